"""A pure-Python reference of Spark's share of window work: pane partials from plain rows, and
windows fed with plain rows (`TupleWindows`, `TimeWindows`), for tests and tools. The gateway
itself never runs this: Spark computes the partials (`query/panes_job.py`)."""
from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import numpy as np

from pep.runtime.plans.compile import CompiledWindow
from pep.runtime.windows.pane_partials import (
    NO_SEQ,
    PARTS,
    Columns,
    PaneLayout,
    Part,
    empty_partials,
    fill_value,
)
from pep.runtime.windows.pane_windows import PaneWindows

# ---------------------------------------------------------------------------------------------
# A pure-Python reference of Spark's share: partials from plain rows (tests, and the
# compatibility classes below)
# ---------------------------------------------------------------------------------------------

def _family_value(value: Any, ftype: str) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if ftype == "boolean":
        return 1 if value else 0
    if ftype == "timestamp" and isinstance(value, str):
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    return value


def partials_from_rows(layout: PaneLayout, rows: Iterable[dict[str, Any]], panes: Iterable[int],
                       keys: Iterable[str] | None = None, times: Iterable[float] | None = None,
                       seqs: Iterable[int | None] | None = None) -> Columns:
    """What Spark computes for one plan's tuples of one batch (given in stream order): partials
    per (key, pane). `panes` is each tuple's pane as Spark numbers it; a label attribute's
    values are its codes (`pep.core.labels`), as Spark gives them."""
    rows = list(rows)
    panes = list(panes)
    keys = list(keys) if keys is not None else [""] * len(rows)
    times = list(times) if times is not None else [0.0] * len(rows)
    seqs = list(seqs) if seqs is not None else [None] * len(rows)
    groups: dict[tuple[str, int], list[int]] = {}
    for i, (k, p) in enumerate(zip(keys, panes, strict=True)):
        groups.setdefault((k, p), []).append(i)
    w = layout.window
    out: dict[str, list[Any]] = {n: [] for n in empty_partials(layout)}
    for (k, p), idx in groups.items():
        out["key"].append(k)
        out["pane"].append(p)
        out["rows"].append(len(idx))
        s = [q for q in (seqs[i] for i in idx) if q is not None]
        out["mseq"].append(max(s) if s else NO_SEQ)
        for j, ((attr, ftype), fam, parts) in enumerate(zip(w.attributes, layout.families,
                                                            layout.parts, strict=True)):
            vals = [(times[i], n, _family_value(rows[i].get(attr), ftype))
                    for n, i in enumerate(idx)]
            vals = [v for v in vals if v[2] is not None]
            out[f"{Part.COUNT}{j}"].append(len(vals))
            plain = [v[2] for v in vals]
            got: dict[str, Any] = dict.fromkeys(PARTS)  # None: no value in the pane
            if vals:
                first = min(vals, key=lambda v: (v[0], v[1])) if layout.timed else vals[0]
                last = max(vals, key=lambda v: (v[0], v[1])) if layout.timed else vals[-1]
                got.update({Part.MIN: min(plain), Part.MAX: max(plain),
                            Part.SUM: sum(plain) if Part.SUM in parts else None,
                            # a label's code: the OR of the categories (`lub`)
                            Part.OR: _or(plain) if Part.OR in parts else None,
                            Part.FIRST: first[2], Part.LAST: last[2],
                            Part.FIRST_TIME: first[0], Part.LAST_TIME: last[0]})
            for part in parts - {Part.COUNT}:
                value = got[part]
                out[f"{part}{j}"].append(fill_value(fam, part) if value is None else value)
    cols: Columns = {}
    template = empty_partials(layout)
    for name, values in out.items():
        cols[name] = np.array(values, dtype=template[name].dtype) if values else template[name]
    return cols


def _or(values: list[Any]) -> int:
    out = 0
    for v in values:
        out |= int(v)
    return out


def _decode(texts: list[str]) -> list[dict[str, Any]]:
    import json
    return [json.loads(t) for t in texts]


class TupleWindows:
    """Count-based sliding windows fed with plain rows (reference path: tests, tools)."""

    def __init__(self, spec: CompiledWindow) -> None:
        assert spec.kind == "tuple"
        self.spec = spec
        self.state = PaneWindows(spec)

    @property
    def open(self) -> dict[str, Any]:
        return self.state.open

    def add(self, rows: list[dict[str, Any]], keys: list[str] | None = None
            ) -> list[dict[str, Any]]:
        layout = self.state.layout
        keys = keys if keys is not None else [""] * len(rows)
        local: dict[str, int] = {}
        panes = []
        offset = self.state.pane_offset()
        for k in keys:  # what Spark's row_number gives: ordinals from the batch's start
            rn = local.get(k, 0)
            local[k] = rn + 1
            panes.append((offset + rn) // layout.width)
        parts = partials_from_rows(layout, rows, panes, keys)
        return _decode(self.state.add(parts).texts)


class TimeWindows:
    """Event-time sliding windows fed with plain rows and their times (reference path)."""

    def __init__(self, spec: CompiledWindow, not_before: float | None = None) -> None:
        assert spec.kind == "time"
        self.spec = spec
        self.state = PaneWindows(spec, not_before)

    @property
    def late(self) -> int:
        return self.state.late

    @property
    def open(self) -> dict[str, Any]:
        return self.state.open

    def add(self, rows: list[dict[str, Any]], times: list[float | None],
            keys: list[str] | None = None) -> None:
        keys = keys if keys is not None else [""] * len(rows)
        picked = [(r, t, k) for r, t, k in zip(rows, times, keys, strict=True) if t is not None]
        width = self.state.layout.width
        parts = partials_from_rows(self.state.layout, [r for r, _, _ in picked],
                                   [math.floor(t / width) for _, t, _ in picked],
                                   [k for _, _, k in picked], [t for _, t, _ in picked])
        self.state.add(parts)  # no watermark: nothing closes before advance()

    def advance(self, watermark: float | None) -> list[dict[str, Any]]:
        return _decode(self.state.add(empty_partials(self.state.layout), watermark).texts)


__all__ = ["TupleWindows", "TimeWindows", "partials_from_rows"]
