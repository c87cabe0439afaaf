"""Arithmetic (A.3.2) and numeric conversion (A.3.4) functions.

Integer division and modulus truncate toward zero, as XPath's op:integer-div and
op:integer-mod do (not Python's floor semantics). Division by zero is Indeterminate.
"""
from __future__ import annotations

import math

from pdp import datatypes as dt
from pdp.functions.base import F1, MAX_INTEGER_BITS, Param, fail, register

_I, _D = Param(dt.INTEGER), Param(dt.DOUBLE)


def _bounded(function_id: str, value: int) -> int:
    if value.bit_length() > MAX_INTEGER_BITS:
        raise fail(function_id, f"integer result exceeds {MAX_INTEGER_BITS} bits")
    return value


def _integer_add(*values: int) -> int:
    return _bounded(F1 + "integer-add", sum(values))


def _integer_multiply(*values: int) -> int:
    result = 1
    for value in values:
        result = _bounded(F1 + "integer-multiply", result * value)
    return result


def _integer_subtract(a: int, b: int) -> int:
    return _bounded(F1 + "integer-subtract", a - b)


def _integer_divide(a: int, b: int) -> int:
    if b == 0:
        raise fail(F1 + "integer-divide", "division by zero")
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b > 0) else -quotient


def _integer_mod(a: int, b: int) -> int:
    if b == 0:
        raise fail(F1 + "integer-mod", "division by zero")
    remainder = abs(a) % abs(b)
    return remainder if a >= 0 else -remainder


def _double_add(*values: float) -> float:
    total = 0.0
    for value in values:
        total += value
    return total


def _double_multiply(*values: float) -> float:
    result = 1.0
    for value in values:
        result *= value
    return result


def _double_subtract(a: float, b: float) -> float:
    return a - b


def _double_divide(a: float, b: float) -> float:
    if b == 0:
        raise fail(F1 + "double-divide", "division by zero")
    return a / b


def _round(x: float) -> float:
    """Nearest whole number; halves go toward positive infinity (fn:round)."""
    if not math.isfinite(x):
        return x
    floor = math.floor(x)
    return float(floor + 1 if x - floor >= 0.5 else floor)


def _floor(x: float) -> float:
    return x if not math.isfinite(x) else float(math.floor(x))


def _double_to_integer(x: float) -> int:
    if not math.isfinite(x):
        raise fail(F1 + "double-to-integer", f"{dt.format_double(x)} has no integer value")
    return int(x)  # truncates toward zero


def _integer_to_double(n: int) -> float:
    try:
        return float(n)
    except OverflowError:
        raise fail(F1 + "integer-to-double", "integer too large for a double") from None


register(F1 + "integer-add", dt.INTEGER, (_I,), _integer_add, variadic=True, min_args=2)
register(F1 + "double-add", dt.DOUBLE, (_D,), _double_add, variadic=True, min_args=2)
register(F1 + "integer-multiply", dt.INTEGER, (_I,), _integer_multiply, variadic=True, min_args=2)
register(F1 + "double-multiply", dt.DOUBLE, (_D,), _double_multiply, variadic=True, min_args=2)
register(F1 + "integer-subtract", dt.INTEGER, (_I, _I), _integer_subtract)
register(F1 + "double-subtract", dt.DOUBLE, (_D, _D), _double_subtract)
register(F1 + "integer-divide", dt.INTEGER, (_I, _I), _integer_divide)
register(F1 + "double-divide", dt.DOUBLE, (_D, _D), _double_divide)
register(F1 + "integer-mod", dt.INTEGER, (_I, _I), _integer_mod)
register(F1 + "integer-abs", dt.INTEGER, (_I,), abs)
register(F1 + "double-abs", dt.DOUBLE, (_D,), abs)
register(F1 + "round", dt.DOUBLE, (_D,), _round)
register(F1 + "floor", dt.DOUBLE, (_D,), _floor)
register(F1 + "double-to-integer", dt.INTEGER, (_D,), _double_to_integer)
register(F1 + "integer-to-double", dt.DOUBLE, (_I,), _integer_to_double)
