"""A masked event time through the whole gateway (issue 41, item 1): HTTP, real Spark.

The owner's rules show `ts` to the role `mt-watch` only as `ts:truncate:minute`. Its members
are the attacker: they know each tuple's minute and want its second. Before the fix the runtime
placed, ordered and clocked tuples by the raw time, and they learned it from what came back:

- stream `mt_clock` (ingest; ts, v, seq; lateness 20 s), time windows of 60 s with firstval,
  lastval, count and sum of v. *Order*: v=1 at 08:00:10 and v=2 at 08:00:50, then v=1 at
  08:02:50 and v=2 at 08:02:10: masked, the two minutes are alike (same values, same stream
  order), yet firstval/lastval came out 1/2 and 2/1. *Lateness*: v=3 at 08:04:10 and v=4 at
  08:05:25, then (a later micro-batch) v=5 at 08:04:40; the same masked history ten minutes on
  with v=4 at 08:15:05: 08:04's window lost v=5 as late, 08:14's kept it (the watermark, 20 s
  behind the raw time, told whether "08:05" had a second of at least 20).
- the same windows joined with a plain stream (`mt_marks`, one mark per window start): the
  join's windowed side ordered firstval/lastval by the raw time too.
- stream `mt_files` (files, no stream position: ordered by the time attribute, then file and
  place): plain rows came in raw-time order, tuple windows took their first and last from it,
  and time windows too.

Now each history's output is what its masked history gives: windows alike once masked are
alike, stream order breaks ties, the watermark is the masked time's.
"""
from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import Reader, added_subjects, auth
from tests.pep.runtime.support import write_jsonl

RULE = {"Content-Type": "application/vnd.xsg.rule+json"}
JSON = {"Content-Type": "application/xacml+json"}
ND = {"Content-Type": "application/x-ndjson"}
CLOCK, MARKS, FILES = "mt_clock", "mt_marks", "mt_files"
T0 = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)
ISO = "%Y-%m-%dT%H:%M:%S.%fZ"
ORDERED = ["v:firstval", "v:lastval", "v:count", "v:sum"]
# the attacker's subjects (one query per stream and subject: one subject per handle here)
SUBJECTS = ("mt-1", "mt-2", "mt-3", "mt-4")


def at(minute: int, second: float = 0) -> str:
    return (T0 + timedelta(minutes=minute, seconds=second)).strftime(ISO)


def rule(stream: str, masks: dict) -> dict:
    return {"id": f"urn:t:masked-time:{stream}", "stream": stream,
            "who": {"roles": ["mt-watch"]}, "mask": masks}


def ask(base: str, who: str, stream: str, query: dict) -> dict:
    body = json.dumps({"Request": {
        "Resource": {"Attribute": [{"AttributeId":
                                    "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
                                    "Value": stream}], "Content": query},
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                  "Value": "read"}]}}}).encode()
    r = requests.post(f"{base}/requests", data=body, headers=auth(who, **JSON), timeout=60)
    assert r.status_code == 201, r.text
    return r.json()


def read_in(runtime, stream: str, rows: int, timeout: float = 60) -> None:
    """Wait until the stream's query has read `rows` tuples: the next write is a micro-batch
    of its own (what the lateness sequence needs)."""
    deadline = time.monotonic() + timeout
    while (runtime.stats().get(stream) or {}).get("rows_in", 0) < rows:
        assert time.monotonic() < deadline, runtime.stats().get(stream)
        time.sleep(0.1)


@pytest.fixture(scope="module")
def streams(gateway, tmp_path_factory):
    base = gateway.url
    folder = tmp_path_factory.mktemp("mt-files")
    definitions = [
        {"name": CLOCK, "time_attribute": "ts", "lateness": 20, "source": {"kind": "ingest"},
         "schema": [{"name": "ts", "type": "timestamp"}, {"name": "v", "type": "long"},
                    {"name": "seq", "type": "long"}]},
        {"name": MARKS, "time_attribute": "ts", "source": {"kind": "ingest"},
         "schema": [{"name": "ts", "type": "timestamp"}, {"name": "at", "type": "timestamp"}]},
        {"name": FILES, "time_attribute": "ts",
         "source": {"kind": "files", "path": str(folder), "format": "json"},
         "schema": [{"name": "ts", "type": "timestamp"}, {"name": "v", "type": "long"}]},
    ]
    rules = [rule(CLOCK, {"ts": "truncate:minute"}), rule(MARKS, {}),
             rule(FILES, {"ts": "truncate:minute"})]
    with added_subjects(gateway, {s: {"roles": ["mt-watch"]} for s in SUBJECTS}):
        try:
            for definition in definitions:
                r = requests.post(f"{base}/streams", headers=auth("nea"), json=definition,
                                  timeout=30)
                assert r.status_code == 201, r.text
            for body in rules:
                r = requests.post(f"{base}/policies", data=json.dumps(body), timeout=30,
                                  headers=auth("nea", **RULE))
                assert r.status_code == 201, r.text
            yield gateway, folder
        finally:
            for body in rules:
                requests.delete(f"{base}/policies/{body['id']}", headers=auth("nea"), timeout=30)


def ingest(base: str, stream: str, rows: list[dict]) -> None:
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    r = requests.post(f"{base}/streams/{stream}/records", data=body, timeout=30,
                      headers=auth("nea", **ND))
    assert r.status_code == 201, r.text


def minute_of(text: str) -> str:
    return text[11:16]


@pytest.mark.timeout(240)
def test_time_windows_and_a_join_see_only_the_masked_minute(streams):
    gateway, _ = streams
    base = gateway.url
    window = {"type": "time", "size": 60, "step": 60, "aggregates": ORDERED}
    windows = ask(base, "mt-1", CLOCK, {"window": window})
    assert windows["plan"]["masks"] == {"ts": "truncate:minute"}  # it orders the windows
    joined = ask(base, "mt-2", CLOCK, {"window": window, "join": {
        "stream": MARKS, "on": [["window_start", "at"]], "within": 5}})
    readers = [Reader(windows["handle"], "mt-1").start(),
               Reader(joined["handle"], "mt-2").start()]
    # one mark per window start, at its end; the last far ahead, so that the marks' side never
    # holds the join's watermark back
    ingest(base, MARKS, [{"ts": at(m + 1), "at": at(m)} for m in (0, 2, 4, 5, 14, 15, 30)])

    def rec(seq: int, minute: int, second: float, v: int) -> dict:
        return {"ts": at(minute, second), "v": v, "seq": seq}
    batches = [
        [rec(1, 0, 10, 1), rec(2, 0, 50, 2)],      # order: 08:00 ...
        [rec(3, 2, 50, 1), rec(4, 2, 10, 2)],      # ... and 08:02, alike once masked
        [rec(5, 4, 10, 3), rec(6, 5, 25, 4)],      # lateness: "08:05" with second 25
        [rec(7, 4, 40, 5)],
        [rec(8, 14, 10, 3), rec(9, 15, 5, 4)],     # the same, ten minutes on, second 5
        [rec(10, 14, 40, 5)],
        [rec(11, 29, 0, 0)],                       # closes every window
    ]
    read = 0
    for batch in batches:
        ingest(base, CLOCK, batch)
        read += len(batch)
        read_in(gateway.runtime, CLOCK, read)
    want = {"08:00": (1, 2, 2, 3), "08:02": (1, 2, 2, 3), "08:04": (3, 5, 2, 8),
            "08:05": (4, 4, 1, 4), "08:14": (3, 5, 2, 8), "08:15": (4, 4, 1, 4)}
    rows = readers[0].wait_rows(len(want))
    got = {minute_of(r["window_start"]): (r["firstval_v"], r["lastval_v"], r["count_v"],
                                          r["sum_v"]) for r in rows}
    assert got == want, rows
    # the join's windowed side: the same first and last, by the masked minute (the join runs
    # on its own query, with its own watermark: the order part is what is compared)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not {"08:00", "08:02"} <= {
            minute_of(r[f"{CLOCK}.window_start"]) for r in readers[1].rows}:
        time.sleep(0.2)
    pairs = {minute_of(r[f"{CLOCK}.window_start"]): (r[f"{CLOCK}.firstval_v"],
                                                     r[f"{CLOCK}.lastval_v"])
             for r in readers[1].rows}
    assert pairs.get("08:00") == pairs.get("08:02") == (1, 2), readers[1].rows
    for doc, who in ((windows, "mt-1"), (joined, "mt-2")):
        assert requests.delete(doc["handle"], headers=auth(who), timeout=30).status_code == 200


@pytest.mark.timeout(240)
def test_rows_and_windows_of_a_stream_ordered_by_time_follow_the_masked_minute(streams):
    """A files stream has no stream position: its tuples are ordered by the time attribute,
    then file and place. For the consumer that time is the minute: within a minute, place
    decides."""
    gateway, folder = streams
    base = gateway.url
    queries = {
        "rows": {"map": ["ts", "v"]},
        "values": {"map": ["v"]},  # ts only orders these rows
        "tuples": {"window": {"type": "tuple", "size": 3, "step": 3,
                              "aggregates": ["v:firstval", "v:lastval"]}},
        "times": {"window": {"type": "time", "size": 60, "step": 60,
                             "aggregates": ["v:firstval", "v:lastval", "v:count"]}},
    }
    who = dict(zip(queries, SUBJECTS, strict=True))
    docs = {name: ask(base, who[name], FILES, q) for name, q in queries.items()}
    readers = {name: Reader(doc["handle"], who[name]).start() for name, doc in docs.items()}
    # two files alike once masked (minutes 0, 0, 1 and 2, 2, 3; v 1, 2, 3 in place order),
    # whose raw seconds order them differently
    files = [[{"ts": at(0, 50), "v": 1}, {"ts": at(0, 10), "v": 2}, {"ts": at(1, 30), "v": 3}],
             [{"ts": at(2, 10), "v": 1}, {"ts": at(2, 50), "v": 2}, {"ts": at(3, 30), "v": 3}],
             [{"ts": at(10), "v": 0}]]
    time.sleep(1.0)  # the first handle started the stream's query at the folder's end
    read = 0
    for i, rows in enumerate(files):
        write_jsonl(Path(folder), f"{i:03d}.json", rows)
        read += len(rows)
        read_in(gateway.runtime, FILES, read)
    minute = [at(m) for m in (0, 0, 1, 2, 2, 3, 10)]
    assert readers["rows"].wait_rows(7) == [
        {"ts": t, "v": v} for t, v in zip(minute, (1, 2, 3, 1, 2, 3, 0), strict=True)]
    assert readers["values"].wait_rows(7) == [{"v": v} for v in (1, 2, 3, 1, 2, 3, 0)]
    assert [(r["firstval_v"], r["lastval_v"]) for r in readers["tuples"].wait_rows(2)] == \
        [(1, 3), (1, 3)]
    times = readers["times"].wait_rows(4)
    assert {minute_of(r["window_start"]): (r["firstval_v"], r["lastval_v"], r["count_v"])
            for r in times} == {"08:00": (1, 2, 2), "08:01": (3, 3, 1), "08:02": (1, 2, 2),
                                "08:03": (3, 3, 1)}
    for name, doc in docs.items():
        assert requests.delete(doc["handle"], headers=auth(who[name]),
                               timeout=30).status_code == 200
