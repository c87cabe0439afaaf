"""New plan topics made known to Spark's Kafka producer before their first rows.

Spark's Kafka sink writes with a Java producer that, on its first record for a topic it has not
written to, blocks the task until it has fetched that topic's metadata: one round trip per new
topic, one after the other inside the task. A micro-batch with rows for 1,000 plan topics made a
moment before spent 5-13 s on that alone on this project's machine (a write of the same records
again: 0.2 s), so a fresh gateway's readers waited seconds behind its first batches.

`TopicWarmer` takes that wait off the rows' path: as soon as a handle is attached with a topic
the runtime has not seen, the topic is queued, and a background thread writes one record to each
queued topic through Spark's Kafka sink with the very options the rows are written with (Spark
keeps one producer per set of options in each executor: the rows' producer is the one that
learnt the topics). Topics queued while one such write runs go together in the next ones, at
most `CHUNK` a write, each write one task: the stream's micro-batches keep a task slot. The
record is keyed `WARM_KEY` with an empty value: an edge skips it (`pep.edge.reader`), it is no
row and takes no event id's place in a reader's stream beyond its offset.

With a cluster of executors, a warm write's tasks run on some of them: the others' producers
still look topics up on the first rows (what they did without it). One topic the broker has
not made yet (it creates a topic's log a moment after the controller took the topic; 10,000
new topics on a loaded machine: "not present in metadata after 5000 ms") fails the whole
write: it is tried again (`TRIES`), then only logged (the rows' write looks the topics up
itself, as before).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from common.errors import described
from pep.delivery.lanes import kafka_topic
from pep.delivery.settings import WARM_KEY

log = logging.getLogger(__name__)

REMEMBERED = 100_000  # topics remembered as warmed (the oldest forgotten first)
TRIES = 3  # writes of a topic's record before giving up on it
RETRY_AFTER = 2.0  # seconds before a failed write is tried again
CHUNK = 100  # topics per warm write (one task each: `_write`)
JOB_GROUP = "xsg-topic-warm"  # Spark's job group of the warm writes


class TopicWarmer:
    """Writes one `WARM_KEY` record to each new plan topic, in the background (the module
    docstring). `options`: Spark's Kafka sink options, the rows' own."""

    def __init__(self, spark: Any, options: dict[str, str]) -> None:
        self._spark = spark
        self._options = dict(options)
        self._cond = threading.Condition()
        self._queued: list[str] = []
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._closed = False
        self._busy = False  # a write under way
        self._tries: dict[str, int] = {}  # failed writes per topic
        self.warmed = 0  # topics written to (observable)
        self._thread = threading.Thread(target=self._run, name="xsg-topic-warmer", daemon=True)
        self._thread.start()

    def add(self, dest: str) -> None:
        """Queue the Kafka topic of a plan's destination (`pep.delivery.lanes`) unless it was
        queued before (many handles share a plan's topic, many plans a topic)."""
        topic = kafka_topic(dest)
        with self._cond:
            if self._closed or topic in self._seen:
                return
            self._seen[topic] = None
            if len(self._seen) > REMEMBERED:
                self._seen.popitem(last=False)
            self._queued.append(topic)
            self._cond.notify()

    def idle(self, timeout: float) -> bool:
        """Wait until nothing is queued or being written; whether that came within `timeout`."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queued and not self._busy, timeout)

    def _run(self) -> None:
        # Spark's local properties are the thread's: every warm write of this thread is a job
        # of the group
        self._spark.sparkContext.setJobGroup(
            JOB_GROUP, "xsg: new plan topics made known to the producer")
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queued or self._closed)
                if self._closed:
                    return
                topics, self._queued = self._queued[:CHUNK], self._queued[CHUNK:]
                self._busy = True
            try:
                self._write(topics)
            except Exception as exc:  # noqa: BLE001 - the rows' write looks them up itself
                again = [t for t in topics if self._tries.get(t, 0) < TRIES - 1]
                for t in topics:
                    self._tries[t] = self._tries.get(t, 0) + 1
                if again:  # a broker still creating a topic's log fails the whole write
                    time.sleep(RETRY_AFTER)
                    with self._cond:
                        self._queued = again + self._queued
                else:
                    log.warning("plan topics: %d new topic(s) could not be made known to the "
                                "producer ahead of their rows: %s", len(topics),
                                described(exc))
            else:
                for t in topics:
                    self._tries.pop(t, None)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, topics: list[str]) -> None:
        """One write of at most `CHUNK` topics, in one task (a job of `JOB_GROUP`): its sends
        wait on a lookup each, so the task runs long while the broker is busy making topics, and the
        stream's micro-batches must keep a task slot meanwhile (the warm write of 5,000 topics
        in 8 tasks held both of a 2-core machine's slots for over 30 s, and the first
        micro-batch waited behind it)."""
        frame = self._spark.createDataFrame(
            [(t, WARM_KEY, b"") for t in topics], "topic string, key binary, value binary")
        frame.coalesce(1).write.format("kafka").options(**self._options).save()
        self.warmed += len(topics)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._queued = []
            self._cond.notify_all()
        self._thread.join(30)


__all__ = ["CHUNK", "JOB_GROUP", "WARM_KEY", "TopicWarmer"]
