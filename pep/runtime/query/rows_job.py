"""The rows job of a micro-batch, as DataFrames over the batch: each tuple some row plan passes,
once, with the attributes those plans show and which plans passed it. Three matchers: a few
plans compiled into one Column each (`few_plans_column`), many plans grouped by shape and tested
on Spark's workers (`values_frame`, `admitted_frame`: the `GroupedMatcher`), or the plan table
(`rows_frame` with its scalar column; spatial, masked and label comparisons).
"""
from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle
from pyspark.sql import Column, DataFrame, functions as F, types as T

from pep.runtime.base.columns import (
    BITS_COLUMN,
    EMIT,
    HASHED_PREFIX,
    LNGS_COLUMN,
    NUMS_COLUMN,
    ORDER_EXACT,
    ORDER_NUMBER,
    PIDS_COLUMN,
    PLANS_COLUMN,
    READ_COLUMN,
    SEQ_COLUMN,
    TOP_COLUMN,
)
from pep.runtime.base.jvm_steps import JvmSteps
from pep.runtime.plans import matcher as matcher_module
from pep.runtime.plans.batch_shape import Shape
from pep.runtime.plans.matcher import GroupedMatcher, admitted_rows, value_column
from pep.runtime.plans.plan_expressions import (
    FEW_PLANS,
    few_plans_column,
    masked_emissions,
    matched_plans_column,
    shared_expressions,
    value_elements,
)
from pep.runtime.plans.plan_schema import ROW_KINDS, PlanField
from pep.runtime.privacy.masks import hashed_text, masked_column
from pep.runtime.query.batch_columns import (
    base_columns,
    masked_order,
    order_columns,
    order_expressions,
    plan_order,
)
from pep.runtime.query.registry import PlanSets
from pep.runtime.query.settings import StreamLayout

# the grouped matcher runs on the workers (the rows job's mapInArrow): its code travels with it,
# so a worker runs the driver's matcher, xsg installed there or not
_pickle_by_value: Callable[[ModuleType], None] = cloudpickle.register_pickle_by_value
_pickle_by_value(matcher_module)

RowsMatcher = Column | GroupedMatcher  # a few plans' Column, or the grouped matcher


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


class RowsJob:
    """The rows job's matchers and DataFrames, each built once per plans' version, schema and
    shape, then reused (its JVM steps too: `JvmSteps`)."""

    def __init__(self, layout: StreamLayout) -> None:
        self._layout = layout
        # the few-plans matcher and its plans
        self._few: tuple[tuple[Any, ...], Column] | None = None
        # the rows job's Columns around it: (matcher, shape key, selected, non-empty test)
        self._few_columns: tuple[Column, tuple[Any, ...], list[Column], Column] | None = None
        self._grouped: tuple[int, GroupedMatcher | None] | None = None  # (plans' version, it)
        # the admitted rows' schema and the values frame's column names, per shape
        self._admitted_schemas: dict[tuple[Any, ...], tuple[T.StructType, list[str]]] = {}
        self._steps = JvmSteps()  # the batch's DataFrame steps, few py4j calls each

    def redefine(self, layout: StreamLayout, restarted: bool) -> None:
        """The stream's definition changed; `restarted`: its schema grew (matchers rebuilt)."""
        self._layout = layout
        if restarted:
            self._few, self._grouped = None, None

    def matcher(self, sets: PlanSets, shape: Shape) -> RowsMatcher | None:
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
                                                   self._layout.schema))
            return self._few[1]
        if self._grouped is None or self._grouped[0] != sets.version:
            self._grouped = (sets.version,
                             GroupedMatcher.build([(s.id, s.compiled) for s in plain]))
        return self._grouped[1]

    def rows_frame(self, batch: DataFrame, plans_column: Column | None, shape: Shape,
                   few: Column | None = None) -> DataFrame:
        """Plain plans: each passing tuple once, its projected attributes and plan ids (from
        `few`, a `few_plans_column`, when given; else from the plan table, `plans_column`)."""
        layout = self._layout
        columns = list(shape.plain_columns)
        order = order_columns(layout, shape)
        if few is not None:
            # One select: `few` reads each attribute's own expression, no value arrays. Its
            # Columns are the same for every batch while the matcher stays (building them is
            # py4j calls, and each DataFrame step is analysed again per batch).
            memo = self._few_columns
            if memo is None or memo[0] is not few or memo[1] != (layout.schema, tuple(columns),
                                                                 tuple(order)):
                keep = ([F.col(f"`{n}`") for n in columns] + order_expressions(layout, shape)
                        + [few.alias(PIDS_COLUMN)])
                memo = (few, (layout.schema, tuple(columns), tuple(order)), keep,
                        F.size(F.col(PIDS_COLUMN)) > 0)
                self._few_columns = memo
            return self._steps.where(self._steps.select(batch, memo[2]), memo[3])
        base = base_columns(layout, shape, columns, False)
        if plans_column is None:
            raise ValueError("rows job without a plan table or a compiled matcher")
        if shape.masked:
            emit, out = shared_expressions(
                ("rows-masked", layout.schema, tuple(columns), tuple(order), shape.spatial,
                 shape.masked_filters, shape.hashed, shape.kafka_cut),
                lambda: self._masked_rows(columns, order, shape))
            return (batch.select(*base, plans_column.alias(PLANS_COLUMN))
                    .select(*emit).select(*out))

        def build() -> tuple[list[Column], Column]:
            keep = [F.col(f"`{n}`") for n in columns] + [F.col(c) for c in order]
            return keep + [matched_plans_column(ROW_KINDS, shape.spatial,
                                                kafka=shape.kafka_cut)
                           .alias(PIDS_COLUMN)], F.size(F.col(PIDS_COLUMN)) > 0
        keep, nonempty = shared_expressions(("rows", layout.schema, tuple(columns),
                                             tuple(order), shape.spatial, shape.kafka_cut),
                                            build)
        return (batch.select(*base, plans_column.alias(PLANS_COLUMN))
                .select(*keep).where(nonempty))

    def values_frame(self, batch: DataFrame, shape: Shape, grouped: GroupedMatcher
                     ) -> DataFrame:
        """Plain plans matched by a `GroupedMatcher`: every tuple once, its projected
        attributes and the values the plans' comparisons read (compiled, no plan table); what
        `admitted_frame` hands to the matcher on the workers."""
        layout = self._layout
        columns = list(shape.plain_columns)
        order = order_columns(layout, shape)

        # One select straight from the batch: each value the matcher reads is its attribute's
        # own element expression (what `value_arrays` would put at that index), so no value
        # arrays are built and the batch's DataFrame is analysed once here, not twice (each
        # DataFrame step is a py4j call and an analysis per batch: ~6 ms, 25 ms at p95 here).
        def build() -> list[Column]:
            elements = dict(zip("dsl", value_elements(layout.schema, shape.read), strict=True))
            return ([F.col(f"`{n}`") for n in columns] + order_expressions(layout, shape)
                    + [elements[fam][a - 1].alias(value_column(a, fam))
                       for a, fam in grouped.columns])
        keep = shared_expressions(("grouped-values", layout.schema, tuple(columns), tuple(order),
                                   layout.time_attr, shape.read, grouped.columns), build)
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
        keep = list(shape.plain_columns) + order_columns(self._layout, shape)
        key = (self._layout.schema, tuple(keep), grouped.columns)
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
        values under the emission's masks, right after the filter (pep/runtime/privacy/masks.py),
        and its order under them too (`plan_order`: a masked time orders a plan's rows by the
        masked value, never the raw one)."""
        layout = self._layout
        emit = [F.explode(masked_emissions(ROW_KINDS, shape.spatial, shape.masked_filters,
                                           shape.kafka_cut))
                .alias(EMIT),
                *[F.col(f"`{n}`") for n in columns], *[F.col(c) for c in order]]
        timed = masked_order(layout, order)
        if timed is not None:  # the ordering time's values, which each emission's masks read
            emit += [F.element_at(F.col(NUMS_COLUMN), timed).alias(ORDER_NUMBER),
                     F.element_at(F.col(LNGS_COLUMN), timed).alias(ORDER_EXACT)]
        e = F.col(EMIT)
        out = []
        for n in columns:
            m = F.element_at(e[PlanField.MASKS], layout.index[n])
            out.append(masked_column(F.col(f"`{n}`"), layout.types[n], m).alias(n))
        for n in shape.hashed:
            m = F.element_at(e[PlanField.MASKS], layout.index[n])
            out.append(hashed_text(F.col(f"`{n}`"), layout.types[n], m)
                       .alias(HASHED_PREFIX + n))
        out += plan_order(layout, order, e[PlanField.MASKS], F.col(ORDER_NUMBER),
                          F.col(ORDER_EXACT))
        out.append(e["i"].alias(PIDS_COLUMN))
        return emit, out


__all__ = ["RowsJob", "RowsMatcher", "split_figures"]
