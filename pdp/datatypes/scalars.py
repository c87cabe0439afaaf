"""boolean, integer, double, hexBinary, base64Binary and anyURI: parsers and formatters, and
the generic XACML equality (`values_equal`, `equality_key`) that makes NaN equal NaN."""
from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from pdp.datatypes.common import fail

_INTEGER_RE = re.compile(r"[+-]?[0-9]+")
_DOUBLE_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?INF|NaN")
_MAX_INTEGER_DIGITS = 4000


def parse_boolean(text: str) -> bool:
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    fail("expected true, false, 1 or 0")


def parse_integer(text: str) -> int:
    if not _INTEGER_RE.fullmatch(text):
        fail("expected an optionally signed decimal integer")
    if len(text) > _MAX_INTEGER_DIGITS:
        fail(f"more than {_MAX_INTEGER_DIGITS} digits")
    return int(text)


NAN = float("nan")


def parse_double(text: str) -> float:
    if not _DOUBLE_RE.fullmatch(text):
        fail("expected a decimal or scientific number, INF, -INF or NaN")
    if text.endswith("INF"):
        return float("-inf") if text.startswith("-") else float("inf")
    if text == "NaN":
        return NAN
    return float(text)


def is_nan(value: Any) -> bool:
    return isinstance(value, float) and value != value


def values_equal(a: Any, b: Any) -> bool:
    """XACML equality of two values of the same type (NaN equals NaN, see module doc)."""
    return a == b or (is_nan(a) and is_nan(b))


def equality_key(value: Any) -> Any:
    """A hashable key such that equal keys <=> XACML-equal values (every NaN maps to NAN)."""
    return NAN if is_nan(value) else value


def format_double(value: float) -> str:
    """XACML lexical form of a double: INF, -INF, NaN, else the shortest round-trip decimal."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "INF" if value > 0 else "-INF"
    text = repr(float(value))
    if "e" in text:
        mantissa, exp = text.split("e")
        if "." not in mantissa:
            mantissa += ".0"
        return f"{mantissa}E{int(exp)}"
    return text


def parse_hex(text: str) -> bytes:
    if len(text) % 2 or not re.fullmatch(r"[0-9A-Fa-f]*", text):
        fail("expected an even number of hexadecimal digits")
    return bytes.fromhex(text)


def parse_base64(text: str) -> bytes:
    compact = "".join(text.split())
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        fail(f"bad base64 ({exc})")


def parse_anyuri(text: str) -> str:
    if any(c in text for c in "\x00\n\r\t"):
        fail("control characters are not allowed in a URI")
    return text
