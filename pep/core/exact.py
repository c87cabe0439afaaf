"""Exact values of `long` and `timestamp` attributes: 64-bit integers and microsecond instants.

A double holds every integer only up to 2^53: `account = 9007199254740993` compared as doubles
also matches account 9007199254740992, and an epoch-seconds double of a far date merges
neighbouring microseconds. So nothing that decides a comparison on a long or a timestamp goes
through a float: the parser keeps integer literals as Python ints and decimal ones as `Decimal`
(never rounded), timestamps are counted in integer microseconds (Spark's precision), and a
comparison whose constant is not an integer of the attribute's domain is rewritten, once, into
an equivalent comparison with an integer constant of that domain:

- `x < 2.5` is `x <= 2`, `x > 2.5` is `x > 2` (that is, `x >= 3`), `x >= 2.5` is `x > 2`,
  `x <= 2.5` is `x <= 2`;
- `x = 2.5` holds for no value: it becomes `x > MAX` (MAX the domain's largest value);
  `x != 2.5` holds for every present value: it becomes `x <= MAX`;
- a constant beyond the domain decides the comparison the same way: `x < 1e30` is `x <= MAX`
  (every present value), `x > 1e30` and `x = 1e30` are `x > MAX` (none), `x > -1e30` is
  `x >= MIN`, `x < -1e30` is `x < MIN`.
The rewritten comparison is still false on a missing value, as every comparison is, so
negations and the NR/PR analysis keep SQL's treatment of missing values.

A bound timestamp constant is written as the gateway writes timestamps everywhere,
`YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC, four-digit year, six fractional digits): fixed width, so
such texts compare as strings in the order of the instants they name, and a row delivered by the
runtime can be evaluated against them as it is.
"""
from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from typing import TypeGuard

from common.numbers import END_EPOCH_SECONDS, INT64_MAX, INT64_MIN, MIN_EPOCH_SECONDS

MICROS_PER_SECOND = 1_000_000
# Instants of years 1 to 9999 (UTC) in epoch microseconds (`common.numbers` has them in seconds):
# from 0001-01-01T00:00:00Z up to, not including, 10000-01-01T00:00:00Z.
MIN_MICROS = MIN_EPOCH_SECONDS * MICROS_PER_SECOND
END_MICROS = END_EPOCH_SECONDS * MICROS_PER_SECOND
MAX_MICROS = END_MICROS - 1

ExactNumber = int | Decimal | Fraction | float
"""A number whose value is exact as it stands (a float is the exact binary value it holds)."""

_EPOCH = datetime(1970, 1, 1)
_ONE_MICRO = timedelta(microseconds=1)
# the fraction of the seconds, after hh:mm:ss (or hhmmss in the basic format)
_FRACTION = re.compile(r"(?:(?<=\d\d:\d\d:\d\d)|(?<=[Tt ]\d{6}))[.,](\d+)")


def is_number(value: object) -> TypeGuard[ExactNumber]:
    """A numeric literal (never a boolean); a guard, so the checker knows what passed it."""
    return isinstance(value, (int, float, Decimal, Fraction)) and not isinstance(value, bool)


def floor_exact(value: ExactNumber) -> int:
    """The largest integer not above `value`, computed without rounding (finite values; keep
    magnitudes sensible: the integer is built in full)."""
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal):
        return int(value.to_integral_value(rounding=ROUND_FLOOR))
    return math.floor(value)


def ceil_exact(value: ExactNumber) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal):
        return int(value.to_integral_value(rounding=ROUND_CEILING))
    return math.ceil(value)


def round_half_even(value: ExactNumber) -> int:
    """The nearest integer (ties to even), computed without rounding on the way."""
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal):
        return int(value.to_integral_value(rounding=ROUND_HALF_EVEN))
    return round(Fraction(value))


def is_integral(value: ExactNumber) -> bool:
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, Decimal):
        return value == value.to_integral_value(rounding=ROUND_FLOOR)
    return value.denominator == 1


def integer_comparison(op: str, value: ExactNumber, low: int = INT64_MIN, high: int = INT64_MAX
                       ) -> tuple[str, int]:
    """`x op value` over the integers from `low` to `high`, as an equivalent `x op' n` with an
    integer n in that range (see the module docstring). `value` must be finite."""
    if value > high:
        return ("<=", high) if op in ("<", "<=", "!=") else (">", high)
    if value < low:
        return (">=", low) if op in (">", ">=", "!=") else ("<", low)
    floor = floor_exact(value)  # within [low, high] now, so a sensible size
    if floor == value:
        return op, floor
    # strictly between floor and floor + 1, both in range
    if op in ("<", "<="):
        return "<=", floor
    if op in (">", ">="):
        return ">", floor
    return (">", high) if op == "=" else ("<=", high)


_DECIMAL_LITERAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,6})?")


def exact_decimal(text: str) -> Decimal:
    """A decimal literal's exact value (ValueError if it is not one). ASCII digits only, as
    every number from the outside world (common/numbers.py): `Decimal` alone would also take
    '١٢', '1_000', 'NaN' and 'Infinity'."""
    if _DECIMAL_LITERAL.fullmatch(text.strip()) is None:
        raise ValueError(text)
    try:
        value = Decimal(text.strip())
    except ArithmeticError:
        raise ValueError(text) from None
    if not value.is_finite():
        raise ValueError(text)
    return value


def scaled(value: ExactNumber, factor: int) -> ExactNumber:
    """`value * factor`, exactly (a Decimal keeps its digits, a float becomes a Fraction)."""
    if isinstance(value, int):
        return value * factor
    if isinstance(value, Decimal):
        sign, digits, exponent = value.as_tuple()
        power = round(math.log10(factor))
        if 10 ** power == factor and isinstance(exponent, int):
            return Decimal((sign, digits, exponent + power))
        return Fraction(value) * factor
    return Fraction(value) * factor


# -- instants --------------------------------------------------------------------------------------

def micros_from_iso(text: str) -> int | Fraction:
    """The instant an ISO-8601 date-time names, in epoch microseconds, exactly: any number of
    fractional digits (a fraction of a microsecond is kept as a Fraction, never rounded or cut);
    `Z` or an offset, or none for UTC. ValueError if the text is not such a date-time."""
    if not isinstance(text, str) or len(text) > 100:
        raise ValueError(text)
    stripped = text.strip()
    fraction: Fraction | None = None
    m = _FRACTION.search(stripped)
    if m is not None:
        digits = m.group(1)
        fraction = Fraction(int(digits), 10 ** len(digits))
        stripped = stripped[:m.start()] + stripped[m.end():]
    if stripped.endswith(("Z", "z")):
        stripped = stripped[:-1] + "+00:00"
    moment = datetime.fromisoformat(stripped)  # ValueError when it is not ISO-8601
    offset = moment.utcoffset() or timedelta(0)
    # timedelta arithmetic: no overflow at the ends of the years 1 to 9999
    delta = (moment.replace(tzinfo=None) - _EPOCH) - offset
    micros = delta // _ONE_MICRO
    if fraction is None:
        return micros
    total = micros + fraction * MICROS_PER_SECOND
    return int(total) if total.denominator == 1 else total


def micros_from_seconds(value: ExactNumber) -> ExactNumber:
    """Epoch seconds as epoch microseconds, exactly."""
    return scaled(value, MICROS_PER_SECOND)


def iso_from_micros(micros: int) -> str:
    """The gateway's text of an instant: `YYYY-MM-DDTHH:MM:SS.ffffffZ` (years 1 to 9999)."""
    if not MIN_MICROS <= micros <= MAX_MICROS:
        raise ValueError(f"{micros} microseconds is outside years 1 to 9999")
    moment = _EPOCH + timedelta(microseconds=micros)
    # isoformat, not strftime: "%Y" does not pad years before 1000 to four digits on glibc
    return moment.isoformat(timespec="microseconds") + "Z"


def timestamp_micros(value: object) -> int:
    """Epoch microseconds of a bound timestamp constant (the gateway's text, or any ISO-8601
    text naming a whole microsecond). ValueError otherwise."""
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a timestamp text")
    micros = micros_from_iso(value)
    if not isinstance(micros, int):
        raise ValueError(f"{value!r} is not a whole microsecond")
    return micros


def in_timestamp_range(micros: ExactNumber) -> bool:
    return MIN_MICROS <= micros < END_MICROS


__all__ = ["INT64_MIN", "INT64_MAX", "MIN_MICROS", "MAX_MICROS", "END_MICROS", "ExactNumber",
           "is_number", "floor_exact", "ceil_exact", "round_half_even", "is_integral",
           "integer_comparison", "exact_decimal", "scaled", "micros_from_iso",
           "micros_from_seconds", "iso_from_micros", "timestamp_micros", "in_timestamp_range"]
