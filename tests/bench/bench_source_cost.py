"""What a micro-batch costs Spark's JVM with and without files: the same 1,000 row plans on a
stream read from Spark's rate source (no files to list, index or read) and on one read from
JSON files (as the gateway's ingest is), one after the other in one process and session.

Run: .venv/bin/python tests/bench/bench_source_cost.py [--plans 1000] [--seconds 30]

Why: a JFR profile of the JVM at 1,000 handles showed the file source's steps (listing the
directory, indexing the batch's files, copying and serializing Hadoop's configuration for each
batch and file) as a large share of its stream thread. If they were what a batch costs, a source
without files would make each batch cheaper. Reported per source: micro-batches in the window,
tuples per batch, Spark's progress durations (p50), the JVM's CPU (cores, from /proc) and per
micro-batch (ms), rows delivered per second; then the ratio of JVM time per batch, files against
rate. The rate source's offsets are whole seconds, so its batches come once a second with 200
tuples each; the files source gets a file of 50 tuples every 0.25 s. Each plan is a band over one
attribute that about half of the tuples pass; rows go to counting callbacks in this process (no
HTTP). Linux only (/proc).
"""
from __future__ import annotations

import argparse
import calendar
import collections
import json
import os
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
from pep.core.schemas import WEATHER_SCHEMA
from pep.runtime.runtime import StreamRuntime
from pep.runtime.session import create_spark_session
from tests.bench.harness import machine, spark_cpu_seconds

FILE_SCHEMA = StreamSchema((Field("seq", "long"), Field("ts", "timestamp"), Field("v", "double")))


def file_writer(directory: Path, stop: threading.Event) -> None:
    """A file of 50 records every 0.25 s, written aside and renamed in (as the ingest does)."""
    seq = 0
    while not stop.is_set():
        lines = [json.dumps({"seq": seq + k, "ts": time.time(), "v": ((seq + k) * 7.31) % 1000.0,
                             "_xsg_seq": seq + k}) for k in range(50)]
        hidden = directory / f".{seq:012d}.tmp"
        hidden.write_text("\n".join(lines) + "\n")
        hidden.rename(directory / f"{seq:012d}.json")
        seq += 50
        stop.wait(0.25)


def measure(spark, kind: str, plans: int, seconds: float, work: Path) -> dict:  # type: ignore[no-untyped-def]
    runtime = StreamRuntime(spark, work / f"rt-{kind}", trigger_interval=0.25)
    delivered = collections.Counter()

    def count(rows) -> bool:  # type: ignore[no-untyped-def]
        delivered["rows"] += len(rows)
        return True
    stop = threading.Event()
    if kind == "rate":
        stream = StreamDefinition("by_rate", "bench", WEATHER_SCHEMA, SourceSpec(
            "generator", (("schema", "weather"), ("rate", "200"))), time_attribute="samplingtime")
        attribute, low, high = "temperature", -10.0, 40.0
    else:
        directory = work / "files"
        directory.mkdir()
        stream = StreamDefinition("by_files", "bench", FILE_SCHEMA, SourceSpec(
            "files", (("path", str(directory)), ("format", "json"))), time_attribute="ts")
        attribute, low, high = "v", 0.0, 1000.0
        threading.Thread(target=file_writer, args=(directory, stop), daemon=True).start()
    width = (high - low) / 2
    try:
        for i in range(plans):
            start = low + (high - low) * i / plans
            plan = ExecutionPlan(stream.name, ((Predicate(attribute, ">=", start),
                                                Predicate(attribute, "<", start + width)),),
                                 (attribute,))
            runtime.attach_handle(f"{kind}-{i}", stream, plan, count)
        time.sleep(15)  # the query started, the JIT warm
        query_ids = {q.id for q in spark.streams.active}
        c0, t0, r0 = spark_cpu_seconds()[0], time.monotonic(), delivered["rows"]
        time.sleep(seconds)
        c1, t1, r1 = spark_cpu_seconds()[0], time.monotonic(), delivered["rows"]
        durations = collections.defaultdict(list)
        batches = 0
        window_start = time.time() - (t1 - t0)
        for query in spark.streams.active:
            if query.id not in query_ids:
                continue
            for p in query.recentProgress:
                stamp = calendar.timegm(time.strptime(p["timestamp"][:19], "%Y-%m-%dT%H:%M:%S"))
                if stamp < window_start or not p["numInputRows"]:
                    continue
                batches += 1
                durations["tuples"].append(p["numInputRows"])
                for name, ms in p["durationMs"].items():
                    durations[name].append(ms)
    finally:
        stop.set()
        runtime.stop()
    cores = (c1 - c0) / (t1 - t0)
    return {"kind": kind, "batches": batches, "cores": cores,
            "ms_per_batch": 1000 * (c1 - c0) / max(1, batches),
            "rows_per_s": (r1 - r0) / (t1 - t0),
            "p50": {k: sorted(v)[len(v) // 2] for k, v in durations.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", type=int, default=1000, help="row plans (handles) per stream")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds per source")
    args = ap.parse_args()
    print("machine:", machine())
    spark = create_spark_session()
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="xsg-bench-source-") as tmp:
            for kind in ("rate", "files"):
                r = measure(spark, kind, args.plans, args.seconds, Path(tmp))
                results.append(r)
                print(f"{kind:>5}: {r['batches']} micro-batches of ~{r['p50'].get('tuples', 0)} "
                      f"tuples in {args.seconds:.0f} s; JVM {r['cores']:.2f} cores, "
                      f"{r['ms_per_batch']:.0f} ms per batch; {r['rows_per_s']:,.0f} rows/s "
                      f"delivered; Spark p50 ms: "
                      + ", ".join(f"{k} {v}" for k, v in sorted(r["p50"].items())
                                  if k != "tuples"))
    finally:
        spark.stop()
    rate, files = results
    print(f"JVM time per micro-batch, files / rate: "
          f"{files['ms_per_batch'] / max(rate['ms_per_batch'], 1e-9):.2f}")
    print("load average at the end:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
