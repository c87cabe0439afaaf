"""Kafka fixtures: one real broker per run (KRaft, from the Maven jars `make install` fetched),
topics with several partitions, and an outside producer (confluent-kafka, a real client).

Without the jars (no mvn when `make install` ran) or without Spark's Kafka connector for the
installed pyspark, every test here skips and says which, and what to install."""
from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.kafka.broker import BrokerUnavailable, KafkaBroker, broker_jars

_topics = itertools.count(1)
CLIENT_LOG = logging.getLogger("tests.kafka.client")
T0 = 1_700_000_000


def _connector_reason() -> str | None:
    from pep.runtime.session import kafka_connector_jars, kafka_unavailable_reason
    return None if kafka_connector_jars() else kafka_unavailable_reason()


def _started_broker(tmp_path_factory, name: str) -> KafkaBroker:
    """A broker started in a fresh directory `name`; the test skips, saying which and what to
    install, without Spark's Kafka connector or the broker's jars."""
    reason = _connector_reason()
    if reason:
        pytest.skip(f"Kafka: {reason}")
    try:
        broker_jars()
    except BrokerUnavailable as exc:
        pytest.skip(f"Kafka: {exc}")
    # retention checked every second: tests/kafka/test_delivery_retention.py
    return KafkaBroker(tmp_path_factory.mktemp(name), retention_check_ms=1000).start()


def _close_spark_producers() -> None:
    """Close the Kafka producers Spark keeps in this process's JVM. Spark's Kafka sink (plan
    topics, `pep/runtime/delivery`) takes its producer from a pool of the JVM and leaves it
    there when the query stops, for `spark.kafka.producer.cache.timeout` (10 minutes): once
    its broker is stopped it logged "Connection to node 1 ... could not be established" until
    the process ended, past the suite's last line. A producer not closed is the fault, so it
    is closed here rather than its logger silenced (which would hide a real outage)."""
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    if jvm is None:  # no Spark in this process
        return
    from py4j.java_gateway import JavaClass

    pool = getattr(jvm.org.apache.spark.sql.kafka010.producer, "InternalKafkaProducerPool$")
    if isinstance(pool, JavaClass):  # (the connector loaded: a query wrote to Kafka)
        getattr(pool, "MODULE$").reset()


def _stopped(broker: KafkaBroker) -> None:
    _close_spark_producers()
    broker.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    broker = _started_broker(tmp_path_factory, "kafka")
    yield broker
    _stopped(broker)


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory):
    """A broker of the module's own, for tests that stop it and start it again (on the same
    ports and log directory: `KafkaBroker.stop`, `.start`); the session's stays up."""
    broker = _started_broker(tmp_path_factory, "own-kafka")
    yield broker
    _stopped(broker)


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


class SteadyProducer(threading.Thread):
    """The owner's producer in a thread of its own: record i to partition i % 3 every few
    milliseconds, its produce call and its acknowledgement timestamped. Its value is i + 1,
    negated for every `negative`-th record when given (a policy's `value > 0` hides those)."""

    def __init__(self, bootstrap: str, topic: str, every: float = 0.004,
                 negative: int | None = None) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                  "enable.idempotence": True, "linger.ms": 0,
                                  "logger": CLIENT_LOG})
        self.topic, self.every, self.negative = topic, every, negative
        self.produced: dict[int, float] = {}
        self.acked: dict[int, float] = {}
        self.errors: list = []
        self.stop = threading.Event()

    def value(self, i: int) -> float:
        return -float(i + 1) if self.negative and i % self.negative == 0 else float(i + 1)

    def matching(self) -> set[float]:
        """The values of every acknowledged record a `value > 0` filter passes."""
        return {self.value(i) for i in self.acked if self.value(i) > 0}

    def _report(self, i: int):
        def report(err, _msg) -> None:
            if err is not None:
                self.errors.append(err)
            else:
                self.acked[i] = time.time()
        return report

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            value = json.dumps({"ts": T0 + i, "value": self.value(i), "secret": "s"}).encode()
            self.produced[i] = time.time()
            self.producer.produce(self.topic, value, partition=i % 3, on_delivery=self._report(i))
            self.producer.poll(0)
            i += 1
            time.sleep(self.every)
        self.producer.flush(30)


def topic_messages(broker: KafkaBroker, topic: str, want: int, timeout: float = 90.0,
                   keep: Callable[[bytes | None], bool] = lambda key: True,
                   settle: float = 1.0) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of partition 0 of `topic` from its start whose key `keep` passes, until
    `want` came, then until `settle` seconds pass with no more (one too many would come
    then)."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "t",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[bytes | None, bytes | None]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error() and keep(msg.key()):
                out.append((msg.key(), msg.value()))
        while (msg := consumer.poll(settle)) is not None:
            if not msg.error() and keep(msg.key()):
                out.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return out


@dataclass
class PlanTopicsRuntime:
    """A Kafka stream on a fresh topic (`source`) and a runtime (trigger 0.25 s) that writes
    its plans' rows to plan topics on the session's broker."""

    source: str
    stream: Any  # StreamDefinition
    settings: Any  # DeliverySettings
    rt: Any  # StreamRuntime

    def attach(self, handle: str, plan: Any, topic: str) -> None:
        """`handle` served `plan` through plan topic `topic` (its reader always there)."""
        from pep.ports import TopicTarget
        self.rt.attach_handle(handle, self.stream, plan, TopicTarget(topic, lambda: True))


@pytest.fixture
def plan_topics_runtime(spark, tmp_path, kafka_broker, kafka_topic
                        ) -> Iterator[Callable[..., PlanTopicsRuntime]]:
    """make(partitions=1, realtime=0.0): a `PlanTopicsRuntime`, its source topic of
    `partitions`, real-time batches of `realtime` seconds (0: micro-batches only); stopped
    after the test."""
    from pep.delivery.settings import DeliverySettings
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    from tests.kafka.test_kafka_runtime import kafka_stream
    made: list[PlanTopicsRuntime] = []

    def make(partitions: int = 1, realtime: float = 0.0) -> PlanTopicsRuntime:
        source = kafka_topic(partitions)
        settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT",
                                    realtime=realtime)
        rt = StreamRuntime(spark, tmp_path / f"work{len(made) or ''}", settings=RuntimeSettings(
            trigger_interval=0.25, delivery=settings))
        made.append(PlanTopicsRuntime(source, kafka_stream(kafka_broker, source), settings, rt))
        return made[-1]

    yield make
    for each in made:
        each.rt.stop()
