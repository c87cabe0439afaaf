"""The panes job of a micro-batch, as a DataFrame over the batch: each tuple paired with the
window plans it passes, numbered into its pane (tuple windows: per plan and key in stream order,
offset by the tuples the driver counted in the open pane; time windows: the epoch-aligned pane of
its time under the plan's mask), then Spark's partial aggregates per (plan, key, pane)
(`pane_partials.Part`), which the router combines into windows (`windows/pane_windows.py`).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pyspark.sql import Column, DataFrame, Window, functions as F

from pep.runtime.base.columns import (
    FILE_COLUMN,
    KEYS_COLUMN,
    LNGS_COLUMN,
    NUMS_COLUMN,
    PLAN,
    PLANS_COLUMN,
    POS_COLUMN,
    SEQ_COLUMN,
    STRS_COLUMN,
    TIME_COLUMN,
)
from pep.runtime.plans.batch_shape import Shape, slot_names
from pep.runtime.plans.clamp import clamped
from pep.runtime.plans.plan_expressions import json_value, matched_plan_structs, shared_expressions
from pep.runtime.plans.plan_schema import TIME, TIME_LONG, TIME_TIMESTAMP, TUPLE, PlanField
from pep.runtime.privacy.masks import (
    hashed_text,
    is_hash,
    let,
    masked_column,
    masked_double,
    masked_long,
    masked_text,
)
from pep.runtime.query.batch_columns import base_columns, masked_order, order_columns, plan_order
from pep.runtime.query.settings import MAX_LONG, TIME_LIMIT, StreamLayout
from pep.runtime.windows.pane_partials import KEY_SEP, PARTS, TIME_PARTS, Part


class PanesJob:
    """The panes job's DataFrame, its stages built once per schema, shape and kind of window
    (`shared_expressions`)."""

    def __init__(self, layout: StreamLayout) -> None:
        self._layout = layout

    def redefine(self, layout: StreamLayout) -> None:
        """The stream's definition changed."""
        self._layout = layout

    def panes_frame(self, batch: DataFrame, plans_column: Column, shape: Shape,
                    counts: Callable[[Column], Column] | None = None) -> DataFrame:
        """Window plans: partial aggregates per (plan, key, pane) (with `shape.raw`: each
        tuple's values, every pane being one tuple). `counts(plan id)`: on a stream with
        security punctuations, whether the tuple counts in that plan's windows
        (`BatchShield.window_filter`); the plans a tuple passes keep only those."""
        base = base_columns(self._layout, shape, [], True)
        parts = []
        for kind, wanted in ((TUPLE, shape.tuple_windows), (TIME, shape.time_windows)):
            if not wanted:
                continue
            key = ("panes", self._layout.schema, shape, kind,
                   tuple(order_columns(self._layout, shape)))
            stages = shared_expressions(key, functools.partial(self._pane_stages, shape, kind))
            if counts is None:
                frame = batch.select(*base, plans_column.alias(PLANS_COLUMN))
            else:  # (a scalar subquery cannot be read inside a higher-order function)
                frame = batch.select("*", plans_column.alias(PLANS_COLUMN)).select(
                    *base, F.filter(F.col(PLANS_COLUMN), lambda p: counts(p[PlanField.ID]))
                    .alias(PLANS_COLUMN))
            frame = frame.select(*stages["explode"]).select(*stages["values"])
            if kind == TUPLE:
                frame = frame.select(*stages["number"]).select(*stages["pane"])
                if "aggregates" in stages:
                    frame = frame.groupBy(*stages["group"]).agg(*stages["aggregates"])
                else:
                    frame = frame.select(*stages["single"])
            else:
                frame = (frame.select(*stages["time"]).where(stages["timed"])
                         .groupBy(*stages["group"]).agg(*stages["aggregates"]))
            parts.append(frame)
        out = parts[0]
        for other in parts[1:]:
            out = out.unionByName(other, allowMissingColumns=True)
        return out

    def _pane_stages(self, shape: Shape, kind: int) -> dict[str, Any]:
        order = order_columns(self._layout, shape)
        p = F.col(PLAN)
        carried = [F.col(c) for c in order]
        explode = [F.explode(matched_plan_structs(kind, shape.spatial, shape.masked_filters,
                                                  shape.kafka_cut))
                   .alias(PLAN),
                   *carried, F.col(NUMS_COLUMN), F.col(STRS_COLUMN), F.col(LNGS_COLUMN)]
        if shape.keys and shape.masked:
            key = let(self._masked_keys(shape, p), lambda texts: F.concat_ws(KEY_SEP, F.transform(
                p[PlanField.KEYS], lambda i: F.coalesce(F.element_at(texts, i), F.lit("null")))))
        elif shape.keys:
            explode.append(F.col(KEYS_COLUMN))
            key = F.concat_ws(KEY_SEP, F.transform(
                p[PlanField.KEYS], lambda i: F.coalesce(F.element_at(F.col(KEYS_COLUMN), i),
                                              F.lit("null"))))
        else:
            key = F.lit("")
        timed = masked_order(self._layout, order)
        if shape.masked and timed is not None:  # the order as each plan sees it
            carried = plan_order(self._layout, order, p[PlanField.MASKS],
                                       F.element_at(F.col(NUMS_COLUMN), timed),
                                       F.element_at(F.col(LNGS_COLUMN), timed))
        values = [p[PlanField.ID].alias("pid"), key.alias("key"), *carried]
        slots = slot_names(shape)
        arrays = {"d": NUMS_COLUMN, "l": LNGS_COLUMN, "s": STRS_COLUMN}
        for name, fam in slots:
            index = F.element_at(p[fam], int(name[1:]) + 1)
            v = F.element_at(F.col(arrays[fam]), index)
            if shape.masked:  # the value under the plan's mask of the attribute
                m = F.element_at(p[PlanField.MASKS], index)
                if fam == "d":
                    v = masked_double(v, m)
                elif fam == "l":
                    v = masked_long(v, m)
                else:
                    v = masked_text(F.coalesce(v, F.element_at(
                        F.col(LNGS_COLUMN), index).cast("string")), m)
            elif fam == "d":
                v = F.nanvl(v, F.lit(None).cast("double"))
            if shape.clamped:  # private windows' values into their bounds, before any sum
                v = clamped(v, p, index, fam)
            values.append(v.alias(name))
        slot_cols = [F.col(n) for n, _ in slots]
        stages: dict[str, Any] = {"explode": explode}
        stages["group"] = [F.col("pid"), F.col("key"), F.col("pane")]
        if kind == TUPLE:
            values += [p[PlanField.PANE_WIDTH].alias("_g"), p[PlanField.PANE_OFFSET].alias("_off")]
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
                    for name, _, parts in shape.slots:
                        v = F.col(name)
                        for part in (Part.COUNT, Part.SUM, Part.MIN, Part.MAX, Part.FIRST,
                                     Part.LAST):
                            if part in parts:
                                col = v.isNotNull().cast("long") if part == Part.COUNT else v
                                single.append(col.alias(f"{name}_{part}"))
                stages["single"] = single
                return {**stages, "values": values}
            okey = F.col("_ok")
            tcol = None
        else:
            # The plan's time: its exact value (a timestamp's microseconds, a long) and as a
            # number, under the plan's mask of it (a masked time places the tuple in its panes,
            # orders its first and last and moves the plan's clock by the masked value: never
            # by what the mask hides); then, a stage later (`time`, each computed once), the
            # time in seconds and the pane.
            t = p[PlanField.TIME_INDEX]
            number = F.element_at(F.col(NUMS_COLUMN), t)
            exact = F.element_at(F.col(LNGS_COLUMN), t)
            if shape.masked:
                m = F.element_at(p[PlanField.MASKS], t)
                number, exact = masked_double(number, m), masked_long(exact, m)
            values += [number.alias("_tn"), exact.alias("_tx"),
                       p[PlanField.TIME_KIND].alias("_tk"), p[PlanField.PANE_WIDTH].alias("_g")]
            tk, exact = F.col("_tk"), F.col("_tx")
            seconds = (F.when(tk == TIME_TIMESTAMP, exact / F.lit(1_000_000.0))
                       .when(tk == TIME_LONG, exact.cast("double"))
                       .otherwise(F.col("_tn")))
            # a numeric time beyond 2^53 s (or NaN, infinite) is no time: such a tuple joins
            # no window and moves no clock (floor() of it would fail the batch, ANSI overflow)
            tnum = F.when(F.abs(seconds) <= F.lit(TIME_LIMIT), seconds)
            width = F.col("_g") * F.lit(1_000_000)
            pane = F.when(tk == TIME_TIMESTAMP,
                          ((exact - F.pmod(exact, width)) / width).cast("long")) \
                .otherwise(F.floor(tnum / F.col("_g")))
            stages["time"] = [F.col("pid"), F.col("key"), *[F.col(c) for c in order],
                              *slot_cols, tnum.alias("_t"), pane.alias("pane")]
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
            for part in PARTS:
                if part in parts and (tcol is not None or part not in TIME_PARTS):
                    made = _part_aggregate(part, F.col(name), fam, okey, tcol)
                    aggs.append(made.alias(f"{name}_{part}"))
        stages["aggregates"] = aggs
        return stages

    def _masked_keys(self, shape: Shape, p: Column) -> Column:
        """Per (row, plan): the JSON text of each group-by attribute under the plan's mask
        (null elsewhere), from the value arrays."""
        texts = []
        for f in self._layout.schema.fields:
            if f.name not in shape.keys:
                texts.append(F.lit(None).cast("string"))
                continue
            i = self._layout.index[f.name]
            lng = F.element_at(F.col(LNGS_COLUMN), i)
            raw = {"double": F.element_at(F.col(NUMS_COLUMN), i), "long": lng,
                   "timestamp": F.timestamp_micros(lng), "boolean": lng == F.lit(1),
                   "string": F.element_at(F.col(STRS_COLUMN), i)}[f.type]
            m = F.element_at(p[PlanField.MASKS], i)
            text = json_value(masked_column(raw, f.type, m), f.type)
            if f.type in ("long", "string"):
                text = F.when(is_hash(m), json_value(hashed_text(raw, f.type, m), "string")
                              ).otherwise(text)
            texts.append(text)
        return F.array(*texts)


__all__ = ["PanesJob"]


def _part_aggregate(part: Part, v: Column, fam: str, okey: Column,
                    tcol: Column | None) -> Column:
    """The aggregate of one part of a slot's pane partial (`pane_partials.Part`): `okey` orders
    first and last values, `tcol` is the plan's time (None: no time parts are asked for)."""
    present = v.isNotNull()
    made: dict[Part, Callable[[], Column]] = {
        Part.COUNT: lambda: F.count(v),
        Part.SUM: lambda: F.try_sum(v) if fam == "l" else F.sum(v),
        Part.MIN: lambda: F.min(v), Part.MAX: lambda: F.max(v),
        Part.OR: lambda: F.bit_or(v),
        Part.FIRST: lambda: F.min_by(v, F.when(present, okey)),
        Part.LAST: lambda: F.max_by(v, F.when(present, okey)),
        Part.FIRST_TIME: lambda: F.min(F.when(present, tcol)),
        Part.LAST_TIME: lambda: F.max(F.when(present, tcol)),
    }
    return made[part]()
