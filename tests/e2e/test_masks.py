"""Masked attributes end to end (issue 24): an owner's sharing rule with every kind of mask,
consumers' handles over HTTP on real Spark, every value checked against the same masks applied
by brute force here (the test's own: `Decimal` floors, Python's `hmac`, string slices), with the
owner's key read from its file.

Stream `fleet` (nea's): mmsi hash, name prefix:3, callsign suffix:2, lat,lon grid:0.1, speed
round:5 (under the policy's raw filter speed < 40), course bands:0,90,180,270, code round:100,
ok null, ts truncate:minute. Stream `fleet2` (nea's too): mmsi hash, ref raw. Five consumers:
- A, no query: every row, masked;
- B, a coarser mask (speed round:10, lat,lon grid:0.5) and a filter on masked values (speed = 20
  AND name = 'VES': masked values only);
- C, a tuple window grouped by the hashed mmsi (the driver's windows: rows, masked), sums of
  masked speeds;
- D, a time window grouped by the masked lat (Spark's panes: masked slots and keys);
- E, a join of fleet and fleet2 on the hashed mmsi (one owner, one key: equal values meet).
What is refused, and why, is checked per case; then a policy change that changes a mask revokes
the live handles as any obligation change does. The key never appears in an answer, the audit
trail or a log record.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import stat
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import ROUND_FLOOR, Decimal

import pytest
import requests

from tests.e2e.conftest import Reader, added_subjects, auth

RULE = "application/vnd.xsg.rule+json"
JSON = {"Content-Type": "application/xacml+json"}
ND = {"Content-Type": "application/x-ndjson"}
T0 = datetime(2025, 6, 1, 10, 0, tzinfo=UTC)
SUBJECTS = ("fleet-a", "fleet-b", "fleet-c", "fleet-d", "fleet-e", "fleet-x")
MASKS = {"mmsi": "hash", "name": "prefix:3", "callsign": "suffix:2", "lat,lon": "grid:0.1",
         "speed": "round:5", "course": "bands:0,90,180,270", "code": "round:100", "ok": "null",
         "ts": "truncate:minute"}
RULE_ID = "urn:t:mask:fleet"
SCHEMA = [("mmsi", "long"), ("name", "string"), ("callsign", "string"), ("lat", "double"),
          ("lon", "double"), ("speed", "double"), ("course", "double"), ("code", "long"),
          ("ok", "boolean"), ("ts", "timestamp")]
NAMES = ("VESSEL", "TUG", "VEGA", "BARGE")


# -- the brute force: masks written here, independently of pep ---------------------------------

def floor_to(x, step: str):
    if x is None:
        return None
    s = Decimal(step)
    return float((Decimal(repr(x)) / s).to_integral_value(rounding=ROUND_FLOOR) * s)


def band(x, edges=(0, 90, 180, 270)):
    below = [e for e in edges if e <= x]
    return float(below[-1]) if below else None


def minute(text: str) -> str:
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return t.replace(second=0, microsecond=0).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def keyed(key: bytes, value) -> str:
    return hmac.new(key, str(value).encode(), hashlib.sha256).hexdigest()


def masked(r: dict, key: bytes, speed="5", grid="0.1") -> dict:
    return {"mmsi": keyed(key, r["mmsi"]), "name": r["name"][:3], "callsign": r["callsign"][-2:],
            "lat": floor_to(r["lat"], grid), "lon": floor_to(r["lon"], grid),
            "speed": floor_to(r["speed"], speed), "course": band(r["course"]),
            "code": r["code"] - r["code"] % 100, "ok": None, "ts": minute(r["ts"])}


def iso(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def records() -> list[dict]:
    out = []
    for k in range(12):  # 12 steps of 20 s: four minutes
        for i in range(1, 7):
            out.append({"mmsi": 244000000 + i, "name": f"{NAMES[i % 4]}-{i:02d}",
                        "callsign": f"9V{i}{k:02d}", "lat": round(1.15 + 0.013 * i * (k + 1), 4),
                        "lon": round(103.6 + 0.021 * i + 0.007 * k, 4),
                        "speed": round(3.3 + ((i * 7 + k * 5) % 43) * 0.91, 2),
                        "course": float((i * 53 + k * 29) % 360), "code": 1000 * i + 37 * k,
                        "ok": (i + k) % 2 == 0, "ts": iso(20 * k + i)})
    return out


def fleet2_records() -> list[dict]:
    return [{"mmsi": 244000000 + i, "port": f"P{i}", "ref": 244000000 + i, "ts": iso(20 * k + 7)}
            for k in range(0, 12, 3) for i in (1, 2, 3, 9)]


# -- setup --------------------------------------------------------------------------------------

def rule(masks: dict) -> dict:
    return {"id": RULE_ID, "stream": "fleet", "who": {"roles": ["fleet-watch"]},
            "filter": "speed < 40", "mask": masks}


@pytest.fixture(scope="module")
def fleet(gateway):
    base = gateway.url
    with added_subjects(gateway, {s: {"roles": ["fleet-watch"]} for s in SUBJECTS}):
        try:
            fleet2 = [("mmsi", "long"), ("port", "string"), ("ref", "long"), ("ts", "timestamp")]
            for name, schema in (("fleet", SCHEMA), ("fleet2", fleet2)):
                r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
                    "name": name, "time_attribute": "ts", "source": {"kind": "ingest"},
                    "schema": [{"name": n, "type": t} for n, t in schema]})
                assert r.status_code == 201, r.text
            r = requests.post(f"{base}/policies", data=json.dumps(rule(MASKS)), timeout=30,
                              headers=auth("nea", **{"Content-Type": RULE}))
            assert r.status_code == 201, r.text
            assert "mmsi as hash" in r.json()["summary"] and "lat and lon as grid:0.1" in \
                r.json()["summary"], r.json()
            r = requests.post(f"{base}/policies", timeout=30, headers=auth("nea", **{
                "Content-Type": RULE}), data=json.dumps({
                    "id": "urn:t:mask:fleet2", "stream": "fleet2",
                    "who": {"roles": ["fleet-watch"]}, "mask": {"mmsi": "hash"}}))
            assert r.status_code == 201, r.text
            yield gateway
        finally:
            for policy in (RULE_ID, "urn:t:mask:fleet2"):
                requests.delete(f"{base}/policies/{policy}", headers=auth("nea"), timeout=30)


def request(stream: str, query: dict | None = None) -> bytes:
    resource = {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
                               "Value": stream}]}
    if query is not None:
        resource["Content"] = query
    return json.dumps({"Request": {"Resource": resource, "Action": {"Attribute": [{
        "AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
        "Value": "read"}]}}}).encode()


def ask(base: str, who: str, query: dict | None = None, where: str = "requests",
        stream: str = "fleet"):
    return requests.post(f"{base}/{where}", data=request(stream, query), timeout=60,
                         headers=auth(who, **JSON))


def ingest(base: str, stream: str, rows: list[dict]) -> None:
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    r = requests.post(f"{base}/streams/{stream}/records", data=body, timeout=30,
                      headers=auth("nea", **ND))
    assert r.status_code == 201, r.text


def error(r) -> str:
    try:
        return str(r.json().get("error"))
    except ValueError:
        return r.text


QUERIES = {
    "fleet-a": None,
    "fleet-b": {"mask": {"speed": "round:10", "lat,lon": "grid:0.5"},
                "filter": "speed = 20 AND name = 'VES'",
                "map": ["mmsi", "name", "lat", "lon", "speed"]},
    "fleet-c": {"window": {"type": "tuple", "size": 2, "step": 2, "keys": ["mmsi"],
                           "aggregates": ["speed:sum", "code:max", "name:min"]}},
    "fleet-d": {"window": {"type": "time", "size": 120, "step": 60, "keys": ["lat"],
                           "aggregates": ["speed:sum", "course:max", "mmsi:count"]}},
    "fleet-e": {"map": ["mmsi", "speed", "ts"],
                "join": {"stream": "fleet2", "on": [["mmsi", "mmsi"]], "within": 40,
                         "map": ["mmsi", "port", "ts"]}},
}


# -- the expected views -------------------------------------------------------------------------

def expected(data: list[dict], join_rows: list[dict], key: bytes) -> dict:
    allowed = [r for r in data if r["speed"] < 40]  # the policy's filter: raw values
    out: dict = {"fleet-a": [masked(r, key) for r in allowed]}
    out["fleet-b"] = [{k: m[k] for k in ("mmsi", "name", "lat", "lon", "speed")}
                      for m in (masked(r, key, speed="10", grid="0.5") for r in allowed)
                      if m["speed"] == 20 and m["name"] == "VES"]
    per_key: dict[str, list[dict]] = {}
    windows = []
    for m in (masked(r, key) for r in allowed):  # tuple windows of 2 per hashed mmsi
        group = per_key.setdefault(m["mmsi"], [])
        group.append(m)
        if len(group) % 2 == 0:
            pair = group[-2:]
            windows.append((m["mmsi"], sum(p["speed"] for p in pair),
                            max(p["code"] for p in pair), min(p["name"] for p in pair)))
    out["fleet-c"] = Counter(windows)
    watermark = max(datetime.fromisoformat(r["ts"].replace("Z", "+00:00")) for r in data)
    cells: dict[tuple, list[dict]] = {}
    for r in allowed:  # time windows of 120 s every 60 s, grouped by the masked lat
        t = datetime.fromisoformat(r["ts"].replace("Z", "+00:00"))
        m = masked(r, key)
        last = int(t.timestamp()) // 60 * 60
        for start in (last - 60, last):
            cells.setdefault((start, m["lat"]), []).append(m)
    out["fleet-d"] = {(s, lat): (pytest.approx(sum(m["speed"] for m in ms)),
                                 max(m["course"] for m in ms), len(ms))
                      for (s, lat), ms in cells.items()
                      if datetime.fromtimestamp(s + 120, UTC) <= watermark}
    pairs = Counter()
    for r in allowed:
        m = masked(r, key)
        mt = datetime.fromisoformat(m["ts"].replace("Z", "+00:00"))
        for o in join_rows:
            ot = datetime.fromisoformat(o["ts"].replace("Z", "+00:00"))
            if keyed(key, o["mmsi"]) == m["mmsi"] and abs((mt - ot).total_seconds()) <= 40:
                pairs[(m["mmsi"], m["speed"], m["ts"], o["port"], o["ts"])] += 1
    out["fleet-e"] = pairs
    return out


# -- the tests ----------------------------------------------------------------------------------

@pytest.mark.timeout(240)
def test_every_mask_on_spark_matches_the_brute_force_and_a_mask_change_revokes(fleet, caplog):
    caplog.set_level(logging.INFO)
    base = fleet.url
    started = time.monotonic()
    readers, handles = {}, {}
    for who, query in QUERIES.items():
        r = ask(base, who, query)
        assert r.status_code == 201, (who, r.text)
        doc = r.json()
        handles[who] = doc
        readers[who] = Reader(doc["handle"], who).start()
    plan_a = handles["fleet-a"]["plan"]
    assert plan_a["masks"] == {"mmsi": "hash", "name": "prefix:3", "callsign": "suffix:2",
                               "lat": "grid:0.1", "lon": "grid:0.1", "speed": "round:5",
                               "course": "bands:0,90,180,270", "code": "round:100",
                               "ok": "null", "ts": "truncate:minute"}
    sql_b = handles["fleet-b"]["sql"]
    assert "floor(`speed` / 10) * 10 = 20" in sql_b and "left(`name`, 3) = 'VES'" in sql_b, sql_b
    assert "`speed` < 40" in sql_b  # the policy's filter, on the raw value
    assert "hmac(<owner's key>" in handles["fleet-a"]["sql"]

    data = records()
    joined = fleet2_records()
    for m in range(4):  # a minute at a time, both streams, as a join's watermarks want it
        ingest(base, "fleet", [r for r in data if r["ts"] < iso(60 * (m + 1))
                               and r["ts"] >= iso(60 * m)])
        ingest(base, "fleet2", [r for r in joined if r["ts"] < iso(60 * (m + 1))
                                and r["ts"] >= iso(60 * m)])
        time.sleep(0.3)
    time.sleep(1.0)
    ingest(base, "fleet", [{**data[-1], "speed": 1.0, "ts": iso(3600)}])  # closes the windows
    data.append({**data[-1], "speed": 1.0, "ts": iso(3600)})

    key_file = fleet.runtime.mask_keys.path_for("nea")
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    key = key_file.read_bytes()
    assert len(key) == 32
    want = expected(data, joined, key)
    assert len(want["fleet-a"]) > 40 and 0 < len(want["fleet-b"]) < 15
    assert len(want["fleet-c"]) >= 10 and len(want["fleet-d"]) >= 6
    assert sum(want["fleet-e"].values()) >= 6
    counts = {"fleet-a": len(want["fleet-a"]), "fleet-b": len(want["fleet-b"]),
              "fleet-c": sum(want["fleet-c"].values()), "fleet-d": len(want["fleet-d"]),
              "fleet-e": sum(want["fleet-e"].values())}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(len(readers[w].rows) < n
                                              for w, n in counts.items()):
        time.sleep(0.2)
    time.sleep(1.0)  # nothing more may come
    assert {w: len(readers[w].rows) for w in counts} == counts

    assert readers["fleet-a"].rows == want["fleet-a"]
    assert readers["fleet-b"].rows == want["fleet-b"]
    got_c = Counter((r["mmsi"], r["sum_speed"], r["max_code"], r["min_name"])
                    for r in readers["fleet-c"].rows)
    assert got_c == want["fleet-c"]
    got_d = {(int(datetime.fromisoformat(r["window_start"].replace("Z", "+00:00")).timestamp()),
              r["lat"]): (r["sum_speed"], r["max_course"], r["count_mmsi"])
             for r in readers["fleet-d"].rows}
    assert got_d == want["fleet-d"]
    got_e = Counter((r["fleet.mmsi"], r["fleet.speed"], r["fleet.ts"], r["fleet2.port"],
                     r["fleet2.ts"]) for r in readers["fleet-e"].rows)
    assert got_e == want["fleet-e"]

    # the key is in no answer, no audit entry and no log record
    hexkey = key.hex()
    for doc in handles.values():
        assert hexkey not in json.dumps(doc)
    audit = requests.get(f"{base}/audit", headers=auth("nea"), timeout=30)
    assert audit.status_code == 200 and "fleet" in audit.text and hexkey not in audit.text
    assert all(hexkey not in r.getMessage() and key.hex().upper() not in r.getMessage()
               for r in caplog.records)

    # a mask changed by the owner (speed round:5 -> round:10) revokes every live handle whose
    # view it changes, as any change of obligations does; nothing is delivered after. B asked
    # for round:10 already: its view is the same, and it is kept.
    r = requests.put(f"{base}/policies/{RULE_ID}", timeout=30,
                     data=json.dumps(rule({**MASKS, "speed": "round:10"})),
                     headers=auth("nea", **{"Content-Type": RULE}))
    assert r.status_code == 200, r.text
    for who in QUERIES:
        if who == "fleet-b":
            continue
        assert readers[who].done.wait(10), who
        assert readers[who].lines[-1]["event"] == "revoked", (who, readers[who].lines[-1])
    assert not readers["fleet-b"].done.is_set()
    assert requests.delete(handles["fleet-b"]["handle"], headers=auth("fleet-b"),
                           timeout=30).status_code in (200, 204)
    count = len(readers["fleet-a"].rows)
    ingest(base, "fleet", records()[:6])
    time.sleep(1.0)
    assert len(readers["fleet-a"].rows) == count
    again = ask(base, "fleet-a")
    assert again.status_code == 201 and again.json()["plan"]["masks"]["speed"] == "round:10"
    assert requests.delete(again.json()["handle"], headers=auth("fleet-a"),
                           timeout=30).status_code in (200, 204)
    assert time.monotonic() - started < 150


@pytest.mark.timeout(60)
def test_what_a_consumer_cannot_do_with_a_masked_attribute(fleet):
    base = fleet.url
    r = requests.put(f"{base}/policies/{RULE_ID}", data=json.dumps(rule(MASKS)), timeout=30,
                     headers=auth("nea", **{"Content-Type": RULE}))
    assert r.status_code == 200, r.text
    cases = [
        # a finer mask than the policy's: refused naming the attribute
        ({"mask": {"speed": "round:2"}}, 403, "speed"),
        ({"mask": {"lat,lon": "grid:0.05"}}, 403, "lat"),
        ({"mask": {"name": "prefix:5"}}, 403, "name"),
        # the raw value of a hashed attribute cannot even be written: mmsi is text here
        ({"filter": "mmsi = 244000001"}, 400, "mmsi"),
        # a spatial predicate would read the raw position
        ({"filter": "DISTANCE(lat, lon, 1.2, 103.8) < 1000"}, 403, "lat"),
        # an average of hashes
        ({"window": {"type": "tuple", "size": 2, "step": 2, "aggregates": ["mmsi:avg"]}}, 400,
         "avg"),
        # a time window finer than the time's mask
        ({"window": {"type": "time", "size": 90, "step": 90, "aggregates": ["speed:sum"]}}, 403,
         "minute"),
        # masked values that can never be: a speed off the 5-grid, a band that is no edge,
        # a masked speed the raw filter (speed < 40) never lets through
        ({"filter": "speed = 7"}, 422, "no value"),
        ({"filter": "course = 45"}, 422, "no value"),
        ({"filter": "speed >= 40"}, 422, "speed < 40"),
        ({"filter": "ok = true"}, 422, "no value"),  # null: always null
        # a join of a hash with a raw value: never the same kind
        ({"join": {"stream": "fleet2", "on": [["mmsi", "ref"]], "within": 5}}, 400, "mmsi"),
    ]
    for query, status, fragment in cases:
        r = ask(base, "fleet-x", query, where="explain" if status != 422 else "requests")
        assert r.status_code == status and fragment in error(r), (query, r.status_code, r.text)
    # what works on masked values, and says so
    r = ask(base, "fleet-x", {"filter": "speed = 20 AND ts >= '2025-06-01T10:01:00Z'"},
            where="explain")
    assert r.status_code == 200, r.text
    doc = r.json()
    predicates = [p for conj in doc["plan"]["filter"] for p in conj]
    assert {"attribute": "speed", "op": "=", "value": 20.0, "mask": "round:5"} in predicates
    assert {"attribute": "speed", "op": "<", "value": 40.0} in predicates
    assert "date_trunc('MINUTE', `ts`) >= TIMESTAMP" in doc["sql"]
    assert [w["kind"] for w in doc["warnings"] if w["operator"] == "filter"] == ["INFO"]
    graph = [op["op"] for op in doc["graph"]["operators"]]
    assert graph == ["source", "filter", "mask", "map"], graph
    r = ask(base, "fleet-x", {"mask": {"speed": "bands:0,20", "mmsi": "null"}}, where="explain")
    assert r.status_code == 200 and r.json()["plan"]["masks"]["speed"] == "bands:0,20", r.text
    assert r.json()["plan"]["masks"]["mmsi"] == "null"
