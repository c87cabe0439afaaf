"""A handle stream read on a thread of its own, for callers that must not block on the socket:
batches that leave on time (`HandleStream.batches`), the Spark data source (whose driver asks
"what is there now?" at every trigger).

The thread iterates the stream's events into a bounded queue, in the groups they come in (a
chunk read from the socket: up to ~1,000 events, one queue operation for them all); the caller
takes what is there (`poll`), waiting at most the time it says. A full queue stops the thread
reading, so the socket is not read either and the gateway holds the rows (or, past its buffer,
reports a gap): memory stays bounded whatever the rate. An error of the reader (a refusal,
`ConnectionLost`) is raised to the caller by the `poll` that reaches it.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from xsg_client.events import Event, Row

if TYPE_CHECKING:
    from xsg_client.client import HandleStream

MAX_QUEUED = 64  # groups of events (chunks read) between the thread and the caller


class _Finished:
    """The thread's last item: the stream ended (`error`: how it failed, if it did)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class Tail:
    """Reads `stream` on a daemon thread (started by `start()` or `with`); `poll` takes events."""

    def __init__(self, stream: HandleStream, max_queued: int = MAX_QUEUED) -> None:
        self.stream = stream
        self._queue: queue.Queue[list[Event] | _Finished] = queue.Queue(max_queued)
        self._thread = threading.Thread(target=self._run, name="xsg-client-tail", daemon=True)
        self._closing = threading.Event()
        self._left: list[Event] = []  # of a group a poll took only part of
        self.finished = False  # the stream's last event was taken

    def __enter__(self) -> Tail:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self._thread.start()

    def _put(self, item: list[Event] | _Finished) -> bool:
        while not self._closing.is_set():
            try:
                self._queue.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        error: BaseException | None = None
        groups = self.stream._groups()
        try:
            for group in groups:
                if not self._put(group):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by poll()
            error = exc
        finally:
            groups.close()
        self._put(_Finished(error))

    def poll(self, timeout: float, max_events: int = 10_000) -> list[Event]:
        """The events there are, at most `max_events`, waiting up to `timeout` seconds for the
        first; [] when none came or the stream has finished (`finished`)."""
        out: list[Event] = []
        if self.finished:
            return out
        if self._left:
            out, self._left = self._left[:max_events], self._left[max_events:]
            if self._left:
                return out
        wait = timeout if not out and timeout > 0 else None
        while len(out) < max_events:
            try:
                item = self._queue.get(timeout=wait) if wait else self._queue.get_nowait()
            except queue.Empty:
                return out
            wait = None
            if isinstance(item, _Finished):
                self.finished = True
                if item.error is not None:
                    raise item.error
                return out
            room = max_events - len(out)
            out += item[:room]
            self._left = item[room:]
        return out

    def row_groups(self, max_rows: int, max_wait: float,
                   on_event: Callable[[Event], None] | None = None
                   ) -> Iterator[tuple[list[dict[str, Any]], list[int]]]:
        """Rows in groups (with their event ids): a group once `max_rows` came, or `max_wait`
        seconds after its first row, or when the stream ends; other events to `on_event`."""
        if max_rows < 1 or max_wait < 0:
            raise ValueError("max_rows must be at least 1 and max_wait at least 0")
        rows: list[dict[str, Any]] = []
        ids: list[int] = []
        first_at = 0.0
        while not self.finished:
            # nothing pending: wait for a first row (a second at a time, so that the loop
            # sees the stream finish); else until the pending group is due
            wait = 1.0 if not rows else max(0.0, first_at + max_wait - time.monotonic())
            for event in self.poll(wait, max_rows - len(rows)):
                if type(event) is Row:
                    if not rows:
                        first_at = time.monotonic()
                    rows.append(event.values)
                    ids.append(event.id)
                elif on_event is not None:
                    on_event(event)
            if rows and (len(rows) >= max_rows or self.finished
                         or time.monotonic() >= first_at + max_wait):
                yield rows, ids
                rows, ids = [], []

    def close(self) -> None:
        """Stop the thread (its connection is closed) and wait for it a moment."""
        self._closing.set()
        self.stream.close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)


__all__ = ["Tail", "MAX_QUEUED"]
