"""Joins of two streams over HTTP on real Spark: each side enforced by its own policy first.

NEA registers `j_stations(t, station, rainrate, humidity)` and `j_ships(ts, area, mmsi, speed,
owner)` and writes one policy per stream (and per subject): lta (and nea) see stations with
rainrate > 1 without humidity, ships with speed < 20 without owner; `other` may see the stations
only. lta joins them on station = area within 5 seconds; every joined row is checked value by
value against a brute-force recomputation that applies each side's policy first. Then: `other`
gets 403 naming the ships, a condition on humidity is refused naming it, and deleting either
side's policy revokes the join's handle with nothing after.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
import requests

from tests.e2e.conftest import Reader, auth

S = "http://www.w3.org/2001/XMLSchema#string"
XML = {"Content-Type": "application/xacml+xml"}
JSON = {"Content-Type": "application/xacml+json"}
ND = {"Content-Type": "application/x-ndjson"}
LEFT, RIGHT = "j_stations", "j_ships"
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
WITHIN = 5


def policy(stream: str, subject: str, condition: str, *visible: str) -> bytes:
    def match(value: str, category: str, attribute: str) -> str:
        return (f'<AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-'
                f'equal"><AttributeValue DataType="{S}">{value}</AttributeValue>'
                f'<AttributeDesignator Category="{category}" AttributeId="{attribute}" '
                f'DataType="{S}" MustBePresent="false"/></Match></AllOf></AnyOf>')
    assignments = "".join(
        f'<AttributeAssignmentExpression AttributeId="exacml:obligation:stream-map-attribute-id">'
        f'<AttributeValue DataType="{S}">{a}</AttributeValue></AttributeAssignmentExpression>'
        for a in visible)
    return (f'<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" '
            f'PolicyId="urn:t:join:{stream}:{subject}" Version="1" RuleCombiningAlgId="urn:oasis:'
            f'names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides"><Target>'
            + match(stream, "urn:oasis:names:tc:xacml:3.0:attribute-category:resource",
                    "urn:oasis:names:tc:xacml:1.0:resource:resource-id")
            + '</Target><Rule RuleId="r" Effect="Permit"><Target>'
            + match(subject, "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject",
                    "urn:oasis:names:tc:xacml:1.0:subject:subject-id")
            + '</Target><ObligationExpressions>'
              '<ObligationExpression ObligationId="exacml:obligation:stream-filter" '
              'FulfillOn="Permit"><AttributeAssignmentExpression '
              'AttributeId="exacml:obligation:stream-filter-condition-id">'
              f'<AttributeValue DataType="{S}">{condition}</AttributeValue>'
              '</AttributeAssignmentExpression></ObligationExpression>'
              '<ObligationExpression ObligationId="exacml:obligation:stream-map" '
              f'FulfillOn="Permit">{assignments}</ObligationExpression>'
              '</ObligationExpressions></Rule></Policy>').encode()


STATIONS_POLICY = ("rainrate &gt; 1", "t", "station", "rainrate")
SHIPS_POLICY = ("speed &lt; 20", "ts", "area", "mmsi", "speed")


def join_request(query: dict) -> bytes:
    return json.dumps({"Request": {
        "Resource": {"Attribute": [{"AttributeId":
                                    "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
                                    "Value": LEFT}], "Content": query},
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                  "Value": "read"}]}}}).encode()


QUERY = {"join": {"stream": RIGHT, "on": [["station", "area"]], "within": WITHIN,
                  "filter": "mmsi > 1000"}}


def iso(seconds: int) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def stations(start: int, n: int) -> list[dict]:
    return [{"t": iso(i), "station": "ABC"[i % 3], "rainrate": float(i % 4) + 0.5,
             "humidity": 50.0 + i} for i in range(start, start + n)]


def ships(start: int, n: int) -> list[dict]:
    return [{"ts": iso(i), "area": "AB"[i % 2], "mmsi": 999 + i % 7, "speed": float(i * 7 % 30),
             "owner": f"owner-{i}"} for i in range(start, start + n)]


def ndjson(rows: list[dict]) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def expected_join(left: list[dict], right: list[dict]) -> Counter:
    """Each side's policy first (and the consumer's filter on its side), then the join."""
    lview = [{"t": r["t"], "station": r["station"], "rainrate": r["rainrate"]}
             for r in left if r["rainrate"] > 1]
    rview = [{"ts": r["ts"], "area": r["area"], "mmsi": r["mmsi"], "speed": r["speed"]}
             for r in right if r["speed"] < 20 and r["mmsi"] > 1000]
    out = Counter()
    for a in lview:
        for b in rview:
            if a["station"] == b["area"] and \
                    abs((when(a["t"]) - when(b["ts"])).total_seconds()) <= WITHIN:
                out[_key({**{f"{LEFT}.{k}": v for k, v in a.items()},
                          **{f"{RIGHT}.{k}": v for k, v in b.items()}})] += 1
    return out


def _key(row: dict) -> tuple:
    return tuple(sorted((k, when(v) if k.endswith((".t", ".ts")) else v)
                        for k, v in row.items()))


def ingest(base: str, stream: str, rows: list[dict]) -> None:
    r = requests.post(f"{base}/streams/{stream}/records", data=ndjson(rows),
                      headers=auth("nea", **ND), timeout=30)
    assert r.status_code == 201, r.text


def setup_streams(base: str) -> None:
    for name, schema, time_attribute in (
            (LEFT, [("t", "timestamp"), ("station", "string"), ("rainrate", "double"),
                    ("humidity", "double")], "t"),
            (RIGHT, [("ts", "timestamp"), ("area", "string"), ("mmsi", "long"),
                     ("speed", "double"), ("owner", "string")], "ts")):
        r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
            "name": name, "time_attribute": time_attribute, "source": {"kind": "ingest"},
            "schema": [{"name": n, "type": t} for n, t in schema]})
        assert r.status_code == 201, r.text
    for stream, obligations, subjects in ((LEFT, STATIONS_POLICY, ("lta", "nea", "other")),
                                          (RIGHT, SHIPS_POLICY, ("lta", "nea"))):
        for subject in subjects:
            r = requests.post(f"{base}/policies", headers=auth("nea", **XML), timeout=30,
                              data=policy(stream, subject, *obligations))
            assert r.status_code == 201, r.text


@pytest.fixture(scope="module")
def streams(gateway):
    setup_streams(gateway.url)
    return gateway


def test_a_join_over_http_on_spark(gateway, streams):
    base = gateway.url
    r = requests.post(f"{base}/requests", headers=auth("lta", **JSON), data=join_request(QUERY),
                      timeout=120)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["plan"]["streams"] == [LEFT, RIGHT] and "JOIN `j_ships`" in body["sql"]
    hid = body["id"]
    reader = Reader(body["handle"]).start()

    # the same join from another subject with the same grants is computed once and shared
    shared = requests.post(f"{base}/requests", headers=auth("nea", **JSON),
                           data=join_request(QUERY), timeout=60)
    assert shared.status_code == 201 and shared.json()["plan"]["key"] == body["plan"]["key"]
    joins = gateway.services.join_runtime.get()
    assert set(joins.handles()) == {hid, shared.json()["id"]}
    assert len(joins.stats()) == 1 and next(iter(joins.stats().values()))["handles"] == 2
    assert requests.delete(shared.json()["handle"], headers=auth("nea"),
                           timeout=30).status_code == 200

    # records in chunks of 8 s of event time, both streams alike (the join's watermark delay is
    # 10 s: no record is late)
    left, right = [], []
    for start in range(0, 48, 8):
        left += stations(start, 8)
        right += ships(start, 8)
        ingest(base, LEFT, left[-8:])
        ingest(base, RIGHT, right[-8:])
        time.sleep(0.3)
    expected = expected_join(left, right)
    assert 40 <= sum(expected.values()) <= 300
    got = reader.wait_rows(sum(expected.values()), timeout=150)
    assert Counter(_key(row) for row in got) == expected, (len(got), sum(expected.values()))
    for row in got:  # what the policies hide never shows, under any name
        assert not any(k.endswith((".humidity", ".owner")) for k in row)
    assert not reader.done.is_set()
    stats = next(iter(joins.stats().values()))
    assert stats.get("late_rows", 0) == 0

    # deleting the ships' policy revokes the join before the DELETE answers; nothing after
    r = requests.delete(f"{base}/policies/urn:t:join:{RIGHT}:lta", headers=auth("nea"),
                        timeout=30)
    assert r.status_code == 204
    assert reader.done.wait(5)
    assert reader.lines[-1]["event"] == "revoked" and RIGHT in reader.lines[-1]["reason"]
    count = len(reader.rows)
    ingest(base, LEFT, stations(48, 8))
    ingest(base, RIGHT, ships(48, 8))
    time.sleep(1.0)
    assert len(reader.rows) == count
    r = requests.get(body["handle"], headers=auth("lta", Accept="application/x-ndjson"),
                     timeout=10)
    assert r.status_code == 410 and r.json()["state"] == "revoked"
    assert hid not in joins.handles()


def test_one_side_only_a_hidden_attribute_and_the_first_sides_revocation(gateway, streams):
    base = gateway.url
    # `other` may read the stations but not the ships: 403 naming the ships
    r = requests.post(f"{base}/requests", headers=auth("other", **JSON),
                      data=join_request(QUERY), timeout=60)
    assert r.status_code == 403
    status = r.json()["Response"][0]["Status"]["StatusMessage"]
    assert f"'{RIGHT}'" in status and "second stream" in status
    # a join condition on an attribute the stations' policy hides: refused naming it
    hidden = {"join": {**QUERY["join"], "on": [["humidity", "speed"]]}}
    r = requests.post(f"{base}/requests", headers=auth("nea", **JSON), data=join_request(hidden),
                      timeout=60)
    assert r.status_code == 403 and r.json()["attribute"] == "humidity", r.text
    # revoking the first side (its policy changes what nea may see) revokes the join
    r = requests.post(f"{base}/requests", headers=auth("nea", **JSON), data=join_request(QUERY),
                      timeout=120)
    assert r.status_code == 201, r.text
    reader = Reader(r.json()["handle"], who="nea").start()
    ingest(base, LEFT, stations(100, 8))
    ingest(base, RIGHT, ships(100, 8))
    assert reader.wait_rows(1, timeout=150), reader.lines
    r = requests.put(f"{base}/policies/urn:t:join:{LEFT}:nea", headers=auth("nea", **XML),
                     timeout=30, data=policy(LEFT, "nea", "rainrate &gt; 2", "t", "station",
                                             "rainrate"))
    assert r.status_code == 200, r.text
    assert reader.done.wait(5)
    assert reader.lines[-1]["event"] == "revoked" and LEFT in reader.lines[-1]["reason"]
    count = len(reader.rows)
    ingest(base, LEFT, stations(108, 8))
    ingest(base, RIGHT, ships(108, 8))
    time.sleep(1.0)
    assert len(reader.rows) == count


def test_a_join_beside_a_plain_handle_gets_every_new_row_and_no_old_one(gateway, streams):
    """The stream's own query (opened by a plain handle) archives the files it has committed;
    a join opened later on the same stream must still see every record ingested after it
    opened, and none from before."""
    base = gateway.url
    r = requests.post(f"{base}/policies", headers=auth("nea", **XML), timeout=30,
                      data=policy(RIGHT, "lta", *SHIPS_POLICY))
    assert r.status_code in (201, 409), r.text
    # nea's plain handle (not `other`'s: the paper scenario checks that `other`, sharing this
    # gateway, has no handle at all)
    r = requests.post(f"{base}/requests", headers=auth("nea", **JSON), timeout=120,
                      data=json.dumps({"Request": {"Resource": {"Attribute": [{
                          "AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
                          "Value": LEFT}]}, "Action": {"Attribute": [{
                              "AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                              "Value": "read"}]}}}))
    assert r.status_code == 201, r.text
    plain = Reader(r.json()["handle"], who="nea").start()
    ingest(base, LEFT, stations(200, 8))
    ingest(base, RIGHT, ships(200, 8))
    assert plain.wait_rows(1, timeout=150), plain.lines

    r = requests.post(f"{base}/requests", headers=auth("lta", **JSON), data=join_request(QUERY),
                      timeout=120)
    assert r.status_code == 201, r.text
    reader = Reader(r.json()["handle"]).start()
    left, right = [], []
    for start in range(300, 348, 8):
        left += stations(start, 8)
        right += ships(start, 8)
        ingest(base, LEFT, left[-8:])
        ingest(base, RIGHT, right[-8:])
        time.sleep(0.5)
    expected = expected_join(left, right)
    got = reader.wait_rows(sum(expected.values()), timeout=150)
    time.sleep(1.0)
    got = reader.rows
    assert Counter(_key(row) for row in got) == expected, (len(got), sum(expected.values()))
    for url, who in ((r.json()["handle"], "lta"), (plain.url, "nea")):
        assert requests.delete(url, headers=auth(who), timeout=30).status_code == 200
