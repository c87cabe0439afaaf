"""Repeated warnings, rate-limited and summed up: one line, then one summary per period.

Under load a warning that fires per micro-batch or per request floods the log (issue 42: 477 of
752 lines in ten minutes were the same "falling behind"), and the flood hides everything else.
A record that may repeat says so with `extra=repeating(label, value)`: `label` names what
repeats (the same label for the same condition: "stream weather is falling behind"), `value` an
optional measure of each occurrence (seconds). `RepeatSummary`, a filter on the gateway's log
handler (`common.logs.configure_logging`), lets the first record of a label through as it is,
holds the next ones for `period` seconds, and then writes one line at the first record's level:
"stream weather is falling behind: 37 times in the last 60 s, worst 2.1 s". While the records
keep coming, a summary per period; one period without any ends it, and the next record is
written in full again. Records without a label pass untouched.

Written here rather than taken from a library: the standard library's logging has no such
filter, and what exists elsewhere drops repeats (log4j's BurstFilter, rate limiters) instead
of counting them, which would make the log say less than what happened.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

REPEAT = "xsg_repeat"  # LogRecord attribute: the label of a record that may repeat
VALUE = "xsg_repeat_value"  # LogRecord attribute: that occurrence's measure (seconds)
DEFAULT_PERIOD = 60.0


def repeating(label: str, value: float | None = None) -> dict[str, Any]:
    """`extra=` for a log call whose record may repeat (see the module docstring)."""
    return {REPEAT: label, VALUE: value}


@dataclass
class _Window:
    """One label's current period: since when, how many records, the largest value."""

    started: float
    level: int
    name: str
    count: int = 0
    worst: float | None = None
    continued: bool = False  # a period after a summary: every record of it is held back


class RepeatSummary(logging.Filter):
    """The filter (see the module docstring). `emit(record)` writes a summary (the handler's
    `handle`); `clock` is monotonic seconds. A timer per label ends its period, so that a
    summary does not wait for a next record (`timers=False`: only `due()` ends periods);
    `flush()` ends every period now."""

    def __init__(self, emit: Callable[[logging.LogRecord], Any],
                 period: float = DEFAULT_PERIOD,
                 clock: Callable[[], float] = time.monotonic, timers: bool = True) -> None:
        super().__init__()
        if not period > 0:
            raise ValueError("the period must be a positive number of seconds")
        self._emit = emit
        self.period = float(period)
        self._clock = clock
        self._timers = timers
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}
        self._pending: dict[str, threading.Timer] = {}
        self._closed = False

    def filter(self, record: logging.LogRecord) -> bool:
        label = getattr(record, REPEAT, None)
        if not isinstance(label, str):
            return True
        value = getattr(record, VALUE, None)
        with self._lock:
            window = self._windows.get(label)
            first = window is None
            if window is None:
                window = self._open(label, _Window(self._clock(), record.levelno, record.name))
            window.count += 1
            if isinstance(value, (int, float)):
                window.worst = value if window.worst is None else max(window.worst, value)
        return first

    def due(self) -> None:
        """End the periods that are over: a summary for each that held records back."""
        self._end(lambda label, window, now: now - window.started >= self.period)

    def flush(self) -> None:
        """End every period now (the process is stopping): no count is lost."""
        self._end(lambda label, window, now: True)

    def close(self) -> None:
        """Flush, and start no more timers."""
        with self._lock:
            self._closed = True
            timers, self._pending = list(self._pending.values()), {}
        for timer in timers:
            timer.cancel()
        self.flush()

    def _open(self, label: str, window: _Window) -> _Window:
        self._windows[label] = window
        if self._timers and not self._closed:
            timer = threading.Timer(self.period, self._end,
                                    args=(lambda lb, w, now: w is window,))
            timer.daemon = True
            timer.name = "xsg-log-repeats"
            old = self._pending.pop(label, None)
            if old is not None:
                old.cancel()
            self._pending[label] = timer
            timer.start()
        return window

    def _end(self, over: Callable[[str, _Window, float], bool]) -> None:
        summaries = []
        with self._lock:
            now = self._clock()
            for label, window in list(self._windows.items()):
                if not over(label, window, now):
                    continue
                held = window.count - (0 if window.continued else 1)
                if held > 0:
                    summaries.append(self._summary(label, window, now))
                    # records are still coming: a new period, each of its records held back
                    self._open(label, _Window(now, window.level, window.name, continued=True))
                else:
                    del self._windows[label]
                    self._pending.pop(label, None)
        for record in summaries:
            self._emit(record)

    @staticmethod
    def _summary(label: str, window: _Window, now: float) -> logging.LogRecord:
        elapsed = max(now - window.started, 0.0)
        span = f"{elapsed:.0f}" if elapsed >= 10 else f"{elapsed:.1f}"
        text = (f"{label}: {window.count} time{'s' if window.count != 1 else ''} in the last "
                f"{span} s")
        if window.worst is not None:
            text += f", worst {window.worst:.1f} s"
        return logging.LogRecord(window.name, window.level, __file__, 0, text, None, None)


__all__ = ["DEFAULT_PERIOD", "REPEAT", "VALUE", "RepeatSummary", "repeating"]
