"""Kafka fixtures: one real broker per run (KRaft, from the Maven jars `make install` fetched),
topics with several partitions, and an outside producer (confluent-kafka, a real client).

Without the jars (no mvn when `make install` ran) or without Spark's Kafka connector for the
installed pyspark, every test here skips and says which, and what to install."""
from __future__ import annotations

import itertools
import json
import logging
import time
from typing import Iterable

import pytest

from tests.kafka.broker import BrokerUnavailable, KafkaBroker, broker_jars

_topics = itertools.count(1)
CLIENT_LOG = logging.getLogger("tests.kafka.client")


def _connector_reason() -> str | None:
    from pep.runtime.session import kafka_connector_jars, kafka_unavailable_reason
    return None if kafka_connector_jars() else kafka_unavailable_reason()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    reason = _connector_reason()
    if reason:
        pytest.skip(f"Kafka: {reason}")
    try:
        broker_jars()
    except BrokerUnavailable as exc:
        pytest.skip(f"Kafka: {exc}")
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def kafka_topic(kafka_broker):
    """A fresh topic of 3 partitions per test."""
    def make(partitions: int = 3) -> str:
        name = f"t{next(_topics)}-{int(time.time() * 1000) % 100000}"
        kafka_broker.create_topic(name, partitions)
        return name
    return make


class OutsideProducer:
    """An owner's own producer: JSON values, acks=all, sent to chosen partitions."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Producer
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                   "enable.idempotence": True, "linger.ms": 2,
                                   "logger": CLIENT_LOG})

    def send(self, topic: str, records: Iterable[dict | bytes], partition: int | None = None,
             timeout: float = 30.0) -> int:
        """Produce and wait for the broker's acknowledgement of every record."""
        errors: list = []
        count = 0
        for record in records:
            value = record if isinstance(record, bytes) else json.dumps(record).encode()
            kwargs = {} if partition is None else {"partition": partition}
            self._producer.produce(topic, value, on_delivery=lambda err, msg: err and
                                   errors.append(err), **kwargs)
            count += 1
        left = self._producer.flush(timeout)
        assert left == 0 and not errors, (left, errors)
        return count


@pytest.fixture(scope="session")
def producer(kafka_broker):
    return OutsideProducer(kafka_broker.bootstrap)


def kafka_source(broker: KafkaBroker, topic: str) -> dict:
    return {"kind": "kafka", "bootstrap.servers": broker.bootstrap, "subscribe": topic}
