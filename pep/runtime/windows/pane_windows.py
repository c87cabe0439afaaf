"""Windows from pane partials: the driver's share of window work (numpy; no Spark).

The partials themselves (their columns, the layout of a plan's, merging a batch's into the
stored ones) are `windows/pane_partials.py`'s; `windows/window_reference.py` computes them from
plain rows, a pure-Python reference of Spark's share for tests.

Spark computes, per micro-batch, partial aggregates per (plan, key, pane): the tuples of a pane,
and per aggregated attribute the count of non-null values, their sum, min, max, first and last
(`query/panes_job.py`). A window of size N and step M is a run of N/P consecutive panes of P =
gcd(N, M) (tuples or seconds), starting every M/P panes. This module keeps, per plan and key,
the panes of the windows that are still open, merges the new partials in, and combines panes
into the windows that are complete. Combining is O(1) per window whatever N/P: panes lie in
blocks of N/P, a window covers the suffix of one block and the prefix of the next, and per
block prefix and suffix aggregates are running accumulations (the van Herk / Gil-Werman
scheme), computed for all windows of a batch at once with numpy.

The state of a plan is the panes of its open windows (at most N/P + M/P panes per key for
tuple windows; for time windows the panes not yet behind the watermark) plus, for tuple
windows, a tuple count and the next window index per key.

Semantics (also in the README):
- Tuple windows (size N, step M) count the tuples that passed the plan's filter, from the first
  tuple after the plan attached (per key value when the window has keys), numbered 0, 1, 2, ...
  Window k holds tuples [k*M, k*M+N) and is emitted as soon as its last tuple arrived;
  window_start and window_end are the indices of its first and last tuple (inclusive). With
  M > N the tuples between windows belong to none.
- Time windows (size S, step P seconds) are aligned to the epoch: window k covers [k*P, k*P+S).
  Each plan has its own clock: its watermark is the largest event time among the tuples that
  passed the plan's filter (never another plan's tuples: what a policy hides moves no time)
  minus the allowed lateness; it moves only between micro-batches. A window is emitted once the
  watermark reaches its end. A tuple that arrives for windows already emitted is dropped from
  those windows and counted as late. A plan attached to a stream whose query has already run a
  micro-batch never emits windows starting at or before the earliest event time of the first
  micro-batch that brings it a tuple (they may hold tuples from before it attached).
  window_start and window_end are the window's bounds in the attribute's own form (ISO-8601
  UTC text for timestamps, epoch seconds for numbers).
- A window (per key value) holding fewer than min_count tuples (nulls included) is not
  emitted; a time window with no tuple never is.
- Aggregates ignore null values: count is the number of non-null values, avg/sum/min/max/
  firstval/lastval are computed over the non-null values (null when there are none). firstval/
  lastval follow stream order for tuple windows and (event time, stream order) for time windows.
  Sums of doubles add pane sums: they can differ from a left-to-right sum in the last bits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pep.core.labels import CATEGORY_MASK, LEVEL_SHIFT, Lattice
from pep.runtime.base.encode import json_array
from pep.runtime.plans.compile import HIDDEN, CompiledWindow
from pep.runtime.windows.pane_partials import (
    INT_MAX,
    INT_MIN,
    KEY_SEP,
    NO_SEQ,
    Columns,
    PaneLayout,
    Part,
    collapse,
    concat_partials,
    empty_partials,
    fill_value,
    key_codes,
    pane_count,
    take_rows,
)

_SUM_LIMIT = 2.0 ** 62  # long sums this large are redone with Python integers


# ---------------------------------------------------------------------------------------------
# Sliding combination over dense pane arrays
# ---------------------------------------------------------------------------------------------

def _blocks(values: np.ndarray, span: int, op: np.ufunc) -> tuple[np.ndarray, np.ndarray]:
    """Per block of `span`: running op from the block's start (prefix) and to its end (suffix)."""
    shaped = values.reshape(-1, span)
    prefix = op.accumulate(shaped, axis=1).ravel()
    suffix = op.accumulate(shaped[:, ::-1], axis=1)[:, ::-1].ravel()
    return prefix, suffix


def _slide(values: np.ndarray, starts: np.ndarray, span: int, op: np.ufunc) -> np.ndarray:
    """op over values[x:x+span] for every x in starts (values: a multiple of span long, blocks
    aligned at 0)."""
    if span == 1:
        return np.asarray(values[starts])
    prefix, suffix = _blocks(values, span, op)
    ends = starts + span - 1
    aligned = starts % span == 0
    return np.asarray(np.where(aligned, prefix[ends], op(suffix[starts], prefix[ends])))


def _dense(column: np.ndarray, positions: np.ndarray, size: int, filler: Any) -> np.ndarray:
    out = np.full(size, filler, dtype=column.dtype)
    out[positions] = column
    return out


@dataclass
class Emitted:
    """Windows computed for one plan in one batch: each output row's columns, in order."""

    starts: np.ndarray  # window start, in panes
    keys: np.ndarray  # object: key text per window
    rows: np.ndarray
    mseq: np.ndarray
    values: dict[str, np.ndarray]  # per attribute: cnt, sum, min, max, first, last (by name)

    def __len__(self) -> int:
        return len(self.starts)


def _combine(cols: Columns, layout: PaneLayout, segments: list[tuple[str, int, int]],
             windows: list[np.ndarray]) -> Emitted:
    """Aggregate windows over the stored panes.

    segments: (key, base pane, panes) runs; windows[i]: window start panes in segment i (each
    window inside its segment). Panes of `cols` outside every segment are ignored."""
    span = layout.span
    bases, offsets, total = [], [], 0
    for _, base, count in segments:
        padded = -(-count // span) * span
        bases.append(base)
        offsets.append(total)
        total += padded
    # place every stored pane that falls into a segment (cols are sorted by key, then pane)
    pos = np.full(pane_count(cols), -1, dtype=np.int64)
    keys, panes = cols["key"], cols["pane"]
    ranges: dict[str, tuple[int, int]] = {}
    if len(keys):
        cuts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
        los = np.concatenate([[0], cuts]).tolist()
        his = np.concatenate([cuts, [len(keys)]]).tolist()
        ranges = {keys[lo]: (lo, hi) for lo, hi in zip(los, his, strict=True)}
    for i, (key, base, count) in enumerate(segments):
        if key not in ranges:
            continue
        lo, hi = ranges[key]
        a = lo + int(np.searchsorted(panes[lo:hi], base, "left"))
        b = lo + int(np.searchsorted(panes[lo:hi], base + count, "left"))
        pos[a:b] = offsets[i] + panes[a:b] - base
    keep = pos >= 0
    at = pos[keep]
    starts = np.concatenate([offsets[i] + (w - bases[i]) for i, w in enumerate(windows)]
                            ) if windows else np.empty(0, np.int64)
    starts = starts.astype(np.int64)
    win_keys = np.concatenate([np.full(len(w), segments[i][0], dtype=object)
                               for i, w in enumerate(windows)]) if windows else np.empty(0, object)
    win_panes = np.concatenate(windows).astype(np.int64) if windows else np.empty(0, np.int64)

    def dense(name: str, filler: Any) -> np.ndarray:
        return _dense(cols[name][keep], at, total, filler)

    rows = _slide(dense("rows", 0), starts, span, np.add)
    mseq = _slide(dense("mseq", NO_SEQ), starts, span, np.maximum)
    values: dict[str, np.ndarray] = {}
    index = np.arange(total, dtype=np.int64)
    for j, (fam, parts) in enumerate(zip(layout.families, layout.parts, strict=True)):
        cnt_d = dense(f"{Part.COUNT}{j}", 0)
        valid = cnt_d > 0
        values[f"{Part.COUNT}{j}"] = _slide(cnt_d, starts, span, np.add)
        some = values[f"{Part.COUNT}{j}"] > 0
        filler = fill_value(fam)
        if Part.FIRST in parts:
            first_at = _slide(np.where(valid, index, INT_MAX), starts, span, np.minimum)
            values[f"{Part.FIRST}{j}"] = dense(f"{Part.FIRST}{j}", filler)[
                np.where(some, first_at, 0)]
        if Part.LAST in parts:
            last_at = _slide(np.where(valid, index, -1), starts, span, np.maximum)
            values[f"{Part.LAST}{j}"] = dense(f"{Part.LAST}{j}", filler)[
                np.where(some, last_at, 0)]
        if fam == "s":
            for part, op, none in ((Part.MIN, np.minimum, INT_MAX), (Part.MAX, np.maximum, -1)):
                if part not in parts:
                    continue
                d = dense(f"{part}{j}", None)
                present = sorted(set(d[valid].tolist()))
                if not present:
                    values[f"{part}{j}"] = np.full(len(starts), None, object)
                    continue
                uniq = np.array(present, dtype=object)
                codes = np.full(total, none, np.int64)
                codes[valid] = np.searchsorted(uniq, d[valid])
                values[f"{part}{j}"] = uniq[np.where(some, _slide(codes, starts, span, op), 0)]
        else:
            big, small = (np.inf, -np.inf) if fam == "d" else (INT_MAX, INT_MIN)
            if Part.MIN in parts:
                lows = np.where(valid, dense(f"{Part.MIN}{j}", big), big)
                values[f"{Part.MIN}{j}"] = _slide(lows, starts, span, np.minimum)
            if Part.MAX in parts:
                highs = np.where(valid, dense(f"{Part.MAX}{j}", small), small)
                values[f"{Part.MAX}{j}"] = _slide(highs, starts, span, np.maximum)
            if Part.OR in parts:
                bits = np.where(valid, dense(f"{Part.OR}{j}", 0), 0)
                values[f"{Part.OR}{j}"] = _slide(bits, starts, span, np.bitwise_or)
        if Part.SUM in parts:
            sums = np.where(valid, dense(f"{Part.SUM}{j}", filler), filler)
            if fam == "l" and len(sums) and float(np.abs(sums.astype(np.float64)).sum()) \
                    >= _SUM_LIMIT:
                sums = np.array([int(v) for v in sums.tolist()], dtype=object)  # exact ints
            values[f"{Part.SUM}{j}"] = _slide(sums, starts, span, np.add)
    return Emitted(win_panes, win_keys, rows, mseq, values)


# ---------------------------------------------------------------------------------------------
# Window state per plan
# ---------------------------------------------------------------------------------------------

@dataclass
class WindowBatch:
    """What one micro-batch emits for a plan: output rows as JSON texts (and their size in
    bytes), and the highest stream position behind them (None when unknown)."""

    texts: list[str]
    last_position: int | None
    nbytes: int = 0

    def __len__(self) -> int:
        return len(self.texts)


class PaneWindows:
    """One window plan's state between micro-batches (tuple or time windows)."""

    def __init__(self, window: CompiledWindow, not_before: float | None = None,
                 single: bool = False, late_start: bool = False) -> None:
        """`not_before`: windows starting at or before it are never emitted. `late_start`
        (time windows of a plan attached to a running stream): `not_before` becomes the start
        of the pane of the earliest tuple of the first batch that brings the plan any tuple
        (windows starting at or before that tuple may hold tuples from before it attached)."""
        self.window = window
        self.layout = PaneLayout.of(window, single)
        self.stored = empty_partials(self.layout)
        # tuple windows: per key, tuples counted so far and the next window to emit
        self.counts: dict[str, int] = {}
        self.next_window: dict[str, int] = {}
        # time windows: the plan's own clock, from its own tuples only
        self.event_time: float | None = None  # the largest event time among the plan's tuples
        self.closed_until = -math.inf  # the watermark reached: windows ending here are closed
        self.not_before = not_before
        self.late_start = late_start and not_before is None
        self.late = 0

    # -- what Spark needs to place the next batch's tuples into panes --------------------------
    def pane_offset(self) -> int:
        """Keyless tuple windows: the tuples already in the current pane (count mod width)."""
        if self.layout.timed or self.window.keys:
            return 0
        return self.counts.get("", 0) % self.layout.width

    @property
    def open(self) -> dict[Any, None]:
        """The windows that have started but are not complete (tuple windows)."""
        out: dict[Any, None] = {}
        if self.layout.timed:
            for p in np.unique(self.stored["pane"]).tolist():
                out[p] = None
            return out
        w = self.window
        for key, count in self.counts.items():
            k = self.next_window.get(key, 0)
            while k * w.step < count:
                out[(key, k)] = None
                k += 1
        return out

    @property
    def stored_panes(self) -> int:
        return pane_count(self.stored)

    # -- one micro-batch ----------------------------------------------------------------------
    def advance(self, batch_time: float | None, lateness: float) -> float | None:
        """Time windows: the plan's watermark after a batch whose tuples (those that passed
        the plan's filter; the executor computes their largest event time in Spark, per plan)
        reach `batch_time` at most: the plan's largest event time so far minus `lateness`.
        None while the plan has seen no event time. Nothing but the plan's own tuples moves
        it: a tuple another plan's filter passes, and this one's does not, moves no time
        here."""
        if batch_time is not None and not math.isnan(batch_time) \
                and (self.event_time is None or batch_time > self.event_time):
            self.event_time = float(batch_time)
        return None if self.event_time is None else self.event_time - lateness

    def add(self, partials: Columns, watermark: float | None = None) -> WindowBatch:
        """Merge a batch's partials (pane indices as Spark gave them) and emit what is complete.
        Time windows close up to `watermark` (event time, seconds; `advance` gives the plan's)."""
        if self.layout.timed:
            return self._add_time(partials, watermark)
        return self._add_tuple(partials)

    def _add_tuple(self, new: Columns) -> WindowBatch:
        w, layout = self.window, self.layout
        width, span, stride = layout.width, layout.span, layout.stride
        if pane_count(new):
            # Spark numbered panes from the batch's start: make them global per key
            uniq, code = key_codes(new["key"])
            before = np.array([self.counts.get(k, 0) for k in uniq.tolist()], dtype=np.int64)
            added = np.bincount(code, weights=new["rows"], minlength=len(uniq)).astype(np.int64)
            for k, b, a in zip(uniq.tolist(), before.tolist(), added.tolist(), strict=True):
                self.counts[k] = b + a
            new = dict(new, pane=new["pane"] + (before // width)[code])
            # panes between windows (step > size) belong to none
            if stride > span:
                new = take_rows(new, np.flatnonzero(new["pane"] % stride < span))
        cols = collapse(concat_partials(self.stored, new), layout)
        segments, windows = [], []
        for key, count in self.counts.items():
            k0 = self.next_window.get(key, 0)
            k1 = (count - w.size) // w.step + 1 if count >= w.size else 0  # windows complete
            if k1 <= k0:
                continue
            base = k0 * stride
            last = (k1 - 1) * stride + span
            segments.append((key, base, last - base))
            windows.append(np.arange(k0, k1, dtype=np.int64) * stride)
            self.next_window[key] = k1
        # a tuple window holds `size` tuples: fewer than min_count means none is ever emitted
        wanted = segments and w.size >= w.min_count
        emitted = _combine(cols, layout, segments, windows) if wanted else None
        # keep the panes of the windows still open
        if pane_count(cols):
            uniq, code = key_codes(cols["key"])
            firsts = np.array([self.next_window.get(k, 0) for k in uniq.tolist()],
                              dtype=np.int64) * stride
            cols = take_rows(cols, np.flatnonzero(cols["pane"] >= firsts[code]))
        self.stored = cols
        if emitted is None or len(emitted) == 0:
            return WindowBatch([], None)
        _, code = key_codes(emitted.keys)
        order = np.lexsort((emitted.starts, code))
        starts = emitted.starts[order] * width
        return self._output(emitted, order, pa.array(starts, pa.int64()),
                            pa.array(starts + w.size - 1, pa.int64()))

    def _add_time(self, new: Columns, watermark: float | None) -> WindowBatch:
        w, layout = self.window, self.layout
        width, span, stride = layout.width, layout.span, layout.stride
        if self.late_start and pane_count(new):
            self.not_before = float(int(new["pane"].min()) * width)
            self.late_start = False
        if pane_count(new):
            panes = new["pane"]
            k_last = panes // stride
            in_window = panes < k_last * stride + span
            last_end = (k_last * stride + span) * width
            late = in_window & (last_end <= self.closed_until)
            if late.any():
                self.late += int(new["rows"][late].sum())
            keep = in_window & ~late
            if self.not_before is not None:
                keep &= (k_last * stride * width) > self.not_before
            new = take_rows(new, np.flatnonzero(keep))
        cols = collapse(concat_partials(self.stored, new), layout)
        emitted = None
        if watermark is not None and watermark > self.closed_until and pane_count(cols):
            segments, windows = self._candidates(cols)
            if segments:
                emitted = _combine(cols, layout, segments, windows)
                start_s = emitted.starts * width
                end_s = start_s + w.size
                ok = (end_s <= watermark) & (end_s > self.closed_until) \
                    & (emitted.rows >= w.min_count)
                if self.not_before is not None:
                    ok &= start_s > self.not_before
                emitted = _select(emitted, np.flatnonzero(ok))
            self.closed_until = watermark
        elif watermark is not None and watermark > self.closed_until:
            self.closed_until = watermark
        if pane_count(cols):  # keep the panes of windows not yet closed
            k_last = cols["pane"] // stride
            keep = (k_last * stride + span) * width > self.closed_until
            cols = take_rows(cols, np.flatnonzero(keep))
        self.stored = cols
        if emitted is None or len(emitted) == 0:
            return WindowBatch([], None)
        _, code = key_codes(emitted.keys)
        order = np.lexsort((code, emitted.starts))
        start_s = emitted.starts[order] * width
        if w.time_is_timestamp:
            micros = start_s.astype(np.int64) * 1_000_000
            starts = pa.array(micros, pa.timestamp("us"))
            ends = pa.array(micros + w.size * 1_000_000, pa.timestamp("us"))
        else:
            starts = pa.array(start_s, pa.int64())
            ends = pa.array(start_s + w.size, pa.int64())
        return self._output(emitted, order, starts, ends)

    def _candidates(self, cols: Columns
                    ) -> tuple[list[tuple[str, int, int]], list[np.ndarray]]:
        """Segments of stored panes (split where no window can span a gap) and, per segment,
        the starts of the windows that hold at least one of its panes."""
        span, stride = self.layout.span, self.layout.stride
        segments, windows = [], []
        keys, panes = cols["key"], cols["pane"]
        bounds = np.flatnonzero((keys[1:] != keys[:-1]) | (np.diff(panes) >= span)) + 1
        lo_idx = np.concatenate([[0], bounds])
        hi_idx = np.concatenate([bounds, [len(panes)]]) - 1
        for lo, hi in zip(lo_idx.tolist(), hi_idx.tolist(), strict=True):
            a, b = int(panes[lo]), int(panes[hi])
            first = -((span - 1 - a) // stride)  # ceil((a - span + 1) / stride)
            last = b // stride
            if last < first:
                continue
            starts = np.arange(first, last + 1, dtype=np.int64) * stride
            base = int(starts[0])
            segments.append((keys[lo], base, int(starts[-1]) + span - base))
            windows.append(starts)
        return segments, windows

    def _output(self, emitted: Emitted, order: np.ndarray, starts: pa.Array, ends: pa.Array
                ) -> WindowBatch:
        w = self.window
        if w.label_bounds:  # MLS: only windows whose tuples' labels the bound dominates
            keep = self._dominated(emitted, order)
            if not keep.all():
                order = order[keep]
                mask = pa.array(keep)
                starts, ends = pc.filter(starts, mask), pc.filter(ends, mask)
                if not len(order):
                    return WindowBatch([], None)
        columns: list[tuple[str, Any, bool]] = [("window_start", starts, False),
                                                ("window_end", ends, False)]
        keys = emitted.keys[order]
        if w.keys:
            parts = [k.split(KEY_SEP) for k in keys.tolist()]
            for i, name in enumerate(w.keys):
                columns.append((name, pa.array([p[i] for p in parts], pa.string()), True))
        slot = {a: j for j, (a, _) in enumerate(w.attributes)}
        types = dict(w.attributes)
        lattices = dict(w.lattices)
        for attr, function, name in (w.aggregates if w.privacy is None else ()):
            if name.startswith(HIDDEN):
                continue
            j = slot[attr]
            if function == "lub":
                columns.append((name, _lub_texts(emitted, order, j, lattices[attr]), False))
                continue
            values, raw = self._result(emitted, order, j, function, types[attr])
            columns.append((name, values, raw))
        if w.privacy is not None:  # differential privacy: noisy aggregates, never the exact
            from pep.runtime.windows.noise import release
            columns += release(w, emitted, order)
        mseq = emitted.mseq
        top = int(mseq.max()) if len(mseq) else NO_SEQ
        encoded = json_array(columns)
        return WindowBatch(encoded.to_pylist(), None if top == NO_SEQ else top,
                           int(pc.sum(pc.binary_length(encoded)).as_py() or 0))

    def _dominated(self, emitted: Emitted, order: np.ndarray) -> np.ndarray:
        """Per window in `order`: whether every label bound dominates the window's lub (a
        window without a label value passes: no tuple of it is above the bound)."""
        slot = {a: j for j, (a, _) in enumerate(self.window.attributes)}
        keep = np.ones(len(order), dtype=bool)
        for attr, bound in self.window.label_bounds:
            j = slot[attr]
            codes = _lub_codes(emitted, order, j)
            level_ok = (codes >> LEVEL_SHIFT) <= (bound >> LEVEL_SHIFT)
            cats_ok = (codes & CATEGORY_MASK & ~bound) == 0
            keep &= (emitted.values[f"{Part.COUNT}{j}"][order] == 0) | (level_ok & cats_ok)
        return keep

    @staticmethod
    def _result(emitted: Emitted, order: np.ndarray, j: int, function: str, ftype: str
                ) -> tuple[pa.Array, bool]:
        """One aggregate's output column, and whether it is raw JSON text already."""
        cnt = emitted.values[f"{Part.COUNT}{j}"][order]
        if function == "count":
            return pa.array(cnt.astype(np.int64), pa.int64()), False
        none = cnt == 0
        if function == "avg":
            sums = emitted.values[f"{Part.SUM}{j}"][order]
            with np.errstate(invalid="ignore", divide="ignore"):
                avg = np.array([float(s) / c if c else np.nan
                                for s, c in zip(sums.tolist(), cnt.tolist(), strict=True)]) \
                    if sums.dtype == object else sums.astype(np.float64) / np.maximum(cnt, 1)
            return pa.array(avg, pa.float64(), mask=none), False
        key = {"sum": Part.SUM, "min": Part.MIN, "max": Part.MAX, "firstval": Part.FIRST,
               "lastval": Part.LAST}[function]
        values = emitted.values[f"{key}{j}"][order]
        if ftype == "double":
            return pa.array(values.astype(np.float64), pa.float64(), mask=none), False
        if ftype == "long":
            if values.dtype == object:  # exact big sums, as JSON integers
                return pa.array([None if m else str(int(v)) for v, m in
                                 zip(values.tolist(), none.tolist(), strict=True)],
                                pa.string()), True
            return pa.array(values.astype(np.int64), pa.int64(), mask=none), False
        if ftype == "timestamp":
            return pa.array(values.astype(np.int64), pa.timestamp("us"), mask=none), False
        if ftype == "boolean":
            return pa.array(values.astype(np.int64) != 0, pa.bool_(), mask=none), False
        return pa.array(
            [None if m else v for v, m in zip(values.tolist(), none.tolist(), strict=True)],
            pa.string(),
        ), False


def _lub_codes(emitted: Emitted, order: np.ndarray, j: int) -> np.ndarray:
    """The least upper bound of each window's label codes: the max code's level, the OR's
    categories."""
    top = emitted.values[f"{Part.MAX}{j}"][order].astype(np.int64)
    ored = emitted.values[f"{Part.OR}{j}"][order].astype(np.int64)
    return np.asarray(((top >> LEVEL_SHIFT) << LEVEL_SHIFT) | (ored & CATEGORY_MASK))


def _lub_texts(emitted: Emitted, order: np.ndarray, j: int, lattice: Lattice) -> pa.Array:
    """The lub of each window as its label's text (each distinct code printed once)."""
    codes = _lub_codes(emitted, order, j)
    none = emitted.values[f"{Part.COUNT}{j}"][order] == 0
    uniq, inverse = np.unique(np.where(none, 0, codes), return_inverse=True)
    texts = np.array([str(lattice.label(int(c))) for c in uniq.tolist()], dtype=object)
    return pa.array(texts[inverse].tolist(), pa.string(), mask=none)


def _select(e: Emitted, index: np.ndarray) -> Emitted:
    return Emitted(e.starts[index], e.keys[index], e.rows[index], e.mseq[index],
                   {k: v[index] for k, v in e.values.items()})


__all__ = ["PaneWindows", "WindowBatch", "Emitted"]
