"""Re-sharing end to end (issue 48), over HTTP on real Spark: nea grants dv-lta a masked,
filtered view of its rain stream WITH GRANT OPTION; dv-lta derives a stream from its handle and
re-shares it under its own rules with dv-other (tuple windows of one station) and dv-third (a
coarser mask); each gets exactly what its derived rule allows of the deriving grant's rows,
checked against a brute force written here; dv-fourth, without the option, cannot derive. Then
nea deletes its grant: every downstream handle ends with `revoked` and no row after it, and the
derived stream is fed nothing more.
"""
from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime, timedelta

import pytest
import requests

from tests.e2e.conftest import Reader, added_subjects, auth

RULE = {"Content-Type": "application/vnd.xsg.rule+json"}
JSON = {"Content-Type": "application/xacml+json"}
ND = {"Content-Type": "application/x-ndjson"}
SUBJECTS = ("dv-lta", "dv-other", "dv-third", "dv-fourth")
T0 = datetime(2026, 3, 1, 6, 0, tzinfo=UTC)
UPSTREAM = "urn:t:dv:lta"


def iso(seconds: int) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def records(start: int, n: int) -> list[dict]:
    return [{"ts": iso(start + i), "station": f"S{(start + i) % 3 % 2}",
             "rainrate": round(((start + i) * 7.3) % 31, 1), "humidity": 50.0 + i}
            for i in range(n)]


# -- the brute force --------------------------------------------------------------------------

def floor_to(x: float, step: int) -> float:
    return float(math.floor(x / step) * step)


def deriving_view(rows: list[dict]) -> list[dict]:
    """nea's grant to dv-lta: rainrate > 8, rainrate rounded down to 5, no humidity."""
    return [{"ts": r["ts"], "station": r["station"], "rainrate": floor_to(r["rainrate"], 5)}
            for r in rows if r["rainrate"] > 8]


def third_view(derived: list[dict]) -> list[dict]:
    """dv-lta's rule for dv-third: ts and rainrate, rainrate rounded down to 10."""
    return [{"ts": r["ts"], "rainrate": floor_to(r["rainrate"], 10)} for r in derived]


def other_view(derived: list[dict]) -> list[dict]:
    """dv-lta's rule for dv-other: station S1's rows, tuple windows of 2 every 2."""
    s1 = [r for r in derived if r["station"] == "S1"]
    out = []
    for k in range(len(s1) // 2):
        pair = [r["rainrate"] for r in s1[2 * k:2 * k + 2]]
        out.append({"window_start": 2 * k, "window_end": 2 * k + 1,
                    "avg_rainrate": sum(pair) / 2, "max_rainrate": max(pair)})
    return out


# -- setup -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rain(gateway):
    base = gateway.url
    with added_subjects(gateway, {s: {"roles": ["consumer"]} for s in SUBJECTS}):
        try:
            r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
                "name": "dv-rain", "time_attribute": "ts", "source": {"kind": "ingest"},
                "schema": [{"name": "ts", "type": "timestamp"},
                           {"name": "station", "type": "string"},
                           {"name": "rainrate", "type": "double"},
                           {"name": "humidity", "type": "double"}]})
            assert r.status_code == 201, r.text
            for rule in ({"id": UPSTREAM, "stream": "dv-rain", "who": {"subjects": ["dv-lta"]},
                          "attributes": ["ts", "station", "rainrate"], "filter": "rainrate > 8",
                          "mask": {"rainrate": "round:5"}, "grant_option": True},
                         {"id": "urn:t:dv:fourth", "stream": "dv-rain",
                          "who": {"subjects": ["dv-fourth"]}}):
                r = requests.post(f"{base}/policies", data=json.dumps(rule), timeout=30,
                                  headers=auth("nea", **RULE))
                assert r.status_code == 201, r.text
            yield base
        finally:
            for policy in (UPSTREAM, "urn:t:dv:fourth"):
                requests.delete(f"{base}/policies/{policy}", headers=auth("nea"), timeout=30)


def ask(base: str, who: str, stream: str) -> dict:
    body = json.dumps({"Request": {
        "Resource": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:"
                                                   "resource-id", "Value": stream}]},
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:"
                                                 "action-id", "Value": "read"}]}}})
    r = requests.post(f"{base}/requests", data=body, headers=auth(who, **JSON), timeout=120)
    assert r.status_code == 201, r.text
    return r.json()


def ingest(base: str, rows: list[dict]) -> None:
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    r = requests.post(f"{base}/streams/dv-rain/records", data=body, timeout=30,
                      headers=auth("nea", **ND))
    assert r.status_code == 201, r.text


def test_a_derived_stream_re_shared_gives_exactly_its_rules_view_and_ends_with_its_grant(
        rain, gateway):
    base = rain
    lta = ask(base, "dv-lta", "dv-rain")
    assert lta["grant_option"] is True
    fourth = ask(base, "dv-fourth", "dv-rain")
    r = requests.post(f"{base}/handles/{fourth['id']}/derive", headers=auth("dv-fourth"),
                      json={"name": "dv-fourth-rain"}, timeout=30)
    assert r.status_code == 403 and "grant option" in r.json()["error"], r.text
    r = requests.post(f"{base}/handles/{lta['id']}/derive", headers=auth("dv-lta"),
                      json={"name": "dv-lta-rain"}, timeout=30)
    assert r.status_code == 201, r.text
    for rule in ({"stream": "dv-lta-rain", "who": {"subjects": ["dv-other"]},
                  "filter": "station = 'S1'",
                  "window": {"type": "tuple", "size": 2, "aggregates": ["rainrate:avg",
                                                                       "rainrate:max"]}},
                 {"stream": "dv-lta-rain", "who": {"subjects": ["dv-third"]},
                  "attributes": ["ts", "rainrate"], "mask": {"rainrate": "round:10"}}):
        r = requests.post(f"{base}/policies", data=json.dumps(rule), timeout=30,
                          headers=auth("dv-lta", **RULE))
        assert r.status_code == 201, r.text
    # wider than the grant: refused at write time
    r = requests.post(f"{base}/policies", timeout=30, headers=auth("dv-lta", **RULE),
                      data=json.dumps({"stream": "dv-lta-rain", "who": {"subjects": ["dv-third"]},
                                       "id": "urn:t:dv:wide", "mask": {"rainrate": "round:1"}}))
    assert r.status_code == 403 and r.json()["wider"] == "mask", r.text

    other = ask(base, "dv-other", "dv-lta-rain")
    third = ask(base, "dv-third", "dv-lta-rain")
    readers = {who: Reader(h["handle"], who=who).start()
               for who, h in (("dv-other", other), ("dv-third", third))}
    rows = records(0, 30)
    ingest(base, rows[:15])
    ingest(base, rows[15:])
    derived = deriving_view(rows)
    want = {"dv-third": third_view(derived), "dv-other": other_view(derived)}
    assert len(want["dv-third"]) > 10 and len(want["dv-other"]) >= 3, want
    for who, reader in readers.items():
        got = reader.wait_rows(len(want[who]), timeout=120)
        assert got == want[who], (who, got, want[who])
        # never more than the deriving grant: no hidden attribute, no finer value
        assert all("humidity" not in row and "station" not in row for row in got)

    # nea takes its grant back: every downstream handle ends, with nothing after `revoked`
    started = time.monotonic()
    assert requests.delete(f"{base}/policies/{UPSTREAM}", headers=auth("nea"),
                           timeout=30).status_code == 204
    for who, reader in readers.items():
        assert reader.done.wait(30), who
        assert reader.lines[-1]["event"] == "revoked", (who, reader.lines[-3:])
        assert "dv-lta-rain" in reader.lines[-1]["reason"]
        assert reader.final_at - started < 10
        assert reader.rows == want[who]  # nothing more came before the end
    catalog = gateway.services.catalog
    fed = catalog.position("dv-lta-rain")  # the last record appended to the derived stream
    assert fed == len(derived), (fed, len(derived))
    ingest(base, records(30, 20))
    time.sleep(2)
    assert catalog.position("dv-lta-rain") == fed
    r = requests.get(f"{base}/streams/dv-lta-rain/derivation", headers=auth("dv-lta"),
                     timeout=30)
    assert r.json()["state"] == "ended" and r.json()["chain"] == ["dv-rain"], r.text
    body = json.dumps({"Request": {"Resource": {"Attribute": [{
        "AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
        "Value": "dv-lta-rain"}]}, "Action": {"Attribute": [{
            "AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id", "Value": "read"}]}}})
    r = requests.post(f"{base}/requests", data=body, headers=auth("dv-third", **JSON), timeout=30)
    assert r.status_code == 410, r.text
