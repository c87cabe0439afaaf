"""Time windows through the whole gateway: a policy's time-window obligation on real Spark."""
from __future__ import annotations

import json
import time

import pytest
import requests

from tests.e2e.conftest import Reader, auth, window_policy
from tests.e2e.test_restart_and_sse import ND, XML, sensor_request


def test_time_windows_over_http(gateway):
    base, stream = gateway.url, "timed_sensors"
    r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
        "name": stream, "time_attribute": "ts", "source": {"kind": "ingest"},
        "schema": [{"name": "ts", "type": "timestamp"}, {"name": "value", "type": "double"}]})
    assert r.status_code == 201, r.text
    policy = window_policy(stream, "time", 10, 10, ("value:sum", "value:count"))
    r = requests.post(f"{base}/policies", headers=auth("nea", **XML), data=policy, timeout=30)
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
