"""Issue 15: one micro-batch that yields more window rows than a handle's buffer keeps.

A tuple window with step 1 gives one row per tuple, so one ingest file of 12,000 records is
one micro-batch of 11,941 windows, more than the 10,000 rows a handle buffers. A reader that
keeps reading must receive every window, without a gap; before the fix it got only the last
10,000 of the batch (and a `gap` event), which looked like a handle that had stopped.
"""
from __future__ import annotations

import json

import requests

from tests.e2e.conftest import Reader, auth
from tests.e2e.test_restart_and_sse import ND, XML, S, sensor_request

INTEGER = "http://www.w3.org/2001/XMLSchema#integer"


def sliding_policy(stream: str, size: int) -> bytes:
    def assign(attr: str, value: str, dtype: str = S) -> str:
        return (f'<AttributeAssignmentExpression AttributeId="exacml:obligation:{attr}">'
                f'<AttributeValue DataType="{dtype}">{value}</AttributeValue>'
                "</AttributeAssignmentExpression>")
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="urn:t:{stream}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
        <AttributeValue DataType="{S}">{stream}</AttributeValue>
        <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
          AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" DataType="{S}"
          MustBePresent="false"/></Match></AllOf></AnyOf></Target>
      <Rule RuleId="all" Effect="Permit"><ObligationExpressions>
        <ObligationExpression ObligationId="exacml:obligation:stream-window" FulfillOn="Permit">
          {assign("stream-window-type-id", "tuple")}
          {assign("stream-window-size-id", str(size), INTEGER)}
          {assign("stream-window-step-id", "1", INTEGER)}
          {assign("stream-window-attr-id", "rainrate:avg")}
        </ObligationExpression></ObligationExpressions></Rule></Policy>""".encode()


def test_one_batch_larger_than_the_handle_buffer_reaches_a_reading_reader(gateway):
    base, stream, size, n = gateway.url, "burst_weather", 60, 12_000
    r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
        "name": stream, "time_attribute": "samplingtime", "source": {"kind": "ingest"},
        "schema": [{"name": "samplingtime", "type": "timestamp"},
                   {"name": "rainrate", "type": "double"}]})
    assert r.status_code == 201, r.text
    r = requests.post(f"{base}/policies", headers=auth("nea", **XML),
                      data=sliding_policy(stream, size), timeout=30)
    assert r.status_code == 201, r.text
    try:
        r = requests.post(f"{base}/requests", headers=auth("lta", **XML),
                          data=sensor_request(stream), timeout=60)
        assert r.status_code == 201, r.text
        handle = r.json()["handle"]
        reader = Reader(handle).start()
        t0 = 1_714_550_400.0
        body = "".join(json.dumps({"samplingtime": t0 + i / 100, "rainrate": float(i % 97)})
                       + "\n" for i in range(n))
        r = requests.post(f"{base}/streams/{stream}/records", data=body.encode(),
                          headers=auth("nea", **ND), timeout=60)
        assert r.status_code == 201 and r.json()["appended"] == n
        expected = n - size + 1
        got = reader.wait_rows(expected, timeout=60)
        assert [x for x in reader.lines if "row" not in x] == []  # no gap event
        assert len(got) == expected
        assert [g["window_start"] for g in got] == list(range(expected))
        values = [float(i % 97) for i in range(n)]
        for k in (0, 1, expected // 2, expected - 1):
            assert abs(got[k]["avg_rainrate"] - sum(values[k:k + size]) / size) < 1e-9
        assert requests.delete(handle, headers=auth("lta"), timeout=30).status_code == 200
    finally:
        requests.delete(f"{base}/policies/urn:t:{stream}", headers=auth("nea"), timeout=30)
