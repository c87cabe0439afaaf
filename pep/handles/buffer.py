"""A handle's bounded buffer of results, read by cursors.

A `HandleBuffer` holds at most `max_rows` rows and `max_bytes` of their JSON; when full, the
OLDEST rows are dropped. Readers are cursors (the id of the last event they saw), not consumers:
a reader that reconnects with `Last-Event-ID` gets what followed, and if some of that was
dropped meanwhile it first gets a `gap` event saying how many rows it lost. A reader that is
reading (inside `read`, or left it less than `READER_STALL` seconds ago) is not overrun by one
large delivery: `put` waits for it to take the rows about to be dropped, at most `MAX_PUT_WAIT`
seconds per delivery (a reader that does not keep up within that bound loses rows, so one slow
reader can hold its stream's shared query back by that much at most). Event ids grow
strictly per handle, also across restarts: after the n-th restart ids start at n * 2**40, so a
reader resuming with an id from before a restart gets a `gap` with an unknown count (the rows in
memory died with the process). Closing the buffer (revocation, release) DISCARDS rows not yet
read, then appends the final event: nothing of a revoked handle is delivered after the
revocation returns.
"""
from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

from pep.core.rows import RowBatch, row_json

DEFAULT_MAX_ROWS = 10_000
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
# A micro-batch can deliver far more rows than a buffer keeps (a tuple window with step 1 gives
# one row per tuple, and one ingest file holds up to 100,000). Without waiting, a reader that
# keeps up lost all but the last `max_rows` of every such delivery (issue 15).
READER_STALL = 2.0    # seconds without a read after which a reader counts as away
MAX_PUT_WAIT = 5.0    # the longest one delivery waits for readers before dropping rows
GENERATION_SPAN = 2 ** 40  # event ids of generation g are in (g * span, (g + 1) * span]

# `shutdown` closes readers when the process stops; the handle itself stays live and resumes.
FINAL_EVENTS = ("revoked", "released", "ended", "shutdown")


@dataclass(frozen=True)
class Event:
    """One thing a reader receives: a row (`kind == "row"`), a `gap`, or a final event
    (`revoked`, `released`, `ended`); `data` is JSON text."""

    id: int
    kind: str
    data: str

    @property
    def final(self) -> bool:
        return self.kind in FINAL_EVENTS


class HandleBuffer:
    """Bounded, thread-safe ring of one handle's results (see the module docstring)."""

    def __init__(self, max_rows: int = DEFAULT_MAX_ROWS, max_bytes: int = DEFAULT_MAX_BYTES,
                 generation: int = 0) -> None:
        if max_rows < 1 or max_bytes < 1:
            raise ValueError("a buffer must hold at least one row")
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.base = generation * GENERATION_SPAN
        self._cond = threading.Condition(threading.Lock())
        self._rows: deque[tuple[int, str]] = deque()
        self._bytes = 0
        self._last = self.base  # id of the newest event
        self._floor = self.base  # every row id <= floor has been dropped (or never existed)
        self._final: Event | None = None
        self.dropped = 0  # rows dropped because the buffer was full
        self.reader_stall = READER_STALL
        self.max_put_wait = MAX_PUT_WAIT
        self._read_upto = self.base  # the newest row id handed to a reader
        self._reading = 0  # readers inside read() now
        self._last_read = -math.inf  # monotonic time a reader last left read()

    @property
    def closed(self) -> bool:
        return self._final is not None

    @property
    def last_id(self) -> int:
        return self._last

    def __len__(self) -> int:
        with self._cond:
            return len(self._rows)

    def put(self, rows: RowBatch | Iterable[dict]) -> bool:
        """Append result rows; False once the buffer is closed (the runtime then stops sending).

        The closed check and the write happen under one lock, the same one `close` takes: that
        is the check-before-each-write that makes revocation exact.
        """
        if isinstance(rows, RowBatch):
            encoded = rows.rows  # encoded once by the runtime, shared with the plan's other handles
        else:
            encoded = [row_json(r) for r in rows]  # outside the lock: encoding can be slow
        with self._cond:
            if self._final is not None:
                return False
            deadline = None
            for text in encoded:
                size = len(text.encode("utf-8")) if not text.isascii() else len(text)
                # the oldest row is about to be dropped before a reading reader took it: wait
                while (self._rows and self._rows[0][0] > self._read_upto
                       and (len(self._rows) >= self.max_rows
                            or self._bytes + size > self.max_bytes)):
                    now = time.monotonic()
                    deadline = now + self.max_put_wait if deadline is None else deadline
                    if (not self._reading and now - self._last_read > self.reader_stall) \
                            or now >= deadline:
                        break  # no reader, or it stopped reading: drop, as for a slow reader
                    self._cond.notify_all()
                    self._cond.wait(min(self.reader_stall, deadline - now))
                    if self._final is not None:
                        return False  # closed meanwhile: close() discarded what was written
                self._last += 1
                self._rows.append((self._last, text))
                self._bytes += size
                while self._rows and (len(self._rows) > self.max_rows
                                      or self._bytes > self.max_bytes):
                    rid, old = self._rows.popleft()
                    self._bytes -= len(old.encode("utf-8")) if not old.isascii() else len(old)
                    self._floor = rid
                    self.dropped += 1
            if encoded:
                self._cond.notify_all()
            return True

    def close(self, kind: str, reason: str | None = None) -> bool:
        """Discard unread rows and append the final event; False if it was already closed."""
        with self._cond:
            if self._final is not None:
                return False
            self._rows.clear()
            self._bytes = 0
            self._floor = self._last
            self._last += 1
            self._final = Event(self._last, kind, json.dumps({"event": kind, "reason": reason}))
            self._cond.notify_all()
            return True

    def read(self, after: int | None = None, timeout: float | None = None,
             limit: int = 1000) -> list[Event]:
        """Events after the id `after` (None or 0: from the oldest kept row), waiting up to
        `timeout` seconds for one; [] on timeout. A `gap` event comes first when rows the reader
        had not seen were dropped. After the final event nothing more ever comes."""
        after = self.base if after is None or after < 0 else after
        with self._cond:
            self._reading += 1
            try:
                events = self._read(after, timeout, limit)
            finally:
                self._reading -= 1
                self._last_read = time.monotonic()
            rows = [e.id for e in events if e.kind == "row"]
            if rows and rows[-1] > self._read_upto:
                self._read_upto = rows[-1]
                self._cond.notify_all()  # a put may be waiting for this reader
            return events

    def _read(self, after: int, timeout: float | None, limit: int) -> list[Event]:
        if self._final is None and after > self._last:
            after = self._last  # an id this buffer never issued: read from now on
        if not self._has_after(after):
            self._cond.wait_for(lambda: self._has_after(after), timeout)
        events: list[Event] = []
        if self._final is not None:
            if after < self._final.id:
                events.append(self._final)
            return events
        if after < self._floor:
            lost = self._floor - after if after >= self.base else None
            events.append(Event(self._floor, "gap", json.dumps(
                {"event": "gap", "lost": lost, "resume_from": self._floor,
                 "reason": "buffer full" if lost is not None else "gateway restarted"})))
        start = max(after, self._floor)
        if self._rows:
            first = self._rows[0][0]
            index = start + 1 - first
            for i in range(max(index, 0), min(len(self._rows), max(index, 0) + limit)):
                rid, text = self._rows[i]
                events.append(Event(rid, "row", text))
        return events

    def _has_after(self, after: int) -> bool:
        if self._final is not None:
            return after < self._final.id
        return after < self._last and self._last > self.base


__all__ = ["HandleBuffer", "Event", "RowBatch", "row_json", "FINAL_EVENTS", "GENERATION_SPAN",
           "DEFAULT_MAX_ROWS", "DEFAULT_MAX_BYTES"]
