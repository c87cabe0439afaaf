"""Issue 15: one micro-batch that yields more window rows than a handle's buffer keeps.

A tuple window with step 1 gives one row per tuple, so one ingest file of 12,000 records is
one micro-batch of 11,941 windows, more than the 10,000 rows a handle buffers. A reader that
keeps reading must receive every window, without a gap; before the fix it got only the last
10,000 of the batch (and a `gap` event), which looked like a handle that had stopped.
"""
from __future__ import annotations

import json

import requests

from tests.e2e.conftest import Reader, auth, window_policy
from tests.e2e.test_restart_and_sse import ND, XML, sensor_request


def test_one_batch_larger_than_the_handle_buffer_reaches_a_reading_reader(gateway):
    base, stream, size, n = gateway.url, "burst_weather", 60, 12_000
    r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
        "name": stream, "time_attribute": "samplingtime", "source": {"kind": "ingest"},
        "schema": [{"name": "samplingtime", "type": "timestamp"},
                   {"name": "rainrate", "type": "double"}]})
    assert r.status_code == 201, r.text
    r = requests.post(f"{base}/policies", headers=auth("nea", **XML),
                      data=window_policy(stream, "tuple", size, 1, ("rainrate:avg",)), timeout=30)
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
