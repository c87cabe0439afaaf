"""Spatial predicates in the shared Spark job, as data: distance, polygon, distance to an anchor.

The executor's generic predicate (`plan_expressions._predicate_holds`) reads a predicate struct and
computes an outcome (1 less, 2 equal, 4 greater) that the operator mask accepts or not. This
module adds the spatial kinds to that struct and to that outcome, with Column expressions only:
no SQL text, no Python UDF, and no constant ever becomes code. Attaching a plan with a spatial
predicate therefore changes the plan table's contents, never the physical plan.

Struct fields beside (a, m, k, n, s, i): `b` the longitude's index, `p` a point (lat, lon), `e` a
polygon's edges (each (y1, x1, y2, x2) from vertex i to vertex i - 1, precomputed on the driver
so the job needs no index arithmetic), `z` an anchor's position segments (see below).

- DISTANCE (kind 2): haversine in metres, the sequence of operations of `pep.core.geo.haversine`
  (F.radians, F.sin, F.cos, F.sqrt, F.asin), compared with `n`.
- WITHIN_POLYGON (kind 3): `pep.core.geo.in_polygon`'s even-odd test without division (the
  session runs with ANSI arithmetic): on an edge (exists) or an odd number of crossings (the
  size of a filter), over the edge array. Outcome 2 inside, 1 outside.
- DISTANCE_TO (kind 4), a moving anchor. Per micro-batch, only when some attached plan uses one:
  1. one small extra Spark job selects the anchors' own tuples: the batch joined, as data, with
     a one-row table of the anchors the plans name (key attribute index and constant, lat/lon
     indices; a LocalRelation read as a scalar subquery), returning (anchor id, `_xsg_seq`, lat,
     lon) for the few matching tuples;
  2. on the driver, `AnchorTracker` merges them, in `_xsg_seq` order, with the position carried
     in from earlier batches into segments (from_seq, to_seq, lat, lon): the anchor's latest
     position reported strictly before any tuple with from_seq < seq <= to_seq;
  3. the segments go into the plan table (rebuilt only when they changed), and the main job
     evaluates `exists`-style: the one segment that covers the tuple's `_xsg_seq`, then the
     haversine distance to it.
  No segment covers the tuple (no known position, a tuple without `_xsg_seq`, a report without
  a valid position): the outcome is null and the predicate false, whatever its operator.
  The carried positions live in this process only: after the stream's query restarts (gateway
  restart, the last handle left, a failed batch) or when a plan first names an anchor, the
  anchor is unknown until it reports again (deny when in doubt). Streams whose tuples carry no
  `_xsg_seq` (files, socket sources) never know an anchor.
"""
from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, functions as F

from pep.core.geo import EARTH_DIAMETER_M
from pep.runtime.base.columns import SEQ_COLUMN
from pep.runtime.plans.compile import (
    ANCHOR_KIND,
    DISTANCE_KIND,
    INTEGER_KIND,
    LABEL_KIND,
    NUMERIC_KIND,
    POLYGON_KIND,
    AnchorSpec,
    CompiledPlan,
    PredicateRow,
    base_kind,
)

log = logging.getLogger(__name__)

MAX_SEQ = (1 << 63) - 1
ANCHOR_COLUMN = "_xsg_anchors"

_EDGE = pa.struct([("y1", pa.float64()), ("x1", pa.float64()), ("y2", pa.float64()),
                   ("x2", pa.float64())])
_SEGMENT = pa.struct([("f", pa.int64()), ("t", pa.int64()), ("la", pa.float64()),
                      ("lo", pa.float64())])
# The spatial fields of a predicate struct (appended to the executor's (a, m, k, n, s)).
PREDICATE_FIELDS: list[tuple[str, pa.DataType]] = [
    ("b", pa.int32()), ("p", pa.list_(pa.float64())), ("e", pa.list_(_EDGE)),
    ("z", pa.list_(_SEGMENT))]
_ANCHOR_TABLE = pa.schema([("anchors", pa.list_(pa.struct([
    pa.field("id", pa.int32(), False), ("a", pa.int32()), ("k", pa.int32()), ("n", pa.float64()),
    ("s", pa.string()), ("i", pa.int64()), ("la", pa.int32()), ("lo", pa.int32())])))])

Segment = tuple[int, int, float | None, float | None]  # (from_seq, to_seq, lat, lon)


# ---------------------------------------------------------------------------------------------
# Predicate structs (driver side, when the plan table is built)
# ---------------------------------------------------------------------------------------------

def edges(points: tuple[float, ...]) -> list[dict[str, float]]:
    """A polygon's edges as `pep.core.geo.in_polygon` walks them: edge i from vertex i to i - 1."""
    n = len(points) // 2
    out = []
    for i in range(n):
        j = (i + n - 1) % n
        out.append({"y1": points[2 * i], "x1": points[2 * i + 1],
                    "y2": points[2 * j], "x2": points[2 * j + 1]})
    return out


def predicate_struct(row: PredicateRow, segments: Callable[[AnchorSpec], list[Segment]]
                     ) -> dict[str, Any]:
    """One predicate row as the plan table's struct (spatial fields null for comparisons)."""
    a, m, k, n, s = row[:5]
    integer = base_kind(k) in (INTEGER_KIND, LABEL_KIND)  # exact: 64-bit integers (masked too)
    out: dict[str, Any] = {"a": a, "m": m, "k": k, "n": None if integer else n, "s": s,
                           "i": n if integer else None,
                           "b": None, "p": None, "e": None, "z": None}
    if len(row) > 5:
        geometry = row[6]
        out["b"] = row[5]
        if k == DISTANCE_KIND:
            out["p"] = list(geometry)
        elif k == POLYGON_KIND:
            out["e"] = edges(geometry)
        elif k == ANCHOR_KIND:
            out["z"] = [{"f": f, "t": t, "la": la, "lo": lo}
                        for f, t, la, lo in segments(geometry)]
    return out


# ---------------------------------------------------------------------------------------------
# Column expressions (built once per JVM with the executor's predicate)
# ---------------------------------------------------------------------------------------------

def let(value: Column, body: Callable[[Column], Column]) -> Column:
    """`body(value)` with `value` computed once: Column expressions are trees, and an
    expression used twice is evaluated (and code-generated) twice; a one-element transform
    binds it to a lambda variable instead."""
    return F.element_at(F.transform(F.array(value), body), 1)


def haversine(lat1: Column, lon1: Column, lat2: Column, lon2: Column) -> Column:
    """`pep.core.geo.haversine`, operation for operation (null in, null out)."""
    p1 = F.radians(lat1)
    p2 = F.radians(lat2)
    dp = F.radians(lat2 - lat1)
    dl = F.radians(lon2 - lon1)
    first = let(F.sin(dp / F.lit(2.0)), lambda s1: s1 * s1)
    second = let(F.sin(dl / F.lit(2.0)), lambda s2: F.cos(p1) * F.cos(p2) * s2 * s2)
    # min(1, root) as Python's min: F.least would skip a null root and give asin(1)
    return let(F.sqrt(first + second), lambda root: F.lit(EARTH_DIAMETER_M) * F.asin(
        F.when(root > F.lit(1.0), F.lit(1.0)).otherwise(root)))


def valid_position(lat: Column, lon: Column) -> Column:
    """`pep.core.geo.valid_position`: non-null, not NaN, within the ranges (null counts false)."""
    return F.coalesce(~F.isnan(lat) & ~F.isnan(lon) & (lat >= F.lit(-90.0))
                      & (lat <= F.lit(90.0)) & (lon >= F.lit(-180.0)) & (lon <= F.lit(180.0)),
                      F.lit(False))


def _cross(y: Column, x: Column, e: Column) -> Column:
    return (x - e["x1"]) * (e["y2"] - e["y1"]) - (y - e["y1"]) * (e["x2"] - e["x1"])


def inside_polygon(y: Column, x: Column, edge_array: Column) -> Column:
    """`pep.core.geo.in_polygon` over an edge array: boundary included, even-odd otherwise."""
    def on_edge(e: Column) -> Column:
        return ((_cross(y, x, e) == F.lit(0.0))
                & (x >= F.least(e["x1"], e["x2"])) & (x <= F.greatest(e["x1"], e["x2"]))
                & (y >= F.least(e["y1"], e["y2"])) & (y <= F.greatest(e["y1"], e["y2"])))

    def crosses(e: Column) -> Column:
        dy = e["y2"] - e["y1"]
        return (((e["y1"] > y) != (e["y2"] > y))
                & let(_cross(y, x, e), lambda c: ((dy > F.lit(0.0)) & (c < F.lit(0.0)))
                      | ((dy < F.lit(0.0)) & (c > F.lit(0.0)))))

    return F.exists(edge_array, on_edge) | (F.size(F.filter(edge_array, crosses)) % 2 == 1)


def spatial_outcome(p: Column, nums: Column, outcome: Callable[[Column, Column], Column]
                    ) -> Column:
    """The outcome of a spatial predicate struct `p` on the row (null: no valid position, or no
    known anchor position); `outcome` is the executor's less/equal/greater comparison."""
    def spatial(position: Column) -> Column:
        lat, lon = position[0], position[1]

        def compare(distance: Column) -> Column:
            return let(distance, lambda d: outcome(d, p["n"]))

        seq = F.col(SEQ_COLUMN)
        segment = F.try_element_at(
            F.filter(p["z"], lambda z: (seq > z["f"]) & (seq <= z["t"])), F.lit(1))
        return (F.when(~valid_position(lat, lon), F.lit(None).cast("int"))
                .when(p["k"] == DISTANCE_KIND, compare(haversine(
                    lat, lon, F.element_at(p["p"], 1), F.element_at(p["p"], 2))))
                .when(p["k"] == POLYGON_KIND,
                      F.when(inside_polygon(lat, lon, p["e"]), F.lit(2)).otherwise(F.lit(1)))
                .when(p["k"] == ANCHOR_KIND, let(segment, lambda z: compare(haversine(
                    lat, lon, z["la"], z["lo"])))))

    return let(F.array(F.element_at(nums, p["a"]), F.element_at(nums, p["b"])), spatial)


# ---------------------------------------------------------------------------------------------
# Moving anchors (DISTANCE_TO): the anchors' own tuples, per micro-batch
# ---------------------------------------------------------------------------------------------

class AnchorTracker:
    """The positions of the anchors the attached plans name, carried across micro-batches.

    `update` runs once per micro-batch before the plan table is read: it costs nothing when no
    attached plan uses DISTANCE_TO; otherwise one small Spark job brings the anchors' own tuples
    (a handful) to the driver. `segments(spec)` then says where the anchor was before any tuple
    of the batch; `version` changes whenever some segment did, so the executor rebuilds its plan
    table then and only then."""

    def __init__(self, spark: SparkSession,
                 value_arrays: Callable[..., tuple[Column, Column, Column]], schema: Any) -> None:
        self.spark = spark
        self._value_arrays = value_arrays
        self._schema = schema
        self._names = list(schema.names)
        self._lock = threading.Lock()
        self._last: dict[AnchorSpec, tuple[int, float | None, float | None]] = {}
        self._segments: dict[AnchorSpec, list[Segment]] = {}
        self._table: tuple[tuple[AnchorSpec, ...], Column] | None = None
        self.version = 0
        self.rows = 0  # anchor tuples brought to the driver, in all

    def with_schema(self, schema: Any) -> AnchorTracker:
        """The same anchors' positions over a schema that added attributes after this one's (a
        stream's query restarted for its new attributes: attribute indices stay valid)."""
        other = AnchorTracker(self.spark, self._value_arrays, schema)
        with self._lock:
            other._last, other._segments = dict(self._last), dict(self._segments)
            other.version, other.rows = self.version + 1, self.rows
        return other

    def segments(self, spec: AnchorSpec) -> list[Segment]:
        with self._lock:
            return list(self._segments.get(spec, ()))

    def update(self, batch: DataFrame, plans: Iterable[CompiledPlan]) -> None:
        specs = tuple(dict.fromkeys(spec for plan in plans for spec in plan.anchors))
        if not specs:
            if self._segments or self._last:
                with self._lock:
                    self._segments, self._last = {}, {}
                    self.version += 1
            return
        reports = self._collect(batch, specs)
        self.rows += sum(len(r) for r in reports.values())
        segments: dict[AnchorSpec, list[Segment]] = {}
        last: dict[AnchorSpec, tuple[int, float | None, float | None]] = {}
        for spec in specs:  # anchors no plan names any more are forgotten (they went unwatched)
            prev = self._last.get(spec)
            out: list[Segment] = []
            for seq, lat, lon in sorted(reports.get(spec, ())):
                if prev is not None:
                    out.append((prev[0], seq, prev[1], prev[2]))
                prev = (seq, lat, lon) if _valid(lat, lon) else (seq, None, None)
            if prev is not None:
                out.append((prev[0], MAX_SEQ, prev[1], prev[2]))
                last[spec] = prev
            segments[spec] = out
        with self._lock:
            if segments != self._segments:
                self.version += 1
            self._segments, self._last = segments, last

    def _collect(self, batch: DataFrame, specs: tuple[AnchorSpec, ...]
                 ) -> dict[AnchorSpec, list[tuple[int, float | None, float | None]]]:
        scalar = self._spec_table(specs)
        needed = frozenset(self._names[i - 1] for s in specs
                           for i in (s.key_index, s.lat_index, s.lon_index))
        # numbers, texts, and exact values for long, timestamp and boolean keys
        nums, strs, lngs = self._value_arrays(self._schema, needed)

        def is_anchor(s: Column) -> Column:
            number = F.element_at(F.col("_n"), s["a"])
            text = F.element_at(F.col("_s"), s["a"])
            integer = F.element_at(F.col("_l"), s["a"])
            return F.coalesce(F.when(s["k"] == NUMERIC_KIND, number == s["n"])
                              .when(s["k"] == INTEGER_KIND, integer == s["i"])
                              .otherwise(text == s["s"]), F.lit(False))

        frame = (batch.select(F.col(SEQ_COLUMN), nums.alias("_n"), strs.alias("_s"),
                              lngs.alias("_l"), scalar.alias(ANCHOR_COLUMN))
                 .where(F.col(SEQ_COLUMN).isNotNull())
                 .select(F.col(SEQ_COLUMN), F.col("_n"),
                         F.explode(F.filter(F.col(ANCHOR_COLUMN), is_anchor)).alias("x"))
                 .select(F.col("x")["id"].alias("id"), F.col(SEQ_COLUMN).alias("seq"),
                         F.element_at(F.col("_n"), F.col("x")["la"]).alias("lat"),
                         F.element_at(F.col("_n"), F.col("x")["lo"]).alias("lon")))
        table = frame.toArrow()
        out: dict[AnchorSpec, list[tuple[int, float | None, float | None]]] = {}
        for spec_id, seq, lat, lon in zip(*(table.column(c).to_pylist()
                                            for c in ("id", "seq", "lat", "lon")), strict=True):
            out.setdefault(specs[spec_id], []).append((seq, lat, lon))
        return out

    def _spec_table(self, specs: tuple[AnchorSpec, ...]) -> Column:
        cached = self._table
        if cached is not None and cached[0] == specs:
            return cached[1]
        rows = [{"id": i, "a": s.key_index, "k": s.key_kind,
                 "n": None if s.key_kind == INTEGER_KIND else s.key_number,
                 "i": s.key_number if s.key_kind == INTEGER_KIND else None,
                 "s": s.key_text, "la": s.lat_index, "lo": s.lon_index}
                for i, s in enumerate(specs)]
        frame = self.spark.createDataFrame(pa.Table.from_pylist([{"anchors": rows}],
                                                                schema=_ANCHOR_TABLE))
        scalar = frame.scalar()
        self._table = (specs, scalar)
        return scalar


def _valid(lat: float | None, lon: float | None) -> bool:
    return (lat is not None and lon is not None and not math.isnan(lat) and not math.isnan(lon)
            and -90.0 <= lat <= 90.0 and -180.0 <= lon <= 180.0)


__all__ = ["AnchorTracker", "PREDICATE_FIELDS", "predicate_struct", "spatial_outcome",
           "haversine", "inside_polygon", "edges", "MAX_SEQ"]
