"""The columns every job of a micro-batch starts from, as functions of the stream's layout and the
batch's shape: the order columns (stream order, `order_columns`), the value arrays the plans'
comparisons read (`base_columns`), the order as a masked plan sees it (`plan_order`), and the
stream's own figures (`observed`). Built once per schema and shape (`shared_expressions`).
"""
from __future__ import annotations

from pyspark.sql import Column, functions as F

from pep.runtime.base.columns import (
    FILE_COLUMN,
    KEYS_COLUMN,
    KOFF_COLUMN,
    KPART_COLUMN,
    LNGS_COLUMN,
    NUMS_COLUMN,
    POS_COLUMN,
    SEQ_COLUMN,
    STRS_COLUMN,
    TIME_COLUMN,
)
from pep.runtime.plans.batch_shape import Shape
from pep.runtime.plans.plan_expressions import (
    kafka_position,
    key_array,
    shared_expressions,
    value_arrays,
)
from pep.runtime.privacy.masks import masked_seconds
from pep.runtime.query.settings import UNIQUE_SEQ_KINDS, StreamLayout


def order_columns(layout: StreamLayout, shape: Shape) -> list[str]:
    """The columns whose values, in this order, put the batch's tuples in stream order."""
    if shape.full_order:
        return [SEQ_COLUMN, TIME_COLUMN, FILE_COLUMN, POS_COLUMN]
    if layout.definition.source.kind in UNIQUE_SEQ_KINDS:
        # the position alone orders them; no row id: monotonically_increasing_id is
        # nondeterministic and keeps Spark from pruning the scan's file metadata
        return [SEQ_COLUMN]
    return [SEQ_COLUMN, POS_COLUMN]


def order_expressions(layout: StreamLayout, shape: Shape) -> list[Column]:
    """The order columns (`order_columns`) as expressions over the batch."""
    cols = [F.col(SEQ_COLUMN)]
    if POS_COLUMN in order_columns(layout, shape):
        cols.append(F.monotonically_increasing_id().alias(POS_COLUMN))
    if shape.full_order:
        if layout.time_attr:
            cols.append(time_number(layout, layout.time_attr).alias(TIME_COLUMN))
        else:
            cols.append(F.lit(None).cast("double").alias(TIME_COLUMN))
        cols.append(F.col(FILE_COLUMN))
    return cols


def base_columns(layout: StreamLayout, shape: Shape, columns: list[str], windows: bool
                 ) -> list[Column]:
    """The batch's columns every job starts from (built once per schema and shape)."""
    def build() -> list[Column]:
        cols = [F.col(f"`{n}`") for n in columns]
        cols += order_expressions(layout, shape)
        nums, strs, lngs = value_arrays(layout.schema, shape.read)
        cols += [nums.alias(NUMS_COLUMN), strs.alias(STRS_COLUMN)]
        # exact values of long, timestamp and boolean attributes: what their comparisons
        # read (a constant array of nulls, folded away, when no such attribute is read)
        cols.append(lngs.alias(LNGS_COLUMN))
        if windows:
            if shape.keys:
                cols.append(key_array(layout.schema, shape.keys).alias(KEYS_COLUMN))
        if shape.kafka_cut:  # the records' positions, which the plans' cuts compare
            partition, offset = kafka_position()
            cols += [partition.alias(KPART_COLUMN), offset.alias(KOFF_COLUMN)]
        return cols
    built: list[Column] = shared_expressions(
        ("base", layout.schema, tuple(columns), windows, shape.keys,
         tuple(order_columns(layout, shape)), layout.time_attr, shape.read, shape.kafka_cut),
        build)
    return built


def time_number(layout: StreamLayout, attr: str) -> Column:
    """An attribute's time in seconds, as a double."""
    c = F.col(f"`{attr}`")
    if layout.types[attr] == "timestamp":
        return F.unix_micros(c) / F.lit(1_000_000.0)
    return c.cast("double")


def observed(shape: Shape) -> list[Column]:
    """The stream's own figures. No event time: each time-window plan's clock comes from its
    own tuples, in the panes job (`mt`), never from the stream's."""
    built: list[Column] = shared_expressions(("observed",), lambda: [
        F.count(F.lit(1)).alias("rows"), F.max(F.col(SEQ_COLUMN)).alias("seq")])
    return built


def masked_order(layout: StreamLayout, order: list[str]) -> int | None:
    """The index of the attribute whose time orders the tuples (the stream's time attribute,
    on sources without a stream position: `order_columns`), when plans' masks may apply to it;
    None when the order reads no time."""
    if TIME_COLUMN not in order or not layout.time_attr:
        return None
    return layout.index[layout.time_attr]


def plan_order(layout: StreamLayout, order: list[str], masks: Column, number: Column,
               exact: Column) -> list[Column]:
    """The order columns as one plan sees them (`masks`: its mask structs, null when it masks
    nothing): the ordering time under the plan's mask of it (`masks.masked_seconds` from the
    attribute's `number` and `exact` values), so tuples alike once masked are ordered by what
    follows (file, position: stream order), never by the hidden part of their time. Unmasked
    plans keep the raw time column as it is."""
    timed, attr = masked_order(layout, order), layout.time_attr
    out = []
    for c in order:
        if c != TIME_COLUMN or timed is None or attr is None:
            out.append(F.col(c))
            continue
        m = F.element_at(masks, timed)
        seconds = masked_seconds(number, exact, layout.types[attr], m)
        out.append(F.when(m.isNull(), F.col(TIME_COLUMN)).otherwise(seconds)
                   .alias(TIME_COLUMN))
    return out


__all__ = ["order_columns", "order_expressions", "base_columns", "time_number", "observed",
           "masked_order", "plan_order"]
