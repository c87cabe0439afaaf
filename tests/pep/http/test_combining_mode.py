"""The combining mode over HTTP (PATCH /streams/<name> {"combining"}), with the real PDP and
handle service and a recording stand-in for Spark: a stream with two rules for one consumer
gives their intersection, then, once its owner chooses union, a union plan; the change itself
revokes the consumer's live handle (its plan differs), and a union is one handle (one window)."""
from __future__ import annotations

import json

import pytest

from pep.core.plan import ExecutionPlan, UnionPlan
from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

S = "http://www.w3.org/2001/XMLSchema#string"
STREAM = {"name": "ships", "time_attribute": "ts", "source": {"kind": "ingest"},
          "schema": [{"name": n, "type": t} for n, t in (
              ("ts", "timestamp"), ("mmsi", "long"), ("speed", "double"),
              ("name", "string"))]}


def rule(rule_id: str, condition: str, *shown: str) -> str:
    maps = "".join(f'<AttributeAssignmentExpression AttributeId="exacml:obligation:stream-map-'
                   f'attribute-id"><AttributeValue DataType="{S}">{a}</AttributeValue>'
                   f'</AttributeAssignmentExpression>' for a in shown)
    return (f'<Rule RuleId="{rule_id}" Effect="Permit"><Target><AnyOf><AllOf><Match MatchId='
            f'"urn:oasis:names:tc:xacml:1.0:function:string-equal"><AttributeValue DataType='
            f'"{S}">lta</AttributeValue><AttributeDesignator Category="urn:oasis:names:tc:'
            f'xacml:1.0:subject-category:access-subject" AttributeId="urn:oasis:names:tc:xacml:'
            f'1.0:subject:subject-id" DataType="{S}" MustBePresent="false"/></Match></AllOf>'
            f'</AnyOf></Target><ObligationExpressions><ObligationExpression ObligationId='
            f'"exacml:obligation:stream-filter" FulfillOn="Permit"><AttributeAssignmentExpression'
            f' AttributeId="exacml:obligation:stream-filter-condition-id"><AttributeValue '
            f'DataType="{S}">{condition}</AttributeValue></AttributeAssignmentExpression>'
            f'</ObligationExpression><ObligationExpression ObligationId="exacml:obligation:'
            f'stream-map" FulfillOn="Permit">{maps}</ObligationExpression>'
            f'</ObligationExpressions></Rule>')


POLICY = (f'<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="urn:t:ships" '
          f'Version="1" RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-'
          f'algorithm:deny-overrides"><Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:'
          f'xacml:1.0:function:string-equal"><AttributeValue DataType="{S}">ships</AttributeValue>'
          f'<AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:'
          f'resource" AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" '
          f'DataType="{S}" MustBePresent="false"/></Match></AllOf></AnyOf></Target>'
          + rule("near", "speed &lt; 10", "ts", "mmsi")
          + rule("own", "mmsi = 7", "ts", "mmsi", "speed", "name") + "</Policy>").encode()
REQUEST = json.dumps({"Request": {"Resource": {"Attribute": [{
    "AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id", "Value": "ships"}]},
    "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                              "Value": "read"}]}}}).encode()
JSON = {"Content-Type": "application/xacml+json"}


@pytest.fixture
def gw(tmp_path):
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path / "data", runtime)
    client = app.test_client()
    assert client.post("/streams", json=STREAM, headers=auth_header("nea")).status_code == 201
    r = client.post("/policies", data=POLICY,
                    headers=auth_header("nea", **{"Content-Type": "application/xacml+xml"}))
    assert r.status_code == 201, r.json
    yield client, runtime, services
    services.close()


def test_the_owners_choice_of_union_revokes_and_unites(gw):
    client, runtime, services = gw
    r = client.post("/requests", data=REQUEST, headers=auth_header("lta", **JSON))
    assert r.status_code == 201, r.json
    first = r.json["id"]
    plan = runtime.attached[first][1]
    assert isinstance(plan, ExecutionPlan) and plan.projection == ("ts", "mmsi")  # both rules
    r = client.patch("/streams/ships", json={"combining": "union"},
                     headers=auth_header("lta"))
    assert r.status_code == 403  # the owner's (or an administrator's) choice
    for bad in ("all", 1, ["union"]):
        r = client.patch("/streams/ships", json={"combining": bad}, headers=auth_header("nea"))
        assert r.status_code == 400 and "combining" in r.json["error"], r.json
    r = client.patch("/streams/ships", json={"combining": "union"}, headers=auth_header("nea"))
    assert r.status_code == 200 and r.json["combining"] == "union"
    assert r.json["revoked"] == 1  # what happened, before the answer (issue 42)
    record = services.handles.get(first)
    assert record.state.value == "revoked" and "combining" in record.reason
    r = client.post("/requests", data=REQUEST, headers=auth_header("lta", **JSON))
    assert r.status_code == 201, r.json
    union = runtime.attached[r.json["id"]][1]
    assert isinstance(union, UnionPlan) and len(union.plans) == 2
    assert {p.projection for p in union.plans} == {("ts", "mmsi"), ("ts", "mmsi", "speed", "name")}
    assert len(r.json["plan"]["union"]) == 2
    again = client.post("/requests", data=REQUEST, headers=auth_header("lta", **JSON))
    assert again.json["id"] == r.json["id"]  # one window: the same handle
    # the same mode again, or another setting: nothing to decide again, nothing revoked
    for change in ({"combining": "union"}, {"description": "ships"}):
        r = client.patch("/streams/ships", json=change, headers=auth_header("nea"))
        assert r.status_code == 200 and r.json["revoked"] == 0, r.json
        assert services.handles.get(again.json["id"]).live
    # back to the gateway's setting: intersection again
    r = client.patch("/streams/ships", json={"combining": None}, headers=auth_header("nea"))
    assert r.status_code == 200 and "combining" not in r.json and r.json["revoked"] == 1
    assert services.handles.get(again.json["id"]).state.value == "revoked"
