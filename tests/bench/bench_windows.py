"""Window plans at saturation: the shared runtime against a direct Structured Streaming query.

Run: .venv/bin/python tests/bench/bench_windows.py [--quick] [--plans 1,10,100]
         [--shapes tuple-60/1,time-60s/1s,tuple-10/2] [--master URL | --standalone]

For each window shape and each number of distinct plans (the same window, different filter
constants, every tuple passing every plan: the most work per tuple), a backlog of files is
linked into an empty ingest directory while the query is already running, and the time until
the last window of every plan has reached the driver gives tuples/s. Both sides read the same
files with the same maxFilesPerTrigger and trigger interval, and hand their results to the
driver:
- runtime: StreamRuntime, one handle per plan, deliver() counting rows (RowBatch of JSON texts);
- direct: one Structured Streaming query computing the same windows for all plans the way one
  would write it in Spark: time windows with `window()` + watermark + append mode (stateful,
  exact); tuple windows (Spark has no count windows on streams) with `row_number` and a
  `ROWS BETWEEN size-1 PRECEDING AND CURRENT ROW` frame per micro-batch (windows spanning two
  batches are not computed: less work than exact windows need), results collected with
  toArrow.
Also printed: rows and bytes the driver receives per ingested tuple (Arrow), both sides.
`--standalone` starts a master and two workers (1 core, 1 GiB each) from pyspark on this
machine (stopped at the end) and runs the runtime there.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pep.core.plan import (Aggregate, ExecutionPlan, Field, Predicate, SourceSpec,  # noqa: E402
                           StreamDefinition, StreamSchema, WindowSpec)

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("temperature", "double"),
                       Field("rainrate", "double"), Field("station", "string")))
SPARK_SCHEMA = "ts timestamp, temperature double, rainrate double, station string, _xsg_seq long"
T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
TICK = 0.1  # seconds of event time between tuples
SHAPES = {"tuple-60/1": ("tuple", 60, 1), "time-60s/1s": ("time", 60, 1),
          "tuple-10/2": ("tuple", 10, 2)}
TRIGGER = 0.25
MAX_FILES = 50
AGGS = (Aggregate("rainrate", "avg"), Aggregate("temperature", "max"),
        Aggregate("temperature", "count"))


def make_backlog(directory: Path, n: int, per_file: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(0, n, per_file):
        lines = []
        for i in range(f, min(n, f + per_file)):
            ts = (T0 + timedelta(seconds=i * TICK)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            lines.append(json.dumps({"ts": ts, "temperature": round(15 + (i * 7919) % 200 / 10, 1),
                                     "rainrate": round((i * 104729) % 120 / 10, 1),
                                     "station": f"s{i % 25}", "_xsg_seq": i}))
        (directory / f"{f:012d}.json").write_text("\n".join(lines) + "\n")


def link_all(staging: Path, target: Path) -> None:
    for p in sorted(staging.iterdir()):
        os.link(p, target / p.name)


def expected_windows(shape: tuple, n: int) -> int:
    kind, size, step = shape
    if kind == "tuple":
        return (n - size) // step + 1 if n >= size else 0
    times = [(T0.timestamp() + i * TICK) for i in range(n)]
    watermark = times[-1]
    lo = math.floor(times[0] / step) * step - size
    count = 0
    k = lo
    i0 = 0
    while k + size <= watermark:
        while i0 < n and times[i0] < k:
            i0 += 1
        if i0 < n and times[i0] < k + size:
            count += 1
        k += step
    return count


def plans_for(name: str, shape: tuple, count: int) -> list[ExecutionPlan]:
    kind, size, step = shape
    window = WindowSpec(kind, size, step, AGGS, "ts" if kind == "time" else None)
    return [ExecutionPlan(name, ((Predicate("temperature", ">", -100.0 - i),),), (), window)
            for i in range(count)]


def run_runtime(spark, work: Path, staging: Path, shape: tuple, count: int, n: int,
                timeout: float) -> dict:
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    name = f"w{int(time.time() * 1000) % 10 ** 9}"
    src = work / name
    src.mkdir(parents=True)
    stream = StreamDefinition(name, "bench", SCHEMA, SourceSpec("ingest", (("path", str(src)),)),
                              time_attribute="ts")
    want = expected_windows(shape, n)
    got = [0] * count
    done = threading.Event()
    last = [0.0]
    lock = threading.Lock()
    finished = [0]

    def deliver_for(i: int):
        def deliver(batch) -> bool:
            with lock:
                before = got[i]
                got[i] += len(batch)
                last[0] = time.perf_counter()
                if before < want <= got[i]:
                    finished[0] += 1
                    if finished[0] == count:
                        done.set()
            return True
        return deliver
    rt = StreamRuntime(spark, work / f"rt-{name}", settings=RuntimeSettings(
        trigger_interval=TRIGGER, max_files_per_trigger=MAX_FILES, retention_seconds=None,
        retention_bytes=None))
    try:
        for i, plan in enumerate(plans_for(name, shape, count)):
            rt.attach_handle(f"h{i}", stream, plan, deliver_for(i))
        time.sleep(1.0)  # the query runs (empty batches) before the backlog appears
        started = time.perf_counter()
        link_all(staging, src)
        ok = done.wait(timeout)
        stats = rt.stats()[name]
    finally:
        rt.stop()
    elapsed = (last[0] or time.perf_counter()) - started
    rows_in = max(1, stats["rows_in"])
    return {"ok": ok, "rate": n / elapsed, "seconds": elapsed, "windows": sum(got),
            "want": want * count, "driver_rows": stats["driver_rows"] / rows_in,
            "driver_bytes": stats["driver_bytes"] / rows_in, "batches": stats["batches"]}


def run_direct(spark, work: Path, staging: Path, shape: tuple, count: int, n: int,
               timeout: float) -> dict:
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    kind, size, step = shape
    src = work / f"direct-{int(time.time() * 1000) % 10 ** 9}"
    src.mkdir(parents=True)
    frame = (spark.readStream.schema(SPARK_SCHEMA).option("maxFilesPerTrigger", MAX_FILES)
             .json(str(src)))
    ids = F.filter(F.array(*[F.when(F.col("temperature") > F.lit(-100.0 - i), F.lit(i))
                             for i in range(count)]), lambda x: x.isNotNull())
    exploded = frame.select(F.explode(ids).alias("pid"), "ts", "temperature", "rainrate",
                            "_xsg_seq")
    raw = [(F.avg("rainrate"), "avg_rainrate"), (F.max("temperature"), "max_temperature"),
           (F.count("temperature"), "count_temperature")]
    aggs = [f.alias(name) for f, name in raw]
    state = {"rows": 0, "bytes": 0, "windows": 0, "last": 0.0}
    want = expected_windows(shape, n) * count
    done = threading.Event()

    def collect(df, _id):
        arrow = df.toArrow()
        state["rows"] += arrow.num_rows
        state["bytes"] += arrow.nbytes
        state["windows"] += arrow.num_rows
        state["last"] = time.perf_counter()
        if kind == "time" and state["windows"] >= want:
            done.set()

    checkpoint = work / f"ck-{src.name}"
    if kind == "time":
        query = (exploded.withWatermark("ts", "0 seconds")
                 .groupBy("pid", F.window("ts", f"{size} seconds", f"{step} seconds"))
                 .agg(*aggs).writeStream.outputMode("append").foreachBatch(collect)
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(processingTime=f"{int(TRIGGER * 1000)} milliseconds").start())
    else:
        w = Window.partitionBy("pid").orderBy("_xsg_seq")
        frame_w = w.rowsBetween(-(size - 1), 0)

        def tuple_batch(df, _id):
            out = (df.select("pid", "rainrate", "temperature", F.row_number().over(w).alias("rn"),
                             *[f.over(frame_w).alias(name) for f, name in raw])
                   .where((F.col("rn") >= size) & ((F.col("rn") - size) % step == 0)))
            collect(out.drop("rainrate", "temperature"), _id)
        query = (exploded.writeStream.foreachBatch(tuple_batch)
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(processingTime=f"{int(TRIGGER * 1000)} milliseconds").start())
    try:
        time.sleep(1.0)
        started = time.perf_counter()
        link_all(staging, src)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not done.is_set():
            seen = sum(p.get("numInputRows", 0) for p in query.recentProgress)
            if kind == "tuple" and seen >= n and not query.status["isTriggerActive"]:
                break
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.1)
        ok = time.monotonic() < deadline
    finally:
        query.stop()
    elapsed = state["last"] - started
    return {"ok": ok, "rate": n / elapsed, "seconds": elapsed, "windows": state["windows"],
            "want": want, "driver_rows": state["rows"] / n, "driver_bytes": state["bytes"] / n}


def machine() -> str:
    load = os.getloadavg()
    return (f"{platform.node()}: {os.cpu_count()} cores, load average {load[0]:.1f} "
            f"{load[1]:.1f} {load[2]:.1f}")


class Standalone:
    """A master and two workers (1 core, 1 GiB each) started from pyspark; stopped by pid."""

    def __init__(self, work: Path) -> None:
        import pyspark
        self.spark_home = os.path.dirname(pyspark.__file__)
        self.dir = work / "standalone"
        self.dir.mkdir(parents=True)
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []

    def _start(self, name: str, *args: str, ready: str) -> None:
        env = dict(os.environ, SPARK_HOME=self.spark_home, SPARK_LOCAL_IP="127.0.0.1",
                   PYSPARK_PYTHON=sys.executable)
        log = open(self.dir / f"{name}.log", "w")
        proc = subprocess.Popen([os.path.join(self.spark_home, "bin", "spark-class"), *args],
                                stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        self.procs.append(proc)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if ready in (self.dir / f"{name}.log").read_text(errors="replace"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"{name} did not start; see {self.dir / name}.log")

    def start(self) -> str:
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(free_port()),
                    ready="I have been elected leader")
        for i in (1, 2):
            (self.dir / f"work{i}").mkdir()
            self._start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.url,
                        "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                        "--webui-port", str(free_port()), "--work-dir",
                        str(self.dir / f"work{i}"),
                        ready="Successfully registered with master")
        return self.url

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller backlog, a few minutes")
    parser.add_argument("--plans", default="1,10,100")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--tuples", type=int, default=None)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--standalone", action="store_true",
                        help="start a master and two workers here and run on them")
    parser.add_argument("--runtime-only", action="store_true", help="skip the direct query")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    n = args.tuples or (20_000 if args.quick else 100_000)
    per_file = 100 if args.quick else 200
    counts = [int(x) for x in args.plans.split(",")]
    shapes = [s for s in args.shapes.split(",") if s]
    from pep.runtime.session import create_spark_session
    with tempfile.TemporaryDirectory(prefix="xsg-bench-windows-") as tmp:
        work = Path(tmp)
        cluster = None
        master = args.master
        extra = {"spark.driver.memory": "3g"}
        try:
            if args.standalone:
                cluster = Standalone(work)
                master = cluster.start()
                extra.update({"spark.driver.host": "127.0.0.1",
                              "spark.driver.bindAddress": "127.0.0.1",
                              "spark.executor.memory": "900m", "spark.cores.max": "2"})
            started = time.perf_counter()
            spark = create_spark_session(master, "xsg-bench-windows", extra)
            print(f"Spark {spark.version} on {spark.sparkContext.master}; session + warm-up "
                  f"{time.perf_counter() - started:.1f} s; {machine()}")
            staging = work / "staging"
            make_backlog(staging, n, per_file)
            warm = work / "warm"
            make_backlog(warm, 2_000, per_file)
            print(f"backlog: {n:,} tuples in {n // per_file} files of {per_file} (event time "
                  f"{TICK} s apart), maxFilesPerTrigger {MAX_FILES}, trigger {TRIGGER} s; "
                  "every plan passes every tuple")
            print(f"{'shape':12s} {'plans':>5s}  {'runtime t/s':>12s} {'direct t/s':>11s} "
                  f"{'ratio':>6s}  {'windows':>10s}  driver rows/tuple (runtime, direct)  "
                  "driver bytes/tuple (runtime, direct)")
            for shape_name in shapes:
                shape = SHAPES[shape_name]
                # untimed: both sides once on a small backlog, so neither pays for the JVM's
                # first compilation of this shape's code
                run_runtime(spark, work, warm, shape, 2, 2_000, args.timeout)
                if not args.runtime_only:
                    run_direct(spark, work, warm, shape, 2, 2_000, args.timeout)
                for i, count in enumerate(counts):
                    def ours_trial():
                        return run_runtime(spark, work, staging, shape, count, n, args.timeout)

                    def direct_trial():
                        return None if args.runtime_only else run_direct(
                            spark, work, staging, shape, count, n, args.timeout)
                    if i % 2:  # alternate which side runs first
                        direct = direct_trial()
                        ours = ours_trial()
                    else:
                        ours = ours_trial()
                        direct = direct_trial()
                    ratio = f"{ours['rate'] / direct['rate']:.2f}" if direct else "-"
                    flag = "" if ours["ok"] and ours["windows"] == ours["want"] else \
                        f"  (runtime: {ours['windows']:,} of {ours['want']:,} windows!)"
                    print(f"{shape_name:12s} {count:5d}  {ours['rate']:12,.0f} "
                          f"{direct['rate'] if direct else float('nan'):11,.0f} {ratio:>6s}  "
                          f"{ours['windows']:10,d}  {ours['driver_rows']:8.3f} "
                          f"{direct['driver_rows'] if direct else float('nan'):8.3f}"
                          f"{'':21s}{ours['driver_bytes']:8.1f} "
                          f"{direct['driver_bytes'] if direct else float('nan'):8.1f}{flag}",
                          flush=True)
            print(f"done; {machine()}")
            spark.stop()
        finally:
            if cluster is not None:
                cluster.stop()


if __name__ == "__main__":
    main()
