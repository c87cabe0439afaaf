"""What the benchmarks that set the gateway beside a direct Spark query share, so that each
measures the same way: the machine line, percentiles in which a row that never arrived counts
as infinitely late, alternating trials, the gateway as `xsg serve` runs it, the reader process
(NDJSON over raw sockets), and the direct query as a user would run it.

The rules these implement (issue 45, "Benchmarks that measure what a user sees"):
- every ratio is against the query a user would write, with Spark's defaults: an application
  of its own (`direct.UserApp`: its own process, JVM and SparkSession, nothing set but the
  Kafka connector's jars), no per-trigger cap, Spark's default trigger (the next micro-batch as
  soon as one ends); beside it the same query in the gateway's session with the gateway's
  per-query settings (`direct.gateway_settings()`: its trigger interval and caps), to show what
  they cost;
- start-up (the first seconds after a fresh start) and steady state are separate figures;
- a row that never arrives counts as infinitely late (`with_missing`);
- producers and readers run in processes of their own (`run_child`, `readers.start_reader`);
- at least three trials, the order of the sides rotating (`rotations`).

Where the rest lives: tests/bench/direct.py (the direct query: a user's application, the
gateway's settings), tests/bench/served.py (the gateway as `xsg serve` runs it, and talking to it
over HTTP), tests/bench/readers.py (the reader process).
"""
from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

INF = float("inf")
T = TypeVar("T")
# the sides of a comparison (see the module's docstring)
SIDE_NAMES = {"gateway": "gateway", "gateway-topics": "gateway, plan topics + edge",
              "gateway-realtime": "gateway, plan topics, real-time",
              "runtime": "runtime", "user": "direct, Spark's defaults",
              "gateway-settings": "direct, the gateway's settings"}


# -- the machine -----------------------------------------------------------------------------------

def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine(*packages: str) -> str:
    """The machine line every benchmark prints first: the host under this project's VM has
    changed between sessions, and the figures with it; the load average is the one before the
    run (other work on the two cores skews every figure). `packages`: modules whose versions
    the figures depend on, beside PySpark's."""
    import importlib
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = []
    for name in ("pyspark", *packages):
        try:
            versions.append(f"{name} {importlib.import_module(name).__version__}")
        except (ImportError, AttributeError):
            versions.append(f"no {name}")
    return (f"{platform.platform()}; CPU {model}; {os.cpu_count()} cores; Python "
            f"{platform.python_version()}; {', '.join(versions)}; load average {load_average()}")


# -- figures ---------------------------------------------------------------------------------------

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
          f"{names['gateway-settings']}: {ratio(med[ours], med['gateway-settings'])}; what the "
          f"gateway's settings do to the direct query (its rate with them / with Spark's "
          f"defaults): {ratio(med['gateway-settings'], med['user'])}")


def rotations(sides: Sequence[T], trials: int) -> list[tuple[T, ...]]:
    """The order of the sides in each trial: trial k starts with side k (mod the sides), so no
    side always runs first, after the same neighbour, or on the warmest JVM."""
    n = len(sides)
    return [tuple(sides[(k + i) % n] for i in range(n)) for k in range(trials)]


def link_all(staging: Path, target: Path, prefix: str = "") -> None:
    """Every file of `staging` into `target` at once (hard links: a backlog appearing)."""
    for f in sorted(staging.iterdir()):
        os.link(f, target / f"{prefix}{f.name}")


# -- child processes -------------------------------------------------------------------------------

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
    order with Spark's lines on stderr), and the gateway's log as `xsg serve` writes it (a
    warning that repeats per micro-batch, "falling behind", summed up once a minute)."""
    import argparse

    from common.logs import configure_logging
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    configure_logging("WARNING").setLevel("WARNING")  # a benchmark's own DEBUG loggers stay off it
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--trials", type=int, default=3, help=f"{trials} (default 3)")
    return parser


def sleep_until(epoch: float) -> None:
    pause = epoch - time.time()
    if pause > 0:
        time.sleep(pause)


# -- Spark's processes -----------------------------------------------------------------------------

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
