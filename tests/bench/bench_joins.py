"""Benchmark of a join under policy (pep/runtime/joins/runtime.py) against the same join written
directly in Spark, in one run, on the same files.

Run: .venv/bin/python tests/bench/bench_joins.py [--quick] [--records N] [--files F]
       [--per-trigger K] [--rounds R]

Two file streams (JSON lines, `_xsg_seq` ordered), `stations(t, station, rainrate, humidity)` and
`ships(ts, area, mmsi, speed, owner)`, one record per 0.1 s of event time on each, ten stations
and ten areas. The join: stations with rainrate > 1 (humidity hidden) and ships with speed < 20
(owner hidden), on station = area, within 1 s. Both queries read `--per-trigger` files per
micro-batch (so the join really streams: many batches, watermarks, state evicted) and stop when
every expected row has reached Python:
- xsg: `JoinRuntime.attach_join` with the `JoinPlan`, rows delivered as `RowBatch`es (each row
  renamed and encoded as JSON, what a handle's buffer receives);
- direct: the same DataFrame program written by hand (filters, projections, watermarks, the
  join condition), each micro-batch's rows brought back with `toArrow()`.
Both are run once on a small data set first (not reported: the JVM compiles each query shape on
its first run). Prints input tuples/s (both sides), joined rows/s, and the ratio xsg / direct per
round (the order alternates between rounds), plus the state rows Spark held at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pep.core.plan import (
    ExecutionPlan,
    Field,
    JoinPlan,
    Predicate,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
)
from pep.runtime.joins.runtime import JoinRuntime
from pep.runtime.session import create_spark_session

T0 = datetime(2025, 3, 1, tzinfo=UTC)
STATIONS = StreamSchema((Field("t", "timestamp"), Field("station", "string"),
                         Field("rainrate", "double"), Field("humidity", "double")))
SHIPS = StreamSchema((Field("ts", "timestamp"), Field("area", "string"), Field("mmsi", "long"),
                      Field("speed", "double"), Field("owner", "string")))
WITHIN = 1.0
LATENESS = 10.0


def station(i: int) -> dict:
    return {"t": (T0 + timedelta(seconds=i / 10)).isoformat().replace("+00:00", "Z"),
            "station": f"s{i % 10}", "rainrate": float(i * 13 % 7), "humidity": 50.0,
            "_xsg_seq": i}


def ship(i: int) -> dict:
    return {"ts": (T0 + timedelta(seconds=i / 10 + 0.05)).isoformat().replace("+00:00", "Z"),
            "area": f"s{i * 3 % 10}", "mmsi": 100 + i % 50, "speed": float(i * 7 % 30),
            "owner": "x", "_xsg_seq": i}


def write(directory: Path, make, records: int, files: int) -> list[dict]:
    directory.mkdir(parents=True)
    per = records // files
    rows = [make(i) for i in range(per * files)]
    for f in range(files):
        text = "\n".join(json.dumps(r) for r in rows[f * per:(f + 1) * per]) + "\n"
        (directory / f"{f:05d}.json").write_text(text)
        os.utime(directory / f"{f:05d}.json", (1_700_000_000 + f, 1_700_000_000 + f))
    return rows


def expected(left: list[dict], right: list[dict]) -> int:
    """Brute force (by event time buckets): the number of joined rows."""
    def secs(text: str) -> float:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    by_area: dict[str, list[float]] = {}
    for r in right:
        if r["speed"] < 20:
            by_area.setdefault(r["area"], []).append(secs(r["ts"]))
    for times in by_area.values():
        times.sort()
    import bisect
    n = 0
    for row in left:
        if row["rainrate"] > 1:
            t = secs(row["t"])
            times = by_area.get(row["station"], [])
            n += bisect.bisect_right(times, t + WITHIN + 1e-9) - bisect.bisect_left(
                times, t - WITHIN - 1e-9)
    return n


def join_plan() -> JoinPlan:
    left = ExecutionPlan("stations", ((Predicate("rainrate", ">", 1.0),),),
                         ("t", "station", "rainrate"))
    right = ExecutionPlan("ships", ((Predicate("speed", "<", 20.0),),),
                          ("ts", "area", "mmsi", "speed"))
    return JoinPlan(left, right, (("station", "area"),), WITHIN, "t", "ts")


def run_xsg(spark, work: Path, ldir: Path, rdir: Path, want: int, per_trigger: int,
            timeout: float) -> tuple[float, int, dict]:
    lstream = StreamDefinition("stations", "bench", STATIONS,
                               SourceSpec("files", (("path", str(ldir)), ("format", "json"))), "t")
    rstream = StreamDefinition("ships", "bench", SHIPS,
                               SourceSpec("files", (("path", str(rdir)), ("format", "json"))), "ts")
    runtime = JoinRuntime(spark, work, trigger_interval=0.25, max_files_per_trigger=per_trigger,
                          lateness=LATENESS)
    got = [0]
    done = threading.Event()

    def deliver(batch) -> bool:
        got[0] += len(batch)
        if got[0] >= want:
            done.set()
        return True
    started = time.perf_counter()
    runtime.attach_join("bench", (lstream, rstream), join_plan(), deliver)
    done.wait(timeout)
    elapsed = time.perf_counter() - started
    stats = next(iter(runtime.stats().values()))
    runtime.stop()
    return elapsed, got[0], stats


def run_direct(spark, work: Path, ldir: Path, rdir: Path, want: int, per_trigger: int,
               timeout: float) -> tuple[float, int, dict]:
    from pyspark.sql import functions as F
    lschema = "t timestamp, station string, rainrate double, humidity double, _xsg_seq long"
    rschema = "ts timestamp, area string, mmsi long, speed double, owner string, _xsg_seq long"
    left = (spark.readStream.schema(lschema).option("maxFilesPerTrigger", per_trigger)
            .json(str(ldir)).filter(F.col("rainrate") > F.lit(1.0))
            .select("t", "station", "rainrate").withWatermark("t", f"{int(LATENESS)} seconds"))
    right = (spark.readStream.schema(rschema).option("maxFilesPerTrigger", per_trigger)
             .json(str(rdir)).filter(F.col("speed") < F.lit(20.0))
             .select("ts", "area", "mmsi", "speed")
             .withWatermark("ts", f"{int(LATENESS)} seconds"))
    window = timedelta(seconds=WITHIN)
    joined = left.join(right, (F.col("station") == F.col("area"))
                       & (F.col("t") >= F.col("ts") - F.lit(window))
                       & (F.col("t") <= F.col("ts") + F.lit(window)), "inner")
    got = [0]
    done = threading.Event()

    def batch(df, _id) -> None:
        got[0] += df.toArrow().num_rows
        if got[0] >= want:
            done.set()
    started = time.perf_counter()
    query = (joined.writeStream.foreachBatch(batch)
             .option("checkpointLocation", str(work / "direct-checkpoint"))
             .trigger(processingTime="250 milliseconds").start())
    done.wait(timeout)
    elapsed = time.perf_counter() - started
    progress = query.lastProgress or {}
    state = sum(op.get("numRowsTotal", 0) for op in progress.get("stateOperators") or [])
    query.stop()
    return elapsed, got[0], {"state_rows": state, "batches": len(query.recentProgress)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="20,000 records per side, 1 round")
    ap.add_argument("--records", type=int, default=60_000, help="records per side")
    ap.add_argument("--files", type=int, default=30)
    ap.add_argument("--per-trigger", type=int, default=3, help="files per micro-batch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    if args.quick:
        args.records, args.files, args.rounds = 20_000, 20, 1
    spark = create_spark_session("local[2]", "xsg-bench-joins",
                                 {"spark.sql.shuffle.partitions": "2"})
    with tempfile.TemporaryDirectory(prefix="xsg-bench-joins-") as tmp:
        base = Path(tmp)
        left = write(base / "stations", station, args.records, args.files)
        right = write(base / "ships", ship, args.records, args.files)
        want = expected(left, right)
        print(f"{len(left):,} stations + {len(right):,} ships, {args.files} files each, "
              f"{args.per_trigger} files per micro-batch; {want:,} joined rows expected")
        # warm-up (not reported): the JVM compiles each query shape on its first run
        wl = write(base / "warm-stations", station, 2_000, 4)
        wr = write(base / "warm-ships", ship, 2_000, 4)
        for name, run in (("xsg", run_xsg), ("direct", run_direct)):
            work = base / f"warm-{name}"
            work.mkdir()
            run(spark, work, base / "warm-stations", base / "warm-ships", expected(wl, wr),
                args.per_trigger, args.timeout)
        results: dict[str, list[tuple[float, int, dict]]] = {"xsg": [], "direct": []}
        for round_ in range(args.rounds):
            order = ("xsg", "direct") if round_ % 2 == 0 else ("direct", "xsg")
            for name in order:
                work = base / f"work-{name}-{round_}"
                work.mkdir()
                run = run_xsg if name == "xsg" else run_direct
                elapsed, got, stats = run(spark, work, base / "stations", base / "ships", want,
                                          args.per_trigger, args.timeout)
                results[name].append((elapsed, got, stats))
                print(f"round {round_ + 1} {name:>6}: {elapsed:6.2f} s, {got:,} rows "
                      f"({'complete' if got == want else 'INCOMPLETE'}), "
                      f"{2 * len(left) / elapsed:,.0f} input tuples/s, "
                      f"{got / elapsed:,.0f} joined rows/s, state rows at the end "
                      f"{stats.get('state_rows')}")
        xsg = statistics.median(r[0] for r in results["xsg"])
        direct = statistics.median(r[0] for r in results["direct"])
        ratios = [d[0] / x[0] for x, d in zip(results["xsg"], results["direct"], strict=True)]
        print(f"median: xsg {2 * len(left) / xsg:,.0f} input tuples/s, {want / xsg:,.0f} joined "
              f"rows/s; direct {2 * len(left) / direct:,.0f} input tuples/s, "
              f"{want / direct:,.0f} joined rows/s; throughput xsg / direct = {direct / xsg:.2f} "
              f"(per round: {', '.join(f'{r:.2f}' for r in ratios)})")
    spark.stop()


if __name__ == "__main__":
    main()
