"""Joins of two streams on Spark: one Structured Streaming query per distinct `JoinPlan`.

Each join runs as a stream-stream inner join of its own, beside the shared per-stream queries
(which it does not touch): each side is that stream's source (for an `ingest` stream, a feed of
the batches written since the join started, `StreamCatalog.open_feed`: nothing from before is
replayed, and the stream's own query archiving its committed files takes nothing away from the
join; other kinds read their source as the stream's query does) with the side plan applied in the
DataFrame API (its start position, its filter with every constant a literal (`F.lit`), never SQL
text; its projection; its time window as a Spark window aggregation), a watermark on each side's
time column, then the join on the equalities and the time bound. Handles with the same plan key
share one query; the query stops with its last handle.

State is bounded by the watermarks (pep/runtime/README.md, "Joins"): each side's watermark is
the latest time among its authorised rows minus `lateness` seconds; the query's watermark is the
lower of the two; Spark drops a buffered row once no row of the other side that is not yet late
can still be within `within` seconds of it, and a side's open windows once the watermark passes
their end. So the join holds about (`within` + `lateness` + a micro-batch) seconds of each side,
and a windowed side one window's partial aggregates per key.

Security labels (MLS): a windowed side's `lub` and its window's label bounds run in the side's
aggregation, in Spark (`_label_bounds` says why per-side bounds suffice for a joined row); when
the plan names the sides' labels (`JoinPlan.label`), each joined row also carries `label`, the
least upper bound of the two.

Output: one dict per joined pair, both sides' outputs named `<stream>.<output>` (and `label`);
timestamps as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (as the shared runtime delivers them); delivered as
one `RowBatch` per micro-batch, shared by the plan's handles.
"""
from __future__ import annotations

import logging
import math
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pep.core.conditions import COMPARATORS
from pep.core.join import JOINED_LABEL, label_lattice
from pep.core.labels import LabelError, Lattice
from pep.core.plan import AnyPredicate, ExecutionPlan, JoinPlan, SpatialPredicate, StreamDefinition
from pep.core.refs import handle_ref
from pep.core.rows import RowBatch
from pep.runtime.checkpoints import await_kafka_offsets
from pep.runtime.labels import dominated_by, label_code, label_text, lub_code, lub_of
from pep.runtime.compile import PlanError, compile_predicate, plan_masks
from pep.runtime.mask_keys import MaskKeys
from pep.core.masks import Mask
from pep.runtime.masks import hashed_text, hmac_material, mask_literal, masked_column
from pep.runtime.predicates import row_column
from pep.runtime.sources import DELETE_COMMITTED, SEQ_COLUMN, build_source
from pep.runtime.spatial import edges, haversine, inside_polygon, valid_position

log = logging.getLogger(__name__)

Deliver = Callable[[Any], bool]
TIME = "_t"  # a side's time column (a timestamp), internal


class JoinPlanError(ValueError):
    """A join plan this runtime cannot run; the message says which side and why."""


# -- one side, in the DataFrame API ---------------------------------------------------------------

def _compare(left: Column, op: str, right: Column) -> Column:
    try:
        return COMPARATORS[op](left, right)
    except KeyError:
        raise JoinPlanError(f"unknown operator {op!r}") from None


def _coordinate(definition: StreamDefinition, name: str) -> Column:
    field_ = definition.schema.lookup(name)
    if field_ is None or field_.type not in ("double", "long"):
        raise JoinPlanError(f"stream {definition.name!r}: {name!r} is not a numeric attribute")
    return F.col(f"`{field_.name}`").cast("double")


def _spatial_column(p: SpatialPredicate, definition: StreamDefinition) -> Column:
    """DISTANCE and WITHIN_POLYGON with the shared runtime's Column expressions
    (pep/runtime/spatial.py), constants as literals; false without a valid position.
    DISTANCE_TO needs the shared query's anchor tracking: refused (pep.core.join refuses it
    first)."""
    lat, lon = _coordinate(definition, p.latitude), _coordinate(definition, p.longitude)
    if p.function == "distance":
        test = _compare(haversine(lat, lon, F.lit(float(p.points[0])), F.lit(float(p.points[1]))),
                        p.op, F.lit(float(p.value)))
    elif p.function == "polygon":
        edge_array = F.array(*[F.struct(*[F.lit(float(e[k])).alias(k)
                                          for k in ("y1", "x1", "y2", "x2")])
                               for e in edges(tuple(p.points))])
        inside = inside_polygon(lat, lon, edge_array)
        if p.op not in ("=", "!="):
            raise JoinPlanError(f"stream {definition.name!r}: a polygon is tested with = or !=")
        test = inside if p.op == "=" else ~inside
    else:
        raise JoinPlanError(f"stream {definition.name!r}: {p.function.upper()} cannot be "
                            "evaluated in a join")
    return F.coalesce(valid_position(lat, lon) & test, F.lit(False))


def filter_column(dnf: tuple[tuple[AnyPredicate, ...], ...] | None,
                  definition: StreamDefinition,
                  mask_of: Callable[[str], Column] | None = None) -> Column | None:
    """The DNF as one Column (None: every tuple passes); constants are literals. A comparison
    over a null attribute is null, which a filter drops: false, as the plan says."""
    if dnf is None:
        return None
    if not dnf:
        return F.lit(False)
    alternatives = []
    for conjunct in dnf:
        terms = []
        for p in conjunct:
            if isinstance(p, SpatialPredicate):
                terms.append(_spatial_column(p, definition))
                continue
            if definition.schema.lookup(p.attribute) is None:
                raise JoinPlanError(f"stream {definition.name!r} has no attribute {p.attribute!r}")
            try:  # each attribute compared in its own family, exactly (pep/runtime/compile.py)
                row = compile_predicate(p, definition.schema, f"stream {definition.name!r}")
            except PlanError as exc:
                raise JoinPlanError(str(exc)) from None
            terms.append(row_column(row, definition.schema, mask_of))
        alternatives.append(_and(terms) if terms else F.lit(True))
    out = alternatives[0]
    for alt in alternatives[1:]:
        out = out | alt
    return out


def _and(terms: list[Column]) -> Column:
    out = terms[0]
    for t in terms[1:]:
        out = out & t
    return out


def _time_column(definition: StreamDefinition, attribute: str) -> Column:
    field_ = definition.schema.lookup(attribute)
    if field_ is None:
        raise JoinPlanError(f"stream {definition.name!r} has no time attribute {attribute!r}")
    column = F.col(f"`{field_.name}`")
    if field_.type == "timestamp":
        return column
    if field_.type in ("double", "long"):
        return F.timestamp_micros((column.cast("double") * F.lit(1_000_000.0)).cast("long"))
    raise JoinPlanError(f"stream {definition.name!r}: time attribute {attribute!r} is "
                        f"{field_.type}, not a timestamp or epoch seconds")


@dataclass(frozen=True)
class _Output:
    internal: str  # column in the joined frame
    name: str  # `<stream>.<output>` in result rows
    seconds: bool = False  # a timestamp delivered as epoch seconds (numeric time attributes)


def _aggregate(function: str, column: Column, order: Column) -> Column:
    if function == "avg":
        return F.avg(column)
    if function == "sum":
        return F.sum(column)
    if function == "min":
        return F.min(column)
    if function == "max":
        return F.max(column)
    if function == "count":
        return F.count(column)
    # first and last non-null value in (event time, stream position) order
    ordered = F.when(column.isNotNull(), order)
    if function == "firstval":
        return F.min_by(column, ordered)
    if function == "lastval":
        return F.max_by(column, ordered)
    raise JoinPlanError(f"unknown aggregate function {function!r}")


KEY_COLUMN = "_xsg_key"  # the owner's hash key, from a one-row table the side is crossed with


def side_frame(spark: SparkSession, definition: StreamDefinition, plan: ExecutionPlan,
               time_output: str, prefix: str, lateness: float, max_files: int,
               feed: Path | None = None, mask_key: Callable[[str], bytes] | None = None,
               source: DataFrame | None = None) -> tuple[DataFrame, list[_Output]]:
    """The side's authorised view as a streaming DataFrame: columns `<prefix><i>` (its outputs,
    in order) and `<prefix>_t` (its time), watermarked; plus how to name its outputs.

    `feed`: for an `ingest` stream, the directory that receives the stream's batches written
    since the join opened (`StreamCatalog.open_feed`); read instead of the ingest directory,
    whose files the stream's own query archives, and deleted once committed. `source`: a
    DataFrame of the source's shape (the schema's columns and `_xsg_seq`) read instead of the
    stream's source; a static one gives the same view as a batch (the tests' brute force runs
    the very expressions a join runs)."""
    if plan.stream != definition.name:
        raise JoinPlanError(f"side plan is for stream {plan.stream!r}, not {definition.name!r}")
    if source is not None:
        df = source
    elif feed is not None and definition.source.kind == "ingest":
        options = dict(definition.source.options)
        options["path"] = str(feed)
        fed = replace(definition, source=replace(definition.source,
                                                 options=tuple(sorted(options.items()))))
        df = build_source(spark, fed, max_files, DELETE_COMMITTED)
    else:
        df = build_source(spark, definition, max_files)
    if plan.start_after is not None:
        df = df.filter(F.col(SEQ_COLUMN) > F.lit(int(plan.start_after)))
    try:
        masks = plan_masks(plan, definition.schema)
    except PlanError as exc:
        raise JoinPlanError(f"stream {definition.name!r}: {exc}") from None
    key = None
    if any(m.kind == "hash" for m in masks.values()):
        if mask_key is None:
            raise JoinPlanError(f"stream {definition.name!r}: a hash mask needs its owner's key")
        table = pa.Table.from_pylist([{KEY_COLUMN: hmac_material(mask_key(definition.owner))}],
                                     schema=pa.schema([(KEY_COLUMN, pa.binary())]))
        df = df.crossJoin(spark.createDataFrame(table))  # the key as data, never a literal
        key = F.col(KEY_COLUMN)
    types = {f.name: f.type for f in definition.schema.fields}

    def mask_of(name: str) -> Column:
        return mask_literal(masks[name], types[name], key)

    condition = filter_column(plan.filter_dnf, definition, mask_of)
    if condition is not None:
        df = df.filter(condition)
    if masks:  # right after the filter, before the projection, the window and the join
        df = df.withColumns({n: _masked_value(F.col(f"`{n}`"), types[n], masks[n], mask_of(n))
                             for n in masks})
        if key is not None:
            df = df.drop(KEY_COLUMN)
    time_col = f"{prefix}{TIME}"
    seq_col = f"{prefix}_seq"
    w = plan.window
    outputs: list[_Output] = []
    if w is None:
        if not plan.projection:
            raise JoinPlanError(f"stream {definition.name!r}: its side shows no attribute")
        time_attribute = definition.schema.lookup(time_output)
        if time_attribute is None or time_attribute.name not in plan.projection:
            raise JoinPlanError(f"stream {definition.name!r}: the join's time {time_output!r} "
                                "is not one of its side's outputs")
        cols = [_time_column(definition, time_attribute.name).alias(time_col)]
        for i, name in enumerate(plan.projection):
            if name == time_attribute.name and time_attribute.type == "timestamp":
                # the time column is this output already: not kept twice in the join's state
                outputs.append(_Output(time_col, f"{definition.name}.{name}"))
                continue
            cols.append(F.col(f"`{name}`").alias(f"{prefix}{i}"))
            outputs.append(_Output(f"{prefix}{i}", f"{definition.name}.{name}"))
        return df.select(*cols).withWatermark(time_col, _delay(lateness)), outputs
    if w.kind != "time":
        raise JoinPlanError(f"stream {definition.name!r}: a tuple-windowed side cannot be joined "
                            "(Spark cannot join after a count-based window)")
    if time_output != "window_end":
        raise JoinPlanError(f"stream {definition.name!r}: a windowed side's time is window_end")
    time_attribute = w.time_attribute or definition.time_attribute
    if not time_attribute:
        raise JoinPlanError(f"stream {definition.name!r}: a time window needs a time attribute")
    numeric_time = definition.schema.lookup(time_attribute).type != "timestamp"  # type: ignore
    bounds = _label_bounds(definition, w.label_bounds)
    needed = list(dict.fromkeys([*w.keys, *(a.attribute for a in w.aggregates),
                                 *(a for a, _, _ in bounds)]))
    cols = [_time_column(definition, time_attribute).alias(time_col),
            F.col(SEQ_COLUMN).alias(seq_col)]
    cols += [F.col(f"`{n}`").alias(f"{prefix}a_{i}") for i, n in enumerate(needed)]
    inner = {n: f"{prefix}a_{i}" for i, n in enumerate(needed)}
    lattices = {n: _lattice(definition, n) for n in needed}
    # a label's code beside its text: its lub and its count read the code (a text that is no
    # label of the lattice counts as absent, as in the shared runtime)
    codes = {n: f"{prefix}k_{i}" for i, n in enumerate(needed) if lattices[n] is not None}
    cols += [label_code(F.col(f"`{n}`"), lattices[n]).alias(codes[n]) for n in codes]
    df = df.select(*cols).withWatermark(time_col, _delay(lateness))
    order = F.struct(F.col(time_col), F.col(seq_col))
    window = F.window(F.col(time_col), f"{w.size} seconds", f"{w.step} seconds")
    aggs = [F.count(F.lit(1)).alias(f"{prefix}_n")]
    for j, agg in enumerate(w.aggregates):
        if agg.attribute in codes and agg.function in ("lub", "count"):
            code = F.col(codes[agg.attribute])
            aggs.append((F.count(code) if agg.function == "count"
                         else label_text(lub_code(F.max(code), F.bit_or(code)),
                                         lattices[agg.attribute])).alias(f"{prefix}g_{j}"))
            continue
        if agg.function == "lub":
            raise JoinPlanError(f"stream {definition.name!r}: lub is the aggregate of label "
                                f"attributes; {agg.attribute!r} is none")
        aggs.append(_aggregate(agg.function, F.col(inner[agg.attribute]), order)
                    .alias(f"{prefix}g_{j}"))
    for j, (attribute, _, _) in enumerate(bounds):  # the lub a bound reads, even if not shown
        code = F.col(codes[attribute])
        aggs.append(lub_code(F.max(code), F.bit_or(code)).alias(f"{prefix}b_{j}"))
    grouped = df.groupBy(window.alias(f"{prefix}_w"), *[F.col(inner[k]) for k in w.keys])
    grouped = grouped.agg(*aggs).filter(F.col(f"{prefix}_n") >= F.lit(int(w.min_count)))
    for j, (_, _, ceiling) in enumerate(bounds):
        lub = F.col(f"{prefix}b_{j}")  # a window without any label passes: nothing above
        grouped = grouped.filter(lub.isNull() | dominated_by(lub, ceiling))
    win = F.col(f"{prefix}_w")
    cols = [F.window_time(win).alias(time_col)]

    def bound(column: Column) -> Column:
        return (F.unix_micros(column) / F.lit(1_000_000.0)) if numeric_time else column

    names = ["window_start", "window_end", *w.keys, *(a.output_name for a in w.aggregates)]
    sources = [bound(win["start"]), bound(win["end"]), *[F.col(inner[k]) for k in w.keys],
               *[F.col(f"{prefix}g_{j}") for j in range(len(w.aggregates))]]
    for i, (name, column) in enumerate(zip(names, sources)):
        cols.append(column.alias(f"{prefix}{i}"))
        outputs.append(_Output(f"{prefix}{i}", f"{definition.name}.{name}"))
    return grouped.select(*cols), outputs


def _lattice(definition: StreamDefinition, name: str) -> Lattice | None:
    field_ = definition.schema.lookup(name)
    return field_.lattice if field_ is not None and field_.type == "label" else None


def _label_bounds(definition: StreamDefinition, bounds: tuple[tuple[str, str], ...]
                  ) -> list[tuple[str, Lattice, int]]:
    """A window's label bounds as (attribute, its lattice, the bound's code).

    A side window is kept only when every bound dominates the least upper bound of its tuples'
    labels (`pep.runtime.windows` does the same for a stream read alone), in Spark, before the
    join. That suffices for a joined row: its label is the lub of its two sides' labels, and
    when the reader's session S dominates both A and B it dominates lub(A, B), since the lub is
    the least of the labels that dominate both. A plain side has no window to bound: its
    policy's filter (`level DOMINATED_BY {subject:session}`) keeps only dominated tuples. So a
    joined row whose two sides each passed the session passes it too, and no further bound is
    applied to the joined rows."""
    out = []
    for attribute, text in bounds:
        lattice = _lattice(definition, attribute)
        if lattice is None:
            raise JoinPlanError(f"stream {definition.name!r}: window label bound on "
                                f"{attribute!r}, which is no label attribute")
        try:
            out.append((definition.schema.lookup(attribute).name,  # type: ignore[union-attr]
                        lattice, lattice.parse(text).code))
        except LabelError as exc:
            raise JoinPlanError(f"stream {definition.name!r}: window label bound on "
                                f"{attribute!r}: {exc}") from None
    return out


def _masked_value(column: Column, field_type: str, mask: Mask, m: Column) -> Column:
    """What a side shows of a masked attribute (`m`: `mask` as a struct): a hashed long
    becomes its hash's text."""
    if mask.kind == "hash" and field_type == "long":
        return hashed_text(column, field_type, m)
    return masked_column(column, field_type, m)


def _delay(seconds: float) -> str:
    millis = max(0, int(round(seconds * 1000)))
    return f"{millis} milliseconds"


def joined_frame(spark: SparkSession, left: StreamDefinition, right: StreamDefinition,
                 plan: JoinPlan, lateness: float = 10.0, max_files: int = 50,
                 feeds: tuple[Path | None, Path | None] = (None, None),
                 mask_key: Callable[[str], bytes] | None = None,
                 sources: tuple[DataFrame | None, DataFrame | None] = (None, None)
                 ) -> tuple[DataFrame, list[_Output]]:
    """The join of the two sides' authorised views, and how to name the result's columns
    (`sources`: see `side_frame`)."""
    if (left.name, right.name) != plan.streams:
        raise JoinPlanError(f"the join is of {plan.streams}, not of {(left.name, right.name)}")
    lframe, lout = side_frame(spark, left, plan.left, plan.left_time, "l", lateness, max_files,
                              feeds[0], mask_key, sources[0])
    rframe, rout = side_frame(spark, right, plan.right, plan.right_time, "r", lateness,
                              max_files, feeds[1], mask_key, sources[1])
    index = {("left", n): o.internal for n, o in zip(_names(plan.left), lout)}
    index.update({("right", n): o.internal for n, o in zip(_names(plan.right), rout)})
    terms = []
    for a, b in plan.on:
        lcol, rcol = F.col(index[("left", a)]), F.col(index[("right", b)])
        terms.append(lcol == rcol)
    # |time(left) - time(right)| <= within, where a windowed side's time is its window_end and
    # its column holds window_time (window_end - 1 microsecond, Spark's event time of a window)
    shift = _windowed(plan.right) - _windowed(plan.left)  # microseconds
    lt, rt = F.col(f"l{TIME}"), F.col(f"r{TIME}")
    low = timedelta(microseconds=shift) - timedelta(seconds=plan.within)
    high = timedelta(microseconds=shift) + timedelta(seconds=plan.within)
    terms.append(lt >= rt + F.lit(low))
    terms.append(lt <= rt + F.lit(high))
    joined = lframe.join(rframe, _and(terms), "inner")
    outputs = lout + rout
    if plan.label is not None:
        joined = joined.withColumn(LABEL_COLUMN, _joined_label(left, right, plan, index))
        outputs.append(_Output(LABEL_COLUMN, JOINED_LABEL))
    return joined, outputs


LABEL_COLUMN = "_xsg_label"  # a joined row's label (JoinPlan.label)


def _joined_label(left: StreamDefinition, right: StreamDefinition, plan: JoinPlan,
                  index: dict[tuple[str, str], str]) -> Column:
    """The least upper bound of the two sides' labels, as text; a side without a label (null, or
    a text no label of the lattice) adds nothing to it, neither does none (null)."""
    assert plan.label is not None
    lattices = (label_lattice(plan.left, left.schema, plan.label[0]),
                label_lattice(plan.right, right.schema, plan.label[1]))
    if None in lattices or (lattices[0].levels, lattices[0].categories) != (  # type: ignore
            lattices[1].levels, lattices[1].categories):  # type: ignore[union-attr]
        raise JoinPlanError(f"the join's label reads {plan.label[0]!r} and {plan.label[1]!r}, "
                            "which are not labels over one lattice")
    lattice = lattices[0]
    assert lattice is not None
    codes = [label_code(F.col(index[(side, name)]), lattice)
             for side, name in zip(("left", "right"), plan.label)]
    return label_text(lub_of(*codes), lattice)


def _windowed(plan: ExecutionPlan) -> int:
    return 1 if plan.window is not None else 0


def _names(plan: ExecutionPlan) -> list[str]:
    w = plan.window
    if w is None:
        return list(plan.projection)
    return ["window_start", "window_end", *w.keys, *(a.output_name for a in w.aggregates)]


# -- the runtime ----------------------------------------------------------------------------------

@dataclass
class _Handle:
    id: str
    deliver: Deliver
    lock: threading.RLock = field(default_factory=threading.RLock)
    active: bool = True


class _JoinQuery:
    """One running join and the handles it serves."""

    def __init__(self, runtime: "JoinRuntime", plan: JoinPlan,
                 streams: tuple[StreamDefinition, StreamDefinition]) -> None:
        self.runtime = runtime
        self.plan = plan
        self.streams = streams
        self.handles: dict[str, _Handle] = {}
        self.lock = threading.RLock()
        self.query = None
        self.checkpoint: Path | None = None
        self.feeds: list[tuple[str, Path]] = []  # (stream, directory) opened for this query
        self.outputs: list[_Output] = []
        self.stopped = False
        self.batch_thread: int | None = None
        self.counters: dict[str, Any] = {"batches": 0, "rows": 0, "rows_delivered": 0,
                                         "last_batch_ms": None, "last_error": None}

    def start(self) -> None:
        rt = self.runtime
        qid = uuid.uuid4().hex
        feeds: list[Path | None] = []
        for side, definition in zip(("left", "right"), self.streams):
            if rt.feeds is None or definition.source.kind != "ingest":
                feeds.append(None)
                continue
            directory = rt.work_dir / "feeds" / qid / side
            rt.feeds.open_feed(definition.name, directory)
            self.feeds.append((definition.name, directory))
            feeds.append(directory)
        try:
            frame, self.outputs = joined_frame(rt.spark, self.streams[0], self.streams[1],
                                               self.plan, rt.lateness, rt.max_files_per_trigger,
                                               (feeds[0], feeds[1]), rt.mask_keys.key_for)
            self.checkpoint = rt.work_dir / "checkpoints" / qid
            self.checkpoint.mkdir(parents=True, exist_ok=True)
            millis = max(1, int(round(rt.trigger_interval * 1000)))
            self.query = (frame.writeStream
                          .queryName(f"xsg-join-{qid[:12]}")
                          .foreachBatch(self._on_batch)
                          .option("checkpointLocation", str(self.checkpoint))
                          .trigger(processingTime=f"{millis} milliseconds")
                          .start())
            kafka = sum(1 for d in self.streams if d.source.kind == "kafka")
            if kafka:  # a Kafka side starts at the latest offsets, fixed at the first trigger
                await_kafka_offsets(self.checkpoint, kafka, self.query)
        except BaseException:
            self._close_feeds()
            raise

    def _close_feeds(self) -> None:
        feeds, self.feeds = self.feeds, []
        for name, directory in feeds:
            self.runtime.feeds.close_feed(name, directory)  # type: ignore[union-attr]
            shutil.rmtree(directory.parent, ignore_errors=True)

    @property
    def active(self) -> bool:
        return self.query is not None and self.query.isActive

    def _on_batch(self, batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        self.batch_thread = threading.get_ident()
        try:
            with self.lock:
                if self.stopped:
                    return
                handles = [h for h in self.handles.values() if h.active]
            if not handles:
                return
            columns = list(dict.fromkeys([o.internal for o in self.outputs]
                                         + [f"l{TIME}", f"r{TIME}"]))
            arrow = batch.select(*columns).toArrow()
            self.counters["batches"] += 1
            if arrow.num_rows == 0:
                return
            rows = self._rows(arrow)
            self.counters["rows"] += len(rows)
            closed = self._deliver(handles, RowBatch.of(rows))
            for handle_id in closed:
                self.runtime._closed_by_deliver(handle_id)
        except Exception as exc:
            if self.stopped:
                return
            self.counters["last_error"] = f"{type(exc).__name__}: {exc}"
            log.exception("join %s: micro-batch %s failed", self.plan.key()[:12], batch_id)
            raise
        finally:
            self.batch_thread = None
            self.counters["last_batch_ms"] = round((time.perf_counter() - started) * 1000, 1)

    def _rows(self, arrow: pa.Table) -> list[dict]:
        """Ordered by (left time, right time); columns renamed; timestamps as ISO text."""
        arrow = arrow.take(pc.sort_indices(arrow, sort_keys=[(f"l{TIME}", "ascending"),
                                                             (f"r{TIME}", "ascending")]))
        names, columns = [], []
        for o in self.outputs:
            column = arrow.column(o.internal)
            if pa.types.is_timestamp(column.type):
                column = _iso_text(column)
            names.append(o.name)
            columns.append(column)
        return pa.Table.from_arrays(columns, names=names).to_pylist()

    def _deliver(self, handles: list[_Handle], batch: RowBatch) -> list[str]:
        closed = []
        for handle in handles:
            with handle.lock:
                if not handle.active:
                    continue
                try:
                    ok = handle.deliver(batch)
                except Exception:
                    log.exception("deliver of handle %s failed; detaching it",
                                  handle_ref(handle.id))
                    ok = False
                if ok is False:
                    handle.active = False
                    closed.append(handle.id)
                else:
                    self.counters["rows_delivered"] += len(batch)
        return closed

    def in_batch_thread(self) -> bool:
        return self.batch_thread == threading.get_ident()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            handles = list(self.handles.values())
        for h in handles:
            with h.lock:
                h.active = False
        deadline = time.monotonic() + 3.0
        while (self.batch_thread is not None and not self.in_batch_thread()
               and time.monotonic() < deadline):
            time.sleep(0.02)
        if self.query is not None:
            try:
                self.query.stop()
            except Exception as exc:  # it may have failed already: report, don't raise
                log.warning("stopping join %s: %s", self.plan.key()[:12], exc)
        if self.checkpoint is not None:
            shutil.rmtree(self.checkpoint, ignore_errors=True)
        self._close_feeds()

    def stats(self) -> dict:
        out = dict(self.counters)
        with self.lock:
            out["handles"] = sum(1 for h in self.handles.values() if h.active)
        out.update(streams=list(self.plan.streams), active=self.active,
                   query_id=str(self.query.id) if self.query is not None else None)
        progress = self.query.lastProgress if self.query is not None else None
        if progress:
            operators = progress.get("stateOperators") or []
            out["state_rows"] = sum(op.get("numRowsTotal", 0) for op in operators)
            out["late_rows"] = sum(op.get("numRowsDroppedByWatermark", 0) for op in operators)
            out["watermark"] = (progress.get("eventTime") or {}).get("watermark")
        return out


def _iso_text(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Timestamps as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (the shared runtime's and the ingest's form)."""
    text = column.cast(pa.timestamp("us")).cast(pa.string())
    text = pc.utf8_replace_slice(text, start=10, stop=11, replacement="T")
    return pc.binary_join_element_wise(text, "Z", "")


class FeedSource(Protocol):
    """Where an `ingest` stream's batches can be copied for a join (`StreamCatalog`)."""

    def open_feed(self, name: str, directory: Path) -> None: ...

    def close_feed(self, name: str, directory: Path) -> None: ...


class JoinRuntime:
    """Runs `JoinPlan`s: attach / detach / handles / stats / stop, like the stream runtime.

    `attach(handle_id, (left, right), plan, deliver)`: `deliver(batch)` is called from the
    join's micro-batch thread with a `RowBatch`, never after `detach()` of the handle returned;
    returning False (or raising) detaches the handle. Handles with the same `plan.key()` share
    one query (the rows are computed once)."""

    def __init__(self, spark: SparkSession | None, work_dir: Path,
                 trigger_interval: float = 0.25, max_files_per_trigger: int = 50,
                 lateness: float = 10.0, feeds: FeedSource | None = None,
                 mask_keys: MaskKeys | None = None) -> None:
        self.spark = spark if spark is not None else SparkSession.builder.getOrCreate()
        self.work_dir = Path(work_dir)
        # the owners' hash-mask keys: the stream runtime's, so both hash alike
        self.mask_keys = mask_keys if mask_keys is not None else \
            MaskKeys(self.work_dir / "mask-keys")
        self.trigger_interval = trigger_interval
        self.max_files_per_trigger = max_files_per_trigger
        if not math.isfinite(lateness) or lateness < 0:
            raise ValueError("lateness must be a finite number of seconds, at least 0")
        self.lateness = lateness
        self.feeds = feeds
        self._lock = threading.RLock()
        self._queries: dict[str, _JoinQuery] = {}
        self._handle_keys: dict[str, str] = {}
        self._stoppers: list[threading.Thread] = []
        self._closed = False

    def attach(self, handle_id: str, streams: tuple[StreamDefinition, StreamDefinition],
               plan: JoinPlan, deliver: Deliver) -> None:
        if not isinstance(plan, JoinPlan):
            raise JoinPlanError("the join runtime runs JoinPlans only")
        key = plan.key()
        with self._lock:
            if self._closed:
                raise RuntimeError("the join runtime has been stopped")
            if handle_id in self._handle_keys:
                raise ValueError(f"handle {handle_id!r} is already attached")
            query = self._queries.get(key)
            carried: list[_Handle] = []
            if query is not None and not query.active:
                # its query failed: start a fresh one and move the surviving handles onto it
                carried = [h for h in query.handles.values() if h.active]
                del self._queries[key]
                self._retire(query)
                query = None
            if query is None:
                query = _JoinQuery(self, plan, tuple(streams))  # type: ignore[arg-type]
                for h in carried:
                    query.handles[h.id] = _Handle(h.id, h.deliver)
                query.handles[handle_id] = _Handle(handle_id, deliver)
                query.start()  # raises on a bad plan or source: nothing is registered
                self._queries[key] = query
            else:
                with query.lock:
                    query.handles[handle_id] = _Handle(handle_id, deliver)
            self._handle_keys[handle_id] = key

    def detach(self, handle_id: str) -> None:
        """Stop serving the handle (idempotent); the join's query stops with its last handle."""
        with self._lock:
            key = self._handle_keys.pop(handle_id, None)
            query = self._queries.get(key) if key is not None else None
        if query is None:
            return
        with query.lock:
            handle = query.handles.get(handle_id)
        if handle is not None:
            with handle.lock:  # waits for a delivery to it in progress
                handle.active = False
        with query.lock:
            query.handles.pop(handle_id, None)
            last = not query.handles
        if last:
            with self._lock:
                if self._queries.get(key) is query:  # type: ignore[arg-type]
                    del self._queries[key]  # type: ignore[arg-type]
            self._retire(query)

    def _retire(self, query: _JoinQuery) -> None:
        if query.in_batch_thread():
            t = threading.Thread(target=query.stop, name="xsg-join-stop", daemon=True)
            with self._lock:
                self._stoppers = [s for s in self._stoppers if s.is_alive()] + [t]
            t.start()
        else:
            query.stop()

    def _closed_by_deliver(self, handle_id: str) -> None:
        self.detach(handle_id)

    def handles(self) -> dict[str, str]:
        """handle id -> the key of the join it reads."""
        with self._lock:
            return dict(self._handle_keys)

    def stats(self) -> dict:
        """Per running join (by the first 16 hex digits of its key): handles, batches, rows,
        state rows and late rows (from Spark's progress), watermark, errors."""
        with self._lock:
            queries = dict(self._queries)
        return {key[:16]: q.stats() for key, q in queries.items()}

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            queries = list(self._queries.values())
            self._queries.clear()
            self._handle_keys.clear()
            stoppers = list(self._stoppers)
        for q in queries:
            q.stop()
        for t in stoppers:
            t.join(timeout=30)


__all__ = ["JoinRuntime", "JoinPlanError", "joined_frame", "side_frame", "filter_column"]
