"""Ordering predicates (A.3.6, A.3.8) and time-in-range.

Strings are ordered by code point; dates and times by the instant they denote, a value
without a timezone being taken in the implicit timezone (UTC, see `pdp.datatypes`).
"""
from __future__ import annotations

import operator
from decimal import Decimal

from pdp import datatypes as dt
from pdp.functions.base import F1, F2, Param, register

_ORDERED = (
    ("integer", dt.INTEGER),
    ("double", dt.DOUBLE),
    ("string", dt.STRING),
    ("time", dt.TIME),
    ("date", dt.DATE),
    ("dateTime", dt.DATETIME),
)
_OPERATORS = (
    ("greater-than", operator.gt),
    ("greater-than-or-equal", operator.ge),
    ("less-than", operator.lt),
    ("less-than-or-equal", operator.le),
)

for _name, _type in _ORDERED:
    for _suffix, _op in _OPERATORS:
        register(f"{F1}{_name}-{_suffix}", dt.BOOLEAN, (Param(_type), Param(_type)), _op)

_DAY = Decimal(86400)


def _utc_seconds(value: dt.XSTime, tz: int | None) -> Decimal:
    offset = value.tz if value.tz is not None else tz
    return (value.seconds_of_day - Decimal((offset or 0) * 60)) % _DAY


def _time_in_range(value: dt.XSTime, low: dt.XSTime, high: dt.XSTime) -> bool:
    """True if value lies in [low, high], the range wrapping past midnight when high < low.

    The bounds take the value's timezone when they have none; the value takes the implicit
    one (UTC). The upper bound is never more than 24 hours after the lower one.
    """
    own_tz = value.tz if value.tz is not None else 0
    x = _utc_seconds(value, own_tz)
    lo = _utc_seconds(low, own_tz)
    hi = _utc_seconds(high, own_tz)
    if hi < lo:
        hi += _DAY
    if x < lo:
        x += _DAY
    return lo <= x <= hi


_T = Param(dt.TIME)
register(F2 + "time-in-range", dt.BOOLEAN, (_T, _T, _T), _time_in_range)
