"""A bound condition on one tuple, in pure Python: SQL's three-valued logic for missing
values, spatial predicates through `pep.core.geo`. The reference semantics the Spark runtime is
tested against, and the comparators both share."""
from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from pep.core import geo
from pep.core.conditions.syntax import And, Comparison, Const, Expr, Not, Or, Spatial
from pep.core.labels import Label, LabelError, holds as label_holds
from pep.core.plan import Scalar, SpatialPredicate

Operand = Any
"""What a comparator compares: a Python value, or a Spark Column (whose comparison is a Column):
the runtime builds its column expressions with the same table."""
RowValue = Any
"""A tuple's value as the runtime delivers it, of its attribute's type (a number, a string, a
boolean, a timestamp's text, a label's text), or None when missing."""

# The comparison operators by their symbol; they work on Python values and on Spark Columns alike.
COMPARATORS: dict[str, Callable[[Operand, Operand], Operand]] = {
    "=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
    ">=": operator.ge}


def _compare(left: RowValue, op: str, right: RowValue) -> bool:
    if isinstance(right, Label):  # a label attribute's value: its text or a Label
        try:
            value = left if isinstance(left, Label) else right.lattice.parse(left)
        except LabelError:
            return False
        return label_holds(value, op, right)
    return bool(COMPARATORS[op](left, right))


AnchorLookup = Callable[[str, Scalar, str, str], "tuple[float, float] | None"]
"""(key attribute, key value, latitude attribute, longitude attribute) -> the anchor's latest
position before the tuple being evaluated, or None when none is known."""


def evaluate(expr: Expr, row: Mapping[str, RowValue], *, anchor: AnchorLookup | None = None
             ) -> bool:
    """Truth of a bound condition on one tuple, with SQL semantics for missing values.

    Row values are as the runtime delivers them: numbers (Python's ints for longs, compared
    exactly), strings, booleans, and timestamps as `YYYY-MM-DDTHH:MM:SS.ffffffZ` text (fixed
    width, so they compare in time order with bound timestamp constants).
    A comparison with a missing (None) attribute is unknown; unknown propagates through
    AND/OR/NOT by Kleene's rules and an unknown condition lets the tuple through no more than
    false does. This equals pushing NOT down to the comparisons and treating any comparison
    over a missing attribute as false, which is what the execution plan states. A spatial
    predicate is unknown on a tuple without a valid position, and DISTANCE_TO also when
    `anchor` knows no position for its anchor (no `anchor`: none is known).
    """
    result = _eval3(expr, row, anchor)
    return result is True


def spatial_holds(s: Spatial | SpatialPredicate, row: Mapping[str, RowValue],
                  anchor: AnchorLookup | None = None) -> bool | None:
    """A bound spatial predicate on one tuple: True, False or None (unknown)."""
    lat, lon = row.get(s.latitude), row.get(s.longitude)
    if lat is None or lon is None or not geo.valid_position(lat, lon):
        return None
    if s.function == "polygon":
        inside = geo.in_polygon(float(lat), float(lon),
                                s.points)  # type: ignore[arg-type]  # bound: numbers
        return inside if s.op == "=" else not inside
    if s.function == "distance":
        plat, plon = s.points  # type: ignore[misc]  # a distance's point: (lat, lon)
        d = geo.haversine(float(lat), float(lon),
                          plat, plon)  # type: ignore[arg-type]  # bound: numbers
    else:
        where = anchor(s.key, s.key_value,  # type: ignore[arg-type]  # DISTANCE_TO: both set
                       s.latitude, s.longitude) if anchor else None
        if where is None or not geo.valid_position(*where):
            return None
        d = geo.haversine(float(lat), float(lon), where[0], where[1])
    radius = s.radius if isinstance(s, Spatial) else s.value
    return _compare(d, s.op, radius)


def _eval3(expr: Expr, row: Mapping[str, RowValue], anchor: AnchorLookup | None = None
           ) -> bool | None:
    if isinstance(expr, Comparison):
        value = row.get(expr.attribute)
        if value is None:
            return None
        return _compare(value, expr.op, expr.value)
    if isinstance(expr, Spatial):
        return spatial_holds(expr, row, anchor)
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Not):
        inner = _eval3(expr.item, row, anchor)
        return None if inner is None else not inner
    if isinstance(expr, And):
        result: bool | None = True
        for item in expr.items:
            v = _eval3(item, row, anchor)
            if v is False:
                return False
            if v is None:
                result = None
        return result
    if not isinstance(expr, Or):  # set membership and boxes are bound away before
        raise TypeError(f"evaluate takes a bound condition, not {type(expr).__name__}")
    result = False
    for item in expr.items:
        v = _eval3(item, row, anchor)
        if v is True:
            return True
        if v is None:
            result = None
    return result
