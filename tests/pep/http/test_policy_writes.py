"""Policy writes through the gateway: checked against the streams' schemas (issue 9, class 6),
loaded in bulk (issue 10), and decisions over /pdp on the gateway's own clock."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

POLICIES = Path(__file__).resolve().parents[3] / "policies" / "weather"
NEA_POLICY = (POLICIES / "nea-weather-policy.xml").read_bytes()
XML = {"Content-Type": "application/xacml+xml"}
S = "http://www.w3.org/2001/XMLSchema#string"
WEATHER = {"name": "weather", "time_attribute": "samplingtime", "source": {"kind": "ingest"},
           "schema": [{"name": n, "type": t} for n, t in (
               ("samplingtime", "timestamp"), ("temperature", "double"), ("humidity", "double"),
               ("solarradiation", "double"), ("rainrate", "double"), ("windspeed", "double"),
               ("winddirection", "long"), ("barometer", "double"))]}


@pytest.fixture
def gw(tmp_path):
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path / "data", runtime)
    client = app.test_client()
    assert client.post("/streams", json=WEATHER, headers=auth_header("nea")).status_code == 201
    yield client, runtime, services
    services.close()


def simple(policy_id: str, stream: str, map_attribute: str = "rainrate") -> bytes:
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="{policy_id}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
        <AttributeValue DataType="{S}">{stream}</AttributeValue>
        <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
          AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" DataType="{S}"
          MustBePresent="false"/></Match></AllOf></AnyOf></Target>
      <Rule RuleId="r" Effect="Permit"><ObligationExpressions>
        <ObligationExpression ObligationId="exacml:obligation:stream-map" FulfillOn="Permit">
          <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-map-attribute-id">
            <AttributeValue DataType="{S}">{map_attribute}</AttributeValue>
          </AttributeAssignmentExpression></ObligationExpression>
      </ObligationExpressions></Rule></Policy>""".encode()


def test_a_typo_in_an_obligation_is_refused_and_revokes_nothing(gw):
    client, runtime, services = gw
    assert client.post("/policies", data=NEA_POLICY, headers=auth_header("nea", **XML)).json[
        "warnings"] == []
    hid = client.post("/requests", data=(POLICIES / "lta-request.xml").read_bytes(),
                      headers=auth_header("lta", **XML)).json["id"]
    typo = NEA_POLICY.replace(b">windspeed<", b">windsped<")
    r = client.put("/policies/urn:xsg:example:weather:nea-policy", data=typo,
                   headers=auth_header("nea", **XML))
    assert r.status_code == 400
    assert "windsped" in r.json["error"] and "'weather'" in r.json["error"]
    assert r.json["element"] == "ObligationExpression" and isinstance(r.json["line"], int)
    assert services.handles.get(hid).live  # nothing was applied
    r = client.post("/policies", data=simple("urn:t:typo", "weather", "rainrat"),
                    headers=auth_header("nea", **XML))
    assert r.status_code == 400 and "rainrat" in r.json["error"]


def test_a_policy_for_a_stream_not_registered_yet_is_accepted_with_a_warning(gw):
    client, runtime, services = gw
    r = client.post("/policies", data=simple("urn:t:later", "later"),
                    headers=auth_header("nea", **XML))
    assert r.status_code == 201
    assert len(r.json["warnings"]) == 1 and "'later' is not registered yet" in r.json["warnings"][0]


def part(name: str, data: bytes):
    return (io.BytesIO(data), name, "application/xml")


def test_bulk_adds_all_or_nothing(gw):
    client, runtime, services = gw
    files = {f"p{i}": part(f"p{i}.xml", simple(f"urn:t:bulk:{i}", "weather")) for i in range(5)}
    r = client.post("/policies/bulk", data=files, headers=auth_header("nea"),
                    content_type="multipart/form-data")
    assert r.status_code == 201, r.json
    assert [p["id"] for p in r.json["policies"]] == [f"urn:t:bulk:{i}" for i in range(5)]
    before = client.get("/policies", headers=auth_header("nea")).json
    bad = {"a": part("a.xml", simple("urn:t:bulk:ok", "weather")),
           "b": part("b.xml", simple("urn:t:bulk:bad", "weather", "nope"))}
    r = client.post("/policies/bulk", data=bad, headers=auth_header("nea"),
                    content_type="multipart/form-data")
    assert r.status_code == 400 and "nope" in r.json["error"] and "b.xml" in r.json["source"]
    dup = {"a": part("a.xml", simple("urn:t:bulk:new", "weather")),
           "b": part("b.xml", simple("urn:t:bulk:0", "weather"))}
    r = client.post("/policies/bulk", data=dup, headers=auth_header("nea"),
                    content_type="multipart/form-data")
    assert r.status_code == 409
    assert client.get("/policies", headers=auth_header("nea")).json == before
    # consumers cannot, and the body must be multipart with at least one document
    files = {f"p{i}": part(f"p{i}.xml", simple(f"urn:t:bulk:x{i}", "weather")) for i in range(2)}
    assert client.post("/policies/bulk", data=files, headers=auth_header("lta"),
                       content_type="multipart/form-data").status_code == 403
    assert client.post("/policies/bulk", data=b"x", headers=auth_header(
        "nea", **XML)).status_code == 415
    assert client.post("/policies/bulk", data={}, headers=auth_header("nea"),
                       content_type="multipart/form-data").status_code == 400


def test_pdp_decides_on_the_gateways_clock_not_the_requests(gw):
    client, runtime, services = gw
    timed = b"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="t"
      Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target/><Rule RuleId="r" Effect="Permit"><Condition>
        <Apply FunctionId="urn:oasis:names:tc:xacml:1.0:function:dateTime-less-than">
          <Apply FunctionId="urn:oasis:names:tc:xacml:1.0:function:dateTime-one-and-only">
            <AttributeDesignator MustBePresent="false"
              DataType="http://www.w3.org/2001/XMLSchema#dateTime"
              Category="urn:oasis:names:tc:xacml:3.0:attribute-category:environment"
              AttributeId="urn:oasis:names:tc:xacml:1.0:environment:current-dateTime"/></Apply>
          <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#dateTime">2001-01-01T00:00:00Z</AttributeValue>
        </Apply></Condition></Rule></Policy>"""
    assert (
        client.post("/policies", data=timed, headers=auth_header("nea", **XML)).status_code == 201
    )
    claim = b"""<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      ReturnPolicyIdList="false" CombinedDecision="false">
      <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:environment">
        <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:environment:current-dateTime"
          IncludeInResult="false"><AttributeValue
          DataType="http://www.w3.org/2001/XMLSchema#dateTime">2000-06-01T00:00:00Z</AttributeValue>
        </Attribute></Attributes></Request>"""
    r = client.post("/pdp", data=claim, headers=auth_header("lta", **XML,
                                                            Accept="application/xacml+json"))
    assert r.status_code == 200 and r.json["Response"][0]["Decision"] == "Deny"


def test_consistent_answers_204_without_a_type_406_on_accept_one_plan_shape(gw):
    client, runtime, services = gw
    client.post("/policies", data=NEA_POLICY, headers=auth_header("nea", **XML))
    pid = "/policies/urn:xsg:example:weather:nea-policy"
    assert client.get(pid, headers=auth_header("nea", Accept="application/json")).status_code == 406
    assert (
        client.get(pid, headers=auth_header("nea", Accept="application/xacml+xml")).status_code
        == 200
    )
    assert client.get(pid + "?history=true", headers=auth_header(
        "nea", Accept="application/json")).status_code == 200
    r = client.post("/requests", data=(POLICIES / "lta-request.xml").read_bytes(),
                    headers=auth_header("lta", **XML))
    listed = client.get("/handles", headers=auth_header("lta")).json["handles"][0]
    assert listed["plan"] == r.json["plan"]  # the same shape as POST /requests gives
    r = client.delete(pid, headers=auth_header("nea"))
    assert r.status_code == 204 and "Content-Type" not in r.headers and r.data == b""


def test_a_policy_id_with_a_double_slash_is_managed_like_any_other(gw):
    client, runtime, services = gw
    pid = "http://example.org//policies/p1"
    body = simple(pid, "weather")
    assert client.post("/policies", data=body, headers=auth_header("nea", **XML)).status_code == 201
    from urllib.parse import quote
    path = "/policies/" + quote(pid, safe="")
    assert client.get(path, headers=auth_header("nea")).status_code == 200
    assert client.get("/policies/" + pid, headers=auth_header("nea")).status_code == 200
    assert client.delete("/policies/" + pid, headers=auth_header("nea")).status_code == 204


def test_the_audit_keeps_any_text(tmp_path):
    from pep.audit.log import AuditLog
    log = AuditLog(tmp_path, durable=False)
    log.record("refused", reason="bad \ud800 surrogate and é")
    assert [e["reason"] for e in log.entries()] == ["bad \ud800 surrogate and é"]
    log.close()
