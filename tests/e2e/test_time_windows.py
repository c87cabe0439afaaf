"""Time windows through the whole gateway: a policy's time-window obligation on real Spark."""
from __future__ import annotations

import json
import time

import pytest
import requests

from tests.e2e.conftest import Reader, auth
from tests.e2e.test_restart_and_sse import ND, XML, S, sensor_request


def window_policy(stream: str) -> bytes:
    def assign(attr: str, value: str, dtype: str = S) -> str:
        return (f'<AttributeAssignmentExpression AttributeId="exacml:obligation:{attr}">'
                f'<AttributeValue DataType="{dtype}">{value}</AttributeValue>'
                "</AttributeAssignmentExpression>")
    integer = "http://www.w3.org/2001/XMLSchema#integer"
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
          {assign("stream-window-type-id", "time")}
          {assign("stream-window-size-id", "10", integer)}
          {assign("stream-window-step-id", "10", integer)}
          {assign("stream-window-attr-id", "value:sum")}
          {assign("stream-window-attr-id", "value:count")}
        </ObligationExpression></ObligationExpressions></Rule></Policy>""".encode()


def test_time_windows_over_http(gateway):
    base, stream = gateway.url, "timed_sensors"
    r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
        "name": stream, "time_attribute": "ts", "source": {"kind": "ingest"},
        "schema": [{"name": "ts", "type": "timestamp"}, {"name": "value", "type": "double"}]})
    assert r.status_code == 201, r.text
    r = requests.post(f"{base}/policies", headers=auth("nea", **XML), data=window_policy(stream),
                      timeout=30)
    assert r.status_code == 201, r.text
    r = requests.post(f"{base}/requests", headers=auth("lta", **XML),
                      data=sensor_request(stream), timeout=60)
    assert r.status_code == 201, r.text
    assert r.json()["plan"]
    reader = Reader(r.json()["handle"]).start()
    t0 = 1_700_000_000  # a multiple of 10: windows are aligned to the epoch
    values = {t0 + i: float(i * i % 17) for i in range(35)}
    for chunk in (range(0, 12), range(12, 25), range(25, 35)):
        body = "".join(json.dumps({"ts": t0 + i, "value": values[t0 + i]}) + "\n" for i in chunk)
        r = requests.post(f"{base}/streams/{stream}/records", data=body.encode(),
                          headers=auth("nea", **ND), timeout=30)
        assert r.status_code == 201
        time.sleep(0.3)
    # the watermark is at t0+34: windows [t0, t0+10), [t0+10, t0+20), [t0+20, t0+30) are complete
    rows = reader.wait_rows(3, timeout=60)
    assert len(rows) == 3, reader.lines
    for k, row in enumerate(rows):
        lo = t0 + 10 * k
        inside = [v for t, v in values.items() if lo <= t < lo + 10]
        assert row["sum_value"] == pytest.approx(sum(inside))
        assert row["count_value"] == len(inside) == 10
        assert row["window_start"].startswith(time.strftime("%Y-%m-%dT%H:%M:%S",
                                                            time.gmtime(lo)))
    time.sleep(1.0)
    assert len(reader.rows) == 3  # [t0+30, t0+40) is still open
