"""Security punctuations' cost: the throughput of a stream with a punctuation every 10 and every
1,000 tuples against the same stream without punctuations, in one run (the paper's section 6.1
reports a low overhead; the aim is at least 0.8x).

Run: .venv/bin/python tests/bench/bench_punctuations.py [--quick] [--trials 5] [--tuples 200000]

The runtime alone (no HTTP: the readers are callbacks in this process), as bench_runtime.py's
throughput side. Three sides, each an `ingest` stream of its own made by the catalogue as an
owner makes it: `none` (punctuations off, the records alone), `every 1000` and `every 10`
(punctuations on; one policy every 1,000 or 10 tuples, alternating between two role sets that
both name the readers' role, so every side delivers every tuple and the figures compare the
same rows). The backlog is ingested beforehand through the catalogue into a staging stream
(files of 1,000 tuples and the stream's punctuation log), then, for a run, the log is put in
place and the files linked at once into the directory of a stream whose query already runs
with four handles attached (two plans: all attributes, and two of them); from the link to the
last row delivered to every handle. Start-up (each side's first run, on a fresh stream, the
shield reading the whole log) apart from the steady state (`--trials` more, the sides' order
rotating, after a warm-up round that is not counted: the runs speed up over the first ones as
the JVM compiles; tests/bench/harness.py says why the order rotates). Each trial's ratio is
printed too: its sides ran next to each other, under the same load.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pep.core.plan import ExecutionPlan
from pep.core.punctuations import LOG_NAME
from pep.streams.catalog import StreamCatalog
from tests.bench.harness import (
    backlog_figures,
    bench_parser,
    machine,
    ratio,
    rotations,
    secs,
    spread,
)

FIELDS = [{"name": "patient", "type": "long"}, {"name": "hr", "type": "double"},
          {"name": "temp", "type": "double"}, {"name": "ward", "type": "string"}]
SIDES = {"none": None, "every 1000": 1000, "every 10": 10}
PER_FILE = 1000
READERS = {"r1": ("patient", "hr", "temp", "ward"), "r2": ("patient", "hr", "temp", "ward"),
           "r3": ("patient", "hr"), "r4": ("patient", "hr")}


def backlog(tuples: int, every: int | None, rnd: random.Random) -> list[bytes]:
    """The ingest bodies (one file each): tuples, a punctuation before every `every`-th."""
    bodies = []
    ts = 0
    lines: list[str] = []
    for i in range(tuples):
        if every is not None and i % every == 0:
            ts += 1
            roles = ["consumer", "medic"] if ts % 2 else ["consumer"]
            lines.append(json.dumps({"$punctuation": {"srp": roles, "ts": ts}}))
        lines.append(json.dumps({"patient": i, "hr": round(rnd.uniform(50, 150), 1),
                                 "temp": round(rnd.uniform(35, 41), 1),
                                 "ward": rnd.choice(["icu", "er", "lab"])}))
        if (i + 1) % PER_FILE == 0:
            bodies.append("\n".join(lines).encode())
            lines = []
    if lines:
        bodies.append("\n".join(lines).encode())
    return bodies


class Counter:
    """A handle's deliver callback: rows counted, the time of the last."""

    def __init__(self) -> None:
        self.rows = 0
        self.first = 0.0
        self.last = 0.0
        self.lock = threading.Lock()

    def __call__(self, batch: Any) -> bool:
        with self.lock:
            if not self.rows:
                self.first = time.time()
            self.rows += len(batch.rows)
            self.last = time.time()
        return True


def main() -> None:
    parser = bench_parser("a smoke run: 20,000 tuples, one trial")
    parser.add_argument("--tuples", type=int, default=200_000)
    parser.set_defaults(trials=5)  # the runs vary much on a shared machine
    args = parser.parse_args()
    tuples = 20_000 if args.quick else args.tuples
    trials = 1 if args.quick else args.trials
    print(machine("numpy", "pyarrow"))
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    from pep.runtime.session import create_spark_session
    spark = create_spark_session("local[*]", "xsg-bench-punctuations")
    root = Path(tempfile.mkdtemp(prefix="xsg-bench-punct-"))
    catalog = StreamCatalog(root / "streams.db", root / "data")
    staged: dict[str, Path] = {}
    for side, every in SIDES.items():  # the backlogs, ingested once through the catalogue
        name = f"staging{every or 0}"
        catalog.register(name, "hospital", FIELDS, {"kind": "ingest", "punctuations":
                                                     "off" if every is None else "on"})
        for body in backlog(tuples, every, random.Random(7)):
            catalog.append_records(name, body)
        staged[side] = catalog.ingest_dir(name)
    runtime = StreamRuntime(spark, root / "work", settings=RuntimeSettings())
    runs = {"n": 0}

    def run(side: str) -> dict[str, Any]:
        runs["n"] += 1
        every = SIDES[side]
        name = f"s{runs['n']}"
        definition = catalog.register(name, "hospital", FIELDS, {
            "kind": "ingest", "punctuations": "off" if every is None else "on"})
        counters = {h: Counter() for h in READERS}
        ids = [f"{name}-{h}" for h in READERS]
        for handle, reader in zip(ids, READERS, strict=True):
            plan = ExecutionPlan(name, None, READERS[reader],
                                 punctuation_roles=None if every is None else ("consumer",))
            runtime.attach_handle(handle, definition, plan, counters[reader])
        target = catalog.ingest_dir(name)
        if every is not None:  # the log first: the ingest writes it before a batch's file
            shutil.copyfile(staged[side] / LOG_NAME, target / LOG_NAME)
        start = time.time()
        for f in sorted(staged[side].iterdir()):  # the data files at once (hard links)
            if not f.name.startswith("."):
                os.link(f, target / f.name)
        deadline = start + 600
        while time.time() < deadline and not all(c.rows >= tuples for c in counters.values()):
            time.sleep(0.05)
        rows = min(c.rows for c in counters.values())
        res = backlog_figures({"start": start, "first": min(c.first for c in counters.values()),
                               "last": max(c.last for c in counters.values()), "rows": rows,
                               "lost": any(c.rows > tuples for c in counters.values())}, tuples)
        for handle in ids:
            runtime.detach(handle)
        return res

    sides = list(SIDES)
    print(f"{tuples:,} tuples in files of {PER_FILE:,}, {len(READERS)} handles (2 plans); "
          "from the files' link to the last row at every handle")
    print("  start-up: each side's first run")
    first = {s: run(s) for s in sides}
    for s in sides:
        print(f"    {s:11s} {first[s]['rate']:,.0f} rows/s, first row after "
              f"{secs(first[s]['first_row'])}")
    for s in sides:  # the JVM's code still warms up over the first runs: one more, not counted
        run(s)
    rates: dict[str, list[float]] = {s: [] for s in sides}
    print(f"  steady state: {trials} trial(s) after a warm-up round, the order rotating")
    for k, order in enumerate(rotations(sides, trials)):
        for s in order:
            r = run(s)
            rates[s].append(r["rate"] if r["complete"] else 0.0)
            print(f"    trial {k + 1} {s:11s} {r['rate']:,.0f} rows/s"
                  + ("" if r["complete"] else " (INCOMPLETE)"))
    med = {s: statistics.median(rates[s]) if rates[s] else 0.0 for s in sides}
    print("  throughput, rows/s (median of the trials)")
    for s in sides:
        print(f"    {s:11s} {spread(rates[s])}")
    for s in ("every 1000", "every 10"):
        # each trial's own ratio too: the sides of one trial ran next to each other, under
        # the same load
        per_trial = [a / b for a, b in zip(rates[s], rates["none"], strict=True) if b]
        print(f"    {s} / none: {ratio(med[s], med['none'])} of the medians, "
              f"{statistics.median(per_trial):.2f} the median of the trials' ratios "
              f"({', '.join(f'{x:.2f}' for x in per_trial)}); start-up "
              f"{ratio(first[s]['rate'], first['none']['rate'])}")
    runtime.stop()
    catalog.close()
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
