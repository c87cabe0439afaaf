"""Clamping in Spark for differentially private windows: the Spark side of `pep.core.privacy`.

A private window's sum has a known sensitivity only if every value it adds lies within the
policy's bounds, so each aggregated value is clamped into them in Spark, as a column
expression, before the panes job aggregates it (never a Python function per row, and never on
the driver). Like everything else a plan brings, the bounds are data: two arrays of the plan
table (`lo`, `hi`, one element per schema attribute, null where unbounded, the arrays null for
a plan without privacy), read by index with the attribute index the value itself was read
with. The expression is part of the panes job only while some attached window plan is private
(`Shape.clamped`), so no other plan's physical plan changes.

Private window plans never take the rows path (`query/registry.py`, `_rows_mode`): there the raw
tuples would reach the driver and be aggregated there, unclamped by Spark.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, functions as F

from pep.runtime.plans.compile import CompiledWindow
from pep.runtime.plans.plan_schema import PlanField


def bound_arrays(window: CompiledWindow | None, index: Mapping[str, int]
                 ) -> tuple[list[float | None] | None, list[float | None] | None]:
    """The plan table's `lo` and `hi` for a window (None, None: nothing is clamped)."""
    if window is None or window.privacy is None:
        return None, None
    width = max(index.values(), default=0)
    lo: list[float | None] = [None] * width
    hi: list[float | None] = [None] * width
    for b in window.privacy.bounds:
        at = index[b.attribute] - 1
        lo[at], hi[at] = float(b.lower), float(b.upper)
    return lo, hi


def clamped(value: Column, plan: Column, attribute_index: Column, family: str) -> Column:
    """`value` clamped into the plan's bounds for that attribute; unchanged where the plan has
    none (and a null stays null: `greatest` would otherwise make it the lower bound)."""
    if family not in ("d", "l"):
        return value
    lo = F.element_at(plan[PlanField.LOW], attribute_index)
    hi = F.element_at(plan[PlanField.HIGH], attribute_index)
    if family == "l":  # long bounds are integers within 2^53: exact as doubles
        lo, hi = lo.cast("long"), hi.cast("long")
    return F.when(value.isNull() | lo.isNull() | hi.isNull(), value) \
        .otherwise(F.least(F.greatest(value, lo), hi))


def is_private(window: Any) -> bool:
    return window is not None and getattr(window, "privacy", None) is not None


__all__ = ["bound_arrays", "clamped", "is_private"]
