"""Numbers from the outside world: the one parser for every header, query parameter, setting,
id and token field that is read as a number.

Python's own conversions are too lenient for input a client or an operator writes:
`str.isdigit()` accepts '²' and '①', which `int()` then refuses (a 500 where a 400 was due);
`int()` and `float()` accept any Unicode decimal digit ('٣' is 3), underscores ('1_000'),
surrounding Unicode spaces, and `float()` accepts 'nan' and 'inf'; `int()` of a long run of
digits is slow, then refused past 4,300 digits. Here a number is ASCII: optional '-' only where
the range holds negatives, digits, for a float an optional fraction and exponent; its text is
bounded in length and its value in range. A refusal is a `NumberError` (a ValueError) whose
message names the field, so the HTTP edge maps it to a 400 and a setting to a start-up error.

The `check_*` functions do the same for values that arrive already typed (JSON, TOML): a bool is
not a number, NaN and the infinities are not finite, and the range holds.
"""
from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1  # SQLite's INTEGER, Java's long
# Instants of years 1 to 9999 (UTC), as Python's datetime and Spark's TIMESTAMP both hold them,
# in epoch seconds: from 0001-01-01T00:00:00Z up to, not including, 10000-01-01T00:00:00Z.
MIN_EPOCH_SECONDS, END_EPOCH_SECONDS = -62_135_596_800, 253_402_300_800
MAX_TEXT = 64  # longer text is refused before any conversion
_INT = re.compile(r"-?[0-9]+")  # [0-9], never \d: \d is every Unicode decimal digit
_FLOAT = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_SPACE = " \t"


class NumberError(ValueError):
    """A number that cannot be used; `field` names where it came from (`query parameter
    'after'`, `header Last-Event-ID`, `environment variable XSG_PORT`, ...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _bounds(low: float, high: float) -> str:
    return f"from {low:g} to {high:g}" if isinstance(low, float) or isinstance(high, float) \
        else f"from {low} to {high}"


def parse_int(text: Any, field: str, *, low: int = 0, high: int = INT64_MAX) -> int:
    """A whole number written in ASCII digits (a '-' only when `low` < 0), within [low, high];
    spaces and tabs around it are ignored. Anything else raises NumberError naming `field`."""
    message = f"{field} must be a whole number {_bounds(low, high)}"
    if not isinstance(text, str):
        raise NumberError(field, f"{message}, not {_shown(text)}")
    stripped = text.strip(_SPACE)
    if len(stripped) > MAX_TEXT or not _INT.fullmatch(stripped) \
            or (stripped.startswith("-") and low >= 0):
        raise NumberError(field, f"{message} (ASCII digits), not {_shown(text)}")
    value = int(stripped)
    if not low <= value <= high:
        raise NumberError(field, f"{message}, not {_shown(text)}")
    return value


def parse_float(text: Any, field: str, *, low: float, high: float) -> float:
    """A finite decimal number in ASCII ('1', '0.25', '.5', '1e3'; a '-' only when `low` < 0;
    never 'nan' or 'inf'), within [low, high]; spaces and tabs around it are ignored."""
    message = f"{field} must be a number {_bounds(low, high)}"
    if not isinstance(text, str):
        raise NumberError(field, f"{message}, not {_shown(text)}")
    stripped = text.strip(_SPACE)
    if len(stripped) > MAX_TEXT or not _FLOAT.fullmatch(stripped) \
            or (stripped.startswith("-") and low >= 0):
        raise NumberError(field, f"{message} (ASCII digits), not {_shown(text)}")
    value = float(stripped)
    if not (math.isfinite(value) and low <= value <= high):
        raise NumberError(field, f"{message}, not {_shown(text)}")
    return value + 0.0  # -0.0 becomes 0.0


def check_int(value: Any, field: str, *, low: int = 0, high: int = INT64_MAX) -> int:
    """An integer that arrived typed (JSON, TOML): not a bool, not a float, within range."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise NumberError(field, f"{field} must be a whole number {_bounds(low, high)}, "
                                 f"not {_shown(value)}")
    return value


def check_float(value: Any, field: str, *, low: float, high: float) -> float:
    """A number that arrived typed (JSON, TOML): an int or a float, not a bool, finite, within
    range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (isinstance(value, float) and not math.isfinite(value)) \
            or not low <= value <= high:
        raise NumberError(field, f"{field} must be a number {_bounds(low, high)}, "
                                 f"not {_shown(value)}")
    return float(value)


def int_argument(low: int = 0, high: int = INT64_MAX) -> Callable[[str], int]:
    """An argparse `type=` for a whole-number flag: `parse_int`, refusals in argparse's words
    (`argument --port: the value must be a whole number from 1 to 65535 ...`, exit status 2)."""

    def whole_number(text: str) -> int:
        try:
            return parse_int(text, "the value", low=low, high=high)
        except NumberError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None

    return whole_number


def float_argument(low: float, high: float) -> Callable[[str], float]:
    """An argparse `type=` for a number flag (seconds, rates): `parse_float`, finite, in range."""

    def number(text: str) -> float:
        try:
            return parse_float(text, "the value", low=low, high=high)
        except NumberError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None

    return number


__all__ = ["INT64_MIN", "INT64_MAX", "MIN_EPOCH_SECONDS", "END_EPOCH_SECONDS", "NumberError",
           "parse_int", "parse_float", "check_int", "check_float", "int_argument", "float_argument"]
