"""What the driver finishes, produced to plan topics by the driver: windows (their panes are
combined on the driver, `windows/pane_windows.py`), unions of grants (their members' rows merged
on the driver, `query/union.py`) and rows given again by a replay. One confluent-kafka producer
per runtime (idempotent, acks=all, retried for as long as it takes: a broker away holds the
stream's routing, never drops a window), flushed at the end of every routed batch, so a batch
counts as delivered only once its rows are on the brokers.

Keys are the row plans' (`topic_rows.py`): `m:<epoch>:<batch>:<i>`, i counted per destination
(a plan's lane of a topic, `pep.delivery.lanes`; behind `<lane>|`) and batch in the order the
rows were produced (stream order, windows in the order they close).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from pep.core.rows import RowBatch
from pep.delivery.lanes import kafka_topic, lane_key, lane_of

log = logging.getLogger(__name__)

FLUSH_STEP = 1.0  # seconds per flush call while waiting for the brokers


class DriverRows:
    """The driver's producer of plan-topic records (the module docstring). `client`: its
    librdkafka settings (`DeliverySettings.client()`); `reader`: those of a consumer of the
    plan topics under the same identity (a stopped real-time query's last records are read
    back, `pep.runtime.query.realtime_mode`)."""

    def __init__(self, client: dict[str, Any], reader: dict[str, Any] | None = None) -> None:
        from confluent_kafka import Producer

        self.reader = reader

        settings = {**client, "acks": "all", "enable.idempotence": True, "linger.ms": 1,
                    "message.timeout.ms": 0,  # never give a record up: the brokers come back
                    "logger": logging.getLogger("pep.runtime.delivery.kafka")}
        self._producer = Producer(settings)
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}  # (destination, prefix) -> rows so far
        self._errors: list[str] = []
        self.produced = 0

    def produce(self, topics: Iterable[str], batch: RowBatch, prefix: str) -> None:
        """`batch`'s rows to each of `topics`, keyed after the rows already produced to that
        topic under `prefix` (one micro-batch's)."""
        if not batch.rows:
            return
        with self._lock:
            for topic in sorted(set(topics)):
                start = self._counts.get((topic, prefix), 0)
                for i, text in enumerate(batch.rows, start):
                    self._send(topic, text, f"{prefix}{i}")
                self._counts[(topic, prefix)] = start + len(batch.rows)
                self.produced += len(batch.rows)

    def _send(self, dest: str, value: str, key: str) -> None:
        topic, record_key = kafka_topic(dest), lane_key(lane_of(dest), key.encode("ascii"))
        while True:
            try:
                self._producer.produce(topic, value.encode("utf-8"), record_key,
                                       on_delivery=self._report)
                return
            except BufferError:  # the local queue is full: let the brokers take some first
                self._producer.poll(0.1)

    def _report(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._errors.append(str(err))

    def flush(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """Wait until every record produced so far is acknowledged (while the brokers are
        away: until they are back, or `stopping()`); then forget the batches' counts."""
        warned = False
        while self._producer.flush(FLUSH_STEP) > 0:
            if stopping():
                return
            if not warned:
                log.warning("plan topics: the driver's rows wait for the brokers")
                warned = True
        if warned:
            log.info("plan topics: the driver's rows were written after the brokers came back")
        with self._lock:
            self._counts.clear()
            errors, self._errors = self._errors, []
        if errors:  # not retriable (a topic deleted meanwhile: its handles ended)
            log.warning("plan topics: %d record(s) of the driver were refused (%s)",
                        len(errors), errors[0])

    def close(self) -> None:
        self._producer.flush(5.0)


__all__ = ["DriverRows"]
