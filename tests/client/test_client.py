"""The xsg client against a real gateway (`xsg serve`, a child process): the rows a raw HTTP
reader gets, typed exactly; resumption across a dropped connection; the end of a handle; bad
input. The gateway restart is tests/client/test_restart.py."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

import pytest

from tests.client.conftest import CLIENT, RawReader, wait_for
from tests.client.relay import Relay
from tests.pep.conftest import TOKENS
from xsg_client import (
    AsyncClient,
    BadHandle,
    Client,
    Disconnected,
    End,
    Gap,
    HTTPError,
    Reconnected,
    Row,
    XsgError,
)
from xsg_client.schema import parse_timestamp, wire_value

SENSOR = [("ts", "timestamp"), ("v", "double"), ("n", "long"), ("tag", "string")]


def sensor(ns) -> list[dict]:
    return [{"ts": "2024-01-01T00:00:00Z", "v": 1.0, "n": n, "tag": "x"} for n in ns]


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def collect(stream, rows: int, into: list) -> threading.Thread:
    """Iterate `stream` on a thread into `into` until `rows` rows (or its end) came."""
    def run() -> None:
        n = 0
        for event in stream:
            into.append(event)
            n += isinstance(event, Row)
            if n >= rows:
                return
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def read_rows(stream, n: int, timeout: float = 90.0) -> list:
    """Rows of a stream opened with an idle timeout, read again until `n` came."""
    rows: list = []
    deadline = time.monotonic() + timeout
    while len(rows) < n and time.monotonic() < deadline:
        rows += list(stream.rows())
    return rows


def test_a_windowed_handle_gives_the_rows_a_raw_reader_gets_typed_exactly(served):
    served.stream("c_win", SENSOR, {"window": {
        "type": "tuple", "size": 4, "step": 2,
        "aggregates": ["v:avg", "n:max", "n:count", "n:sum", "ts:lastval"]}},
        time_attribute="ts")
    records = [{"ts": f"2024-05-01T00:00:{i:02d}.{i:06d}Z", "v": i * 1.5, "n": 2 ** 60 + i,
                "tag": "x"} for i in range(20)]
    with Client(served.url, TOKENS["lta"]) as xsg:
        grant = xsg.request("c_win", action="subscribe")
        assert grant.new and grant.stream == "c_win"
        stream = xsg.open(grant)
        assert {c["name"]: c["type"] for c in stream.schema.to_json()} == {
            "window_start": "long", "window_end": "long", "avg_v": "double", "max_n": "long",
            "count_n": "long", "sum_n": "long", "lastval_ts": "timestamp"}
        raw = RawReader(grant.handle).start()
        events: list = []
        reading = collect(stream, 9, events)
        served.append("c_win", records)
        reading.join(90)
        wait_for(lambda: len(raw.rows()) == 9, what="the raw reader's 9 windows")
    rows = [e for e in events if isinstance(e, Row)]
    assert list(raw.rows()[0]["row"]) == list(stream.schema.names)  # the gateway's order
    # the same events, and the same values once written back as the gateway wrote them
    assert [(r.id, {k: wire_value(v) for k, v in r.values.items()}) for r in rows] \
        == [(x["id"], x["row"]) for x in raw.rows()]
    for k, row in enumerate(r.values for r in rows):  # window k: tuples 2k .. 2k+3
        first, last = 2 * k, 2 * k + 3
        assert row["window_start"] == first and row["window_end"] == last
        assert row["max_n"] == 2 ** 60 + last and type(row["max_n"]) is int
        assert row["sum_n"] == sum(2 ** 60 + i for i in range(first, last + 1))
        assert row["count_n"] == 4
        assert row["avg_v"] == pytest.approx(sum(i * 1.5 for i in range(first, last + 1)) / 4)
        assert row["lastval_ts"] == utc(records[last]["ts"][:-1])


EXTREMES = [
    {"ts": "1969-12-31T23:59:59.999999Z", "v": 0.1, "n": 2 ** 63 - 1},
    {"ts": "1900-01-01T00:00:00.000001Z", "v": -1e-300, "n": -(2 ** 63)},
    {"ts": "2262-04-11T23:47:16.854776Z", "v": 2.0 ** 53 + 2, "n": 2 ** 53 + 1},
    {"ts": "9999-12-31T23:59:59.999999Z", "v": 1e308, "n": -(2 ** 53) - 1},
    {"ts": "2024-02-29T12:00:00.000000Z", "v": None, "n": None},
]


def test_64_bit_values_and_timestamps_round_trip_exactly(served):
    served.stream("c_exact", [("ts", "timestamp"), ("v", "double"), ("n", "long")], {})
    expected = [{"ts": parse_timestamp(r["ts"]), "v": r["v"], "n": r["n"]} for r in EXTREMES]
    with Client(served.url, TOKENS["lta"]) as xsg:
        grant = xsg.request("c_exact")
        served.append("c_exact", EXTREMES)
        rows = read_rows(xsg.open(grant, idle_timeout=1), len(EXTREMES))
        assert rows == expected
        assert [type(r["n"]) for r in rows[:4]] == [int] * 4
        assert [r["ts"].microsecond for r in rows] == [999999, 1, 854776, 999999, 0]

        # Arrow and pandas: int64 and timestamp[us, UTC], never through a float or ns
        stream = xsg.open(grant, idle_timeout=1)
        batches = list(stream.batches(max_rows=100, max_wait=0.5, id_column="event_id"))
        import pyarrow as pa
        table = pa.Table.from_batches(batches)
        assert table.schema.field("n").type == pa.int64()
        assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")
        assert table.column("n").to_pylist() == [r["n"] for r in EXTREMES]
        assert table.column("ts").to_pylist() == [r["ts"] for r in expected]
        assert table.column("event_id").to_pylist() == [1, 2, 3, 4, 5]
        frame = next(xsg.open(grant, idle_timeout=1).frames(max_rows=100, max_wait=0.5))
        assert str(frame["n"].dtype) == "Int64" and str(frame["ts"].dtype) == "datetime64[us, UTC]"
        assert frame["n"].tolist()[:4] == [r["n"] for r in EXTREMES[:4]]

    async def read_async() -> list:
        async with AsyncClient(served.url, TOKENS["lta"]) as axsg:
            astream = await axsg.open(grant.handle, idle_timeout=1)
            return [row async for row in astream.rows()]

    assert asyncio.run(read_async()) == expected


def test_a_dropped_connection_resumes_after_the_last_event_read(served):
    served.stream("c_drop", SENSOR, {"attributes": ["ts", "n"]})
    relay = Relay(served.port)
    try:
        with Client(served.url, TOKENS["lta"]) as direct, \
                Client(relay.url, TOKENS["lta"]) as xsg:
            grant = direct.request("c_drop")
            stream = xsg.open(grant.id)  # by id: through the relay, not the handle's own URL
            events: list = []
            reading = collect(stream, 10, events)
            served.append("c_drop", sensor(range(5)))
            wait_for(lambda: sum(isinstance(e, Row) for e in events) == 5, what="5 rows")
            assert relay.cut() >= 2
            wait_for(lambda: any(isinstance(e, Reconnected) for e in events), what="reconnected")
            served.append("c_drop", sensor(range(5, 10)))
            reading.join(90)
            assert not reading.is_alive()
    finally:
        relay.close()
    rows = [e for e in events if isinstance(e, Row)]
    assert [r.values["n"] for r in rows] == list(range(10))  # none lost, none twice
    assert [r.id for r in rows] == list(range(1, 11))
    assert not any(isinstance(e, Gap) for e in events)
    lost = [e for e in events if isinstance(e, Disconnected)]
    back = [e for e in events if isinstance(e, Reconnected)]
    assert lost and lost[0].last_event_id == 5 and back[0].last_event_id == 5
    assert events.index(lost[0]) < events.index(back[0]) < events.index(rows[5])


def test_revocation_ends_iteration_with_the_reason(served):
    served.stream("c_rev", SENSOR, {"id": "urn:t:c_rev", "attributes": ["ts", "n"]})
    with Client(served.url, TOKENS["lta"]) as xsg:
        grant = xsg.request("c_rev")
        stream = xsg.open(grant)
        events: list = []
        reading = collect(stream, 10 ** 6, events)  # until the end

        async def read_async() -> list:
            async with AsyncClient(served.url, TOKENS["lta"]) as axsg:
                astream = await axsg.open(grant)
                return [event async for event in astream]

        async_events: list = []
        async_reading = threading.Thread(
            target=lambda: async_events.extend(asyncio.run(read_async())), daemon=True)
        async_reading.start()
        served.append("c_rev", sensor(range(3)))
        wait_for(lambda: sum(isinstance(e, Row) for e in events) == 3, what="3 rows")
        served.call("DELETE", "/policies/urn:t:c_rev", ok=(204,))
        reading.join(60)
        async_reading.join(60)
        assert not reading.is_alive() and not async_reading.is_alive()
        end = events[-1]
        assert isinstance(end, End) and end.kind == "revoked" and end.reason
        assert stream.end == end
        assert isinstance(async_events[-1], End) and async_events[-1].kind == "revoked"
        assert [e.values["n"] for e in events if isinstance(e, Row)] == [0, 1, 2]
        # opened again: the gateway answers 410, the reader ends at once with the same reason
        again = xsg.open(grant)
        assert list(again) == [End(None, "revoked", end.reason)]
        with pytest.raises(HTTPError) as gone:
            xsg.describe(grant)
        assert gone.value.status == 410 and gone.value.body["reason"] == end.reason


def test_bad_input_gives_clear_errors(served):
    served.stream("c_bad", SENSOR, {"attributes": ["ts", "n"]})
    served.call("POST", "/streams", json={"name": "c_nobody", "source": {"kind": "ingest"},
                                          "schema": [{"name": "n", "type": "long"}]})
    with Client(served.url, TOKENS["lta"]) as xsg:
        for bad, said in [("", "not a handle"), ("c_bad", "not a handle"),
                          (f"{served.url}/streams/c_bad", "must end in /handles/ID"),
                          ("ftp://127.0.0.1/handles/abcdefghijklmnopqrstuvwxyz", "not a handle"),
                          (f"{served.url}/handles/{'a' * 43}?after=3", "no query parameter"),
                          (f"{served.url}/handles/{'a' * 43}#x", "no #fragment")]:
            with pytest.raises(BadHandle, match=said) as error:
                xsg.open(bad)
            assert "a" * 20 not in str(error.value)  # an id is never shown whole
        # the bearer token goes to this client's gateway only, whatever a URL says
        with pytest.raises(BadHandle, match="is on http://elsewhere.invalid:8080, not on this"):
            xsg.open(f"http://elsewhere.invalid:8080/handles/{'a' * 43}")
        with pytest.raises(HTTPError) as missing:
            xsg.open(f"{served.url}/handles/{'Q' * 43}")
        assert missing.value.status == 404 and "no such handle" in str(missing.value)
        assert "Q" * 7 not in str(missing.value)
        with pytest.raises(HTTPError) as denied:
            xsg.request("c_nobody")
        assert denied.value.status == 403 and "NotApplicable" in str(denied.value)
        with pytest.raises(HTTPError) as malformed:
            xsg.request("c_bad", query={"window": {"type": "tuple", "size": "ten"}})
        assert malformed.value.status == 400 and "$.window" in str(malformed.value)
        first = xsg.request("c_bad")
        with pytest.raises(HTTPError) as conflict:
            xsg.request("c_bad", query={"filter": "n > 1"})
        assert conflict.value.status == 409 and conflict.value.body["handle"] == first.handle
        with pytest.raises(XsgError, match="cannot read /nonexistent.xml"):
            xsg.request_file("/nonexistent.xml")
        # a read token: its URL reads the handle with no bearer token at all
        token = xsg.read_token(first)
        served.append("c_bad", sensor([7]))
        with Client(served.url, token=None) as anonymous:
            with pytest.raises(XsgError, match="needs a bearer token"):
                anonymous.handles()
            with pytest.raises(XsgError, match="needs a bearer token"):
                anonymous.open(first.handle)
            stream = anonymous.open(token.url, idle_timeout=1)
            rows = read_rows(stream, 1)
            # no bearer token, no stream schema (GET /streams): `ts` cannot be told from a
            # string, and stays the gateway's text unless the caller types it
            assert stream.schema.type_of("ts") == "json"
            assert rows == [{"ts": "2024-01-01T00:00:00.000000Z", "n": 7}]
            typed = anonymous.open(token.url, types={"ts": "timestamp"}, idle_timeout=1)
            assert read_rows(typed, 1) == [{"ts": utc("2024-01-01T00:00:00"), "n": 7}]
        assert [h.id for h in xsg.handles() if h.stream == "c_bad"] == [first.id]
        assert xsg.release(first)["state"] == "released"
        assert [(e.id, e.kind) for e in xsg.open(first)] == [(None, "released")]
    with pytest.raises(XsgError, match="not a gateway URL"):
        Client("ftp://127.0.0.1")
    with pytest.raises(XsgError, match="cannot reach the gateway"):
        with Client("http://127.0.0.1:9", TOKENS["lta"]) as nowhere:
            nowhere.handles()


def test_the_client_installs_and_imports_without_spark_or_the_gateway():
    """Its one dependency is httpx; importing it (the asyncio client too) loads no Spark,
    pyarrow, pandas, Flask or gateway module."""
    import tomllib

    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "xsg-client" and project["dependencies"] == ["httpx>=0.27"]
    code = ("import json, sys, xsg_client, xsg_client.aio, xsg_client.tail\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=CLIENT)
    assert out.returncode == 0, out.stderr
    loaded = {name.split(".")[0] for name in json.loads(out.stdout)}
    assert not loaded & {"pyspark", "py4j", "pyarrow", "pandas", "numpy", "flask", "pep", "pdp",
                         "requests"}
