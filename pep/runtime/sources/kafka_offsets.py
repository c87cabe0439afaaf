"""A Kafka stream's partitions and their end (or start) offsets, asked of the broker.

Two uses. A handle's cut (issue 41): the partitions' end offsets (the high watermark, what a
consumer reading uncommitted records sees) are read when a handle on a Kafka stream is
requested, and the handle is given only records at or after them, so that no record the broker
acknowledged before the request reaches it (`pep.handles.service`). And the restart's replay
(`sources/replay.py`): batches are read again only while the topic still holds every record of them
(the partitions' start offsets).

The client is confluent-kafka's AdminClient (librdkafka), the gateway's own Kafka client beside
its producer (`pep/streams/kafka_producer.py`): it takes the stream's `producer.*` settings
(librdkafka names: security, SASL), one client per distinct configuration. No Spark here.
When the broker does not answer within the time-out, or does not have the topic,
`KafkaOffsetsUnavailable` says which stream, topic and servers, and why: a caller must not go on
without the offsets (a handle without its cut would get records from before its request).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from pep.core.plan import StreamDefinition

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0  # seconds the broker has to name the partitions and their offsets
RETRY_PAUSE = 0.2  # seconds between two tries after an error the client calls retriable


class KafkaOffsetsUnavailable(RuntimeError):
    """The partitions' offsets could not be read; the message says where and why."""


def client_config(definition: StreamDefinition) -> tuple[dict[str, str], str]:
    """(librdkafka settings, topic) of a Kafka stream: its `producer.*` options without their
    prefix, and its servers."""
    opts = dict(definition.source.options)
    config = {k[len("producer."):]: v for k, v in opts.items() if k.startswith("producer.")}
    config["bootstrap.servers"] = opts.get("bootstrap.servers") or ""
    return config, opts.get("subscribe") or ""


class KafkaOffsets:
    """Reads partitions' offsets with one AdminClient per client configuration."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self._clients: dict[tuple[tuple[str, str], ...], Any] = {}
        self._lock = threading.Lock()

    def end_offsets(self, definition: StreamDefinition) -> tuple[int, ...]:
        """Per partition (index = partition), the offset the next record will get: every
        record acknowledged so far is before it."""
        return self._offsets(definition, latest=True)

    def start_offsets(self, definition: StreamDefinition) -> tuple[int, ...]:
        """Per partition, the first offset the topic still holds (retention removes older
        records)."""
        return self._offsets(definition, latest=False)

    def _client(self, config: dict[str, str]) -> Any:
        from confluent_kafka.admin import AdminClient

        key = tuple(sorted(config.items()))
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                settings: dict[str, Any] = {
                    **config, "logger": logging.getLogger("xsg.kafka.offsets"),
                    "reconnect.backoff.ms": 500, "reconnect.backoff.max.ms": 5000}
                client = self._clients[key] = AdminClient(settings)
            return client

    def _drop(self, config: dict[str, str]) -> None:
        with self._lock:
            self._clients.pop(tuple(sorted(config.items())), None)

    def _offsets(self, definition: StreamDefinition, latest: bool) -> tuple[int, ...]:
        """Per partition, its end (or start) offset; errors the client calls retriable (a
        partition's leader moving, a topic just made) are tried again until the time-out."""
        from confluent_kafka import KafkaException

        config, topic = client_config(definition)
        where = (f"stream {definition.name!r} (Kafka topic {topic!r} at "
                 f"{config['bootstrap.servers']})")
        what = "end" if latest else "start"
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self._ask(config, topic, where, latest, deadline)
            except KafkaOffsetsUnavailable:
                raise
            except KafkaException as exc:
                if _retriable(exc) and time.monotonic() + RETRY_PAUSE < deadline:
                    time.sleep(RETRY_PAUSE)
                    continue
                self._drop(config)
                raise KafkaOffsetsUnavailable(f"{where}: the {what} offsets of its partitions "
                                              f"could not be read within {self.timeout:g} s: "
                                              f"{exc}") from None
            except Exception as exc:  # noqa: BLE001 - a time-out, a client that failed
                self._drop(config)
                raise KafkaOffsetsUnavailable(f"{where}: the {what} offsets of its partitions "
                                              f"could not be read within {self.timeout:g} s: "
                                              f"{type(exc).__name__}: {exc}") from None

    def _ask(self, config: dict[str, str], topic: str, where: str, latest: bool,
             deadline: float) -> tuple[int, ...]:
        """One round: the topic's partitions, then their offsets."""
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        left = max(0.1, deadline - time.monotonic())
        client = self._client(config)
        metadata = client.list_topics(topic, timeout=left)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            if found is not None and found.error is not None \
                    and _retriable(KafkaException(found.error)):
                raise KafkaException(found.error)
            reason = found.error.str() if found is not None and found.error else "unknown"
            raise KafkaOffsetsUnavailable(f"{where}: the broker does not have the topic "
                                          f"({reason})")
        partitions = sorted(found.partitions)
        if partitions != list(range(len(partitions))):
            raise KafkaOffsetsUnavailable(f"{where}: unexpected partitions {partitions}")
        # (confluent-kafka's OffsetSpec constructors carry no annotations)
        make: Any = OffsetSpec.latest if latest else OffsetSpec.earliest
        spec = make()
        left = max(0.1, deadline - time.monotonic())
        futures = client.list_offsets(
            {TopicPartition(topic, p): spec for p in partitions},
            isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=left)
        offsets = {tp.partition: int(f.result(timeout=left + 1.0).offset)
                   for tp, f in futures.items()}
        if any(o < 0 for o in offsets.values()):
            raise KafkaOffsetsUnavailable(f"{where}: the broker gave no offset for some "
                                          f"partitions ({offsets})")
        return tuple(offsets[p] for p in partitions)

    def close(self) -> None:
        with self._lock:
            self._clients.clear()


def _retriable(exc: Exception) -> bool:
    """An error worth trying again before the time-out: one the client calls retriable, or a
    partition's leader that moved or is not known yet (a topic just made), a request or the
    connection that timed out."""
    from confluent_kafka import KafkaError

    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError):
        return False
    return bool(error.retriable()) or error.code() in (
        KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT)


__all__ = ["KafkaOffsets", "KafkaOffsetsUnavailable", "client_config", "DEFAULT_TIMEOUT"]
