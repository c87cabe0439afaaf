"""A micro-batch's work: which jobs run (the few-plans or grouped matcher, the plan table, the
panes job), the stream's figures observed on them, and their results handed to the route worker,
which delivers them one batch behind the query (`query/route_worker.py`). Whether a batch may run at
all (a stop under way, a batch delivered before a restart) is the life cycle's to say
(`lifecycle.py`).
"""
from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession

from pep.runtime.base.jvm_steps import JvmSteps
from pep.runtime.delivery.writer import TopicWriter
from pep.runtime.plans.batch_shape import Shape
from pep.runtime.plans.matcher import GroupedMatcher
from pep.runtime.query.batch_columns import observed, order_columns
from pep.runtime.query.figures import QueryFigures
from pep.runtime.query.panes_job import PanesJob
from pep.runtime.query.plan_table import PlanTable
from pep.runtime.query.registry import PlanRegistry, PlanSets
from pep.runtime.query.route_worker import DRAIN_WAIT, RouteWorker
from pep.runtime.query.router import ResultRouter
from pep.runtime.query.rows_job import RowsJob, RowsMatcher
from pep.runtime.query.settings import StreamLayout
from pep.runtime.query.shield import BatchShield, PunctuationShield
from pep.runtime.query.source_shield import SourceShield

log = logging.getLogger(__name__)

Route = Callable[[], list[str]]  # a batch's results into the handles; the handles that closed
# Observation names, unique in the process (uuid4 reads os.urandom: a system call that gives the
# GIL away, up to a 5 ms wait for it under load, in every batch)
_OBSERVATIONS = itertools.count(1)


class MicroBatchRunner:
    """Runs a micro-batch's jobs over the registry's plans and hands their results to the route
    worker it owns. `on_handle_closed(handle_id)`: a handle whose delivery refused or failed
    (the runtime detaches it)."""

    def __init__(self, spark: SparkSession, layout: StreamLayout, registry: PlanRegistry,
                 table: PlanTable, rows: RowsJob, panes: PanesJob, router: ResultRouter,
                 figures: QueryFigures, on_handle_closed: Callable[[str], None],
                 shield: PunctuationShield | SourceShield | None = None,
                 topics: TopicWriter | None = None) -> None:
        self._spark = spark
        self._layout = layout
        self._registry = registry
        self._table = table
        self._rows = rows
        self._panes = panes
        self._router = router
        self._figures = figures
        self._on_handle_closed = on_handle_closed
        # delivery through plan topics (pep/runtime/delivery): the row plans whose handles read
        # topics are written from the workers in the batch; None: every row to the driver
        self._topics = topics
        self._shield = shield  # the stream's security punctuations (`query/shield.py`)
        # a Kafka stream's rows read come from Spark's progress, which counts punctuation
        # records: a punctuated one's tuples are counted by its shield instead
        self._counting = (shield if isinstance(shield, SourceShield) and layout.kafka
                          else None)
        if self._counting is not None:
            figures.counted_by_shield()
        # a batch's results are delivered one batch behind the query (`query/route_worker.py`)
        self._worker = RouteWorker(f"xsg-route-{layout.name}", figures.failed)
        self._codegen: str | None = None  # whole-stage codegen as set in the query's session
        self._steps = JvmSteps()  # the observation's steps

    def redefine(self, layout: StreamLayout) -> None:
        """The stream's definition changed."""
        self._layout = layout

    def new_session(self) -> None:
        """The batches come from another session from now on (a new query clones one; a
        replay runs in the gateway's): the codegen setting is made there again."""
        self._codegen = None

    # ----- the route worker -------------------------------------------------------------------
    def drain(self, timeout: float = DRAIN_WAIT) -> None:
        """Wait until the batch in flight is delivered (raises `RoutingFailed` if delivering
        it failed)."""
        self._worker.drain(timeout)

    def close(self) -> None:
        """The query stopped: the route worker's thread ends once the batch in flight is done."""
        self._worker.close()

    def in_worker(self) -> bool:
        """On the route worker, delivering a batch."""
        return self._worker.in_worker()

    # ----- a micro-batch ----------------------------------------------------------------------
    def began(self) -> None:
        """A micro-batch was let in (before it is run or skipped)."""
        self._registry.batch_ran()

    def run(self, batch: DataFrame, batch_id: int) -> None:
        """The batch's jobs; their results are routed on the route worker, after the batch
        before this one."""
        sets = self._registry.plan_sets()
        plans, version = sets.plans, sets.version
        if not plans:
            self._worker.submit(functools.partial(self._batch_routed, batch_id, []))
            return
        if sets.keeps_windows:
            # the plan table carries tuple windows' pane offsets, and time windows advance
            # their watermarks, in routing: the batch before this one is routed first
            self._worker.drain()
        t0 = time.perf_counter()
        guard = None
        if self._shield is not None:  # (a files or kafka stream's: its punctuations taken out)
            batch, guard = self._shield.shielded(batch)
            if self._counting is not None:
                self._figures.tuples_read(self._counting.tuples)
        self._table.anchors.update(batch, sets.anchored)  # nothing without DISTANCE_TO
        shape = self._table.shape_of(plans, version)
        rows_by = self._rows.matcher(sets, shape)
        scalar = None
        if rows_by is None or sets.windowed:
            # the plan table: only for what the compiled matchers leave to it
            _, scalar = self._table.plan_table(plans, version, shape)
        t1 = time.perf_counter()
        route: Route | None = None
        spark_s = 0.0
        if scalar is not None or rows_by is not None:
            route, spark_s = self._evaluate(batch, sets, shape, scalar, rows_by, guard,
                                            batch_id)
        self._figures.evaluated(len(plans))
        # Spark commits this batch and prepares the next while its rows are delivered
        # (`query/route_worker.py`); the one before it is routed first
        self._worker.submit(functools.partial(self._batch_routed, batch_id, [route],
                                              t1 - t0, spark_s))

    def route_later(self, batch_id: int, route: Route | None, spark_s: float = 0.0) -> None:
        """A batch whose jobs ran elsewhere (the shared query, `pep/runtime/shared/`): its
        results routed on this stream's route worker, after the batch before it."""
        self._worker.submit(functools.partial(self._batch_routed, batch_id, [route], 0.0,
                                              spark_s))

    def _batch_routed(self, batch_id: int, routes: list[Route | None], table_s: float = 0.0,
                      spark_s: float = 0.0) -> None:
        """On the route worker: deliver a batch's results, then count it delivered."""
        started = time.perf_counter()
        closed: list[str] = []
        self._router.begin(batch_id)
        for route in routes:
            if route is not None:
                closed += route()
        if routes:
            # the jobs incl. toArrow, then the driver's share (windows, encoding, delivery):
            # the split tests/bench reads
            log.debug("batch %s: table %.3f eval %.3f route %.3f", batch_id, table_s, spark_s,
                      time.perf_counter() - started)
        if self._topics is not None:
            self._topics.flush()  # the driver's records are on the brokers before "delivered"
        self._router.delivered(batch_id)
        for handle_id in closed:
            self._on_handle_closed(handle_id)

    def _evaluate(self, batch: DataFrame, sets: PlanSets, shape: Shape,
                  scalar: Column | None, rows_by: RowsMatcher | None = None,
                  guard: BatchShield | None = None, batch_id: int = 0) -> tuple[Route, float]:
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
            if not session._jsparkSession.equals(self._spark._jsparkSession):
                session.conf.set("spark.sql.codegen.wholeStage", codegen)
            self._codegen = codegen
        # the stream's figures: counted by the grouped matcher's tasks when it runs, else
        # observed on the batch's first job (a Kafka stream's rows come from Spark's progress)
        from_progress = self._layout.kafka
        counted = grouped is not None and bool(plain) and bool(shape.plain_columns)
        # the row plans whose handles read plan topics are written from the workers; the rest
        # (windows' rows, unions' members, handles in this process) come to the driver
        # (a punctuated stream's rows pass its shield on the driver first: all to the driver)
        worker, driver_plain = (self._topics.split(plain)
                                if self._topics is not None and guard is None else ([], plain))
        # a write to the plan topics as the batch's only job: Spark's writer runs it as a
        # command, whose observed metrics never reach the observation (it would wait forever):
        # the grouped matcher's tasks count the batch on the way (`TopicRows.counted`), else
        # the figures come from one more small job
        writes_only = bool(worker) and not driver_plain and not windowed
        observation = None
        observed_batch = batch
        if not from_progress and not counted and not writes_only:
            observed_batch, observation = self._steps.observe(
                batch, f"xsg_observed_{next(_OBSERVATIONS)}", observed(shape))
        rows_arrow: pa.Table | None = None
        panes_arrow: pa.Table | None = None
        figures: dict[str, Any] = {}
        if plain and shape.plain_columns:
            if driver_plain and grouped is not None:
                rows_arrow, counts = self._rows.admitted_arrow(observed_batch, shape, grouped)
                if not from_progress:
                    figures = counts
            elif driver_plain and (few is not None or scalar is not None):
                rows_arrow = self._rows.rows_frame(observed_batch, scalar, shape, few).toArrow()
            if worker:
                tasks_counted = self._write_topics(observed_batch, shape, scalar, few, grouped,
                                                   worker, batch_id)
                if writes_only and tasks_counted is not None and not from_progress:
                    figures, writes_only = tasks_counted, False  # no job more to count it
            panes_source = batch
        else:
            panes_source = observed_batch
        # no plan table while every window plan passes nothing: no panes (`route_panes`)
        if windowed and scalar is not None:
            # on a punctuated stream, each tuple only in the windows of the plans its segment
            # lets count it (`BatchShield.window_filter`)
            shielded = guard.window_filter(windowed, batch) if guard is not None else None
            panes_arrow = self._panes.panes_frame(panes_source, scalar, shape,
                                                  shielded).toArrow()
        computed = writes_only and not from_progress
        try:
            if observation is not None:
                figures = self._steps.observed(batch, observation)
        except Exception as exc:  # noqa: BLE001 - the figures come from one more job (below)
            # pyspark 4.2.0 (the version Kafka pins) sometimes had no observed row for a Kafka
            # micro-batch whose only job was the panes job (toPyRow's assertion fails; Kafka
            # batches no longer observe): the same figures from one more small job
            log.debug("stream %s: observed figures unavailable (%s); computed",
                      self._layout.name, type(exc).__name__)
            computed = True
        if computed:
            row = batch.agg(*observed(shape)).first()  # an aggregate: always one row
            figures = row.asDict() if row is not None else {}
        spark_s = time.perf_counter() - started
        self._figures.observed(figures)
        for arrow in (rows_arrow, panes_arrow):
            if arrow is not None:
                self._figures.collected(arrow)
        router = self._router
        written = frozenset(s.id for s in worker)

        def route() -> list[str]:
            closed: list[str] = []
            if rows_arrow is not None and rows_arrow.num_rows:
                closed += router.route_rows(rows_arrow, driver_plain, shape, grouped, written,
                                            shield=guard)
            if windowed:
                closed += router.route_panes(panes_arrow, windowed, shape)
            return closed
        return route, spark_s

    def _write_topics(self, batch: DataFrame, shape: Shape, scalar: Column | None,
                      few: Column | None, grouped: GroupedMatcher | None, worker: list[Any],
                      batch_id: int) -> dict[str, Any] | None:
        """The rows of the plans whose handles read plan topics, written from the workers
        (`pep.runtime.delivery`); the batch's figures when the grouped matcher's tasks counted
        them on the way (None otherwise)."""
        topics = self._topics
        assert topics is not None
        layout = self._layout
        routes = topics.routes(worker, lambda s: tuple(layout.row_columns(
            s.compiled, s.compiled.projection)))
        order = order_columns(layout, shape)
        position = self._router.position(batch_id)
        if grouped is not None:
            keep = list(shape.plain_columns) + order
            topics.write_bits(self._rows.admitted_frame(batch, shape, grouped), grouped, keep,
                              routes, order, position)
            return topics.rows.counted() if routes else None
        if few is not None or scalar is not None:
            topics.write_pids(self._rows.rows_frame(batch, scalar, shape, few), routes, order,
                              position)
        return None


__all__ = ["MicroBatchRunner", "Route"]
