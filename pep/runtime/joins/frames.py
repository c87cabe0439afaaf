"""One join as a streaming DataFrame: each side's source, filter, masks, projection or window,
watermark, and the join of the two (the DataFrame API only: every constant a literal, never SQL
text). `joins/runtime.py` runs the frame as a query and delivers its rows; README "Joins" says why
the state stays bounded and why a policy's hidden tuples move no side's time.

Security labels (MLS): a windowed side's `lub` and its window's label bounds run in the side's
aggregation, in Spark (`_label_bounds` says why per-side bounds suffice for a joined row); when
the plan names the sides' labels (`JoinPlan.label`), each joined row also carries `label`, the
least upper bound of the two.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, functions as F

from pep.core import punctuations
from pep.core.conditions import COMPARATORS
from pep.core.join import JOINED_LABEL, label_lattice
from pep.core.labels import LabelError, Lattice
from pep.core.masks import Mask
from pep.core.plan import AnyPredicate, ExecutionPlan, JoinPlan, SpatialPredicate, StreamDefinition
from pep.runtime.base.columns import SEQ_COLUMN
from pep.runtime.joins.shield import shielded_side
from pep.runtime.plans.compile import PlanError, compile_predicate, plan_masks
from pep.runtime.plans.plan_expressions import kafka_admits, offsets_literal
from pep.runtime.plans.predicates import row_column
from pep.runtime.plans.spatial import edges, haversine, inside_polygon, valid_position
from pep.runtime.privacy.labels import dominated_by, label_code, label_text, lub_code, lub_of
from pep.runtime.privacy.masks import hashed_text, hmac_material, mask_literal, masked_column
from pep.runtime.sources.frames import DELETE_COMMITTED, build_source

TIME = "_t"  # a side's time column (a timestamp), internal


class JoinPlanError(ValueError):
    """A join plan this runtime cannot run; the message says which side and why."""


# -- one side, in the DataFrame API ---------------------------------------------------------------

def _compare(left: Column, op: str, right: Column) -> Column:
    try:
        compared: Column = COMPARATORS[op](left, right)
        return compared
    except KeyError:
        raise JoinPlanError(f"unknown operator {op!r}") from None


def _coordinate(definition: StreamDefinition, name: str) -> Column:
    field_ = definition.schema.lookup(name)
    if field_ is None or field_.type not in ("double", "long"):
        raise JoinPlanError(f"stream {definition.name!r}: {name!r} is not a numeric attribute")
    return F.col(f"`{field_.name}`").cast("double")


def _spatial_column(p: SpatialPredicate, definition: StreamDefinition) -> Column:
    """DISTANCE and WITHIN_POLYGON with the shared runtime's Column expressions
    (pep/runtime/plans/spatial.py), constants as literals; false without a valid position.
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
            # each attribute compared in its own family, exactly (pep/runtime/plans/compile.py)
            try:
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
class JoinOutput:
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
               source: DataFrame | None = None, reads: tuple[str, ...] = ()
               ) -> tuple[DataFrame, list[JoinOutput]]:
    """The side's authorised view as a streaming DataFrame: columns `<prefix><i>` (its outputs,
    in order) and `<prefix>_t` (its time), watermarked; plus how to name its outputs.

    `feed`: for an `ingest` stream, the directory that receives the stream's batches written
    since the join opened (`StreamCatalog.open_feed`); read instead of the ingest directory,
    whose files the stream's own query archives, and deleted once committed. `source`: a
    DataFrame of the source's shape (the schema's columns and `_xsg_seq`) read instead of the
    stream's source; a static one gives the same view as a batch (the tests' brute force runs
    the very expressions a join runs). On a stream with security punctuations, the side's
    tuples pass its shield first (`joins/shield.py`; `reads`: the attributes the join reads of
    the side, its keys, time and label: a tuple in which one is hidden joins nothing)."""
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
    if plan.start_offsets is not None:
        if definition.source.kind != "kafka":
            raise JoinPlanError(f"stream {definition.name!r}: start_offsets cut Kafka streams "
                                "only")
        df = df.filter(kafka_admits(offsets_literal(plan.start_offsets)))
    if punctuations.enabled(definition):
        if definition.source.kind != "ingest":  # refused when the handle is asked for, too
            raise JoinPlanError(f"stream {definition.name!r}: its security punctuations are in "
                                "its records, which a join's side does not read")
        try:
            df = shielded_side(df, definition, plan, reads)
        except ValueError as exc:
            raise JoinPlanError(str(exc)) from None
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
    outputs: list[JoinOutput] = []
    if w is None:
        if not plan.projection:
            raise JoinPlanError(f"stream {definition.name!r}: its side shows no attribute")
        time_field = definition.schema.lookup(time_output)
        if time_field is None or time_field.name not in plan.projection:
            raise JoinPlanError(f"stream {definition.name!r}: the join's time {time_output!r} "
                                "is not one of its side's outputs")
        cols = [_time_column(definition, time_field.name).alias(time_col)]
        for i, name in enumerate(plan.projection):
            if name == time_field.name and time_field.type == "timestamp":
                # the time column is this output already: not kept twice in the join's state
                outputs.append(JoinOutput(time_col, f"{definition.name}.{name}"))
                continue
            cols.append(F.col(f"`{name}`").alias(f"{prefix}{i}"))
            outputs.append(JoinOutput(f"{prefix}{i}", f"{definition.name}.{name}"))
        return df.select(*cols).withWatermark(time_col, _delay(lateness)), outputs
    if w.kind != "time":
        raise JoinPlanError(f"stream {definition.name!r}: a tuple-windowed side cannot be joined "
                            "(Spark cannot join after a count-based window)")
    if time_output != "window_end":
        raise JoinPlanError(f"stream {definition.name!r}: a windowed side's time is window_end")
    time_attribute = w.time_attribute or definition.time_attribute
    if not time_attribute:
        raise JoinPlanError(f"stream {definition.name!r}: a time window needs a time attribute")
    numeric_time = definition.schema.field(time_attribute).type != "timestamp"
    bounds = _label_bounds(definition, w.label_bounds)
    needed = list(dict.fromkeys([*w.keys, *(a.attribute for a in w.aggregates),
                                 *(a for a, _, _ in bounds)]))
    cols = [_time_column(definition, time_attribute).alias(time_col),
            F.col(SEQ_COLUMN).alias(seq_col)]
    cols += [F.col(f"`{n}`").alias(f"{prefix}a_{i}") for i, n in enumerate(needed)]
    inner = {n: f"{prefix}a_{i}" for i, n in enumerate(needed)}
    lattices = {n: lattice for n in needed
                if (lattice := _lattice(definition, n)) is not None}
    # a label's code beside its text: its lub and its count read the code (a text that is no
    # label of the lattice counts as absent, as in the shared runtime)
    codes = {n: f"{prefix}k_{i}" for i, n in enumerate(needed) if n in lattices}
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
    windows = grouped.agg(*aggs).filter(F.col(f"{prefix}_n") >= F.lit(int(w.min_count)))
    for j, (_, _, ceiling) in enumerate(bounds):
        lub = F.col(f"{prefix}b_{j}")  # a window without any label passes: nothing above
        windows = windows.filter(lub.isNull() | dominated_by(lub, ceiling))
    win = F.col(f"{prefix}_w")
    cols = [F.window_time(win).alias(time_col)]

    def bound(column: Column) -> Column:
        return (F.unix_micros(column) / F.lit(1_000_000.0)) if numeric_time else column

    names = ["window_start", "window_end", *w.keys, *(a.output_name for a in w.aggregates)]
    sources = [bound(win["start"]), bound(win["end"]), *[F.col(inner[k]) for k in w.keys],
               *[F.col(f"{prefix}g_{j}") for j in range(len(w.aggregates))]]
    for i, (name, column) in enumerate(zip(names, sources, strict=True)):
        cols.append(column.alias(f"{prefix}{i}"))
        outputs.append(JoinOutput(f"{prefix}{i}", f"{definition.name}.{name}"))
    return windows.select(*cols), outputs


def _lattice(definition: StreamDefinition, name: str) -> Lattice | None:
    field_ = definition.schema.lookup(name)
    return field_.lattice if field_ is not None and field_.type == "label" else None


def _label_bounds(definition: StreamDefinition, bounds: tuple[tuple[str, str], ...]
                  ) -> list[tuple[str, Lattice, int]]:
    """A window's label bounds as (attribute, its lattice, the bound's code).

    A side window is kept only when every bound dominates the least upper bound of its tuples'
    labels (`pep.runtime.windows.pane_windows` does the same for a stream read alone), in Spark,
    before the join. That suffices for a joined row: its label is the lub of its two sides' labels,
    and when the reader's session S dominates both A and B it dominates lub(A, B), since the lub is
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
            out.append((definition.schema.field(attribute).name,
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
                 ) -> tuple[DataFrame, list[JoinOutput]]:
    """The join of the two sides' authorised views, and how to name the result's columns
    (`sources`: see `side_frame`)."""
    if (left.name, right.name) != plan.streams:
        raise JoinPlanError(f"the join is of {plan.streams}, not of {(left.name, right.name)}")
    lframe, lout = side_frame(spark, left, plan.left, plan.left_time, "l", lateness, max_files,
                              feeds[0], mask_key, sources[0], _reads(plan, 0))
    rframe, rout = side_frame(spark, right, plan.right, plan.right_time, "r", lateness,
                              max_files, feeds[1], mask_key, sources[1], _reads(plan, 1))
    index = {("left", n): o.internal for n, o in zip(_names(plan.left), lout, strict=True)}
    index.update({("right", n): o.internal for n, o in zip(_names(plan.right), rout, strict=True)})
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
        outputs.append(JoinOutput(LABEL_COLUMN, JOINED_LABEL))
    return joined, outputs


LABEL_COLUMN = "_xsg_label"  # a joined row's label (JoinPlan.label)


def _joined_label(left: StreamDefinition, right: StreamDefinition, plan: JoinPlan,
                  index: dict[tuple[str, str], str]) -> Column:
    """The least upper bound of the two sides' labels, as text; a side without a label (null, or
    a text no label of the lattice) adds nothing to it, neither does none (null)."""
    assert plan.label is not None
    lattice = label_lattice(plan.left, left.schema, plan.label[0])
    other = label_lattice(plan.right, right.schema, plan.label[1])
    if lattice is None or other is None \
            or (lattice.levels, lattice.categories) != (other.levels, other.categories):
        raise JoinPlanError(f"the join's label reads {plan.label[0]!r} and {plan.label[1]!r}, "
                            "which are not labels over one lattice")
    codes = [label_code(F.col(index[(side, name)]), lattice)
             for side, name in zip(("left", "right"), plan.label, strict=True)]
    return label_text(lub_of(*codes), lattice)


def _reads(plan: JoinPlan, side: int) -> tuple[str, ...]:
    """What the join reads of a side's outputs (its keys, its time, its label): a side's
    punctuations must show all of them for its tuple to join (`joins/shield.py`)."""
    names = [pair[side] for pair in plan.on]
    names.append((plan.left_time, plan.right_time)[side])
    if plan.label is not None:
        names.append(plan.label[side])
    return tuple(dict.fromkeys(names))


def _windowed(plan: ExecutionPlan) -> int:
    return 1 if plan.window is not None else 0


def _names(plan: ExecutionPlan) -> list[str]:
    w = plan.window
    if w is None:
        return list(plan.projection)
    return ["window_start", "window_end", *w.keys, *(a.output_name for a in w.aggregates)]


__all__ = ["JoinPlanError", "JoinOutput", "TIME", "joined_frame", "side_frame", "filter_column"]
