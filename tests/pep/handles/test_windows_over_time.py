"""Example 2 across time (issue 9, class 2): a consumer that releases a window and asks for
another size must not get windows over the tuples its earlier query already aggregated."""
from __future__ import annotations

import json

import pytest

from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

S = "http://www.w3.org/2001/XMLSchema#string"
INT = "http://www.w3.org/2001/XMLSchema#integer"
XML = {"Content-Type": "application/xacml+xml"}


def policy() -> bytes:
    def a(attr, value, dtype=S):
        return (f'<AttributeAssignmentExpression AttributeId="exacml:obligation:{attr}">'
                f'<AttributeValue DataType="{dtype}">{value}</AttributeValue>'
                "</AttributeAssignmentExpression>")
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="p"
      Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target/><Rule RuleId="r" Effect="Permit"><ObligationExpressions>
        <ObligationExpression ObligationId="exacml:obligation:stream-window" FulfillOn="Permit">
          {a("stream-window-type-id", "tuple")}{a("stream-window-size-id", "3", INT)}
          {a("stream-window-step-id", "3", INT)}{a("stream-window-attr-id", "v:sum")}
        </ObligationExpression></ObligationExpressions></Rule></Policy>""".encode()


def request(size: int) -> bytes:
    query = (f"<UserQuery><Aggregation><WindowType>tuple</WindowType>"
             f"<WindowSize>{size}</WindowSize><WindowStep>{size}</WindowStep>"
             "<Attribute>v:sum</Attribute></Aggregation></UserQuery>")
    return f"""<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      ReturnPolicyIdList="false" CombinedDecision="false">
      <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource">
        <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
          IncludeInResult="false"><AttributeValue DataType="{S}">s</AttributeValue></Attribute>
        <Content>{query}</Content></Attributes></Request>""".encode()


@pytest.fixture
def gw(tmp_path):
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path / "data", runtime)
    client = app.test_client()
    r = client.post("/streams", headers=auth_header("nea"), json={
        "name": "s", "time_attribute": "t",
        "schema": [{"name": "t", "type": "timestamp"}, {"name": "v", "type": "double"}]})
    assert r.status_code == 201
    assert (
        client.post("/policies", data=policy(), headers=auth_header("nea", **XML)).status_code
        == 201
    )
    yield client, runtime, services
    services.close()


def ingest(client, n: int, start: int = 0) -> None:
    body = "".join(json.dumps({"t": 1_700_000_000 + i, "v": float(i)}) + "\n"
                   for i in range(start, start + n))
    r = client.post("/streams/s/records", data=body.encode(), headers=auth_header(
        "nea", **{"Content-Type": "application/x-ndjson"}))
    assert r.status_code == 201


def open_handle(client, size: int):
    r = client.post("/requests", data=request(size), headers=auth_header("lta", **XML))
    assert r.status_code in (200, 201), r.json
    return r.json["id"]


def test_another_window_starts_after_every_tuple_ingested_so_far(gw):
    client, runtime, services = gw
    first = open_handle(client, 3)
    assert runtime.attached[first][1].start_after is None  # a first window needs no cut
    ingest(client, 9)
    assert client.delete(f"/handles/{first}", headers=auth_header("lta")).status_code == 200
    second = open_handle(client, 4)
    assert runtime.attached[second][1].start_after == 9  # seq 1..9 went to the size-3 query
    # the same request again is the same handle, not a conflict
    assert open_handle(client, 4) == second
    client.delete(f"/handles/{second}", headers=auth_header("lta"))
    ingest(client, 5, start=9)
    # back to the first size: still a window other than one used before on these tuples
    third = open_handle(client, 3)
    assert runtime.attached[third][1].start_after == 14


def test_the_same_window_again_needs_no_cut_and_other_consumers_are_independent(gw):
    client, runtime, services = gw
    first = open_handle(client, 3)
    ingest(client, 6)
    client.delete(f"/handles/{first}", headers=auth_header("lta"))
    again = open_handle(client, 3)
    assert runtime.attached[again][1].start_after is None
    r = client.post("/requests", data=request(5), headers=auth_header("other", **XML))
    assert r.status_code == 201 and runtime.attached[r.json["id"]][1].start_after is None


def test_the_cut_survives_a_restart(gw, tmp_path):
    client, runtime, services = gw
    first = open_handle(client, 3)
    ingest(client, 4)
    client.delete(f"/handles/{first}", headers=auth_header("lta"))
    second = open_handle(client, 6)
    services.close()
    runtime2 = RecordingRuntime()
    app2, services2 = build_gateway(tmp_path / "data", runtime2)
    try:
        assert services2.resumed == [second]
        assert runtime2.attached[second][1].start_after == 4
    finally:
        services2.close()
