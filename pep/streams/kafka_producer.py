"""Records appended through the gateway to a Kafka-backed stream go to its topic.

The owner's batch is validated exactly as for an `ingest` stream (`records.validate_records`:
every line before anything is sent, so bad input sends nothing), then each record is produced to
the stream's topic as a JSON object (no key: the client spreads records over the partitions)
with `acks=all` and idempotence, and the call returns only when the broker acknowledged every
record. The stream's query reads the topic like any producer's records, so owners may use the
gateway's API or their own producers.

When the broker refuses or does not acknowledge within `timeout` seconds, `Unavailable` (503)
says so: how many records of the batch were acknowledged, and the broker's error. Kafka has no
all-or-nothing write across partitions without transactions, so such a batch may be partly
written (resending it may duplicate those records).

One producer (confluent-kafka, librdkafka) per distinct client configuration serves every
request; a background thread serves its delivery reports, and each request waits only for its
own records.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pep.core.errors import Unavailable
from pep.core.plan import StreamDefinition
from pep.streams.records import CheckedRecord

if TYPE_CHECKING:  # confluent-kafka is imported with the first append, not before
    from confluent_kafka import KafkaError, Message

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 15.0  # seconds the broker has to acknowledge a batch
RETRY_AFTER = 5


@dataclass
class _Pending:
    """One request's records awaiting acknowledgement."""

    left: int
    errors: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def report(self, err: KafkaError | None, _msg: Message) -> None:
        with self.lock:
            if err is not None:
                self.errors.append(str(err))
            self.left -= 1
            if self.left <= 0:
                self.done.set()


class _Producer:
    """A confluent-kafka producer and the thread that serves its delivery reports."""

    def __init__(self, config: dict[str, str], timeout: float) -> None:
        from confluent_kafka import Producer

        self.timeout = timeout
        self.producer = Producer({
            **config,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            # a record not acknowledged by then is reported as failed (never retried later)
            "message.timeout.ms": int(timeout * 1000),
            # a topic the cluster does not know fails its records after this, not 30 s
            "topic.metadata.propagation.max.ms": int(min(timeout, 5.0) * 1000),
            "logger": logging.getLogger("xsg.kafka.producer"),
            # a broker that is away: one line per attempt, at most every few seconds
            "reconnect.backoff.ms": 500,
            "reconnect.backoff.max.ms": 5000,
        })
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="xsg-kafka-producer",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.producer.flush(2)


class KafkaAppender:
    """Produces validated records to Kafka-backed streams' topics (see the module docstring)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self._producers: dict[tuple[tuple[str, str], ...], _Producer] = {}
        self._lock = threading.Lock()

    def _producer(self, config: dict[str, str]) -> _Producer:
        key = tuple(sorted(config.items()))
        with self._lock:
            found = self._producers.get(key)
            if found is None:
                found = self._producers[key] = _Producer(config, self.timeout)
            return found

    def _drop(self, config: dict[str, str]) -> None:
        """Forget a producer that failed (a broker that is gone: it would retry and log for
        ever); the next append makes a new one. Closed on a thread of its own (its flush may
        wait for records that will time out)."""
        with self._lock:
            found = self._producers.pop(tuple(sorted(config.items())), None)
        if found is not None:
            threading.Thread(target=found.close, name="xsg-kafka-producer-close",
                             daemon=True).start()

    def append(self, definition: StreamDefinition, records: list[CheckedRecord]) -> int:
        """Produce `records` to the stream's topic; returns their number once the broker has
        acknowledged all of them, else Unavailable saying what happened."""
        try:
            return self._append(definition, records)
        except Unavailable:
            self._drop(self._config(definition)[0])
            raise

    @staticmethod
    def _config(definition: StreamDefinition) -> tuple[dict[str, str], str]:
        opts = dict(definition.source.options)
        config = {k[len("producer."):]: v for k, v in opts.items() if k.startswith("producer.")}
        config["bootstrap.servers"] = opts["bootstrap.servers"]
        return config, opts["subscribe"]

    def _append(self, definition: StreamDefinition, records: list[CheckedRecord]) -> int:
        from confluent_kafka import KafkaException

        config, topic = self._config(definition)
        where = (f"stream {definition.name!r} (Kafka topic {topic!r} at "
                 f"{config['bootstrap.servers']})")
        try:
            client = self._producer(config)
        except KafkaException as exc:
            raise Unavailable(f"{where}: the Kafka producer cannot be set up: {exc}",
                              retry_after=RETRY_AFTER) from None
        pending = _Pending(len(records))
        deadline = time.monotonic() + self.timeout
        sent = 0
        try:
            for record in records:
                value = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()
                while True:
                    try:
                        client.producer.produce(topic, value, on_delivery=pending.report)
                        break
                    except BufferError:  # the client's queue is full: let it drain
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.01)
                sent += 1
        except (BufferError, KafkaException) as exc:
            with pending.lock:
                pending.left -= len(records) - sent  # never produced: nothing will report them
                if pending.left <= 0:
                    pending.done.set()
            pending.done.wait(max(0.0, deadline - time.monotonic()))
            raise Unavailable(f"{where}: {sent} of {len(records)} records were handed to "
                              f"Kafka before it refused more ({exc}); "
                              f"{self._acknowledged(pending, sent)} were acknowledged",
                              retry_after=RETRY_AFTER) from None
        # message.timeout.ms bounds the wait; a little more for the report to arrive
        if not pending.done.wait(max(0.0, deadline - time.monotonic()) + 5.0):
            raise Unavailable(f"{where}: the broker did not acknowledge the records within "
                              f"{self.timeout:g} s ({self._acknowledged(pending, sent)} of "
                              f"{len(records)} acknowledged)", retry_after=RETRY_AFTER)
        if pending.errors:
            first = pending.errors[0]
            raise Unavailable(f"{where}: the broker did not acknowledge "
                              f"{len(pending.errors)} of {len(records)} records: {first}",
                              retry_after=RETRY_AFTER)
        return len(records)

    @staticmethod
    def _acknowledged(pending: _Pending, sent: int) -> int:
        with pending.lock:
            return max(0, sent - max(pending.left, 0) - len(pending.errors))

    def close(self) -> None:
        with self._lock:
            producers, self._producers = list(self._producers.values()), {}
        for p in producers:
            p.close()


__all__ = ["KafkaAppender", "DEFAULT_TIMEOUT"]
