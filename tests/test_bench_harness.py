"""The benchmarks' shared measuring (tests/bench/harness.py, issue 45): what makes their figures
honest must itself hold. A row that never arrives is infinitely late; a backlog run that lost
rows has no rate; the trials rotate; the reader process counts what the gateway sent it, event
by event; the rows each benchmark says its handles are owed are the rows their filters pass.
No Spark: the benchmarks themselves are run by hand (docs/benchmarks.md)."""
from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.bench import bench_many_readers, bench_runtime
from tests.bench.direct import gateway_settings
from tests.bench.harness import INF, backlog_figures, pct, rotations, with_missing
from tests.bench.readers import ReadJob, reader_result, start_reader, wait_ready


def test_every_side_leads_one_trial_in_turn():
    sides = ("gateway", "user", "gateway-settings")
    orders = rotations(sides, 3)
    assert [o[0] for o in orders] == list(sides)
    assert all(sorted(o) == sorted(sides) for o in orders)
    assert rotations(("a", "b"), 3) == [("a", "b"), ("b", "a"), ("a", "b")]


def test_a_row_that_never_arrived_is_infinitely_late():
    assert pct(with_missing([0.1] * 96, 100), 95) == pytest.approx(0.1)
    assert pct(with_missing([0.1] * 94, 100), 95) == INF
    assert with_missing([0.2], 1) == [0.2]


def test_a_backlog_run_that_lost_or_missed_rows_has_no_rate():
    times = {"start": 100.0, "first": 101.0, "last": 105.0}
    done = backlog_figures({"rows": 1000, **times}, 1000)
    assert done["complete"] and done["rate"] == pytest.approx(200.0)
    assert done["first_row"] == pytest.approx(1.0)
    assert done["steady"] == pytest.approx(999 / 4)
    short = backlog_figures({"rows": 999, **times}, 1000)
    assert not short["complete"] and short["rate"] == 0.0
    lost = backlog_figures({"rows": 1000, "lost": 3, **times}, 1000)
    assert not lost["complete"] and lost["rate"] == 0.0
    none = backlog_figures({"rows": 0, "start": 100.0, "first": None, "last": None}, 10)
    assert none["first_row"] == INF and none["rate"] == 0.0


def test_the_gateway_settings_are_read_from_the_gateway():
    from pep.runtime.runtime import RuntimeSettings
    from pep.runtime.sources.frames import KAFKA_MAX_OFFSETS
    s = gateway_settings()
    assert (s.trigger, s.max_files, s.max_offsets) == (
        RuntimeSettings().trigger_interval, RuntimeSettings().max_files_per_trigger,
        KAFKA_MAX_OFFSETS)


class Handles(BaseHTTPRequestHandler):
    """Two handles as the gateway serves them over HTTP/1.0: `a` three rows (two in the first
    phase, one in the second), a gap of 2 rows, `revoked`, then a row that must be counted as
    after it; `b` refused."""

    protocol_version = "HTTP/1.0"
    start = 0.0

    def do_GET(self) -> None:  # http.server's name
        if self.path != "/handles/a":
            self.send_response(403)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        rows = [(1, self.start + 0.5), (2, self.start + 1.5), (3, self.start + 3.0)]
        lines = [json.dumps({"id": i, "row": {"seq": i * 7, "sent": sent}},
                            separators=(",", ":")) for i, sent in rows]
        lines.append(json.dumps({"id": 4, "event": "gap", "lost": 2}, separators=(",", ":")))
        lines.append(json.dumps({"id": 5, "event": "revoked"}, separators=(",", ":")))
        lines.append(json.dumps({"id": 6, "row": {"seq": 1, "sent": self.start}},
                                separators=(",", ":")))
        for line in lines:
            self.wfile.write(line.encode() + b"\n")
            self.wfile.flush()
            time.sleep(0.02)

    def log_message(self, *args: object) -> None:
        pass


def test_the_reader_process_counts_rows_latencies_gaps_and_what_follows_revoked(tmp_path: Path):
    Handles.start = time.time() - 10.0  # rows sent 10 s ago and after
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handles)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        s = Handles.start
        job = ReadJob("127.0.0.1", server.server_address[1],
                      [(0, "/handles/a", "t"), (1, "/handles/b", "t")], str(tmp_path / "r.out"),
                      ready=str(tmp_path / "r.ready"), seconds=20,
                      phases=[(s, s + 2.0), (s + 2.0, s + 10.0)], sample=7)
        proc = start_reader(job)
        assert wait_ready(job, 20)
        got = reader_result(proc, job, 30)
    finally:
        server.shutdown()
    assert got["rows"] == 3
    assert [len(x) for x in got["lat"]] == [2, 1]
    assert all(6.5 < lat < 40 for phase in got["lat"] for lat in phase)
    assert (got["gaps"], got["lost"]) == (1, 2)
    assert len(got["revoked"]) == 1 and got["finals"] == {"revoked": 1}
    assert got["after_final"] == 1
    assert [seq for _, seq, _ in got["samples"]] == [7, 14, 21]
    assert any(" 403 " in e for e in got["errors"])
    assert got["still_open"] == 0


def test_many_readers_owes_each_handle_the_tuples_in_its_band():
    n, pass_rate = 40, 0.3
    bands = [bench_many_readers.bounds(i, n, pass_rate) for i in range(n)]
    puts = [(k * 20, 20, 1000.0 + k * 0.1) for k in range(50)]
    phases = [(1000.0, 1002.0), (1002.0, 1010.0)]
    want = [0, 0]
    for first, count, sent in puts:
        k = 0 if sent < 1002.0 else 1
        for seq in range(first, first + count):
            v = bench_many_readers.value(seq)
            want[k] += sum(1 for a, b in bands if a <= v < b)
    assert bench_many_readers.owed(puts, bands, phases) == want
    assert sum(want) == pytest.approx(50 * 20 * n * pass_rate, rel=0.2)


def test_the_runtime_benchmark_owes_each_handle_what_its_filter_passes():
    rnd = random.Random(5)
    los = [rnd.uniform(-10, 35) for _ in range(60)]
    written = [(1000.0 + i * 0.05, round(rnd.uniform(-10, 40), 2), f"s{i % 20}")
               for i in range(400)]
    phases = [(1000.0, 1005.0), (1005.0, 1030.0)]
    want = [0, 0]
    for sent, temp, station in written:
        k = 0 if sent < 1005.0 else 1
        want[k] += sum(1 for h, lo in enumerate(los) if temp > lo and station != f"s{h % 20}")
    assert bench_runtime.owed([list(w) for w in written], los, phases) == want


class Busy(BaseHTTPRequestHandler):
    """A handle refused twice (429, then 503, each with `Retry-After: 1`, as a server at its
    connection limit and an edge whose check did not come answer), then served: a row and
    `revoked`; and one refused without `Retry-After` (an error, not asked again)."""

    protocol_version = "HTTP/1.0"
    asked = 0

    def do_GET(self) -> None:  # http.server's name
        if self.path == "/handles/x":
            self.send_response(503)
            self.end_headers()
            return
        Busy.asked += 1
        if Busy.asked <= 2:
            self.send_response(429 if Busy.asked == 1 else 503)
            self.send_header("retry-after", "1")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        for line in ({"id": 1, "row": {"seq": 7, "sent": time.time()}},
                     {"id": 2, "event": "revoked"}):
            self.wfile.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
            self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


def test_the_reader_asks_again_after_retry_after_when_told_to(tmp_path: Path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        job = ReadJob("127.0.0.1", server.server_address[1],
                      [(0, "/handles/c", "t"), (1, "/handles/x", "t")], str(tmp_path / "r.out"),
                      ready=str(tmp_path / "r.ready"), seconds=20, retry=True)
        t0 = time.monotonic()
        proc = start_reader(job)
        got = reader_result(proc, job, 30)
    finally:
        server.shutdown()
    assert Busy.asked == 3 and time.monotonic() - t0 >= 2.0  # after each Retry-After, not at once
    assert got["rows"] == 1 and got["finals"] == {"revoked": 1}
    assert got["refused"] == {"429": 1, "503": 1} and got["never_served"] == 0
    assert len(got["errors"]) == 1 and " 503 " in got["errors"][0]
