"""Spark's JVM and its Python workers over TCP and over Unix domain sockets, side by side.

Run: .venv/bin/python tests/bench/bench_python_sockets.py [--jobs 60] [--partitions 2]

The rows job of every micro-batch is a `DataFrame.mapInArrow` over a few dozen tuples
(pep/runtime/plans/matcher.py), so its fixed cost is what a batch pays. This runs the same small job
(`--partitions` partitions of 100 cached rows, a function that only stamps times) `--jobs` times
in two child processes, one SparkSession each (one per process is all Spark allows): the
gateway's session with `spark.python.unix.domain.socket.enabled` false (TCP, Spark's default),
then true (the gateway's default on a local master, `pep/runtime/session.py`). Printed per
transport, medians after 10 warm-up jobs: the whole job (submit -> Arrow table on the driver),
submit -> the worker's function starts, the function's start -> its first input batch, and the
ratio UDS / TCP of the whole job.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

WARM = 10


def child(transport: str, jobs: int, partitions: int) -> dict[str, float]:
    """One session with the given transport; medians in milliseconds."""
    import pyarrow as pa
    from pyspark.sql import types as T

    from pep.runtime.base.jvm_steps import JvmSteps
    from pep.runtime.session import UDS_ENABLED, create_spark_session

    spark = create_spark_session("local[2]", f"xsg-bench-sockets-{transport}",
                                 {UDS_ENABLED: "true" if transport == "uds" else "false"},
                                 warm=False)
    df = spark.range(100).repartition(partitions).cache()
    df.count()

    def stamp(batches):  # in the worker: when it started, when its first batch came
        started = time.time()
        first = None
        for b in batches:
            if first is None:
                first = time.time()
            yield pa.RecordBatch.from_arrays(
                [pa.array([started] * b.num_rows), pa.array([first] * b.num_rows)],
                names=["started", "first"])

    schema = T.StructType.fromDDL("started double, first double")
    steps = JvmSteps()
    whole, to_fn, to_first = [], [], []
    for i in range(jobs + WARM):
        frame = steps.map_in_arrow(df, ("stamp",), stamp, lambda: stamp, schema, ["id"])
        t0 = time.time()
        table = steps.to_arrow(frame, schema)
        t1 = time.time()
        if i < WARM:
            continue
        started = table.column("started").to_pylist()
        firsts = table.column("first").to_pylist()
        whole.append(1000 * (t1 - t0))
        to_fn.append(1000 * (min(started) - t0))
        to_first.append(1000 * max(f - s for f, s in zip(firsts, started, strict=True)))
        time.sleep(0.05)
    spark.stop()
    return {"job": statistics.median(whole), "submit_to_function": statistics.median(to_fn),
            "function_to_first_batch": statistics.median(to_first)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=60, help="measured jobs per transport")
    ap.add_argument("--partitions", type=int, default=2, help="partitions (tasks) per job")
    ap.add_argument("--child", choices=("tcp", "uds"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.jobs, args.partitions)))
        return
    results = {}
    for transport in ("tcp", "uds"):
        out = subprocess.run([sys.executable, __file__, "--child", transport, "--jobs",
                              str(args.jobs), "--partitions", str(args.partitions)],
                             capture_output=True, text=True, timeout=600)
        if out.returncode:
            sys.exit(f"the {transport} run failed:\n{out.stderr[-2000:]}")
        results[transport] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"machine: {os.cpu_count()} cores; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.jobs} jobs of "
          f"{args.partitions} tasks each (medians, ms)")
    print(f"{'':10} {'whole job':>10} {'submit->fn':>11} {'fn->1st batch':>14}")
    for transport, r in results.items():
        print(f"{transport:10} {r['job']:10.1f} {r['submit_to_function']:11.1f} "
              f"{r['function_to_first_batch']:14.1f}")
    print(f"ratio uds/tcp, whole job: {results['uds']['job'] / results['tcp']['job']:.2f}")


if __name__ == "__main__":
    main()
