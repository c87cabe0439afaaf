"""The Spark jobs of a micro-batch, as DataFrames over the batch: the rows job (`rows_frame`; with
many plans `values_frame` and `admitted_frame`, the grouped matcher on the workers) and the panes
job (`panes_frame`: partial aggregates per plan, key and pane, `pane_partials.Part`).
"""
from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pep.runtime.masks import (hashed_text, is_hash, let, masked_column, masked_double,
                               masked_long, masked_seconds, masked_text)
from pep.runtime import matcher as matcher_module
from pep.runtime.matcher import GroupedMatcher, admitted_rows, value_column
from pep.runtime.privacy import clamped
from pep.runtime.pane_partials import KEY_SEP, PARTS, TIME_PARTS, Part
from pep.runtime.columns import (BITS_COLUMN, EMIT, FILE_COLUMN, HASHED_PREFIX, KEYS_COLUMN,
                                KOFF_COLUMN, KPART_COLUMN, LNGS_COLUMN, NUMS_COLUMN,
                                PIDS_COLUMN, PLAN, PLANS_COLUMN, POS_COLUMN, READ_COLUMN,
                                SEQ_COLUMN, STRS_COLUMN, TIME_COLUMN, TOP_COLUMN, ORDER_NUMBER,
                                ORDER_EXACT)
from pep.runtime.plan_schema import ROW_KINDS, TIME, TIME_LONG, TIME_TIMESTAMP, TUPLE, PlanField
from pep.runtime.plan_expressions import (json_value, kafka_position, key_array,
                                          masked_emissions, matched_plan_structs,
                                          matched_plans_column, shared_expressions,
                                          value_arrays, value_elements)
from pep.runtime.executor_state import MAX_LONG, TIME_LIMIT, UNIQUE_SEQ_KINDS
from pep.runtime.batch_shape import Shape, slot_names
from pep.runtime.plan_table import PlanTable


# the grouped matcher runs on the workers (the rows job's mapInArrow): its code travels with it,
# so a worker runs the driver's matcher, xsg installed there or not
_pickle_by_value: Callable[[ModuleType], None] = cloudpickle.register_pickle_by_value
_pickle_by_value(matcher_module)


def split_figures(table: pa.Table) -> tuple[pa.Table, dict[str, Any]]:
    """The grouped matcher's output (`admitted_frame`) as its admitted rows (without the two
    figure columns) and the batch's figures: {"rows": tuples read, "seq": their highest
    position or None}, summed over the tasks' figures rows."""
    read = table.column(READ_COLUMN)
    figures_rows = pc.is_valid(read)
    counts = pc.filter(read, figures_rows)
    figures = {"rows": int(pc.sum(counts).as_py() or 0),
               "seq": pc.max(pc.filter(table.column(TOP_COLUMN), figures_rows)).as_py()}
    rows = table.filter(pc.invert(figures_rows)) if len(counts) else table
    return rows.drop_columns([READ_COLUMN, TOP_COLUMN]), figures


class BatchFrames(PlanTable):
    """The batch's jobs as DataFrames (built once per schema and shape, then reused)."""

    def _order_columns(self, shape: Shape) -> list[str]:
        if shape.full_order:
            return [SEQ_COLUMN, TIME_COLUMN, FILE_COLUMN, POS_COLUMN]
        if self.definition.source.kind in UNIQUE_SEQ_KINDS:
            # the position alone orders them; no row id: monotonically_increasing_id is
            # nondeterministic and keeps Spark from pruning the scan's file metadata
            return [SEQ_COLUMN]
        return [SEQ_COLUMN, POS_COLUMN]

    def _order_expressions(self, shape: Shape) -> list[Column]:
        """The order columns (`_order_columns`) as expressions over the batch."""
        cols = [F.col(SEQ_COLUMN)]
        if POS_COLUMN in self._order_columns(shape):
            cols.append(F.monotonically_increasing_id().alias(POS_COLUMN))
        if shape.full_order:
            if self._time_attr:
                cols.append(self._time_number(self._time_attr).alias(TIME_COLUMN))
            else:
                cols.append(F.lit(None).cast("double").alias(TIME_COLUMN))
            cols.append(F.col(FILE_COLUMN))
        return cols

    def _base_columns(self, shape: Shape, columns: list[str], windows: bool) -> list[Column]:
        """The batch's columns every job starts from (built once per schema and shape)."""
        def build() -> list[Column]:
            cols = [F.col(f"`{n}`") for n in columns]
            cols += self._order_expressions(shape)
            nums, strs, lngs = value_arrays(self._schema, shape.read)
            cols += [nums.alias(NUMS_COLUMN), strs.alias(STRS_COLUMN)]
            # exact values of long, timestamp and boolean attributes: what their comparisons
            # read (a constant array of nulls, folded away, when no such attribute is read)
            cols.append(lngs.alias(LNGS_COLUMN))
            if windows:
                if shape.keys:
                    cols.append(key_array(self._schema, shape.keys).alias(KEYS_COLUMN))
            if shape.kafka_cut:  # the records' positions, which the plans' cuts compare
                partition, offset = kafka_position()
                cols += [partition.alias(KPART_COLUMN), offset.alias(KOFF_COLUMN)]
            return cols
        return shared_expressions(("base", self._schema, tuple(columns), windows, shape.keys,
                                    tuple(self._order_columns(shape)), self._time_attr,
                                    shape.read, shape.kafka_cut), build)

    def _time_number(self, attr: str) -> Column:
        c = F.col(f"`{attr}`")
        if self._types[attr] == "timestamp":
            return F.unix_micros(c) / F.lit(1_000_000.0)
        return c.cast("double")

    def _observed(self, shape: Shape) -> list[Column]:
        """The stream's own figures. No event time: each time-window plan's clock comes from its
        own tuples, in the panes job (`mt`), never from the stream's."""
        return shared_expressions(("observed",), lambda: [
            F.count(F.lit(1)).alias("rows"), F.max(F.col(SEQ_COLUMN)).alias("seq")])

    def rows_frame(self, batch: DataFrame, plans_column: Column | None, shape: Shape,
                   few: Column | None = None) -> DataFrame:
        """Plain plans: each passing tuple once, its projected attributes and plan ids (from
        `few`, a `few_plans_column`, when given; else from the plan table, `plans_column`)."""
        columns = list(shape.plain_columns)
        order = self._order_columns(shape)
        if few is not None:
            # One select: `few` reads each attribute's own expression, no value arrays. Its
            # Columns are the same for every batch while the matcher stays (building them is
            # py4j calls, and each DataFrame step is analysed again per batch).
            memo = self._few_columns
            if memo is None or memo[0] is not few or memo[1] != (self._schema, tuple(columns),
                                                                 tuple(order)):
                keep = ([F.col(f"`{n}`") for n in columns] + self._order_expressions(shape)
                        + [few.alias(PIDS_COLUMN)])
                memo = (few, (self._schema, tuple(columns), tuple(order)), keep,
                        F.size(F.col(PIDS_COLUMN)) > 0)
                self._few_columns = memo
            return self._steps.where(self._steps.select(batch, memo[2]), memo[3])
        base = self._base_columns(shape, columns, False)
        if plans_column is None:
            raise ValueError("rows job without a plan table or a compiled matcher")
        if shape.masked:
            emit, out = shared_expressions(
                ("rows-masked", self._schema, tuple(columns), tuple(order), shape.spatial,
                 shape.masked_filters, shape.hashed, shape.kafka_cut),
                lambda: self._masked_rows(columns, order, shape))
            return (batch.select(*base, plans_column.alias(PLANS_COLUMN))
                    .select(*emit).select(*out))

        def build() -> tuple[list[Column], Column]:
            keep = [F.col(f"`{n}`") for n in columns] + [F.col(c) for c in order]
            return keep + [matched_plans_column(ROW_KINDS, shape.spatial,
                                                kafka=shape.kafka_cut)
                           .alias(PIDS_COLUMN)], F.size(F.col(PIDS_COLUMN)) > 0
        keep, nonempty = shared_expressions(("rows", self._schema, tuple(columns),
                                              tuple(order), shape.spatial, shape.kafka_cut),
                                             build)
        return (batch.select(*base, plans_column.alias(PLANS_COLUMN))
                .select(*keep).where(nonempty))

    def values_frame(self, batch: DataFrame, shape: Shape, grouped: GroupedMatcher
                     ) -> DataFrame:
        """Plain plans matched by a `GroupedMatcher`: every tuple once, its projected
        attributes and the values the plans' comparisons read (compiled, no plan table); what
        `admitted_frame` hands to the matcher on the workers."""
        columns = list(shape.plain_columns)
        order = self._order_columns(shape)

        # One select straight from the batch: each value the matcher reads is its attribute's
        # own element expression (what `value_arrays` would put at that index), so no value
        # arrays are built and the batch's DataFrame is analysed once here, not twice (each
        # DataFrame step is a py4j call and an analysis per batch: ~6 ms, 25 ms at p95 here).
        def build() -> list[Column]:
            elements = dict(zip("dsl", value_elements(self._schema, shape.read)))
            return ([F.col(f"`{n}`") for n in columns] + self._order_expressions(shape)
                    + [elements[fam][a - 1].alias(value_column(a, fam))
                       for a, fam in grouped.columns])
        keep = shared_expressions(("grouped-values", self._schema, tuple(columns), tuple(order),
                                    self._time_attr, shape.read, grouped.columns), build)
        return self._steps.select(batch, keep)

    def admitted_arrow(self, batch: DataFrame, shape: Shape, grouped: GroupedMatcher
                       ) -> tuple[pa.Table, dict[str, Any]]:
        """`admitted_frame`'s rows, collected (its schema is known: see `JvmSteps.to_arrow`),
        and the batch's figures its tasks counted (`split_figures`)."""
        frame, schema = self._admitted(batch, shape, grouped)
        return split_figures(self._steps.to_arrow(frame, schema))

    def admitted_frame(self, batch: DataFrame, shape: Shape, grouped: GroupedMatcher
                       ) -> DataFrame:
        """Plain plans matched by a `GroupedMatcher` on the workers: `values_frame` through
        `DataFrame.mapInArrow` (`matcher.admitted_rows`, per Arrow record batch), so only the
        tuples some plan admits leave them, with the columns `rows_frame` gives (the projected
        attributes, the order columns) and instead of the plans' ids a bitmap of them
        (`BITS_COLUMN`, `GroupedMatcher.pairs`); the values only the filters read stay there.
        Each task adds a row of figures (`READ_COLUMN`, `TOP_COLUMN`: `split_figures`)."""
        return self._admitted(batch, shape, grouped)[0]

    def _admitted(self, batch: DataFrame, shape: Shape, grouped: GroupedMatcher
                  ) -> tuple[DataFrame, T.StructType]:
        values = self.values_frame(batch, shape, grouped)
        keep = list(shape.plain_columns) + self._order_columns(shape)
        key = (self._schema, tuple(keep), grouped.columns)
        known = self._admitted_schemas.get(key)
        if known is None:  # the same for every batch of a schema: asked of Spark once
            fields = values.schema.fields
            types = {f.name: f for f in fields}
            # nullable: a task's figures row has no tuple's values
            schema = T.StructType([T.StructField(n, types[n].dataType) for n in keep]
                                  + [T.StructField(BITS_COLUMN, T.BinaryType()),
                                     T.StructField(READ_COLUMN, T.LongType()),
                                     T.StructField(TOP_COLUMN, T.LongType())])
            known = self._admitted_schemas[key] = (schema, [f.name for f in fields])
        schema, names = known
        # the UDF (the matcher pickled) is built once per matcher, not per batch
        return self._steps.map_in_arrow(
            values, ("admitted", key), grouped,
            lambda: admitted_rows(grouped, SEQ_COLUMN, keep, BITS_COLUMN,
                                  (READ_COLUMN, TOP_COLUMN)), schema, names), schema

    def _masked_rows(self, columns: list[str], order: list[str], shape: Shape
                     ) -> tuple[list[Column], list[Column]]:
        """The rows job when some plan masks: a row per emission (`masked_emissions`), its
        values under the emission's masks, right after the filter (pep/runtime/masks.py), and
        its order under them too (`_plan_order`: a masked time orders a plan's rows by the
        masked value, never the raw one)."""
        emit = [F.explode(masked_emissions(ROW_KINDS, shape.spatial, shape.masked_filters,
                                           shape.kafka_cut))
                .alias(EMIT),
                *[F.col(f"`{n}`") for n in columns], *[F.col(c) for c in order]]
        timed = self._masked_order(order)
        if timed is not None:  # the ordering time's values, which each emission's masks read
            emit += [F.element_at(F.col(NUMS_COLUMN), timed).alias(ORDER_NUMBER),
                     F.element_at(F.col(LNGS_COLUMN), timed).alias(ORDER_EXACT)]
        e = F.col(EMIT)
        out = []
        for n in columns:
            m = F.element_at(e[PlanField.MASKS], self._index[n])
            out.append(masked_column(F.col(f"`{n}`"), self._types[n], m).alias(n))
        for n in shape.hashed:
            m = F.element_at(e[PlanField.MASKS], self._index[n])
            out.append(hashed_text(F.col(f"`{n}`"), self._types[n], m)
                       .alias(HASHED_PREFIX + n))
        out += self._plan_order(order, e[PlanField.MASKS], F.col(ORDER_NUMBER),
                                F.col(ORDER_EXACT))
        out.append(e["i"].alias(PIDS_COLUMN))
        return emit, out

    def _masked_order(self, order: list[str]) -> int | None:
        """The index of the attribute whose time orders the tuples (the stream's time
        attribute, on sources without a stream position: `_order_columns`), when plans' masks
        may apply to it; None when the order reads no time."""
        if TIME_COLUMN not in order or not self._time_attr:
            return None
        return self._index[self._time_attr]

    def _plan_order(self, order: list[str], masks: Column, number: Column, exact: Column
                    ) -> list[Column]:
        """The order columns as one plan sees them (`masks`: its mask structs, null when it
        masks nothing): the ordering time under the plan's mask of it (`masks.masked_seconds`
        from the attribute's `number` and `exact` values), so tuples alike once masked are
        ordered by what follows (file, position: stream order), never by the hidden part of
        their time. Unmasked plans keep the raw time column as it is."""
        timed, attr = self._masked_order(order), self._time_attr
        out = []
        for c in order:
            if c != TIME_COLUMN or timed is None or attr is None:
                out.append(F.col(c))
                continue
            m = F.element_at(masks, timed)
            seconds = masked_seconds(number, exact, self._types[attr], m)
            out.append(F.when(m.isNull(), F.col(TIME_COLUMN)).otherwise(seconds)
                       .alias(TIME_COLUMN))
        return out

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
            m = F.element_at(p[PlanField.MASKS], i)
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
            stages = shared_expressions(("panes", self._schema, shape, kind,
                                          tuple(self._order_columns(shape))),
                                        functools.partial(self._pane_stages, shape, kind))
            frame = batch.select(*base, plans_column.alias(PLANS_COLUMN))
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
        order = self._order_columns(shape)
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
        timed = self._masked_order(order)
        if shape.masked and timed is not None:  # the order as each plan sees it
            carried = self._plan_order(order, p[PlanField.MASKS],
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
                    for (name, fam, parts) in shape.slots:
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
            v = F.col(name)
            present = v.isNotNull()
            made = {
                Part.COUNT: lambda: F.count(v),
                Part.SUM: lambda: F.try_sum(v) if fam == "l" else F.sum(v),
                Part.MIN: lambda: F.min(v), Part.MAX: lambda: F.max(v),
                Part.OR: lambda: F.bit_or(v),
                Part.FIRST: lambda: F.min_by(v, F.when(present, okey)),
                Part.LAST: lambda: F.max_by(v, F.when(present, okey)),
                Part.FIRST_TIME: lambda: F.min(F.when(present, tcol)),
                Part.LAST_TIME: lambda: F.max(F.when(present, tcol)),
            }
            for part in PARTS:
                if part in parts and (tcol is not None or part not in TIME_PARTS):
                    aggs.append(made[part]().alias(f"{name}_{part}"))
        stages["aggregates"] = aggs
        return stages


__all__ = ["BatchFrames", "split_figures"]
