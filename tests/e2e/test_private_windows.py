"""Issue 28 end to end, over HTTP on Spark: an owner's differentially private window, consumers'
noisy windows, the paper's Example 2 attack from three identities at once, explain, and a
budget that runs out (the reader gets its paid windows, then `ended`; a new request is 403 with
the figures).

The owner's policy is Example 2's (tuple windows of 3, advancing by 2, sum) with differential
privacy: epsilon 0.5 per window, rainrate clamped to [0, 10], a budget of 12 per day. Three
identities ask at the same time for windows of 3, 4 and 5 tuples (allowed: coarser than the
policy's), which without noise rebuild the stream (S4 - S3 and S5 - S4 give every tuple from
the fourth on). With noise, each difference carries two independent Laplace draws, of scales
10 / 0.5 = 20 and 10 / 0.25 = 40 (the identity asking for windows of 4 asks for less privacy
loss): a recovered value lies within 0.5 of the truth with probability about 1/120.
"""
from __future__ import annotations

import json

import requests

from tests.e2e.conftest import Reader, auth, window_policy
from tests.e2e.test_restart_and_sse import ND, XML, sensor_request

STREAM = "dp_weather"


def private_policy(stream: str) -> bytes:
    """Tuple windows of 3 every 2 with differentially private sums and maxima (also
    tests/pep/http/test_private_windows_api.py's)."""
    return window_policy(stream, "tuple", 3, 2, ("rainrate:sum", "rainrate:max"),
                         dp_epsilon="0.5", dp_bounds="rainrate:0:10", dp_budget="12/86400")


def ask(base: str, who: str, size: int, extra: dict | None = None) -> requests.Response:
    query = {"window": {"type": "tuple", "size": size, "step": 2, **(extra or {})}}
    return requests.post(f"{base}/requests", headers=auth(who), timeout=60, files={
        "request": ("r.xml", sensor_request(STREAM), "application/xacml+xml"),
        "query": ("q.json", json.dumps(query), "application/json")})


def ingest(base: str, values: list[float], t0: float) -> None:
    body = "".join(json.dumps({"samplingtime": t0 + i, "rainrate": v}) + "\n"
                   for i, v in enumerate(values))
    r = requests.post(f"{base}/streams/{STREAM}/records", data=body.encode(),
                      headers=auth("nea", **ND), timeout=60)
    assert r.status_code == 201, r.text


def test_private_windows_over_http(gateway):
    base = gateway.url
    r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
        "name": STREAM, "time_attribute": "samplingtime", "source": {"kind": "ingest"},
        "schema": [{"name": "samplingtime", "type": "timestamp"},
                   {"name": "rainrate", "type": "double"}]})
    assert r.status_code == 201, r.text
    private = private_policy(STREAM)
    r = requests.post(f"{base}/policies", headers=auth("nea", **XML), data=private, timeout=30)
    assert r.status_code == 201, r.text
    try:
        # explain: the parameters, and a full budget
        r = requests.post(f"{base}/explain", headers=auth("lta", **XML),
                          data=sensor_request(STREAM), timeout=30)
        assert r.status_code == 200, r.text
        shown = r.json()
        window = shown["plan"]["window"]
        assert [a["function"] for a in window["aggregates"]] == ["sum"]  # max withheld
        assert window["privacy"]["epsilon_per_window"] == 0.5
        assert window["privacy"]["bounds"] == [{"attribute": "rainrate", "lower": 0.0,
                                                "upper": 10.0}]
        assert shown["privacy"]["budgets"][0]["remaining"] == 12
        assert shown["privacy"]["budgets"][0]["windows_affordable"] == 24
        assert any("max(rainrate)" in w["message"] for w in shown["warnings"])
        # asking for max, or for more privacy loss, is refused naming it
        r = ask(base, "lta", 3, {"aggregates": ["rainrate:max"]})
        assert r.status_code == 403 and "max(rainrate)" in r.json()["error"], r.text
        r = ask(base, "lta", 3, {"epsilon": 5})
        assert r.status_code == 403 and "epsilon" in r.json()["error"], r.text

        # Example 2 from three identities at once: windows of 3, 4 and 5 tuples (`other` asks
        # for less privacy loss than the policy allows: epsilon 0.25, more noise)
        handles = {}
        for who, size, extra in (("lta", 3, None), ("other", 4, {"epsilon": 0.25}),
                                 ("nea", 5, None)):
            r = ask(base, who, size, extra)
            assert r.status_code == 201, r.text
            assert r.json()["plan"]["window"]["privacy"]["epsilon_per_window"] == \
                (0.25 if who == "other" else 0.5)
            assert r.json()["privacy"]["budgets"][0]["remaining"] == 12
            handles[who] = r.json()["handle"]
        readers = {who: Reader(url, who=who).start() for who, url in handles.items()}
        values = [float((7 * i) % 11) for i in range(41)]  # integers 0..10: inside the bounds
        ingest(base, values, 1_714_550_400.0)
        s3 = readers["lta"].wait_rows(20, timeout=90)
        s4 = readers["other"].wait_rows(19, timeout=90)
        s5 = readers["nea"].wait_rows(19, timeout=90)
        assert (len(s3), len(s4), len(s5)) == (20, 19, 19)
        exact3 = [sum(values[2 * k:2 * k + 3]) for k in range(20)]
        assert all(w["window_start"] == 2 * k for k, w in enumerate(s3))
        assert not any(w["sum_rainrate"] == e for w, e in zip(s3, exact3, strict=True))  # all noisy
        recovered, truth = [], []
        for k in range(19):
            recovered.append(s4[k]["sum_rainrate"] - s3[k]["sum_rainrate"])  # a[2k+3]
            truth.append(values[2 * k + 3])
            recovered.append(s5[k]["sum_rainrate"] - s4[k]["sum_rainrate"])  # a[2k+4]
            truth.append(values[2 * k + 4])
        close = sum(abs(r_ - t) < 0.5 for r_, t in zip(recovered, truth, strict=True))
        assert close <= 6, (close, recovered, truth)  # expected under 0.5; exact: all 38
        assert sum(abs(r_ - t) for r_, t in zip(recovered, truth, strict=True)) / len(truth) > 5

        # the budget: lta spent 20 x 0.5 = 10 of 12; four more windows, then the end
        ingest(base, [5.0] * 20, 1_714_550_500.0)
        assert readers["lta"].done.wait(90)
        rows = readers["lta"].rows
        final = readers["lta"].lines[-1]
        assert len(rows) == 24 and [w["window_start"] for w in rows[20:]] == [40, 42, 44, 46]
        assert final["event"] == "ended" and "privacy budget spent" in final["reason"]
        assert "12 per 86400 s on stream 'dp_weather'" in final["reason"]
        r = requests.get(handles["lta"], headers=auth("lta"), timeout=30)
        assert r.status_code == 410
        listed = [h for h in requests.get(f"{base}/handles", headers=auth("lta"),
                                          timeout=30).json()["handles"]
                  if h["stream"] == STREAM]
        assert listed[-1]["state"] == "ended"
        # a new request is refused with the figures; explain says so too
        r = ask(base, "lta", 3)
        assert r.status_code == 403, r.text
        body = r.json()
        assert "privacy budget" in body["error"] and body["budget"]["remaining"] == 0
        assert body["budget"]["refills_at"].endswith("Z") and body["needed"] == 0.5
        r = requests.post(f"{base}/explain", headers=auth("lta", **XML),
                          data=sensor_request(STREAM), timeout=30)
        assert r.json()["privacy"]["admitted"] is False
        assert r.json()["privacy"]["budgets"][0]["spent"] == 12
        # another consumer's budget is its own: 29 windows of 0.25
        assert readers["other"].wait_rows(29, timeout=60)[-1]["window_start"] == 56
        assert not readers["other"].done.is_set()
        for who in ("other", "nea"):
            requests.delete(handles[who], headers=auth(who), timeout=30)
    finally:
        requests.delete(f"{base}/policies/urn:t:{STREAM}", headers=auth("nea"), timeout=30)
