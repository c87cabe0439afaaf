"""The runtime alone with many distinct row plans: micro-batch phases and latency, no HTTP.

Run: .venv/bin/python tests/bench/bench_row_plans.py [--plans 1000] [--pass-rate 0.5]
                                                     [--seconds 20] [--profile]

One SparkSession and one StreamRuntime on an ingest directory; N handles, each with a plan of its
own (a band `v >= a AND v < a + 1000 x pass-rate` over v spread evenly on [0, 1000): each tuple
passes about that share of them), each delivering to a counting callback in this process. A
writer adds a file of 50 records every 0.25 s (200 tuples/s), each stamped with its write time.
Reported: micro-batches in the measured window and their phases (the runtime's DEBUG line: plan
table, Spark jobs incl. toArrow, routing and delivery into the callbacks), rows/s delivered, and
per delivered batch the latency of its newest row (write -> callback). `--profile`: cProfile of
the micro-batch thread over the window (top 30 by cumulative time). bench_many_readers.py
measures the same workload read over HTTP.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import os
import pstats
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pep.core.plan import (
    ExecutionPlan,
    Field,
    Predicate,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
)
from pep.runtime.query.lifecycle import QueryLifecycle
from pep.runtime.runtime import StreamRuntime
from pep.runtime.session import create_spark_session

SCHEMA = StreamSchema((Field("seq", "long"), Field("sent", "double"), Field("v", "double"),
                       Field("pad", "string")))


class Phases(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.batches: list[tuple[float, float, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("batch %s: table"):
            self.batches.append(record.args[1:4])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=1000)
    ap.add_argument("--pass-rate", type=float, default=0.5)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores")
    phases = Phases()
    log = logging.getLogger("pep.runtime.query.runner")
    log.addHandler(phases)
    log.setLevel(logging.DEBUG)
    prof = cProfile.Profile()
    profiling = threading.Event()
    original = QueryLifecycle.on_batch

    def on_batch(self, batch, batch_id):
        if not (args.profile and profiling.is_set()):
            return original(self, batch, batch_id)
        prof.enable()
        try:
            return original(self, batch, batch_id)
        finally:
            prof.disable()
    QueryLifecycle.on_batch = on_batch
    spark = create_spark_session("local[2]", "bench-row-plans")
    work = Path(tempfile.mkdtemp())
    directory = work / "in"
    directory.mkdir()
    runtime = StreamRuntime(spark, work / "rt", trigger_interval=0.25)
    sd = StreamDefinition("s", "o", SCHEMA, SourceSpec("ingest", (("path", str(directory)),)))
    lock = threading.Lock()
    latencies: list[float] = []
    rows = [0]

    def deliver(batch) -> bool:
        now = time.time()
        with lock:
            rows[0] += len(batch.rows)
            if batch.rows:
                latencies.append(now - json.loads(batch.rows[-1])["sent"])
        return True
    width = 1000 * args.pass_rate
    started = time.perf_counter()
    for i in range(args.plans):
        a = i * (1000 - width) / args.plans + (i % 7) * 0.001
        runtime.attach_handle(f"h{i}", sd, ExecutionPlan(
            "s", ((Predicate("v", ">=", a), Predicate("v", "<", a + width)),),
            ("seq", "sent", "v", "pad")), deliver)
    attached = time.perf_counter() - started
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            now = time.time()
            lines = [json.dumps({"seq": n * 50 + k, "sent": now, "v": ((n * 50 + k) * 7.31) % 1000,
                                 "pad": "p" * 40, "_xsg_seq": n * 50 + k}) for k in range(50)]
            tmp = directory / f".f{n:06d}"
            tmp.write_text("\n".join(lines) + "\n")
            os.replace(tmp, directory / f"f{n:06d}.json")
            n += 1
            stop.wait(0.25)
    writer = threading.Thread(target=write, daemon=True)
    try:
        time.sleep(3)
        writer.start()
        time.sleep(5)  # warm-up
        with lock:
            latencies.clear()
            rows[0] = 0
        phases.batches.clear()
        profiling.set()
        t0 = time.time()
        time.sleep(args.seconds)
        profiling.clear()
        elapsed = time.time() - t0
        stop.set()
        writer.join(5)
        with lock:
            lat = sorted(latencies)
            delivered = rows[0]
        b = list(phases.batches)
        print(f"{args.plans:,} plans (each ~{args.pass_rate:.0%} of the tuples), 200 tuples/s, "
              f"{elapsed:.0f} s measured; attached in {attached:.1f} s")
        print(f"  {len(b)} micro-batches; rows/s delivered {delivered / elapsed:,.0f}")
        if lat:
            print(f"  newest row of each delivered batch, write -> callback: p50 "
                  f"{lat[len(lat) // 2]:.3f} s, p95 {lat[int(0.95 * (len(lat) - 1))]:.3f} s")
        for k, name in enumerate(("plan table", "Spark jobs + toArrow", "routing + delivery")):
            v = [x[k] for x in b]
            if v:
                print(f"  {name}: p50 {statistics.median(v):.3f} s, max {max(v):.3f} s")
        if args.profile:
            prof.create_stats()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(30)
            print(out.getvalue())
        print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        stop.set()
        runtime.stop()
        spark.stop()


if __name__ == "__main__":
    main()
