"""Pane partials: what Spark's panes job returns per (plan, key, pane), as numpy columns on the
driver, and the pane layout of a window plan (numpy; no Spark).

`Part` names the partial aggregates (count, sum, min, max, bitwise OR, first, last, and the event
times of first and last) in one place for both sides: the panes job (`query/panes_job.py`) builds
`<slot>_<code>` columns, this module and `windows/pane_windows.py` read and merge `<code><j>`
columns. A batch's partials are merged into the stored ones here (`collapse`);
`windows/pane_windows.py` combines them into windows.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import numpy as np
import pyarrow as pa

from pep.runtime.plans.compile import FAMILIES, CompiledWindow

ISO_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
INT_MAX = np.iinfo(np.int64).max
INT_MIN = np.iinfo(np.int64).min
NO_SEQ = INT_MIN  # mseq of a pane whose tuples have no stream position
KEY_SEP = "\x01"  # joins the JSON texts of a key's values (JSON text never holds a raw \x01)


def iso_utc(seconds: float) -> str:
    """ISO-8601 UTC text with microseconds and a Z suffix: the form the gateway's ingest writes."""
    return datetime.fromtimestamp(seconds, tz=UTC).strftime(ISO_FORMAT)


# ---------------------------------------------------------------------------------------------
# Pane partials: a dict of equally long numpy columns
#   key (object: the key's JSON value texts joined by KEY_SEP; "" without keys), pane (int64),
#   rows (int64: tuples, nulls included), mseq (int64: highest stream position, NO_SEQ if none),
#   and per aggregated attribute j: c{j} count of non-null values, s{j} sum (d and l
#   families), n{j} min, x{j} max, f{j} first, l{j} last, and for time windows ft{j}/lt{j}, the
#   event time of the first/last value. Values are float64 (d), int64 (l) or object (s); where
#   c{j} == 0 the value columns hold fillers and are never read.
# ---------------------------------------------------------------------------------------------

Columns = dict[str, np.ndarray]


class Part(StrEnum):
    """A pane's partial aggregates of one attribute, one code each: the driver's columns are
    `<code><j>` (attribute j of the plan), the panes job's `<slot>_<code>` (`query/panes_job.py`).
    The codes are column names only, never stored (no checkpoint holds them)."""

    COUNT = "c"  # non-null values (always wanted: it says whether a pane holds a value)
    SUM = "s"
    MIN = "n"
    MAX = "x"
    OR = "o"  # bitwise OR of the values (a label's categories)
    FIRST = "f"  # the first value in stream order ((event time, stream order) for time windows)
    LAST = "l"
    FIRST_TIME = "ft"  # time windows: the event time of the first value
    LAST_TIME = "lt"  # ... of the last


PARTS = tuple(Part)  # in the order the panes job's columns come
TIME_PARTS = frozenset({Part.FIRST_TIME, Part.LAST_TIME})  # only time windows have these

NEEDS: dict[str, tuple[Part, ...]] = {
    "count": (), "sum": (Part.SUM,), "avg": (Part.SUM,), "min": (Part.MIN,),
    "max": (Part.MAX,), "firstval": (Part.FIRST,), "lastval": (Part.LAST,),
    # a label's least upper bound from its codes: the highest level is the max code's,
    # the categories the bitwise OR's (`pep.core.labels`)
    "lub": (Part.MAX, Part.OR)}


def part_of(column: str) -> tuple[Part, int]:
    """A partial's column name (`<code><j>`) as its part and attribute index."""
    return Part(column.rstrip("0123456789")), int(column.lstrip("cnxosflt"))


def needed_parts(window: CompiledWindow) -> tuple[frozenset[str], ...]:
    """Per aggregated attribute, the partials its functions need (the count always: it tells
    whether a pane holds a value)."""
    timed = window.kind == "time"
    out = []
    for attr, _ in window.attributes:
        parts = {Part.COUNT}
        for a, function, _ in window.aggregates:
            if a == attr:
                parts.update(NEEDS[function])
        if timed and Part.FIRST in parts:
            parts.add(Part.FIRST_TIME)
        if timed and Part.LAST in parts:
            parts.add(Part.LAST_TIME)
        out.append(frozenset(parts))
    return tuple(out)


@dataclass(frozen=True)
class PaneLayout:
    """How one window plan's partials are shaped, derived from its compiled window."""

    window: CompiledWindow
    width: int  # pane width: tuples (tuple windows) or seconds (time windows)
    families: tuple[str, ...]  # per aggregated attribute
    parts: tuple[frozenset[str], ...]  # per aggregated attribute: the partials it needs

    @classmethod
    def of(cls, window: CompiledWindow, single: bool = False) -> PaneLayout:
        """`single`: every pane is one tuple (tuple windows whose tuples reach the driver)."""
        width = window.pane
        if window.kind == "tuple" and (window.keys or single):
            width = 1  # per-key tuple counts are the driver's: keyed tuple panes are tuples
        return cls(window, width, tuple(FAMILIES[t] for _, t in window.attributes),
                   needed_parts(window))

    @property
    def timed(self) -> bool:
        return self.window.kind == "time"

    @property
    def span(self) -> int:  # W: panes per window
        return self.window.size // self.width

    @property
    def stride(self) -> int:  # S: panes between window starts
        return self.window.step // self.width

    def value_columns(self) -> list[str]:
        return [f"{part}{j}" for j, parts in enumerate(self.parts) for part in PARTS
                if part in parts]


def part_dtype(family: str, part: str = "v") -> Any:
    """The numpy dtype of a family's partial `part` ("v": a value of the family)."""
    if part == Part.COUNT:
        return np.int64
    if part in TIME_PARTS:
        return np.float64
    return {"d": np.float64, "l": np.int64, "s": object}[family]


def fill_value(family: str, part: str = "v") -> Any:
    dtype = part_dtype(family, part)
    return None if dtype is object else dtype(0)


def empty_partials(layout: PaneLayout) -> Columns:
    out: Columns = {"key": np.empty(0, object), "pane": np.empty(0, np.int64),
                    "rows": np.empty(0, np.int64), "mseq": np.empty(0, np.int64)}
    for name in layout.value_columns():
        part, j = part_of(name)
        out[name] = np.empty(0, part_dtype(layout.families[j], part))
    return out


def pane_count(cols: Columns) -> int:
    return len(cols["pane"])


def take_rows(cols: Columns, index: np.ndarray) -> Columns:
    return {k: v[index] for k, v in cols.items()}


def concat_partials(a: Columns, b: Columns) -> Columns:
    if pane_count(a) == 0:
        return b
    if pane_count(b) == 0:
        return a
    return {k: np.concatenate([a[k], b[k]]) for k in a}


def _numeric(values: Any, family: str, filler: Any) -> np.ndarray:
    """An Arrow column (or anything array-like) as a numpy column of the family's dtype."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        if family == "s":
            return np.array(values.to_pylist(), dtype=object)
        arr = values.fill_null(filler)
        out = arr.to_numpy() if isinstance(arr, pa.Array) else arr.to_numpy()
        return np.asarray(out, dtype=part_dtype(family))
    if family == "s":
        return np.array(list(values), dtype=object)
    return np.asarray(values, dtype=part_dtype(family))


def partials_from_arrow(table: pa.Table, layout: PaneLayout, columns: dict[str, str],
                        raw: bool = False) -> Columns:
    """Partials of one plan from the executor's Arrow result. `columns` maps this module's
    column names (c0, s0, ...; with `raw`, v0, ...) to the result's column names; key, pane,
    rows and mseq are named so. `raw`: every pane is one tuple and the result holds its value
    per attribute (no aggregation in Spark)."""
    n = table.num_rows
    out: Columns = {
        "key": np.array(table.column("key").fill_null("").to_pylist(), dtype=object),
        "pane": _numeric(table.column("pane"), "l", 0),
        "rows": np.ones(n, np.int64) if raw else _numeric(table.column("rows"), "l", 0),
        "mseq": _numeric(table.column("mseq"), "l", NO_SEQ),
    }
    for name in layout.value_columns():
        part, j = part_of(name)
        fam = layout.families[j]
        if raw:
            column = table.column(columns[f"v{j}"])
            if part == Part.COUNT:
                out[name] = column.is_valid().to_numpy(zero_copy_only=False).astype(np.int64)
            else:
                out[name] = _numeric(column, fam, fill_value(fam))
        else:
            out[name] = _numeric(table.column(columns[name]), "l" if part == Part.COUNT else
                                 ("d" if part in TIME_PARTS else fam), fill_value(fam, part))
    return out


def partials_from_values(layout: PaneLayout, keys: np.ndarray | None, seqs: np.ndarray,
                         values: list[tuple[np.ndarray, np.ndarray]]) -> Columns:
    """One-tuple panes of tuple windows from a batch's tuples of one plan, in stream order:
    `keys` (object array of key texts, None without keys), `seqs` (NO_SEQ where unknown),
    and per aggregated attribute (values in its family's dtype, validity). Panes are numbered
    per key from the batch's start, as `PaneWindows.add` expects."""
    n = len(seqs)
    if keys is None:
        keys = np.full(n, "", dtype=object)
        panes = np.arange(n, dtype=np.int64)
    else:
        _, code = key_codes(keys)
        order = np.argsort(code, kind="stable")
        sorted_code = code[order]
        starts = np.flatnonzero(np.concatenate([[True], sorted_code[1:] != sorted_code[:-1]]))
        rank = np.arange(n) - np.repeat(starts, np.diff(np.concatenate([starts, [n]])))
        panes = np.empty(n, np.int64)
        panes[order] = rank
    out: Columns = {"key": keys, "pane": panes, "rows": np.ones(n, np.int64),
                    "mseq": seqs.astype(np.int64)}
    for j, ((vals, valid), parts) in enumerate(zip(values, layout.parts, strict=True)):
        out[f"{Part.COUNT}{j}"] = valid.astype(np.int64)
        for part in parts - {Part.COUNT} - TIME_PARTS:
            out[f"{part}{j}"] = vals
    return out


def key_codes(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct keys, code of each key)."""
    if len(keys) == 0:
        return np.empty(0, object), np.empty(0, np.int64)
    if keys[0] == keys[-1] and (keys == keys[0]).all():  # one key (always, without keys)
        return np.array([keys[0]], dtype=object), np.zeros(len(keys), np.int64)
    uniq, inverse = np.unique(keys, return_inverse=True)
    return uniq, inverse.astype(np.int64)


def collapse(cols: Columns, layout: PaneLayout) -> Columns:
    """Sort by (key, pane) and merge partials of the same pane (earlier rows first: the stored
    panes come before a batch's new partials, which is stream order)."""
    n = pane_count(cols)
    if n == 0:
        return cols
    _, code = key_codes(cols["key"])
    order = np.lexsort((np.arange(n), cols["pane"], code))
    cols = take_rows(cols, order)
    code = code[order]
    same = (code[1:] == code[:-1]) & (cols["pane"][1:] == cols["pane"][:-1])
    if not same.any():
        return cols
    starts = np.flatnonzero(np.concatenate([[True], ~same]))
    merged = take_rows(cols, starts)
    runs = np.flatnonzero(np.diff(np.concatenate([starts, [n]])) > 1)
    for r in runs.tolist():  # only panes met twice (a batch boundary, late tuples): few
        lo = starts[r]
        hi = starts[r + 1] if r + 1 < len(starts) else n
        group = take_rows(cols, np.arange(lo, hi))
        for name, value in _merge_group(group, layout).items():
            merged[name][r] = value
    return merged


def _merge_group(g: Columns, layout: PaneLayout) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": int(g["rows"].sum()), "mseq": int(g["mseq"].max())}
    for j, parts in enumerate(layout.parts):
        valid = g[f"{Part.COUNT}{j}"] > 0
        out[f"{Part.COUNT}{j}"] = int(g[f"{Part.COUNT}{j}"].sum())
        if not valid.any():
            continue
        idx = np.flatnonzero(valid)
        if Part.MIN in parts:
            out[f"{Part.MIN}{j}"] = min(g[f"{Part.MIN}{j}"][idx].tolist())
        if Part.MAX in parts:
            out[f"{Part.MAX}{j}"] = max(g[f"{Part.MAX}{j}"][idx].tolist())
        if Part.OR in parts:
            ors = g[f"{Part.OR}{j}"][idx].astype(np.int64)
            out[f"{Part.OR}{j}"] = int(np.bitwise_or.reduce(ors))
        if Part.SUM in parts:
            out[f"{Part.SUM}{j}"] = sum(g[f"{Part.SUM}{j}"][idx].tolist())
        if Part.FIRST in parts:
            first = idx[0]
            if layout.timed:  # the earliest event time; the earliest row among equal times
                first = idx[int(np.argmin(g[f"{Part.FIRST_TIME}{j}"][idx]))]
                out[f"{Part.FIRST_TIME}{j}"] = g[f"{Part.FIRST_TIME}{j}"][first]
            out[f"{Part.FIRST}{j}"] = g[f"{Part.FIRST}{j}"][first]
        if Part.LAST in parts:
            last = idx[-1]
            if layout.timed:  # the latest event time; the latest row among equal times
                lt = g[f"{Part.LAST_TIME}{j}"][idx]
                last = idx[len(lt) - 1 - int(np.argmax(lt[::-1]))]
                out[f"{Part.LAST_TIME}{j}"] = g[f"{Part.LAST_TIME}{j}"][last]
            out[f"{Part.LAST}{j}"] = g[f"{Part.LAST}{j}"][last]
    return out


__all__ = ["pane_count", "take_rows", "concat_partials", "key_codes", "collapse", "fill_value",
           "part_dtype", "Part", "PARTS", "TIME_PARTS", "NEEDS", "PaneLayout", "Columns",
           "part_of", "needed_parts", "empty_partials", "partials_from_arrow",
           "partials_from_values", "iso_utc", "ISO_FORMAT", "KEY_SEP", "NO_SEQ", "INT_MAX",
           "INT_MIN"]
