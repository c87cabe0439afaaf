"""Spark's Python workers started and warmed before the first micro-batch needs them.

A stream's rows job runs Python on the workers once it has many plans: the grouped matcher
(`plans/matcher.py`) and, for plan topics, the records' numbering (`delivery/worker_rows.py`),
two `mapInArrow` steps chained in one task, so two Python processes per task. Spark starts
them when a task first asks (forked by its Python daemon, which it starts first), and each
imports pyspark's worker, numpy and pyarrow's compute functions on its first task. Measured
here (`bench_edges_split.py`, 1,000 handles on plan topics): the first micro-batch's job took
1.8 s for 60 tuples, of which 0.8 s starting the two workers and 0.6 s in their first calls;
a chained job after the session's JVM warm-up 1.2-1.4 s the first time, 0.13 s once warm, and
0.13 s the first time after this warm-up too. A slow first batch delays the next ones (their
input piled up meanwhile), so every reader's first seconds paid for it.

This runs one tiny job with the same shape (two chained `mapInArrow` steps per task, a task
per core, the numbering step being `worker_rows.numbered_records` itself) when the session is
made. Spark stops a Python worker that stayed idle for a minute (`PythonWorkerFactory`, not
configurable): the first micro-batch after a minute without any Python work starts new ones,
from the running daemon (measured 0.55 s rather than 1.2-1.4 s). On a cluster the job reaches
the executors that run its tasks, not necessarily all of them.

This module and `worker_rows` are pickled by value: their functions run on the workers without
xsg installed.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from types import ModuleType

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import SparkSession, types as T

from pep.runtime.delivery import worker_rows

_pickle_by_value: Callable[[ModuleType], None] = cloudpickle.register_pickle_by_value

ROWS = 64  # tuples per task of the warm-up job
MAX_TASKS = 8  # at most this many tasks (each two Python workers)


def _routed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The first step: each tuple with the plans that pass it (two of three plans), using the
    array kernels the matcher uses."""
    import numpy as np
    import pyarrow.compute as pc

    for batch in batches:
        x = np.asarray(batch.column(0), dtype=np.int64)
        order = pc.sort_indices(batch, sort_keys=[("x", "descending")])
        pids = pa.array([[1, 2 + int(v % 2)] for v in x[np.asarray(order)]],
                        pa.list_(pa.int64()))
        yield pa.RecordBatch.from_arrays([pids, batch.column(0).take(order)],
                                         names=["pids", "x"])


def warm_python_workers(spark: SparkSession) -> float:
    """Run the warm-up job (the module docstring); returns the seconds it took."""
    started = time.perf_counter()
    tasks = max(1, min(MAX_TASKS, spark.sparkContext.defaultParallelism))
    table = worker_rows.route_table([(1, ("warm#0",), 0), (2, ("warm#1",), 0),
                                     (3, ("warm#0", "warm#1"), 0)])
    numbering = worker_rows.numbered_records(worker_rows.list_pairs("pids"), ["x"], ["x"],
                                             table, ("topic", "projection", "i", "value"))
    frame = spark.range(0, ROWS * tasks, numPartitions=tasks).selectExpr("id AS x")
    routed = frame.mapInArrow(_routed, "pids array<long>, x long")
    numbered = routed.mapInArrow(numbering, T.StructType([
        T.StructField("topic", T.StringType()), T.StructField("projection", T.IntegerType()),
        T.StructField("i", T.LongType()), T.StructField("x", T.LongType())]))
    numbered.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


_pickle_by_value(sys.modules[__name__])
_pickle_by_value(worker_rows)

__all__ = ["warm_python_workers"]
