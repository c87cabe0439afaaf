"""Issue 15 at scale: well past the point where a windowed handle used to stop, every window of
several shapes (a tuple window of 60 step 1 among them) arrives, value by value equal to a
brute-force recomputation, and the stream keeps up until the end.

Three consumers read one stream over HTTP (NDJSON) while its owner ingests 200,000 records
through the API in batches of 10,000: a tuple window 60/1 (avg), a tuple window 10/2 (sum,
count, min, max) and a time window of 60 s advancing by 1 s (avg, count) over records 10 ms
apart. No reader may see a gap.
"""
from __future__ import annotations

import json
import math
import threading
import time
from datetime import datetime

import requests

from tests.e2e.conftest import auth
from tests.pep.conftest import TOKENS

S = "http://www.w3.org/2001/XMLSchema#string"
STREAM = "scale"
N = 200_000
BATCH = 10_000
T0 = 1_714_550_400.0  # 2024-05-01T08:00:00Z
SHAPES = {
    "lta": {"type": "tuple", "size": 60, "step": 1, "aggregates": ["v:avg"]},
    "other": {"type": "tuple", "size": 10, "step": 2,
              "aggregates": ["v:sum", "v:count", "v:min", "v:max"]},
    "nea": {"type": "time", "size": 60, "step": 1, "aggregates": ["v:avg", "v:count"]},
}


def value(i: int) -> float:
    return float((i * 7919) % 1000) / 10.0


def open_policy() -> bytes:
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="urn:t:{STREAM}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
        <AttributeValue DataType="{S}">{STREAM}</AttributeValue>
        <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
          AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" DataType="{S}"
          MustBePresent="false"/></Match></AllOf></AnyOf></Target>
      <Rule RuleId="everyone" Effect="Permit"/></Policy>""".encode()


def request_body() -> bytes:
    return f"""<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      ReturnPolicyIdList="false" CombinedDecision="false">
      <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource">
        <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
          IncludeInResult="false"><AttributeValue DataType="{S}">{STREAM}</AttributeValue>
        </Attribute></Attributes></Request>""".encode()


class FastReader:
    """Reads a handle's NDJSON in big chunks (a consumer that keeps up)."""

    def __init__(self, url: str, who: str) -> None:
        self.url, self.who = url, who
        self.rows: list[dict] = []
        self.events: list[dict] = []
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {TOKENS[self.who]}",
                   "Accept": "application/x-ndjson"}
        try:
            with requests.get(self.url, headers=headers, stream=True, timeout=60) as r:
                pending = b""
                for chunk in r.iter_content(chunk_size=1 << 16):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if not line:
                            continue
                        obj = json.loads(line)
                        if "row" in obj:
                            self.rows.append(obj["row"])
                        elif obj.get("event") != "heartbeat":
                            self.events.append(obj)
                            if obj.get("event") in ("revoked", "released", "ended", "shutdown"):
                                return
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = repr(exc)


def tuple_windows(values: list[float], size: int, step: int, functions: list[str]) -> list[dict]:
    out = []
    for k in range(0, (len(values) - size) // step + 1):
        window = values[k * step:k * step + size]
        row = {"window_start": k * step, "window_end": k * step + size - 1}
        row.update(aggregate(window, functions))
        out.append(row)
    return out


def time_windows(times: list[float], values: list[float], size: int, step: int,
                 functions: list[str]) -> list[dict]:
    top = max(times)
    by_window: dict[int, list[float]] = {}
    for t, v in zip(times, values, strict=True):
        for k in range(math.floor((t - size) / step) + 1, math.floor(t / step) + 1):
            by_window.setdefault(k, []).append(v)
    out = []
    for k in sorted(by_window):
        if k * step + size <= top:  # closed by the watermark (the largest event time)
            out.append({"window_start": k * step, **aggregate(by_window[k], functions)})
    return out


def aggregate(window: list[float], functions: list[str]) -> dict:
    row = {}
    for f in functions:
        name = f"{f}_v"
        row[name] = {"avg": sum(window) / len(window), "sum": sum(window), "count": len(window),
                     "min": min(window), "max": max(window)}[f]
    return row


def close_enough(a, b) -> bool:
    if isinstance(b, float) or isinstance(a, float):
        return a is not None and abs(a - b) <= 1e-9 * max(1.0, abs(b))
    return a == b


def test_every_window_arrives_well_past_the_old_stall(gateway, monkeypatch):
    # The readers are threads of this process, sharing its interpreter with the gateway; when
    # Spark falls behind (another test's job on the same cores), files pile up and one
    # micro-batch brings the 60/1 handle some 40,000 windows at once. A delivery waits at most
    # MAX_PUT_WAIT (5 s) for its readers before dropping rows: here they are given longer, so
    # a gap still means a reader that does not keep up, not one that shares a loaded machine.
    monkeypatch.setattr("pep.handles.buffer.MAX_PUT_WAIT", 30.0)
    base = gateway.url
    r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
        "name": STREAM, "time_attribute": "t", "source": {"kind": "ingest"},
        "schema": [{"name": "t", "type": "timestamp"}, {"name": "v", "type": "double"}]})
    assert r.status_code == 201, r.text
    r = requests.post(f"{base}/policies", headers=auth("nea", **{
        "Content-Type": "application/xacml+xml"}), data=open_policy(), timeout=30)
    assert r.status_code == 201, r.text
    readers = {}
    try:
        for who, window in SHAPES.items():
            r = requests.post(f"{base}/requests", headers=auth(who), timeout=60, files={
                "request": ("r.xml", request_body(), "application/xacml+xml"),
                "query": ("q.json", json.dumps({"window": window}), "application/json")})
            assert r.status_code == 201, r.text
            readers[who] = (r.json()["handle"], FastReader(r.json()["handle"], who))
        times = [T0 + i / 100 for i in range(N)]
        values = [value(i) for i in range(N)]
        for start in range(0, N, BATCH):
            body = "".join(json.dumps({"t": times[i], "v": values[i]}) + "\n"
                           for i in range(start, start + BATCH))
            r = requests.post(f"{base}/streams/{STREAM}/records", data=body.encode(),
                              headers=auth("nea", **{"Content-Type": "application/x-ndjson"}),
                              timeout=60)
            assert r.status_code == 201, r.text

        expected = {
            "lta": tuple_windows(values, 60, 1, ["avg"]),
            "other": tuple_windows(values, 10, 2, ["sum", "count", "min", "max"]),
            "nea": time_windows(times, values, 60, 1, ["avg", "count"]),
        }
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and any(
                len(reader.rows) < len(expected[who]) for who, (_, reader) in readers.items()):
            time.sleep(0.5)
        for who, (_, reader) in readers.items():
            want = expected[who]
            assert reader.error is None, (who, reader.error)
            assert [e for e in reader.events if e.get("event") == "gap"] == [], who
            assert len(reader.rows) == len(want), (who, len(reader.rows), len(want))
            for got, exp in zip(reader.rows, want, strict=True):
                if who == "nea":  # time windows' bounds are ISO text
                    got = {**got, "window_start": _epoch(got["window_start"])}
                for key, v in exp.items():
                    assert close_enough(got[key], v), (who, key, got, exp)
    finally:
        requests.delete(f"{base}/policies/urn:t:{STREAM}", headers=auth("nea"), timeout=30)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
