"""Revocation touches only what a change can alter, and does it in batches (issue 10).

A policy change re-decides only the live handles on the streams its target can match, handles
with identical requests from one caller are decided once, and one pass's revocations are one
transaction and one invalidation event.
"""
from __future__ import annotations

import pytest

from pep.invalidation.hub import InvalidationHub
from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

S = "http://www.w3.org/2001/XMLSchema#string"
XML = {"Content-Type": "application/xacml+xml"}
SCHEMA = [{"name": "t", "type": "timestamp"}, {"name": "v", "type": "double"}]
CONSUMERS = ["lta", "other"]


def policy(policy_id: str, stream: str, subjects=CONSUMERS) -> bytes:
    anyof = "".join(
        f'<AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">'
        f'<AttributeValue DataType="{S}">{s}</AttributeValue><AttributeDesignator '
        f'Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject" '
        f'AttributeId="urn:oasis:names:tc:xacml:1.0:subject:subject-id" DataType="{S}" '
        f'MustBePresent="false"/></Match></AllOf>' for s in subjects)
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="{policy_id}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
        <AttributeValue DataType="{S}">{stream}</AttributeValue>
        <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
          AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" DataType="{S}"
          MustBePresent="false"/></Match></AllOf></AnyOf></Target>
      <Rule RuleId="r" Effect="Permit"><Target><AnyOf>{anyof}</AnyOf></Target></Rule>
    </Policy>""".encode()


def request(stream: str) -> bytes:
    return f"""<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      ReturnPolicyIdList="false" CombinedDecision="false">
      <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource">
        <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
          IncludeInResult="false"><AttributeValue DataType="{S}">{stream}</AttributeValue>
        </Attribute></Attributes></Request>""".encode()


def open_handles(client, streams: list[str]) -> dict[tuple[str, str], str]:
    """Each stream registered by its owner with a policy of its own, then a handle on it for
    every consumer: (consumer, stream) -> handle id."""
    for name in streams:
        r = client.post("/streams", json={"name": name, "schema": SCHEMA, "time_attribute": "t"},
                        headers=auth_header("nea"))
        assert r.status_code == 201, r.json
        r = client.post("/policies", data=policy(f"urn:t:{name}", name),
                        headers=auth_header("nea", **XML))
        assert r.status_code == 201, r.json
    handles = {}
    for name in streams:
        for who in CONSUMERS:
            r = client.post("/requests", data=request(name), headers=auth_header(who, **XML))
            assert r.status_code == 201, r.json
            handles[(who, name)] = r.json["id"]
    return handles


@pytest.fixture
def gw(tmp_path):
    hub = InvalidationHub()
    app, services = build_gateway(tmp_path / "data", RecordingRuntime(), invalidation=hub)
    client = app.test_client()
    streams = [f"s{i}" for i in range(6)]
    handles = open_handles(client, streams)
    calls = []
    decide = services.revocation.decide_and_plan

    def counting(*args, **kwargs):
        calls.append(args[3].subject)
        return decide(*args, **kwargs)

    services.revocation.decide_and_plan = counting
    yield client, services, hub, handles, calls
    services.close()


def states(services, handles):
    return {key: services.handles.get(hid).state.value for key, hid in handles.items()}


def test_a_policy_change_re_decides_only_the_handles_of_its_streams(gw):
    client, services, hub, handles, calls = gw
    r = client.post("/policies", data=policy("urn:t:more", "s2"), headers=auth_header("nea", **XML))
    assert r.status_code == 201
    assert sorted(calls) == ["lta", "other"]  # the two handles on s2, not all twelve
    calls.clear()
    r = client.put("/policies/urn:t:s3", data=policy("urn:t:s3", "s3", subjects=["lta"]),
                   headers=auth_header("nea", **XML))
    assert r.status_code == 200
    assert sorted(calls) == ["lta", "other"]
    after = states(services, handles)
    assert after[("other", "s3")] == "revoked" and after[("lta", "s3")] == "live"
    assert [s for k, s in after.items() if k[1] != "s3"] == ["live"] * 10


def test_a_deletion_revokes_its_handles_in_one_batch_and_one_event(gw):
    client, services, hub, handles, calls = gw
    before = hub.last_id
    assert client.delete("/policies/urn:t:s4", headers=auth_header("nea")).status_code == 204
    # one of them decided: no policy can apply to s4 any more, so the other gets the same
    # refusal without a decision of its own (test_revocation_pass)
    assert len(calls) == 1 and calls[0] in ("lta", "other")
    after = states(services, handles)
    assert after[("lta", "s4")] == after[("other", "s4")] == "revoked"
    events, complete = hub.events_after(before)
    revoked = [e for e in events if e.kind == "handle-revoked"]
    assert complete and len(revoked) == 1
    assert set(revoked[0].handle_ids) == {handles[("lta", "s4")], handles[("other", "s4")]}
    assert revoked[0].stream == "s4" and revoked[0].subject is None  # two subjects
    # the policy event follows the handle events (revocation is subscribed first)
    assert [e.kind for e in events][-1] == "policy-changed"


def test_identical_requests_of_one_caller_are_decided_once_per_pass(gw):
    client, services, hub, handles, calls = gw
    records = [services.handles.get(hid) for hid in handles.values()]
    twice = records + records
    services.revocation._apply_all(twice, services.policies.engine, "test")
    assert len(calls) == len(records)  # twelve handles (6 streams x 2 callers), each once


def test_policies_that_mention_time_are_tracked_per_change(gw):
    client, services, hub, handles, calls = gw
    assert not services.revocation.time_sensitive
    timed = policy("urn:t:timed", "s5").replace(
        b"<Rule RuleId=\"r\"", b"<!-- environment --><Rule RuleId=\"r\"")
    client.post("/policies", data=timed, headers=auth_header("nea", **XML))
    assert services.revocation.time_sensitive
    client.delete("/policies/urn:t:timed", headers=auth_header("nea"))
    assert not services.revocation.time_sensitive


def test_each_revoked_reader_learns_it_as_its_handle_is_decided(gw):
    """Within one pass, a handle found no longer permitted has its buffer closed (`revoked`,
    nothing more written) before the next handle is decided, not at the end of the pass; the
    pass still records every revocation."""
    client, services, hub, handles, calls = gw
    on_s0 = [handles[(who, "s0")] for who in CONSUMERS]
    seen_closed = []
    decide = services.revocation.decide_and_plan

    def watching(*args, **kwargs):
        seen_closed.append([services.handles._buffers[h].closed for h in on_s0])
        return decide(*args, **kwargs)

    services.revocation.decide_and_plan = watching
    # a policy still applies to s0, refusing both: each handle is decided (a deletion would
    # decide one for both, test_revocation_pass)
    r = client.put("/policies/urn:t:s0", data=policy("urn:t:s0", "s0", subjects=["nobody"]),
                   headers=auth_header("nea", **XML))
    assert r.status_code == 200
    assert len(seen_closed) == 2
    assert seen_closed[0] == [False, False]
    assert sum(seen_closed[1]) == 1  # the first one decided was already closed
    assert all(services.handles.get(h).state.value == "revoked" for h in on_s0)


def test_a_policy_change_reads_only_the_handles_on_its_streams(gw):
    """The pass reads live handles through the stream index (`HandleStore.live_on`), never the
    whole live table, when the change names its streams; the handles elsewhere are untouched."""
    client, services, hub, handles, calls = gw
    store = services.handles.store
    read_all = []
    original = store.live

    def counting_live():
        read_all.append(1)
        return original()
    store.live = counting_live
    r = client.delete("/policies/urn:t:s3", headers=auth_header("nea"))
    assert r.status_code in (200, 204)
    assert read_all == []
    assert len(calls) == 1  # no policy can apply to s3 any more: one decision for both
    after = states(services, handles)
    assert all(v == ("revoked" if name == "s3" else "live") for (_, name), v in after.items())
    assert {r.id for r in store.live_on({"s1"})} == {handles[(w, "s1")] for w in CONSUMERS}
