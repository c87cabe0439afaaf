"""A stream's life after registration over HTTP: its owner changes it (settings, added
attributes) and deletes it (handles revoked first, events, files and, on request, policies
with it; the name reserved to its former owner), with races against requests and ingest.

The gateway is the real one (PDP, catalogue, handles, revocation, audit) with a recording
stand-in for Spark; the Spark side of the same operations is in tests/pep/runtime and
tests/e2e/test_stream_lifecycle.py.
"""
from __future__ import annotations

import json
import threading
import time

import pytest

from tests.pep.conftest import RecordingRuntime, build_gateway
from tests.pep.http.test_stream_visibility import (
    RESOURCE,
    SUBJECT,
    XML,
    access_request,
    auth_entries,
    bearer,
    match,
)

SCHEMA = [{"name": "ts", "type": "timestamp"}, {"name": "v", "type": "double"},
          {"name": "note", "type": "string"}]
GAUGE = {"name": "gauge", "source": {"kind": "ingest"}, "time_attribute": "ts",
         "schema": SCHEMA}
POLICY_ID = "urn:t:gauge"
ND = {"Content-Type": "application/x-ndjson"}
STRING = "http://www.w3.org/2001/XMLSchema#string"


def gauge_policy(streams=("gauge",), policy_id: str = POLICY_ID) -> bytes:
    """lta reads `ts` and `v` (a map); other reads everything (no map); anyone else: Deny."""
    any_stream = "".join(f"<AllOf>{match(*RESOURCE, s)}</AllOf>" for s in streams)
    mapped = "".join(
        f'<AttributeAssignmentExpression AttributeId="exacml:obligation:stream-map-attribute-id">'
        f'<AttributeValue DataType="{STRING}">{a}</AttributeValue>'
        f'</AttributeAssignmentExpression>' for a in ("ts", "v"))
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="{policy_id}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
      <Target><AnyOf>{any_stream}</AnyOf></Target>
      <Rule RuleId="lta" Effect="Permit">
        <Target><AnyOf><AllOf>{match(*SUBJECT, "lta")}</AllOf></AnyOf></Target>
        <ObligationExpressions>
          <ObligationExpression ObligationId="exacml:obligation:stream-map" FulfillOn="Permit">
            {mapped}
          </ObligationExpression>
        </ObligationExpressions></Rule>
      <Rule RuleId="other" Effect="Permit">
        <Target><AnyOf><AllOf>{match(*SUBJECT, "other")}</AllOf></AnyOf></Target></Rule>
      <Rule RuleId="deny" Effect="Deny"/></Policy>""".encode()


def open_policy(stream: str = "open") -> bytes:
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="urn:t:{stream}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
      <Target><AnyOf><AllOf>{match(*RESOURCE, stream)}</AllOf></AnyOf></Target>
      <Rule RuleId="p" Effect="Permit"/></Policy>""".encode()


@pytest.fixture
def gw(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "auth.json").write_text(json.dumps(auth_entries()))
    runtime = RecordingRuntime()
    app, services = build_gateway(data, runtime)
    yield app.test_client(), runtime, services, data
    services.close()


def register(client, who="acme", **overrides):
    r = client.post("/streams", headers=bearer(who), json={**GAUGE, **overrides})
    assert r.status_code == 201, r.json
    return r.json


def add_policy(client, data: bytes, who="acme"):
    r = client.post("/policies", headers=bearer(who, **XML), data=data)
    assert r.status_code == 201, r.json


def ask(client, who: str, stream: str = "gauge", join: str | None = None):
    return client.post("/requests", headers=bearer(who, **XML),
                       data=access_request(stream, "read", join=join))


def record(**values) -> bytes:
    base = {"ts": "2026-01-01T00:00:00Z", "v": 1.5, "note": "n"}
    return (json.dumps({**base, **values}) + "\n").encode()


def final_event(services, handle_id: str) -> dict:
    buffer = services.handles.buffer(handle_id)
    assert buffer is None  # ended handles keep no buffer
    record_ = services.handle_store.get(handle_id)
    return {"state": record_.state.value, "reason": record_.reason}


# -- changing a stream --------------------------------------------------------------------------

def test_settings_are_set_at_registration_changed_shown_and_audited(gw):
    client, _, services, _ = gw
    made = register(client, description="a rain gauge", lateness=5, retention=600)
    assert (made["description"], made["lateness"], made["retention"]) == ("a rain gauge", 5, 600)
    r = client.patch("/streams/gauge", headers=bearer("acme"),
                     json={"description": "  on the roof ", "lateness": 2.5, "retention": None})
    assert r.status_code == 200, r.json
    assert (r.json["description"], r.json["lateness"], r.json["retention"]) == (
        "on the roof", 2.5, None)
    assert r.json["added"] == [] and r.json["revoked"] == 0
    seen = client.get("/streams/gauge", headers=bearer("lta")).json
    assert (seen["description"], seen["lateness"], seen["retention"]) == ("on the roof", 2.5, None)
    assert services.catalog.get("gauge").lateness == 2.5  # what the runtime is given
    changed = services.audit.log.query(kinds=["stream-changed"])
    assert changed[-1]["changes"] == {"description": "on the roof", "lateness": 2.5,
                                      "retention": None}
    for body, fragment in (({"lateness": -1}, "lateness must be a number of seconds"),
                           ({"lateness": "5"}, "got a string"),
                           ({"retention": 10 ** 12}, "retention must be"),
                           ({"description": "x" * 2001}, "at most 2000"),
                           ({"description": "bell\x07"}, "control characters"),
                           ({"add_attributes": [], "lateness": 1}, "non-empty list"),
                           ({"add_attributes": [{"name": "w", "type": "long"}],
                             "schema": SCHEMA}, "not both")):
        r = client.patch("/streams/gauge", headers=bearer("acme"), json=body)
        assert r.status_code == 400 and fragment in r.json["error"], (body, r.json)
    register(client, name="timeless", time_attribute=None)
    r = client.patch("/streams/timeless", headers=bearer("acme"), json={"lateness": 3})
    assert r.status_code == 400 and "no time_attribute" in r.json["error"]
    r = client.post("/streams", headers=bearer("acme"),
                    json={**GAUGE, "name": "t2", "time_attribute": None, "lateness": 3})
    assert r.status_code == 400 and "no time_attribute" in r.json["error"]
    r = client.patch("/streams/gauge", headers=bearer("other"), json={"description": "mine"})
    assert r.status_code == 403
    assert client.get("/streams/gauge", headers=bearer("lta")).json["description"] == "on the roof"


def test_added_attributes_leave_explicit_grants_alone_and_revoke_the_others(gw):
    client, runtime, services, _ = gw
    register(client)
    add_policy(client, gauge_policy())
    mapped = ask(client, "lta")
    everything = ask(client, "other")
    assert mapped.status_code == 201 and everything.status_code == 201, everything.json
    assert mapped.json["plan"]["projection"] == ["ts", "v"]
    assert everything.json["plan"]["projection"] == ["ts", "v", "note"]
    r = client.patch("/streams/gauge", headers=bearer("acme"),
                     json={"add_attributes": [{"name": "w", "type": "long"}]})
    assert r.status_code == 200, r.json
    assert r.json["added"] == ["w"] and r.json["revoked"] == 1
    assert r.json["schema"][-1] == {"name": "w", "type": "long", "optional": True}
    # the mapped grant is exactly what it was: the handle lives on, the same plan
    assert services.handle_store.get(mapped.json["id"]).live
    assert runtime.push(mapped.json["id"], [{"ts": "2026-01-01T00:00:00Z", "v": 1.0}])
    again = ask(client, "lta")
    assert again.status_code == 200 and again.json["id"] == mapped.json["id"]
    # "every attribute" now means one more: that handle is revoked, and asking again gives w
    gone = services.handle_store.get(everything.json["id"])
    assert gone.state.value == "revoked" and "gained attribute(s) w" in gone.reason
    assert not runtime.push(everything.json["id"], [{"ts": "2026-01-01T00:00:00Z"}])
    fresh = ask(client, "other")
    assert fresh.status_code == 201 and fresh.json["plan"]["projection"] == ["ts", "v", "note",
                                                                            "w"]
    # producers that do not know w go on; those that do may send it; the old fields stay
    # required
    def post(body):
        return client.post("/streams/gauge/records", headers=bearer("acme", **ND), data=body)

    assert post(record()).status_code == 201
    assert post(record(w=7)).status_code == 201
    bad = post(record(w="seven"))
    assert bad.status_code == 400 and "'w'" in bad.json["error"]
    missing = post(b'{"ts": "2026-01-01T00:00:00Z", "note": "n"}\n')
    assert missing.status_code == 400 and "missing required field" in missing.json["error"]
    files = sorted((services.catalog.ingest_dir("gauge")).glob("*.json"))
    written = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert [r.get("w", "absent") for r in written] == [None, 7]
    audit = services.audit.log.query(kinds=["stream-changed"])
    assert audit[-1]["changes"] == {"add_attributes": [{"name": "w", "type": "long"}]}
    # the whole schema may be given too, when it only adds
    r = client.patch("/streams/gauge", headers=bearer("acme"),
                     json={"schema": SCHEMA + [{"name": "w", "type": "long"},
                                               {"name": "x", "type": "boolean"}]})
    assert r.status_code == 200 and r.json["added"] == ["x"]
    for attrs, fragment in (([{"name": "V", "type": "double"}], "duplicate field"),
                            ([{"name": "_y", "type": "long"}], "name must match"),
                            ([{"name": "y", "type": "blob"}], "type must be")):
        r = client.patch("/streams/gauge", headers=bearer("acme"), json={"add_attributes": attrs})
        assert r.status_code == 400 and fragment in r.json["error"], r.json


def test_schema_changes_that_are_not_additions_are_refused_naming_the_policies(gw):
    client, _, services, _ = gw
    register(client)
    register(client, who="root", name="open")
    add_policy(client, gauge_policy())
    # an administrator's policy over two streams names `ts` too; acme may not manage it
    add_policy(client, gauge_policy(("gauge", "open"), "urn:t:two"), who="root")
    without_v = [f for f in SCHEMA if f["name"] != "v"]
    r = client.patch("/streams/gauge", headers=bearer("acme"), json={"schema": without_v})
    assert r.status_code == 409, r.json
    assert f"policy {POLICY_ID!r} names v (line" in r.json["error"]
    assert "1 policy you may not manage" in r.json["error"]
    assert r.json["policies"] == [POLICY_ID] and r.json["attributes"] == ["v"]
    retyped = [{**f, "type": "string"} if f["name"] == "ts" else f for f in SCHEMA]
    r = client.patch("/streams/gauge", headers=bearer("root"), json={"schema": retyped})
    assert r.status_code == 409 and "urn:t:two" in r.json["error"]  # an admin sees every one
    assert "retypes ts" in r.json["error"]
    # an attribute no policy names: still refused, saying why
    r = client.patch("/streams/gauge", headers=bearer("acme"), json={"schema": SCHEMA[:2]})
    assert r.status_code == 400 and "removes note" in r.json["error"]
    assert "can only be added to" in r.json["error"]
    r = client.patch("/streams/gauge", headers=bearer("acme"),
                     json={"schema": [SCHEMA[1], SCHEMA[0], SCHEMA[2]]})
    assert r.status_code == 400 and "keep their order" in r.json["error"]
    r = client.patch("/streams/gauge", headers=bearer("acme"), json={"schema": SCHEMA})
    assert r.status_code == 200 and r.json["added"] == []
    assert client.get("/streams/gauge", headers=bearer("acme")).json["schema"] == SCHEMA
    r = client.post("/streams", headers=bearer("acme"),
                    json={"name": "ships", "source": {"kind": "generator", "schema": "ais"}})
    assert r.status_code == 201
    r = client.patch("/streams/ships", headers=bearer("acme"),
                     json={"add_attributes": [{"name": "extra", "type": "long"}]})
    assert r.status_code == 400 and "'ingest' streams only" in r.json["error"]


# -- deleting a stream --------------------------------------------------------------------------

def test_delete_revokes_every_handle_and_takes_events_files_and_policies_with_it(gw):
    client, runtime, services, data = gw
    register(client)
    register(client, who="root", name="open")
    add_policy(client, gauge_policy())
    add_policy(client, open_policy(), who="root")
    add_policy(client, gauge_policy(("gauge", "open"), "urn:t:two"), who="root")
    r = client.post("/streams/gauge/events", headers=bearer("acme"),
                    json={"name": "storm", "condition": "v > 10"})
    assert r.status_code == 201, r.json
    assert client.post("/streams/gauge/records", headers=bearer("acme", **ND),
                       data=record()).status_code == 201
    plain = ask(client, "lta")
    joined = ask(client, "other", stream="open", join="gauge")  # gauge is the join's 2nd side
    assert plain.status_code == 201 and joined.status_code == 201, joined.json
    buffers = {h: services.handles.buffer(h) for h in (plain.json["id"], joined.json["id"])}

    d = client.get("/streams/gauge/dependents", headers=bearer("acme"))
    assert d.status_code == 200, d.json
    assert (d.json["live_handles"], d.json["joins"], d.json["subjects"]) == (2, 1, 2)
    assert d.json["events"] == ["storm"] and d.json["other_policies"] == 1
    assert [(p["id"], p["action"]) for p in d.json["policies"]] == [(POLICY_ID, "keep")]
    d = client.get("/streams/gauge/dependents?remove_policies=true", headers=bearer("root"))
    assert [(p["id"], p["action"]) for p in d.json["policies"]] == [
        (POLICY_ID, "remove"), ("urn:t:two", "keep")]
    for who in ("lta", "rival"):
        assert client.delete("/streams/gauge", headers=bearer(who)).status_code == 403
        assert client.get("/streams/gauge/dependents", headers=bearer(who)).status_code == 403

    r = client.delete("/streams/gauge?remove_policies=true", headers=bearer("acme"))
    assert r.status_code == 200, r.json
    assert r.json["handles_revoked"] == 2 and r.json["events_removed"] == ["storm"]
    assert r.json["policies"] == [{"id": POLICY_ID, "action": "removed",
                                   "reason": "confined to this stream: removed with it"}]
    assert r.json["other_policies"] == 1 and r.json["data"] == "removed"
    # every reader got `revoked` (a join on either side), and nothing is delivered after it
    for handle_id, buffer in buffers.items():
        events = buffer.read(0, timeout=0)
        assert events[-1].kind == "revoked" and "deleted by 'acme'" in events[-1].data
        assert not runtime.push(handle_id, [{"ts": "2026-01-01T00:00:00Z", "v": 1.0}])
        assert not services.handle_store.get(handle_id).live
    assert services.handles.live_on("gauge") == []
    assert not any(r[0].name == "gauge" for r in runtime.attached.values())  # the event too
    # the stream is gone on every route, as a name that never existed
    for method, path, headers, body in (("GET", "/streams/gauge", {}, None),
                                        ("POST", "/streams/gauge/records", ND, record()),
                                        ("PATCH", "/streams/gauge", {}, None),
                                        ("GET", "/streams/gauge/events", {}, None),
                                        ("DELETE", "/streams/gauge", {}, None)):
        gone = client.open(path, method=method, headers=bearer("acme", **headers), data=body)
        never = client.open(path.replace("gauge", "nosuch"), method=method,
                            headers=bearer("acme", **headers), data=body)
        assert gone.status_code == never.status_code == 404, (method, path)
    assert ask(client, "lta").status_code == 404
    assert client.get(f"/handles/{plain.json['id']}", headers=bearer("lta")).status_code == 404
    assert services.stream_events.all("gauge") == []
    # its files: the ingest directory and the holding place are gone; the policies as told
    assert not (data / "streams" / "gauge").exists()
    assert not (data / "deleted").exists() or list((data / "deleted").iterdir()) == []
    assert client.get(f"/policies/{POLICY_ID}", headers=bearer("root")).status_code == 404
    assert client.get("/policies/urn:t:two", headers=bearer("root")).status_code == 200
    # all of it audited
    kinds = [e["kind"] for e in services.audit.log.query()]
    assert kinds.count("handle-revoked") == 2
    assert {"event-deleted", "policy-deleted", "stream-deleted"} <= set(kinds)
    entry = services.audit.log.query(kinds=["stream-deleted"])[0]
    assert entry["stream"] == "gauge" and entry["by"] == "acme"
    assert (entry["handles_revoked"], entry["events"], entry["policies_removed"],
            entry["policies_kept"]) == (2, ["storm"], [POLICY_ID], [])
    # the former owner still reads its audit entries
    mine = client.get("/audit?kind=stream-deleted", headers=bearer("acme")).json["entries"]
    assert [e["stream"] for e in mine] == ["gauge"]
    assert client.get("/audit?kind=stream-deleted",
                      headers=bearer("rival")).json["entries"] == []


def test_a_deleted_name_is_its_former_owners_and_starts_clean(gw):
    client, runtime, services, data = gw
    register(client)
    add_policy(client, gauge_policy())
    assert ask(client, "lta").status_code == 201
    r = client.delete("/streams/gauge", headers=bearer("acme"))
    assert r.status_code == 200
    assert r.json["policies"][0]["action"] == "kept"
    # another owner may not take the name: the kept policy, the audit trail name it
    r = client.post("/streams", headers=bearer("rival"), json=GAUGE)
    assert r.status_code == 409 and "reserved to its former owner" in r.json["error"]
    # the former owner still manages the policy it kept; a stranger does not
    assert client.get(f"/policies/{POLICY_ID}", headers=bearer("acme")).status_code == 200
    assert client.get(f"/policies/{POLICY_ID}", headers=bearer("rival")).status_code == 403
    # registering it again: a new stream (no handle, no event, a new counter), under the kept
    # policy, which applies again
    again = register(client, schema=SCHEMA[:2])
    assert again["schema"] == SCHEMA[:2]
    assert services.handles.live_on("gauge") == []
    assert client.get("/streams/gauge/events", headers=bearer("acme")).json["events"] == []
    assert services.catalog.position("gauge") == 0
    r = ask(client, "lta")
    assert r.status_code == 201 and r.json["plan"]["projection"] == ["ts", "v"]
    # after its former owner re-registered it, deleting it again frees it for an administrator
    assert client.delete("/streams/gauge?remove_policies=true",
                         headers=bearer("acme")).status_code == 200
    r = client.post("/streams", headers=bearer("root"), json=GAUGE)
    assert r.status_code == 201 and r.json["owner"] == "root"


def test_a_deleted_streams_handles_stay_gone_when_the_name_comes_back(gw):
    """(issue 41, item 6) A handle belongs to the stream it was opened on, not to its name:
    once that stream is deleted its handles answer 404 like the stream, and keep answering 404
    (never 410, never listed) after the former owner registers the name again, so that none of
    them passes for one of the new stream's handles."""
    client, runtime, services, data = gw
    register(client)
    register(client, who="root", name="open")
    add_policy(client, gauge_policy())
    add_policy(client, open_policy(), who="root")
    add_policy(client, gauge_policy(("gauge", "open"), "urn:t:two"), who="root")
    released = ask(client, "lta").json["id"]
    assert client.delete(f"/handles/{released}", headers=bearer("lta")).status_code == 200
    live = ask(client, "lta").json["id"]
    joined = ask(client, "other", stream="open", join="gauge").json["id"]  # gauge: 2nd side
    old = {"lta": [released, live], "other": [joined]}
    assert client.get(f"/handles/{released}", headers=bearer("lta")).status_code == 410

    def answers(who: str, handle_id: str) -> list:
        out = []
        for method, path in (("GET", f"/handles/{handle_id}"),
                             ("DELETE", f"/handles/{handle_id}"),
                             ("POST", f"/handles/{handle_id}/read-token")):
            r = client.open(path, method=method,
                            headers=bearer(who, Accept="application/json"))
            out.append((r.status_code, r.json))
        return out

    never = {who: answers(who, "n0SuchHandle" * 4) for who in old}
    assert all(status == 404 for who in old for status, _ in never[who]), never

    def check_gone() -> None:
        for who, ids in old.items():
            for handle_id in ids:
                assert answers(who, handle_id) == never[who], (who, handle_id)
            listed = {h["id"] for h in client.get("/handles",
                                                  headers=bearer(who)).json["handles"]}
            assert not listed & set(ids), (who, listed)

    assert client.delete("/streams/gauge", headers=bearer("acme")).status_code == 200
    check_gone()
    register(client)  # the former owner takes the name again: a new stream
    check_gone()
    fresh = ask(client, "lta")
    assert fresh.status_code == 201 and fresh.json["id"] not in old["lta"]
    listed = [h["id"] for h in client.get("/handles", headers=bearer("lta")).json["handles"]]
    assert listed == [fresh.json["id"]]
    check_gone()
    # a later deletion sets the new stream's handles apart too; "open"'s own are untouched
    assert client.delete("/streams/gauge", headers=bearer("acme")).status_code == 200
    register(client)
    old["lta"].append(fresh.json["id"])
    check_gone()
    mine = ask(client, "other", stream="open")
    assert mine.status_code == 201, mine.json
    assert client.get(f"/handles/{mine.json['id']}", headers=bearer(
        "other", Accept="application/json")).status_code == 200


def test_a_failed_deletion_gives_the_stream_its_handles_back(gw, monkeypatch):
    """A deletion that fails half-way puts the stream back: its handles stay revoked, and are
    its owners' again (410, listed), not set apart as a deleted stream's."""
    client, runtime, services, data = gw
    register(client)
    add_policy(client, gauge_policy())
    handle_id = ask(client, "lta").json["id"]

    def broken(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(services.catalog, "finish_delete", broken)
    assert client.delete("/streams/gauge", headers=bearer("acme")).status_code == 503
    monkeypatch.undo()
    r = client.get(f"/handles/{handle_id}", headers=bearer("lta", Accept="application/json"))
    assert r.status_code == 410 and r.json["state"] == "revoked"
    assert handle_id in {h["id"] for h in client.get("/handles",
                                                     headers=bearer("lta")).json["handles"]}


def test_keep_data_keeps_the_files_until_the_sweep(gw):
    client, _, services, data = gw
    register(client)
    assert client.post("/streams/gauge/records", headers=bearer("acme", **ND),
                       data=record()).status_code == 201
    for query, fragment in (("keep_data=-1", "keep_data must be"),
                            ("keep_data=soon", "keep_data must be"),
                            ("keep_data=1e9", "keep_data must be"),
                            ("remove_policies=maybe", "remove_policies must be true or false")):
        r = client.delete(f"/streams/gauge?{query}", headers=bearer("acme"))
        assert r.status_code == 400 and fragment in r.json["error"], r.json
    assert client.get("/streams/gauge", headers=bearer("acme")).status_code == 200
    r = client.delete("/streams/gauge?keep_data=3600", headers=bearer("acme"))
    assert r.status_code == 200 and "kept_until" in r.json["data"]
    (holding,) = list((data / "deleted").iterdir())
    note = json.loads((holding / "deleted.json").read_text())
    assert note["stream"] == "gauge" and note["keep_until"] == r.json["data"]["kept_until"]
    kept = [json.loads(line) for f in (holding / "streams" / "ingest").glob("*.json")
            for line in f.read_text().splitlines()]
    assert [k["v"] for k in kept] == [1.5]
    assert not (data / "streams" / "gauge").exists()
    assert services.lifecycle.sweep_kept(every=0) == 0  # not yet
    assert services.lifecycle.sweep_kept(now=time.time() + 3601, every=0) == 1
    assert list((data / "deleted").iterdir()) == []
    entry = services.audit.log.query(kinds=["stream-deleted"])[0]
    assert entry["kept_until"] == r.json["data"]["kept_until"]


def test_a_hidden_stream_cannot_be_deleted_or_probed_by_whoever_may_not_see_it(gw):
    client, _, services, _ = gw
    register(client, visibility="restricted")
    for path, method in (("/streams/{}", "DELETE"), ("/streams/{}/dependents", "GET"),
                         ("/streams/{}?keep_data=5", "DELETE")):
        hidden = client.open(path.format("gauge"), method=method, headers=bearer("other"))
        absent = client.open(path.format("nosuch"), method=method, headers=bearer("other"))
        assert (hidden.status_code, hidden.get_data().replace(b"gauge", b"nosuch")) == \
            (absent.status_code, absent.get_data()), path
        assert hidden.status_code == 404
    assert client.get("/streams/gauge", headers=bearer("acme")).status_code == 200


# -- races ----------------------------------------------------------------------------------------

def test_a_deletion_racing_requests_leaves_no_live_handle_on_the_deleted_stream(gw):
    client, runtime, services, _ = gw
    granted = 0
    for round_ in range(6):
        name = f"race{round_}"
        register(client, name=name)
        add_policy(client, gauge_policy((name,), f"urn:t:race{round_}"))
        statuses: list[int] = []
        stop = threading.Event()

        # the round's values are passed in: a thread outliving its join(30) must not see the
        # next round's
        def asker(who: str, stop: threading.Event, name: str, statuses: list[int]) -> None:
            own = client.application.test_client()
            while not stop.is_set():
                r = ask(own, who, stream=name)
                statuses.append(r.status_code)
                if r.status_code == 404:
                    return
                if r.status_code in (200, 201):
                    own.delete(f"/handles/{r.json['id']}", headers=bearer(who))

        threads = [threading.Thread(target=asker, args=(w, stop, name, statuses))
                   for w in ("lta", "other")]
        for t in threads:
            t.start()
        time.sleep(0.02 * round_)
        r = client.delete(f"/streams/{name}?remove_policies=true", headers=bearer("acme"))
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert r.status_code == 200, r.json
        assert set(statuses) <= {200, 201, 404}, statuses
        granted += statuses.count(201)
        assert services.handles.live_on(name) == []
        with runtime.lock:
            assert not any(s.name == name for s, _, _ in runtime.attached.values())
    assert granted > 0  # the requests did get handles: the race was run


def test_deleting_during_ingest_answers_201_or_404_and_leaves_nothing(gw):
    client, _, services, data = gw
    register(client)
    statuses: list[int] = []
    stop = threading.Event()

    def producer() -> None:
        own = client.application.test_client()
        while not stop.is_set():
            r = own.post("/streams/gauge/records", headers=bearer("acme", **ND),
                         data=record() * 50)
            statuses.append(r.status_code)
            if r.status_code == 404:
                return

    threads = [threading.Thread(target=producer) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    r = client.delete("/streams/gauge", headers=bearer("acme"))
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert r.status_code == 200
    assert 201 in statuses and set(statuses) <= {201, 404}, set(statuses)
    assert not (data / "streams" / "gauge").exists()
    assert client.post("/streams/gauge/records", headers=bearer("acme", **ND),
                       data=record()).status_code == 404


def test_a_request_decided_before_the_deletion_cannot_open_a_handle_after_it(gw):
    """The window the race above can hit only by luck, made certain: the grant is decided and
    the stream looked up, the stream deleted, and then the handle opened with that grant."""
    from pep.core.errors import NotFound
    from pep.handles.records import StoredRequest
    from pep.handles.service import StalePolicies

    client, runtime, services, _ = gw
    register(client)
    add_policy(client, gauge_policy())
    identity = services.authenticator.identity_for("lta")
    epoch = services.handles.policy_epoch
    grant = services.access.decide_and_plan(services.policies.engine,
                                            access_request("gauge", "read"),
                                            "application/xacml+xml", identity,
                                            services.catalog.schema)
    looked_up = services.handles._definitions(grant.plan)  # before the deletion
    services.handles._definitions = lambda plan: looked_up
    assert client.delete("/streams/gauge", headers=bearer("acme")).status_code == 200
    stored = StoredRequest(access_request("gauge", "read"), "application/xacml+xml")
    with pytest.raises(StalePolicies):  # the route decides again, and finds no stream
        services.handles.open("lta", ("consumer",), False, grant.plan, grant.policy_ids,
                              stored, epoch=epoch)
    with pytest.raises(NotFound):
        services.handles.open("lta", ("consumer",), False, grant.plan, grant.policy_ids,
                              stored)
    assert services.handles.live_on("gauge") == [] and runtime.attached == {}


class SlowAttachRuntime(RecordingRuntime):
    """Attaching waits until the test lets it go (a stream's first handle starting its query)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.go = threading.Event()

    def attach_handle(self, handle_id, stream, plan, deliver):
        self.entered.set()
        assert self.go.wait(30)
        super().attach_handle(handle_id, stream, plan, deliver)


def test_a_deletion_waits_for_an_attach_under_way_which_then_lets_go(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "auth.json").write_text(json.dumps(auth_entries()))
    runtime = SlowAttachRuntime()
    app, services = build_gateway(data, runtime)
    try:
        client = app.test_client()
        runtime.go.set()
        register(client)
        add_policy(client, gauge_policy())
        runtime.go.clear()
        asked: list = []
        t = threading.Thread(target=lambda: asked.append(ask(app.test_client(), "lta")))
        t.start()
        assert runtime.entered.wait(10)  # the handle is live, its attach under way
        deleted: list = []
        d = threading.Thread(target=lambda: deleted.append(
            app.test_client().delete("/streams/gauge", headers=bearer("acme"))))
        d.start()
        time.sleep(0.5)
        assert deleted == []  # waiting for the attach
        runtime.go.set()
        t.join(10)
        d.join(10)
        assert deleted[0].status_code == 200 and deleted[0].json["handles_revoked"] == 1
        assert asked[0].status_code == 201  # it was granted before the deletion
        hid = asked[0].json["id"]
        assert services.handle_store.get(hid).state.value == "revoked"
        assert hid not in runtime.attached and hid in runtime.detached
    finally:
        runtime.go.set()
        services.close()
