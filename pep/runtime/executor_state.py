"""The state of one stream's shared query (`StreamExecutor`): the attached handles and plan
states, and the settings, caches and figures its jobs share. The executor is built in layers
over it, one job each: `handle_registry.py` (handles and plan states), `plan_table.py` (the
plan table and the batch's shape), `batch_frames.py` (the Spark jobs), `routing.py` (results
into handles), `query_lifecycle.py` (the query), `executor.py` (the micro-batch).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.streaming.query import StreamingQuery

from pep.core.plan import StreamDefinition
from pep.runtime.checkpoints import StreamCheckpoint
from pep.runtime.delivery import Deliver
from pep.runtime.compile import CompiledPlan, CompiledUnion
from pep.runtime.matcher import GroupedMatcher
from pep.runtime.jvm_steps import JvmSteps
from pep.runtime.route_worker import RouteWorker
from pep.runtime.spatial import AnchorTracker
from pep.runtime.batch_shape import Shape
from pep.runtime.windows import PaneWindows
from pep.runtime.plan_schema import PLAIN, ROW_TUPLE, TIME, TUPLE
from pep.runtime.plan_expressions import value_arrays



# Tuple windows with panes narrower than this travel as rows (see README "Where windows are
# computed"); wider panes are aggregated in Spark.
DEFAULT_TUPLE_PANE_MIN = 8
# sources whose every tuple has `_xsg_seq`; a Kafka record has none, and is ordered by the
# stream's time attribute, then partition, then offset (`_xsg_file`, see sources.py)
SEQ_KINDS = ("ingest", "generator")
UNIQUE_SEQ_KINDS = ("ingest", "generator")  # ... and no two tuples share one
MAX_LONG = (1 << 63) - 1
TIME_LIMIT = float(1 << 53)  # seconds: larger numeric event times (and NaN) are no time


@dataclass
class AttachedHandle:
    id: str
    plan_id: int
    deliver: Deliver
    lock: threading.RLock = field(default_factory=threading.RLock)
    active: bool = True
    delivered_rows: int = 0
    union: str | None = None  # the key of the union of grants it reads (`pep.runtime.union`)


@dataclass(frozen=True)
class PlanSets:
    """The attached plans of one version of the registry, and the subsets a micro-batch asks
    for. Built once per version (a handle attached or detached changes it): at 5,000 plans
    each pass over them cost 10-20 ms per batch while the event loop held the GIL."""

    version: int
    plans: list["PlanState"]
    plain: list["PlanState"]     # row plans whose filter can pass something (the rows job)
    windowed: list["PlanState"]  # plans delivered through panes (the panes job)
    keeps_windows: bool          # some plan carries window state (routed in batch order)
    anchored: list[CompiledPlan]  # the plans whose filters read DISTANCE_TO anchors

    @staticmethod
    def of(version: int, plans: list["PlanState"]) -> "PlanSets":
        return PlanSets(version, plans,
                        [s for s in plans if s.rows and not s.compiled.passes_nothing],
                        [s for s in plans if not s.rows],
                        any(s.windows is not None for s in plans),
                        [s.compiled for s in plans if s.compiled.anchors])


@dataclass
class PlanState:
    id: int
    compiled: CompiledPlan
    rows: bool  # its tuples come back as rows (plain plans, tuple windows with narrow panes)
    handles: dict[str, AttachedHandle] = field(default_factory=dict)
    windows: PaneWindows | None = None
    batches: int = 0
    unions: dict[str, int] = field(default_factory=dict)  # union key -> member index

    @property
    def used(self) -> bool:
        return bool(self.handles or self.unions)

    @property
    def kind(self) -> int:
        w = self.compiled.window
        if w is None:
            return PLAIN
        if w.kind == "time":
            return TIME
        return ROW_TUPLE if self.rows else TUPLE


class Paused(Exception):
    """A micro-batch refused while the query is being restarted (`StreamExecutor.restart`)."""


@dataclass
class UnionState:
    """A union of grants: its members' plan ids (in the plan's order) and its handles."""

    compiled: CompiledUnion
    members: tuple[int, ...]
    handles: dict[str, AttachedHandle] = field(default_factory=dict)


class ExecutorState:
    """What the shared query of one stream keeps: its settings, plans, handles, caches and
    figures. The modules below `executor.py` add one job each on top of it."""

    def __init__(self, spark: SparkSession, definition: StreamDefinition, work_dir: Path,
                 trigger_interval: float, max_files_per_trigger: int, lateness: float,
                 on_handle_closed: Callable[[str], None],
                 tuple_pane_min: int = DEFAULT_TUPLE_PANE_MIN,
                 mask_key: Callable[[str], bytes] | None = None) -> None:
        self.spark = spark
        self._mask_key_of = mask_key
        self.tuple_pane_min = tuple_pane_min
        self.definition = definition
        self.work_dir = Path(work_dir)
        self.trigger_interval = trigger_interval
        self.max_files_per_trigger = max_files_per_trigger
        self.lateness = lateness
        self._on_handle_closed = on_handle_closed
        self._lock = threading.RLock()
        self._plans: dict[int, PlanState] = {}
        self._plan_ids: dict[str, int] = {}
        self._handles: dict[str, AttachedHandle] = {}
        self._unions: dict[str, UnionState] = {}
        self._next_plan_id = 1
        self._version = 0
        self._sets: PlanSets | None = None  # of `_version` (`_plan_sets`)
        self._table: tuple[Any, DataFrame | None, Column | None] | None = None
        self._table_lock = threading.Lock()
        self._shape: tuple[int, Shape] | None = None
        # a micro-batch ran: a time-window plan attached now may have missed tuples of its
        # first windows (whether a batch ran is public: `health()`'s last_batch_at)
        self._ran_batch = False
        self._batch_thread: int | None = None
        self._query: StreamingQuery | None = None
        self._checkpoint: StreamCheckpoint | None = None
        self._stopped = False
        self._pausing = False  # a restart (`restart`) is waiting for a batch boundary
        self._completed_batch = -1  # the last batch whose every delivery was made
        # Kafka: deliveries carry their micro-batch (`RowBatch.batch`, counted from the
        # checkpoint's `batch_base`), which positioned buffers name their rows by; set by the
        # one thread routing a batch (the route worker, or `replay` before the query starts)
        self._positions = definition.source.kind == "kafka"
        self._batch_base = 0
        self._routing_batch: int | None = None
        # attached while the gateway restores its handles: the start gives their
        # replayable handles again what their readers may not have read (`replay`)
        self.replay_pending = False
        # a batch's results are delivered one batch behind the query (`route_worker.py`)
        self._router = RouteWorker(f"xsg-route-{definition.name}", self._routing_failed)
        self._schema = definition.schema
        self._field_names = list(definition.schema.names)
        self._index = {n: i + 1 for i, n in enumerate(self._field_names)}
        self._types = {f.name: f.type for f in definition.schema.fields}
        self._full_order = definition.source.kind not in SEQ_KINDS
        self._time_attr = self._order_time_attribute()
        self._anchors = AnchorTracker(spark, value_arrays, definition.schema)  # DISTANCE_TO
        # the few-plans matcher and its plans
        self._few: tuple[tuple[Any, ...], Column] | None = None
        # the rows job's Columns around it: (matcher, shape key, selected, non-empty test)
        self._few_columns: tuple[Column, tuple[Any, ...], list[Column], Column] | None = None
        self._grouped: tuple[int, GroupedMatcher | None] | None = None  # (plans' version, it)
        # the admitted rows' schema and the values frame's column names, per shape
        self._admitted_schemas: dict[tuple[Any, ...], tuple[T.StructType, list[str]]] = {}
        self._steps = JvmSteps()  # the batch's DataFrame steps, few py4j calls each
        self._codegen: str | None = None  # whole-stage codegen as set in the query's session
        # no stream positions (Kafka): the rows read come from Spark's progress reports, not
        # from an observation in every batch (pep/runtime/progress.py)
        self._rows_from_progress = definition.source.kind == "kafka"
        self._query_name: str | None = None
        self.started_at: float | None = None
        self.last_batch_started_at: float | None = None
        self.last_batch_at: float | None = None
        # (last_batch_at, when) Spark's status first said that data is available after that
        # batch: the time the input is known to have arrived (`QueryLifecycle.input_waiting`)
        self._available_seen: tuple[float | None, float] | None = None
        self.skipped_to_end = False
        self._skip_names: frozenset[str] | None = None
        self.stats_counters: dict[str, Any] = {
            "batches": 0, "rows_in": 0, "rows_delivered": 0, "last_batch_ms": None,
            "plan_evaluations": 0, "late_rows": 0, "last_error": None,
            "driver_rows": 0, "driver_bytes": 0, "max_position": None,
        }

    def _order_time_attribute(self) -> str | None:
        attr = self.definition.time_attribute
        if not attr:
            return None
        f = self.definition.schema.lookup(attr)
        if f is None or f.type not in ("timestamp", "double", "long"):
            return None
        return f.name

    def _routing_failed(self, exc: BaseException) -> None:
        self.stats_counters["last_error"] = f"{type(exc).__name__}: {exc}"

    def _current(self) -> tuple[list[PlanState], int]:
        sets = self._plan_sets()
        return sets.plans, sets.version

    def _plan_sets(self) -> PlanSets:
        """The used plans and their subsets, for the registry's current version. A plan's set
        of users changes only under the lock, and a plan becomes used or unused only together
        with a new version (it is made with its first user and dropped with its last), so the
        sets of one version stay true."""
        with self._lock:
            sets = self._sets
            if sets is None or sets.version != self._version:
                sets = self._sets = PlanSets.of(
                    self._version, [s for s in self._plans.values() if s.used])
            return sets


__all__ = ["ExecutorState", "AttachedHandle", "PlanSets", "PlanState", "UnionState", "Paused",
           "Deliver", "DEFAULT_TUPLE_PANE_MIN", "SEQ_KINDS", "UNIQUE_SEQ_KINDS", "MAX_LONG",
           "TIME_LIMIT"]
