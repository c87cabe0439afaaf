"""The paper's scenario over HTTP on real Spark (eXACML+ sections 2.2, 3.3 and 3.4).

NEA registers its weather stream and loads its policy (Figure 2); LTA posts its request and
reads the handle while NEA ingests records through the API; every window LTA receives is checked
value by value against a recomputation from the ingested records; then NEA deletes the policy and
LTA's reader gets `revoked` at once, and the handle answers 410 afterwards.
"""
from __future__ import annotations

import json
import random
import time
from datetime import UTC, datetime, timedelta

import pytest
import requests

from tests.e2e.conftest import POLICIES, Reader, auth

NEA_POLICY_ID = "urn:xsg:example:weather:nea-policy"
FIELDS = (("samplingtime", "timestamp"), ("temperature", "double"), ("humidity", "double"),
          ("solarradiation", "double"), ("rainrate", "double"), ("windspeed", "double"),
          ("winddirection", "long"), ("barometer", "double"))
XML = {"Content-Type": "application/xacml+xml"}


def make_records(n: int, seed: int = 7) -> list[dict]:
    rnd = random.Random(seed)
    t0 = datetime(2024, 5, 1, 8, 0, tzinfo=UTC)
    return [{"samplingtime": (t0 + timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%SZ"),
             "temperature": round(rnd.uniform(24, 33), 2),
             "humidity": round(rnd.uniform(50, 95), 1),
             "solarradiation": round(rnd.uniform(0, 900), 1),
             "rainrate": round(rnd.choice([0, 0, 2.5, 4.9, 5.0]) if i % 3 == 0
                               else rnd.uniform(5.01, 80), 2),
             "windspeed": round(rnd.uniform(0, 40), 2), "winddirection": rnd.randrange(360),
             "barometer": round(rnd.uniform(1000, 1020), 1)} for i in range(n)]


def expected_windows(records: list[dict], size: int = 5, step: int = 2) -> list[dict]:
    """Figure 2 recomputed: filter rainrate > 5, then tuple windows of 5 advancing by 2."""
    kept = [r for r in records if r["rainrate"] > 5]
    out = []
    k = 0
    while k * step + size <= len(kept):
        w = kept[k * step: k * step + size]
        out.append({"window_start": k * step, "window_end": k * step + size - 1,
                    "lastval_samplingtime": w[-1]["samplingtime"],
                    "avg_rainrate": sum(r["rainrate"] for r in w) / size,
                    "max_windspeed": max(r["windspeed"] for r in w)})
        k += 1
    return out


def as_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def ndjson(records: list[dict]) -> bytes:
    return ("\n".join(json.dumps(r) for r in records) + "\n").encode()


def test_weather_scenario_end_to_end(gateway):
    base = gateway.url
    # NEA registers its stream and loads its policy
    schema = [{"name": n, "type": t} for n, t in FIELDS]
    r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30,
                      json={"name": "weather", "schema": schema, "source": {"kind": "ingest"},
                            "time_attribute": "samplingtime"})
    assert r.status_code == 201, r.text
    r = requests.post(f"{base}/policies", headers=auth("nea", **XML), timeout=30,
                      data=(POLICIES / "weather" / "nea-weather-policy.xml").read_bytes())
    assert r.status_code == 201, r.text
    # LTA sees the stream and asks for it
    names = [
        s["name"] for s in requests.get(f"{base}/streams", headers=auth("lta")).json()["streams"]
    ]
    assert "weather" in names
    lta_request = (POLICIES / "weather" / "lta-request.xml").read_bytes()
    r = requests.post(f"{base}/requests", headers=auth("lta", **XML), data=lta_request, timeout=60)
    assert r.status_code == 201, r.text
    handle = r.json()["handle"]
    assert handle.startswith(f"{base}/handles/")
    hid = r.json()["id"]

    # Example 2's rule: a second, different query on the same stream is refused; the same one
    # maps to the same handle
    r = requests.post(f"{base}/requests", headers=auth("lta", **XML), timeout=30,
                      data=(POLICIES / "weather" / "lta-request-with-query.xml").read_bytes())
    assert r.status_code == 409 and r.json()["handle"] == handle
    r = requests.post(f"{base}/requests", headers=auth("lta", **XML), data=lta_request, timeout=30)
    assert r.status_code == 200 and r.json()["handle"] == handle

    # subject binding: another token cannot read, release or even see the handle, and cannot
    # get LTA's grant by claiming to be LTA in the request file
    assert requests.get(handle, headers=auth("other", Accept="application/x-ndjson"),
                        timeout=10).status_code == 404
    assert requests.delete(handle, headers=auth("other"), timeout=10).status_code == 404
    assert requests.get(f"{base}/handles", headers=auth("other")).json()["handles"] == []
    r = requests.post(f"{base}/requests", headers=auth("other", **XML), data=lta_request,
                      timeout=30)
    assert r.status_code == 403 and b"Deny" in r.content

    reader = Reader(handle).start()
    # NEA ingests records through the API, in several batches
    records = make_records(60)
    bad = ndjson(records[:3]) + b'{"samplingtime": "2024-05-01T09:00:00Z", "rainrate": "x"}\n'
    r = requests.post(f"{base}/streams/weather/records", data=bad, timeout=30,
                      headers=auth("nea", **{"Content-Type": "application/x-ndjson"}))
    assert r.status_code == 400 and r.json()["line"] == 4
    for i in range(0, len(records), 20):
        r = requests.post(f"{base}/streams/weather/records", data=ndjson(records[i:i + 20]),
                          headers=auth("nea", **{"Content-Type": "application/x-ndjson"}),
                          timeout=30)
        assert r.status_code == 201 and r.json()["appended"] == 20
        time.sleep(0.3)  # several micro-batches: windows must be exact across them

    expected = expected_windows(records)
    assert len(expected) >= 15
    got = reader.wait_rows(len(expected))
    assert len(got) == len(expected), (len(got), len(expected), reader.lines[-3:])
    for g, e in zip(got, expected, strict=True):
        assert set(g) == set(e), g
        assert g["window_start"] == e["window_start"] and g["window_end"] == e["window_end"]
        assert as_time(g["lastval_samplingtime"]) == as_time(e["lastval_samplingtime"])
        assert g["avg_rainrate"] == pytest.approx(e["avg_rainrate"], rel=1e-9)
        assert g["max_windspeed"] == pytest.approx(e["max_windspeed"], rel=1e-12)
    assert [x["id"] for x in reader.lines] == list(range(1, len(expected) + 1))

    # NEA deletes its policy: by the time DELETE answers, the handle is revoked
    t0 = time.monotonic()
    r = requests.delete(f"{base}/policies/{NEA_POLICY_ID}", headers=auth("nea"), timeout=30)
    assert r.status_code == 204
    assert reader.done.wait(5), "the reader did not get the revoked event"
    final = reader.lines[-1]
    assert final["event"] == "revoked" and NEA_POLICY_ID in final["reason"]
    assert reader.final_at - t0 < 2.0
    # nothing after revocation: more records produce nothing, later reads are 410
    requests.post(f"{base}/streams/weather/records", data=ndjson(make_records(20, seed=9)),
                  headers=auth("nea", **{"Content-Type": "application/x-ndjson"}), timeout=30)
    r = requests.get(handle, headers=auth("lta", Accept="application/x-ndjson"), timeout=10)
    assert r.status_code == 410 and r.json()["state"] == "revoked"
    r = requests.get(handle, headers=auth("lta", Accept="text/event-stream"), timeout=10)
    assert r.status_code == 410
    listed = requests.get(f"{base}/handles", headers=auth("lta")).json()["handles"]
    assert [(h["id"], h["state"]) for h in listed if h["id"] == hid] == [(hid, "revoked")]
    assert hid not in gateway.runtime.handles()
