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
The stream's own figures (tuples in, highest position) are observed on the same jobs
(`DataFrame.observe`), without another pass over the batch. Time is per plan: each time-window
plan's watermark is the largest event time among the tuples its own filter passed (a max per
pane in the panes job), so a tuple a plan's policy hides moves none of its time.
"""
from __future__ import annotations

import logging
import functools
import operator
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle
from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pdp.numbers import NumberError, parse_int
from pep.core.labels import LabelError, Lattice
from pep.core.plan import StreamDefinition, StreamSchema
from pep.core.refs import handle_ref
from pep.core.rows import RowBatch
from pep.runtime.checkpoints import StreamCheckpoint, archive_dir, await_kafka_offsets
from pep.runtime.compile import (FAMILIES, INTEGER_KIND, LABEL_KIND, MASKED_KIND, NUMERIC_KIND,
                                 STRING_KIND, CompiledPlan, CompiledUnion, row_attributes)
from pep.runtime.labels import label_code, label_holds, label_outcome
from pep.runtime.encode import json_array, value_texts
from pep.runtime.masks import (MASK_ARROW, MASKS_TYPE, hashed_text, is_hash, let, mask_struct,
                               masked_column, masked_double, masked_long, masked_text)
from pep.runtime import matcher as matcher_module
from pep.runtime.matcher import GroupedMatcher, admitted_rows, value_column
from pep.runtime.memo import OwnedCache
from pep.runtime.privacy import bound_arrays, clamped, is_private
from pep.runtime.columns import FILE_COLUMN, SEQ_COLUMN
from pep.runtime.sources import build_source
from pep.runtime.spatial import (PREDICATE_FIELDS, AnchorTracker, predicate_struct,
                                 spatial_outcome)
from pep.runtime.union import member_masks, merged_rows, tag_rows
from pep.runtime.pane_partials import (KEY_SEP, NO_SEQ, empty_partials, partials_from_arrow,
                                       partials_from_values)
from pep.runtime.windows import PaneWindows

log = logging.getLogger(__name__)
# the grouped matcher runs on the workers (the rows job's mapInArrow): its code travels with it,
# so a worker runs the driver's matcher, xsg installed there or not
cloudpickle.register_pickle_by_value(matcher_module)

Deliver = Callable[[RowBatch], bool]

POS_COLUMN = "_xsg_pos"
TIME_COLUMN = "_xsg_t"      # the stream's time attribute as epoch seconds (ordering)
NUMS_COLUMN = "_xsg_n"
STRS_COLUMN = "_xsg_s"
LNGS_COLUMN = "_xsg_l"
KEYS_COLUMN = "_xsg_k"
PLANS_COLUMN = "_xsg_plans"
PIDS_COLUMN = "_xsg_pids"
BITS_COLUMN = "_xsg_pbits"  # the grouped matcher's bitmap of a row's plans (matcher.py)
PLAN = "p"
# plan kinds in the plan table: plain rows; tuple windows whose panes Spark aggregates; time
# windows; tuple windows whose tuples come back as rows (panes of one tuple, on the driver)
PLAIN, TUPLE, TIME, ROW_TUPLE = 0, 1, 2, 3
ROW_KINDS = (PLAIN, ROW_TUPLE)
# Tuple windows with panes narrower than this travel as rows (see README "Where windows are
# computed"); wider panes are aggregated in Spark.
DEFAULT_TUPLE_PANE_MIN = 8
# sources whose every tuple has `_xsg_seq`; a Kafka record has none, and is ordered by the
# stream's time attribute, then partition, then offset (`_xsg_file`, see sources.py)
SEQ_KINDS = ("ingest", "generator")
UNIQUE_SEQ_KINDS = ("ingest", "generator")  # ... and no two tuples share one
MAX_LONG = (1 << 63) - 1
TIME_LIMIT = float(1 << 53)  # seconds: larger numeric event times (and NaN) are no time
JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'", "ignoreNullFields": "false"}

PREDICATE_TYPE = T.StructType([
    T.StructField("a", T.IntegerType(), False),   # attribute index, 1-based
    T.StructField("m", T.IntegerType(), False),   # accepted outcomes: 1 less, 2 equal, 4 greater
    T.StructField("k", T.IntegerType(), False),   # 0 double, 1 string, 5 64-bit integer
    T.StructField("n", T.DoubleType(), True),     # the constant of a double comparison
    T.StructField("s", T.StringType(), True),     # ... of a string comparison
    T.StructField("i", T.LongType(), True),       # ... of a long, timestamp, boolean comparison
])
_PRED_ARROW = pa.struct([pa.field("a", pa.int32(), False), pa.field("m", pa.int32(), False),
                         pa.field("k", pa.int32(), False), ("n", pa.float64()),
                         ("s", pa.string()), ("i", pa.int64()),
                         *PREDICATE_FIELDS])  # spatial fields: spatial.py
PLAN_TABLE_ARROW = pa.schema([("plans", pa.list_(pa.struct([
    pa.field("id", pa.int32(), False),
    pa.field("k", pa.int32(), False),       # PLAIN, TUPLE, TIME or ROW_TUPLE
    ("c", pa.list_(pa.list_(_PRED_ARROW))),  # conjuncts; [[]] passes everything
    ("sa", pa.int64()),                      # start_after: positions <= sa never reach the plan
    ("g", pa.int64()),                       # pane width (tuples or seconds)
    ("off", pa.int64()),                     # tuple windows: tuples already in the open pane
    ("t", pa.int32()),                       # time windows: time attribute index
    ("tk", pa.int32()),                      # 0: timestamp (exact microseconds), 1: number
    ("ky", pa.list_(pa.int32())),            # group-by attribute indices
    ("d", pa.list_(pa.int32())),             # aggregated attributes per family, padded
    ("l", pa.list_(pa.int32())),
    ("s", pa.list_(pa.int32())),
    ("lo", pa.list_(pa.float64())),          # private windows: clamping bounds per attribute
    ("hi", pa.list_(pa.float64())),          # (pep/runtime/privacy.py); null otherwise
    ("mk", pa.list_(MASK_ARROW)),            # masks per attribute index (null: none masked)
])))])
HASHED_PREFIX = "_xsg_h_"  # a hashed long attribute's text in the rows job's output
EMIT = "_xsg_e"  # the rows job's emission (with masks): the plan ids a row is for, their masks


# ---------------------------------------------------------------------------------------------
# Per-row expressions (built once per schema and JVM; unresolved, so shared by every query)
# ---------------------------------------------------------------------------------------------

def value_arrays(definition: StreamDefinition | StreamSchema,
                 only: frozenset[str] | None = None) -> tuple[Column, Column]:
    """Per-row arrays of every attribute as a number and as text, indexed like the schema
    (with `only`: the other attributes are null, so the scan need not read them)."""
    schema = definition.schema if isinstance(definition, StreamDefinition) else definition
    nums, strs = [], []
    for f in schema.fields:
        c = F.col(f"`{f.name}`")
        if only is not None and f.name not in only:
            nums.append(F.lit(None).cast("double"))
            strs.append(F.lit(None).cast("string"))
        elif f.type in ("string", "label"):  # a label's text (its code: long_array)
            nums.append(F.lit(None).cast("double"))
            strs.append(c)
        else:
            if f.type == "timestamp":
                num = F.unix_micros(c) / F.lit(1_000_000.0)
            elif f.type == "boolean":
                num = F.when(c, F.lit(1.0)).when(~c, F.lit(0.0))
            else:
                num = c.cast("double")
            nums.append(num)
            strs.append(F.lit(None).cast("string"))
    return F.array(*nums), F.array(*strs)


def long_array(schema: StreamSchema, only: frozenset[str] | None = None) -> Column:
    """Per-row array of every attribute as a 64-bit integer (long as is, timestamps in epoch
    microseconds, booleans 0/1), null for doubles and strings: exact values for windows."""
    out = []
    for f in schema.fields:
        c = F.col(f"`{f.name}`")
        if only is not None and f.name not in only:
            out.append(F.lit(None).cast("long"))
        elif f.type == "long":
            out.append(c)
        elif f.type == "timestamp":
            out.append(F.unix_micros(c))
        elif f.type == "boolean":
            out.append(F.when(c, F.lit(1)).when(~c, F.lit(0)).cast("long"))
        elif f.type == "label" and f.lattice is not None:
            out.append(label_code(c, f.lattice))
        else:
            out.append(F.lit(None).cast("long"))
    return F.array(*out)


def json_value(c: Column, ftype: str) -> Column:
    """The JSON text of a value (Spark's to_json; NaN and infinities as null)."""
    if ftype == "double":
        c = F.when(F.isnan(c) | (F.abs(c) == F.lit(float("inf"))), F.lit(None)).otherwise(c)
    return F.regexp_replace(F.to_json(F.array(c), JSON_OPTIONS), r"^\[|\]$", "")


def key_array(schema: StreamSchema, keys: tuple[str, ...]) -> Column:
    """Per-row array holding the JSON text of each group-by attribute (null elsewhere)."""
    return F.array(*[json_value(F.col(f"`{f.name}`"), f.type) if f.name in keys
                     else F.lit(None).cast("string") for f in schema.fields])


def _outcome(value: Column, constant: Column) -> Column:
    return (F.when(value < constant, F.lit(1)).when(value == constant, F.lit(2))
            .when(value > constant, F.lit(4)))


def _predicate_holds(p: Column, spatial: bool, plan: Column | None = None) -> Column:
    """Each comparison in its attribute's family: doubles, 64-bit integers (exact), strings.
    With `plan` (some attached plan masks): a comparison marked MASKED_KIND reads the value
    under the plan's mask for its attribute (pep/runtime/masks.py)."""
    num = F.element_at(F.col(NUMS_COLUMN), p["a"])
    txt = F.element_at(F.col(STRS_COLUMN), p["a"])
    lng = F.element_at(F.col(LNGS_COLUMN), p["a"])
    if plan is not None:
        m = F.element_at(plan["mk"], p["a"])
        outcome = (F.when(p["k"] == NUMERIC_KIND, _outcome(num, p["n"]))
                   .when(p["k"] == INTEGER_KIND, _outcome(lng, p["i"]))
                   .when(p["k"] == STRING_KIND, _outcome(txt, p["s"]))
                   .when(p["k"] == NUMERIC_KIND | MASKED_KIND,
                         _outcome(masked_double(num, m), p["n"]))
                   .when(p["k"] == INTEGER_KIND | MASKED_KIND,
                         _outcome(masked_long(lng, m), p["i"]))
                   .when(p["k"] == STRING_KIND | MASKED_KIND,
                         _outcome(masked_text(F.coalesce(txt, lng.cast("string")), m), p["s"])))
        if spatial:
            outcome = outcome.otherwise(spatial_outcome(p, F.col(NUMS_COLUMN), _outcome))
    elif not spatial:
        outcome = (F.when(p["k"] == NUMERIC_KIND, _outcome(num, p["n"]))
                   .when(p["k"] == INTEGER_KIND, _outcome(lng, p["i"]))
                   .when(p["k"] == LABEL_KIND, label_outcome(lng, p["i"]))
                   .otherwise(_outcome(txt, p["s"])))
    else:
        outcome = (F.when(p["k"] == NUMERIC_KIND, _outcome(num, p["n"]))
                   .when(p["k"] == INTEGER_KIND, _outcome(lng, p["i"]))
                   .when(p["k"] == LABEL_KIND, label_outcome(lng, p["i"]))
                   .when(p["k"] == STRING_KIND, _outcome(txt, p["s"]))
                   .otherwise(spatial_outcome(p, F.col(NUMS_COLUMN), _outcome)))
    return F.coalesce(p["m"].bitwiseAND(outcome) != 0, F.lit(False))


def _matches(plan: Column, spatial: bool, masked: bool = False) -> Column:
    """The plan's start position and DNF filter hold for the row. `spatial`: some attached
    plan has a spatial predicate. Without one the expression leaves the spatial branch out:
    Spark evaluates these lambdas per row and plan, uncompiled; with the branch (and whole-stage
    code generation still on), 1,000 plain plans ran about 20 times slower (bench_many_readers:
    3.8 s per micro-batch against 0.17 s)."""
    seq = F.col(SEQ_COLUMN)
    started = plan["sa"].isNull() | seq.isNull() | (seq > plan["sa"])
    return started & F.exists(plan["c"], lambda conj: F.forall(
        conj, lambda p: _predicate_holds(p, spatial, plan if masked else None)))


def matched_plans_column(kinds: tuple[int, ...] | None = None, spatial: bool = False,
                         masked: bool = False) -> Column:
    """Ids of the plans (of `kinds`) whose filter holds for the row: one expression for any
    number of plans."""
    if kinds is None:
        chosen = F.filter(F.col(PLANS_COLUMN), lambda p: _matches(p, spatial, masked))
    else:
        chosen = F.filter(F.col(PLANS_COLUMN),
                          lambda p: p["k"].isin(*kinds) & _matches(p, spatial, masked))
    return F.transform(chosen, lambda plan: plan["id"])


def masked_emissions(kinds: tuple[int, ...], spatial: bool, masked_filters: bool) -> Column:
    """The rows job's emissions when some plan masks: one for the plans without masks that the
    row passes (their ids, no masks), then one per masked plan it passes (its id, its masks),
    since each masked plan sees its own values of the row."""
    matched = F.filter(F.col(PLANS_COLUMN),
                       lambda p: p["k"].isin(*kinds) & _matches(p, spatial, masked_filters))

    def emissions(ms: Column) -> Column:
        plain = F.transform(F.filter(ms, lambda p: p["mk"].isNull()), lambda p: p["id"])
        masked = F.filter(ms, lambda p: p["mk"].isNotNull())
        none = F.lit(None).cast(MASKS_TYPE)
        shared = F.when(F.size(plain) > 0,
                        F.array(F.struct(plain.alias("i"), none.alias("mk")))) \
            .otherwise(F.array().cast(T.ArrayType(T.StructType([
                T.StructField("i", T.ArrayType(T.IntegerType(), False)),
                T.StructField("mk", MASKS_TYPE)]))))
        own = F.transform(masked, lambda p: F.struct(F.array(p["id"]).alias("i"),
                                                     p["mk"].alias("mk")))
        return F.concat(shared, own)
    return let(matched, emissions)


# Up to this many row plans (and none spatial, no window plan in Spark) are matched by one
# compiled Column per plan instead of the plan table: Spark generates code for it, where the
# plan table's higher-order functions run interpreted (measured on one plain plan: the
# gateway's throughput against a direct query 0.75-0.80 with the plan table).
FEW_PLANS = 8


def few_plans_column(plans: list[tuple[int, CompiledPlan]]) -> Column:
    """Ids of the plans whose filter holds for the row, one Column per plan: the same tests as
    the plan table's (`_predicate_holds`, on the same per-row value arrays, a null operand
    false), every constant a typed literal (data in the expression tree, never SQL text)."""
    nums, strs, seq = F.col(NUMS_COLUMN), F.col(STRS_COLUMN), F.col(SEQ_COLUMN)
    lngs = F.col(LNGS_COLUMN)
    chosen = []
    for plan_id, compiled in plans:
        alternatives = []
        for conj in compiled.conjuncts:
            terms = []
            for a, m, k, n, s in conj:
                if k == LABEL_KIND:
                    terms.append(label_holds(F.element_at(lngs, a), m, int(n)))
                    continue
                if k == NUMERIC_KIND:
                    value, constant = F.element_at(nums, a), F.lit(n).cast("double")
                elif k == INTEGER_KIND:
                    value, constant = F.element_at(lngs, a), F.lit(int(n)).cast("long")
                else:
                    value, constant = F.element_at(strs, a), F.lit(s).cast("string")
                tests = [test for bit, test in ((1, value < constant), (2, value == constant),
                                                (4, value > constant)) if m & bit]
                term = functools.reduce(operator.or_, tests) if tests else F.lit(False)
                terms.append(F.coalesce(term, F.lit(False)))
            alternatives.append(functools.reduce(operator.and_, terms) if terms else F.lit(True))
        holds = functools.reduce(operator.or_, alternatives) if alternatives else F.lit(False)
        if compiled.start_after is not None:
            holds = holds & (seq.isNull() | (seq > F.lit(int(compiled.start_after))))
        chosen.append(F.when(holds, F.lit(plan_id)))
    return F.array_compact(F.array(*chosen))


def matched_plan_structs(kind: int, spatial: bool = False, masked: bool = False) -> Column:
    return F.filter(F.col(PLANS_COLUMN),
                    lambda p: (p["k"] == kind) & _matches(p, spatial, masked))


# Building expressions takes py4j round trips (~0.1-0.3 ms each); they are unresolved and hold
# no session state, so they are built once per JVM gateway and key and shared by every query.
_EXPRESSIONS = OwnedCache(maxsize=256)


def _shared_expressions(key: Any, build: Callable[[], Any]) -> Any:
    from pyspark import SparkContext
    return _EXPRESSIONS.get_or_build(SparkContext._gateway, key, build)


def filter_expressions(schema: StreamSchema) -> tuple[Column, Column, Column]:
    """(numbers array, texts array, matched plan ids) for `schema`, built once and then reused."""
    nums, strs = _shared_expressions(("values", schema), lambda: value_arrays(schema))
    (matched,) = _shared_expressions(("matched",), lambda: (matched_plans_column(),))
    return nums, strs, matched


# ---------------------------------------------------------------------------------------------
# The shape of a batch's jobs: what the attached plans read (not how many there are)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    # what the rows job returns: the plain plans' projections and the aggregated and group-by
    # attributes of tuple windows whose tuples come back as rows, schema order
    plain_columns: tuple[str, ...]
    tuple_windows: bool
    time_windows: bool
    # value slots of the panes job: (column prefix, family, partials wanted), per family in
    # order; a plan's i-th aggregated attribute of family f is slot f<i>
    slots: tuple[tuple[str, str, frozenset[str]], ...]
    keys: tuple[str, ...]  # attributes some window plan groups by, schema order
    ordered_time_firsts: bool  # a time plan asks firstval/lastval: order ties by stream order
    full_order: bool  # the source may lack `_xsg_seq`: order by time, file, position too
    single_tuples: bool  # every tuple-window pane is one tuple: no aggregation in Spark
    read: frozenset[str]  # attributes filters, windows or time read (the value arrays)
    spatial: bool = False  # some plan's filter has a spatial predicate
    clamped: bool = False  # some window plan is differentially private: clamp its values
    masked: bool = False  # some plan masks (pep/runtime/masks.py): per-plan values
    masked_filters: bool = False  # some plan's filter compares masked values
    hashed: tuple[str, ...] = ()  # long attributes some row plan shows hashed (their text)

    @property
    def windows(self) -> bool:
        return self.tuple_windows or self.time_windows

    @property
    def raw(self) -> bool:
        """Only one-tuple panes: the panes job returns each tuple's values, not partials."""
        return self.single_tuples and self.tuple_windows and not self.time_windows


def slot_names(shape: Shape) -> list[tuple[str, str]]:
    """(slot column prefix, family) of every value slot of the panes job."""
    return [(name, fam) for name, fam, _ in shape.slots]


@dataclass
class _Handle:
    id: str
    plan_id: int
    deliver: Deliver
    lock: threading.RLock = field(default_factory=threading.RLock)
    active: bool = True
    delivered_rows: int = 0
    union: str | None = None  # the key of the union of grants it reads (`pep.runtime.union`)


@dataclass
class _PlanState:
    id: int
    compiled: CompiledPlan
    rows: bool  # its tuples come back as rows (plain plans, tuple windows with narrow panes)
    handles: dict[str, _Handle] = field(default_factory=dict)
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


class _Paused(Exception):
    """A micro-batch refused while the query is being restarted (`StreamExecutor.restart`)."""


@dataclass
class _UnionState:
    """A union of grants: its members' plan ids (in the plan's order) and its handles."""

    compiled: CompiledUnion
    members: tuple[int, ...]
    handles: dict[str, _Handle] = field(default_factory=dict)


class StreamExecutor:
    """The shared query of one stream; its foreachBatch runs every attached plan."""

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
        self._plans: dict[int, _PlanState] = {}
        self._plan_ids: dict[str, int] = {}
        self._handles: dict[str, _Handle] = {}
        self._unions: dict[str, _UnionState] = {}
        self._next_plan_id = 1
        self._version = 0
        self._table: tuple[Any, DataFrame | None, Column | None] | None = None
        self._table_lock = threading.Lock()
        self._shape: tuple[int, Shape] | None = None
        # a micro-batch ran: a time-window plan attached now may have missed tuples of its
        # first windows (whether a batch ran is public: `health()`'s last_batch_at)
        self._ran_batch = False
        self._batch_thread: int | None = None
        self._query = None
        self._checkpoint: StreamCheckpoint | None = None
        self._stopped = False
        self._pausing = False  # a restart (`restart`) is waiting for a batch boundary
        self._completed_batch = -1  # the last batch whose every delivery was made
        self._schema = definition.schema
        self._field_names = list(definition.schema.names)
        self._index = {n: i + 1 for i, n in enumerate(self._field_names)}
        self._types = {f.name: f.type for f in definition.schema.fields}
        self._full_order = definition.source.kind not in SEQ_KINDS
        self._time_attr = self._order_time_attribute()
        self._anchors = AnchorTracker(spark, value_arrays, definition.schema,  # DISTANCE_TO
                                      long_array)
        self._few: tuple[tuple, Column] | None = None  # the few-plans matcher and its plans
        self._grouped: tuple[int, GroupedMatcher | None] | None = None  # (plans' version, it)
        self._admitted_schemas: dict[tuple, T.StructType] = {}
        self._anchored: tuple[int, list[CompiledPlan]] | None = None  # plans with DISTANCE_TO
        self._codegen: str | None = None  # whole-stage codegen as set in the query's session
        self.started_at: float | None = None
        self.last_batch_started_at: float | None = None
        self.last_batch_at: float | None = None
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

    # ----- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._checkpoint = StreamCheckpoint.for_stream(self.work_dir, self.definition)
        self._codegen = None  # a new query clones a new session
        skip = self._checkpoint.prepare()
        # a new checkpoint numbers its batches from 0 again; a resumed one continues, and the
        # batch its last query delivered but may not have committed is not delivered twice
        self._completed_batch = -1 if skip else max(self._completed_batch,
                                                    self._checkpoint.delivered_batch())
        kind = self.definition.source.kind
        archive = (str(archive_dir(self.work_dir, self.definition)) if kind == "ingest"
                   else None)
        if skip and kind in ("ingest", "files"):
            names = [e.name for e in self._source_files()] if self._source_path() else None
            if names is not None and 0 < len(names) <= self._files_per_trigger():
                # the query's first batch lists these files (the oldest first, so all of them)
                # and maybe newer ones: it drops the tuples of these
                self._skip_names = frozenset(names)
                self.skipped_to_end = True
            elif names and kind == "ingest" and archive is not None:
                self._archive_present(names, Path(archive))
            elif names != []:
                self._skip_to_end(archive)
        source = build_source(self.spark, self.definition, self.max_files_per_trigger, archive)
        millis = max(1, int(round(self.trigger_interval * 1000)))
        self.started_at = time.time()
        self._query = (source.writeStream
                       .queryName(f"xsg-{uuid.uuid4().hex[:12]}")
                       .foreachBatch(self._on_batch)
                       .option("checkpointLocation", str(self._checkpoint.location))
                       .trigger(processingTime=f"{millis} milliseconds")
                       .start())
        self._checkpoint.mark_running()
        if kind == "kafka":
            # a new query starts at the latest offsets, fixed at its first trigger: every record
            # produced after the handle's request was answered reaches the handle
            await_kafka_offsets(self._checkpoint.location, 1, self._query)
        # Built while the query lists its source and plans its first batch (a few tenths of a
        # second), so that batch finds it ready instead of the request waiting for it first.
        try:
            self._prepare_plans()
        except Exception as exc:  # the query runs already: its first batch builds it (or fails)
            log.warning("stream %s: plan table not prepared: %s", self.definition.name, exc)

    def _source_path(self) -> str | None:
        from pep.runtime.sources import _local_dir
        path = self.definition.source.option("path")
        return _local_dir(path) if path else None

    def _source_files(self) -> list[os.DirEntry]:
        path = self._source_path()
        if not path:
            return []
        try:
            with os.scandir(path) as it:
                return [e for e in it if e.name[:1] not in (".", "_") and e.is_file()]
        except OSError:
            return []

    def _files_per_trigger(self) -> int:
        own = self.definition.source.option("maxFilesPerTrigger")
        try:
            return parse_int(str(own), "maxFilesPerTrigger", low=1, high=1_000_000)
        except NumberError:  # unset (or refused at registration)
            return self.max_files_per_trigger

    def _archive_present(self, names: list[str], archive: Path) -> None:
        """An `ingest` stream's directory is the gateway's own: files present when a first
        handle starts the query (more than its first batch would list) are moved to the
        archive, where retention removes them, instead of a Spark query that marks them
        processed (measured 0.3-0.5 s of the request that starts the stream)."""
        started = time.perf_counter()
        source = Path(self._source_path() or "")
        target = archive / "not-delivered"
        target.mkdir(parents=True, exist_ok=True)
        moved = 0
        for name in names:
            try:
                os.replace(source / name, target / name)
                moved += 1
            except FileNotFoundError:
                continue
        self.skipped_to_end = True
        log.info("stream %s: started at the end of its source, %d files archived (%.3f s)",
                 self.definition.name, moved, time.perf_counter() - started)

    def _skip_to_end(self, archive: str | None) -> None:
        """Mark every file now in the source directory as processed, without reading one: a
        one-batch query (availableNow) whose foreachBatch does nothing commits them to the
        checkpoint; the real query then continues after them. Tuples ingested before a
        stream's first handle are not delivered."""
        assert self._checkpoint is not None
        frame = build_source(self.spark, self.definition, None, archive)
        started = time.perf_counter()
        for attempt in (1, 2):
            query = (frame.writeStream.queryName(f"xsg-skip-{uuid.uuid4().hex[:12]}")
                     .foreachBatch(lambda df, batch_id: None)
                     .option("checkpointLocation", str(self._checkpoint.location))
                     .trigger(availableNow=True).start())
            try:
                query.awaitTermination(120)
                if query.exception() is None:
                    break
                raise RuntimeError(str(query.exception()))
            except Exception as exc:  # noqa: BLE001
                query.stop()
                if attempt == 2:
                    raise
                log.warning("stream %s: skipping to the end failed (%s); starting a new "
                            "checkpoint", self.definition.name, exc)
                shutil.rmtree(self._checkpoint.location, ignore_errors=True)
        self.skipped_to_end = True
        log.info("stream %s: started at the end of its source (%.2f s)", self.definition.name,
                 time.perf_counter() - started)

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
        # Stop between two batches: a batch stopped half-way would be run again by the new
        # query after some of its rows were delivered. The batch under way ends first; one
        # starting meanwhile fails before it delivers anything (so it is not committed, and the
        # new query runs it); one that ended but whose commit the stop cut off is run again and
        # skipped (`_completed_batch`).
        self._pausing = True
        try:
            deadline = time.monotonic() + 120.0
            while self._batch_thread is not None and time.monotonic() < deadline:
                time.sleep(0.02)
            self.stop(idle=False)
        finally:
            self._pausing = False
        self.definition = definition
        self._schema = definition.schema
        self._field_names = list(definition.schema.names)
        self._index = {name: i + 1 for i, name in enumerate(self._field_names)}
        self._types = {f.name: f.type for f in definition.schema.fields}
        self._anchors = self._anchors.with_schema(definition.schema)
        with self._table_lock:
            self._table = None
        self._shape, self._few, self._grouped, self._anchored = None, None, None, None
        StreamCheckpoint.for_stream(self.work_dir, definition).adopt(old)
        self._stopped = False
        self.start()

    @property
    def query_id(self) -> str | None:
        return str(self._query.id) if self._query is not None else None

    @property
    def active(self) -> bool:
        return self._query is not None and self._query.isActive

    def in_batch_thread(self) -> bool:
        return self._batch_thread == threading.get_ident()

    def stop(self, idle: bool = False) -> None:
        """Stop the query. `idle`: its last handle left (the next start begins at the stream's
        end); otherwise (gateway stopping, a replaced query) it resumes where it stopped: then
        the batch under way ends first (one starting meanwhile fails before it delivers, so is
        not committed), and the last batch delivered in full is written down for the next
        query, which skips it if this stop cut off its commit."""
        pause = not idle and not self._pausing and self._query is not None \
            and not self.in_batch_thread()
        if pause:
            self._pausing = True
            deadline = time.monotonic() + 30.0
            while self._batch_thread is not None and time.monotonic() < deadline:
                time.sleep(0.02)
        try:
            self._stopped = True
            if self._query is not None:
                try:
                    self._query.stop()
                except Exception:  # noqa: BLE001 - stopping must not fail the caller
                    log.exception("stopping the query of stream %s failed",
                                  self.definition.name)
            if self._checkpoint is not None:
                try:
                    if idle:
                        self._checkpoint.mark_idle()
                    else:
                        self._checkpoint.release(self._completed_batch)
                except OSError:
                    log.exception("stream %s: checkpoint state not written",
                                  self.definition.name)
        finally:
            if pause:
                self._pausing = False

    # ----- handles ---------------------------------------------------------------------------
    def add_handle(self, handle_id: str, compiled: CompiledPlan | CompiledUnion,
                   deliver: Deliver) -> None:
        with self._lock:
            if isinstance(compiled, CompiledUnion):
                self._add_union_handle(handle_id, compiled, deliver)
                return
            plan_id = self._plan_state(compiled)
            handle = _Handle(handle_id, plan_id, deliver)
            self._plans[plan_id].handles[handle_id] = handle
            self._handles[handle_id] = handle

    def _plan_state(self, compiled: CompiledPlan) -> int:
        """The id of the plan's state, made when no attached plan has its key (under the lock)."""
        plan_id = self._plan_ids.get(compiled.key)
        if plan_id is None:
            plan_id = self._next_plan_id
            self._next_plan_id += 1
            rows = self._rows_mode(compiled)
            state = _PlanState(plan_id, compiled, rows,
                               windows=self._new_windows(compiled, rows))
            self._plans[plan_id] = state
            self._plan_ids[compiled.key] = plan_id
            self._version += 1
        return plan_id

    def _add_union_handle(self, handle_id: str, compiled: CompiledUnion,
                          deliver: Deliver) -> None:
        union = self._unions.get(compiled.key)
        if union is None:
            members = tuple(self._plan_state(m) for m in compiled.members)
            union = _UnionState(compiled, members)
            for index, plan_id in enumerate(members):
                self._plans[plan_id].unions[compiled.key] = index
            self._unions[compiled.key] = union
        handle = _Handle(handle_id, -1, deliver, union=compiled.key)
        union.handles[handle_id] = handle
        self._handles[handle_id] = handle

    def _rows_mode(self, compiled: CompiledPlan) -> bool:
        w = compiled.window
        if is_private(w):
            return False  # its values are clamped by the panes job, never raw on the driver
        return w is None or (w.kind == "tuple"
                             and (bool(w.keys) or w.pane < self.tuple_pane_min))

    def _new_windows(self, compiled: CompiledPlan, rows: bool) -> PaneWindows | None:
        w = compiled.window
        if w is None:
            return None
        if w.kind == "tuple":
            return PaneWindows(w, single=rows)
        return PaneWindows(w, late_start=self._ran_batch)

    def remove_handle(self, handle_id: str) -> int:
        """Detach a handle (waiting for a delivery to it in progress); returns handles left."""
        with self._lock:
            handle = self._handles.get(handle_id)
        if handle is not None:
            with handle.lock:
                handle.active = False
        with self._lock:
            handle = self._handles.pop(handle_id, None)
            if handle is not None and handle.union is not None:
                union = self._unions.get(handle.union)
                if union is not None:
                    union.handles.pop(handle_id, None)
                    if not union.handles:
                        del self._unions[handle.union]
                        for plan_id in union.members:
                            state = self._plans.get(plan_id)
                            if state is not None:
                                state.unions.pop(handle.union, None)
                                self._drop_if_unused(state)
            elif handle is not None:
                state = self._plans.get(handle.plan_id)
                if state is not None:
                    state.handles.pop(handle_id, None)
                    self._drop_if_unused(state)
            return len(self._handles)

    def _drop_if_unused(self, state: _PlanState) -> None:
        if not state.used and state.id in self._plans:
            del self._plans[state.id]
            del self._plan_ids[state.compiled.key]
            self._version += 1

    def attached(self) -> list[tuple[str, CompiledPlan, Deliver]]:
        """The active handles with their plans (to move them onto a replacement query)."""
        with self._lock:
            out: list[tuple[str, Any, Deliver]] = [
                (h.id, self._plans[h.plan_id].compiled, h.deliver)
                for h in self._handles.values()
                if h.active and h.union is None and h.plan_id in self._plans]
            out += [(h.id, self._unions[h.union].compiled, h.deliver)
                    for h in self._handles.values()
                    if h.active and h.union is not None and h.union in self._unions]
            return out

    def handle_ids(self) -> list[str]:
        with self._lock:
            return list(self._handles)

    # ----- figures ---------------------------------------------------------------------------
    def stats(self, stall_after: float | None = None) -> dict:
        with self._lock:
            out = dict(self.stats_counters)
            out.update(handles=len(self._handles), plans=len(self._plans),
                       query_id=self.query_id,
                       late_rows=sum(s.windows.late for s in self._plans.values()
                                     if s.windows is not None)
                       + self.stats_counters["late_rows"],
                       window_panes=sum(s.windows.stored_panes for s in self._plans.values()
                                        if s.windows is not None))
        out.update(self.health(stall_after))
        out["active"] = self.active
        out["skipped_to_end"] = self.skipped_to_end
        return out

    def input_waiting(self) -> tuple[bool, float | None]:
        """(input is waiting, since when): new files in the source directory that no batch has
        listed yet, or the query's own status saying that data is available."""
        since: float | None = None
        listed = self.last_batch_started_at or self.started_at or 0.0
        for entry in self._source_files():
            try:
                mtime = entry.stat().st_mtime
            except OSError:
                continue
            if mtime > listed and (since is None or mtime < since):
                since = mtime
        available = False
        if self._query is not None:
            try:
                available = bool(self._query.status.get("isDataAvailable"))
            except Exception:  # noqa: BLE001 - a stopped query has no status
                available = False
        if available:
            anchor = self.last_batch_at or self.started_at or time.time()
            since = anchor if since is None else min(since, anchor)
        return since is not None, since

    def health(self, stall_after: float | None = None, now: float | None = None) -> dict:
        now = time.time() if now is None else now
        waiting, since = self.input_waiting()
        progress = self.last_batch_at or self.started_at or now
        stalled = bool(stall_after is not None and waiting and since is not None
                       and now - since > stall_after and now - progress > stall_after)
        if not self.active:
            state = "failed" if self.stats_counters["last_error"] else "idle"
        elif stalled:
            state = "stalled"
        elif waiting or (stall_after is not None and now - progress <= stall_after):
            state = "running"
        else:
            state = "idle"
        return {"state": state, "last_batch_at": self.last_batch_at, "input_waiting": waiting,
                "waiting_since": since, "stalled": stalled,
                "last_error": self.stats_counters["last_error"]}

    # ----- the plan table and the batch's shape ----------------------------------------------
    def _current(self) -> tuple[list[_PlanState], int]:
        with self._lock:
            return [s for s in self._plans.values() if s.used], self._version

    def _prepare_plans(self) -> None:
        plans, version = self._current()
        if plans:
            shape = self._shape_of(plans, version)
            self._plan_table(plans, version, shape)

    def _shape_of(self, plans: list[_PlanState], version: int) -> Shape:
        cached = self._shape
        if cached is not None and cached[0] == version:
            return cached[1]
        plain: set[str] = set()
        keys: set[str] = set()
        read: set[str] = set()
        slots: dict[str, set[str]] = {}
        tuples = timed = ordered = False
        single = True
        masked = any(s.compiled.masks for s in plans)
        hashed: set[str] = set()
        for s in plans:
            if s.rows:
                hashed.update(self._field_names[i - 1] for i, m in s.compiled.masks
                              if m.kind == "hash" and self._types[self._field_names[i - 1]]
                              == "long")
            for conj in s.compiled.conjuncts:
                read.update(self._field_names[i - 1] for row in conj for i in row_attributes(row))
            w = s.compiled.window
            if w is None:
                plain.update(s.compiled.projection)
                continue
            if s.rows:
                plain.update(a for a, _ in w.attributes)
                plain.update(w.keys)
                continue
            layout = s.windows.layout  # type: ignore[union-attr]
            keys.update(w.keys)
            read.update(a for a, _ in w.attributes)
            if s.compiled.masks:
                read.update(w.keys)  # masked keys are computed per plan from the values
            seen = {"d": 0, "l": 0, "s": 0}
            for fam, parts in zip(layout.families, layout.parts):
                slots.setdefault(f"{fam}{seen[fam]}", set()).update(parts)
                seen[fam] += 1
            if w.kind == "tuple":
                tuples = True
                single &= layout.width == 1
            else:
                timed = True
                read.add(w.time_attribute or "")
                ordered |= any(f in ("firstval", "lastval") for _, f, _ in w.aggregates)
        if masked:
            read.update(keys)  # every plan's keys are computed from the values then
        order = list(self._field_names)
        slot_list = tuple((name, name[0], frozenset(parts)) for fam in "dls"
                          for name, parts in sorted(slots.items(), key=lambda kv: int(kv[0][1:]))
                          if name[0] == fam)
        shape = Shape(tuple(n for n in order if n in plain), tuples, timed, slot_list,
                      tuple(n for n in order if n in keys), ordered, self._full_order,
                      single, frozenset(read),
                      any(len(row) > 5 for s in plans for conj in s.compiled.conjuncts
                          for row in conj),
                      clamped=any(is_private(s.compiled.window) for s in plans if not s.rows),
                      masked=masked,
                      masked_filters=any(row[2] & MASKED_KIND for s in plans
                                         for conj in s.compiled.conjuncts
                                         for row in conj if len(row) == 5),
                      hashed=tuple(n for n in order if n in hashed and n in plain))
        self._shape = (version, shape)
        return shape

    def _offsets(self, plans: list[_PlanState]) -> tuple:
        return tuple((s.id, s.windows.pane_offset()) for s in plans
                     if s.windows is not None and s.windows.layout.width > 1
                     and not s.windows.layout.timed)

    def _plan_table(self, plans: list[_PlanState], version: int, shape: Shape
                    ) -> tuple[DataFrame | None, Column | None]:
        """The plans as one row of data (and its scalar-subquery column), rebuilt only when the
        set of plans changed or a tuple window's open pane moved (pane width > 1).

        Built in the gateway's session (the batch of the query's cloned session reads a
        LocalRelation from it just as well)."""
        key = (version, self._offsets(plans), self._anchors.version)
        with self._table_lock:  # start() and the first micro-batch may ask at once
            cached = self._table
            if cached is not None and cached[0] == key:
                return cached[1], cached[2]
            frame = self._build_table(plans, shape)
            scalar = frame.scalar() if frame is not None else None
            self._table = (key, frame, scalar)
            return frame, scalar

    def _build_table(self, plans: list[_PlanState], shape: Shape) -> DataFrame | None:
        data = []
        for s in plans:
            c = s.compiled
            if c.passes_nothing:
                continue
            row: dict[str, Any] = {
                "id": s.id, "k": PLAIN, "sa": c.start_after,
                "c": [[predicate_struct(r, self._anchors.segments) for r in conj]
                      for conj in c.conjuncts],
                "g": None, "off": None, "t": None, "tk": None, "ky": [], "d": [], "l": [],
                "s": [], "lo": None, "hi": None, "mk": self._mask_structs(c)}
            w = c.window
            if w is not None:
                layout = s.windows.layout  # type: ignore[union-attr]
                lo, hi = bound_arrays(w, self._index)
                row.update(k=s.kind, g=layout.width, lo=lo, hi=hi,
                           off=s.windows.pane_offset(),  # type: ignore[union-attr]
                           ky=[self._index[k] for k in w.keys])
                if w.kind == "time":
                    row.update(t=self._index[w.time_attribute], tk=0 if w.time_is_timestamp else 1)
                by_family: dict[str, list[int | None]] = {"d": [], "l": [], "s": []}
                for attr, ftype in w.attributes:
                    by_family[FAMILIES[ftype]].append(self._index[attr])
                for fam in "dls":
                    count = sum(1 for _, f, _ in shape.slots if f == fam)
                    row[fam] = by_family[fam] + [None] * (count - len(by_family[fam]))
            data.append(row)
        if not data:
            return None
        # from Arrow: a LocalRelation, so reading it as a subquery needs no Spark job
        return self.spark.createDataFrame(pa.Table.from_pylist([{"plans": data}],
                                                                schema=PLAN_TABLE_ARROW))

    def _mask_key(self, owner: str) -> bytes:
        if self._mask_key_of is None:
            raise RuntimeError("this runtime has no hash keys: a hash mask cannot be served")
        return self._mask_key_of(owner)

    def _mask_structs(self, compiled: CompiledPlan) -> list | None:
        """The plan's masks as one struct per attribute (None where it shows the raw value),
        the owner's hash key inside hash masks only; None when the plan masks nothing."""
        if not compiled.masks:
            return None
        out: list[dict | None] = [None] * len(self._field_names)
        for index, mask in compiled.masks:
            ftype = self._types[self._field_names[index - 1]]
            key = self._mask_key(self.definition.owner) if mask.kind == "hash" else None
            out[index - 1] = mask_struct(mask, ftype, key)
        return out

    def row_columns(self, compiled: CompiledPlan, names) -> list[str]:
        """The rows job's columns holding a plan's values of `names` (a hashed long: its
        text's column)."""
        hashed = {self._field_names[i - 1] for i, m in compiled.masks if m.kind == "hash"
                  and self._types[self._field_names[i - 1]] == "long"}
        return [HASHED_PREFIX + n if n in hashed else n for n in names]

    # ----- the batch's frames ----------------------------------------------------------------
    def _order_columns(self, shape: Shape) -> list[str]:
        if shape.full_order:
            return [SEQ_COLUMN, TIME_COLUMN, FILE_COLUMN, POS_COLUMN]
        if self.definition.source.kind in UNIQUE_SEQ_KINDS:
            # the position alone orders them; no row id: monotonically_increasing_id is
            # nondeterministic and keeps Spark from pruning the scan's file metadata
            return [SEQ_COLUMN]
        return [SEQ_COLUMN, POS_COLUMN]

    def _base_columns(self, shape: Shape, columns: list[str], windows: bool) -> list[Column]:
        """The batch's columns every job starts from (built once per schema and shape)."""
        def build() -> list[Column]:
            cols = [F.col(f"`{n}`") for n in columns]
            cols.append(F.col(SEQ_COLUMN))
            if POS_COLUMN in self._order_columns(shape):
                cols.append(F.monotonically_increasing_id().alias(POS_COLUMN))
            if shape.full_order:
                if self._time_attr:
                    cols.append(self._time_number(self._time_attr).alias(TIME_COLUMN))
                else:
                    cols.append(F.lit(None).cast("double").alias(TIME_COLUMN))
                cols.append(F.col(FILE_COLUMN))
            nums, strs = value_arrays(self._schema, shape.read)
            cols += [nums.alias(NUMS_COLUMN), strs.alias(STRS_COLUMN)]
            # exact values of long, timestamp and boolean attributes: what their comparisons
            # read (a constant array of nulls, folded away, when no such attribute is read)
            cols.append(long_array(self._schema, shape.read).alias(LNGS_COLUMN))
            if windows:
                if shape.keys:
                    cols.append(key_array(self._schema, shape.keys).alias(KEYS_COLUMN))
            return cols
        return _shared_expressions(("base", self._schema, tuple(columns), windows, shape.keys,
                                    tuple(self._order_columns(shape)), self._time_attr,
                                    shape.read), build)

    def _time_number(self, attr: str) -> Column:
        c = F.col(f"`{attr}`")
        if self._types[attr] == "timestamp":
            return F.unix_micros(c) / F.lit(1_000_000.0)
        return c.cast("double")

    def _observed(self, shape: Shape) -> list[Column]:
        """The stream's own figures. No event time: each time-window plan's clock comes from its
        own tuples, in the panes job (`mt`), never from the stream's."""
        return _shared_expressions(("observed",), lambda: [
            F.count(F.lit(1)).alias("rows"), F.max(F.col(SEQ_COLUMN)).alias("seq")])

    def rows_frame(self, batch: DataFrame, plans_column: Column | None, shape: Shape,
                   few: Column | None = None) -> DataFrame:
        """Plain plans: each passing tuple once, its projected attributes and plan ids (from
        `few`, a `few_plans_column`, when given; else from the plan table, `plans_column`)."""
        columns = list(shape.plain_columns)
        base = self._base_columns(shape, columns, False)
        order = self._order_columns(shape)
        if few is not None:
            keep = [F.col(f"`{n}`") for n in columns] + [F.col(c) for c in order]
            return (batch.select(*base).select(*keep, few.alias(PIDS_COLUMN))
                    .where(F.size(F.col(PIDS_COLUMN)) > 0))
        if plans_column is None:
            raise ValueError("rows job without a plan table or a compiled matcher")
        if shape.masked:
            emit, out = _shared_expressions(
                ("rows-masked", self._schema, tuple(columns), tuple(order), shape.spatial,
                 shape.masked_filters, shape.hashed),
                lambda: self._masked_rows(columns, order, shape))
            return (batch.select(*base, plans_column.alias(PLANS_COLUMN))
                    .select(*emit).select(*out))

        def build() -> tuple[list[Column], Column]:
            keep = [F.col(f"`{n}`") for n in columns] + [F.col(c) for c in order]
            return keep + [matched_plans_column(ROW_KINDS, shape.spatial)
                           .alias(PIDS_COLUMN)], F.size(F.col(PIDS_COLUMN)) > 0
        keep, nonempty = _shared_expressions(("rows", self._schema, tuple(columns),
                                              tuple(order), shape.spatial), build)
        return (batch.select(*base, plans_column.alias(PLANS_COLUMN))
                .select(*keep).where(nonempty))

    def values_frame(self, batch: DataFrame, shape: Shape, grouped: GroupedMatcher
                     ) -> DataFrame:
        """Plain plans matched by a `GroupedMatcher`: every tuple once, its projected
        attributes and the values the plans' comparisons read (compiled, no plan table); what
        `admitted_frame` hands to the matcher on the workers."""
        columns = list(shape.plain_columns)
        base = self._base_columns(shape, columns, False)
        order = self._order_columns(shape)

        def build() -> list[Column]:
            arrays = {"d": F.col(NUMS_COLUMN), "l": F.col(LNGS_COLUMN), "s": F.col(STRS_COLUMN)}
            return ([F.col(f"`{n}`") for n in columns] + [F.col(c) for c in order]
                    + [F.element_at(arrays[fam], a).alias(value_column(a, fam))
                       for a, fam in grouped.columns])
        keep = _shared_expressions(("grouped-values", self._schema, tuple(columns), tuple(order),
                                    grouped.columns), build)
        return batch.select(*base).select(*keep)

    def admitted_frame(self, batch: DataFrame, shape: Shape, grouped: GroupedMatcher
                       ) -> DataFrame:
        """Plain plans matched by a `GroupedMatcher` on the workers: `values_frame` through
        `DataFrame.mapInArrow` (`matcher.admitted_rows`, per Arrow record batch), so only the
        tuples some plan admits leave them, with the columns `rows_frame` gives (the projected
        attributes, the order columns) and instead of the plans' ids a bitmap of them
        (`BITS_COLUMN`, `GroupedMatcher.pairs`); the values only the filters read stay there."""
        values = self.values_frame(batch, shape, grouped)
        keep = list(shape.plain_columns) + self._order_columns(shape)
        key = (self._schema, tuple(keep), grouped.columns)
        schema = self._admitted_schemas.get(key)
        if schema is None:  # the same for every batch of a schema: asked of Spark once
            types = {f.name: f for f in values.schema.fields}
            schema = T.StructType([types[n] for n in keep]
                                  + [T.StructField(BITS_COLUMN, T.BinaryType())])
            self._admitted_schemas[key] = schema
        return values.mapInArrow(admitted_rows(grouped, SEQ_COLUMN, keep, BITS_COLUMN), schema)

    def _masked_rows(self, columns: list[str], order: list[str], shape: Shape
                     ) -> tuple[list[Column], list[Column]]:
        """The rows job when some plan masks: a row per emission (`masked_emissions`), its
        values under the emission's masks, right after the filter (pep/runtime/masks.py)."""
        emit = [F.explode(masked_emissions(ROW_KINDS, shape.spatial, shape.masked_filters))
                .alias(EMIT),
                *[F.col(f"`{n}`") for n in columns], *[F.col(c) for c in order]]
        e = F.col(EMIT)
        out = []
        for n in columns:
            m = F.element_at(e["mk"], self._index[n])
            out.append(masked_column(F.col(f"`{n}`"), self._types[n], m).alias(n))
        for n in shape.hashed:
            m = F.element_at(e["mk"], self._index[n])
            out.append(hashed_text(F.col(f"`{n}`"), self._types[n], m)
                       .alias(HASHED_PREFIX + n))
        out += [F.col(c) for c in order]
        out.append(e["i"].alias(PIDS_COLUMN))
        return emit, out

    def _masked_keys(self, shape: Shape, p: Column) -> Column:
        """Per (row, plan): the JSON text of each group-by attribute under the plan's mask
        (null elsewhere), from the value arrays."""
        texts = []
        for f in self._schema.fields:
            if f.name not in shape.keys:
                texts.append(F.lit(None).cast("string"))
                continue
            i = self._index[f.name]
            lng = F.element_at(F.col(LNGS_COLUMN), i)
            raw = {"double": F.element_at(F.col(NUMS_COLUMN), i), "long": lng,
                   "timestamp": F.timestamp_micros(lng), "boolean": lng == F.lit(1),
                   "string": F.element_at(F.col(STRS_COLUMN), i)}[f.type]
            m = F.element_at(p["mk"], i)
            text = json_value(masked_column(raw, f.type, m), f.type)
            if f.type in ("long", "string"):
                text = F.when(is_hash(m), json_value(hashed_text(raw, f.type, m), "string")
                              ).otherwise(text)
            texts.append(text)
        return F.array(*texts)

    def panes_frame(self, batch: DataFrame, plans_column: Column, shape: Shape) -> DataFrame:
        """Window plans: partial aggregates per (plan, key, pane) (with `shape.raw`: each
        tuple's values, every pane being one tuple)."""
        base = self._base_columns(shape, [], True)
        parts = []
        for kind, wanted in ((TUPLE, shape.tuple_windows), (TIME, shape.time_windows)):
            if not wanted:
                continue
            stages = _shared_expressions(("panes", self._schema, shape, kind,
                                          tuple(self._order_columns(shape))),
                                         lambda kind=kind: self._pane_stages(shape, kind))
            frame = batch.select(*base, plans_column.alias(PLANS_COLUMN))
            frame = frame.select(*stages["explode"]).select(*stages["values"])
            if kind == TUPLE:
                frame = frame.select(*stages["number"]).select(*stages["pane"])
                if "aggregates" in stages:
                    frame = frame.groupBy(*stages["group"]).agg(*stages["aggregates"])
                else:
                    frame = frame.select(*stages["single"])
            else:
                frame = (frame.where(stages["timed"]).groupBy(*stages["group"])
                         .agg(*stages["aggregates"]))
            parts.append(frame)
        out = parts[0]
        for other in parts[1:]:
            out = out.unionByName(other, allowMissingColumns=True)
        return out

    def _pane_stages(self, shape: Shape, kind: int) -> dict[str, Any]:
        order = self._order_columns(shape)
        p = F.col(PLAN)
        carried = [F.col(c) for c in order]
        explode = [F.explode(matched_plan_structs(kind, shape.spatial, shape.masked_filters))
                   .alias(PLAN),
                   *carried, F.col(NUMS_COLUMN), F.col(STRS_COLUMN), F.col(LNGS_COLUMN)]
        if shape.keys and shape.masked:
            key = let(self._masked_keys(shape, p), lambda texts: F.concat_ws(KEY_SEP, F.transform(
                p["ky"], lambda i: F.coalesce(F.element_at(texts, i), F.lit("null")))))
        elif shape.keys:
            explode.append(F.col(KEYS_COLUMN))
            key = F.concat_ws(KEY_SEP, F.transform(
                p["ky"], lambda i: F.coalesce(F.element_at(F.col(KEYS_COLUMN), i),
                                              F.lit("null"))))
        else:
            key = F.lit("")
        values = [p["id"].alias("pid"), key.alias("key"), *carried]
        slots = slot_names(shape)
        arrays = {"d": NUMS_COLUMN, "l": LNGS_COLUMN, "s": STRS_COLUMN}
        for name, fam in slots:
            index = F.element_at(p[fam], int(name[1:]) + 1)
            v = F.element_at(F.col(arrays[fam]), index)
            if shape.masked:  # the value under the plan's mask of the attribute
                m = F.element_at(p["mk"], index)
                v = {"d": lambda: masked_double(v, m), "l": lambda: masked_long(v, m),
                     "s": lambda: masked_text(F.coalesce(v, F.element_at(
                         F.col(LNGS_COLUMN), index).cast("string")), m)}[fam]()
            elif fam == "d":
                v = F.nanvl(v, F.lit(None).cast("double"))
            if shape.clamped:  # private windows' values into their bounds, before any sum
                v = clamped(v, p, index, fam)
            values.append(v.alias(name))
        slot_cols = [F.col(n) for n, _ in slots]
        stages: dict[str, Any] = {"explode": explode}
        stages["group"] = [F.col("pid"), F.col("key"), F.col("pane")]
        if kind == TUPLE:
            values += [p["g"].alias("_g"), p["off"].alias("_off")]
            ordered = [F.col(c).asc_nulls_last() for c in order]
            rn = F.row_number().over(Window.partitionBy("pid", "key").orderBy(*ordered))
            stages["number"] = [F.col("pid"), F.col("key"), F.col(SEQ_COLUMN), *slot_cols,
                                F.col("_g"), F.col("_off"), rn.alias("_ok")]
            stages["pane"] = [F.col("pid"), F.col("key"), F.col(SEQ_COLUMN), *slot_cols,
                              F.col("_ok"),
                              F.floor((F.col("_off") + F.col("_ok") - F.lit(1)) / F.col("_g"))
                              .alias("pane")]
            if shape.single_tuples:
                single = [F.col("pid"), F.col("key"), F.col("pane"),
                          F.col(SEQ_COLUMN).alias("mseq")]
                if shape.raw:
                    single += slot_cols  # one value per attribute: the driver makes partials
                else:  # the partials of a one-tuple pane, shaped like the time panes'
                    single.append(F.lit(1).cast("long").alias("rows"))
                    for (name, fam, parts) in shape.slots:
                        v = F.col(name)
                        for part in ("c", "s", "n", "x", "f", "l"):
                            if part in parts:
                                col = v.isNotNull().cast("long") if part == "c" else v
                                single.append(col.alias(f"{name}_{part}"))
                stages["single"] = single
                return {**stages, "values": values}
            okey = F.col("_ok")
            tcol = None
        else:
            # a numeric time beyond 2^53 s (or NaN, infinite) is no time: such a tuple joins
            # no window and moves no clock (floor() of it would fail the batch, ANSI overflow)
            tnum = F.element_at(F.col(NUMS_COLUMN), p["t"])
            tnum = F.when(F.abs(tnum) <= F.lit(TIME_LIMIT), tnum)
            micros = F.element_at(F.col(LNGS_COLUMN), p["t"])
            width = p["g"] * F.lit(1_000_000)
            pane = F.when(p["tk"] == 0,
                          ((micros - F.pmod(micros, width)) / width).cast("long")) \
                .otherwise(F.floor(tnum / p["g"]))
            values += [tnum.alias("_t"), pane.alias("pane")]
            stages["timed"] = F.col("pane").isNotNull()
            tcol = F.col("_t")
            if shape.ordered_time_firsts:
                okey = F.struct(tcol, F.coalesce(F.col(SEQ_COLUMN), F.lit(MAX_LONG)),
                                *([F.coalesce(F.col(TIME_COLUMN), F.lit(float("inf"))),
                                   F.coalesce(F.col(FILE_COLUMN), F.lit("\uffff"))]
                                  if shape.full_order else []),
                                *([F.col(POS_COLUMN)] if POS_COLUMN in order else []))
            else:
                okey = tcol  # no plan reads first/last values: ties need no order
        stages["values"] = values
        aggs = [F.count(F.lit(1)).alias("rows"), F.max(F.col(SEQ_COLUMN)).alias("mseq")]
        if tcol is not None:
            # the pane's largest event time: the plan's clock is the largest over its panes,
            # i.e. over the tuples its own filter passed (README "Time windows")
            aggs.append(F.max(tcol).alias("mt"))
        for name, fam, parts in shape.slots:
            v = F.col(name)
            present = v.isNotNull()
            made = {
                "c": lambda: F.count(v),
                "s": lambda: F.try_sum(v) if fam == "l" else F.sum(v),
                "n": lambda: F.min(v), "x": lambda: F.max(v), "o": lambda: F.bit_or(v),
                "f": lambda: F.min_by(v, F.when(present, okey)),
                "l": lambda: F.max_by(v, F.when(present, okey)),
                "ft": lambda: F.min(F.when(present, tcol)),
                "lt": lambda: F.max(F.when(present, tcol)),
            }
            for part in ("c", "s", "n", "x", "o", "f", "l", "ft", "lt"):
                if part in parts and (tcol is not None or part not in ("ft", "lt")):
                    aggs.append(made[part]().alias(f"{name}_{part}"))
        stages["aggregates"] = aggs
        return stages

    # ----- the micro-batch -------------------------------------------------------------------
    def _on_batch(self, batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        self.last_batch_started_at = time.time()
        self._batch_thread = threading.get_ident()
        self._ran_batch = True
        try:
            if self._pausing:
                raise _Paused()  # never committed: the restarted query runs this batch
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
            plans, version = self._current()
            if not plans:
                self._completed_batch = batch_id
                return
            t0 = time.perf_counter()
            if self._anchored is None or self._anchored[0] != version:
                self._anchored = (version, [s.compiled for s in plans if s.compiled.anchors])
            self._anchors.update(batch, self._anchored[1])  # nothing without DISTANCE_TO
            shape = self._shape_of(plans, version)
            rows_by = self._rows_matcher(plans, shape, version)
            scalar = None
            if rows_by is None or any(not s.rows for s in plans):
                # the plan table: only for what the compiled matchers leave to it
                table, scalar = self._plan_table(plans, version, shape)
            t1 = time.perf_counter()
            closed: list[str] = []
            spark_s = 0.0
            if scalar is not None or rows_by is not None:
                closed, spark_s = self._evaluate(batch, plans, shape, scalar, rows_by)
            t2 = time.perf_counter()
            # the evaluation jobs incl. toArrow, then the driver's share (windows, encoding,
            # delivery): the same split as before, read by tests/bench
            log.debug("batch %s: table %.3f eval %.3f route %.3f", batch_id, t1 - t0, spark_s,
                      t2 - t1 - spark_s)
            self.stats_counters["batches"] += 1
            self.stats_counters["plan_evaluations"] += len(plans)
            self._completed_batch = batch_id
            for handle_id in closed:
                self._on_handle_closed(handle_id)
        except Exception as exc:
            if isinstance(exc, _Paused):
                raise
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

    def _rows_matcher(self, plans: list[_PlanState], shape: Shape, version: int
                      ) -> Column | GroupedMatcher | None:
        """How the rows job matches tuples to the row plans: a few plans, one compiled Column
        each (`few_plans_column`); more, the `GroupedMatcher` (one compiled job returning the
        values the filters read, the tests as array kernels per shape); None: the plan table
        (spatial, masked or label comparisons)."""
        if shape.spatial or shape.masked:
            return None
        plain = [s for s in plans if s.rows and not s.compiled.passes_nothing]
        if not plain:
            return None
        windowed = any(not s.rows for s in plans)
        if len(plain) <= FEW_PLANS and not windowed:
            key = tuple((s.id, s.compiled.key, s.compiled.start_after) for s in plain)
            if self._few is None or self._few[0] != key:
                self._few = (key, few_plans_column([(s.id, s.compiled) for s in plain]))
            return self._few[1]
        if self._grouped is None or self._grouped[0] != version:
            self._grouped = (version, GroupedMatcher.build([(s.id, s.compiled) for s in plain]))
        return self._grouped[1]

    def _evaluate(self, batch: DataFrame, plans: list[_PlanState], shape: Shape,
                  scalar: Column | None, rows_by: Column | GroupedMatcher | None = None
                  ) -> tuple[list[str], float]:
        """Run the batch's jobs and hand out their results; (closed handles, seconds in
        Spark jobs)."""
        started = time.perf_counter()
        plain = [s for s in plans if s.rows and not s.compiled.passes_nothing]
        windowed = [s for s in plans if not s.rows]
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
        observation = Observation(f"xsg_{uuid.uuid4().hex}")
        observed = batch.observe(observation, *self._observed(shape))
        rows_arrow = panes_arrow = None
        if plain and shape.plain_columns:
            if grouped is not None:
                rows_arrow = self.admitted_frame(observed, shape, grouped).toArrow()
            elif few is not None or scalar is not None:
                rows_arrow = self.rows_frame(observed, scalar, shape, few).toArrow()
            panes_source = batch
        else:
            panes_source = observed
        # no plan table while every window plan passes nothing: no panes (`_route_panes`)
        if windowed and scalar is not None:
            panes_arrow = self.panes_frame(panes_source, scalar, shape).toArrow()
        try:
            figures = observation.get
        except Exception as exc:  # noqa: BLE001
            # pyspark 4.2.0 (the version Kafka pins) sometimes has no observed row for a Kafka
            # micro-batch whose only job is the panes job (toPyRow's assertion fails): the same
            # figures from one more small job over the batch
            log.debug("stream %s: observed figures unavailable (%s); computed",
                      self.definition.name, type(exc).__name__)
            figures = batch.agg(*self._observed(shape)).first().asDict()
        spark_s = time.perf_counter() - started
        self._observe(figures, shape)
        closed: list[str] = []
        for arrow in (rows_arrow, panes_arrow):
            if arrow is not None:
                self.stats_counters["driver_rows"] += arrow.num_rows
                self.stats_counters["driver_bytes"] += arrow.nbytes
        if rows_arrow is not None and rows_arrow.num_rows:
            closed += self._route_rows(rows_arrow, plain, shape, grouped)
        if windowed:
            closed += self._route_panes(panes_arrow, windowed, shape)
        return closed, spark_s

    def _observe(self, figures: dict, shape: Shape) -> None:
        self.stats_counters["rows_in"] += int(figures.get("rows") or 0)
        seq = figures.get("seq")
        if seq is not None:
            top = self.stats_counters["max_position"]
            self.stats_counters["max_position"] = seq if top is None else max(top, seq)

    # ----- plain plans: order, encode once per projection, deliver ---------------------------
    def _route_rows(self, arrow: pa.Table, plans: list[_PlanState], shape: Shape,
                    grouped: GroupedMatcher | None = None) -> list[str]:
        keys = [(c, "ascending", "at_end") for c in self._order_columns(shape)]
        arrow = arrow.take(pc.sort_indices(arrow, sort_keys=keys))
        if grouped is not None:  # a plan's pairs together, in stream order
            plan_ids, row_ids = grouped.pairs(arrow.column(BITS_COLUMN).combine_chunks())
        else:
            matches = arrow.column(PIDS_COLUMN).combine_chunks()
            plan_ids = pc.list_flatten(matches).to_numpy(zero_copy_only=False)
            row_ids = pc.list_parent_indices(matches).to_numpy(zero_copy_only=False)
            # a plan's pairs together, in stream order (a stable sort); a radix sort when the
            # ids span at most 2^16 (numpy sorts 16-bit keys so), else a merge sort
            sort_keys = plan_ids
            if len(plan_ids):
                low = plan_ids.min()
                if int(plan_ids.max()) - int(low) < 1 << 16:
                    sort_keys = (plan_ids - low).astype(np.uint16)
            by_plan = np.argsort(sort_keys, kind="stable")
            plan_ids, row_ids = plan_ids[by_plan], row_ids[by_plan]
        # each plan's pairs are one run: its bounds
        starts = np.concatenate(([0], np.flatnonzero(np.diff(plan_ids)) + 1)) \
            if len(plan_ids) else np.empty(0, np.int64)
        ends = list(starts[1:].tolist()) + [len(plan_ids)]
        bounds = dict(zip(plan_ids[starts].tolist(), zip(starts.tolist(), ends)))
        seqs = arrow.column(SEQ_COLUMN).combine_chunks().fill_null(NO_SEQ).to_numpy()
        groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[_PlanState]] = {}
        closed: list[str] = []
        for state in plans:
            if state.id not in bounds:
                continue
            if state.windows is not None:
                closed += self._row_windows(state, arrow, row_ids[slice(*bounds[state.id])],
                                            seqs)
            elif state.handles:  # a member of unions only is delivered through them, below
                projection = state.compiled.projection
                sources = tuple(self.row_columns(state.compiled, projection))
                groups.setdefault((projection, sources), []).append(state)
        for (projection, sources), members in groups.items():
            picks = [row_ids[slice(*bounds[s.id])] for s in members]
            rows = picks[0] if len(picks) == 1 else np.unique(np.concatenate(picks))
            table = arrow.select(list(sources)).rename_columns(list(projection)) \
                .take(pa.array(rows))
            texts, lengths = _json_texts(table)
            for state, idx in zip(members, picks):
                if len(picks) == 1:
                    chosen, size = tuple(texts), int(lengths.sum())
                else:
                    at = np.searchsorted(rows, idx)
                    chosen = _pick(texts, at)
                    size = int(lengths[at].sum())
                top = int(seqs[idx].max()) if len(idx) else NO_SEQ
                out = RowBatch(chosen, size, None if top == NO_SEQ else top)
                state.batches += 1
                closed += self._deliver(state, out)
        closed += self._route_unions(arrow, row_ids, bounds, seqs, plans)
        return closed

    def _route_unions(self, arrow: pa.Table, row_ids: np.ndarray,
                      bounds: dict[int, tuple[int, int]], seqs: np.ndarray,
                      plans: list[_PlanState]) -> list[str]:
        """Each union's plain members' rows, merged per tuple (`pep.runtime.union`)."""
        with self._lock:
            unions = [u for u in self._unions.values() if u.handles]
        if not unions:
            return []
        states = {s.id: s for s in plans}
        closed: list[str] = []
        for union in unions:
            members = [(bit, pid) for bit, pid in enumerate(union.members)
                       if pid in states and states[pid].windows is None]
            if not members:
                continue
            mask = member_masks(arrow.num_rows, row_ids, bounds, members)
            projections = {bit: states[pid].compiled.projection for bit, pid in members}
            out = merged_rows(arrow, mask, projections, self._field_names, _json_texts, seqs,
                              NO_SEQ)
            if out is not None:
                closed += self._deliver_to(list(union.handles.values()), out)
        return closed

    def _row_windows(self, state: _PlanState, arrow: pa.Table, idx: np.ndarray,
                     seqs: np.ndarray) -> list[str]:
        """A tuple window's tuples of this batch (in stream order) into one-tuple panes."""
        windows = state.windows
        assert windows is not None
        w = windows.window
        take = pa.array(idx)
        keys = None
        column = dict(zip(self._field_names, self.row_columns(state.compiled,
                                                              self._field_names)))
        if w.keys:
            texts = [value_texts(arrow.column(column[k]).take(take)) for k in w.keys]
            joined = texts[0] if len(texts) == 1 else \
                pc.binary_join_element_wise(*texts, KEY_SEP)
            keys = np.array(joined.to_pylist(), dtype=object)
        lattices = dict(w.lattices)
        values = [_family_values(arrow.column(column[attr]).take(take), ftype,
                                 lattices.get(attr))
                  for attr, ftype in w.attributes]
        partials = partials_from_values(windows.layout, keys, seqs[idx], values)
        result = windows.add(partials)
        state.batches += 1
        if not len(result):
            return []
        return self._deliver(state, RowBatch(tuple(result.texts), result.nbytes,
                                             result.last_position))

    # ----- window plans: panes into windows ---------------------------------------------------
    def _route_panes(self, arrow: pa.Table | None, plans: list[_PlanState], shape: Shape
                     ) -> list[str]:
        bounds: dict[int, tuple[int, int]] = {}
        if arrow is not None and arrow.num_rows:
            arrow = arrow.sort_by("pid")
            pids = arrow.column("pid").to_numpy()
            ids, starts = np.unique(pids, return_index=True)
            ends = list(starts[1:].tolist()) + [len(pids)]
            bounds = dict(zip(ids.tolist(), zip(starts.tolist(), ends)))
        closed: list[str] = []
        for state in plans:
            windows = state.windows
            assert windows is not None
            layout = windows.layout
            batch_time = None
            if state.id in bounds:
                lo, hi = bounds[state.id]
                mine = arrow.slice(lo, hi - lo)
                partials = partials_from_arrow(mine, layout, _slot_columns(layout),
                                               raw=shape.raw)
                if layout.timed:
                    batch_time = pc.max(mine.column("mt")).as_py()
            else:
                partials = empty_partials(layout)
            # the plan's own watermark: only tuples its filter passed move it
            watermark = windows.advance(batch_time, self.lateness) if layout.timed else None
            result = windows.add(partials, watermark)
            state.batches += 1
            if len(result):
                out = RowBatch(tuple(result.texts), result.nbytes, result.last_position)
                closed += self._deliver(state, out)
        return closed

    def _deliver(self, state: _PlanState, out: RowBatch) -> list[str]:
        closed = self._deliver_to(list(state.handles.values()), out)
        if state.unions and state.windows is not None:
            # a windowed member's windows go to its unions' handles, tagged with its index
            with self._lock:
                targets = [(self._unions[key], index) for key, index in state.unions.items()
                           if key in self._unions]
            for union, index in targets:
                closed += self._deliver_to(list(union.handles.values()), tag_rows(out, index))
        return closed

    def _deliver_to(self, handles: list[_Handle], out: RowBatch) -> list[str]:
        closed = []
        for handle in handles:
            with handle.lock:
                if not handle.active:
                    continue
                try:
                    ok = handle.deliver(out)
                except Exception:
                    log.exception("deliver of handle %s failed; detaching it",
                                  handle_ref(handle.id))
                    ok = False
                if ok is False:
                    handle.active = False
                    closed.append(handle.id)
                else:
                    handle.delivered_rows += len(out)
                    self.stats_counters["rows_delivered"] += len(out)
        return closed


def _family_values(column: pa.ChunkedArray, ftype: str, lattice: Lattice | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """An attribute's values as the windows' family dtype, and where they are present (NaN
    counts as absent, as null does; a label's text that is no label of its lattice too)."""
    column = column.combine_chunks()
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    if ftype == "label" and lattice is not None:  # its code, each distinct text parsed once
        texts = column.fill_null("")
        uniq, inverse = np.unique(np.array(texts.to_pylist(), dtype=object),
                                  return_inverse=True)
        codes = np.array([_label_code(t, lattice) for t in uniq.tolist()], dtype=np.int64)
        values = codes[inverse] if len(uniq) else np.empty(0, np.int64)
        return np.where(values < 0, 0, values), valid & (values >= 0)
    if ftype == "string":
        return np.array(column.to_pylist(), dtype=object), valid
    if ftype == "double":
        values = column.fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        nan = np.isnan(values)
        if nan.any():
            valid = valid & ~nan
            values = np.where(nan, 0.0, values)
        return values, valid
    if ftype == "timestamp":
        column = column.cast(pa.timestamp("us")).cast(pa.int64())
    elif ftype == "boolean":
        column = column.cast(pa.int64())
    return column.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), valid


def _label_code(text: str, lattice: Lattice) -> int:
    try:
        return lattice.parse(text).code
    except LabelError:
        return -1


def _slot_columns(layout) -> dict[str, str]:
    """This plan's attribute j -> the panes job's slot columns (per family, in order)."""
    seen = {"d": 0, "l": 0, "s": 0}
    out = {}
    for j, fam in enumerate(layout.families):
        name = f"{fam}{seen[fam]}"
        seen[fam] += 1
        out[f"v{j}"] = name
        for part in ("c", "s", "n", "x", "o", "f", "l", "ft", "lt"):
            out[f"{part}{j}"] = f"{name}_{part}"
    return out


def _json_texts(table: pa.Table) -> tuple[list[str], np.ndarray]:
    """Each row's JSON text, and its length in bytes."""
    encoded = json_array([(name, table.column(name), False) for name in table.column_names],
                         table.num_rows)
    return encoded.to_pylist(), pc.binary_length(encoded).to_numpy().astype(np.int64)


def _pick(texts: list[str], at: np.ndarray) -> tuple[str, ...]:
    if len(at) == 0:
        return ()
    if len(at) == 1:
        return (texts[int(at[0])],)
    return operator.itemgetter(*at.tolist())(texts)


__all__ = ["StreamExecutor", "Shape", "filter_expressions", "value_arrays", "long_array",
           "matched_plans_column", "POS_COLUMN", "PIDS_COLUMN", "PLAN_TABLE_ARROW"]
