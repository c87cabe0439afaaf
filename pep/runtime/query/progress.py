"""The rows each stream query read, from Spark's own progress reports.

A micro-batch's `numInputRows` is in the progress Spark reports after the batch, for free. The
runtime used to count a batch's rows itself with `DataFrame.observe` in every micro-batch: a
DataFrame analysed per batch, a metrics node in the job, and a wait for its result, ~25 ms of
a Kafka batch of 10,000 records. A Kafka source has no stream positions (`_xsg_seq`), so its
rows count is all the observation gave: its queries take the count from here instead (sources
with positions still observe their highest one; see `query/runner.py`).

One listener per SparkSession, shared by its queries; each query registers its name before it
starts (a name, not an id: the first progress can come before `start()` returned the id).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener

from common.errors import described

log = logging.getLogger(__name__)

RowsRead = Callable[[int], None]


class _Progress(StreamingQueryListener):
    """Hands each reported batch's input rows to the callback registered for its query."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: dict[str, RowsRead] = {}

    def register(self, name: str, callback: RowsRead) -> None:
        with self._lock:
            self._callbacks[name] = callback

    def unregister(self, name: str) -> None:
        with self._lock:
            self._callbacks.pop(name, None)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        with self._lock:
            callback = self._callbacks.get(progress.name)
        if callback is None:
            return
        try:
            callback(int(progress.numInputRows or 0))
        except Exception as exc:  # noqa: BLE001 - a figure must not break Spark's listener bus
            log.error("query %s: progress not counted: %s", progress.name, described(exc))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


_LISTENER_ATTRIBUTE = "_xsg_progress_listener"
_LISTENERS_LOCK = threading.Lock()


def query_progress(spark: SparkSession) -> _Progress:
    """The session's progress listener (added to it on first use, kept on the session)."""
    with _LISTENERS_LOCK:
        listener = getattr(spark, _LISTENER_ATTRIBUTE, None)
        if listener is None:
            listener = _Progress()
            spark.streams.addListener(listener)
            setattr(spark, _LISTENER_ATTRIBUTE, listener)
        return listener


__all__ = ["RowsRead", "query_progress"]
