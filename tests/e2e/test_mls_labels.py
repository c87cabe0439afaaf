"""Multilevel labels end to end on Spark (policies/mls/position-policy.xml): a stream whose
`level` attribute is a label on U < C < S < TS with categories, analysts reading at their
clearance or a session they choose below it, and windows over the tuples their session
dominates, labelled with the least upper bound of those tuples (the MLS DSMS paper's shape);
every row and window against a brute-force reading of the lattice (pep.core.labels). And from a
low reader's side: its windows are the same whether or not tuples above it are ingested."""
from __future__ import annotations

import json
import random
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests

from pep.core.labels import lub
from pep.streams.definition import parse_schema
from tests.e2e.conftest import Reader, added_subjects, auth

POLICIES = Path(__file__).resolve().parents[2] / "policies"
POSITION = next(s for s in json.loads((POLICIES / "streams.json").read_text())
                if s["name"] == "position")
LATTICE = parse_schema(POSITION["schema"]).lookup("level").lattice
XML = "application/xacml+xml"
T0 = 1_714_550_400  # a multiple of 60
SUBJECTS = {"analyst-s": "S:{nuclear,crypto}", "analyst-sess": "S:{nuclear,crypto}",
            "analyst-w": "S:{nuclear,crypto}", "analyst-cw": "C", "analyst-cn": "C:{nuclear}"}
CLEAN = ["U", "C", "C:{nuclear}", "S:{crypto}", "S:{nuclear,crypto}", "U:{crypto}"]
ANY = CLEAN + ["TS", "S:{army}", "TS:{nuclear,crypto,army}", "C:{army}"]


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def records() -> list[dict]:
    """Three minutes of reports: the first and the last only of labels an S:{nuclear,crypto}
    session dominates, the second with some above it (TS, army)."""
    rng = random.Random(27)
    out = []
    for i in range(180):
        pool = ANY if 60 <= i < 120 else CLEAN
        out.append({"sid": 100 + i % 9, "lat": round(rng.uniform(-5, 5), 4),
                    "lon": round(rng.uniform(100, 110), 4), "level": rng.choice(pool),
                    "ts": iso(T0 + i)})
    return out


def request(action: str, session: str | None = None) -> bytes:
    body = (POLICIES / "mls" / ("analyst-request.xml" if action == "read"
                                else "analyst-count-request.xml")).read_bytes()
    if session is not None:
        body = (POLICIES / "mls" / "analyst-session-request.xml").read_bytes() \
            .replace(b"C:{nuclear}", session.encode())
    return body


def ask(base: str, who: str, body: bytes):
    return requests.post(f"{base}/requests", data=body, timeout=60,
                         headers=auth(who, **{"Content-Type": XML}))


@pytest.fixture(scope="module")
def mls(gateway):
    base = gateway.url
    with added_subjects(gateway, {s: {"roles": ["analyst"], "attributes": {"clearance": c}}
                                for s, c in SUBJECTS.items()}):
        try:
            r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
                k: POSITION[k] for k in ("name", "time_attribute", "source", "schema")})
            assert r.status_code == 201, r.text
            assert r.json()["schema"][3]["categories"] == ["nuclear", "crypto", "army"]
            policy = POLICIES / "mls" / "position-policy.xml"
            r = requests.post(f"{base}/policies", data=policy.read_bytes(), timeout=30,
                              headers=auth("nea", **{"Content-Type": XML}))
            assert r.status_code == 201, r.text
            yield base
        finally:
            requests.delete(f"{base}/policies/urn:xsg:example:mls:position-policy",
                            headers=auth("nea"), timeout=30)


def dominated(text: str, session: str) -> bool:
    return LATTICE.parse(text).dominated_by(LATTICE.parse(session))


def expected_windows(recs: list[dict], session: str) -> list[dict]:
    """60 s windows over the reports the session dominates (nothing else enters them), at
    least 3 of them (time windows' default), closed by the latest event time among them, with
    their lub."""
    mine = [(i, r) for i, r in enumerate(recs) if dominated(r["level"], session)]
    watermark = max(T0 + i for i, _ in mine)
    out = []
    for k in range(3):
        start, end = T0 + 60 * k, T0 + 60 * (k + 1)
        inside = [r for i, r in mine if 60 * k <= i < 60 * (k + 1)]
        if end > watermark or len(inside) < 3:
            continue
        out.append({"window_start": iso(start), "window_end": iso(end),
                    "count_sid": len(inside),
                    "lub_level": str(lub(LATTICE.parse(r["level"]) for r in inside))})
    return out


@pytest.mark.timeout(150)
def test_analysts_read_at_their_session_and_windows_are_labelled(mls):
    base = mls
    # ingest refuses what is no label of the lattice, naming line and field
    r = requests.post(f"{base}/streams/position/records", timeout=30,
                      data=b'{"sid": 1, "lat": 0, "lon": 0, "level": "S:{spy}", "ts": "'
                      + iso(T0).encode() + b'"}\n',
                      headers=auth("nea", **{"Content-Type": "application/x-ndjson"}))
    assert r.status_code == 400 and "level" in r.text and "spy" in r.text, r.text
    # no read up: a session above the clearance
    r = ask(base, "analyst-s", request("read", "TS:{nuclear}"))
    assert r.status_code == 403 and "clearance" in r.text, r.text
    handles = {}
    for who, body in (("analyst-s", request("read")),
                      ("analyst-sess", request("read", "C:{nuclear}")),
                      ("analyst-w", request("aggregate")),
                      ("analyst-cw", request("aggregate"))):
        r = ask(base, who, body)
        assert r.status_code == 201, (who, r.text)
        handles[who] = Reader(r.json()["handle"], who).start()
    recs = records()
    for n in range(0, 180, 60):
        body = "".join(json.dumps(x) + "\n" for x in recs[n:n + 60])
        r = requests.post(f"{base}/streams/position/records", data=body, timeout=30,
                          headers=auth("nea", **{"Content-Type": "application/x-ndjson"}))
        assert r.status_code == 201, r.text
        time.sleep(0.3)
    want = {
        "analyst-s": [r for r in recs if dominated(r["level"], "S:{nuclear,crypto}")],
        "analyst-sess": [r for r in recs if dominated(r["level"], "C:{nuclear}")],
        "analyst-w": expected_windows(recs, "S:{nuclear,crypto}"),
        "analyst-cw": expected_windows(recs, "C"),
    }
    assert 0 < len(want["analyst-sess"]) < len(want["analyst-s"]) < len(recs)
    # the middle minute holds TS and army reports: it counts only what the session dominates
    assert want["analyst-w"][0]["count_sid"] == 60
    assert 3 <= want["analyst-w"][1]["count_sid"] < 60
    assert len(want["analyst-cw"]) == 2
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(
            len(handles[w].rows) >= len(want[w]) for w in want):
        time.sleep(0.1)
    time.sleep(1.0)
    for who in ("analyst-s", "analyst-sess"):
        assert handles[who].rows == want[who], who
    assert handles["analyst-w"].rows == want["analyst-w"]
    assert handles["analyst-cw"].rows == want["analyst-cw"]
    for who, reader in handles.items():
        assert requests.delete(reader.url, headers=auth(who), timeout=30).status_code in (200, 204)


# -- a join of two labelled streams ---------------------------------------------------------------

STR = "http://www.w3.org/2001/XMLSchema#string"
INT = "http://www.w3.org/2001/XMLSchema#integer"
SITES, REPORTS = "mls_sites", "mls_reports"


def _assign(attribute: str, value: str, datatype: str = STR) -> str:
    return (f'<AttributeAssignmentExpression AttributeId="exacml:obligation:{attribute}">'
            f'<AttributeValue DataType="{datatype}">{value}</AttributeValue>'
            '</AttributeAssignmentExpression>')


def labelled_policy(stream: str, obligation: str) -> bytes:
    """Analysts (any action) read `stream` under one obligation."""
    def match(value: str, category: str, attribute: str) -> str:
        return (f'<AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-'
                f'equal"><AttributeValue DataType="{STR}">{value}</AttributeValue>'
                f'<AttributeDesignator Category="{category}" AttributeId="{attribute}" '
                f'DataType="{STR}" MustBePresent="false"/></Match></AllOf></AnyOf>')
    return (f'<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" '
            f'PolicyId="urn:t:mls-join:{stream}" Version="1" RuleCombiningAlgId="urn:oasis:'
            f'names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides"><Target>'
            + match(stream, "urn:oasis:names:tc:xacml:3.0:attribute-category:resource",
                    "urn:oasis:names:tc:xacml:1.0:resource:resource-id")
            + '</Target><Rule RuleId="r" Effect="Permit"><Target>'
            + match("analyst", "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject",
                    "urn:oasis:names:tc:xacml:2.0:subject:role")
            + f'</Target><ObligationExpressions>{obligation}</ObligationExpressions></Rule>'
              '</Policy>').encode()


SITES_WINDOW = ('<ObligationExpression ObligationId="exacml:obligation:stream-window" '
                'FulfillOn="Permit">' + _assign("stream-window-type-id", "time")
                + _assign("stream-window-size-id", "10", INT)
                + _assign("stream-window-step-id", "10", INT)
                + _assign("stream-window-attr-id", "site:count")
                + _assign("stream-window-attr-id", "level:lub")
                + _assign("stream-window-key-id", "site")
                + _assign("stream-window-min-count-id", "1", INT)
                + _assign("stream-window-label-bound-id",
                          "level DOMINATED_BY {subject:session}")
                + '</ObligationExpression>')
REPORTS_FILTER = ('<ObligationExpression ObligationId="exacml:obligation:stream-filter" '
                  'FulfillOn="Permit">'
                  + _assign("stream-filter-condition-id", "level DOMINATED_BY {subject:session}")
                  + '</ObligationExpression>')


def labelled_records(pool_of, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"site": "AB"[i % 2], "level": rng.choice(pool_of(i)), "ts": iso(T0 + i)}
            for i in range(60)]


def _when(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def expected_join(sites: list[dict], reports: list[dict], session: str) -> Counter:
    """10 s windows per site over the sites' tuples the session dominates (nothing else enters
    them), with their lub, closed by the join's watermark (the lower side's latest time among
    the tuples it lets through, minus 10 s of lateness); the reports the session dominates;
    pairs on site within 5 s of the window's end, labelled with the lub of the window's lub and
    the report's label."""
    sites = [r for r in sites if dominated(r["level"], session)]
    watermark = min(max(_when(r["ts"]) for r in sites),
                    max(_when(r["ts"]) for r in reports if dominated(r["level"], session))) - 10
    bound = LATTICE.parse(session)
    windows = []
    for k in range(6):
        start, end = T0 + 10 * k, T0 + 10 * (k + 1)
        for site in "AB":
            inside = [r for r in sites if r["site"] == site and start <= _when(r["ts"]) < end]
            if inside and end <= watermark:
                windows.append((start, end, site, len(inside),
                                lub(LATTICE.parse(r["level"]) for r in inside)))
    out: Counter = Counter()
    for start, end, site, count, top in windows:
        for r in reports:
            label = LATTICE.parse(r["level"])
            if r["site"] == site and label.dominated_by(bound) and \
                    abs(end - _when(r["ts"])) <= 5:
                out[_row_key({f"{SITES}.window_start": start, f"{SITES}.window_end": end,
                              f"{SITES}.site": site, f"{SITES}.count_site": count,
                              f"{SITES}.lub_level": str(top), f"{REPORTS}.site": r["site"],
                              f"{REPORTS}.level": r["level"], f"{REPORTS}.ts": _when(r["ts"]),
                              "label": str(lub([top, label]))})] += 1
    return out


def _row_key(row: dict) -> tuple:
    return tuple(sorted((k, _when(v) if k.endswith(("window_start", "window_end", ".ts"))
                         and isinstance(v, str) else v) for k, v in row.items()))


@pytest.mark.timeout(240)
def test_a_join_of_two_labelled_streams_is_labelled_and_bounded_by_the_session(mls):
    base = mls
    schema = [{"name": "site", "type": "string"}, POSITION["schema"][3],
              {"name": "ts", "type": "timestamp"}]
    for stream, obligation in ((SITES, SITES_WINDOW), (REPORTS, REPORTS_FILTER)):
        r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
            "name": stream, "time_attribute": "ts", "source": {"kind": "ingest"},
            "schema": schema})
        assert r.status_code == 201, r.text
        r = requests.post(f"{base}/policies", data=labelled_policy(stream, obligation),
                          timeout=30, headers=auth("nea", **{"Content-Type": XML}))
        assert r.status_code == 201, r.text
    try:
        query = {"join": {"stream": REPORTS, "on": [["site", "site"]], "within": 5}}
        body = json.dumps({"Request": {
            "Resource": {"Attribute": [{"AttributeId":
                                        "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
                                        "Value": SITES}], "Content": query},
            "Action": {"Attribute": [{"AttributeId":
                                      "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                      "Value": "read"}]}}}).encode()
        r = requests.post(f"{base}/requests", data=body, timeout=120,
                          headers=auth("analyst-w", **{"Content-Type": "application/xacml+json"}))
        assert r.status_code == 201, r.text
        plan = r.json()["plan"]
        assert plan["output"][-1] == "label"
        assert plan["join"]["label"] == {"left": "lub_level", "right": "level",
                                         "output": "label"}
        reader = Reader(r.json()["handle"], "analyst-w").start()
        above = ["TS", "S:{army}", "C:{army}"]
        sites = labelled_records(lambda i: CLEAN + above if 20 <= i < 30 else CLEAN, 2727)
        reports = labelled_records(lambda i: CLEAN + above, 2728)
        reports = [{**x, "ts": iso(_when(x["ts"]) + 0.5)} for x in reports]
        for n in range(0, 60, 20):
            for stream, rows in ((SITES, sites), (REPORTS, reports)):
                data = "".join(json.dumps(x) + "\n" for x in rows[n:n + 20])
                r = requests.post(f"{base}/streams/{stream}/records", data=data, timeout=30,
                                  headers=auth("nea", **{"Content-Type":
                                                         "application/x-ndjson"}))
                assert r.status_code == 201, r.text
            time.sleep(0.3)
        want = expected_join(sites, reports, SUBJECTS["analyst-w"])
        assert sum(want.values()) >= 10
        got = reader.wait_rows(sum(want.values()), timeout=150)
        time.sleep(1.0)
        got = reader.rows
        assert Counter(_row_key(x) for x in got) == want, (len(got), sum(want.values()))
        session = LATTICE.parse(SUBJECTS["analyst-w"])
        for row in got:  # nothing above the session, neither a side nor the joined row
            for name in (f"{SITES}.lub_level", f"{REPORTS}.level", "label"):
                assert LATTICE.parse(row[name]).dominated_by(session), row
        assert any(row["label"] != row[f"{SITES}.lub_level"] for row in got)
        assert requests.delete(reader.url, headers=auth("analyst-w"),
                               timeout=30).status_code in (200, 204)
    finally:
        for stream in (SITES, REPORTS):
            requests.delete(f"{base}/policies/urn:t:mls-join:{stream}", headers=auth("nea"),
                            timeout=30)


# -- non-interference, from a low reader's side ---------------------------------------------------

QUIET, BUSY = "mls_quiet", "mls_busy"
LOW_STEPS = 6


def shipped_for(stream: str) -> bytes:
    """The shipped policy, word for word, for another stream (its target and id)."""
    policy = (POLICIES / "mls" / "position-policy.xml").read_bytes()
    assert policy.count(b">position<") == 1
    return policy.replace(b">position<", f">{stream}<".encode()).replace(
        b'PolicyId="urn:xsg:example:mls:position-policy"',
        f'PolicyId="urn:t:mls-ni:{stream}"'.encode())


def low_reports(step: int) -> list[dict]:
    """Four reports a C:{nuclear} session dominates, in minute `step`."""
    return [{"sid": 1 + i, "lat": 1.0, "lon": 104.0, "level": level,
             "ts": iso(T0 + 60 * step + offset)}
            for i, (level, offset) in enumerate((("U", 3), ("C", 17), ("C:{nuclear}", 31),
                                                 ("U", 52)))]


def high_reports(step: int) -> tuple[list[dict], list[dict]]:
    """Reports a C:{nuclear} session does not dominate (higher or incomparable), for ingest
    `step`: (in the same ingest as the low reports, in an ingest of their own before it)."""
    def report(level: str, ts: float) -> dict:
        return {"sid": 9, "lat": 2.0, "lon": 105.0, "level": level, "ts": iso(ts)}
    minute = T0 + 60 * step
    return [
        ([report("S", minute + 10), report("TS", minute + 40)], []),  # the same window
        ([report("C:{army}", minute + 65)], []),  # the next one, ahead of the reader's time
        ([report("S:{army}", T0 + 10 ** 8)], []),  # far in the future
        ([report("TS:{nuclear,crypto,army}", T0 - 10 ** 8)], []),  # far in the past
        ([], [report("C:{crypto}", minute + 20), report("S:{nuclear}", minute + 45)]),
        ([report("S:{nuclear,crypto}", minute + 5)], [report("TS", minute + 90)]),
    ][step]


@pytest.mark.timeout(240)
def test_a_low_readers_windows_are_the_same_whether_or_not_high_tuples_are_ingested(mls):
    """Two streams under the shipped policy, the same low reports ingested into both, tuples
    above the reader's session (C:{nuclear}) only into the second: in the same window as its
    reports, the next, far in the future, far in the past, in ingests of their own. After every
    ingest the reader's windows on both are the same, and the MLS paper's: counts and lubs of
    its own reports. (Under the old shape the second stream gave it no window at all.)"""
    base = mls
    session = SUBJECTS["analyst-cn"]
    for stream in (QUIET, BUSY):
        r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
            "name": stream, "time_attribute": "ts", "source": {"kind": "ingest"},
            "schema": POSITION["schema"]})
        assert r.status_code == 201, r.text
        r = requests.post(f"{base}/policies", data=shipped_for(stream), timeout=30,
                          headers=auth("nea", **{"Content-Type": XML}))
        assert r.status_code == 201 and r.json()["warnings"] == [], r.text
    readers = {}
    try:
        for stream in (QUIET, BUSY):
            body = request("aggregate").replace(b">position<", f">{stream}<".encode())
            r = ask(base, "analyst-cn", body)
            assert r.status_code == 201, r.text
            assert r.json()["plan"]["filter"] == [[{"attribute": "level", "op": "<=",
                                                    "label": session}]]
            readers[stream] = Reader(r.json()["handle"], "analyst-cn").start()

        def ingest(stream: str, rows: list[dict]) -> None:
            r = requests.post(f"{base}/streams/{stream}/records", timeout=30,
                              data="".join(json.dumps(x) + "\n" for x in rows),
                              headers=auth("nea", **{"Content-Type": "application/x-ndjson"}))
            assert r.status_code == 201, r.text

        want: list[dict] = []
        for step in range(LOW_STEPS):
            mixed, alone = high_reports(step)
            if alone:
                ingest(BUSY, alone)
            low = low_reports(step)
            ingest(QUIET, low)
            ingest(BUSY, low[:2] + mixed + low[2:])
            if step:  # this minute's reports close the last one's window
                before = low_reports(step - 1)
                want.append({"window_start": iso(T0 + 60 * (step - 1)),
                             "window_end": iso(T0 + 60 * step), "count_sid": 4,
                             "lub_level": str(lub(LATTICE.parse(x["level"]) for x in before))})
            assert all(dominated(w["lub_level"], session) for w in want)
            for stream, timeout in ((QUIET, 60), (BUSY, 20)):
                readers[stream].wait_rows(len(want), timeout=timeout)
            assert readers[QUIET].rows == want, step
            assert readers[BUSY].rows == want, (step, readers[BUSY].rows)
        time.sleep(1.5)  # nothing more comes on either
        assert readers[QUIET].rows == readers[BUSY].rows == want
    finally:
        for reader in readers.values():
            requests.delete(reader.url, headers=auth("analyst-cn"), timeout=30)
        for stream in (QUIET, BUSY):
            requests.delete(f"{base}/policies/urn:t:mls-ni:{stream}", headers=auth("nea"),
                            timeout=30)
