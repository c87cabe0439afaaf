"""Micro-batches that took longer than their trigger interval ("falling behind"), for the log.

Spark says so itself at every such trigger (`ProcessingTimeExecutor`: a WARN line per batch; under
load most of the gateway's log, issue 42). That line is switched off (log4j2.properties) and the
same figure is read here instead: the trigger's duration in Spark's progress report of the batch
(`batchDuration`), off the micro-batch path. The runtime's janitor asks every few seconds for the
reports of the batches since its last look (`StreamingQuery.recentProgress`: Spark keeps the
last 100 of each query) and logs each late batch as a warning marked as repeating
(`common.log_repeats`): the gateway's log writes the first in full, then once a minute how often it
happened and the worst ("stream weather is falling behind: 37 times in the last 60 s, worst
2.1 s").

A query run's start is not counted (its first batch and the triggers before it that found
nothing to read): it plans the query, generates its code and opens its sources (0.3-1.5 s
measured for a new Kafka stream's query against a 0.25 s trigger), which is the start of a
query, not a query falling behind; a backlog it cannot work off shows in the batches after it.

The shared query (`pep/runtime/shared/`) is measured against the longest interval its adaptive
trigger may choose (`shared_trigger_max`), less the time it held a batch on purpose (the
trigger's pause, which Spark counts in the batch); each stream that brought tuples to a late
batch is named, as its own query would be.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from common.errors import described
from common.log_repeats import repeating

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LateBatch:
    """A micro-batch whose trigger took longer than the trigger interval."""

    query: str  # the query's name
    batch_id: int
    seconds: float


class LateBatches:
    """Finds the late batches of a session's running queries since the last look: those longer
    than `trigger_interval` seconds (`limit`: what that bound is, for the log), less what
    `held(batch id)` says the query held the batch on purpose."""

    def __init__(self, trigger_interval: float, limit: str = "the trigger interval",
                 held: Callable[[int], float] | None = None, retained: int = 100) -> None:
        self.trigger_interval = float(trigger_interval)
        # how many reports Spark keeps per query (spark.sql.streaming.numRecentProgressUpdates):
        # fewer than that and the reports held go back to the run's first trigger
        self.retained = retained
        self.limit = limit
        self._held = held
        # query name -> the start of the last trigger looked at (ISO-8601 UTC text, which
        # orders as time does; not the batch id: an idle trigger reports the id of the batch
        # that has not run yet, and that batch's own report comes later under the same id)
        self._seen: dict[str, str] = {}

    def since_last(self, queries: Iterable[Any]) -> list[LateBatch]:
        """The late batches among `queries` (PySpark `StreamingQuery`s) reported since the last
        call, oldest first; a query seen for the first time counts from its first report."""
        late: list[LateBatch] = []
        seen: dict[str, str] = {}
        for query in queries:
            try:
                name = str(query.name)
                reports = query._jsq.recentProgress()  # the JVM's array: read from its end
                last = self._seen.get(name, "")
                newest, found = last, []
                start = _start(reports) if len(reports) < self.retained else -1
                for i in range(len(reports) - 1, -1, -1):
                    report = reports[i]
                    started = str(report.timestamp())
                    if started <= last:
                        break
                    newest = max(newest, started)
                    if i <= start:
                        continue  # the query's start, see above
                    seconds = int(report.batchDuration()) / 1000.0
                    batch_id = int(report.batchId())
                    if self._held is not None:
                        seconds = max(0.0, seconds - self._held(batch_id))
                    if seconds > self.trigger_interval:
                        found.append(LateBatch(name, batch_id, seconds))
            except Exception as exc:  # noqa: BLE001 - a query stopping meanwhile has nothing to say
                log.debug("progress of a query not read: %s", described(exc))
                continue
            seen[name] = newest
            late.extend(reversed(found))
        self._seen = seen  # queries no longer running are forgotten
        return late

    def log(self, queries: Iterable[Any], describe: Callable[[LateBatch], list[str]]) -> int:
        """Log each late batch of `queries`; `describe(batch)` says what it served, a warning
        each (["stream weather"]; none for a query that is not the gateway's). Returns how many
        were logged."""
        logged = 0
        for batch in self.since_last(queries):
            for what in describe(batch):
                log.warning("%s is falling behind: micro-batch %d took %.1f s, longer than %s "
                            "(%.2f s)", what, batch.batch_id, batch.seconds, self.limit,
                            self.trigger_interval,
                            extra=repeating(f"{what} is falling behind", batch.seconds))
                logged += 1
        return logged


def _start(reports: Any) -> int:
    """The index of the last report of a query run's start among its reports (a JVM array,
    oldest first, back to the run's first trigger): that of its first batch that ran
    (`addBatch` timed), the triggers before it having found nothing to read (reported under
    the id of the batch still to come); all of them while no batch ran."""
    for i in range(len(reports)):
        if reports[i].durationMs().containsKey("addBatch"):
            return i
    return len(reports) - 1


__all__ = ["LateBatch", "LateBatches"]
