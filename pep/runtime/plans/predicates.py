"""A compiled predicate row as one Column, for queries that filter with plain Column expressions
(joins' sides) rather than the shared query's plan table.

The row (`pep.runtime.plans.compile`) already holds the comparison in its attribute's family, so the
Column compares exactly as the plan table does: doubles as doubles, longs, timestamps (epoch
microseconds) and booleans (0/1) as 64-bit integers, strings as strings. Constants are typed
literals (data in the expression tree, never SQL text).
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Callable

from pyspark.sql import Column, functions as F

from pep.core.plan import StreamSchema
from pep.runtime.plans.compile import (
    EQUAL,
    GREATER,
    INTEGER_KIND,
    LABEL_KIND,
    LESS,
    MASKED_KIND,
    NUMERIC_KIND,
    PredicateRow,
    base_kind,
)
from pep.runtime.privacy.labels import label_code, label_holds
from pep.runtime.privacy.masks import masked_double, masked_long, masked_text


def integer_value(column: Column, ftype: str) -> Column:
    """A long, timestamp or boolean attribute as the 64-bit integer its comparisons use."""
    if ftype == "timestamp":
        return F.unix_micros(column)
    if ftype == "boolean":
        return F.when(column, F.lit(1)).when(~column, F.lit(0)).cast("long")
    return column.cast("long")


def masked_comparison(value: Column, mask: int, constant: Column) -> Column:
    """The outcomes the operator mask accepts (less, equal, greater); false on a null value."""
    tests = [test for bit, test in ((LESS, value < constant), (EQUAL, value == constant),
                                    (GREATER, value > constant)) if mask & bit]
    term = functools.reduce(operator.or_, tests) if tests else F.lit(False)
    return F.coalesce(term, F.lit(False))


def row_column(row: PredicateRow, schema: StreamSchema,
               mask_of: Callable[[str], Column] | None = None) -> Column:
    """A comparison row (not a spatial one) on the frame's own attribute columns. A row on a
    masked value (MASKED_KIND) compares the attribute under `mask_of(attribute)`, a mask
    struct (pep/runtime/privacy/masks.py)."""
    index, mask, kind, number, text = row[:5]
    field = schema.fields[index - 1]
    column = F.col(f"`{field.name}`")
    if kind & MASKED_KIND:
        if mask_of is None:
            raise ValueError(f"a comparison on the masked value of {field.name!r} without its "
                             "mask")
        m = mask_of(field.name)
        kind = base_kind(kind)
        if kind == INTEGER_KIND:
            return masked_comparison(masked_long(integer_value(column, field.type), m), mask,
                                     F.lit(int(number)).cast("long"))
        if kind == NUMERIC_KIND:
            return masked_comparison(masked_double(column.cast("double"), m), mask,
                                     F.lit(float(number)).cast("double"))
        source = column if field.type == "string" else column.cast("long").cast("string")
        return masked_comparison(masked_text(source, m), mask, F.lit(text).cast("string"))
    if kind == LABEL_KIND and field.lattice is not None:
        return label_holds(label_code(column, field.lattice), mask, int(number))
    if kind == INTEGER_KIND:
        return masked_comparison(integer_value(column, field.type), mask,
                                 F.lit(int(number)).cast("long"))
    if kind == NUMERIC_KIND:
        return masked_comparison(column.cast("double"), mask, F.lit(float(number)).cast("double"))
    return masked_comparison(column, mask, F.lit(text).cast("string"))


__all__ = ["integer_value", "masked_comparison", "row_column"]
