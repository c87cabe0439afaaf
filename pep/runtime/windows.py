"""Per-plan window state kept on the driver between micro-batches (pure Python, no Spark).

Only partial aggregates of the windows that are still open and a tuple counter are kept, so the
state of a plan is O(size/step) whatever the stream's length.

Semantics (also in deploy/spark-standalone.md and the README):
- Tuple windows (size N, step M) count the tuples that passed the plan's filter, from the first
  tuple after the plan attached, numbered 0, 1, 2, ... Window k holds tuples [k*M, k*M+N) and is
  emitted as soon as its last tuple arrives; window_start and window_end are the indices of its
  first and last tuple (inclusive). With M > N the tuples between windows belong to none.
- Time windows (size S, step P seconds on the time attribute) are aligned to the epoch: window k
  covers [k*P, k*P+S) (start inclusive, end exclusive). The watermark is the largest event time
  the stream has shown (over all its tuples, filtered or not) minus the allowed lateness; it moves
  only between micro-batches. A window is emitted once the watermark reaches its end. A tuple that
  arrives for windows already emitted is dropped from those windows and counted as late. Windows
  with no tuples, or fewer than the plan's minimum count, are not emitted. When a plan attaches
  to a stream that already showed event time T, windows starting at or before T are never
  emitted (they would be partial).
  window_start and window_end are the window's bounds in the attribute's own form (ISO-8601 UTC
  text for timestamps, epoch seconds for numbers).
- Aggregates ignore null values: count is the number of non-null values, avg/sum/min/max/firstval/
  lastval are computed over the non-null values (null when there are none). firstval/lastval
  follow stream order for tuple windows and (event time, stream order) for time windows.
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from pep.runtime.compile import CompiledWindow


ISO_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def iso_utc(seconds: float) -> str:
    """ISO-8601 UTC text with microseconds and a Z suffix: the form the gateway's ingest writes."""
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime(ISO_FORMAT)


class _Accumulator:
    __slots__ = ("count", "total", "low", "high", "first", "first_key", "last", "last_key")

    def __init__(self) -> None:
        self.count = 0
        self.total: Any = 0
        self.low: Any = None
        self.high: Any = None
        self.first: Any = None
        self.first_key: Any = None
        self.last: Any = None
        self.last_key: Any = None

    def add(self, value: Any, key: Any) -> None:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        self.count += 1
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self.total += value
        if self.low is None or value < self.low:
            self.low = value
        if self.high is None or value > self.high:
            self.high = value
        if self.first_key is None or key < self.first_key:
            self.first, self.first_key = value, key
        if self.last_key is None or key >= self.last_key:
            self.last, self.last_key = value, key

    def result(self, function: str) -> Any:
        if function == "count":
            return self.count
        if self.count == 0:
            return None
        if function == "sum":
            return self.total
        if function == "avg":
            return self.total / self.count
        if function == "min":
            return self.low
        if function == "max":
            return self.high
        if function == "firstval":
            return self.first
        if function == "lastval":
            return self.last
        raise ValueError(f"unknown aggregate function {function!r}")


class _OpenWindow:
    __slots__ = ("start", "end", "accs", "rows")

    def __init__(self, start: Any, end: Any, attributes: tuple[str, ...]) -> None:
        self.start = start
        self.end = end
        self.accs = {a: _Accumulator() for a in attributes}
        self.rows = 0

    def add(self, row: dict, key: Any) -> None:
        self.rows += 1
        for attr, acc in self.accs.items():
            acc.add(row.get(attr), key)

    def output(self, spec: CompiledWindow, start: Any, end: Any) -> dict:
        out = {"window_start": start, "window_end": end}
        for attr, function, name in spec.aggregates:
            out[name] = self.accs[attr].result(function)
        return out


def _attributes(spec: CompiledWindow) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a for a, _, _ in spec.aggregates))


class TupleWindows:
    """Count-based sliding windows over the filtered tuples in stream order."""

    def __init__(self, spec: CompiledWindow) -> None:
        assert spec.kind == "tuple"
        self.spec = spec
        self.attributes = _attributes(spec)
        self.seen = 0
        self.open: dict[int, _OpenWindow] = {}

    def add(self, rows: list[dict]) -> list[dict]:
        size, step = self.spec.size, self.spec.step
        emitted: list[dict] = []
        for row in rows:
            i = self.seen
            self.seen += 1
            first_k = max(0, -((size - 1 - i) // step))  # ceil((i - size + 1) / step)
            for k in range(first_k, i // step + 1):
                window = self.open.get(k)
                if window is None:
                    window = self.open[k] = _OpenWindow(k * step, k * step + size - 1,
                                                        self.attributes)
                window.add(row, i)
                if i == window.end:
                    emitted.append(window.output(self.spec, window.start, window.end))
                    del self.open[k]
        return emitted


class TimeWindows:
    """Event-time sliding windows aligned to the epoch, closed by the stream's watermark."""

    def __init__(self, spec: CompiledWindow, not_before: float | None = None) -> None:
        assert spec.kind == "time"
        self.spec = spec
        self.attributes = _attributes(spec)
        self.open: dict[int, _OpenWindow] = {}
        self.closed_until = -math.inf
        # Windows starting at or before this event time were partly seen before attach.
        self.not_before = not_before
        self.late = 0
        self.arrivals = 0

    def add(self, rows: list[dict], times: list[float | None]) -> None:
        size, step = self.spec.size, self.spec.step
        for row, t in zip(rows, times):
            if t is None:
                continue
            self.arrivals += 1
            key = (t, self.arrivals)
            accepted = True  # a tuple in a gap between windows (step > size) is not late
            for k in range(math.floor((t - size) / step) + 1, math.floor(t / step) + 1):
                start = k * step
                end = start + size
                if end <= self.closed_until:
                    accepted = False
                    continue
                if self.not_before is not None and start <= self.not_before:
                    accepted = True  # belongs to a suppressed partial window: not late
                    continue
                window = self.open.get(k)
                if window is None:
                    window = self.open[k] = _OpenWindow(start, end, self.attributes)
                window.add(row, key)
                accepted = True
            if not accepted:
                self.late += 1

    def advance(self, watermark: float | None) -> list[dict]:
        if watermark is None or watermark <= self.closed_until:
            return []
        self.closed_until = watermark
        emitted = []
        for k in sorted(k for k, w in self.open.items() if w.end <= watermark):
            window = self.open.pop(k)
            if window.rows < self.spec.min_count:
                continue  # too few tuples to show without showing them
            if self.spec.time_is_timestamp:
                emitted.append(window.output(self.spec, iso_utc(window.start),
                                             iso_utc(window.end)))
            else:
                emitted.append(window.output(self.spec, window.start, window.end))
        return emitted
