"""Result rows to JSON texts, column by column (Arrow compute kernels, no per-row Python).

`json_objects(columns)` turns equally long Arrow arrays into one compact JSON object text per
row, with the keys in the given order. Values keep the form the gateway has always delivered:
- doubles as JSON numbers with a fraction or exponent (`1.0`, `0.25`, `1e+20`), so that a reader
  decodes a float; NaN and the infinities become `null`;
- longs as integers, booleans as `true`/`false`;
- timestamps as `"YYYY-MM-DDTHH:MM:SS.ffffffZ"` (UTC, always six fractional digits);
- strings JSON-escaped (`"` `\\` and the control characters; other characters as UTF-8);
- columns marked raw are JSON texts already and are copied as they are;
- null as `null`.
The texts decode (json.loads) to exactly what `pep.core.rows.row_json` gives for the same row.
"""
from __future__ import annotations

import json
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

ISO_TEXT = "%Y-%m-%dT%H:%M:%SZ"  # Arrow prints microseconds with %S: the same text as ISO_FORMAT

_CONTROL = [chr(i) for i in range(0x20)]
_SHORT = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def iso_text(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Timestamps as `YYYY-MM-DDTHH:MM:SS.ffffffZ`: the same text as strftime with ISO_TEXT,
    measured ~6x faster (Arrow's cast prints `YYYY-MM-DD HH:MM:SS.ffffff` for microseconds)."""
    text = column.cast(pa.timestamp("us")).cast(pa.string())
    text = pc.utf8_replace_slice(text, start=10, stop=11, replacement="T")
    return pc.binary_join_element_wise(text, "Z", "")


def _quoted(text: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise('"', text, '"', "")


def _escape(text: pa.Array) -> pa.Array:
    if len(text) == 0:
        return text
    text = pc.replace_substring(text, "\\", "\\\\")
    text = pc.replace_substring(text, '"', '\\"')
    if pc.any(pc.match_substring_regex(text, "[\\x00-\\x1f]")).as_py():
        for ch in _CONTROL:
            text = pc.replace_substring(text, ch, _SHORT.get(ch, f"\\u{ord(ch):04x}"))
    return text


def value_texts(array: pa.Array | pa.ChunkedArray, raw: bool = False) -> pa.Array:
    """The JSON text of every value of `array` (null -> `null`)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    t = array.type
    if raw:
        text = array.cast(pa.string())
    elif pa.types.is_floating(t):
        array = array.cast(pa.float64())
        finite = pc.is_finite(array)
        text = pc.if_else(finite, array.cast(pa.string()), pa.scalar(None, pa.string()))
        # Arrow prints integral doubles without a fraction ("1", "-0"): add one, so that a
        # reader decodes a float, as it did from json.dumps
        integral = pc.invert(pc.or_(pc.match_substring(text, "."), pc.match_substring(text, "e")))
        text = pc.if_else(integral, pc.binary_join_element_wise(text, ".0", ""), text)
    elif pa.types.is_integer(t) or pa.types.is_boolean(t):
        text = array.cast(pa.string())
    elif pa.types.is_timestamp(t):
        text = _quoted(iso_text(array))
    elif pa.types.is_date(t):
        text = _quoted(array.cast(pa.string()))
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        text = _quoted(_escape(array.cast(pa.string())))
    elif pa.types.is_null(t):
        text = pa.nulls(len(array), pa.string())
    elif pa.types.is_decimal(t):
        text = array.cast(pa.float64()).cast(pa.string())
    else:
        raise TypeError(f"cannot encode Arrow type {t} as JSON")
    return pc.fill_null(text, "null")


def json_array(columns: Sequence[tuple[str, pa.Array | pa.ChunkedArray, bool]],
               length: int | None = None) -> pa.Array:
    """One JSON object text per row, as an Arrow string array: `columns` are (key, values,
    values-are-raw-JSON)."""
    if not columns:
        return pa.array(["{}"] * (length or 0), pa.string())
    parts: list[pa.Array | str] = []
    for i, (name, values, raw) in enumerate(columns):
        parts.append(("{" if i == 0 else ",") + json.dumps(name) + ":")
        parts.append(value_texts(values, raw))
    if len(parts[1]) == 0:
        return pa.array([], pa.string())
    return pc.binary_join_element_wise(*parts, "}", "")


def json_objects(columns: Sequence[tuple[str, pa.Array | pa.ChunkedArray, bool]],
                 length: int | None = None) -> list[str]:
    """One JSON object text per row (see `json_array`), as Python strings."""
    texts: list[str] = json_array(columns, length).to_pylist()
    return texts


__all__ = ["ISO_TEXT", "iso_text", "json_array", "json_objects", "value_texts"]
