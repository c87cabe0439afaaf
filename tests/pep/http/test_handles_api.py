"""POST /requests and /handles over HTTP with the real PDP, processor and handle service.

The stream runtime is a recording stand-in (rows are pushed through the very deliver callback
Spark would call); tests/e2e runs the same paths on real Spark.
"""
from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

POLICIES = Path(__file__).resolve().parents[3] / "policies" / "weather"
NEA_POLICY_ID = "urn:xsg:example:weather:nea-policy"
WEATHER = {"name": "weather", "time_attribute": "samplingtime", "source": {"kind": "ingest"},
           "schema": [{"name": n, "type": t} for n, t in (
               ("samplingtime", "timestamp"), ("temperature", "double"), ("humidity", "double"),
               ("solarradiation", "double"), ("rainrate", "double"), ("windspeed", "double"),
               ("winddirection", "long"), ("barometer", "double"))]}
XML = {"Content-Type": "application/xacml+xml"}
ND = {"Accept": "application/x-ndjson"}


@pytest.fixture
def gw(tmp_path):
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path / "data", runtime)
    client = app.test_client()
    r = client.post("/streams", json=WEATHER, headers=auth_header("nea"))
    assert r.status_code == 201, r.json
    r = client.post("/policies", data=(POLICIES / "nea-weather-policy.xml").read_bytes(),
                    headers=auth_header("nea", **XML))
    assert r.status_code == 201, r.json
    yield client, runtime, services, tmp_path
    services.close()


def request_xml(name: str = "lta-request.xml") -> bytes:
    return (POLICIES / name).read_bytes()


def post_request(client, who="lta", body=None, **kw):
    return client.post("/requests", data=body if body is not None else request_xml(),
                       headers=auth_header(who, **XML), **kw)


def read_lines(client, url_or_path, who="lta", until_final=True, max_lines=50, **headers):
    path = url_or_path.split("://", 1)[-1].split("/", 1)[-1]
    r = client.get("/" + path, headers=auth_header(who, **ND, **headers), buffered=False)
    if r.status_code != 200:
        return r, []
    out = []
    for chunk in r.response:
        for text in (chunk.decode() if isinstance(chunk, bytes) else chunk).splitlines():
            obj = json.loads(text)
            if obj.get("event") == "heartbeat":
                if not until_final:
                    r.close()
                    return r, out
                continue
            out.append(obj)
            if obj.get("event") in ("revoked", "released", "ended") or len(out) >= max_lines:
                r.close()
                return r, out
    return r, out


def test_permit_gives_handle_and_repeat_gives_same(gw):
    client, runtime, *_ = gw
    r = post_request(client)
    assert r.status_code == 201, r.get_data(as_text=True)
    body = r.json
    assert body["handle"].startswith("http://localhost/handles/") and body["new"] is True
    assert r.headers["Location"] == body["handle"]
    assert body["plan"] and NEA_POLICY_ID in body["policy_ids"]
    assert {w["kind"] for w in body["warnings"]} <= {"PR"}
    hid = body["id"]
    assert len(hid) == 43 and hid in runtime.attached
    _, plan, _ = runtime.attached[hid]
    assert plan.window.size == 5 and plan.window.step == 2
    assert set(plan.projection) <= {"samplingtime", "rainrate", "windspeed"}
    again = post_request(client)
    assert again.status_code == 200 and again.json["id"] == hid and len(runtime.attached) == 1
    listed = client.get("/handles", headers=auth_header("lta")).json["handles"]
    assert [(h["id"], h["state"]) for h in listed] == [(hid, "live")]


def test_one_window_per_user(gw):
    client, runtime, *_ = gw
    first = post_request(client).json["id"]
    r = post_request(client, body=request_xml("lta-request-with-query.xml"))
    assert r.status_code == 409
    assert r.json["handle"].endswith(first) and "release" in r.json
    assert client.delete(f"/handles/{first}", headers=auth_header("lta")).status_code == 200
    r = post_request(client, body=request_xml("lta-request-with-query.xml"))
    assert r.status_code == 201 and r.json["id"] != first
    assert runtime.attached[r.json["id"]][1].window.size == 10


def test_deny_is_403_with_xacml_and_starts_nothing(gw):
    client, runtime, *_ = gw
    r = post_request(client, who="other")
    assert r.status_code == 403 and r.mimetype == "application/xacml+xml"
    assert b"Deny" in r.data
    assert runtime.attached == {}


def test_subject_is_the_caller_not_the_file(gw):
    client, runtime, *_ = gw
    forged = request_xml().replace(b">lta<", b">nea<")  # claims to be the owner
    r = post_request(client, who="lta", body=forged)
    assert r.status_code == 201
    _, plan, _ = runtime.attached[r.json["id"]]
    assert plan.window is not None  # LTA's windowed view, not NEA's raw stream
    r = post_request(client, who="other", body=forged)
    assert r.status_code == 403


def test_nr_is_422_and_starts_nothing(gw):
    client, runtime, *_ = gw
    query = b"""<UserQuery><Stream name="weather"/><Filter><FilterCondition>rainrate &lt; 3
      </FilterCondition></Filter></UserQuery>"""
    r = client.post("/requests", headers=auth_header("lta"), data={
        "request": (__import__("io").BytesIO(request_xml()), "r.xml", "application/xacml+xml"),
        "query": (__import__("io").BytesIO(query), "q.xml", "application/xml")},
        content_type="multipart/form-data")
    assert r.status_code == 422, r.get_data(as_text=True)
    assert "no result" in r.json["error"] and r.json["warnings"][0]["kind"] == "NR"
    assert runtime.attached == {}
    assert client.get("/handles", headers=auth_header("lta")).json["handles"] == []


def test_multipart_with_query_part(gw):
    client, runtime, *_ = gw
    query = b"""<UserQuery><Stream name="weather"/><Filter><FilterCondition>rainrate &gt; 50
      </FilterCondition></Filter></UserQuery>"""
    r = client.post("/requests", headers=auth_header("lta"),
                    data={"request": request_xml().decode(), "query": query.decode()},
                    content_type="multipart/form-data")
    assert r.status_code == 201, r.get_data(as_text=True)
    _, plan, _ = runtime.attached[r.json["id"]]
    values = {p.value for conj in plan.filter_dnf for p in conj}
    assert 50 in values or 50.0 in values


@pytest.mark.parametrize("body, ctype, status", [
    (b"", "application/xacml+xml", 400),
    (b"<Request", "application/xacml+xml", 400),
    (b"hello", "text/plain", 415),
])
def test_malformed_requests(gw, body, ctype, status):
    client, runtime, *_ = gw
    r = client.post("/requests", data=body, headers=auth_header("lta", **{"Content-Type": ctype}))
    assert r.status_code == status
    assert runtime.attached == {}


def test_reading_rows_resume_and_owner_only(gw):
    client, runtime, *_ = gw
    hid = post_request(client).json["id"]
    assert runtime.push(hid, [{"avg_rainrate": float(i)} for i in range(3)])
    r, lines = read_lines(client, f"/handles/{hid}", until_final=False)
    assert r.status_code == 200 and r.mimetype == "application/x-ndjson"
    assert [x["row"]["avg_rainrate"] for x in lines] == [0.0, 1.0, 2.0]
    assert [x["id"] for x in lines] == [1, 2, 3]
    _, lines = read_lines(client, f"/handles/{hid}", until_final=False,
                          **{"Last-Event-ID": "2"})
    assert [x["id"] for x in lines] == [3]
    # another subject, a wrong id, and no token
    assert client.get(f"/handles/{hid}", headers=auth_header("other", **ND)).status_code == 404
    assert client.get(f"/handles/{hid[:-1]}x", headers=auth_header("lta", **ND)).status_code \
        == 404
    assert client.get(f"/handles/{hid}", headers=ND).status_code == 401
    assert client.delete(f"/handles/{hid}", headers=auth_header("other")).status_code == 404
    assert client.get("/handles", headers=auth_header("other")).json["handles"] == []
    assert client.get(f"/handles/{hid}", headers=auth_header("lta", Accept="image/png")) \
        .status_code == 406
    r = client.get(f"/handles/{hid}", headers=auth_header("lta", Accept="application/json"))
    assert r.json["state"] == "live"


def test_sse_stream(gw):
    client, runtime, *_ = gw
    hid = post_request(client).json["id"]
    runtime.push(hid, [{"x": 1}])
    r = client.get(f"/handles/{hid}", headers=auth_header("lta", Accept="text/event-stream"),
                   buffered=False)
    assert r.mimetype == "text/event-stream"
    assert r.headers["Cache-Control"].startswith("no-cache")
    it = iter(r.response)
    assert next(it) == b": connected\n\n"
    assert next(it) == b'id: 1\ndata: {"x":1}\n\n'
    assert next(it) == b": keep-alive\n\n"
    client.delete(f"/handles/{hid}", headers=auth_header("lta"))
    final = next(it).decode()
    assert final.startswith("id: 2\nevent: released\n")
    with pytest.raises(StopIteration):
        next(it)
    r.close()


def test_policy_delete_revokes_and_later_reads_are_410(gw):
    client, runtime, services, *_ = gw
    hid = post_request(client).json["id"]
    deliver = runtime.attached[hid][2]
    r = client.get(f"/handles/{hid}", headers=auth_header("lta", **ND), buffered=False)
    it = iter(r.response)
    d = client.delete(f"/policies/{NEA_POLICY_ID}", headers=auth_header("nea"))
    assert d.status_code == 204
    # when DELETE answered, the handle was already revoked: nothing more can be written
    assert deliver([{"late": True}]) is False and hid in runtime.detached
    lines = []
    for chunk in it:
        lines += [json.loads(x) for x in chunk.decode().splitlines()]
        if lines and lines[-1].get("event") == "revoked":
            break
    assert lines[-1]["event"] == "revoked" and NEA_POLICY_ID in lines[-1]["reason"]
    assert not any("row" in x for x in lines)
    r.close()
    g = client.get(f"/handles/{hid}", headers=auth_header("lta", **ND))
    assert g.status_code == 410 and g.json["state"] == "revoked"
    assert client.delete(f"/handles/{hid}", headers=auth_header("lta")).status_code == 410
    assert client.get("/handles", headers=auth_header("lta")).json["handles"][0]["state"] \
        == "revoked"
    # and a new request is refused now
    assert post_request(client).status_code == 403


def test_added_deny_policy_revokes(gw):
    client, runtime, *_ = gw
    hid = post_request(client).json["id"]
    deny = b"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="urn:t:deny-lta" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides">
      <Target/><Rule RuleId="r" Effect="Deny"><Target><AnyOf><AllOf>
        <Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
          <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">lta</AttributeValue>
          <AttributeDesignator MustBePresent="false"
            Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
            AttributeId="urn:oasis:names:tc:xacml:1.0:subject:subject-id"
            DataType="http://www.w3.org/2001/XMLSchema#string"/></Match>
      </AllOf></AnyOf></Target></Rule></Policy>"""
    r = client.post("/policies", data=deny, headers=auth_header("nea", **XML))
    assert r.status_code == 201, r.json
    rec = client.get("/handles", headers=auth_header("lta")).json["handles"][0]
    assert rec["state"] == "revoked" and "urn:t:deny-lta" in rec["reason"]
    assert hid in runtime.detached


def test_updated_obligations_revoke(gw):
    client, runtime, *_ = gw
    hid = post_request(client).json["id"]
    changed = (POLICIES / "nea-weather-policy.xml").read_bytes().replace(
        b'Version="1.0"', b'Version="1.1"').replace(b"rainrate &gt; 5", b"rainrate &gt; 10")
    r = client.put(f"/policies/{NEA_POLICY_ID}", data=changed, headers=auth_header("nea", **XML))
    assert r.status_code == 200, r.json
    rec = client.get("/handles", headers=auth_header("lta")).json["handles"][0]
    assert rec["state"] == "revoked" and "obligations changed" in rec["reason"]
    # an update that changes nothing for the plan keeps the handle
    hid2 = post_request(client).json["id"]
    same = changed.replace(b'Version="1.1"', b'Version="1.2"')
    assert client.put(f"/policies/{NEA_POLICY_ID}", data=same,
                      headers=auth_header("nea", **XML)).status_code == 200
    assert client.get(f"/handles/{hid2}", headers=auth_header(
        "lta", Accept="application/json")).json["state"] == "live"
    assert hid2 != hid


def test_time_limited_grant_ends_on_time(gw):
    client, runtime, services, _ = gw
    until = (datetime.now(UTC) + timedelta(seconds=1.5)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    timed = (POLICIES / "nea-weather-policy.xml").read_bytes().replace(
        b'Version="1.0"', b'Version="2.0"').replace(
        b'<Rule RuleId="urn:xsg:example:weather:lta-reads-windows" Effect="Permit">',
        b'<Rule RuleId="urn:xsg:example:weather:lta-reads-windows" Effect="Permit">'
        b'<Condition><Apply FunctionId="urn:oasis:names:tc:xacml:1.0:function:dateTime-less-than">'
        b'<Apply FunctionId="urn:oasis:names:tc:xacml:1.0:function:dateTime-one-and-only">'
        b'<AttributeDesignator'
        b' Category="urn:oasis:names:tc:xacml:3.0:attribute-category:environment"'
        b' AttributeId="urn:oasis:names:tc:xacml:1.0:environment:current-dateTime"'
        b' DataType="http://www.w3.org/2001/XMLSchema#dateTime" MustBePresent="false"/></Apply>'
        b'<AttributeValue DataType="http://www.w3.org/2001/XMLSchema#dateTime">' + until.encode()
        + b'</AttributeValue></Apply></Condition>', 1)
    # Condition must follow Target inside a Rule: move it after the rule's Target.
    head, rest = timed.split(b'Effect="Permit"><Condition>', 1)
    cond, after = rest.split(b"</Condition>", 1)
    target_end = after.index(b"</Target>") + len(b"</Target>")
    timed = (head + b'Effect="Permit">' + after[:target_end] + b"<Condition>" + cond
             + b"</Condition>" + after[target_end:])
    r = client.put(f"/policies/{NEA_POLICY_ID}", data=timed, headers=auth_header("nea", **XML))
    assert r.status_code == 200, r.json
    assert services.revocation.time_sensitive
    hid = post_request(client)
    assert hid.status_code == 201, hid.get_data(as_text=True)
    hid = hid.json["id"]
    deadline = time.monotonic() + 6
    state = "live"
    while time.monotonic() < deadline and state == "live":
        time.sleep(0.1)
        state = client.get("/handles", headers=auth_header("lta")).json["handles"][0]["state"]
    assert state == "revoked"
    assert datetime.now(UTC) >= datetime.fromisoformat(until.replace("Z", "+00:00"))
    assert hid in runtime.detached


def test_restart_keeps_permitted_handles_and_ends_others(tmp_path):
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path / "data", runtime)
    c = app.test_client()
    c.post("/streams", json=WEATHER, headers=auth_header("nea"))
    c.post("/policies", data=(POLICIES / "nea-weather-policy.xml").read_bytes(),
           headers=auth_header("nea", **XML))
    lta = post_request(c).json["id"]
    nea = post_request(c, who="nea").json["id"]
    runtime.push(lta, [{"v": 1}])
    services.close()

    runtime2 = RecordingRuntime()
    app2, services2 = build_gateway(tmp_path / "data", runtime2)
    c2 = app2.test_client()
    assert sorted(services2.resumed) == sorted([lta, nea]) and services2.ended == []
    assert set(runtime2.attached) == {lta, nea}
    runtime2.push(lta, [{"v": 2}])
    _, lines = read_lines(c2, f"/handles/{lta}", until_final=False, **{"Last-Event-ID": "1"})
    assert lines[0]["event"] == "gap" and lines[0]["lost"] is None
    assert lines[1]["row"] == {"v": 2} and lines[1]["id"] > 1
    # the same request after the restart maps to the same handle
    assert post_request(c2).json["id"] == lta
    # policies change while the gateway is down: the next start ends what is no longer allowed
    services2.close_stream_side()
    services2.policies.delete(NEA_POLICY_ID, owner="nea")
    services2.close()
    app3, services3 = build_gateway(tmp_path / "data", RecordingRuntime())
    assert services3.resumed == [] and sorted(services3.ended) == sorted([lta, nea])
    c3 = app3.test_client()
    g = c3.get(f"/handles/{lta}", headers=auth_header("lta", **ND))
    assert g.status_code == 410 and "gateway start" in g.json["reason"]
    services3.close()


def test_ended_handles_are_published_to_the_invalidation_hub(tmp_path):
    from pep.invalidation.hub import InvalidationHub

    hub = InvalidationHub()
    app, services = build_gateway(tmp_path / "data", RecordingRuntime(), invalidation=hub)
    try:
        c = app.test_client()
        c.post("/streams", json=WEATHER, headers=auth_header("nea"))
        c.post("/policies", data=(POLICIES / "nea-weather-policy.xml").read_bytes(),
               headers=auth_header("nea", **XML))
        first = post_request(c).json["id"]
        c.delete(f"/handles/{first}", headers=auth_header("lta"))
        second = post_request(c).json["id"]
        assert c.delete(f"/policies/{NEA_POLICY_ID}", headers=auth_header("nea")).status_code \
            == 204
        events, complete = hub.events_after(0)
        handle_events = [(e.kind, e.handle_ids) for e in events if e.kind.startswith("handle-")]
        assert complete and handle_events == [("handle-released", (first,)),
                                              ("handle-revoked", (second,))]
    finally:
        services.close()
        hub.close()


def without_action(body: bytes, action: bytes | None = None) -> bytes:
    """The request with its action category removed (or its action id replaced)."""
    import re

    if action is not None:
        return body.replace(b">read<", b">" + action + b"<")
    cut = re.sub(rb"<Attributes\s+Category=\"[^\"]*attribute-category:action\".*?</Attributes>",
                 b"", body, flags=re.S)
    assert cut != body and b"action-id" not in cut
    return cut


@pytest.mark.parametrize("action", [None, b"", b"  "])
def test_a_stream_request_without_an_action_is_told_so(gw, action):
    """(issue 42) A request with no action was a bare 403 Deny: its denial now says the request
    names no action, in the answer's XACML status message (XML or JSON Profile, as asked)
    and for /explain. The decision is the PDP's, unchanged: /pdp answers the same request as
    XACML says; a policy that grants whatever the action still permits it; a denial of a
    request that has an action says nothing of actions; an unknown stream is 404 as ever."""
    client, runtime, services, _ = gw
    body = without_action((POLICIES / "lta-request.xml").read_bytes(), action)
    hint = ("the request names no action (attribute urn:oasis:names:tc:xacml:1.0:action:"
            "action-id in the category urn:oasis:names:tc:xacml:3.0:attribute-category:action)")
    r = client.post("/requests", data=body, headers=auth_header("lta", **XML))
    assert r.status_code == 403 and r.content_type.startswith("application/xacml+xml")
    assert hint in r.get_data(as_text=True) and "<StatusMessage>" in r.get_data(as_text=True)
    r = client.post("/explain", data=body, headers=auth_header("lta", **XML))
    assert r.status_code == 403 and hint in r.get_data(as_text=True)
    as_json = json.loads((POLICIES / "lta-request.json").read_text())
    as_json["Request"].pop("Action", None)
    as_json["Request"]["Category"] = [c for c in as_json["Request"].get("Category", [])
                                      if "action" not in c.get("CategoryId", "")]
    r = client.post("/requests", data=json.dumps(as_json),
                    headers=auth_header("lta", **{"Content-Type": "application/xacml+json"}))
    assert r.status_code == 403 and hint in r.get_data(as_text=True), r.data
    assert runtime.attached == {}
    # the PDP's own answer is XACML's, with no hint
    r = client.post("/pdp", data=body, headers=auth_header("lta", **XML))
    assert r.status_code == 200 and b"<Decision>" in r.data and b"names no action" not in r.data
    # a denial of a complete request says nothing of actions
    r = client.post("/requests", data=(POLICIES / "lta-request.xml").read_bytes().replace(
        b">read<", b">delete<"), headers=auth_header("lta", **XML))
    assert r.status_code == 403 and b"names no action" not in r.data
    r = client.post("/requests", data=body.replace(b">weather<", b">nosuch<"),
                    headers=auth_header("lta", **XML))
    assert r.status_code == 404, r.json
    # nea's own rule grants it every attribute, whatever the action: still a handle
    r = client.post("/requests", data=body, headers=auth_header("nea", **XML))
    assert r.status_code == 201, r.json
