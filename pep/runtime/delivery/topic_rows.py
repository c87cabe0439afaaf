"""Row plans' rows of a micro-batch written to their plan topics by Spark's Kafka sink on the
workers, inside the stream's foreachBatch: never collected to the driver.

The rows job's frame (each tuple some row plan passes, its projected attributes, its order
columns and the plans that passed it: a list of plan ids, or the grouped matcher's bitmap)
becomes one record per (tuple, plan topic), made on the workers by `worker_rows.py`:

- `topic`: the plan's topic (a plan read by handles of several topics is written to each): the
  Kafka topic of each destination `<topic>#<lane>` the plan's handles are bound to
  (`pep.delivery.lanes`; routed, numbered and ordered per destination, so per lane);
- `value`: the row's JSON object, the plan's projection in its order (`to_json` of a struct,
  natively: doubles as Java prints them, `1.0E20` where the gateway's own encoder writes
  `1e+20`, the same number; NaN and infinities null; timestamps `YYYY-MM-DDTHH:MM:SS.ffffffZ`;
  nulls kept). When the plans show at most `VALUES_BEFORE` projections, each row's object
  under each is made before the rows are repeated per plan (a row passing 100 plans of one
  projection is encoded once, not 100 times), and the worker picks each record's; otherwise
  the records carry the projected attributes and are encoded after;
- `key`: `m:<epoch>:<batch>:<i>` (behind `<lane>|` for a lane), i the row's place among the
  batch's rows of that destination in
  stream order (ordered by the stream's order columns, then by plan, then by the row's
  values: deterministic also for rows that tie in the order columns). A micro-batch that runs
  again after a crash writes the same keys: an edge skips a key it read
  (`pep.edge.reader.KeyLog`). The epoch is the query's checkpoint's (Spark's query id):
  batches are numbered anew only with a new checkpoint.

With the grouped matcher (many plans, `from_bits`) the whole batch's records are made in one
task (the frame coalesced to one partition, so no shuffle: a window over the topics cost a
shuffle and a sort, about 0.25 s of a 0.3-0.5 s micro-batch at 1,000 plan topics), numbered
there per topic and written in stream order by one producer (idempotent, acks=all): one
partition per plan topic keeps them in that order. The micro-batches this path serves are
bounded (the sources' per-trigger caps), so holding one batch's records in the task's memory
is what the window's sort did too. With a few plans (`from_pids`) the rows job's own explode,
a broadcast join with the routes and a window over the topics number them (the upstream stays
in every task; the window's partitioning puts a topic's records in one task).

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
from pep.delivery.lanes import LANE_END, LANE_MARK
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
VALUE = "_xsg_value"  # the value columns made before the records (`_numbered`): VALUE<j>
VALUES_BEFORE = 4  # at most this many projections: each row's values made before the records
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
        self._values: dict[Any, tuple[Column, list[Column]]] = {}  # (projections, types)
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
        return self._encoded(projections, types)[0]

    def _texts(self, projections: dict[tuple[tuple[str, ...], tuple[str, ...]], int],
               types: dict[str, T.DataType]) -> list[Column]:
        """Each projection's JSON object of a row, by projection index."""
        return self._encoded(projections, types)[1]

    def _encoded(self, projections: dict[tuple[tuple[str, ...], tuple[str, ...]], int],
                 types: dict[str, T.DataType]) -> tuple[Column, list[Column]]:
        key = (tuple(sorted(projections.items(), key=lambda kv: kv[1])),
               tuple(sorted((n, t.simpleString()) for n, t in types.items())))
        memo = self._values.get(key)
        if memo is not None:
            return memo
        value: Column | None = None
        texts: list[Column] = []
        for (projection, sources), index in sorted(projections.items(), key=lambda kv: kv[1]):
            fields = [_json_ready(F.col(f"`{src}`"), types[src]).alias(name)
                      for name, src in zip(projection, sources, strict=True)]
            text = F.to_json(F.struct(*fields), JSON_OPTIONS) if fields else F.lit("{}")
            texts.append(text.alias(f"{VALUE}{index}"))
            value = text if value is None else \
                F.when(F.col(PROJ) == index, text).otherwise(value)
        assert value is not None
        self._values[key] = (value, texts)
        return value, texts

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
        projections = _projections(routes)
        sources = _sources(routes)
        types = {f.name: f.dataType for f in exploded.schema.fields if f.name in sources}
        joined = exploded.join(self._routes_frame(exploded.sparkSession, routes, projections),
                               on=PID)
        return joined, self._value(projections, types)

    def lane_records(self, key: Column, value: Column) -> list[Column]:
        """The (topic, key, value) Columns of records to the destinations in the `TOPIC`
        column (`pep.delivery.lanes`): the Kafka topic before `#`, the key behind `<lane>|`
        when there is a lane (both native: the records are made on the workers)."""
        destination = F.col(TOPIC)
        topic, lane = self._shaped(("lanes",), self, lambda: [
            F.substring_index(destination, LANE_MARK, 1).alias("topic"),
            F.when(F.instr(destination, LANE_MARK) > 0,
                   F.concat(F.substring_index(destination, LANE_MARK, -1),
                            F.lit(LANE_END.decode("ascii")))).otherwise(F.lit(""))])
        return [topic, F.concat(lane, key).cast("binary").alias("key"), value.alias("value")]

    # ----- the frames the rows job makes --------------------------------------------------------
    def from_pids(self, frame: DataFrame, routes: Sequence[PlanRoute], order: Sequence[str],
                  prefix: str) -> DataFrame:
        """Records from a rows frame with a list of plan ids per row (`PIDS_COLUMN`: a few
        plans, each row a record or two), natively: exploded, joined with the routes and
        numbered by a window over the topics. A Python step in one task (`from_bits`' way)
        cost more here than the window's shuffle and sort: a Kafka backlog of 100,000 records
        through one plan went at 0.58 of the user's query's rate that way, 0.81-0.82 with the
        window, whose upstream (the source's read and parse) runs in every task
        (`bench_kafka.py --parts throughput`)."""
        sources = _sources(routes)
        columns = self._shaped(("pids", tuple(sources), tuple(order)), self, lambda: [
            F.explode(F.col(PIDS_COLUMN)).alias(PID),
            *[F.col(f"`{s}`") for s in sources if s not in order], *[F.col(o) for o in order]])
        return self._windowed(self._steps.select(frame, columns), routes, order, prefix)

    def _windowed(self, exploded: DataFrame, routes: Sequence[PlanRoute], order: Sequence[str],
                  prefix: str) -> DataFrame:
        """(topic, key, value) of every (row, plan topic) of `exploded` (a row per (row,
        plan): its plan id in `PID`, the routes' sources and the order columns), numbered by
        `row_number` over the topic."""
        joined, value = self.routed(exploded, routes)
        order_key = tuple(order)

        def valued() -> list[Column]:
            return [F.col(TOPIC), F.col(PID), value.alias("value"), *[F.col(o) for o in order]]

        def numbered() -> list[Column]:
            # as the worker's numbering: the stream's order, then the plan, then the value
            ordering = Window.partitionBy(TOPIC).orderBy(
                *[F.col(o).asc_nulls_last() for o in order], F.col(PID), F.col("value"))
            return [F.col(TOPIC), F.col(PID), F.col("value"), *[F.col(o) for o in order],
                    (F.row_number().over(ordering) - 1).alias(INDEX)]

        steps = self._steps
        rows = steps.select(steps.select(joined, self._shaped(("valued", order_key), value,
                                                              valued)),
                            self._shaped(("numbered", order_key), value, numbered))
        index, text = self._shaped(("keyed",), self, lambda: [
            F.col(INDEX).cast("string"), F.col("value")])
        return rows.select(*self.lane_records(F.concat(F.lit(prefix), index), text))

    def from_pids_on_worker(self, frame: DataFrame, routes: Sequence[PlanRoute],
                            order: Sequence[str], prefix: str) -> DataFrame:
        """`from_pids`' records made as `from_bits` makes them (routed and numbered by a
        worker's Python step in one task), for a plan-ids frame: the same keys either way
        (tests hold the two to it)."""
        sources = _sources(routes)
        keep = [*[s for s in sources if s not in order], *order]
        columns = self._shaped(("pids-on-worker", tuple(keep)), self, lambda: [
            F.col(PIDS_COLUMN), *[F.col(f"`{s}`") for s in keep]])
        return self._numbered(self._steps.select(frame, columns), "pids", self,
                              lambda: worker_rows.list_pairs(PIDS_COLUMN), keep, routes,
                              order, prefix, None)

    def from_bits(self, admitted: DataFrame, matcher: Any, keep: Sequence[str],
                  routes: Sequence[PlanRoute], order: Sequence[str], prefix: str) -> DataFrame:
        """Records from the grouped matcher's admitted frame (a bitmap per row, and the tasks'
        figures rows); the figures are added to an accumulator (`counted()` once the write is
        done: a writer's job reports no observation, and one more job to count the batch cost
        as much as a second pass over it)."""
        counted = self._counter(admitted.sparkSession)
        counted.value = {}
        return self._numbered(admitted, ("bits", id(matcher)), matcher,
                              lambda: worker_rows.bitmap_pairs(matcher, BITS_COLUMN), keep,
                              routes, order, prefix, counted)

    def _numbered(self, frame: DataFrame, kind: Any, owner: object,
                  pairs: Callable[[], Any], keep: Sequence[str], routes: Sequence[PlanRoute],
                  order: Sequence[str], prefix: str, counted: Any) -> DataFrame:
        """(topic, key, value) of every (row, plan topic) of `frame`, numbered on the workers
        without a shuffle (`worker_rows.numbered_records`): the frame goes through one task,
        which writes every topic's records in stream order (one producer; one partition per
        plan topic keeps that order)."""
        projections = _projections(routes)
        table_key = tuple((r.pid, r.topics, projections[(r.projection, r.sources)])
                          for r in routes)
        fields = {f.name: f.dataType for f in frame.schema.fields}
        types = {n: fields[n] for n in _sources(routes)}
        figures = (READ_COLUMN, TOP_COLUMN) if counted is not None else None
        key = ("numbered", kind, tuple(keep), tuple(order), table_key)
        out = (TOPIC, PROJ, INDEX, "value")
        if len(projections) <= VALUES_BEFORE:
            texts = self._texts(projections, types)
            values = [f"{VALUE}{j}" for j in range(len(texts))]
            framed = self._steps.select(frame, self._shaped(
                ("valued-before", tuple(fields)), texts, lambda: [
                    *[F.col(f"`{n}`") for n in fields], *texts]))
            schema = T.StructType([T.StructField(TOPIC, T.StringType()),
                                   T.StructField(INDEX, T.LongType()),
                                   T.StructField("value", T.StringType())])
            numbered = self._steps.map_in_arrow(
                framed.coalesce(1), (*key, "values"), owner,
                lambda: worker_rows.numbered_records(
                    pairs(), [*order, *values], list(order),
                    worker_rows.route_table(table_key), out, figures, counted, values),
                schema, [*fields, *values])
            index, text = self._shaped(("keyed",), self, lambda: [
                F.col(INDEX).cast("string"), F.col("value")])
        else:
            schema = T.StructType([T.StructField(TOPIC, T.StringType()),
                                   T.StructField(PROJ, T.IntegerType()),
                                   T.StructField(INDEX, T.LongType()),
                                   *[T.StructField(n, fields[n]) for n in keep]])
            numbered = self._steps.map_in_arrow(
                frame.coalesce(1), key, owner,
                lambda: worker_rows.numbered_records(
                    pairs(), list(keep), list(order), worker_rows.route_table(table_key),
                    out, figures, counted),
                schema, list(fields))
            value = self._value(projections, types)
            index, text = self._shaped(("keyed-after",), value, lambda: [
                F.col(INDEX).cast("string"), value.alias("value")])
        return numbered.select(*self.lane_records(F.concat(F.lit(prefix), index), text))

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


def _projections(routes: Sequence[PlanRoute]
                 ) -> dict[tuple[tuple[str, ...], tuple[str, ...]], int]:
    """Each distinct (projection, sources) of the routes, numbered in order of appearance (the
    records' projection index)."""
    projections: dict[tuple[tuple[str, ...], tuple[str, ...]], int] = {}
    for r in routes:
        projections.setdefault((r.projection, r.sources), len(projections))
    return projections


def _sources(routes: Sequence[PlanRoute]) -> list[str]:
    """The frame's columns the routes' records read, sorted."""
    return sorted({s for r in routes for s in r.sources})


def _json_ready(column: Column, dtype: T.DataType) -> Column:
    """A value as the handles' JSON rows have it: a NaN or infinite double is null."""
    if isinstance(dtype, (T.DoubleType, T.FloatType)):
        return F.when(F.isnan(column) | (F.abs(column) == float("inf")), F.lit(None)
                      ).otherwise(column)
    return column


__all__ = ["PID", "PlanRoute", "TopicRows", "described", "micro_batch_key"]
