"""Bounded handle buffers: limits, gaps, resume, blocking reads, closing, and the wire formats."""
from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime

import pytest

from pep.handles.buffer import GENERATION_SPAN, HandleBuffer, row_json
from pep.http.handles import NDJSON_ROW, HandleStream, ndjson_event, sse_event, stream_events


def rows(a: int, b: int) -> list[dict]:
    return [{"n": i} for i in range(a, b)]


def data(events) -> list:
    return [json.loads(e.data)["n"] for e in events if e.kind == "row"]


def test_ids_increase_and_reads_resume():
    buf = HandleBuffer(max_rows=100)
    assert buf.put(rows(0, 5))
    ev = buf.read(None, timeout=0)
    assert [e.id for e in ev] == [1, 2, 3, 4, 5] and data(ev) == [0, 1, 2, 3, 4]
    assert buf.read(5, timeout=0) == []
    buf.put(rows(5, 7))
    assert data(buf.read(3, timeout=0)) == [3, 4, 5, 6]
    assert [e.id for e in buf.read(5, timeout=0)] == [6, 7]


def test_row_bound_drops_oldest_and_reports_gap():
    buf = HandleBuffer(max_rows=10)
    buf.put(rows(0, 25))
    assert len(buf) == 10 and buf.dropped == 15
    ev = buf.read(0, timeout=0)
    assert ev[0].kind == "gap"
    gap = json.loads(ev[0].data)
    assert gap["lost"] == 15 and gap["resume_from"] == 15 and ev[0].id == 15
    assert data(ev[1:]) == list(range(15, 25))
    # a reader that had seen up to id 12 lost only 3
    ev = buf.read(12, timeout=0)
    assert json.loads(ev[0].data)["lost"] == 3 and data(ev[1:]) == list(range(15, 25))
    # a reader that is inside the kept range gets no gap
    assert [e.kind for e in buf.read(20, timeout=0)] == ["row"] * 5


def test_byte_bound():
    one = len(row_json({"n": 0, "pad": "x" * 100}))
    buf = HandleBuffer(max_rows=1000, max_bytes=one * 3)
    buf.put([{"n": i, "pad": "x" * 100} for i in range(10)])
    assert len(buf) == 3
    assert data(buf.read(0, timeout=0)[1:]) == [7, 8, 9]
    # a single row larger than the whole budget is dropped, and the reader is told
    small = HandleBuffer(max_rows=10, max_bytes=10)
    small.put([{"n": 1, "pad": "y" * 50}])
    assert len(small) == 0
    ev = small.read(0, timeout=0)
    assert [e.kind for e in ev] == ["gap"] and json.loads(ev[0].data)["lost"] == 1


def test_memory_stays_bounded_with_no_reader():
    buf = HandleBuffer(max_rows=100, max_bytes=10_000)
    for i in range(200):
        buf.put(rows(i * 50, i * 50 + 50))
    assert len(buf) <= 100 and buf.last_id == 10_000
    assert buf._bytes <= 10_000


def test_blocking_read_wakes_on_put_and_times_out():
    buf = HandleBuffer()
    t0 = time.monotonic()
    assert buf.read(0, timeout=0.2) == []
    assert 0.15 <= time.monotonic() - t0 < 2
    got = []
    reader = threading.Thread(target=lambda: got.extend(buf.read(0, timeout=5)))
    reader.start()
    time.sleep(0.05)
    buf.put(rows(0, 1))
    reader.join(2)
    assert not reader.is_alive() and data(got) == [0]


def test_close_wakes_readers_discards_rows_and_refuses_writes():
    buf = HandleBuffer()
    got = []
    reader = threading.Thread(target=lambda: got.extend(buf.read(0, timeout=5)))
    reader.start()
    time.sleep(0.05)
    assert buf.close("revoked", "policy deleted")
    reader.join(2)
    assert [e.kind for e in got] == ["revoked"] and got[0].final
    buf2 = HandleBuffer()
    buf2.put(rows(0, 3))
    buf2.close("revoked", "x")
    assert buf2.put(rows(3, 4)) is False
    ev = buf2.read(0, timeout=0)
    assert [e.kind for e in ev] == ["revoked"] and ev[0].id == 4
    assert json.loads(ev[0].data) == {"event": "revoked", "reason": "x"}
    assert buf2.read(4, timeout=0) == []
    assert buf2.close("released") is False


def test_a_close_that_keeps_rows_lets_them_be_read_before_the_final_event():
    """A handle that ends on its own terms (its privacy budget spent) keeps what it was given."""
    from pep.http.handles import HandleStream

    buf = HandleBuffer()
    buf.put(rows(0, 3))
    assert buf.read(0, timeout=0, limit=1)[0].id == 1
    assert buf.close("ended", "privacy budget spent", keep=True)
    assert buf.closed and not buf.withholds and buf.put(rows(3, 4)) is False
    ev = buf.read(1, timeout=0, limit=1)
    assert [e.kind for e in ev] == ["row"] and data(ev) == [1]
    ev = buf.read(2, timeout=0)
    assert [e.kind for e in ev] == ["row", "ended"] and data(ev) == [2] and ev[-1].id == 4
    assert buf.read(4, timeout=0) == []
    chunks = list(stream_events(buf, None, ndjson_event, "", heartbeat=0.05))
    lines = [json.loads(x) for c in chunks for x in c.decode().splitlines()]
    assert [x.get("row", {}).get("n", x.get("event")) for x in lines] == [0, 1, 2, "ended"]
    stream = HandleStream(buf, None, ndjson_event, "", 15.0)
    data_, done = stream.pull(1 << 20)
    assert done and not stream.retract() and len(data_.decode().splitlines()) == 4
    revoked = HandleBuffer()
    revoked.put(rows(0, 3))
    revoked.close("revoked", "x")
    assert revoked.withholds


def test_a_stream_says_when_a_pull_took_everything():
    """`has_more`: the server pulls again only while the buffer holds what the stream has not
    pulled (a pull that took everything is not followed by an empty one), and a row or the
    final event that comes after a pull is seen."""
    buf = HandleBuffer()
    stream = HandleStream(buf, None, ndjson_event, "", 15.0, row_template=NDJSON_ROW)
    assert not stream.has_more()
    buf.put(rows(0, 3))
    assert stream.has_more()
    data_, done = stream.pull(1 << 20)
    assert len(data_.decode().splitlines()) == 3 and not done and not stream.has_more()
    buf.put(rows(3, 5))
    assert stream.has_more()
    stream.pull(1 << 20)
    assert not stream.has_more()
    buf.close("revoked", "x")
    assert stream.has_more()
    data_, done = stream.pull(1 << 20)
    assert done and b'"revoked"' in data_ and not stream.has_more()


def test_generation_ids_continue_and_old_ids_get_unknown_gap():
    buf = HandleBuffer(generation=2)
    buf.put(rows(0, 2))
    ev = buf.read(0, timeout=0)
    assert ev[0].kind == "gap" and json.loads(ev[0].data)["lost"] is None
    assert [e.id for e in ev[1:]] == [2 * GENERATION_SPAN + 1, 2 * GENERATION_SPAN + 2]
    # a reader without Last-Event-ID after a restart simply starts at what is kept
    assert [e.kind for e in buf.read(None, timeout=0)] == ["row", "row"]


def test_bogus_future_id_reads_from_now_on():
    buf = HandleBuffer()
    buf.put(rows(0, 2))
    assert buf.read(10**9, timeout=0) == []
    buf.put(rows(2, 3))
    assert data(buf.read(2, timeout=0)) == [2]


def test_concurrent_writers_and_reader_see_every_row_once():
    buf = HandleBuffer(max_rows=100_000)
    def w(k):
        for i in range(100):
            buf.put([{"n": k * 1000 + i}])
    ws = [threading.Thread(target=w, args=(k,)) for k in range(4)]
    for t in ws:
        t.start()
    seen, cursor = [], 0
    deadline = time.monotonic() + 5
    while len(seen) < 400 and time.monotonic() < deadline:
        ev = buf.read(cursor, timeout=0.5)
        if ev:
            seen.extend(data(ev))
            cursor = ev[-1].id
    assert sorted(seen) == sorted(k * 1000 + i for k in range(4) for i in range(100))


def test_row_json_handles_spark_values():
    text = row_json({"t": datetime(2024, 5, 1, 10, 0, tzinfo=UTC),
                     "naive": datetime(2024, 5, 1, 10, 0), "avg": float("nan"), "x": 1.5})
    assert json.loads(text) == {"t": "2024-05-01T10:00:00Z", "naive": "2024-05-01T10:00:00Z",
                                "avg": None, "x": 1.5}


# -- wire formats ----------------------------------------------------------------------------------

def test_sse_and_ndjson_formatting():
    buf = HandleBuffer(max_rows=2)
    buf.put(rows(0, 3))
    gap, r1, r2 = buf.read(0, timeout=0)
    assert sse_event(r1) == 'id: 2\ndata: {"n":1}\n\n'
    assert sse_event(gap).startswith("id: 1\nevent: gap\ndata: {")
    assert json.loads(ndjson_event(r1)) == {"id": 2, "row": {"n": 1}}
    g = json.loads(ndjson_event(gap))
    assert g["id"] == 1 and g["event"] == "gap" and g["lost"] == 1
    buf.close("revoked", "gone")
    (final,) = buf.read(3, timeout=0)
    assert sse_event(final) == ('id: 4\nevent: revoked\n'
                                'data: {"event": "revoked", "reason": "gone"}\n\n')
    assert json.loads(ndjson_event(final)) == {"id": 4, "event": "revoked", "reason": "gone"}


def test_stream_events_heartbeats_then_ends_after_final():
    buf = HandleBuffer()
    gen = stream_events(buf, None, sse_event, ": hb\n\n", heartbeat=0.05, opening=": hi\n\n")
    assert next(gen) == b": hi\n\n"
    assert next(gen) == b": hb\n\n"  # nothing yet: a heartbeat
    buf.put(rows(0, 2))
    assert next(gen) == b'id: 1\ndata: {"n":0}\n\nid: 2\ndata: {"n":1}\n\n'
    buf.put(rows(2, 3))
    buf.close("revoked", "r")
    chunk = next(gen).decode()
    assert "event: revoked" in chunk and '"n":2' not in chunk  # unread rows are withheld
    with pytest.raises(StopIteration):
        next(gen)


def test_stream_events_resume_from_last_event_id():
    buf = HandleBuffer()
    buf.put(rows(0, 5))
    gen = stream_events(buf, 3, ndjson_event, "{}\n", heartbeat=0.05)
    lines = [json.loads(x) for x in next(gen).decode().splitlines()]
    assert [x["id"] for x in lines] == [4, 5] and lines[0]["row"] == {"n": 3}


# -- one delivery larger than the buffer (issue 15) ------------------------------------------------

def _ndjson_reader(buf: HandleBuffer, got: list) -> threading.Thread:
    def run():
        for chunk in stream_events(buf, None, ndjson_event, "", heartbeat=0.05):
            for line in chunk.decode().splitlines():
                got.append(json.loads(line))
                if got[-1].get("event") == "revoked":
                    return
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_reading_reader_is_not_overrun_by_one_large_delivery():
    # a micro-batch of a tuple window with step 1 delivers one row per tuple: far more than
    # the buffer keeps. A reader that keeps reading must get all of it, with no gap.
    buf = HandleBuffer(max_rows=100)
    got: list = []
    _ndjson_reader(buf, got)
    time.sleep(0.1)
    assert buf.put(rows(0, 30)) and buf.put(rows(30, 3_000))
    deadline = time.monotonic() + 10
    while len(got) < 3_000 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [o.get("event") for o in got if "row" not in o] == []
    assert [o["row"]["n"] for o in got] == list(range(3_000))


def test_a_large_delivery_stops_waiting_for_a_reader_that_stopped_reading():
    buf = HandleBuffer(max_rows=10)
    buf.reader_stall = 0.2
    buf.put(rows(0, 5))
    assert data(buf.read(0, timeout=0)) == [0, 1, 2, 3, 4]  # then the reader goes quiet
    t0 = time.monotonic()
    assert buf.put(rows(5, 500))
    assert time.monotonic() - t0 < 2
    ev = buf.read(5, timeout=0)
    assert ev[0].kind == "gap" and json.loads(ev[0].data)["lost"] == 485
    # no reader at all: no waiting, the oldest rows go (a reader away loses them)
    t0 = time.monotonic()
    HandleBuffer(max_rows=10).put(rows(0, 500))
    assert time.monotonic() - t0 < 0.5


def test_closing_releases_a_delivery_waiting_for_its_reader():
    buf = HandleBuffer(max_rows=10)
    buf.reader_stall = 30.0  # the reader looks alive: the put waits until the close
    buf.put(rows(0, 10))
    buf.read(0, timeout=0)
    result = []
    writer = threading.Thread(target=lambda: result.append(buf.put(rows(10, 100))))
    writer.start()
    time.sleep(0.2)
    assert writer.is_alive()  # waiting for the reader to take rows 11..20
    t0 = time.monotonic()
    assert buf.close("revoked", "policy deleted")
    writer.join(2)
    assert not writer.is_alive() and result == [False] and time.monotonic() - t0 < 1
    assert [e.kind for e in buf.read(10, timeout=0)] == ["revoked"]  # nothing after the close


# -- notices, waiters, byte-bounded reads ----------------------------------------------------------

def test_a_notice_comes_in_order_and_is_not_a_row():
    buf = HandleBuffer(max_rows=100)
    buf.put(rows(0, 2))
    assert buf.notice("stalled", {"seconds": 30, "event": "ignored"})
    buf.put(rows(2, 3))
    ev = buf.read(0, timeout=0)
    assert [(e.id, e.kind) for e in ev] == [(1, "row"), (2, "row"), (3, "stalled"), (4, "row")]
    assert json.loads(ev[2].data) == {"event": "stalled", "seconds": 30}
    assert not ev[2].final and len(buf) == 3
    assert sse_event(ev[2]) == 'id: 3\nevent: stalled\ndata: {"event":"stalled","seconds":30}\n\n'
    assert json.loads(ndjson_event(ev[2])) == {"id": 3, "event": "stalled", "seconds": 30}
    # resuming past a notice works like past a row
    assert [e.id for e in buf.read(3, timeout=0)] == [4]


@pytest.mark.parametrize("kind", ["row", "gap", "heartbeat", "message", "revoked", "ended",
                                  "Stalled", "", "a b", "x" * 40, None])
def test_notice_kinds_are_checked(kind):
    with pytest.raises(ValueError):
        HandleBuffer().notice(kind, {})


def test_a_notice_after_close_is_refused_and_rows_dropped_around_notices_count_right():
    buf = HandleBuffer(max_rows=4)
    buf.put(rows(0, 2))       # ids 1, 2
    buf.notice("stalled", {})  # id 3
    buf.put(rows(2, 7))       # ids 4..8: rows 1, 2 and the notice... go as the rows push out
    ev = buf.read(0, timeout=0)
    assert ev[0].kind == "gap"
    gap = json.loads(ev[0].data)
    assert gap["resume_from"] == ev[0].id
    kept_rows = [e for e in ev[1:] if e.kind == "row"]
    assert len(kept_rows) == 4
    # lost counts rows only: 7 rows were put, 4 are kept
    assert gap["lost"] == 3
    buf.close("revoked", "r")
    assert buf.notice("stalled", {}) is False


def test_notices_alone_stay_bounded():
    buf = HandleBuffer(max_rows=5)
    for i in range(500):
        buf.notice("stalled", {"n": i})
    assert len(buf._entries) <= 5 + 100 and len(buf) == 0


def test_waiters_are_called_on_put_notice_and_close():
    buf = HandleBuffer()
    calls = []

    def waiter():
        calls.append(1)

    buf.add_waiter(waiter)
    assert calls == [1]  # called once at once: there may be events already
    buf.put(rows(0, 3))
    buf.notice("stalled", {})
    buf.put([])
    assert len(calls) == 3
    buf.remove_waiter(waiter)
    buf.put(rows(3, 4))
    assert len(calls) == 3
    buf.add_waiter(waiter)
    buf.close("released")
    assert len(calls) == 5


def test_read_stops_near_max_bytes():
    buf = HandleBuffer()
    buf.put([{"n": i, "pad": "x" * 90} for i in range(100)])
    one = len(row_json({"n": 10, "pad": "x" * 90}))
    ev = buf.read(0, timeout=0, max_bytes=one * 10)
    assert 9 <= len(ev) <= 11
    assert len(buf.read(0, timeout=0, max_bytes=1)) == 1  # at least one event


def test_handle_stream_pulls_formatted_chunks_for_the_io_thread():
    from pep.http.handles import HandleStream

    buf = HandleBuffer()
    released = []
    stream = HandleStream(buf, None, ndjson_event, '{"event":"heartbeat"}\n', 15.0,
                          on_close=lambda: released.append(1))
    wakes = []
    stream.start(lambda: wakes.append(1))
    assert wakes == [1]
    assert stream.pull(1 << 20) == (b"", False)
    buf.put(rows(0, 3))
    buf.notice("stalled", {"seconds": 5})
    assert len(wakes) == 3
    data, done = stream.pull(1 << 20)
    lines = [json.loads(x) for x in data.decode().splitlines()]
    assert not done and [x["id"] for x in lines] == [1, 2, 3, 4]
    assert lines[0] == {"id": 1, "row": {"n": 0}} and lines[3]["event"] == "stalled"
    assert stream.pull(1 << 20) == (b"", False)
    buf.put(rows(3, 5))
    assert not stream.retract()
    buf.close("revoked", "gone")
    assert stream.retract()  # pulled-but-unwritten bytes must be withheld now
    data, done = stream.pull(1 << 20)
    assert done and [json.loads(x)["event"] for x in data.decode().splitlines()] == ["revoked"]
    assert stream.heartbeat() == b'{"event":"heartbeat"}\n'
    stream.close()
    stream.close()
    assert released == [1]
    assert buf._waiters == ()


@pytest.mark.parametrize("fmt", ["ndjson", "sse"])
def test_the_one_pass_row_path_writes_what_the_event_path_writes(fmt):
    """The I/O thread's one-pass path for rows (`read_rows_text`) gives the same bytes as
    formatting `Event`s, whatever comes between the rows: notices, gaps after rows were
    dropped, pulls cut by `max_bytes`, a revocation, a close that keeps its rows."""
    import random

    from pep.core.rows import RowBatch
    from pep.http.handles import NDJSON_ROW, SSE_ROW, HandleStream, sse_event

    event_fmt, template = (ndjson_event, NDJSON_ROW) if fmt == "ndjson" else (sse_event, SSE_ROW)
    seen = b""
    for seed in range(12):
        rng = random.Random(seed)
        outputs = []
        for fast in (False, True):
            rng.seed(seed)
            buf = HandleBuffer(max_rows=40)
            buf.max_put_wait = 0.0  # a full buffer drops at once: the same rows in both runs
            stream = HandleStream(buf, None, event_fmt, "", 15.0,
                                  row_template=template if fast else None)
            stream.start(lambda: None)
            out, n, done = [], 0, False
            for _ in range(60):
                op = rng.random()
                if op < 0.55:
                    k = rng.randint(1, 30)
                    buf.put(
                        RowBatch.of_texts([f'{{"n":{n + i},"t":"%s\\u00e9"}}' for i in range(k)])
                    )
                    n += k
                elif op < 0.65:
                    buf.notice("stalled", {"seconds": rng.randint(1, 9)})
                else:
                    budget = rng.choice([1, 50, 300, 1 << 20])
                    for _ in range(rng.randint(1, 3)):
                        data, done = stream.pull(budget)
                        out.append(data)
                        if done:
                            break
                if done:
                    break
            if not done:
                if seed % 2:
                    buf.close("ended", "budget spent", keep=True)
                else:
                    buf.close("revoked", "gone")
                while not done:
                    data, done = stream.pull(rng.choice([50, 1 << 20]))
                    out.append(data)
            outputs.append(b"".join(out))
        assert outputs[0] == outputs[1], seed
        seen += outputs[0]
    # the scripts went through notices, gaps, escapes, both ends and cut pulls
    for part in (b"stalled", b"gap", b"\\u00e9", b"revoked", b"ended", b'%s'):
        assert part in seen


def test_rows_read_in_one_pass_are_withheld_when_revoked_before_they_are_written():
    """A revocation between the one-pass read and the write: the rows it read never go out,
    the reader gets the final event instead."""
    from pep.core.rows import RowBatch
    from pep.http.handles import NDJSON_ROW, HandleStream

    class RevokedWhileReading(HandleBuffer):
        def read_rows_text(self, *args, **kwargs):
            got = super().read_rows_text(*args, **kwargs)
            self.close("revoked", "policy deleted")
            return got

    buf = RevokedWhileReading()
    buf.put(RowBatch.of_texts(['{"n":1}', '{"n":2}']))
    stream = HandleStream(buf, None, ndjson_event, "", 15.0, row_template=NDJSON_ROW)
    data, done = stream.pull(1 << 20)
    assert done and b'"row"' not in data
    assert [json.loads(x)["event"] for x in data.decode().splitlines()] == ["revoked"]


def test_an_idle_woken_reader_is_not_overrun_by_a_burst_after_a_quiet_spell():
    # A reader driven by a waiter (the server's I/O thread) reads only when woken. After a quiet
    # spell longer than reader_stall it has not read for a while, but its last read had
    # everything: it is idle, not slow, and a burst larger than the buffer must wait for it.
    from pep.http.handles import HandleStream

    buf = HandleBuffer(max_rows=50)
    buf.reader_stall = 0.3
    got: list = []
    woken = threading.Event()
    stream = HandleStream(buf, None, ndjson_event, "", 15.0)

    def io_thread():
        while True:
            woken.wait(5)
            woken.clear()
            data, done = stream.pull(1 << 20)
            got.extend(json.loads(x) for x in data.decode().splitlines())
            if done:
                return

    t = threading.Thread(target=io_thread, daemon=True)
    t.start()
    stream.start(woken.set)
    buf.put(rows(0, 10))
    time.sleep(0.8)  # quiet: longer than reader_stall since the last read
    assert buf.put(rows(10, 1_000))
    deadline = time.monotonic() + 10
    while sum("row" in o for o in got) < 1_000 and time.monotonic() < deadline:
        time.sleep(0.01)
    buf.close("released")  # (a close discards what is unread: only after the reader has it all)
    t.join(10)
    assert [o.get("event") for o in got if "row" not in o] == ["released"]
    assert [o["row"]["n"] for o in got if "row" in o] == list(range(1_000))


def test_a_woken_reader_that_does_not_come_is_given_up_on():
    buf = HandleBuffer(max_rows=10)
    buf.reader_stall = 0.2
    buf.add_waiter(lambda: None)  # woken, never reads
    buf.read(None, timeout=0)  # its last read had everything
    time.sleep(0.3)
    t0 = time.monotonic()
    assert buf.put(rows(0, 100))
    assert 0.15 <= time.monotonic() - t0 < 2  # waited the stall bound once, then dropped
    assert len(buf) == 10


def test_a_row_batch_that_fits_is_appended_at_once_and_counted_exactly():
    """The bulk path (a RowBatch with room for all of it): ids in order, the bytes it counts
    are the rows' UTF-8 bytes, and the bounds hold once later batches no longer fit."""
    from pep.core.rows import RowBatch
    b = HandleBuffer(max_rows=5, max_bytes=10_000)
    assert b.put(RowBatch.of_texts(['{"v":1}', '{"v":"é"}', '{"v":3}']))
    assert [e.id for e in b.read(0, timeout=0)] == [1, 2, 3]
    assert b._bytes == sum(len(t.encode()) for t in ('{"v":1}', '{"v":"é"}', '{"v":3}'))
    assert b.put(RowBatch.of_texts([f'{{"v":{i}}}' for i in range(4, 8)]))  # 7 > 5: drops 2
    assert len(b) == 5 and b.dropped == 2
    assert [e.data for e in b.read(2, timeout=0)] == [f'{{"v":{i}}}' for i in range(3, 8)]
    assert b._bytes == sum(len(e.data.encode()) for e in b.read(2, timeout=0))
    b.close("revoked")
    assert not b.put(RowBatch.of_texts(['{"v":9}']))
    assert [e.kind for e in b.read(7, timeout=0)] == ["revoked"]


def test_a_reader_that_did_not_keep_up_is_waited_for_once_per_episode():
    """After one put waited its bound for a reading reader that fell behind, the next puts
    drop at once (they would otherwise hold back every handle of the stream each micro-batch)
    until the reader has caught up; then puts wait for it again."""
    from pep.core.rows import RowBatch
    b = HandleBuffer(max_rows=10)
    b.max_put_wait, b.reader_stall = 0.4, 5.0
    assert b.put(RowBatch.of_texts([f'{{"v":{i}}}' for i in range(10)]))
    b.read(0, timeout=0, limit=1)  # reading, slowly: took one row
    started = time.monotonic()
    assert b.put(RowBatch.of_texts(['{"v":10}', '{"v":11}']))  # waits its bound, then drops
    assert 0.3 <= time.monotonic() - started < 3
    started = time.monotonic()
    for i in range(5):
        assert b.put(RowBatch.of_texts([f'{{"v":{20 + i}}}']))
    assert time.monotonic() - started < 0.2  # lagging: no more waiting
    events = b.read(1, timeout=0)  # it catches up (a gap first: rows were dropped)
    assert events[0].kind == "gap" and events[-1].data == '{"v":24}'
    assert b.read(events[-1].id, timeout=0) == []
    taker = threading.Thread(target=lambda: (time.sleep(0.2), b.read(events[-1].id, timeout=0)))
    taker.start()
    started = time.monotonic()
    # more than the buffer holds: its own first rows would go before the reader took them
    assert b.put(RowBatch.of_texts([f'{{"v":{30 + i}}}' for i in range(15)]))
    waited = time.monotonic() - started
    taker.join(10)
    assert 0.1 <= waited < 3  # caught up: waited for the reader again


def test_a_batch_that_pushes_out_only_rows_already_read_is_appended_at_once():
    """A backlog's batches of `max_rows` rows each: once the reader has read a batch, the next
    one replaces it in one step (no wait, no per-row pass), and the reader gets it whole, without
    a gap; what it pushed out counts as dropped."""
    from pep.core.rows import RowBatch
    b = HandleBuffer(max_rows=10)
    b.max_put_wait, b.reader_stall = 2.0, 5.0
    assert b.put(RowBatch.of_texts([f'{{"v":{i}}}' for i in range(10)]))
    last = b.read(0, timeout=0)[-1].id  # a reader that read everything (and reads on)
    started = time.monotonic()
    assert b.put(RowBatch.of_texts([f'{{"v":{10 + i}}}' for i in range(10)]))
    assert time.monotonic() - started < 0.2
    assert len(b) == 10 and b.dropped == 10
    events = b.read(last, timeout=0)
    assert [e.kind for e in events] == ["row"] * 10
    assert [e.data for e in events] == [f'{{"v":{10 + i}}}' for i in range(10)]
    # a row not read yet: the next batch, which pushes it out, waits for the reader
    assert b.read(events[-1].id, timeout=0) == []
    b.put(RowBatch.of_texts(['{"v":20}']))
    started = time.monotonic()
    taker = threading.Thread(target=lambda: (time.sleep(0.3), b.read(events[-1].id, timeout=0)))
    taker.start()
    assert b.put(RowBatch.of_texts([f'{{"v":{30 + i}}}' for i in range(10)]))
    waited = time.monotonic() - started
    taker.join(10)
    assert 0.2 <= waited < 3


def test_an_idle_reader_gets_its_grace_once_until_it_reads_again():
    """A reader whose last read had everything (idle) and that is woken by a waiter gets a
    grace counted from the first wake since that read; when it does not come (its socket is
    full: stalled, not idle), the next puts do not wait again until it reads."""
    from pep.core.rows import RowBatch
    b = HandleBuffer(max_rows=3)
    b.max_put_wait, b.reader_stall = 5.0, 0.3
    b.add_waiter(lambda: None)
    assert b.put(RowBatch.of_texts(['{"v":0}']))
    assert len(b.read(0, timeout=0)) == 1  # caught up
    b._last_read -= 1.0  # it left read() a while ago: idle
    assert b.put(RowBatch.of_texts(['{"v":1}', '{"v":2}', '{"v":3}']))  # fits: no wait
    started = time.monotonic()
    assert b.put(RowBatch.of_texts(['{"v":4}']))  # full, unread: the grace, once
    assert 0.2 <= time.monotonic() - started < 2
    started = time.monotonic()
    for i in range(5):
        assert b.put(RowBatch.of_texts([f'{{"v":{5 + i}}}']))
    assert time.monotonic() - started < 0.2


# -- positioned buffers (Kafka handles that a restart gives again exactly, issue 41) --------------

def _batch(texts: list[str], batch: int | None = None, resumed_from: int | None = None):
    from pep.core.rows import RowBatch
    return RowBatch(tuple(texts), sum(len(t) for t in texts), None, batch, resumed_from)


def test_a_positioned_buffer_names_rows_by_micro_batch_the_same_in_every_process():
    from pep.handles.buffer import BATCH_SPAN
    first = HandleBuffer(100, 1 << 20, positioned=True)
    first.put(_batch(['{"v":1}', '{"v":2}'], batch=3))
    first.notice("stalled", {"stream": "s"})
    first.put(_batch(['{"v":3}'], batch=7))
    events = first.read(None, timeout=0)
    assert [(divmod(e.id, BATCH_SPAN), e.kind) for e in events] == [
        ((3, 1), "row"), ((3, 2), "row"), ((3, 3), "stalled"), ((7, 1), "row")]
    assert first.last_id == 7 * BATCH_SPAN + 1
    # the one-pass path writes the same ids
    text, last = first.read_rows_text(events[2].id, "%d %s\n", 1 << 20)
    assert text == f'{7 * BATCH_SPAN + 1} {{"v":3}}\n' and last == 7 * BATCH_SPAN + 1
    # the next process, given the same batches (after telling that nothing was lost), gives a
    # reader resuming from (3, 1) exactly the rest: the notice died with the first process
    second = HandleBuffer(100, 1 << 20, positioned=True)
    second.put(_batch([], resumed_from=0))
    second.put(_batch(['{"v":1}', '{"v":2}'], batch=3))
    second.put(_batch(['{"v":3}'], batch=7))
    again = second.read(events[0].id, timeout=0)
    assert [(e.id, e.data) for e in again] == [(events[1].id, '{"v":2}'),
                                               (events[3].id, '{"v":3}')]
    # an id in a hole (past batch 3's rows) or from the future: what comes after it
    assert [e.id for e in second.read(5 * BATCH_SPAN, timeout=0)] == [events[3].id]
    assert second.read(9 * BATCH_SPAN, timeout=0) == []
    second.put(_batch(['{"v":4}'], batch=9))
    assert [e.data for e in second.read(9 * BATCH_SPAN, timeout=0)] == ['{"v":4}']


def test_a_positioned_buffer_counts_dropped_rows_and_says_when_it_cannot():
    from pep.handles.buffer import BATCH_SPAN
    buffer = HandleBuffer(3, 1 << 20, positioned=True)
    buffer.put(_batch([], resumed_from=2))  # a restart: rows of batches 0 and 1 unknown
    for b in range(2, 7):
        buffer.put(_batch([f'{{"b":{b},"i":{i}}}' for i in range(2)], batch=b))
    # a reader at (2, 2) lost (3, 1) .. (5, 1): five rows, counted
    events = buffer.read(2 * BATCH_SPAN + 2, timeout=0)
    gap = json.loads(events[0].data)
    assert gap == {"event": "gap", "lost": 5, "resume_from": events[0].id,
                   "reason": "buffer full"} and events[0].id == 5 * BATCH_SPAN + 1
    assert [json.loads(e.data) for e in events[1:]] == [
        {"b": 5, "i": 1}, {"b": 6, "i": 0}, {"b": 6, "i": 1}]
    # resuming from the gap: no gap again
    assert [e.kind for e in buffer.read(events[0].id, timeout=0)] == ["row"] * 3
    # a reader at (1, 4), before the restart's batches: rows may have died, count unknown
    events = buffer.read(1 * BATCH_SPAN + 4, timeout=0)
    assert json.loads(events[0].data)["lost"] is None
    assert json.loads(events[0].data)["reason"] == "gateway restarted"
    assert buffer.read_rows_text(1 * BATCH_SPAN + 4, "%d %s", 1 << 20) is None
    # a reader naming no position is told of the rows the buffer dropped, as in any buffer
    assert json.loads(buffer.read(None, timeout=0)[0].data)["lost"] == 7


def test_a_positioned_buffer_s_shutdown_keeps_its_reader_where_it_was():
    """At a stop the buffer discards unread rows; the next start gives them again, so a reader
    resuming from the `shutdown` event must not skip them: it bears the id it had."""
    from pep.handles.buffer import BATCH_SPAN
    buffer = HandleBuffer(100, 1 << 20, positioned=True)
    buffer.put(_batch(['{"v":1}', '{"v":2}', '{"v":3}'], batch=4))
    seen = buffer.read(None, timeout=0, limit=1)
    buffer.close("shutdown", "the gateway is stopping")
    final = buffer.read(seen[-1].id, timeout=0)
    assert [(e.id, e.kind) for e in final] == [(4 * BATCH_SPAN + 1, "shutdown")]
    # a notice while a delivery waits for its reader comes after the batch's rows
    other = HandleBuffer(2, 1 << 20, positioned=True)
    other.max_put_wait = 0.5
    other.put(_batch(['{"v":1}', '{"v":2}'], batch=1))
    other.read(None, timeout=0, limit=1)  # a reader is reading: the next put waits for it
    done = threading.Thread(target=other.put, args=(_batch(['{"v":3}', '{"v":4}'], batch=2),))
    done.start()
    time.sleep(0.1)
    other.notice("stalled", {})
    done.join(5)
    ids = [(divmod(e.id, BATCH_SPAN), e.kind) for e in other.read(None, timeout=0)]
    assert ids[-3:] == [((2, 1), "row"), ((2, 2), "row"), ((2, 3), "stalled")]
