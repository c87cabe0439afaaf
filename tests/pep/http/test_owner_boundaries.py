"""The boundary between stream owners (issue 20): the three attacks an outside run found, each
replayed against the whole gateway.

1. An owner's policy read another owner's stream event (its keys: values of the other owner's
   data; whether it is open) through its advice or condition, and POST /pdp handed it back.
   Now refused when written, wherever the policy names it, and a decision about a stream sees
   only that stream's events anyway.
2. A join was audited under its first stream only: that owner read the other side's policies
   and plan, the other owner did not see the join at all. Now the entry names both streams and
   each owner reads its own side.
3. The invalidation hub logged full handle ids (tests/pep/http/test_no_secrets_in_logs.py).
"""
from __future__ import annotations

import io
import json

import pytest

from tests.pep.http.boundaries import (
    ADMIN,
    ALICE,
    BOB,
    CAROL,
    DAVE,
    JSON_TYPE,
    PLACEMENTS,
    XML,
    Gateway,
    build,
    join_query,
    policy,
    reading,
    request,
    stream_json,
    stream_obligations,
)

KEY = "KEY-bobs-ship-zx81"  # a value of Bob's data: the key his event collected
BOB_EVENT = "urn:xsg:event:bstream:bevent"
BOB_POLICY = "urn:bob:policy-q7zcanary"
ALICE_POLICY = "urn:alice:policy"
BOB_FILTER = "area != 'BOBFILTER-q7zcanary'"


@pytest.fixture
def gw(tmp_path) -> Gateway:
    gw = build(tmp_path / "data")
    assert gw.call("POST", "/streams", ALICE, json=stream_json("astream")).status_code == 201
    assert gw.call("POST", "/streams", BOB, json=stream_json("bstream")).status_code == 201
    r = gw.call("POST", "/streams/bstream/events", BOB,
                json={"name": "bevent", "condition": "speed > 50", "key": "area"})
    assert r.status_code == 201, r.json
    yield gw
    gw.services.close()


def add(gw: Gateway, who: str, document: bytes):
    return gw.call("POST", "/policies", who, data=document, headers=XML)


def decide(gw: Gateway, who: str, stream: str) -> str:
    r = gw.call("POST", "/pdp", who, data=request(stream, return_policy_ids=True),
                headers=JSON_TYPE)
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.get_data(as_text=True)


# -- 1. events: an owner's policy reads only its own streams' events ------------------------------

@pytest.mark.parametrize("suffix", ["", ":since", ":keys"])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_an_owner_cannot_write_a_policy_that_reads_another_owners_event(gw, placement, suffix):
    attribute = BOB_EVENT + suffix
    document = policy(ALICE_POLICY, ("astream",), **reading(placement, attribute))
    r = add(gw, ALICE, document)
    assert r.status_code == 403, (placement, r.json)
    assert attribute in r.json["error"] and "bstream" in r.json["error"], r.json
    # in bulk, and as a new version of a policy she may manage
    r = gw.call("POST", "/policies/bulk", ALICE,
                data={"p": (io.BytesIO(document), "p.xml")},
                content_type="multipart/form-data")
    assert r.status_code == 403 and attribute in r.json["error"]
    assert add(gw, ALICE, policy(ALICE_POLICY, ("astream",))).status_code == 201
    r = gw.call("PUT", f"/policies/{ALICE_POLICY}", ALICE, data=document, headers=XML)
    assert r.status_code == 403 and attribute in r.json["error"]
    # the same reading of her own stream's event is hers to write
    own = document.replace(b"bstream:bevent", b"astream:aevent")
    r = gw.call("PUT", f"/policies/{ALICE_POLICY}", ALICE, data=own, headers=XML)
    assert r.status_code == 200, r.json


def test_a_policy_confined_to_one_of_an_owners_streams_reads_no_other_streams_events(gw):
    assert gw.call("POST", "/streams", ALICE, json=stream_json("astream2")).status_code == 201
    document = policy(ALICE_POLICY, ("astream",),
                      **reading("condition", "urn:xsg:event:astream2:e"))
    r = add(gw, ALICE, document)
    assert r.status_code == 403 and "urn:xsg:event:astream2:e" in r.json["error"]
    # spelled in other letter cases, or with spaces the parser strips: refused all the same
    for spelling in (" urn:xsg:event:bstream:bevent ", "URN:XSG:EVENT:bstream:bevent"):
        r = add(gw, ALICE, policy(ALICE_POLICY, ("astream",), **reading("condition", spelling)))
        assert r.status_code == 403, spelling


def test_an_administrators_policy_may_read_any_event_with_a_warning_when_it_never_sees_it(gw):
    document = policy("urn:admin:p", ("astream",), **reading("condition", BOB_EVENT))
    r = add(gw, ADMIN, document)
    assert r.status_code == 201
    assert any(BOB_EVENT in w and "never appears" in w for w in r.json["warnings"]), r.json
    # unconfined: it may be about bstream, so it may see bstream's events: no warning
    r = add(gw, ADMIN, policy("urn:admin:q", (), **reading("advice", BOB_EVENT + ":keys")))
    assert r.status_code == 201 and not any(BOB_EVENT in w for w in r.json["warnings"])


def test_a_decision_sees_only_the_events_of_the_stream_it_is_about(gw):
    """Defence in depth: a policy that reads another stream's events (an administrator's, or one
    stored before the write-time rule existed) never sees them in a decision about its own
    stream: POST /pdp, POST /explain, POST /requests and joins alike."""
    echo = reading("advice", BOB_EVENT + ":keys")["advice"]
    # as if stored before the rule: straight into the policy service, bypassing the PAP's checks
    gw.services.policies.add(policy(ALICE_POLICY, ("astream",), advice=echo,
                                    obligations=stream_obligations(
                                        f"area IN {{environment:{BOB_EVENT}:keys}}")),
                             owner=ALICE, source="legacy")
    gw.services.policies.add(policy("urn:admin:echo", (), advice=echo), owner=ADMIN,
                             source="admin")
    assert add(gw, BOB, policy(BOB_POLICY, ("bstream",), (CAROL,))).status_code == 201
    closed = decide(gw, ALICE, "astream")
    gw.open_event("bstream", "bevent", KEY)
    assert gw.services.stream_events.environment("bstream")  # open, with its key
    assert gw.services.stream_events.environment("astream") == []
    # Alice asks about her own stream: neither her legacy policy nor the administrator's sees
    # Bob's event; the answer is what it was while the event was closed
    assert decide(gw, ALICE, "astream") == closed and KEY not in closed
    r = gw.call("POST", "/explain", ALICE, data=request("astream"), headers=JSON_TYPE)
    assert KEY not in r.get_data(as_text=True)
    r = gw.call("POST", "/requests", ALICE, data=request("astream"), headers=JSON_TYPE)
    assert KEY not in r.get_data(as_text=True)
    # a request naming both streams sees no event at all
    both = json.loads(request("astream"))
    both["Request"]["Resource"]["Attribute"][0]["Value"] = ["astream", "bstream"]
    r = gw.call("POST", "/pdp", ALICE, data=json.dumps(both), headers=JSON_TYPE)
    assert r.status_code == 200 and KEY not in r.get_data(as_text=True)
    # a decision about bstream sees bstream's events (here through the administrator's policy,
    # which applies to any stream: his to write)
    assert KEY in decide(gw, ALICE, "bstream")


def needs(stream: str, event: str) -> dict:
    """A policy's parts that permit only while the event is open."""
    return reading("condition", f"urn:xsg:event:{stream}:{event}")


def test_a_joins_sides_each_see_their_own_streams_events(gw):
    """Carol's join of astream with bstream: each side is decided with its own stream's events,
    never the other's (the second side's request is bound to bstream's environment, not to the
    first side's)."""
    assert gw.call("POST", "/streams/astream/events", ALICE,
                   json={"name": "aevent", "condition": "speed > 50"}).status_code == 201
    assert add(gw, ALICE, policy(ALICE_POLICY, ("astream",), (CAROL,),
                                 **needs("astream", "aevent"))).status_code == 201
    # an administrator's policy on bstream that waits for astream's event: a decision about
    # bstream never sees it, so it never permits, even inside a join with astream
    assert add(gw, ADMIN, policy("urn:admin:b", ("bstream",), (CAROL,),
                                 **needs("astream", "aevent"))).status_code == 201
    body = request("astream", join_query("bstream"))
    r = gw.call("POST", "/requests", CAROL, data=body, headers=JSON_TYPE)
    assert r.status_code == 403 and "to stream 'astream'" in r.get_data(as_text=True)
    gw.open_event("astream", "aevent")
    r = gw.call("POST", "/requests", CAROL, data=body, headers=JSON_TYPE)
    assert r.status_code == 403 and "to stream 'bstream'" in r.get_data(as_text=True)
    # Bob's own policy waiting for his own event: the join opens once both events are open
    assert add(gw, BOB, policy(BOB_POLICY, ("bstream",), (CAROL,),
                               **needs("bstream", "bevent"))).status_code == 201
    assert gw.call("DELETE", "/policies/urn:admin:b", ADMIN).status_code == 204
    r = gw.call("POST", "/requests", CAROL, data=body, headers=JSON_TYPE)
    assert r.status_code == 403 and "to stream 'bstream'" in r.get_data(as_text=True)
    gw.open_event("bstream", "bevent", KEY)
    r = gw.call("POST", "/requests", CAROL, data=body, headers=JSON_TYPE)
    assert r.status_code == 201, r.json


def test_an_event_change_re_decides_only_the_handles_on_its_stream(gw):
    assert add(gw, ALICE, policy(ALICE_POLICY, ("astream",), (CAROL,))).status_code == 201
    assert add(gw, BOB, policy(BOB_POLICY, ("bstream",), (CAROL,),
                               **needs("bstream", "bevent"))).status_code == 201
    decided = []
    original = gw.services.revocation.reevaluate

    def reevaluate(record, *args, **kwargs):
        decided.append(record.stream)
        return original(record, *args, **kwargs)

    gw.services.revocation.reevaluate = reevaluate
    assert gw.call("POST", "/requests", CAROL, data=request("astream"),
                   headers=JSON_TYPE).status_code == 201
    gw.open_event("bstream", "bevent", KEY)
    assert decided == []  # carol's astream handle cannot depend on bstream's event
    r = gw.call("POST", "/requests", CAROL, data=request("bstream"), headers=JSON_TYPE)
    assert r.status_code == 201, r.json
    gw.open_event("bstream", "bevent", KEY + "-2")  # a new key: bstream's handles again
    assert decided == ["bstream"]
    gw.services.stream_events._clock = lambda: 4e9  # long after: the event closes
    assert gw.services.stream_events.tick()
    assert gw.services.handles.get(r.json["id"]).state.value == "revoked"
    assert [h["stream"] for h in gw.call("GET", "/handles", CAROL).json["handles"]
            if h["state"] == "live"] == ["astream"]


def test_event_definitions_and_states_are_for_the_owner_and_administrators(gw):
    gw.open_event("bstream", "bevent", KEY)
    for who in (ALICE, CAROL):
        r = gw.call("GET", "/streams/bstream/events", who)
        assert r.status_code == 403 and KEY not in r.get_data(as_text=True)
    for who in (BOB, ADMIN):
        events = gw.call("GET", "/streams/bstream/events", who).json["events"]
        assert events[0]["open"] is True and events[0]["keys"] == 1


# -- 2. the audit trail of a join: each owner reads its own side ----------------------------------

@pytest.fixture
def joined(gw):
    """Carol's live join of astream (Alice's) with bstream (Bob's)."""
    assert add(gw, ALICE, policy(ALICE_POLICY, ("astream",), (CAROL, DAVE), obligations=(
        stream_obligations("speed > 1", ("ts", "mmsi", "area"))))).status_code == 201
    assert add(gw, BOB, policy(BOB_POLICY, ("bstream",), (CAROL,), obligations=(
        stream_obligations(BOB_FILTER, ("ts", "mmsi"))))).status_code == 201
    r = gw.call("POST", "/requests", CAROL, data=request("astream", join_query("bstream")),
                headers=JSON_TYPE)
    assert r.status_code == 201, r.json
    return gw, r.json["id"]


def audit(gw: Gateway, who: str, **params) -> list[dict]:
    r = gw.call("GET", "/audit", who, query_string=params)
    assert r.status_code == 200, r.json
    return r.json["entries"]


def text(entries: list[dict]) -> str:
    return json.dumps(entries)


def test_a_joins_grant_names_both_streams_and_each_owner_reads_its_side(joined):
    gw, _ = joined
    [full] = audit(gw, ADMIN, kind="granted")
    assert full["streams"] == ["astream", "bstream"] and full["plan"]["join"]
    sides = {s["stream"]: s for s in full["sides"]}
    assert [p["id"] for p in sides["astream"]["policies"]] == [ALICE_POLICY]
    assert [p["id"] for p in sides["bstream"]["policies"]] == [BOB_POLICY]
    assert "BOBFILTER" in json.dumps(sides["bstream"]["plan"])

    [alices] = audit(gw, ALICE, kind="granted")
    assert alices["subject"] == CAROL and alices["streams"] == ["astream", "bstream"]
    assert [s["stream"] for s in alices["sides"]] == ["astream"]
    assert alices["sides"][0]["policies"][0]["id"] == ALICE_POLICY
    assert {"plan", "policies", "plan_key"} <= set(alices["withheld"])
    assert BOB_POLICY not in text([alices]) and "BOBFILTER" not in text([alices])
    assert "speed" not in json.dumps(alices["sides"][0]["plan"]["projection"])

    # Bob sees that Carol reads his stream through a join, and his side only
    [bobs] = audit(gw, BOB, kind="granted")
    assert bobs["subject"] == CAROL and [s["stream"] for s in bobs["sides"]] == ["bstream"]
    assert ALICE_POLICY not in text([bobs]) and "speed > 1" not in text([bobs])
    # ?stream= matches either side
    assert [e["seq"] for e in audit(gw, BOB, stream="bstream", kind="granted")] == [bobs["seq"]]
    assert [e["seq"] for e in audit(gw, ADMIN, stream="bstream", kind="granted")] == [full["seq"]]
    assert audit(gw, ALICE, stream="bstream", kind="granted") == [alices]


def test_the_revocation_and_release_of_a_join_reach_both_owners_without_the_others_reasons(joined):
    gw, hid = joined
    # Bob narrows his policy: the join is revoked; the reason names his policy
    narrower = policy(BOB_POLICY, ("bstream",), (CAROL,), obligations=stream_obligations(
        BOB_FILTER + " AND mmsi > 5", ("ts", "mmsi")))
    assert gw.call("PUT", f"/policies/{BOB_POLICY}", BOB, data=narrower,
                   headers=XML).status_code == 200
    assert gw.services.handles.get(hid).state.value == "revoked"
    [full] = audit(gw, ADMIN, kind="handle-revoked")
    assert BOB_POLICY in full["reason"] and full["streams"] == ["astream", "bstream"]
    [alices] = audit(gw, ALICE, kind="handle-revoked")
    assert "reason" not in alices and alices["withheld"] == ["reason"]
    assert BOB_POLICY not in text(audit(gw, ALICE))
    [bobs] = audit(gw, BOB, kind="handle-revoked")
    assert bobs["handle_ref"] == alices["handle_ref"] == full["handle_ref"]
    # a release is the consumer's doing: both owners read it whole
    r = gw.call("POST", "/requests", CAROL, data=request("astream", join_query("bstream")),
                headers=JSON_TYPE)
    assert r.status_code == 201, r.json
    assert gw.call("DELETE", f"/handles/{r.json['id']}", CAROL).status_code == 200
    for who in (ALICE, BOB):
        [released] = audit(gw, who, kind="handle-released")
        assert released["reason"] == "released by its owner"
        assert released["streams"] == ["astream", "bstream"]


def test_a_refused_join_shows_its_reason_to_the_owner_of_the_side_that_refused(joined):
    gw, _ = joined
    # Dave may read astream, not bstream: Bob's side refuses (his policy is NotApplicable)
    r = gw.call("POST", "/requests", DAVE, data=request("astream", join_query("bstream")),
                headers=JSON_TYPE)
    assert r.status_code == 403 and "to stream 'bstream'" in r.get_data(as_text=True)
    [full] = audit(gw, ADMIN, kind="refused")
    assert full["side"] == "bstream" and full["streams"] == ["astream", "bstream"]
    [bobs] = audit(gw, BOB, kind="refused")
    assert bobs["reason"] == full["reason"]
    [alices] = audit(gw, ALICE, kind="refused")
    assert alices["subject"] == DAVE and "reason" not in alices
    # a join refused as a whole (its condition uses what Bob's side hides): reason to neither
    live = gw.call("GET", "/handles", CAROL).json["handles"][0]["id"]
    assert gw.call("DELETE", f"/handles/{live}", CAROL).status_code == 200
    hidden = {"join": {"stream": "bstream", "on": [["area", "area"]], "within": 30}}
    r = gw.call("POST", "/requests", CAROL, data=request("astream", hidden), headers=JSON_TYPE)
    assert r.status_code == 403 and "area" in r.json["error"], r.json
    whole = audit(gw, ADMIN, kind="refused")[-1]
    assert whole["subject"] == CAROL and "side" not in whole and "area" in whole["reason"]
    for who in (ALICE, BOB):
        seen = audit(gw, who, kind="refused")[-1]
        assert seen["seq"] == whole["seq"] and "reason" not in seen


def test_the_policy_handles_count_shows_an_owner_only_its_own_streams(joined):
    gw, _ = joined
    r = gw.call("GET", f"/policies/{ALICE_POLICY}/handles", ALICE)
    assert r.json["streams"] == {"astream": 1} and r.json["subjects"] == [CAROL]
    r = gw.call("GET", f"/policies/{BOB_POLICY}/handles", BOB)
    assert r.json["streams"] == {"bstream": 1}
    r = gw.call("GET", f"/policies/{BOB_POLICY}/handles", ALICE)
    assert r.status_code == 403 and "BOBFILTER" not in r.get_data(as_text=True)


def test_audit_entries_written_before_joins_were_split_are_split_when_read(gw):
    """An entry of the earlier form (a join grant under its first stream only, the whole plan)
    is cut at read time: its plan names both streams."""
    plan = {"join": {"left": {"stream": "astream", "filter": "speed > 1"},
                     "right": {"stream": "bstream", "filter": BOB_FILTER}},
            "streams": ["astream", "bstream"]}
    gw.services.audit.log.record("granted", subject=CAROL, stream="astream", handle_ref="0" * 16,
                                 plan_key="k", plan=plan,
                                 policies=[{"id": BOB_POLICY, "version": "1"}])
    [alices] = audit(gw, ALICE, kind="granted")
    assert [s["stream"] for s in alices["sides"]] == ["astream"] and "policies" not in alices
    assert "BOBFILTER" not in text([alices]) and BOB_POLICY not in text([alices])
    [bobs] = audit(gw, BOB, kind="granted")
    assert [s["stream"] for s in bobs["sides"]] == ["bstream"]


def test_an_owners_view_of_odd_entries_never_fails():
    """Entries are read back from files: whatever shape one has, a view is computed or the
    entry is left out, never an error (GET /audit must not answer 500)."""
    from pep.audit.views import owner_view

    def owns(s):
        return s == "astream"

    odd = [{}, {"stream": 3}, {"stream": "astream", "reason": ["x"], "streams": "ab"},
           {"kind": "policy-added", "streams": "astream"}, {"stream": "astream", "plan": []},
           {"streams": ["astream", "bstream"], "sides": [1, {"stream": None}], "reason": {}},
           {"stream": "astream", "plan": {"join": {"left": 1, "right": {"stream": "bstream"}}}}]
    views = [owner_view(entry, owns) for entry in odd]
    assert views[0] is None and views[1] is None
    assert views[5]["sides"] == [] and views[5]["withheld"] == ["reason"]
    assert views[6]["streams"] == ["astream", "bstream"] and "plan" not in views[6]
