"""Re-sharing over HTTP (issue 48): a consumer with the grant option derives a stream from its
handle, writes policies for it (refused when wider than its grant), its own consumers read it;
ending or narrowing the upstream grant ends every downstream handle at once, transitively; the
audit trail shows each owner the chain and nothing of another owner's policies.

The gateway is the real one (PDP, catalogue, handles, revocation, audit) with a recording
stand-in for Spark, so the rows a deriving handle is delivered are pushed here as a micro-batch
would push them, and what reaches the derived stream is read from its ingest files; Spark's
side, end to end, is tests/e2e/test_derived_streams.py.
"""
from __future__ import annotations

import json

import pytest

from pep.audit.views import entry_streams
from pep.core.rows import RowBatch
from pep.handles.records import HandleState
from tests.pep.conftest import RecordingRuntime, build_gateway

TOKENS = {name: f"tok-{name}-d3r1ved-{i:04d}" for i, name in
          enumerate(("root", "met", "lta", "kim", "other", "zed"))}
RULE = {"Content-Type": "application/vnd.xsg.rule+json"}
XML = {"Content-Type": "application/xacml+xml"}
RAIN = {"name": "rain", "source": {"kind": "ingest"}, "time_attribute": "ts",
        "schema": [{"name": "ts", "type": "timestamp"}, {"name": "station", "type": "string"},
                   {"name": "rate", "type": "double"}, {"name": "humidity", "type": "double"}]}
LTA_RULE = {"id": "urn:t:rain:lta", "stream": "rain", "who": {"subjects": ["lta"]},
            "attributes": ["ts", "station", "rate"], "filter": "rate > 8",
            "mask": {"rate": "round:5"}, "grant_option": True}
KIM_RULE = {"id": "urn:t:rain:kim", "stream": "rain", "who": {"subjects": ["kim"]}}
ROWS = [{"ts": f"2026-01-01T00:00:0{i:d}Z", "station": f"S{i % 2}", "rate": 10.0 + 5 * i}
        for i in range(4)]


def bearer(who: str, **extra) -> dict:
    return {"Authorization": f"Bearer {TOKENS[who]}", **extra}


def access(stream: str, action: str = "read") -> bytes:
    return json.dumps({"Request": {
        "Resource": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:"
                                                   "resource-id", "Value": stream}]},
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:"
                                                 "action-id", "Value": action}]}}}).encode()


@pytest.fixture
def gw(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    roles = {"root": [], "met": ["data-owner"]}
    (data / "auth.json").write_text(json.dumps([
        {"token": TOKENS[n], "subject": n, "roles": roles.get(n, ["consumer"]),
         "admin": n == "root"} for n in TOKENS]))
    runtime = RecordingRuntime()
    app, services = build_gateway(data, runtime)
    client = app.test_client()
    assert client.post("/streams", headers=bearer("met"), json=RAIN).status_code == 201
    add_rule(client, "met", LTA_RULE)
    add_rule(client, "met", KIM_RULE)
    yield client, runtime, services, data
    services.close()


def add_rule(client, who: str, rule: dict, status: int = 201):
    r = client.post("/policies", headers=bearer(who, **RULE), data=json.dumps(rule))
    assert r.status_code == status, r.json
    return r.json


def ask(client, who: str, stream: str, status: int = 201) -> dict:
    r = client.post("/requests", headers=bearer(who, **{"Content-Type": "application/xacml+json"}),
                    data=access(stream))
    assert r.status_code == status, r.json
    return r.json


def derive(client, who: str, handle: str, status: int = 201, **body):
    r = client.post(f"/handles/{handle}/derive", headers=bearer(who), json=body)
    assert r.status_code == status, r.json
    return r.json


def fed(data, stream: str) -> list[dict]:
    """What the derived stream's ingest holds (the runtime is a stand-in: nothing consumes it)."""
    rows = []
    for path in sorted((data / "streams" / stream / "ingest").glob("*.json")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if k != "_xsg_seq"} for r in rows]


def masked(row: dict) -> dict:
    """The deriving grant's view of a source row (rate > 8, rate round:5, no humidity)."""
    return {"ts": row["ts"].replace("Z", ".000000Z"), "station": row["station"],
            "rate": float(int(row["rate"] // 5) * 5)}


def test_a_consumer_with_the_grant_option_derives_a_stream_and_re_shares_it(gw):
    client, runtime, services, data = gw
    lta = ask(client, "lta", "rain")
    assert lta["grant_option"] is True
    kim = ask(client, "kim", "rain")
    assert "grant_option" not in kim
    # without the option: 403 saying why
    r = client.post(f"/handles/{kim['id']}/derive", headers=bearer("kim"), json={"name": "k"})
    assert r.status_code == 403 and "carries no grant option" in r.json["error"]
    out = derive(client, "lta", lta["id"], name="lta-rain", description="heavy rain, banded")
    assert out["owner"] == "lta" and out["visibility"] == "restricted"
    assert [(f["name"], f["type"]) for f in out["schema"]] == [
        ("ts", "timestamp"), ("station", "string"), ("rate", "double")]
    assert out["time_attribute"] == "ts"
    assert out["derived_from"] == {"stream": "rain", "holds": {
        "source": "rain", "masks": {"rate": "round:5"}, "window": None, "time_attribute": "ts"}}
    # one handle feeds one derived stream
    derive(client, "lta", lta["id"], 409, name="lta-rain2")

    # lta's policies for it: wider ones refused, naming what is wider
    hidden = add_rule(client, "lta", {"stream": "lta-rain", "who": {"subjects": ["other"]},
                                      "attributes": ["humidity"]}, 403)
    assert hidden["wider"] == "attribute" and hidden["field"] == "/attributes", hidden
    assert hidden["error"].startswith("/attributes names attribute 'humidity' of stream 'rain'")
    finer = add_rule(client, "lta", {"stream": "lta-rain", "who": {"subjects": ["other"]},
                                     "mask": {"rate": "round:1"}}, 403)
    assert finer["wider"] == "mask" and "round:5" in finer["error"], finer
    assert finer["field"] == "/mask"
    # a name that is no attribute of either stream: the schema check's 400
    typo = add_rule(client, "lta", {"stream": "lta-rain", "who": {"subjects": ["other"]},
                                    "attributes": ["rat"]}, 400)
    assert "has no attribute 'rat'" in typo["error"]
    # the preview says the same before anything is stored
    r = client.post("/rules/preview", headers=bearer("lta"), json={"rule": {
        "stream": "lta-rain", "who": {"subjects": ["other"]}, "mask": {"rate": "round:1"}}})
    assert r.status_code == 403 and r.json["wider"] == "mask", r.json
    document = (data.parent / "x.xml")
    document.write_text(xacml_naming("humidity"))
    r = client.post("/policies", headers=bearer("lta", **XML), data=document.read_bytes())
    assert r.status_code == 403 and r.json["wider"] == "attribute", r.json
    assert "hides" not in r.json["error"] and "refer to nothing" in r.json["error"]
    add_rule(client, "lta", {"id": "urn:t:lta-rain:other", "stream": "lta-rain",
                             "who": {"subjects": ["other"]}, "filter": "station = 'S1'",
                             "mask": {"rate": "round:10"}})

    # other reads it; lta cannot write into it, nor change its schema
    other = ask(client, "other", "lta-rain")
    assert other["plan"]["stream"] == "lta-rain"
    r = client.post("/streams/lta-rain/records", headers=bearer("lta", **{
        "Content-Type": "application/x-ndjson"}), data=b'{"ts": 1, "station": "x", "rate": 1}')
    assert r.status_code == 403 and "derived" in r.json["error"]
    r = client.patch("/streams/lta-rain", headers=bearer("lta"),
                     json={"add_attributes": [{"name": "x", "type": "double"}]})
    assert r.status_code == 409

    # the deriving handle's rows reach the derived stream's ingest, exactly
    batch = [masked(row) for row in ROWS]
    assert runtime.push(lta["id"], RowBatch.of(batch))
    assert fed(data, "lta-rain") == batch
    assert services.derived.feeds.stats()["lta-rain"]["rows"] == 4

    # the chain, as each may see it
    mine = client.get("/streams/lta-rain/derivation", headers=bearer("lta")).json
    assert mine["source"] == "rain" and mine["chain"] == ["rain"] and "policies" not in mine
    assert mine["plan"]["stream"] == "rain"
    theirs = client.get("/streams/lta-rain/derivation", headers=bearer("met")).json
    assert [p["id"] for p in theirs["policies"]] == ["urn:t:rain:lta"]
    assert client.get("/streams/lta-rain/derivation", headers=bearer("other")).status_code == 404


def xacml_naming(attribute: str) -> str:
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="urn:t:wide" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
      <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
        <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">lta-rain</AttributeValue>
        <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
          AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" MustBePresent="false"
          DataType="http://www.w3.org/2001/XMLSchema#string"/></Match></AllOf></AnyOf></Target>
      <Rule RuleId="r" Effect="Permit"><ObligationExpressions>
        <ObligationExpression ObligationId="exacml:obligation:stream-filter" FulfillOn="Permit">
          <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-filter-condition-id">
            <AttributeValue
              DataType="http://www.w3.org/2001/XMLSchema#string">{attribute} &gt; 1</AttributeValue>
          </AttributeAssignmentExpression></ObligationExpression>
      </ObligationExpressions></Rule></Policy>"""


def test_malformed_and_hostile_derivations_get_clear_4xx(gw):
    client, runtime, services, data = gw
    lta = ask(client, "lta", "rain")
    url = f"/handles/{lta['id']}/derive"
    cases = [
        (dict(data=b"name=x", headers=bearer("lta", **{"Content-Type": "text/plain"})), 415),
        (dict(data=b"{", headers=bearer("lta", **{"Content-Type": "application/json"})), 400),
        (dict(data=b"[" * 100_000, headers=bearer("lta", **{"Content-Type": "application/json"})),
         400),
        (dict(json=["lta-x"], headers=bearer("lta")), 400),
        (dict(json={}, headers=bearer("lta")), 400),
        (dict(json={"name": "../etc"}, headers=bearer("lta")), 400),
        (dict(json={"name": 7}, headers=bearer("lta")), 400),
        (dict(json={"name": "x" * 65}, headers=bearer("lta")), 400),
        (dict(json={"name": "ok", "owner": "met"}, headers=bearer("lta")), 400),
        (dict(json={"name": "ok", "visibility": "public"}, headers=bearer("lta")), 400),
        (dict(json={"name": "ok", "description": 5}, headers=bearer("lta")), 400),
        (dict(json={"name": "rain"}, headers=bearer("lta")), 409),  # taken (another owner's)
        (dict(json={"name": "ok"}, headers=bearer("kim")), 404),  # not kim's handle
        (dict(json={"name": "ok"}, headers={}), 401),
    ]
    for kwargs, status in cases:
        r = client.post(url, **kwargs)
        assert r.status_code == status, (kwargs.get("json"), r.status_code, r.get_data()[:300])
        if status != 401:
            assert r.json["error"], r.json
    assert client.post("/handles/not-a-handle/derive", headers=bearer("lta"),
                       json={"name": "ok"}).status_code == 404
    # nothing was registered by any of them
    assert client.get("/streams/ok", headers=bearer("root")).status_code == 404
    assert services.catalog.derivations.all() == []
    # a released handle is gone
    client.delete(f"/handles/{lta['id']}", headers=bearer("lta"))
    assert client.post(url, headers=bearer("lta"), json={"name": "ok"}).status_code == 410


def test_revoking_the_upstream_grant_ends_every_downstream_handle_transitively(gw):
    client, runtime, services, data = gw
    lta = ask(client, "lta", "rain")
    derive(client, "lta", lta["id"], name="lta-rain")
    add_rule(client, "lta", {"id": "urn:t:lta-rain:other", "stream": "lta-rain",
                             "who": {"subjects": ["other"]}, "grant_option": True})
    other = ask(client, "other", "lta-rain")
    assert other["grant_option"] is True
    derive(client, "other", other["id"], name="other-rain", visibility="listed")
    add_rule(client, "other", {"stream": "other-rain", "who": {"subjects": ["zed"]},
                               "attributes": ["ts", "rate"]})
    zed = ask(client, "zed", "other-rain")
    assert client.get("/streams/other-rain/derivation",
                      headers=bearer("met")).json["chain"] == ["lta-rain", "rain"]

    # met takes its grant back: lta's handle, then other's, then zed's, before the answer
    assert client.delete("/policies/urn:t:rain:lta", headers=bearer("met")).status_code == 204
    for who, handle in (("lta", lta), ("other", other), ("zed", zed)):
        record = services.handles.get(handle["id"])
        assert record.state is HandleState.REVOKED, (who, record)
        assert not runtime.push(handle["id"], RowBatch.of(ROWS[:1]))  # no row after it
    assert "derived stream 'lta-rain' ended" in services.handles.get(other["id"]).reason
    # the reason downstream readers get names nothing of met's policy
    assert "urn:t:rain:lta" not in services.handles.get(other["id"]).reason
    assert "urn:t:rain:lta" not in services.handles.get(zed["id"]).reason
    for name in ("lta-rain", "other-rain"):
        assert not services.catalog.derivations.get(name).live
        r = client.post("/requests", headers=bearer("zed" if name == "other-rain" else "other",
                                                    **{"Content-Type": "application/xacml+json"}),
                        data=access(name))
        assert r.status_code == 410 and "gets no new data" in r.json["error"], r.json
    # the streams stay registered, with their policies, until their owners delete them
    assert client.get("/streams/lta-rain", headers=bearer("lta")).status_code == 200
    assert client.delete("/streams/lta-rain", headers=bearer("lta")).status_code == 200
    assert services.catalog.derivations.get("lta-rain") is None


def test_taking_the_grant_option_away_or_releasing_the_handle_ends_the_feed(gw):
    client, runtime, services, data = gw
    lta = ask(client, "lta", "rain")
    derive(client, "lta", lta["id"], name="lta-rain")
    add_rule(client, "lta", {"stream": "lta-rain", "who": {"subjects": ["other"]}})
    other = ask(client, "other", "lta-rain")
    # the same view without the option: lta's handle was granted something else (revoked)
    r = client.put("/policies/urn:t:rain:lta", headers=bearer("met", **RULE),
                   data=json.dumps({**LTA_RULE, "grant_option": False}))
    assert r.status_code == 200, r.json
    assert services.handles.get(lta["id"]).state is HandleState.REVOKED
    assert services.handles.get(other["id"]).state is HandleState.REVOKED
    assert not runtime.push(lta["id"], RowBatch.of([masked(ROWS[0])]))
    assert fed(data, "lta-rain") == []
    # asked again, lta's new handle has no option: it cannot derive
    again = ask(client, "lta", "rain")
    assert "grant_option" not in again
    r = client.post(f"/handles/{again['id']}/derive", headers=bearer("lta"), json={"name": "b"})
    assert r.status_code == 403

    # with the option back, a new derivation; releasing the deriving handle ends it
    client.put("/policies/urn:t:rain:lta", headers=bearer("met", **RULE),
               data=json.dumps(LTA_RULE))
    lta2 = ask(client, "lta", "rain")
    derive(client, "lta", lta2["id"], name="lta-rain2")
    add_rule(client, "lta", {"stream": "lta-rain2", "who": {"subjects": ["other"]}})
    other2 = ask(client, "other", "lta-rain2")
    client.delete(f"/handles/{lta2['id']}", headers=bearer("lta"))
    assert services.handles.get(other2["id"]).state is HandleState.REVOKED
    assert not services.catalog.derivations.get("lta-rain2").live
    # deleting the source stream ends a derivation the same way
    lta3 = ask(client, "lta", "rain")
    derive(client, "lta", lta3["id"], name="lta-rain3")
    assert client.delete("/streams/rain", headers=bearer("met")).status_code == 200
    assert not services.catalog.derivations.get("lta-rain3").live


def test_the_audit_trail_shows_each_owner_the_chain_and_none_of_another_owners_policy(gw):
    client, runtime, services, data = gw
    lta = ask(client, "lta", "rain")
    derive(client, "lta", lta["id"], name="lta-rain")
    add_rule(client, "lta", {"id": "urn:t:lta-rain:other", "stream": "lta-rain",
                             "who": {"subjects": ["other"]}, "filter": "station = 'S1'"})
    ask(client, "other", "lta-rain")
    client.delete("/policies/urn:t:rain:lta", headers=bearer("met"))

    def entries(who: str, **params):
        r = client.get("/audit", headers=bearer(who), query_string=params)
        assert r.status_code == 200, r.json
        return r.json["entries"]

    met = entries("met", stream="rain")
    kinds = [e["kind"] for e in met]
    for kind in ("stream-derived", "granted", "derivation-ended", "handle-revoked"):
        assert kind in kinds, kinds
    text = json.dumps(met)
    assert "urn:t:lta-rain:other" not in text and "station = 'S1'" not in text  # lta's policy
    other_grant = next(e for e in met if e["kind"] == "granted" and e["stream"] == "lta-rain")
    assert other_grant["subject"] == "other" and other_grant["derived_from"] == ["rain"]
    assert "plan" not in other_grant and "policies" in other_grant["withheld"]
    derived = next(e for e in met if e["kind"] == "stream-derived")
    assert [p["id"] for p in derived["upstream"]["policies"]] == ["urn:t:rain:lta"]

    lta_view = entries("lta")
    text = json.dumps(lta_view)
    assert "urn:t:lta-rain:other" in text  # its own policy, in its consumer's grant
    # met's policies behind lta's grant, and why it ended, are met's
    assert not any("upstream" in e for e in lta_view) and "urn:t:rain:lta" not in text
    assert any(e["kind"] == "derivation-ended" and "upstream" in e["withheld"]
               for e in lta_view)
    assert all(entry_streams(e)[0] == "lta-rain" for e in lta_view), lta_view
    assert client.get("/audit", headers=bearer("other")).status_code == 403
    assert any(e["kind"] == "stream-derived" for e in entries("root"))


def test_a_derivation_survives_a_restart_and_ends_when_its_handle_does_not(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    entries = [{"token": TOKENS[n], "subject": n, "roles": ["data-owner"] if n == "met"
                else ["consumer"], "admin": False} for n in ("met", "lta", "other")]
    (data / "auth.json").write_text(json.dumps(entries))
    runtime = RecordingRuntime()
    app, services = build_gateway(data, runtime)
    client = app.test_client()
    client.post("/streams", headers=bearer("met"), json=RAIN)
    add_rule(client, "met", LTA_RULE)
    lta = ask(client, "lta", "rain")
    derive(client, "lta", lta["id"], name="lta-rain")
    add_rule(client, "lta", {"stream": "lta-rain", "who": {"subjects": ["other"]}})
    other = ask(client, "other", "lta-rain")
    services.close()

    # the same gateway again: both handles resumed, the feed with them
    runtime = RecordingRuntime()
    app, services = build_gateway(data, runtime)
    try:
        assert set(services.resumed) == {lta["id"], other["id"]}
        assert services.catalog.derivations.get("lta-rain").live
        assert runtime.push(lta["id"], RowBatch.of([masked(ROWS[1])]))
        assert fed(data, "lta-rain") == [masked(ROWS[1])]
    finally:
        services.close()

    # lta is gone from the auth file when it starts again: its handle is revoked at start, and
    # with it the derivation and other's handle on the derived stream
    (data / "auth.json").write_text(json.dumps([e for e in entries if e["subject"] != "lta"]))
    runtime = RecordingRuntime()
    app, services = build_gateway(data, runtime)
    try:
        assert services.handles.get(lta["id"]).state is HandleState.REVOKED
        assert services.handles.get(other["id"]).state is HandleState.REVOKED
        assert not services.catalog.derivations.get("lta-rain").live
        assert other["id"] not in runtime.attached
    finally:
        services.close()


def test_policies_kept_for_a_name_are_checked_when_it_is_derived_again(gw):
    client, runtime, services, data = gw
    lta = ask(client, "lta", "rain")
    derive(client, "lta", lta["id"], name="lta-rain")
    add_rule(client, "lta", {"id": "urn:t:lta-rain:other", "stream": "lta-rain",
                             "who": {"subjects": ["other"]}, "mask": {"rate": "round:5"}})
    # a join that reads a derived stream is refused (its audit could not show the chain)
    from pep.streams.derived import admit_streams
    with pytest.raises(Exception, match="join that reads a derived stream"):
        admit_streams(services.catalog.derivations,
                      [services.catalog.get("rain"), services.catalog.get("lta-rain")])
    # met narrows lta's grant: rates to the 10; lta's handle and derivation end
    client.put("/policies/urn:t:rain:lta", headers=bearer("met", **RULE),
               data=json.dumps({**LTA_RULE, "mask": {"rate": "round:10"}}))
    assert not services.catalog.derivations.get("lta-rain").live
    # lta deletes the ended stream, keeping its policies, and derives the name again from its
    # new, narrower handle: its kept rule shows rates to the 5, which this grant does not give
    assert client.delete("/streams/lta-rain", headers=bearer("lta")).status_code == 200
    again = ask(client, "lta", "rain")
    r = client.post(f"/handles/{again['id']}/derive", headers=bearer("lta"),
                    json={"name": "lta-rain"})
    assert r.status_code == 409 and r.json["policy"] == "urn:t:lta-rain:other", r.json
    assert "round:10" in r.json["error"]
    assert services.catalog.get("lta-rain") is None  # nothing registered
    client.delete("/policies/urn:t:lta-rain:other", headers=bearer("lta"))
    out = derive(client, "lta", again["id"], name="lta-rain")
    assert out["derived_from"]["holds"]["masks"] == {"rate": "round:10"}


def test_one_window_per_consumer_holds_across_a_derivation(gw):
    """A window over a derived stream's rows is a window over its source's tuples: a consumer
    who reads the source itself and what was derived from it could difference the two
    (eXACML+ Example 2), so it holds one query on both at a time."""
    client, runtime, services, data = gw
    lta = ask(client, "lta", "rain")
    derive(client, "lta", lta["id"], name="lta-rain")
    add_rule(client, "lta", {"stream": "lta-rain", "who": {"subjects": ["kim"]},
                             "window": {"type": "tuple", "size": 4, "aggregates": ["rate:sum"]}})
    kim = ask(client, "kim", "rain")  # kim's own grant on the source (every attribute)
    r = client.post("/requests", headers=bearer("kim", **{"Content-Type":
                                                          "application/xacml+json"}),
                    data=access("lta-rain"))
    assert r.status_code == 409, r.json
    assert r.json["handle"].endswith(kim["id"]) and "'rain'" in r.json["error"]
    client.delete(f"/handles/{kim['id']}", headers=bearer("kim"))
    on_derived = ask(client, "kim", "lta-rain")
    r = client.post("/requests", headers=bearer("kim", **{"Content-Type":
                                                          "application/xacml+json"}),
                    data=access("rain"))
    assert r.status_code == 409 and r.json["handle"].endswith(on_derived["id"]), r.json
