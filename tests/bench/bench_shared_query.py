"""What one Structured Streaming query for several streams would save against a query per stream:
Spark alone (no gateway), K directories of JSON files each fed as the gateway's ingest feeds a
stream (a file of 20 records every 0.1 s: 200 tuples/s), a trigger every 0.25 s, three ways:

  separate     K queries, one per directory; each micro-batch collects its rows (`toArrow`),
               as the gateway runs a stream's query today;
  union-1      one query over the union of the K sources (each row tagged with its stream);
               each micro-batch collects all of them in one job;
  union-K      the same query, each micro-batch collecting each stream's rows in a job of its
               own (what a shared query would do if the per-stream work stayed per stream).

Run: .venv/bin/python tests/bench/bench_shared_query.py [--streams 8] [--seconds 30]

Reported per way: micro-batches in the window, Spark's JVM CPU (cores, from /proc), JVM time per
trigger of all the streams, and the age of each delivered tuple (written -> collected on the
driver) at p50 and p95; then JVM cores and p95 relative to `separate`. Why: with the gateway,
1,000 handles over 8 busy streams fell behind on 2 cores while the same handles on one stream
did not (README, "Many busy streams"): each stream's micro-batches carry Spark's fixed cost.
Linux only (/proc). Everything started is stopped, even on error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from functools import reduce
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pep.runtime.session import create_spark_session
from tests.bench.harness import machine, pct, spark_cpu_seconds

SCHEMA = "seq long, ts double, v double"
WAYS = ("separate", "union-1", "union-K")
TRIGGER = 0.25  # seconds


def feeder(directories: list[Path], stop: threading.Event) -> None:
    """Into each directory, a file of 20 records every 0.1 s, written aside and renamed in."""
    seq = 0
    while not stop.is_set():
        for d in directories:
            now = time.time()
            lines = "".join(json.dumps({"seq": seq + k, "ts": now, "v": (seq + k) * 0.5}) + "\n"
                            for k in range(20))
            hidden = d / f".{seq:012d}.tmp"
            hidden.write_text(lines)
            hidden.rename(d / f"{seq:012d}.json")
        seq += 20
        stop.wait(0.1)


def measure(spark, way: str, streams: int, seconds: float, work: Path) -> dict:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    directories = [work / way / f"s{k}" for k in range(streams)]
    for d in directories:
        d.mkdir(parents=True)
    ages: list[float] = []
    batches = [0]
    window = [float("inf"), float("inf")]
    lock = threading.Lock()

    def collect(frame) -> None:  # type: ignore[no-untyped-def]
        table = frame.toArrow()
        now = time.time()
        if table.num_rows and window[0] <= now <= window[1]:
            with lock:
                ages.extend(now - t for t in table.column("ts").to_pylist())

    def on_batch(frame, _batch_id: int) -> None:  # type: ignore[no-untyped-def]
        if window[0] <= time.time() <= window[1]:
            with lock:
                batches[0] += 1
        if way == "union-K":
            for k in range(streams):
                collect(frame.where(F.col("_stream") == k))
        else:
            collect(frame)

    def source(k: int):  # type: ignore[no-untyped-def]
        frame = spark.readStream.schema(SCHEMA).json(str(directories[k]))
        return frame.withColumn("_stream", F.lit(k)) if way != "separate" else frame

    stop = threading.Event()
    queries = []
    try:
        if way == "separate":
            frames = [source(k) for k in range(streams)]
        else:
            frames = [reduce(lambda a, b: a.unionByName(b), [source(k) for k in range(streams)])]
        for i, frame in enumerate(frames):
            queries.append(frame.writeStream.foreachBatch(on_batch)
                           .option("checkpointLocation", str(work / way / f"ck{i}"))
                           .trigger(processingTime=f"{int(TRIGGER * 1000)} milliseconds")
                           .start())
        threading.Thread(target=feeder, args=(directories, stop), daemon=True).start()
        time.sleep(15)  # the queries started, the JIT warm
        c0, t0 = spark_cpu_seconds()[0], time.monotonic()
        window[0] = time.time()
        window[1] = window[0] + seconds
        time.sleep(seconds)
        c1, t1 = spark_cpu_seconds()[0], time.monotonic()
    finally:
        stop.set()
        for q in queries:
            try:
                q.stop()
            except Exception as exc:  # noqa: BLE001 - printed; the others still stop
                print(f"(stopping a query failed: {exc!r})")
    cores = (c1 - c0) / (t1 - t0)
    triggers = seconds / TRIGGER
    with lock:
        got = list(ages)
    return {"way": way, "batches": batches[0], "cores": cores,
            "ms_per_trigger": 1000 * (c1 - c0) / triggers, "tuples_per_s": len(got) / seconds,
            "p50": pct(got, 50) if got else float("nan"),
            "p95": pct(got, 95) if got else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=8, help="streams (directories), K")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds per way")
    args = ap.parse_args()
    if args.streams < 1 or args.seconds <= 0:
        ap.error("--streams wants 1 or more, --seconds more than 0")
    print("machine:", machine())
    spark = create_spark_session()
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="xsg-bench-shared-") as tmp:
            for way in WAYS:
                r = measure(spark, way, args.streams, args.seconds, Path(tmp))
                results.append(r)
                print(f"{way:>8}: {args.streams} streams, {r['batches']} micro-batches in "
                      f"{args.seconds:.0f} s; JVM {r['cores']:.2f} cores, "
                      f"{r['ms_per_trigger']:.0f} ms per trigger of all streams; "
                      f"{r['tuples_per_s']:,.0f} tuples/s collected, age p50 {r['p50']:.3f} s, "
                      f"p95 {r['p95']:.3f} s")
    finally:
        spark.stop()
    base = results[0]
    for r in results[1:]:
        print(f"{r['way']} / separate: JVM cores {r['cores'] / max(base['cores'], 1e-9):.2f}, "
              f"p95 {r['p95'] / base['p95']:.2f}")
    print("load average at the end:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
