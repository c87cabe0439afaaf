"""One shared Structured Streaming query per source stream, serving every attached plan.

Per micro-batch, at most two Spark jobs evaluate every attached plan with fixed-shape, data-
driven expressions: the plans are the contents of a one-row table (an array of plan structs:
kind, conjuncts of predicate structs, start position, pane width, attribute indices) that the
batch reads as a scalar subquery, and generic expressions read attributes by index from per-row
value arrays. The physical plan therefore never depends on how many handles are attached or on
their constants (only on the schema, on which attributes the plans project, aggregate or group
by, and on how many attributes of each kind a window plan aggregates); nothing is recompiled
when a handle attaches, and constants travel as data (never as SQL text).

- Rows job (plans without a window): each tuple that passes at least one such plan comes back
  once, with only the attributes those plans project and the ids of the plans it passed.
  The driver orders the rows (stream order), encodes them once per distinct projection (Arrow
  kernels, `encode.py`) and gives each plan one `RowBatch`, shared by its handles.
- Panes job (window plans): each tuple is paired with the window plans it passes; tuple
  windows number their tuples per plan (and key) with a window function, offset by the count
  the driver carries; time windows use the epoch-aligned pane of the event time. Spark then
  aggregates per (plan, key, pane): tuples, and per aggregated attribute the count, sum, min,
  max, first and last non-null value. The driver combines panes into windows (`windows.py`).
The stream's own figures (tuples in, highest position) come without another pass over the
batch: with the grouped matcher its tasks count them (`matcher.admitted_rows`), otherwise they
are observed on the same jobs (`DataFrame.observe`); a Kafka stream, which has no positions,
takes its tuples in from Spark's progress reports instead (`progress.py`). Time is
per plan: each time-window plan's watermark is the largest event time among the tuples its own
filter passed (a max per pane in the panes job), so a tuple a plan's policy hides moves none of
its time.

This module runs the micro-batch (which jobs; their results are then routed by the stream's
route worker, one batch behind the query: `route_worker.py`); the layers below
`StreamExecutor` each have one job (`executor_state.py` lists them).
"""
from __future__ import annotations

import functools
import itertools
import json
import logging
import threading
import time
from typing import Any, Callable

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pep.core.rows import RowBatch
from pep.runtime.compile import CompiledPlan
from pep.runtime.delivery import deliver_to
from pep.runtime.kafka_offsets import KafkaOffsets
from pep.runtime.matcher import GroupedMatcher, kafka_positions
from pep.runtime.columns import FILE_COLUMN
from pep.runtime.plan_expressions import FEW_PLANS, few_plans_column
from pep.runtime.executor_state import PlanSets, PlanState
from pep.runtime.batch_shape import Shape
from pep.runtime.query_lifecycle import QueryLifecycle
from pep.runtime.replay import (BatchRange, batch_of, batch_ranges, batch_start, covers,
                                last_committed, offsets_json, split_by_batch, still_held)
from pep.runtime.sources import kafka_options, kafka_range_frame

log = logging.getLogger(__name__)

Route = Callable[[], list[str]]  # a batch's results into the handles; the handles that closed
# Observation names, unique in the process (uuid4 reads os.urandom: a system call that gives the
# GIL away, up to a 5 ms wait for it under load, in every batch)
_OBSERVATIONS = itertools.count(1)


def replayable_compiled(plan: CompiledPlan) -> bool:
    """A compiled plan whose rows a restart can compute again (`pep.core.plan.replayable`):
    cut at Kafka offsets, no window, no DISTANCE_TO anchor."""
    return plan.start_offsets is not None and plan.window is None and not plan.anchors


class StreamExecutor(QueryLifecycle):
    """The shared query of one stream; its foreachBatch runs every attached plan."""

    def _on_batch(self, batch: DataFrame, batch_id: int) -> None:
        self._batch_thread = threading.get_ident()  # before the check: a stop waits for it
        if self._pausing:
            # never committed: the query is being stopped between two batches (a restart, the
            # gateway stopping) and the next query runs this batch
            self._batch_thread = None
            raise self._held_for_stop()
        started = time.perf_counter()
        self.last_batch_started_at = time.time()
        self._ran_batch = True
        try:
            if self._stopped:
                return
            if batch_id <= self._completed_batch:
                return  # run again after a restart: delivered in full before the stop
            if self._skip_names is not None:
                # the files present when the stream's first handle attached are not delivered
                names = sorted(self._skip_names)
                self._skip_names = None
                batch = batch.where(~F.element_at(F.split(F.col(FILE_COLUMN), "/"), -1)
                                    .isin(*names))
            sets = self._plan_sets()
            plans, version = sets.plans, sets.version
            if not plans:
                self._router.submit(functools.partial(self._batch_routed, batch_id, []))
                return
            if sets.keeps_windows:
                # the plan table carries tuple windows' pane offsets, and time windows advance
                # their watermarks, in routing: the batch before this one is routed first
                self._router.drain()
            t0 = time.perf_counter()
            self._anchors.update(batch, sets.anchored)  # nothing without DISTANCE_TO
            shape = self._shape_of(plans, version)
            rows_by = self._rows_matcher(sets, shape)
            scalar = None
            if rows_by is None or sets.windowed:
                # the plan table: only for what the compiled matchers leave to it
                table, scalar = self._plan_table(plans, version, shape)
            t1 = time.perf_counter()
            route: Route | None = None
            spark_s = 0.0
            if scalar is not None or rows_by is not None:
                route, spark_s = self._evaluate(batch, sets, shape, scalar, rows_by)
            self.stats_counters["batches"] += 1
            self.stats_counters["plan_evaluations"] += len(plans)
            # Spark commits this batch and prepares the next while its rows are delivered
            # (`route_worker.py`); the one before it is routed first
            self._router.submit(functools.partial(self._batch_routed, batch_id, [route],
                                                  t1 - t0, spark_s))
        except Exception as exc:
            if self._stopped:
                return  # the job was cancelled by stop(); nothing is delivered any more
            self.stats_counters["last_error"] = f"{type(exc).__name__}: {exc}"
            log.exception("stream %s: micro-batch %s failed", self.definition.name, batch_id)
            raise
        finally:
            self._batch_thread = None
            self.stats_counters["last_batch_ms"] = round((time.perf_counter() - started) * 1000, 1)
            if not self._stopped:
                self.last_batch_at = time.time()

    def _batch_routed(self, batch_id: int, routes: list[Route | None], table_s: float = 0.0,
                      spark_s: float = 0.0) -> None:
        """On the route worker: deliver a batch's results, then count it delivered."""
        started = time.perf_counter()
        closed: list[str] = []
        self._routing_batch = self._batch_base + batch_id
        for route in routes:
            if route is not None:
                closed += route()
        if routes:
            # the jobs incl. toArrow, then the driver's share (windows, encoding, delivery):
            # the split tests/bench reads
            log.debug("batch %s: table %.3f eval %.3f route %.3f", batch_id, table_s, spark_s,
                      time.perf_counter() - started)
        self._completed_batch = max(self._completed_batch, batch_id)
        for handle_id in closed:
            self._on_handle_closed(handle_id)

    def _rows_matcher(self, sets: PlanSets, shape: Shape) -> Column | GroupedMatcher | None:
        """How the rows job matches tuples to the row plans: a few plans, one compiled Column
        each (`few_plans_column`); more, the `GroupedMatcher` (one compiled job returning the
        values the filters read, the tests as array kernels per shape); None: the plan table
        (spatial, masked or label comparisons)."""
        if shape.spatial or shape.masked:
            return None
        plain = sets.plain
        if not plain:
            return None
        if len(plain) <= FEW_PLANS and not sets.windowed:
            key = tuple((s.id, s.compiled.key, s.compiled.start_after) for s in plain)
            if self._few is None or self._few[0] != key:
                self._few = (key, few_plans_column([(s.id, s.compiled) for s in plain],
                                                     self._schema))
            return self._few[1]
        if self._grouped is None or self._grouped[0] != sets.version:
            self._grouped = (sets.version,
                             GroupedMatcher.build([(s.id, s.compiled) for s in plain]))
        return self._grouped[1]

    def _evaluate(self, batch: DataFrame, sets: PlanSets, shape: Shape,
                  scalar: Column | None, rows_by: Column | GroupedMatcher | None = None
                  ) -> tuple[Route, float]:
        """Run the batch's jobs; (what routes their results into the handles and returns the
        handles that closed on the way, seconds in Spark jobs)."""
        started = time.perf_counter()
        plain, windowed = sets.plain, sets.windowed
        # A few plain plans: one compiled Column each (`few_plans_column`), with whole-stage
        # code generation. Otherwise the plan table, whose lambdas Spark evaluates per row
        # without generated code (higher-order functions fall back to interpretation); inside
        # whole-stage code generation that fallback copies the row, the whole plan table
        # included, for every row, so it is turned off: the jobs ran 1.2-8 times faster (1,000
        # plans over 5,000 rows: 1.9 s -> 1.2 s, 9 s -> 1.1 s with a spatial predicate). Only
        # in the stream query's own clone of the session (a batch handed in from the gateway's
        # session, as some tests do, leaves it alone), so other queries keep their setting.
        few = rows_by if isinstance(rows_by, Column) else None
        grouped = rows_by if isinstance(rows_by, GroupedMatcher) else None
        codegen = "true" if rows_by is not None and not windowed else "false"
        if codegen != self._codegen:  # a query keeps its session: set when the choice changes
            session = batch.sparkSession
            if not session._jsparkSession.equals(self.spark._jsparkSession):
                session.conf.set("spark.sql.codegen.wholeStage", codegen)
            self._codegen = codegen
        # the stream's figures: counted by the grouped matcher's tasks when it runs, else
        # observed on the batch's first job (a Kafka stream's rows come from Spark's progress)
        counted = grouped is not None and bool(plain) and bool(shape.plain_columns)
        observation = None
        observed = batch
        if not self._rows_from_progress and not counted:
            observed, observation = self._steps.observe(
                batch, f"xsg_observed_{next(_OBSERVATIONS)}", self._observed(shape))
        rows_arrow = panes_arrow = None
        figures: dict[str, Any] = {}
        if plain and shape.plain_columns:
            if grouped is not None:
                rows_arrow, counts = self.admitted_arrow(observed, shape, grouped)
                if not self._rows_from_progress:
                    figures = counts
            elif few is not None or scalar is not None:
                rows_arrow = self.rows_frame(observed, scalar, shape, few).toArrow()
            panes_source = batch
        else:
            panes_source = observed
        # no plan table while every window plan passes nothing: no panes (`_route_panes`)
        if windowed and scalar is not None:
            panes_arrow = self.panes_frame(panes_source, scalar, shape).toArrow()
        try:
            if observation is not None:
                figures = self._steps.observed(batch, observation)
        except Exception as exc:  # noqa: BLE001
            # pyspark 4.2.0 (the version Kafka pins) sometimes had no observed row for a Kafka
            # micro-batch whose only job was the panes job (toPyRow's assertion fails; Kafka
            # batches no longer observe): the same figures from one more small job
            log.debug("stream %s: observed figures unavailable (%s); computed",
                      self.definition.name, type(exc).__name__)
            row = batch.agg(*self._observed(shape)).first()  # an aggregate: always one row
            figures = row.asDict() if row is not None else {}
        spark_s = time.perf_counter() - started
        self._observe(figures, shape)
        for arrow in (rows_arrow, panes_arrow):
            if arrow is not None:
                self.stats_counters["driver_rows"] += arrow.num_rows
                self.stats_counters["driver_bytes"] += arrow.nbytes

        def route() -> list[str]:
            closed: list[str] = []
            if rows_arrow is not None and rows_arrow.num_rows:
                closed += self._route_rows(rows_arrow, plain, shape, grouped)
            if windowed:
                closed += self._route_panes(panes_arrow, windowed, shape)
            return closed
        return route, spark_s

    # ----- a restart: what the restored handles' readers may not have read --------------------
    def replay(self, fresh: bool) -> None:
        """Before a restored Kafka stream's query starts: each replayable handle (a positioned
        buffer, `pep.core.plan.replayable`) is told from which micro-batch on its rows follow
        (`RowBatch.resumed_from`), then given again the rows of every batch its stream's
        checkpoint names and its topic still holds, up to the last one delivered (Spark runs
        the rest), under the ids they had (`replay.py`). `fresh`: the query starts without a
        checkpoint: nothing can be read again. A replay that fails (the broker away) leaves
        the rows of those batches lost, and says so (`resumed_from`: the first live batch)."""
        assert self._checkpoint is not None
        with self._lock:
            unions = [u for u in self._unions.values()
                      if u.handles and all(self._plans[m].windows is None
                                           and replayable_compiled(self._plans[m].compiled)
                                           for m in u.members)]
            members = {m for u in unions for m in u.members}
            states = [s for s in self._plans.values()
                      if (s.handles or s.id in members) and s.rows and s.windows is None
                      and replayable_compiled(s.compiled)]
            targets = [(h, s.compiled.start_offsets) for s in states
                       for h in s.handles.values()]
            targets += [(h, u.compiled.members[0].start_offsets) for u in unions
                        for h in u.handles.values()]
        if not targets:
            return
        location = self._checkpoint.location
        topic = kafka_options(self.definition)[1]
        last = -1 if fresh else max(last_committed(location), self._completed_batch)
        ranges: list[BatchRange] = []
        replayed: list[tuple[int, pa.Table]] = []
        shape: Shape | None = None
        grouped: GroupedMatcher | None = None
        started = time.perf_counter()
        if last >= 0:
            try:
                ranges = batch_ranges(location, topic, last)
                if ranges:
                    earliest = KafkaOffsets().start_offsets(self.definition)
                    ranges = still_held(ranges, dict(enumerate(earliest)))
                if ranges:
                    replayed, shape, grouped = self._replay_rows(ranges, states)
            except Exception as exc:  # noqa: BLE001 - the handles resume; the rows are lost
                log.warning("stream %s: the micro-batches before the restart could not be "
                            "read again (%s: %s); readers that had not read them get a gap",
                            self.definition.name, type(exc).__name__, exc)
                ranges, replayed = [], []
        first = ranges[0].batch if ranges else last + 1
        start = None if fresh else (ranges[0].start if ranges
                                    else batch_start(location, topic, first))
        for handle, cut in targets:
            whole = start is not None and cut is not None and covers(cut, start)
            marker = RowBatch((), 0, resumed_from=0 if whole else self._batch_base + first)
            deliver_to([handle], marker, self.stats_counters)
        try:
            for batch_id, table in replayed:
                self._routing_batch = self._batch_base + batch_id
                if table.num_rows and shape is not None:
                    self._route_rows(table, states, shape, grouped, unions)
        finally:
            self._routing_batch = None
        if ranges:
            log.info("stream %s: micro-batches %d-%d read again for %d restored handles "
                     "(%.2f s)", self.definition.name, ranges[0].batch, ranges[-1].batch,
                     len(targets), time.perf_counter() - started)

    def _replay_rows(self, ranges: list[BatchRange], states: list[PlanState]
                     ) -> tuple[list[tuple[int, pa.Table]], Shape, GroupedMatcher | None]:
        """The rows job of `states` over the records of `ranges`, read again from Kafka (one
        batch query), split by the micro-batch each record came in."""
        topic = kafka_options(self.definition)[1]
        partitions = sorted({p for r in ranges for p in (*r.start, *r.end)})
        start = {p: ranges[0].start.get(p, 0) for p in partitions}
        end = {p: ranges[-1].end.get(p, start[p]) for p in partitions}
        frame = kafka_range_frame(self.spark, self.definition,
                                  json.dumps({topic: partitions}), offsets_json(topic, start),
                                  offsets_json(topic, end))
        version = -1 - self._version  # its own shape and tables, rebuilt for the live query
        sets = PlanSets.of(version, states)
        shape = self._shape_of(states, version)
        rows_by = self._rows_matcher(sets, shape)
        grouped = rows_by if isinstance(rows_by, GroupedMatcher) else None
        if grouped is not None:
            arrow, _ = self.admitted_arrow(frame, shape, grouped)
        else:
            _, scalar = self._plan_table(states, version, shape)
            arrow = self.rows_frame(frame, scalar, shape,
                                    rows_by if isinstance(rows_by, Column) else None).toArrow()
        parts, offsets = kafka_positions(arrow.column(FILE_COLUMN))
        return split_by_batch(arrow, batch_of(parts, offsets, ranges), ranges), shape, grouped

    def _observe(self, figures: dict[str, Any], shape: Shape) -> None:
        self.stats_counters["rows_in"] += int(figures.get("rows") or 0)
        seq = figures.get("seq")
        if seq is not None:
            top = self.stats_counters["max_position"]
            self.stats_counters["max_position"] = seq if top is None else max(top, seq)


__all__ = ["StreamExecutor"]
