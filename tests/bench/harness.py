"""What the benchmarks that set the gateway beside a direct Spark query share, so that each
measures the same way: the machine line, percentiles in which a row that never arrived counts
as infinitely late, alternating trials, the gateway as `xsg serve` runs it, the reader process
(NDJSON over raw sockets), and the direct query as a user would run it.

The rules these implement (issue 45, "Benchmarks that measure what a user sees"):
- every ratio is against the query a user would write, with Spark's defaults: an application
  of its own (`UserApp`: its own process, JVM and SparkSession, nothing set but the Kafka
  connector's jars), no per-trigger cap, Spark's default trigger (the next micro-batch as soon
  as one ends); beside it the same query in the gateway's session with the gateway's per-query
  settings (`gateway_settings()`: its trigger interval and caps), to show what they cost;
- start-up (the first seconds after a fresh start) and steady state are separate figures;
- a row that never arrives counts as infinitely late (`with_missing`);
- producers and readers run in processes of their own (`start_reader`, `run_child`);
- at least three trials, the order of the sides rotating (`rotations`).

`python tests/bench/harness.py --read JOB` is the reader process (see `ReadJob`).
"""
from __future__ import annotations

import json
import os
import platform
import queue
import re
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

INF = float("inf")
T = TypeVar("T")
# the sides of a comparison (see the module's docstring)
SIDE_NAMES = {"gateway": "gateway", "runtime": "runtime", "user": "direct, Spark's defaults",
              "gateway-settings": "direct, the gateway's settings"}
FINAL_EVENTS = ("revoked", "released", "ended", "shutdown")


# -- the machine -----------------------------------------------------------------------------------

def load_average() -> str:
    return " ".join("%.2f" % x for x in os.getloadavg())


def machine() -> str:
    """The machine line every benchmark prints first: the host under this project's VM has
    changed between sessions, and the figures with it; the load average is the one before the
    run (other work on the two cores skews every figure)."""
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import pyspark
        spark = f"PySpark {pyspark.__version__}"
    except ImportError:
        spark = "no PySpark"
    return (f"{platform.platform()}; CPU {model}; {os.cpu_count()} cores; Python "
            f"{platform.python_version()}; {spark}; load average {load_average()}")


# -- figures -----------------------------------------------------------------------------------------

def pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank); inf counts as a value (a row that never arrived);
    nan for no values."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))] if s else float("nan")


def with_missing(latencies: list[float], expected: int) -> list[float]:
    """`latencies` and one inf for every expected row that did not arrive."""
    return latencies + [INF] * max(0, expected - len(latencies))


def secs(x: float, unit: str = "s") -> str:
    """A duration for a table: "never" for inf (a row that did not arrive)."""
    if x != x:
        return "n/a"
    if x == INF:
        return "never"
    return f"{x * 1000:.0f} ms" if unit == "ms" else f"{x:.3f} s"


def latency_line(lat: list[float], expected: int, unit: str = "s") -> str:
    """p50/p95/p99/max over every expected row, those that never arrived infinitely late."""
    full = with_missing(lat, expected)
    missing = max(0, expected - len(lat))
    return (f"p50 {secs(pct(full, 50), unit)}, p95 {secs(pct(full, 95), unit)}, p99 "
            f"{secs(pct(full, 99), unit)}, max {secs(max(full) if full else float('nan'), unit)}"
            f" over {expected:,} rows ({missing:,} never arrived)")


def spread(values: Iterable[float], fmt: str = "{:,.0f}") -> str:
    """"median (lowest-highest)" of the trials."""
    v = [x for x in values if x == x]
    if not v:
        return "n/a"
    med = fmt.format(statistics.median(v))
    return med if len(v) == 1 else f"{med} ({fmt.format(min(v))}-{fmt.format(max(v))})"


def ratio(a: float, b: float) -> str:
    if not (a == a and b == b) or b == 0:
        return "n/a"
    return f"{a / b:.2f}"


def backlog_figures(res: dict[str, Any], expected: int) -> dict[str, Any]:
    """A backlog run's figures from its times (epoch seconds: `start` the backlog's first record
    or file, `first` and `last` row read) and `rows` read: rows/s from start to the last row (0
    when a row never arrived, or was lost: no finish), the first row's wait (start-up; inf if
    none came) and the rate from the first row to the last (nan when all came at once)."""
    complete = res["rows"] >= expected and not res.get("lost")
    start, first, last = res["start"], res["first"], res["last"]
    return {**res, "expected": expected, "complete": complete,
            "rate": expected / (last - start) if complete and last else 0.0,
            "first_row": (first - start) if first else INF,
            "steady": (res["rows"] - 1) / (last - first) if first and last and last > first
            else float("nan")}


def backlog_line(name: str, t: dict[str, Any], since: str) -> str:
    """One line for a backlog run (`backlog_figures`); `since`: what its start was."""
    rate = (f"{t['rate']:,.0f} rows/s" if t["complete"] else
            f"no finish: {t['rows']:,} of {t['expected']:,} rows arrived "
            f"({t.get('lost') or 0} lost)")
    then = (f"then {t['steady']:,.0f} rows/s" if t["steady"] == t["steady"]
            else "all in one micro-batch")
    if t.get("batches"):
        then += f" ({t['batches']} micro-batches with rows)"
    return (f"{name:32s} {rate}; first row {secs(t['first_row'])} after {since}, {then}"
            + (f"; executor {t['split']}" if t.get("split") else "")
            + (f"; errors {t['errors']}" if t.get("errors") else ""))


def backlog_trials(run: Callable[[str], dict[str, Any]], sides: Sequence[str], trials: int,
                   since: str, names: dict[str, str] = SIDE_NAMES) -> dict[str, Any]:
    """Each side's first run (start-up), then `trials` trials in rotating order (steady state),
    each run printed: {"first": {side: figures}, "runs": {side: [figures]}}."""
    print("  start-up: each side's first run")
    first = {}
    for side in sides:
        first[side] = run(side)
        print("  " + backlog_line(names[side], first[side], since))
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    print(f"  steady state: {trials} trial(s), the order rotating")
    for k, order in enumerate(rotations(sides, trials)):
        for side in order:
            runs[side].append(run(side))
            print(f"  trial {k + 1} " + backlog_line(names[side], runs[side][-1], since))
    return {"first": first, "runs": runs}


def backlog_summary(tp: dict[str, Any], sides: Sequence[str], what: str,
                    names: dict[str, str] = SIDE_NAMES) -> None:
    """The medians of `backlog_trials`' figures and the ratios of the first side (the gateway or
    the runtime) to the user's query and to the query with the gateway's settings."""
    rate = {s: [t["rate"] for t in tp["runs"][s]] for s in sides}
    med = {s: statistics.median(rate[s]) for s in sides}
    print(f"  throughput, rows/s {what}")
    for s in sides:
        print(f"    {names[s]:32s} {spread(rate[s])}; first run {tp['first'][s]['rate']:,.0f}, "
              f"its first row after {secs(tp['first'][s]['first_row'])}")
    ours = sides[0]
    print(f"    {ours} / {names['user']}: {ratio(med[ours], med['user'])}; {ours} / "
          f"{names['gateway-settings']}: {ratio(med[ours], med['gateway-settings'])}; the "
          f"settings' cost ({names['gateway-settings']} / user): "
          f"{ratio(med['gateway-settings'], med['user'])}")


def rotations(sides: Sequence[T], trials: int) -> list[tuple[T, ...]]:
    """The order of the sides in each trial: trial k starts with side k (mod the sides), so no
    side always runs first, after the same neighbour, or on the warmest JVM."""
    n = len(sides)
    return [tuple(sides[(k + i) % n] for i in range(n)) for k in range(trials)]


# -- child processes -----------------------------------------------------------------------------------

def reply(obj: dict[str, Any]) -> None:
    """A child's answer to its parent: one line of JSON on stdout, marked (the JVM or a library
    may write other lines there)."""
    print("@@" + json.dumps(obj), flush=True)


def last_reply(text: str) -> dict[str, Any] | None:
    lines = [ln for ln in text.splitlines() if ln.startswith("@@")]
    return json.loads(lines[-1][2:]) if lines else None


def run_child(script: str | Path, args: Sequence[object], timeout: float = 600.0,
              echo: bool = False) -> dict[str, Any]:
    """Run `python script args...` (a producer, an ingest, a whole trial) and return its answer;
    with `echo` its other output lines are printed as they come (a trial's report)."""
    cmd = [sys.executable, str(script), *map(str, args)]
    if not echo:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
        got = last_reply(out.stdout)
        if out.returncode != 0 or got is None:
            raise RuntimeError(f"{Path(script).name} {' '.join(map(str, args))[:200]} failed "
                               f"({out.returncode}): {out.stderr[-1500:]}")
        return got
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    got = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("@@"):
                got = json.loads(line[2:])
            else:
                print(line, end="", flush=True)
        proc.wait()
    finally:
        timer.cancel()
    if proc.returncode != 0 or got is None:
        raise RuntimeError(f"{Path(script).name} {' '.join(map(str, args))[:200]} failed "
                           f"({proc.returncode})")
    return got


class Child:
    """A child started now and answering later (`result()`), e.g. a producer that runs while the
    parent waits for rows."""

    def __init__(self, script: str | Path, args: Sequence[object]) -> None:
        self.out = tempfile.TemporaryFile(mode="w+")
        self.err = tempfile.TemporaryFile(mode="w+")
        self.args = [str(a) for a in args]
        self.proc = subprocess.Popen([sys.executable, str(script), *self.args], stdout=self.out,
                                     stderr=self.err, stdin=subprocess.DEVNULL, text=True)

    def result(self, timeout: float = 600.0) -> dict[str, Any]:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.out.seek(0)
        self.err.seek(0)
        got = last_reply(self.out.read())
        if got is None:
            raise RuntimeError(f"child {' '.join(self.args)[:200]} gave no answer "
                               f"({self.proc.returncode}): {self.err.read()[-1500:]}")
        return got

    def stop(self, timeout: float = 60.0) -> dict[str, Any]:
        """SIGTERM (a child that runs until told, e.g. an ingest), then its answer."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.result(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


Command = tuple[Callable[..., Any], tuple[Callable[[str], Any], ...]]


def run_command(commands: dict[str, Command]) -> bool:
    """When this process was started as one of a benchmark's children (`script --role args...`:
    a producer, an ingest, a writer, the user's application), run that role with its arguments
    converted, and say so."""
    role = sys.argv[1] if len(sys.argv) > 1 else None
    if role not in commands:
        return False
    fn, kinds = commands[role]
    fn(*(kind(arg) for kind, arg in zip(kinds, sys.argv[2:], strict=True)))
    return True


def bench_parser(quick: str, trials: str = "trials, the sides' order rotating") -> Any:
    """The command line every such benchmark has (`--quick`: a smoke run of a couple of minutes,
    `--trials`, at least three for figures), its output line-buffered (the figures stay in
    order with Spark's lines on stderr)."""
    import argparse
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--trials", type=int, default=3, help=f"{trials} (default 3)")
    return parser


def sleep_until(epoch: float) -> None:
    pause = epoch - time.time()
    if pause > 0:
        time.sleep(pause)


# -- the direct query: a user's, or with the gateway's settings ---------------------------------------

@dataclass(frozen=True)
class QuerySettings:
    """The per-query settings of a direct query. All None: Spark's defaults (no cap on what a
    micro-batch reads; the default trigger, each micro-batch as soon as the last has ended)."""

    name: str
    trigger: float | None = None
    max_files: int | None = None
    max_offsets: int | None = None

    def source(self, reader: Any, kind: str) -> Any:
        """`reader` (a DataStreamReader of `kind` "files" or "kafka") with the caps."""
        if kind == "files" and self.max_files is not None:
            reader = reader.option("maxFilesPerTrigger", str(self.max_files))
        if kind == "kafka" and self.max_offsets is not None:
            reader = reader.option("maxOffsetsPerTrigger", str(self.max_offsets))
        return reader

    def trigger_on(self, writer: Any) -> Any:
        if self.trigger is None:
            return writer
        return writer.trigger(processingTime=f"{int(round(self.trigger * 1000))} milliseconds")

    def describe(self) -> str:
        if self.trigger is None and self.max_files is None and self.max_offsets is None:
            return "Spark's defaults: no cap per micro-batch, the default trigger"
        return (f"trigger {self.trigger} s, maxFilesPerTrigger {self.max_files}, "
                f"maxOffsetsPerTrigger {self.max_offsets}")


USER = QuerySettings("user")


def gateway_settings() -> QuerySettings:
    """The gateway's own per-query settings, read from its code (pep.runtime): its trigger
    interval, files per micro-batch, and records per micro-batch of a Kafka stream."""
    from pep.runtime.runtime import RuntimeSettings
    from pep.runtime.sources import KAFKA_MAX_OFFSETS

    d = RuntimeSettings()
    return QuerySettings("gateway-settings", d.trigger_interval, d.max_files_per_trigger,
                         KAFKA_MAX_OFFSETS)


def from_dict(d: dict[str, Any]) -> QuerySettings:
    return QuerySettings(**d)



def user_session(kafka: bool = False) -> Any:
    """A SparkSession as a user's application makes it: Spark's defaults, local[*]; the only
    addition is the Kafka connector's jars (what `--packages` would fetch)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[*]").appName("a-user-query")
    if kafka:
        from pep.runtime.session import kafka_connector_jars
        builder = builder.config("spark.jars", ",".join(map(str, kafka_connector_jars())))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


Handler = Callable[..., dict[str, Any]]


def serve_user_app(handlers: dict[str, Handler], kafka: bool = False) -> None:
    """The child side of `UserApp`: a fresh SparkSession with Spark's defaults, then one command
    per stdin line (`{"op": ..., "args": {...}}`), each answered with `reply`."""
    started = time.time()
    spark = user_session(kafka)
    reply({"ready": True, "session_seconds": time.time() - started})
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            if cmd["op"] == "stop":
                break
            try:
                reply(handlers[cmd["op"]](spark, **cmd.get("args", {})))
            except Exception as exc:  # noqa: BLE001 - the parent reports it
                reply({"failed": f"{type(exc).__name__}: {str(exc)[:800]}"})
    finally:
        spark.stop()


def link_all(staging: Path, target: Path, prefix: str = "") -> None:
    """Every file of `staging` into `target` at once (hard links: a backlog appearing)."""
    for f in sorted(staging.iterdir()):
        os.link(f, target / f"{prefix}{f.name}")


class FileQuery:
    """The direct query on a directory of JSON-lines files: readStream json with `schema` (DDL),
    the filter `condition`, the projection `columns`, each micro-batch's rows brought to the
    driver with `toArrow()` (what a user's application reads); `done` once `want` rows came."""

    def __init__(self, spark: Any, settings: QuerySettings, directory: str, schema: str,
                 condition: str, columns: list[str], want: int = 1) -> None:
        self.frame = (settings.source(spark.readStream.schema(schema), "files").json(directory)
                      .filter(condition).select(*columns))
        self.settings = settings
        self.want = want
        self.rows = 0
        self.batches = 0  # micro-batches that brought rows
        self.first: float | None = None
        self.last: float | None = None
        self.done = threading.Event()
        self.query: Any = None
        self.stopping = False

    def _batch(self, df: Any, _id: int) -> None:
        try:
            n = df.toArrow().num_rows
        except Exception:
            if self.stopping:
                return  # stop() interrupted this batch's job
            raise
        if not n:
            return
        now = time.time()
        self.rows += n
        self.batches += 1
        self.first = self.first or now
        self.last = now
        if self.rows >= self.want:
            self.done.set()

    def start(self) -> "FileQuery":
        writer = self.frame.writeStream.foreachBatch(self._batch)
        self.query = self.settings.trigger_on(writer).start()
        return self

    def stop(self) -> None:
        self.stopping = True
        if self.query is not None:
            self.query.stop()


def file_first_row(spark: Any, settings: dict[str, Any], directory: str, schema: str,
                   condition: str, columns: list[str], timeout: float = 60.0) -> dict[str, Any]:
    """Start -> the first row, for a query on a directory that records arrive in (inf: none
    within `timeout`)."""
    started = time.time()
    q = FileQuery(spark, from_dict(settings), directory, schema, condition, columns).start()
    try:
        q.done.wait(timeout)
    finally:
        q.stop()
    return {"first": (q.first - started) if q.first else INF}


def file_backlog(spark: Any, settings: dict[str, Any], staging: str, directory: str,
                 schema: str, condition: str, columns: list[str], expected: int,
                 timeout: float = 600.0) -> dict[str, Any]:
    """The query running on an empty directory, then the backlog's files appearing in it at
    once: the link's time, the first and last row's, the rows (see `backlog_figures`)."""
    Path(directory).mkdir(parents=True)
    q = FileQuery(spark, from_dict(settings), directory, schema, condition, columns, expected)
    q.start()
    try:
        time.sleep(1.0)  # the query runs (an empty directory: no batch yet)
        start = time.time()
        link_all(Path(staging), Path(directory))
        q.done.wait(timeout)
    finally:
        q.stop()
    return {"rows": q.rows, "lost": 0, "start": start, "first": q.first, "last": q.last,
            "batches": q.batches}


FILE_QUERY: dict[str, Handler] = {"first_row": file_first_row, "backlog": file_backlog}


class DirectSides:
    """Runs an operation of `ops` for a direct side: "user" in the user's application (which
    serves the same `ops`), "gateway-settings" here, in the gateway's session `spark`."""

    def __init__(self, spark: Any, app: "UserApp | None", ops: dict[str, Handler]) -> None:
        self.spark, self.app, self.ops = spark, app, ops
        self.settings = {"user": USER, "gateway-settings": gateway_settings()}

    def run(self, side: str, op: str, wait: float = 900.0, **args: Any) -> dict[str, Any]:
        settings = asdict(self.settings[side])
        if side == "user":
            assert self.app is not None
            return self.app.call(op, wait=wait, settings=settings, **args)
        return self.ops[op](self.spark, settings=settings, **args)


def started_spark(stack: ExitStack, master: str = "local[*]", app_name: str = "xsg",
                  extra: dict[str, str] | None = None) -> Any:
    """The gateway's SparkSession as `xsg serve` makes it (its settings, its warm-up), stopped
    with `stack`."""
    from pep.runtime.session import create_spark_session
    t = time.time()
    spark = create_spark_session(master, app_name, extra)
    stack.callback(spark.stop)
    print(f"the gateway's Spark on {spark.sparkContext.master} started in {time.time() - t:.1f} s "
          "(with its warm-up)")
    return spark


def started_user_app(stack: ExitStack, script: str | Path, kafka: bool = False) -> "UserApp":
    """The user's application (`UserApp`), closed with `stack`."""
    app = UserApp(script, kafka)
    stack.callback(app.close)
    print(f"the user's application (local[*], Spark's defaults) started in "
          f"{app.started['session_seconds']:.1f} s")
    return app


class UserApp:
    """The direct query as a user runs it: an application of its own (`script --user-app`), kept
    for the whole benchmark like the gateway is, so both sides' JVMs are equally warm after their
    first run. Its first run is its start-up."""

    def __init__(self, script: str | Path, kafka: bool = False, timeout: float = 300.0) -> None:
        self.err = tempfile.NamedTemporaryFile(prefix="xsg-bench-user-app-", suffix=".log",
                                               delete=False, mode="w")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), "--user-app", "kafka" if kafka else "files"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True, bufsize=1)
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True, name="user-app-out").start()
        self.started = self._next(timeout)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@"):
                self.lines.put(json.loads(line[2:]))
        self.lines.put({"failed": f"the user's application ended ({self.proc.wait()}); see "
                                 f"{self.err.name}"})

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            got = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the user's application did not answer in {timeout:.0f} s; "
                               f"see {self.err.name}") from None
        if "failed" in got:
            raise RuntimeError(f"the user's application: {got['failed']}")
        return got

    def call(self, op: str, *, wait: float = 900.0, **args: Any) -> dict[str, Any]:
        """Run `op` in the application with `args`; its answer (at most `wait` seconds)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, "args": args}) + "\n")
        self.proc.stdin.flush()
        return self._next(wait)

    def close(self) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write(json.dumps({"op": "stop"}) + "\n")
                self.proc.stdin.flush()
            self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(30)
        self.err.close()
        os.unlink(self.err.name)


# -- the gateway ---------------------------------------------------------------------------------------

class Gateway:
    """One gateway in this process as `xsg serve` runs it (services, app, the configured HTTP
    server, its garbage collector tuned once started) on a free loopback port, over `runtime`.
    `accounts` are the auth file's entries; `config` overrides GatewayConfig's defaults."""

    def __init__(self, runtime: Any, data_dir: Path, accounts: list[dict[str, Any]],
                 **config: Any) -> None:
        from pdp.auth import write_auth_file
        from pep.config import GatewayConfig
        from pep.http.app import create_app
        from pep.http.serving import tune_gc
        from pep.serve import gateway_server
        from pep.services import build_services

        data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = data_dir
        auth = data_dir / "auth.json"
        write_auth_file(auth, accounts)
        self.runtime = runtime
        cfg = GatewayConfig(data_dir=data_dir, auth_file=auth, policies_dir=None, port=0,
                            **config)
        self.services = build_services(cfg, runtime=runtime)
        self.server = gateway_server(create_app(services=self.services), cfg).start()
        self.url: str = self.server.url
        tune_gc()  # as `xsg serve` does once started (pep.http.serving.GC_THRESHOLDS)

    @property
    def port(self) -> int:
        return int(self.server.port)

    def ingest_dir(self, stream: str) -> Path:
        return self.data_dir / "streams" / stream / "ingest"

    def register(self, name: str, schema: list[tuple[str, str]], source: dict[str, Any],
                 time_attribute: str) -> None:
        import requests
        r = requests.post(f"{self.url}/streams", headers=hdr(ADMIN_TOKEN), timeout=60, json={
            "name": name, "time_attribute": time_attribute, "source": source,
            "schema": [{"name": n, "type": t} for n, t in schema]})
        assert r.status_code == 201, r.text

    def add_policy(self, xml: bytes) -> None:
        import requests
        r = requests.post(f"{self.url}/policies", headers=hdr(ADMIN_TOKEN, **XML), data=xml,
                          timeout=60)
        assert r.status_code == 201, r.text

    def delete_policy(self, policy_id: str) -> None:
        import requests
        r = requests.delete(f"{self.url}/policies/{policy_id}", headers=hdr(ADMIN_TOKEN),
                            timeout=300)
        assert r.status_code in (200, 204), r.text

    def open(self, token: str, body: bytes, media: str = "application/xacml+json"
             ) -> dict[str, Any]:
        """POST /requests: the handle's answer (its URL under "handle")."""
        import requests
        r = requests.post(f"{self.url}/requests", headers=hdr(token, **{"Content-Type": media}),
                          data=body, timeout=120)
        assert r.status_code in (200, 201), (r.status_code, r.text)
        return dict(r.json())

    def release(self, token: str, handle: str) -> None:
        import requests
        requests.delete(handle, headers=hdr(token), timeout=60)

    def reader(self, handles: list[tuple[int, str, str]], out: Path, **job: Any) -> ReadJob:
        """A ReadJob for `handles` (index, handle URL or id, token) of this gateway."""
        return ReadJob("127.0.0.1", self.port, [(i, handle_path(h), t) for i, h, t in handles],
                       str(out), **job)

    def close(self) -> None:
        steps = [self.services.close_stream_side, self.server.stop, self.services.close]
        stop = getattr(self.runtime, "stop", None)
        if stop is not None:
            steps.append(stop)
        for step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001
                print(f"(cleanup: {getattr(step, '__qualname__', step)} failed: {exc!r})")


# -- talking to the gateway over HTTP -------------------------------------------------------------------

ADMIN_TOKEN = "tok-bench-nea-0123456789"
XML = {"Content-Type": "application/xacml+xml"}
NDJSON = {"Content-Type": "application/x-ndjson"}


def consumer_token(i: int) -> str:
    return f"tok-bench-c{i:03d}-0123456789"


def accounts(consumers: int) -> list[dict[str, Any]]:
    """The auth file: the owner `nea` (an administrator), `lta` (consumer 0) and consumers
    c001..c<consumers>."""
    return ([{"token": ADMIN_TOKEN, "subject": "nea", "roles": ["data-owner"], "admin": True},
             {"token": consumer_token(0), "subject": "lta", "roles": ["consumer"],
              "admin": False}]
            + [{"token": consumer_token(i), "subject": f"c{i:03d}", "roles": ["consumer"],
                "admin": False} for i in range(1, consumers + 1)])


def hdr(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


def inline_policy(policy_id: str, streams: list[str], condition: str, fields: list[str]) -> bytes:
    """A plain filter+map grant for every authenticated subject on the given streams."""
    s = "http://www.w3.org/2001/XMLSchema#string"
    rid = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"
    res = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
    eq = "urn:oasis:names:tc:xacml:1.0:function:string-equal"
    all_ofs = "".join(
        f'<AllOf><Match MatchId="{eq}"><AttributeValue DataType="{s}">{name}</AttributeValue>'
        f'<AttributeDesignator Category="{res}" AttributeId="{rid}" DataType="{s}" '
        f'MustBePresent="false"/></Match></AllOf>' for name in streams)
    maps = "".join(
        f'<AttributeAssignmentExpression AttributeId="exacml:obligation:stream-map-attribute-id">'
        f'<AttributeValue DataType="{s}">{f}</AttributeValue></AttributeAssignmentExpression>'
        for f in fields)
    cond = condition.replace(">", "&gt;").replace("<", "&lt;")
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="{policy_id}" Version="1.0"
 RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
 <Target><AnyOf>{all_ofs}</AnyOf></Target>
 <Rule RuleId="{policy_id}:read" Effect="Permit">
  <ObligationExpressions>
   <ObligationExpression ObligationId="exacml:obligation:stream-filter" FulfillOn="Permit">
    <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-filter-condition-id">
     <AttributeValue DataType="{s}">{cond}</AttributeValue>
    </AttributeAssignmentExpression>
   </ObligationExpression>
   <ObligationExpression ObligationId="exacml:obligation:stream-map" FulfillOn="Permit">{maps}
   </ObligationExpression>
  </ObligationExpressions>
 </Rule>
</Policy>""".encode()


def request_json(stream: str) -> bytes:
    return json.dumps({"Request": {
        "AccessSubject": {"Attribute": [{
            "AttributeId": "urn:oasis:names:tc:xacml:1.0:subject:subject-id", "Value": "whoever"}]},
        "Resource": {"Attribute": [{
            "AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id", "Value": stream}]},
        "Action": {"Attribute": [{
            "AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
            "Value": "read"}]}}}).encode()


# -- the reader process ----------------------------------------------------------------------------------

# A row line and the two numbers it is measured by (the gateway writes compact JSON: no space
# after a colon), found with one regex scan per received chunk rather than a Python loop per row:
# at 100,000 rows/s a per-row loop made four reader processes take half a core of the two that
# the gateway they measure runs on.
ROW_LINE = re.compile(rb'^\{"id":[0-9]+,"row":', re.M)
SENT = re.compile(rb'"sent":(-?[0-9][0-9.eE+-]*)')
SEQ = re.compile(rb'"seq":(-?[0-9]+)')


@dataclass
class ReadJob:
    """What one reader process reads: handles (index, path, token) of the gateway at host:port,
    each as NDJSON over a raw socket (HTTP/1.0: the stream ends with the connection).
    A handle is done at its final event (revoked, released, ended, shutdown), at `want` rows
    (and rows reported lost), or when the connection ends; the process at `seconds`, at SIGTERM,
    or when every handle is done. With `phases` ((lo, hi) epoch ranges of the rows' `sent`) every
    row's latency (arrival - sent) is kept under its phase; with `sample`, (index, seq, arrival)
    of the rows with seq % sample == 0."""

    host: str
    port: int
    handles: list[tuple[int, str, str]]
    out: str
    ready: str | None = None
    want: int | None = None
    seconds: float = 600.0
    phases: list[tuple[float, float]] = field(default_factory=list)
    sample: int = 0
    start_file: str | None = None  # phases are offsets from the epoch second written there


def write_start(job: ReadJob, epoch: float) -> None:
    """Tell a reader whose phases are relative (`start_file`) when its run starts."""
    assert job.start_file is not None
    tmp = Path(job.start_file + ".tmp")
    tmp.write_text(repr(epoch))
    os.replace(tmp, job.start_file)


def handle_path(url: str) -> str:
    """A handle's path (`/handles/<id>`) from its URL or id."""
    return urlsplit(url).path if "://" in url else f"/handles/{url}"


def start_reader(job: ReadJob) -> subprocess.Popen[bytes]:
    submit(job)
    return spawn_reader(job.out)


def spawn_reader(out: str) -> subprocess.Popen[bytes]:
    """A reader process that waits for its job (`submit`): started before the handle is
    opened, so that the reader's own start (a Python process: 0.1-1 s) is not counted in a
    first row's wait."""
    return subprocess.Popen([sys.executable, __file__, "--read", str(Path(out).with_suffix(".job"))],
                            stdin=subprocess.DEVNULL)


def submit(job: ReadJob) -> None:
    path = Path(job.out).with_suffix(".job")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(job)))
    os.replace(tmp, path)


def wait_ready(job: ReadJob, timeout: float = 120.0) -> bool:
    """Until the reader has every handle's response head (its `ready` file)."""
    assert job.ready is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Path(job.ready).exists():
            return True
        time.sleep(0.05)
    return False


def reader_result(proc: subprocess.Popen[bytes], job: ReadJob, timeout: float,
                  stop: bool = False) -> dict[str, Any]:
    """The reader's figures, once it ended (or, with `stop`, after SIGTERM now)."""
    if stop and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    try:
        return json.loads(Path(job.out).read_text())
    except (OSError, ValueError):
        return {"rows": 0, "lat": [[] for _ in job.phases], "errors": ["no output"],
                "first": None, "last": None, "gaps": 0, "lost": 0, "revoked": [],
                "after_final": 0, "still_open": len(job.handles), "samples": [], "finals": {}}


class _Conn:
    __slots__ = ("index", "sock", "pending", "head", "final", "rows", "lost")

    def __init__(self, index: int, sock: socket.socket) -> None:
        self.index, self.sock = index, sock
        self.pending = b""
        self.head = False
        self.final: str | None = None
        self.rows = 0
        self.lost = 0


def reader_main(job_path: str) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    waited = time.monotonic() + 600
    while not Path(job_path).exists():  # spawned ahead of its job (`spawn_reader`)
        if stop.is_set() or time.monotonic() > waited:
            return
        time.sleep(0.005)
    job = ReadJob(**json.loads(Path(job_path).read_text()))
    deadline = time.monotonic() + job.seconds
    sel = selectors.DefaultSelector()
    conns: dict[int, _Conn] = {}
    for index, path, token in job.handles:
        s = socket.create_connection((job.host, job.port), timeout=30)
        s.sendall(f"GET {path} HTTP/1.0\r\nAccept: application/x-ndjson\r\n"
                  f"Authorization: Bearer {token}\r\n\r\n".encode())
        s.setblocking(False)
        conns[index] = _Conn(index, s)
        sel.register(s, selectors.EVENT_READ, index)
    phases = [tuple(p) for p in job.phases]
    relative = job.start_file is not None

    def resolve() -> bool:
        """Relative phases made absolute once the start is known."""
        nonlocal phases, relative
        try:
            start = float(Path(job.start_file).read_text())  # type: ignore[arg-type]
        except (OSError, ValueError):
            return False
        phases = [(start + lo, start + hi) for lo, hi in phases]
        relative = False
        return True
    lat: list[list[float]] = [[] for _ in phases]
    samples: list[tuple[int, int, float]] = []
    revoked: list[float] = []
    finals: dict[str, int] = {}
    out = {"rows": 0, "gaps": 0, "lost": 0, "after_final": 0}
    first: float | None = None
    last: float | None = None
    errors: list[str] = []
    ready_written = job.ready is None

    def close(c: _Conn) -> None:
        sel.unregister(c.sock)
        c.sock.close()
        del conns[c.index]

    while not stop.is_set() and conns and time.monotonic() < deadline:
        if relative:
            resolve()
        if not ready_written and all(c.head for c in conns.values()):
            Path(job.ready).write_text("ready")  # type: ignore[arg-type]
            ready_written = True
        for key, _ in sel.select(0.2):
            c = conns.get(key.data)
            if c is None:
                continue
            try:
                data = c.sock.recv(262144)
            except BlockingIOError:
                continue
            except OSError as exc:
                data = b""
                errors.append(repr(exc))
            now = time.time()
            if not data:
                close(c)
                continue
            buf = c.pending + data
            if not c.head:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    c.pending = buf
                    continue
                if b" 200 " not in buf[:20]:
                    errors.append(buf[:300].decode(errors="replace"))
                    close(c)
                    continue
                buf = buf[end + 4:]
                c.head = True
            cut = buf.rfind(b"\n") + 1
            chunk, c.pending = buf[:cut], buf[cut:]
            if c.final is not None:
                out["after_final"] += len(ROW_LINE.findall(chunk))
                continue
            if b'"event":' in chunk:  # events are rare: those lines are parsed whole
                at = 0
                for line in chunk.split(b"\n"):
                    at += len(line) + 1
                    if not line.startswith(b'{"id":') or b',"row":' in line[:32]:
                        continue
                    obj = json.loads(line)
                    kind = obj.get("event")
                    if kind == "gap":
                        out["gaps"] += 1
                        c.lost += obj.get("lost") or 0
                    elif kind in FINAL_EVENTS:
                        c.final = kind
                        finals[kind] = finals.get(kind, 0) + 1
                        if kind == "revoked":
                            revoked.append(now)
                        out["after_final"] += len(ROW_LINE.findall(chunk, at))
                        chunk = chunk[:at]
                        break
            n = len(ROW_LINE.findall(chunk))
            if n:
                c.rows += n
                out["rows"] += n
                first = first or now
                last = now
                if relative and not resolve():
                    errors.append("rows before the run's start was known")
                elif phases:
                    sents = SENT.findall(chunk)
                    if len(sents) != n:
                        errors.append(f"a row without `sent` in {chunk[:200]!r}")
                    else:
                        for sent_text in sents:
                            sent = float(sent_text)
                            for k, (lo, hi) in enumerate(phases):
                                if lo <= sent < hi:
                                    lat[k].append(now - sent)
                                    break
                if job.sample:
                    for seq_text in SEQ.findall(chunk):
                        seq = int(seq_text)
                        if seq % job.sample == 0:
                            samples.append((c.index, seq, now))
            if c.final is not None or (job.want is not None and c.rows + c.lost >= job.want):
                out["lost"] += c.lost
                close(c)
    for c in list(conns.values()):
        out["lost"] += c.lost
        c.sock.close()
    if not ready_written and job.ready:
        Path(job.ready).write_text("ended before every head arrived")
    Path(job.out).write_text(json.dumps({
        **out, "lat": lat, "first": first, "last": last, "revoked": revoked, "finals": finals,
        "samples": samples, "errors": errors[:5], "still_open": len(conns)}))


# -- Spark's processes -------------------------------------------------------------------------------------

def spark_jvm_pid() -> int | None:
    try:
        from pyspark import SparkContext
        proc = getattr(SparkContext._gateway, "proc", None)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - no Spark
        proc = None
    return None if proc is None else int(proc.pid)


def spark_cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by Spark's JVM and by its Python workers (the JVM's descendant
    processes: pyspark.daemon and the workers it forks), from /proc; (nan, nan) without Spark.
    A steadier figure than latency on a shared machine: what the runtime's per-batch work
    costs the two cores the readers, the gateway and Spark share."""
    jvm = spark_jvm_pid()
    if jvm is None:
        return float("nan"), float("nan")
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        used[pid] = (int(fields[11]) + int(fields[12])) / tick
    workers = 0.0
    for pid in used:
        up = parent.get(pid)
        while up is not None and up > 1 and up != jvm:
            up = parent.get(up)
        if up == jvm:
            workers += used[pid]
    return used.get(jvm, float("nan")), workers


def rss_mib() -> tuple[float, float]:
    """Resident memory (MiB) of this process and of Spark's JVM (nan if none)."""
    def of(pid: int) -> float:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return float("nan")
    jvm = spark_jvm_pid()
    return of(os.getpid()), (float("nan") if jvm is None else of(jvm))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--read"] and len(sys.argv) == 3:
        reader_main(sys.argv[2])
    else:
        sys.exit("usage: harness.py --read JOB (the reader process; see ReadJob)")
