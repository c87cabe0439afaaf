"""Handles survive a gateway restart; SSE is streamed as it happens (the real HTTP server, real
Spark)."""

from __future__ import annotations

import json
import threading
import time

import requests

from pep.handles.buffer import GENERATION_SPAN
from tests.e2e.conftest import Reader, auth, start_gateway

XML = {"Content-Type": "application/xacml+xml"}
ND = {"Content-Type": "application/x-ndjson"}
S = "http://www.w3.org/2001/XMLSchema#string"


def sensor_policy(stream: str, policy_id: str) -> bytes:
    """LTA may read `stream`'s positive values, attributes ts and value only."""
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="{policy_id}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
        <AttributeValue DataType="{S}">{stream}</AttributeValue>
        <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
          AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" DataType="{S}"
          MustBePresent="false"/></Match></AllOf></AnyOf></Target>
      <Rule RuleId="lta" Effect="Permit"><Target><AnyOf><AllOf>
        <Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
          <AttributeValue DataType="{S}">lta</AttributeValue>
          <AttributeDesignator
            Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
            AttributeId="urn:oasis:names:tc:xacml:1.0:subject:subject-id" DataType="{S}"
            MustBePresent="false"/></Match></AllOf></AnyOf></Target>
        <ObligationExpressions>
          <ObligationExpression ObligationId="exacml:obligation:stream-filter" FulfillOn="Permit">
            <AttributeAssignmentExpression
              AttributeId="exacml:obligation:stream-filter-condition-id">
              <AttributeValue DataType="{S}">value &gt; 0</AttributeValue>
            </AttributeAssignmentExpression></ObligationExpression>
          <ObligationExpression ObligationId="exacml:obligation:stream-map" FulfillOn="Permit">
            <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-map-attribute-id">
              <AttributeValue DataType="{S}">ts</AttributeValue></AttributeAssignmentExpression>
            <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-map-attribute-id">
              <AttributeValue DataType="{S}">value</AttributeValue></AttributeAssignmentExpression>
          </ObligationExpression>
        </ObligationExpressions></Rule></Policy>""".encode()


def sensor_request(stream: str) -> bytes:
    return f"""<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      ReturnPolicyIdList="false" CombinedDecision="false">
      <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource">
        <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
          IncludeInResult="false"><AttributeValue DataType="{S}">{stream}</AttributeValue>
        </Attribute></Attributes></Request>""".encode()


def setup_stream(base: str, stream: str) -> str:
    r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
        "name": stream, "time_attribute": "ts", "source": {"kind": "ingest"},
        "schema": [{"name": "ts", "type": "timestamp"}, {"name": "value", "type": "double"},
                   {"name": "secret", "type": "string"}]})
    assert r.status_code == 201, r.text
    r = requests.post(f"{base}/policies", headers=auth("nea", **XML),
                      data=sensor_policy(stream, f"urn:t:{stream}"), timeout=30)
    assert r.status_code == 201, r.text
    r = requests.post(f"{base}/requests", headers=auth("lta", **XML),
                      data=sensor_request(stream), timeout=60)
    assert r.status_code == 201, r.text
    return r.json()["handle"]


def records(values, start: int = 0) -> bytes:
    return "".join(json.dumps({"ts": 1_700_000_000 + start + i, "value": v, "secret": "s"}) + "\n"
                   for i, v in enumerate(values)).encode()


def test_sse_is_streamed_not_buffered(gateway):
    base = gateway.url
    handle = setup_stream(base, "sse_sensors")
    got: list[str] = []
    first_byte = threading.Event()
    t0 = time.monotonic()

    def read():
        with requests.get(handle, headers=auth("lta", Accept="text/event-stream"), stream=True,
                          timeout=60) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            for line in r.iter_lines(chunk_size=1, decode_unicode=True):
                got.append(line)
                first_byte.set()
                if line.startswith("event: released"):
                    return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    assert first_byte.wait(3) and time.monotonic() - t0 < 3 and got[0] == ": connected"
    r = requests.post(f"{base}/streams/sse_sensors/records", data=records([1.5, -2.0, 3.5]),
                      headers=auth("nea", **ND), timeout=30)
    assert r.status_code == 201
    deadline = time.monotonic() + 60
    while sum(x.startswith("data:") for x in got) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    data = [json.loads(x[5:]) for x in got if x.startswith("data:")]
    assert [d["value"] for d in data] == [1.5, 3.5]
    assert all(set(d) == {"ts", "value"} for d in data)  # `secret` is not exposed
    assert [x for x in got if x.startswith("id:")] == ["id: 1", "id: 2"]
    assert requests.delete(handle, headers=auth("lta"), timeout=30).status_code == 200
    t.join(5)
    assert not t.is_alive() and any(x == "event: released" for x in got)
    assert requests.get(handle, headers=auth("lta"), timeout=10).status_code == 410


def test_restart_keeps_handles(spark, tmp_path):
    data_dir = tmp_path / "gw"
    a = start_gateway(spark, data_dir)
    try:
        handle = setup_stream(a.url, "restart_sensors")
        hid = handle.rsplit("/", 1)[1]
        reader = Reader(handle).start()
        requests.post(f"{a.url}/streams/restart_sensors/records", data=records([1, 2, 3]),
                      headers=auth("nea", **ND), timeout=30)
        assert [r["value"] for r in reader.wait_rows(3, timeout=60)] == [1, 2, 3]
        last_id = reader.lines[-1]["id"]
    finally:
        a.close()
    assert reader.done.wait(10) and reader.lines[-1]["event"] == "shutdown"

    b = start_gateway(spark, data_dir)
    try:
        assert b.services.resumed == [hid] and b.services.ended == []
        listed = requests.get(f"{b.url}/handles", headers=auth("lta"), timeout=10).json()
        assert [(h["id"], h["state"]) for h in listed["handles"]] == [(hid, "live")]
        handle_b = f"{b.url}/handles/{hid}"
        reader = Reader(handle_b, last_event_id=last_id).start()
        requests.post(f"{b.url}/streams/restart_sensors/records", data=records([4, -1, 5], 10),
                      headers=auth("nea", **ND), timeout=30)
        deadline = time.monotonic() + 60
        while 5.0 not in [r["value"] for r in reader.rows] and time.monotonic() < deadline:
            time.sleep(0.05)
        values = [r["value"] for r in reader.rows]
        assert values[-2:] == [4, 5]
        assert reader.lines[0]["event"] == "gap" and reader.lines[0]["lost"] is None
        assert reader.lines[0]["id"] == GENERATION_SPAN  # generation 1 starts there
        assert all(x["id"] > GENERATION_SPAN for x in reader.lines[1:])
        # the same request after the restart maps to the same handle
        r = requests.post(f"{b.url}/requests", headers=auth("lta", **XML),
                          data=sensor_request("restart_sensors"), timeout=30)
        assert r.status_code == 200 and r.json()["id"] == hid
    finally:
        b.close()
