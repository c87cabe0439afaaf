"""Row plans' rows of a micro-batch written to their plan topics by Spark's Kafka sink on the
workers, inside the stream's foreachBatch: never collected to the driver.

The rows job's frame (each tuple some row plan passes, its projected attributes, its order
columns and the plans that passed it: a list of plan ids, or the grouped matcher's bitmap,
exploded on the workers by `worker_rows.py`) becomes one record per (tuple, plan topic):

- `topic`: the plan's topic (a small table of (plan id, topic, projection) joined by plan id;
  a plan read by handles of several topics is written to each);
- `value`: the row's JSON object, the plan's projection in its order (`to_json` of a struct,
  natively: doubles as Java prints them, `1.0E20` where the gateway's own encoder writes
  `1e+20`, the same number; NaN and infinities null; timestamps `YYYY-MM-DDTHH:MM:SS.ffffffZ`;
  nulls kept);
- `key`: `m:<epoch>:<batch>:<i>`, i the row's place among the batch's rows of that topic in
  stream order (`row_number` over the topic, ordered by the stream's order columns, then by
  plan and value: deterministic also for rows that tie in the order columns). A
  micro-batch that runs again after a crash writes the same keys: an edge keeps, per topic,
  the highest (batch, i) of the epoch and skips what is not above it (`pep.edge.topic_log`).
  The epoch is the query's checkpoint's (Spark's query id): batches are numbered anew only with
  a new checkpoint.

The records of one topic are in one task (the window's partitioning), written in stream order
by one producer (idempotent, acks=all): one partition per plan topic keeps them in that order.

A write that fails (the brokers away) is tried again, the same records under the same keys,
until it succeeds or the query stops: the micro-batch is not committed meanwhile, so the
stream stalls (its readers are told) rather than losing or repeating rows.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pyarrow as pa
from pyspark import AccumulatorParam, cloudpickle
from pyspark.sql import Column, DataFrame, Window, functions as F, types as T

from common.errors import described
from pep.runtime.base.columns import BITS_COLUMN, PIDS_COLUMN, READ_COLUMN, TOP_COLUMN
from pep.runtime.base.jvm_steps import JvmSteps
from pep.runtime.delivery import worker_rows

log = logging.getLogger(__name__)

_pickle_by_value: Callable[[ModuleType], None] = cloudpickle.register_pickle_by_value
_pickle_by_value(worker_rows)  # runs on the workers without xsg

PID = "_xsg_pid"
TOPIC = "topic"
PROJ = "_xsg_proj"
INDEX = "_xsg_i"
JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'",
                "ignoreNullFields": "false"}
KEPT = 64  # Column lists kept (`_shaped`): shapes seen lately
RETRY = (0.5, 5.0)  # seconds before a failed write is tried again, doubling up to the second


@dataclass(frozen=True)
class PlanRoute:
    """Where one plan's rows go: its topics (one per distinct handle topic), the names its
    rows show (its projection, in order) and the frame's columns they are read from."""

    pid: int
    topics: tuple[str, ...]
    projection: tuple[str, ...]
    sources: tuple[str, ...]


def micro_batch_key(epoch: str, batch: int) -> str:
    """The keys' common part for one micro-batch (`m:<epoch>:<batch>:`)."""
    return f"m:{epoch}:{batch}:"


class TopicRows:
    """Writes row plans' rows to their plan topics from the workers (the module docstring).
    `options`: Spark's Kafka sink options (`DeliverySettings.spark_options`)."""

    def __init__(self, options: dict[str, str]) -> None:
        self._options = dict(options)
        self._steps = JvmSteps()
        self._lock = threading.Lock()
        self._routes: tuple[Any, DataFrame] | None = None  # (routes' key, their frame)
        self._values: dict[Any, tuple[Column, list[str]]] = {}  # (routes, types) -> value
        self._exploded: dict[Any, T.StructType] = {}
        self._columns: dict[Any, tuple[object, list[Column]]] = {}  # `_shaped`
        self._counted: Any = None  # the exploding tasks' figures (`_counter`)
        self.written = 0  # write jobs done (observable)
        self.retried = 0  # writes tried again

    # ----- the records --------------------------------------------------------------------------
    def _routes_frame(self, session: Any, routes: Sequence[PlanRoute],
                      projections: dict[tuple[tuple[str, ...], tuple[str, ...]], int]
                      ) -> DataFrame:
        """(plan id, topic, projection index) as a small local table, built when they change,
        hinted for a broadcast."""
        key = tuple((r.pid, r.topics, projections[(r.projection, r.sources)]) for r in routes)
        with self._lock:
            memo = self._routes
            if memo is not None and memo[0] == key:
                return memo[1]
        table = pa.table({PID: pa.array([p for p, ts, _ in key for _ in ts], pa.int64()),
                          TOPIC: pa.array([t for _, ts, _ in key for t in ts], pa.string()),
                          PROJ: pa.array([j for _, ts, j in key for _ in ts], pa.int32())})
        frame: DataFrame = F.broadcast(session.createDataFrame(table))
        with self._lock:
            self._routes = (key, frame)
        return frame

    def _value(self, projections: dict[tuple[tuple[str, ...], tuple[str, ...]], int],
               types: dict[str, T.DataType]) -> Column:
        """The record's value: per projection its JSON object (a CASE over the projection
        index when the plans show more than one)."""
        key = (tuple(sorted(projections.items(), key=lambda kv: kv[1])),
               tuple(sorted((n, t.simpleString()) for n, t in types.items())))
        memo = self._values.get(key)
        if memo is not None:
            return memo[0]
        value: Column | None = None
        for (projection, sources), index in sorted(projections.items(), key=lambda kv: kv[1]):
            fields = [_json_ready(F.col(f"`{src}`"), types[src]).alias(name)
                      for name, src in zip(projection, sources, strict=True)]
            text = F.to_json(F.struct(*fields), JSON_OPTIONS) if fields else F.lit("{}")
            value = text if value is None else \
                F.when(F.col(PROJ) == index, text).otherwise(value)
        assert value is not None
        self._values[key] = (value, [])
        return value

    def records(self, exploded: DataFrame, routes: Sequence[PlanRoute], order: Sequence[str],
                prefix: str) -> DataFrame:
        """(topic, key, value) of every (row, plan topic) of `exploded` (a row per (row,
        plan): its plan id in `PID`, the routes' sources and the order columns)."""
        joined, value = self.routed(exploded, routes)
        order_key = tuple(order)

        def valued() -> list[Column]:
            return [F.col(TOPIC), F.col(PID), value.alias("value"), *[F.col(o) for o in order]]

        def numbered() -> list[Column]:
            # rows that tie in the stream's order are told apart by their plan and their
            # value, so that a write run again numbers every row as the first did, whatever
            # order its tasks give them in (an edge skips a key it read: a row keyed
            # differently the second time would be skipped or repeated); rows alike in all of
            # these are the same record
            ordering = Window.partitionBy(TOPIC).orderBy(
                *[F.col(o).asc_nulls_last() for o in order], F.col(PID), F.col("value"))
            return [F.col(TOPIC), F.col(PID), F.col("value"), *[F.col(o) for o in order],
                    (F.row_number().over(ordering) - 1).alias(INDEX)]

        steps = self._steps
        rows = steps.select(steps.select(joined, self._shaped(("valued", order_key), value,
                                                              valued)),
                            self._shaped(("numbered", order_key), value, numbered))
        topic, index, text = self._shaped(("keyed",), self, lambda: [
            F.col(TOPIC), F.col(INDEX).cast("string"), F.col("value")])
        return rows.select(topic, F.concat(F.lit(prefix), index).cast("binary").alias("key"),
                           text)

    def _shaped(self, key: Any, owner: object, build: Callable[[], list[Column]]
                ) -> list[Column]:
        """The Columns of one of the records' steps, built once per shape while `owner` (the
        value Column they read) is the same object: each is a py4j call, and a batch's records
        were ~0.3 s of them on a loaded machine (py-spy of the batch thread)."""
        with self._lock:
            hit = self._columns.get(key)
        if hit is not None and hit[0] is owner:
            return hit[1]
        columns = build()  # outside the lock: py4j calls
        with self._lock:
            if len(self._columns) >= KEPT:
                self._columns.clear()
            self._columns[key] = (owner, columns)
        return columns

    def routed(self, exploded: DataFrame, routes: Sequence[PlanRoute]
               ) -> tuple[DataFrame, Column]:
        """`exploded` joined with the routes (a broadcast of the small table: a row per (row,
        plan topic)) and the records' value Column over it; shared with the real-time query
        (`pep/runtime/query/realtime.py`), which allows a broadcast join but no window."""
        projections: dict[tuple[tuple[str, ...], tuple[str, ...]], int] = {}
        for r in routes:
            projections.setdefault((r.projection, r.sources), len(projections))
        sources = sorted({s for r in routes for s in r.sources})
        types = {f.name: f.dataType for f in exploded.schema.fields if f.name in sources}
        joined = exploded.join(self._routes_frame(exploded.sparkSession, routes, projections),
                               on=PID)
        return joined, self._value(projections, types)

    # ----- the frames the rows job makes --------------------------------------------------------
    def from_pids(self, frame: DataFrame, routes: Sequence[PlanRoute], order: Sequence[str],
                  prefix: str) -> DataFrame:
        """Records from a rows frame with a list of plan ids per row (`PIDS_COLUMN`)."""
        sources = sorted({s for r in routes for s in r.sources})
        columns = self._shaped(("pids", tuple(sources), tuple(order)), self, lambda: [
            F.explode(F.col(PIDS_COLUMN)).alias(PID),
            *[F.col(f"`{s}`") for s in sources if s not in order], *[F.col(o) for o in order]])
        return self.records(self._steps.select(frame, columns), routes, order, prefix)

    def from_bits(self, admitted: DataFrame, matcher: Any, keep: Sequence[str],
                  routes: Sequence[PlanRoute], order: Sequence[str], prefix: str) -> DataFrame:
        """Records from the grouped matcher's admitted frame (a bitmap per row, and the tasks'
        figures rows): the bitmaps exploded on the workers (`worker_rows.exploded_rows`), the
        figures added to an accumulator (`counted()` once the write is done: a writer's job
        reports no observation, and one more job to count the batch cost as much as a second
        pass over it)."""
        schema = self._exploded_schema(admitted, keep)
        counted = self._counter(admitted.sparkSession)
        counted.value = {}
        exploded = self._steps.map_in_arrow(
            admitted, ("explode", tuple(keep), id(matcher)), matcher,
            lambda: worker_rows.exploded_rows(matcher, list(keep), BITS_COLUMN, PID,
                                              (READ_COLUMN, TOP_COLUMN), counted),
            schema, [f.name for f in admitted.schema.fields])
        return self.records(exploded.where(F.col(PID).isNotNull()), routes, order, prefix)

    def _counter(self, session: Any) -> Any:
        """The accumulator the exploding tasks add their figures to (one per writer: the
        exploding function, built once, closes over it)."""
        with self._lock:
            if self._counted is None:
                self._counted = session.sparkContext.accumulator({}, _PerTask())
            return self._counted

    def counted(self) -> dict[str, Any]:
        """The figures of the batch `from_bits` last wrote: {"rows": tuples read, "seq": their
        highest position or None}, summed over its tasks."""
        per_task = dict(self._counted.value) if self._counted is not None else {}
        tops = [t for _, t in per_task.values() if t is not None]
        return {"rows": sum(r for r, _ in per_task.values()), "seq": max(tops) if tops else None}

    def _exploded_schema(self, admitted: DataFrame, keep: Sequence[str]) -> T.StructType:
        key = tuple(keep)
        schema = self._exploded.get(key)
        if schema is None:
            fields = {f.name: f.dataType for f in admitted.schema.fields}
            schema = T.StructType([T.StructField(PID, T.LongType())]
                                  + [T.StructField(n, fields[n]) for n in keep]
                                  + [T.StructField(READ_COLUMN, T.LongType()),
                                     T.StructField(TOP_COLUMN, T.LongType())])
            self._exploded[key] = schema
        return schema

    # ----- the write ----------------------------------------------------------------------------
    def write(self, records: DataFrame, stopping: Callable[[], bool]) -> None:
        """Write the records with Spark's Kafka sink; a failure is tried again (the same
        records, the same keys) until it succeeds or `stopping()` says the query stops (then
        the failure is raised: the batch is not committed, and runs again)."""
        delay = RETRY[0]
        warned = False
        while True:
            try:
                records.write.format("kafka").options(**self._options).save()
                self.written += 1
                if warned:
                    log.info("plan topics: the rows of a micro-batch were written after the "
                             "brokers came back")
                return
            except Exception as exc:  # the brokers away, or a fault: try again
                if stopping():
                    raise
                self.retried += 1
                if not warned:
                    # never Spark's text: it may quote a row's value (a cast, a record too
                    # large), and what a policy hides reaches no log line
                    log.warning("plan topics: a micro-batch's rows could not be written (%s); "
                                "trying again until the brokers answer", described(exc))
                    warned = True
                time.sleep(delay)
                delay = min(delay * 2, RETRY[1])


class _PerTask(AccumulatorParam[dict[int, Any]]):
    """{partition: figures}: a task's figures replace those of an earlier run of the same task
    (a write tried again, a task retried), so nothing is counted twice."""

    def zero(self, value: dict[int, Any]) -> dict[int, Any]:
        return {}

    def addInPlace(self, a: dict[int, Any], b: dict[int, Any]) -> dict[int, Any]:
        a.update(b)
        return a


def _json_ready(column: Column, dtype: T.DataType) -> Column:
    """A value as the handles' JSON rows have it: a NaN or infinite double is null."""
    if isinstance(dtype, (T.DoubleType, T.FloatType)):
        return F.when(F.isnan(column) | (F.abs(column) == float("inf")), F.lit(None)
                      ).otherwise(column)
    return column


__all__ = ["PID", "PlanRoute", "TopicRows", "described", "micro_batch_key"]
