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
  kernels, `base/encode.py`) and gives each plan one `RowBatch`, shared by its handles.
- Panes job (window plans): each tuple is paired with the window plans it passes; tuple
  windows number their tuples per plan (and key) with a window function, offset by the count
  the driver carries; time windows use the epoch-aligned pane of the event time. Spark then
  aggregates per (plan, key, pane): tuples, and per aggregated attribute the count, sum, min,
  max, first and last non-null value. The driver combines panes into windows
  (`windows/pane_windows.py`).
The stream's own figures (tuples in, highest position) come without another pass over the
batch: with the grouped matcher its tasks count them (`matcher.admitted_rows`), otherwise they
are observed on the same jobs (`DataFrame.observe`); a Kafka stream, which has no positions,
takes its tuples in from Spark's progress reports instead (`query/progress.py`). Time is
per plan: each time-window plan's watermark is the largest event time among the tuples its own
filter passed (a max per pane in the panes job), so a tuple a plan's policy hides moves none of
its time.

`StreamExecutor` is the wiring: it makes the parts, each the one owner of its state, hands each
the others it uses, and answers the stream runtime (`runtime.py`; about its handles through
`StreamHandles`, the same part a stream on the shared query has). The parts, from the bottom:
`PlanRegistry` (handles and plan states), `PlanTable` (the batch's shape, the plan table, the
anchors), `RowsJob` and `PanesJob` (the batch's Spark jobs), `ResultRouter` (results into the
handles), `MicroBatchRunner` (a micro-batch's work, the route worker), `KafkaReplay` (a restored
Kafka stream's rows again), `QueryLifecycle` (the query: start, stop, the batches' gate, health).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from pep.core import punctuations
from pep.core.plan import StreamDefinition
from pep.runtime.delivery.driver_rows import DriverRows
from pep.runtime.delivery.topic_rows import TopicRows
from pep.runtime.delivery.writer import TopicWriter
from pep.runtime.query.figures import QueryFigures
from pep.runtime.query.kafka_replay import KafkaReplay
from pep.runtime.query.lifecycle import QueryLifecycle
from pep.runtime.query.panes_job import PanesJob
from pep.runtime.query.plan_table import PlanTable
from pep.runtime.query.realtime import RealTimeRows
from pep.runtime.query.realtime_mode import RealTimeMode
from pep.runtime.query.registry import PlanRegistry
from pep.runtime.query.router import ResultRouter
from pep.runtime.query.rows_job import RowsJob
from pep.runtime.query.runner import MicroBatchRunner
from pep.runtime.query.settings import DEFAULT_TUPLE_PANE_MIN, QuerySettings, StreamLayout
from pep.runtime.query.shield import PunctuationShield
from pep.runtime.query.source_shield import SourceShield
from pep.runtime.query.stream_handles import StreamHandles
from pep.runtime.sources.frames import KAFKA_MAX_OFFSETS, KAFKA_TOPICS_MAX_OFFSETS


class StreamExecutor:
    """The shared query of one stream: its parts, wired once; what the stream runtime asks of
    it. `on_handle_closed(handle_id)`: a handle's delivery refused or failed (the runtime
    detaches it); `mask_key(owner)`: the owner's key of hash masks."""

    def __init__(self, spark: SparkSession, definition: StreamDefinition, work_dir: Path,
                 trigger_interval: float, max_files_per_trigger: int, lateness: float,
                 on_handle_closed: Callable[[str], None],
                 tuple_pane_min: int = DEFAULT_TUPLE_PANE_MIN,
                 mask_key: Callable[[str], bytes] | None = None,
                 topics: tuple[dict[str, str], DriverRows] | None = None,
                 realtime: float = 0.0) -> None:
        """`topics`: delivery through plan topics (Spark's Kafka sink options, the runtime's
        producer of the driver's rows), `pep.runtime.delivery`; `realtime`: seconds of a
        real-time batch, for a Kafka stream whose plans qualify (0: micro-batches only,
        `pep.runtime.query.realtime`)."""
        settings = QuerySettings(spark, Path(work_dir), trigger_interval, max_files_per_trigger,
                                 tuple_pane_min, mask_key,
                                 KAFKA_TOPICS_MAX_OFFSETS if topics is not None
                                 else KAFKA_MAX_OFFSETS)
        layout = StreamLayout.of(definition)
        self._settings = settings
        self._layout = layout
        self.figures = QueryFigures()
        self.registry = PlanRegistry(tuple_pane_min)
        self.table = PlanTable(spark, layout, mask_key)
        self.rows = RowsJob(layout)
        self.panes = PanesJob(layout)
        writer = None if topics is None else TopicWriter(
            TopicRows(topics[0]), topics[1], epoch=lambda: self.lifecycle.checkpoint_id(),
            stopping=lambda: self.lifecycle.stopping)
        realtime_rows = (RealTimeRows(writer.rows, topics[0], realtime)
                         if writer is not None and topics is not None and realtime > 0 else None)
        self.router = ResultRouter(layout, self.registry, self.figures, lateness, writer)
        # real-time mode follows the plans (`QueryLifecycle.plans_changed`)
        self.handles = StreamHandles(self.registry, self.router, self.figures,
                                     on_change=lambda: self.lifecycle.plans_changed())
        self.shield: PunctuationShield | SourceShield | None = None
        if punctuations.enabled(definition):
            # an ingest stream's punctuations are in its log; a files or kafka stream's in
            # its records, learnt per micro-batch (`query/source_shield.py`)
            self.shield = (PunctuationShield(layout) if definition.source.kind == "ingest"
                           else SourceShield(spark, layout, Path(work_dir)))
        self.runner = MicroBatchRunner(spark, layout, self.registry, self.table, self.rows,
                                       self.panes, self.router, self.figures, on_handle_closed,
                                       self.shield, writer)
        self.replay = KafkaReplay(spark, layout, self.registry, self.table, self.rows,
                                  self.router, self.figures)
        realtime_mode = None if realtime_rows is None or topics is None else RealTimeMode(
            realtime_rows, spark, lambda: self.registry.current()[0], self.shield is not None,
            self.registry.raise_cuts, topics[1].reader)
        self.lifecycle = QueryLifecycle(settings, layout, self.runner, self.router, self.replay,
                                        self.figures, self._prepare_plans, realtime_mode)

    def _prepare_plans(self) -> None:
        self.table.prepare(*self.registry.current())

    # ----- the stream's definition ------------------------------------------------------------
    @property
    def definition(self) -> StreamDefinition:
        return self._layout.definition

    def redefine(self, definition: StreamDefinition) -> None:
        """The stream's definition changed but not its schema (its lateness, its owner's
        settings): the parts read the new one from the next micro-batch on."""
        if definition.schema != self._layout.schema:
            raise ValueError(f"stream {definition.name!r}: a new schema restarts the query")
        self._relayout(StreamLayout.of(definition), restarted=False)

    def restart(self, definition: StreamDefinition) -> None:
        """Stop the query and start it again on its checkpoint with `definition`, whose schema
        adds attributes after the existing ones (`pep.streams.definition.extend_schema`): the
        source is read with the new columns; attached plans (their attribute indices stay
        valid), their windows and the stream's figures carry over; the new query continues
        where the old one committed, so a record ingested meanwhile is read once, by it."""
        old = self.definition
        n = len(old.schema.fields)
        if (definition.name, definition.source) != (old.name, old.source) \
                or definition.schema.fields[:n] != old.schema.fields:
            raise ValueError(f"stream {old.name!r}: a query restarts only for added attributes")
        self.lifecycle.stop_between_batches()
        self._relayout(StreamLayout.of(definition), restarted=True)
        self.lifecycle.start_again(old)

    def _relayout(self, layout: StreamLayout, restarted: bool) -> None:
        """Every part that reads the stream's layout gets the new one (`restarted`: the schema
        grew, so what was built for the old one is built again)."""
        self._layout = layout
        self.table.redefine(layout, restarted)
        self.rows.redefine(layout, restarted)
        self.panes.redefine(layout)
        self.router.redefine(layout)
        self.runner.redefine(layout)
        self.replay.redefine(layout)
        self.lifecycle.redefine(layout)
        if self.shield is not None:
            self.shield.redefine(layout)

    # ----- the query --------------------------------------------------------------------------
    def start(self, replay: bool = False) -> None:
        """Start the query (`QueryLifecycle.start`; `replay`: its handles were restored)."""
        self.lifecycle.start(replay)

    def stop(self, idle: bool = False) -> None:
        self.lifecycle.stop(idle)
        if isinstance(self.shield, SourceShield):
            self.shield.close()

    def failed(self, exc: BaseException) -> None:
        """The query failed outside a micro-batch (it did not start): `health()` says so."""
        self.figures.failed(exc)

    @property
    def active(self) -> bool:
        return self.lifecycle.active

    @property
    def query_id(self) -> str | None:
        return self.lifecycle.query_id

    @property
    def query_name(self) -> str | None:
        return self.lifecycle.query_name

    def in_batch_thread(self) -> bool:
        return self.lifecycle.in_batch_thread()

    def process_available(self, timeout: float = 120.0) -> None:
        self.lifecycle.process_available(timeout)

    def wait_delivered(self, timeout: float = 120.0) -> None:
        """Return once the micro-batches run so far are delivered (`query/route_worker.py`); raises
        `RoutingFailed` if delivering the last one failed."""
        self.runner.drain(timeout)

    # ----- figures ----------------------------------------------------------------------------
    def stats(self, stall_after: float | None = None) -> dict[str, Any]:
        out = self.handles.counters(self.query_id)
        out.update(self.health(stall_after))
        out["active"] = self.active
        out["skipped_to_end"] = self.lifecycle.skipped_to_end
        if self.shield is not None:  # the owner's figures: how many policies, none of them
            out["punctuation_segments"] = len(self.shield.starts)
            out["punctuations_out_of_order"] = self.shield.discarded
            if isinstance(self.shield, SourceShield):
                out["punctuations_unreadable"] = self.shield.malformed
        return out

    def health(self, stall_after: float | None = None, now: float | None = None
               ) -> dict[str, Any]:
        return self.lifecycle.health(stall_after, now)


__all__ = ["StreamExecutor"]
