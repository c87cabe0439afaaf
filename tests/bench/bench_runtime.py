"""Benchmark of the shared-query runtime against a direct Spark query on the same source.

Run: .venv/bin/python tests/bench/bench_runtime.py [--quick]
Prints: attach->first row vs direct start->first row (ratio), tuples/s delivered vs direct (ratio),
and p95 tuple latency for 100 / 500 / 1000 concurrent handles with different filters.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pep.core.plan import ExecutionPlan, Field, Predicate, SourceSpec, StreamDefinition, StreamSchema  # noqa: E402
from pep.runtime.runtime import StreamRuntime  # noqa: E402
from pep.runtime.session import create_spark_session  # noqa: E402

SCHEMA = StreamSchema((Field("seq", "long"), Field("sent", "double"), Field("temp", "double"),
                       Field("station", "string")))
SPARK_SCHEMA = "seq long, sent double, temp double, station string, _xsg_seq long"


def write_file(directory: Path, name: str, start: int, count: int) -> None:
    now = time.time()
    lines = [json.dumps({"seq": i, "sent": now, "temp": round(random.uniform(-10, 40), 2),
                         "station": f"s{i % 20}", "_xsg_seq": i})
             for i in range(start, start + count)]
    tmp = directory / f".{name}.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, directory / name)


class Writer(threading.Thread):
    """Appends a file of `per_file` records every `period` seconds (records stamped when written)."""

    def __init__(self, directory: Path, per_file: int, period: float) -> None:
        super().__init__(daemon=True)
        self.directory, self.per_file, self.period = directory, per_file, period
        self.stop_event = threading.Event()
        self.n = 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            write_file(self.directory, f"w{self.n:06d}.json", self.n * self.per_file, self.per_file)
            self.n += 1
            self.stop_event.wait(self.period)


def stream(directory: Path, name: str) -> StreamDefinition:
    return StreamDefinition(name, "bench", SCHEMA, SourceSpec("ingest", (("path", str(directory)),)))


def direct_first_row(spark, directory: Path, interval: float) -> float:
    got = threading.Event()

    def batch(df, _id):
        if df.filter("temp > -100").select("seq", "temp").toArrow().num_rows:
            got.set()
    started = time.perf_counter()
    q = (spark.readStream.schema(SPARK_SCHEMA).option("maxFilesPerTrigger", 50).json(str(directory))
         .writeStream.foreachBatch(batch).trigger(processingTime=f"{int(interval * 1000)} milliseconds")
         .start())
    got.wait(60)
    elapsed = time.perf_counter() - started
    q.stop()
    return elapsed


def runtime_first_row(spark, work: Path, directory: Path, name: str, interval: float) -> float:
    got = threading.Event()
    rt = StreamRuntime(spark, work, trigger_interval=interval)
    started = time.perf_counter()
    rt.attach_handle("h", stream(directory, name), ExecutionPlan(
        name, ((Predicate("temp", ">", -100),),), ("seq", "temp")), lambda rows: got.set() or True)
    got.wait(60)
    elapsed = time.perf_counter() - started
    rt.stop()
    return elapsed


def first_row(spark, work: Path, rounds: int, interval: float) -> None:
    directory = work / "live"
    directory.mkdir(parents=True)
    writer = Writer(directory, 20, 0.1)
    writer.start()
    time.sleep(1)
    direct, ours = [], []
    for i in range(rounds):
        direct.append(direct_first_row(spark, directory, interval))
        ours.append(runtime_first_row(spark, work / f"rt{i}", directory, f"live{i}", interval))
    writer.stop_event.set()
    d, o = statistics.median(direct), statistics.median(ours)
    print(f"first row: direct query start->first row median {d:.3f} s {['%.2f' % x for x in direct]}")
    print(f"first row: runtime attach->first row median   {o:.3f} s {['%.2f' % x for x in ours]}")
    print(f"first row ratio (runtime/direct): {o / d:.2f}  (aim <= 1.2)")


def throughput(spark, work: Path, files: int, per_file: int, interval: float) -> None:
    """Both sides run on an empty directory; then the same backlog appears in it at once (a
    stream's first handle starts at the stream's end: files present before would be skipped)."""
    staging = work / "backlog-staging"
    staging.mkdir(parents=True)
    for n in range(files):
        write_file(staging, f"b{n:05d}.json", n * per_file, per_file)
    total = files * per_file

    def link_backlog(directory: Path) -> None:
        for p in sorted(staging.iterdir()):
            os.link(p, directory / p.name)
    directory = work / "backlog-direct"
    directory.mkdir(parents=True)

    done = threading.Event()
    count = [0]
    last = [0.0]

    def batch(df, _id):
        count[0] += df.filter("temp > -100").select("seq", "temp").toArrow().num_rows
        if count[0] >= total:
            last[0] = time.perf_counter()
            done.set()
    q = (spark.readStream.schema(SPARK_SCHEMA).option("maxFilesPerTrigger", 50).json(str(directory))
         .writeStream.foreachBatch(batch).trigger(processingTime=f"{int(interval * 1000)} milliseconds")
         .start())
    time.sleep(1)
    started = time.perf_counter()
    link_backlog(directory)
    done.wait(600)
    q.stop()
    direct_rate = total / (last[0] - started)

    got = [0]
    done2 = threading.Event()

    def deliver(rows):
        got[0] += len(rows)
        if got[0] >= total:
            last[0] = time.perf_counter()
            done2.set()
        return True
    rt = StreamRuntime(spark, work / "rt-tp", trigger_interval=interval, max_files_per_trigger=50)
    directory = work / "backlog-runtime"
    directory.mkdir(parents=True)
    rt.attach_handle("h", stream(directory, "backlog"), ExecutionPlan(
        "backlog", ((Predicate("temp", ">", -100),),), ("seq", "temp")), deliver)
    time.sleep(1)
    started = time.perf_counter()
    link_backlog(directory)
    done2.wait(600)
    ours_rate = total / (last[0] - started)
    rt.stop()
    print(f"throughput: direct {direct_rate:,.0f} tuples/s, runtime {ours_rate:,.0f} tuples/s "
          f"({total:,} tuples), ratio {ours_rate / direct_rate:.2f}  (aim >= 0.9)")


def concurrency(spark, work: Path, n_handles: int, seconds: float, rate_per_s: int,
                interval: float) -> float:
    directory = work / f"conc{n_handles}"
    directory.mkdir(parents=True)
    latencies: list[float] = []
    lock = threading.Lock()

    def make_deliver():
        def deliver(batch):  # a RowBatch: one JSON text per row, keys in projection order
            now = time.time()
            lat = [now - float(t.split(',"sent":', 1)[1].split(",", 1)[0]) for t in batch.rows]
            with lock:
                latencies.extend(lat)
            return True
        return deliver
    rt = StreamRuntime(spark, work / f"rt-c{n_handles}", trigger_interval=interval)
    sd = stream(directory, f"conc{n_handles}")
    rnd = random.Random(n_handles)
    attach_times = []
    for h in range(n_handles):
        lo = rnd.uniform(-10, 35)
        plan = ExecutionPlan(sd.name, ((Predicate("temp", ">", lo),
                                        Predicate("station", "!=", f"s{h % 20}")),
                                       (Predicate("seq", "<", 0),)), ("seq", "sent", "temp"))
        t = time.perf_counter()
        rt.attach_handle(f"h{h}", sd, plan, make_deliver())
        attach_times.append(time.perf_counter() - t)
    time.sleep(2)  # let the query settle
    with lock:
        latencies.clear()
    per_file = max(1, int(rate_per_s * 0.25))
    writer = Writer(directory, per_file, 0.25)
    writer.start()
    time.sleep(seconds)
    writer.stop_event.set()
    time.sleep(2)
    stats = rt.stats()[sd.name]
    rt.stop()
    with lock:
        lat = sorted(latencies)
    p95 = lat[int(0.95 * (len(lat) - 1))] if lat else float("nan")
    p50 = lat[len(lat) // 2] if lat else float("nan")
    print(f"{n_handles:5d} handles: p50 {p50:.3f} s, p95 {p95:.3f} s, {len(lat):,} tuple deliveries, "
          f"{stats['batches']} batches (last {stats['last_batch_ms']} ms), plans {stats['plans']}, "
          f"attach median {statistics.median(attach_times) * 1000:.1f} ms "
          f"(first {attach_times[0] * 1000:.0f} ms)")
    return p95


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--handles", default="100,500,1000")
    args = parser.parse_args()
    interval = 0.25
    started = time.perf_counter()
    spark = create_spark_session(extra_conf={"spark.driver.memory": "4g"})
    print(f"session + warm-up: {time.perf_counter() - started:.1f} s")
    with tempfile.TemporaryDirectory(prefix="xsg-bench-") as tmp:
        work = Path(tmp)
        first_row(spark, work, 2 if args.quick else 3, interval)
        throughput(spark, work, 40 if args.quick else 200, 500, interval)
        best = 0
        for n in [int(x) for x in args.handles.split(",")]:
            p95 = concurrency(spark, work, n, 5 if args.quick else 10, 200, interval)
            if p95 < 1.0:
                best = n
        print(f"largest tested handle count with p95 tuple latency < 1 s: {best}")
    spark.stop()


if __name__ == "__main__":
    main()
