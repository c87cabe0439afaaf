"""What a revocation pass saves must change nothing it does (issue 26): it decides the live
handles' stored requests from the memo of parsed requests (`pep.core.parsed`), filled when the
handles were opened, and gets what a fresh parse gets (the same revocations, with the same
reasons); it hands the listeners (audit, proxies) the records it holds, as revoked, and they are
exactly what the store holds afterwards, so the audit entries are those of records read back."""
from __future__ import annotations

import threading
import time
from dataclasses import fields, replace

import pytest

from pdp import RequestSyntaxError, parse_request
from pep.audit.log import handle_ref
from pep.core import access
from pep.handles import revocation
from pep.handles.records import HandleRecord, HandleState, HandleStore, StoredRequest
from pep.handles.revocation import FINAL_READS_WAIT
from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

from .test_revocation_at_scale import CONSUMERS, XML, open_handles, policy


@pytest.fixture
def gw(tmp_path):
    app, services = build_gateway(tmp_path / "data", RecordingRuntime())
    client = app.test_client()
    handles = open_handles(client, ["s0", "s1"])
    yield client, services, handles
    services.close()


def state(services, handle_id):
    record = services.handles.get(handle_id)
    return record.state.value, record.reason


def test_a_pass_reads_the_requests_parsed_when_the_handles_opened(gw, monkeypatch):
    client, services, handles = gw
    parses = []
    real = access.parse_request
    monkeypatch.setattr(access, "parse_request", lambda *a: parses.append(1) or real(*a))
    memo = services.revocation.parsed
    hits = memo.hits
    r = client.put("/policies/urn:t:s0", data=policy("urn:t:s0", "s0", subjects=["lta"]),
                   headers=auth_header("nea", **XML))
    assert r.status_code == 200
    assert parses == [] and memo.hits - hits == 2 * len(CONSUMERS)  # request and query each
    assert state(services, handles[("lta", "s0")]) == ("live", None)
    assert state(services, handles[("other", "s0")]) == (
        "revoked", "policy 'urn:t:s0' updated: the request is no longer permitted "
        "(AccessDenied): access denied: decision is Deny")
    # the next pass, with `other` permitted again, decides again and keeps what it may
    r = client.put("/policies/urn:t:s0", data=policy("urn:t:s0", "s0"),
                   headers=auth_header("nea", **XML))
    assert r.status_code == 200 and parses == []
    assert state(services, handles[("lta", "s0")]) == ("live", None)


def test_a_stored_request_that_does_not_parse_is_revoked_with_the_reason_it_always_had(gw):
    client, services, handles = gw
    broken = b"<Request xmlns='urn:oasis:names:tc:xacml:3.0:core:schema:wd-17'"
    with pytest.raises(RequestSyntaxError) as info:
        parse_request(broken, XML["Content-Type"])
    hid = handles[("lta", "s1")]
    services.handle_store._db.execute("UPDATE handles SET request_body = ? WHERE id = ?",
                                      (broken, hid))
    for _ in range(2):  # the memo keeps nothing of it: a second pass refuses it the same way
        record = services.handles.get(hid)
        verdict = services.revocation.reevaluate(record, services.policies.engine)
        assert not verdict.keep and verdict.reason == (
            f"the request is no longer permitted (MalformedRequest): {info.value}")
    r = client.put("/policies/urn:t:s1", data=policy("urn:t:s1", "s1"),
                   headers=auth_header("nea", **XML))
    assert r.status_code == 200
    assert state(services, hid) == (
        "revoked", "policy 'urn:t:s1' updated: the request is no longer permitted "
        f"(MalformedRequest): {info.value}")
    assert state(services, handles[("other", "s1")]) == ("live", None)


def test_the_listeners_get_the_records_as_the_store_holds_them_after_the_pass(gw):
    client, services, handles = gw
    told = []
    services.handles.add_listener(lambda records: told.append(list(records)))
    log = services.audit.log
    seq = max((e["seq"] for e in log.entries()), default=0)
    r = client.delete("/policies/urn:t:s0", headers=auth_header("nea"))
    assert r.status_code in (200, 204)
    assert len(told) == 1
    revoked = told[0]
    ids = [handles[(who, "s0")] for who in CONSUMERS]
    assert sorted(r.id for r in revoked) == sorted(ids)
    # field by field what the store holds now: state, reason and updated_at included
    assert revoked == services.handle_store.get_many([r.id for r in revoked])
    assert all(r.state is HandleState.REVOKED and r.updated_at for r in revoked)
    entries = [e for e in log.entries() if e["seq"] > seq and e["kind"].startswith("handle-")]
    assert [{k: v for k, v in e.items() if k not in ("time", "seq")} for e in entries] == [
        {"kind": "handle-revoked", "subject": r.subject, "stream": "s0",
         "handle_ref": handle_ref(r.id),
         "reason": "policy 'urn:t:s0' deleted: the request is no longer permitted "
                   "(AccessDenied): access denied: decision is NotApplicable"}
        for r in revoked]
    assert [e["seq"] for e in entries] == list(range(entries[0]["seq"],
                                                     entries[0]["seq"] + len(entries)))


def test_the_closing_listeners_hear_a_pass_s_revocations_before_its_transaction(gw):
    """The edges' listener (`PlanTopics.closing`) is told once the handles are decided, while
    the store still holds them live; the transaction's listeners after, with them revoked."""
    client, services, handles = gw
    order: list[tuple[str, list[str]]] = []

    def closing(endings):
        order.append(("closing", sorted(h for h, _, _ in endings)))
        assert {state(services, h)[0] for h, _, _ in endings} == {"live"}
        assert {(s, r.split(":")[0]) for _, s, r in endings} == {
            ("revoked", "policy 'urn:t:s0' deleted")}

    services.revocation.add_closing_listener(closing)
    services.handles.add_listener(
        lambda records: order.append(("ended", sorted(r.id for r in records))))
    r = client.delete("/policies/urn:t:s0", headers=auth_header("nea"))
    assert r.status_code in (200, 204)
    ids = sorted(handles[(who, "s0")] for who in CONSUMERS)
    assert order == [("closing", ids), ("ended", ids)]
    assert {state(services, h)[0] for h in ids} == {"revoked"}
    # a listener that fails does not stop the pass (the transaction's listeners tell again)
    services.revocation.add_closing_listener(lambda endings: 1 / 0)
    r = client.delete("/policies/urn:t:s1", headers=auth_header("nea"))
    assert r.status_code in (200, 204)
    assert {state(services, handles[(who, "s1")])[0] for who in CONSUMERS} == {"revoked"}


def test_records_the_caller_holds_are_used_only_while_live_and_the_first_ending_wins(gw):
    client, services, handles = gw
    told = []
    services.handles.add_listener(lambda records: told.append(list(records)))
    lta, other = handles[("lta", "s1")], handles[("other", "s1")]
    held = {lta: services.handles.get(lta), other: services.handles.get(other)}
    services.handles.end(other, "ended first")  # what the caller holds of it is stale now
    stale = held[other]
    assert stale.state is HandleState.LIVE
    with services.handles.lock:
        revoked = services.handles.revoke_many([(lta, "one"), (lta, "two"), (other, "late")],
                                               held)
    assert revoked == [lta, lta]  # an id given twice is told twice (as it always was)
    assert told[-1] == services.handle_store.get_many([lta, lta])
    assert told[-1][0].reason == "one" and told[-1][0].state is HandleState.REVOKED
    # a held record that is not live is never trusted: the store's is told
    held[lta] = services.handles.get(lta)
    hid = handles[("lta", "s0")]
    with services.handles.lock:
        services.handles.revoke_many([(hid, "why")], {hid: held[lta]})
    assert [r.id for r in told[-1]] == [hid] and told[-1] == services.handle_store.get_many([hid])


def test_a_record_ended_is_the_record_replaced_in_every_other_field():
    record = HandleRecord(
        id="h", subject="s", roles=("a", "b"), admin=True, stream="st", plan_json='{"x":1}',
        plan_key="k", policy_ids=("p",), request=StoredRequest(b"b", "m", b"q", "t"),
        state=HandleState.LIVE, reason="r0", created_at="c", updated_at="u", generation=7)
    # a field added to HandleRecord must be copied by `ended` too: this list then fails
    assert [f.name for f in fields(HandleRecord)] == [
        "id", "subject", "roles", "admin", "stream", "plan_json", "plan_key", "policy_ids",
        "request", "state", "reason", "created_at", "updated_at", "generation"]
    assert record.ended(HandleState.REVOKED, "why", "now") == replace(
        record, state=HandleState.REVOKED, reason="why", updated_at="now")


def test_loading_records_decodes_their_lists_as_before(tmp_path):
    store = HandleStore(tmp_path / "h.db")
    try:
        for i, roles in enumerate([(), ("a",), ("a", "b"), ("a",)]):
            store.insert(HandleRecord(
                id=f"h{i}", subject="s", roles=roles, admin=False, stream="st", plan_json="{}",
                plan_key="k", policy_ids=tuple(f"p{j}" for j in range(i)),
                request=StoredRequest(b"b", "m")))
        loaded = store.live_on({"st"})
        assert [r.roles for r in loaded] == [(), ("a",), ("a", "b"), ("a",)]
        assert [r.policy_ids for r in loaded] == [(), ("p0",), ("p0", "p1"), ("p0", "p1", "p2")]
        assert all(r.state is HandleState.LIVE for r in loaded)
        store.finish("h1", HandleState.RELEASED, "bye")
        assert store.get("h1").state is HandleState.RELEASED
    finally:
        store.close()


def _delete_s0(tmp_path, name, monkeypatch=None):
    app, services = build_gateway(tmp_path / name, RecordingRuntime())
    try:
        client = app.test_client()
        handles = open_handles(client, ["s0", "s1"])
        decided = []
        real = access.decide_and_plan

        def counting(*args, **kwargs):
            decided.append(1)
            return real(*args, **kwargs)
        if monkeypatch is not None:
            monkeypatch.setattr(access, "decide_and_plan", counting)
            monkeypatch.setattr(services.revocation, "decide_and_plan", counting, raising=False)
        r = client.delete("/policies/urn:t:s0", headers=auth_header("nea"))
        assert r.status_code in (200, 204), r.data
        return {key: state(services, hid) for key, hid in handles.items()}, decided
    finally:
        services.close()


def test_a_stream_no_policy_can_apply_to_any_more_is_decided_once(tmp_path, monkeypatch):
    """Deleting the one policy of a stream: the PDP proves that no request on it can be
    permitted (`PolicyEngine.never_permits`), so the pass decides one of its handles and gives
    the others the same refusal, worded as deciding each would word it."""
    states, decided = _delete_s0(tmp_path, "shared", monkeypatch)
    assert len(decided) == 1 < len(CONSUMERS)
    with monkeypatch.context() as m:
        from pdp.engine import PolicyEngine
        m.setattr(PolicyEngine, "never_permits", lambda self, resource_id: False)
        one_by_one, decided_each = _delete_s0(tmp_path, "each", m)
    assert len(decided_each) == len(CONSUMERS)
    assert states == one_by_one
    assert {states[(who, "s0")][0] for who in CONSUMERS} == {"revoked"}
    assert {states[(who, "s1")] for who in CONSUMERS} == {("live", None)}


class Reader:
    """A streaming reader of one buffer, as the server's event loop is: a waiter that, woken
    for a final event, reads it a little later from another thread."""

    def __init__(self, buffer, delay: float, log: list) -> None:
        self.buffer, self.delay, self.log = buffer, delay, log
        self.urgent = self.take  # the final event's wake (`HandleBuffer._wake`)
        buffer.add_waiter(self)

    def __call__(self) -> None:
        pass  # rows: not read here

    def take(self) -> None:
        threading.Timer(self.delay, self.read).start()

    def read(self) -> None:
        events = self.buffer.read(self.buffer.last_id - 1, timeout=0)
        if events and events[-1].final:
            self.log.append(("read", events[-1].kind))


def test_a_pass_records_its_revocations_once_their_readers_were_given_revoked(gw, monkeypatch):
    client, services, handles = gw
    monkeypatch.setattr(revocation, "FINAL_READS_WAIT", 10.0)  # a loaded machine's timers
    log: list = []
    revoked = [h for (who, stream), h in handles.items() if stream == "s0" and who != "lta"]
    for hid in revoked:
        Reader(services.handles._buffers[hid], 0.05, log)
    services.handles.add_listener(lambda records: log.append(("recorded", len(records))))
    r = client.put("/policies/urn:t:s0", data=policy("urn:t:s0", "s0", subjects=["lta"]),
                   headers=auth_header("nea", **XML))
    assert r.status_code == 200
    assert log == [("read", "revoked")] * len(revoked) + [("recorded", len(revoked))]


def test_a_reader_that_does_not_take_revoked_holds_a_pass_back_a_bounded_time(gw):
    client, services, handles = gw
    hid = handles[("other", "s0")]
    services.handles._buffers[hid].add_waiter(lambda: None)  # woken, never reads
    started = time.monotonic()
    r = client.put("/policies/urn:t:s0", data=policy("urn:t:s0", "s0", subjects=["lta"]),
                   headers=auth_header("nea", **XML))
    took = time.monotonic() - started
    assert r.status_code == 200 and state(services, hid)[0] == "revoked"
    assert FINAL_READS_WAIT <= took < FINAL_READS_WAIT + 5
