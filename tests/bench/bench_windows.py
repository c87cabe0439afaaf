"""Window plans at saturation: the shared runtime against the direct Structured Streaming query
a user would write.

Run: .venv/bin/python tests/bench/bench_windows.py [--quick] [--trials 3] [--plans 1,10,100]
         [--shapes tuple-60/1,time-60s/1s,tuple-10/2] [--master URL | --standalone]

For each window shape and each number of distinct plans (the same window, different filter
constants, every tuple passing every plan: the most work per tuple), a backlog of files is
linked into an empty directory while the side's query already runs, and the time until the
last window of every plan has reached the driver gives tuples/s; the first window's wait is
reported too (the start of the run). Three sides (tests/bench/harness.py says why):
- runtime: StreamRuntime with the gateway's defaults (0.25 s trigger, 50 files per micro-batch),
  one handle per plan, deliver() counting rows (RowBatch of JSON texts);
- user: one Structured Streaming query computing the same windows for all plans the way one
  would write it in Spark, in an application of its own with Spark's defaults (no
  maxFilesPerTrigger, the default trigger, 200 shuffle partitions): time windows with
  `window()` + watermark + append mode (stateful, exact); tuple windows (Spark has no count
  windows on streams) with `row_number` and a `ROWS BETWEEN size-1 PRECEDING AND CURRENT ROW`
  frame per micro-batch (windows spanning two batches are not computed: less work than exact
  windows need), results collected with toArrow;
- gateway-settings: that query in the runtime's session with the gateway's trigger and cap.
Each shape first runs once on each side on a small backlog (the first runs after the start,
reported apart); then `--trials` trials per plan count, the sides' order rotating. A runtime
run that does not deliver every window has no rate. Also printed: rows and bytes the driver
receives per ingested tuple (Arrow), the runtime and the user's query.
`--standalone` starts a master and two workers (1 core, 1 GiB each) from pyspark on this
machine (stopped at the end) and runs the runtime and the gateway-settings query there.
"""
from __future__ import annotations

import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pep.core.plan import (
    Aggregate,
    ExecutionPlan,
    Field,
    Predicate,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
    WindowSpec,
)
from tests.bench.direct import (
    USER,
    DirectSides,
    Handler,
    UserApp,
    from_dict,
    gateway_settings,
    serve_user_app,
    started_user_app,
)
from tests.bench.harness import (
    INF,
    SIDE_NAMES,
    bench_parser,
    link_all,
    load_average,
    machine,
    ratio,
    rotations,
    run_command,
    secs,
    spread,
)
from tests.bench.served import started_spark

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("temperature", "double"),
                       Field("rainrate", "double"), Field("station", "string")))
SPARK_SCHEMA = "ts timestamp, temperature double, rainrate double, station string, _xsg_seq long"
T0 = datetime(2024, 5, 1, tzinfo=UTC)
TICK = 0.1  # seconds of event time between tuples
SHAPES = {"tuple-60/1": ("tuple", 60, 1), "time-60s/1s": ("time", 60, 1),
          "tuple-10/2": ("tuple", 10, 2)}
SIDES = ("runtime", "user", "gateway-settings")
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
    first = [0.0]
    last = [0.0]
    lock = threading.Lock()
    finished = [0]

    def deliver_for(i: int):
        def deliver(batch) -> bool:
            with lock:
                before = got[i]
                got[i] += len(batch)
                last[0] = time.perf_counter()
                first[0] = first[0] or last[0]
                if before < want <= got[i]:
                    finished[0] += 1
                    if finished[0] == count:
                        done.set()
            return True
        return deliver
    defaults = RuntimeSettings()
    rt = StreamRuntime(spark, work / f"rt-{name}", settings=RuntimeSettings(
        trigger_interval=defaults.trigger_interval,
        max_files_per_trigger=defaults.max_files_per_trigger, retention_seconds=None,
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
    complete = ok and sum(got) == want * count
    return {"complete": complete, "rate": n / elapsed if complete else 0.0,
            "first": (first[0] - started) if first[0] else INF, "windows": sum(got),
            "want": want * count, "driver_rows": stats["driver_rows"] / rows_in,
            "driver_bytes": stats["driver_bytes"] / rows_in, "batches": stats["batches"]}


def run_direct(spark, settings: dict, work: str, staging: str, shape: list, count: int, n: int,
               timeout: float) -> dict:
    """The direct query (in the user's application, or in the runtime's session)."""
    from pyspark.sql import Window, functions as F
    qs = from_dict(settings)
    kind, size, step = shape
    src = Path(work) / f"direct-{int(time.time() * 1000) % 10 ** 9}"
    src.mkdir(parents=True)
    frame = qs.source(spark.readStream.schema(SPARK_SCHEMA), "files").json(str(src))
    ids = F.filter(F.array(*[F.when(F.col("temperature") > F.lit(-100.0 - i), F.lit(i))
                             for i in range(count)]), lambda x: x.isNotNull())
    exploded = frame.select(F.explode(ids).alias("pid"), "ts", "temperature", "rainrate",
                            "_xsg_seq")
    raw = [(F.avg("rainrate"), "avg_rainrate"), (F.max("temperature"), "max_temperature"),
           (F.count("temperature"), "count_temperature")]
    aggs = [f.alias(name) for f, name in raw]
    state = {"rows": 0, "bytes": 0, "windows": 0, "first": 0.0, "last": 0.0}
    want = expected_windows(tuple(shape), n) * count
    done = threading.Event()

    def collect(df, _id):
        arrow = df.toArrow()
        state["rows"] += arrow.num_rows
        state["bytes"] += arrow.nbytes
        state["windows"] += arrow.num_rows
        if arrow.num_rows:
            state["last"] = time.perf_counter()
            state["first"] = state["first"] or state["last"]
        if kind == "time" and state["windows"] >= want:
            done.set()

    checkpoint = Path(work) / f"ck-{src.name}"
    if kind == "time":
        writer = (exploded.withWatermark("ts", "0 seconds")
                  .groupBy("pid", F.window("ts", f"{size} seconds", f"{step} seconds"))
                  .agg(*aggs).writeStream.outputMode("append").foreachBatch(collect)
                  .option("checkpointLocation", str(checkpoint)))
    else:
        w = Window.partitionBy("pid").orderBy("_xsg_seq")
        frame_w = w.rowsBetween(-(size - 1), 0)

        def tuple_batch(df, _id):
            out = (df.select("pid", "rainrate", "temperature", F.row_number().over(w).alias("rn"),
                             *[f.over(frame_w).alias(name) for f, name in raw])
                   .where((F.col("rn") >= size) & ((F.col("rn") - size) % step == 0)))
            collect(out.drop("rainrate", "temperature"), _id)
        writer = (exploded.writeStream.foreachBatch(tuple_batch)
                  .option("checkpointLocation", str(checkpoint)))
    query = qs.trigger_on(writer).start()
    try:
        time.sleep(1.0)
        started = time.perf_counter()
        link_all(Path(staging), src)
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
    return {"complete": ok, "rate": n / elapsed if ok and state["last"] else 0.0,
            "first": (state["first"] - started) if state["first"] else INF,
            "windows": state["windows"], "want": want, "driver_rows": state["rows"] / n,
            "driver_bytes": state["bytes"] / n}


USER_APP: dict[str, Handler] = {"windows": run_direct}


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
    if run_command({"--user-app": (lambda: serve_user_app(USER_APP), ())}):
        return
    parser = bench_parser("a smoke run: a smaller backlog, 1 plan, one trial")
    parser.add_argument("--plans", default=None, help="plan counts (default 1,10,100)")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--tuples", type=int, default=None)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--standalone", action="store_true",
                        help="start a master and two workers here and run on them")
    parser.add_argument("--runtime-only", action="store_true", help="skip the direct queries")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    n = args.tuples or (20_000 if args.quick else 100_000)
    per_file = 100 if args.quick else 200
    trials = 1 if args.quick else args.trials
    counts = [int(x) for x in (args.plans or ("1" if args.quick else "1,10,100")).split(",")]
    shapes = [s for s in args.shapes.split(",") if s and SHAPES[s]]
    print("machine:", machine())
    with tempfile.TemporaryDirectory(prefix="xsg-bench-windows-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        master = args.master
        extra = {"spark.driver.memory": "3g"}
        if args.standalone:
            cluster = Standalone(work)
            stack.callback(cluster.stop)
            master = cluster.start()
            extra.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                          "spark.executor.memory": "900m", "spark.cores.max": "2"})
        spark = started_spark(stack, master, "xsg-bench-windows", extra)
        app = None if args.runtime_only else started_user_app(stack, __file__)
        bench = Bench(spark, app, work, args.timeout)
        make_backlog(bench.staging, n, per_file)
        make_backlog(bench.warm, 2_000, per_file)
        print(f"backlog: {n:,} tuples in {n // per_file} files of {per_file} (event time "
              f"{TICK} s apart); every plan passes every tuple; sides: runtime (its defaults); "
              f"{SIDE_NAMES['user']} ({USER.describe()}, an application of its own); "
              f"{SIDE_NAMES['gateway-settings']} ({gateway_settings().describe()}, in the "
              f"runtime's session); {trials} trial(s), the sides' order rotating")
        results = [(name, count, bench.compare(name, count, n, trials))
                   for name in shapes for count in ([0] + counts)]
    summary([r for r in results if r[1]], n, args.runtime_only)
    print("load average at the end:", load_average())


class Bench:
    def __init__(self, spark: Any, app: UserApp | None, work: Path, timeout: float) -> None:
        self.spark, self.work, self.timeout = spark, work, timeout
        self.sides = ("runtime",) if app is None else SIDES
        self.direct = DirectSides(spark, app, USER_APP)
        self.staging, self.warm = work / "staging", work / "warm"

    def run(self, side: str, backlog: Path, shape: tuple, count: int, tuples: int) -> dict:
        if side == "runtime":
            return run_runtime(self.spark, self.work, backlog, shape, count, tuples, self.timeout)
        return self.direct.run(side, "windows", wait=self.timeout + 300, work=str(self.work),
                               staging=str(backlog), shape=list(shape), count=count, n=tuples,
                               timeout=self.timeout)

    def compare(self, name: str, count: int, n: int, trials: int) -> dict[str, list[dict]]:
        """`trials` trials of `count` plans of the window shape `name`, rotating; count 0: each
        side once on the small backlog (its first run of this shape's code; for the first shape
        its first run after the start), reported apart."""
        shape = SHAPES[name]
        if not count:
            first = {side: self.run(side, self.warm, shape, 2, 2_000) for side in self.sides}
            print(f"{name}: first runs (2 plans, 2,000 tuples): " + "; ".join(
                f"{SIDE_NAMES[s]} {first[s]['rate']:,.0f} tuples/s, first window after "
                f"{secs(first[s]['first'])}" for s in self.sides))
            return {s: [first[s]] for s in self.sides}
        runs: dict[str, list[dict]] = {s: [] for s in self.sides}
        for k, order in enumerate(rotations(self.sides, trials)):
            for side in order:
                res = self.run(side, self.staging, shape, count, n)
                runs[side].append(res)
                flag = "" if res["complete"] else \
                    f" (no finish: {res['windows']:,} of {res['want']:,} windows)"
                print(f"  {name} {count:>3} plans, trial {k + 1}, {SIDE_NAMES[side]:32s} "
                      f"{res['rate']:9,.0f} tuples/s, first window after {secs(res['first'])}, "
                      f"{res['windows']:,} windows{flag}")
        return runs


def summary(results: list[tuple[str, int, dict[str, list[dict]]]], n: int,
            runtime_only: bool) -> None:
    print(f"\nsummary: tuples/s, median of the trials (lowest-highest); {n:,} tuples")
    for name, count, runs in results:
        med = {s: statistics.median(r["rate"] for r in runs[s]) for s in runs}
        line = f"  {name:12s} {count:>3} plans: " + "; ".join(
            f"{SIDE_NAMES[s]} {spread([r['rate'] for r in runs[s]])}" for s in runs)
        if not runtime_only:
            line += (f"; runtime / user {ratio(med['runtime'], med['user'])}, runtime / "
                     f"gateway-settings {ratio(med['runtime'], med['gateway-settings'])}; driver "
                     f"rows/tuple {runs['runtime'][0]['driver_rows']:.3f} against "
                     f"{runs['user'][0]['driver_rows']:.3f}")
        print(line)


if __name__ == "__main__":
    main()
