"""The shared-query runtime (no HTTP: readers are callbacks in its process) against the direct
Spark query a user would write on the same source.

Run: .venv/bin/python tests/bench/bench_runtime.py [--quick] [--trials 3] [--handles 100,500,1000]

Three sides (tests/bench/harness.py says why): the runtime (StreamRuntime with the gateway's
defaults, in this process's SparkSession as the gateway makes it); the direct query as a user
writes it (readStream json, the same filter and projection, each micro-batch's rows brought to
the driver with `toArrow()`) in an application of its own with Spark's defaults (no
maxFilesPerTrigger, the default trigger); and that query in this session with the gateway's
settings (0.25 s trigger, 50 files per micro-batch). Files are written by a process of its own.
1. first row (start-up): the runtime's attach -> first row against the direct query's start ->
   first row, on a fresh directory that a writer fills (20 records every 0.1 s). A first round
   right after the applications started, then `--trials` rounds, the sides' order rotating. A
   direct query reads the files already there; a handle starts at its stream's end and waits for
   a file written after it attached. No first row within 60 s counts as never.
2. throughput (steady state): a backlog of files (half the records pass `temp > 15`) linked at
   once into an empty directory the side's query already runs on; from the link to the last row.
   Each side's first run apart, then `--trials` trials, rotating. A run in which a row never
   arrives has no rate.
3. p50/p95 tuple latency with 100 / 500 / 1,000 handles of different filters: a writer process
   writes 200 records/s; latency from the record's write to its callback, every row a handle's
   filter passes counted (one that never arrives: infinitely late), the first `--startup`
   seconds apart from the rest.
"""
from __future__ import annotations

import bisect
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.direct import (
    FILE_QUERY,
    USER,
    DirectSides,
    UserApp,
    gateway_settings,
    serve_user_app,
    started_user_app,
)
from tests.bench.harness import (
    INF,
    SIDE_NAMES,
    Child,
    backlog_figures,
    backlog_summary,
    backlog_trials,
    bench_parser,
    latency_line,
    link_all,
    load_average,
    machine,
    ratio,
    reply,
    rotations,
    run_command,
    secs,
    sleep_until,
    spread,
)
from tests.bench.served import started_spark

SPARK_SCHEMA = "seq long, sent double, temp double, station string, _xsg_seq long"
CONDITION = ("temp", ">", 15.0)  # temp is uniform in -10..40: half the records pass
SIDES = ("runtime", "user", "gateway-settings")
FIRST_ROW_TIMEOUT = 60.0


def records(start: int, count: int, rnd: random.Random) -> list[dict[str, Any]]:
    now = time.time()
    return [{"seq": i, "sent": now, "temp": round(rnd.uniform(-10, 40), 2),
             "station": f"s{i % 20}", "_xsg_seq": i} for i in range(start, start + count)]


def write_file(directory: Path, name: str, rows: list[dict[str, Any]]) -> None:
    tmp = directory / f".{name}.tmp"
    tmp.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    os.replace(tmp, directory / name)


def writer_main(directory: str, per_file: int, period: float, seconds: float, seed: int,
                start_at: float) -> None:
    """From `start_at`, a file of `per_file` records every `period` s, for `seconds` or until
    SIGTERM; records stamped `sent` when written."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    rnd = random.Random(seed)
    sleep_until(start_at)
    n = 0
    written: list[tuple[float, float, str]] = []
    start = time.monotonic()
    while not stop.is_set() and time.monotonic() - start < seconds:
        rows = records(n * per_file, per_file, rnd)
        write_file(Path(directory), f"w{n:06d}.json", rows)
        written.extend((r["sent"], r["temp"], r["station"]) for r in rows)
        n += 1
        stop.wait(max(0.0, start + n * period - time.monotonic()))
    # what was written (the runtime moves the files it has read to its archive)
    reply({"files": n, "rows": written})


def writer(directory: Path, per_file: int, period: float, seconds: float = 900.0,
           seed: int = 1, start_at: float = 0.0) -> Child:
    return Child(__file__, ["--write", directory, per_file, period, seconds, seed, start_at])


def stream(directory: Path, name: str) -> Any:
    from pep.core.plan import Field, SourceSpec, StreamDefinition, StreamSchema
    schema = StreamSchema((Field("seq", "long"), Field("sent", "double"), Field("temp", "double"),
                           Field("station", "string")))
    return StreamDefinition(name, "bench", schema,
                            SourceSpec("ingest", (("path", str(directory)),)))


# -- the direct query: tests/bench/harness.py's FileQuery ------------------------------------------

def direct_args() -> dict[str, Any]:
    col, op, value = CONDITION
    return {"schema": SPARK_SCHEMA, "condition": f"{col} {op} {value}", "columns": ["seq", "temp"]}


# -- the runtime -----------------------------------------------------------------------------------

def plan(name: str, lo: float = CONDITION[2], station: str | None = None) -> Any:
    from pep.core.plan import ExecutionPlan, Predicate
    if station is None:
        return ExecutionPlan(name, ((Predicate("temp", ">", lo),),), ("seq", "temp"))
    return ExecutionPlan(name, ((Predicate("temp", ">", lo), Predicate("station", "!=", station)),
                                (Predicate("seq", "<", 0),)), ("seq", "sent", "temp"))


def runtime_first_row(spark: Any, work: Path, directory: Path, name: str) -> dict[str, Any]:
    from pep.runtime.runtime import StreamRuntime
    got: list[float] = []
    done = threading.Event()

    def deliver(rows: Any) -> bool:
        if not got:
            got.append(time.time())
            done.set()
        return True
    rt = StreamRuntime(spark, work)
    try:
        started = time.time()
        rt.attach_handle("h", stream(directory, name), plan(name), deliver)
        done.wait(FIRST_ROW_TIMEOUT)
    finally:
        rt.stop()
    return {"first": (got[0] - started) if got else INF}


def runtime_backlog(spark: Any, work: Path, staging: Path, directory: Path,
                    expected: int) -> dict[str, Any]:
    from pep.runtime.runtime import StreamRuntime
    state: dict[str, Any] = {"rows": 0, "first": None, "last": None}
    done = threading.Event()

    def deliver(rows: Any) -> bool:
        now = time.time()
        state["rows"] += len(rows)
        state["first"] = state["first"] or now
        state["last"] = now
        if state["rows"] >= expected:
            done.set()
        return True
    directory.mkdir(parents=True)
    rt = StreamRuntime(spark, work)
    try:
        rt.attach_handle("h", stream(directory, directory.name), plan(directory.name), deliver)
        time.sleep(1.0)
        start = time.time()
        link_all(staging, directory)
        done.wait(600)
    finally:
        rt.stop()
    return {**state, "start": start}


# -- the phases ------------------------------------------------------------------------------------

class Bench:
    def __init__(self, spark: Any, app: UserApp, work: Path) -> None:
        self.spark, self.app, self.work = spark, app, work
        self.sides = DirectSides(spark, app, FILE_QUERY)
        self.count = 0

    def fresh(self, name: str) -> Path:
        self.count += 1
        return self.work / f"{name}-{self.count}"

    def direct(self, side: str, op: str, **args: Any) -> dict[str, Any]:
        return self.sides.run(side, op, **direct_args(), **args)


def first_row(bench: Bench, trials: int) -> dict[str, Any]:
    print(f"\n1. first row: a first round right after the applications started, then {trials} "
          "trial(s), the sides' order rotating")
    runs: dict[str, list[float]] = {s: [] for s in SIDES}
    fresh: dict[str, float] = {}
    for k, order in enumerate([SIDES, *rotations(SIDES, trials)]):
        directory = bench.fresh("live")
        directory.mkdir()
        w = writer(directory, 20, 0.1)
        try:
            time.sleep(1.0)  # a few files before the first query
            got = {}
            for side in order:
                if side == "runtime":
                    got[side] = runtime_first_row(bench.spark, bench.fresh("rt"), directory,
                                                  directory.name)["first"]
                else:
                    got[side] = bench.direct(side, "first_row", directory=str(directory))["first"]
        finally:
            w.stop()
        print(f"  {'after a fresh start' if k == 0 else f'trial {k}'}: "
              + ", ".join(f"{SIDE_NAMES[s]} {secs(got[s])}" for s in SIDES))
        for s in SIDES:
            if k == 0:
                fresh[s] = got[s]
            else:
                runs[s].append(got[s])
    return {"runs": runs, "fresh": fresh}


def stage(directory: Path, files: int, per_file: int) -> int:
    """The backlog's files; returns how many records pass the filter."""
    directory.mkdir(parents=True)
    rnd = random.Random(7)
    passing = 0
    for n in range(files):
        rows = records(n * per_file, per_file, rnd)
        passing += sum(r["temp"] > CONDITION[2] for r in rows)
        write_file(directory, f"b{n:05d}.json", rows)
    return passing


def throughput(bench: Bench, files: int, per_file: int, trials: int) -> dict[str, Any]:
    staging = bench.work / "backlog-staging"
    expected = stage(staging, files, per_file)
    print(f"\n2. throughput: a backlog of {files * per_file:,} records in {files} files, "
          f"{expected:,} pass")

    def run(side: str) -> dict[str, Any]:
        directory = bench.fresh(f"backlog-{side}")
        if side == "runtime":
            res = runtime_backlog(bench.spark, bench.fresh("rt-tp"), staging, directory, expected)
        else:
            res = bench.direct(side, "backlog", staging=str(staging), directory=str(directory),
                               expected=expected)
        return backlog_figures(res, expected)
    return backlog_trials(run, SIDES, trials, "the link")


def owed(written: list[list[Any]], los: list[float], phases: list[tuple[float, float]]
         ) -> list[int]:
    """Rows the handles (filter temp > lo AND station != s<h % 20>) are owed per phase, from the
    records the writer wrote (sent, temp, station)."""
    every = sorted(los)
    by_station: dict[str, list[float]] = {}
    for h, lo in enumerate(los):
        by_station.setdefault(f"s{h % 20}", []).append(lo)
    for v in by_station.values():
        v.sort()
    out = [0] * len(phases)
    for sent, temp, station in written:
        k = next((i for i, (a, b) in enumerate(phases) if a <= sent < b), None)
        if k is not None:
            out[k] += (bisect.bisect_left(every, temp)
                       - bisect.bisect_left(by_station.get(station, []), temp))
    return out


def concurrency(bench: Bench, n_handles: int, seconds: float, startup: float,
                rate: int) -> dict[str, Any]:
    """N handles of different filters; latency from a record's write to its callback."""
    from pep.runtime.runtime import StreamRuntime
    directory = bench.fresh(f"conc{n_handles}")
    directory.mkdir()
    phases: list[tuple[float, float]] = []  # set once the handles are attached
    lat: list[list[float]] = [[], []]
    lock = threading.Lock()

    def deliver(batch: Any) -> bool:  # a RowBatch: one JSON text per row, keys in plan order
        now = time.time()
        sent = [float(t.split(',"sent":', 1)[1].split(",", 1)[0]) for t in batch.rows]
        with lock:
            for s in sent:
                for k, (a, b) in enumerate(phases):
                    if a <= s < b:
                        lat[k].append(now - s)
        return True
    rt = StreamRuntime(bench.spark, bench.fresh(f"rt-c{n_handles}"))
    sd = stream(directory, directory.name)
    rnd = random.Random(n_handles)
    los = [rnd.uniform(-10, 35) for _ in range(n_handles)]
    attach_times = []
    try:
        for h, lo in enumerate(los):
            t = time.perf_counter()
            rt.attach_handle(f"h{h}", sd, plan(sd.name, lo, f"s{h % 20}"), deliver)
            attach_times.append(time.perf_counter() - t)
        per_file = max(1, int(rate * 0.25))
        start_at = time.time() + 2.0  # the query settles; the writer process starts
        phases[:] = [(start_at, start_at + startup), (start_at + startup, start_at + seconds + 1)]
        w = writer(directory, per_file, 0.25, seconds, seed=n_handles, start_at=start_at)
        written = w.result(seconds + 120)["rows"]
        time.sleep(3.0)  # the last rows; later ones count as never arrived
        stats = rt.stats()[sd.name]
    finally:
        rt.stop()
    want = owed(written, los, phases)
    with lock:
        got = [list(x) for x in lat]
    for k, label in enumerate((f"start-up (first {startup:.0f} s)", "steady")):
        print(f"  {n_handles:5d} handles, {label}: {latency_line(got[k], want[k])}")
    print(f"        {stats['batches']} batches (last {stats['last_batch_ms']} ms), plans "
          f"{stats['plans']}, attach median {statistics.median(attach_times) * 1000:.1f} ms "
          f"(first {attach_times[0] * 1000:.0f} ms)")
    return {"lat": got, "want": want}


def main() -> None:
    if run_command({"--user-app": (lambda: serve_user_app(FILE_QUERY), ()),
                    "--write": (writer_main, (str, int, float, float, int, float))}):
        return
    parser = bench_parser("a smoke run (one trial, smaller sizes)")
    parser.add_argument("--handles", default="100,500,1000")
    parser.add_argument("--seconds", type=float, default=20.0, help="latency run per size")
    parser.add_argument("--startup", type=float, default=5.0,
                        help="a latency run's first seconds, reported as start-up")
    args = parser.parse_args()
    trials = 1 if args.quick else args.trials
    seconds, startup = (8.0, 4.0) if args.quick else (args.seconds, args.startup)
    print("machine:", machine())
    print(f"sides: the runtime (its defaults); {SIDE_NAMES['user']} ({USER.describe()}, an "
          f"application of its own); {SIDE_NAMES['gateway-settings']} "
          f"({gateway_settings().describe()}, in the runtime's session)")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="xsg-bench-") as tmp, ExitStack() as stack:
        bench = Bench(started_spark(stack), started_user_app(stack, __file__), Path(tmp))
        results["first"] = first_row(bench, trials)
        results["tp"] = throughput(bench, 40 if args.quick else 200, 500, trials)
        print(f"\n3. tuple latency, 200 records/s for {seconds:.0f} s, every row owed counted")
        results["conc"] = {n: concurrency(bench, n, seconds, startup, 200)
                           for n in (int(x) for x in args.handles.split(","))}
    summary(results)
    print("load average at the end:", load_average())


def summary(results: dict[str, Any]) -> None:
    from tests.bench.harness import pct, with_missing
    print("\nsummary (median of the trials, lowest-highest)")
    first = results["first"]
    med = {s: statistics.median(first["runs"][s]) for s in SIDES}
    print("  first row (s): " + "; ".join(
        f"{SIDE_NAMES[s]} {spread(first['runs'][s], '{:.3f}')} (fresh {secs(first['fresh'][s])})"
        for s in SIDES))
    print(f"    runtime / {SIDE_NAMES['user']} {ratio(med['runtime'], med['user'])}, runtime / "
          f"{SIDE_NAMES['gateway-settings']} {ratio(med['runtime'], med['gateway-settings'])}")
    backlog_summary(results["tp"], SIDES, "from the link to the last row")
    for n, res in results["conc"].items():
        p95 = [pct(with_missing(res["lat"][k], res["want"][k]), 95) for k in range(2)]
        print(f"  {n:5d} handles: p95 start-up {secs(p95[0])}, steady {secs(p95[1])}")


if __name__ == "__main__":
    main()
