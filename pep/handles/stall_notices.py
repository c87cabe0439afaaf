"""Tell a stream's readers when its query stalls or fails, and when it runs again.

The runtime knows when a stream's input has waited longer than the stall bound without a
completed micro-batch (`StreamRuntime.health()`: state `stalled`, or `failed` after an error);
the readers of its handles would otherwise see only silence (issue 15). On every transition each
live handle of that stream gets a notice in its buffer, which its readers receive in order with
the rows: `stalled` (NDJSON `{"event": "stalled", "stream": ..., "state": "stalled"|"failed",
"last_batch_at": ..., "detail": ...}`, SSE `event: stalled`) and later `resumed`. Handles are not
ended by a stall: the query may recover, and a reader that wants to give up can release its handle.

Listeners (`add_listener`) get the streams stalled or failed now after every check: with
delivery through plan topics, the edges are told from there (`pep.delivery.control.
StreamNotices`).

Polled from the re-evaluation timer (once a second by default), so a notice follows the runtime's
verdict by at most that interval.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol, TypedDict

from common.errors import described
from pep.handles.buffer import HandleBuffer
from pep.handles.records import HandleRecord
from pep.ports import StreamReport

log = logging.getLogger(__name__)

TROUBLE = ("stalled", "failed")


class StallNotice(TypedDict):
    """What a stalled (or failed) stream's readers are told (`stalled`)."""

    stream: str
    state: str
    last_batch_at: str | None
    detail: str


class ResumeNotice(TypedDict):
    """What they are told when it runs again (`resumed`): its state as the runtime reports
    it (None: the runtime reports none)."""

    stream: str
    state: str | None


class _Handles(Protocol):
    def live(self) -> list[HandleRecord]: ...

    def buffer(self, handle_id: str) -> HandleBuffer | None: ...


class StallNotices:
    """Compares each stream's runtime state with the last one seen and notifies on change."""

    def __init__(self, health: Callable[[], StreamReport], handles: _Handles) -> None:
        self._health = health
        self._handles = handles
        self._troubled: dict[str, StallNotice] = {}  # stream -> the notice sent
        self._listeners: list[Callable[[dict[str, tuple[str, str | None]]], None]] = []

    def add_listener(self, listener: Callable[[dict[str, tuple[str, str | None]]], None]
                     ) -> None:
        """`listener(troubled)` after every check: stream -> (state, last batch's time) of
        the streams stalled or failed now."""
        self._listeners.append(listener)

    def troubled(self) -> dict[str, StallNotice]:
        """Streams stalled or failed at the last check, with what their readers were told."""
        return dict(self._troubled)

    def check(self) -> None:
        try:
            health = self._health() or {}
        except Exception as exc:  # noqa: BLE001 - the runtime is stopping or not started; nothing to tell
            log.debug("runtime health unavailable: %s", described(exc))
            return
        changes: dict[str, tuple[str, StallNotice | ResumeNotice]] = {}
        for stream, state in health.items():
            kind = state.get("state")
            if kind in TROUBLE and stream not in self._troubled:
                notice: StallNotice = {
                    "stream": stream, "state": kind,
                    "last_batch_at": _iso(state.get("last_batch_at")),
                    "detail": state.get("last_error")
                    or "input has waited longer than the stall bound without a "
                       "completed micro-batch"}
                self._troubled[stream] = notice
                changes[stream] = ("stalled", notice)
            elif kind not in TROUBLE and stream in self._troubled:
                del self._troubled[stream]
                changes[stream] = ("resumed", {"stream": stream, "state": kind})
        for stream in [s for s in self._troubled if s not in health]:
            # the stream's query is gone (its last handle left, or the runtime stopped)
            del self._troubled[stream]
        if changes:
            self._notify(changes, self._handles.live())
        if self._listeners:
            now = {s: (n["state"], n["last_batch_at"]) for s, n in self._troubled.items()}
            for listener in self._listeners:
                try:
                    listener(now)
                except Exception:
                    log.exception("a stall listener failed")

    def _notify(self, changes: dict[str, tuple[str, StallNotice | ResumeNotice]],
                live: Iterable[HandleRecord]) -> None:
        for record in live:
            change = changes.get(record.stream)
            if change is None:
                continue
            buffer = self._handles.buffer(record.id)
            if buffer is not None:
                buffer.notice(*change)
        for stream, (kind, data) in changes.items():
            log.info("stream %s: readers told %s (%s)", stream, kind, data["state"])


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


__all__ = ["ResumeNotice", "StallNotice", "StallNotices"]
