"""A new plan topic is made known to Spark's Kafka producer before its first rows (issue 45):
the producer otherwise looks each new topic up on its first record, one round trip after the
other inside the rows' task, and a fresh gateway's first batches waited seconds on it. The
runtime writes one `WARM_KEY` record to each new topic as soon as a handle is attached with
it, from the rows' own producer; an edge skips that record."""
from __future__ import annotations

import json
import time

import pytest

from pep.core.plan import ExecutionPlan, Predicate
from pep.delivery.settings import WARM_KEY, DeliverySettings
from pep.edge.reader import TopicReader
from pep.ports import TopicTarget
from tests.kafka.test_kafka_runtime import kafka_stream, rec


def records(broker, topic: str, want: int, timeout: float = 60.0) -> list[tuple[bytes, bytes]]:
    """(key, value) of the topic's records from its start, until `want` came (and a second
    more)."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "warm",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                out.append((msg.key(), msg.value()))
        while (msg := consumer.poll(1.0)) is not None:
            if not msg.error():
                out.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return out


@pytest.mark.timeout(180)
def test_a_new_plan_topic_gets_its_warm_record_before_any_row(spark, tmp_path, kafka_broker,
                                                              kafka_topic, producer):
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    source = kafka_topic(1)
    stream = kafka_stream(kafka_broker, source)
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT")
    first, second = kafka_topic(1), kafka_topic(1)
    rt = StreamRuntime(spark, tmp_path / "work", settings=RuntimeSettings(
        trigger_interval=0.25, delivery=settings))
    try:
        plan = ExecutionPlan(stream.name, ((Predicate("v", ">", 0.0),),), ("v",))
        open_ = lambda: True  # noqa: E731 - a callback that always answers True
        rt.attach_handle("a", stream, plan, TopicTarget(first, open_))
        rt.attach_handle("b", stream, plan, TopicTarget(first, open_))  # the same topic
        rt.attach_handle("c", stream, plan, TopicTarget(second, open_))
        # no tuple yet: what the topics hold is the warm record alone, once each
        assert records(kafka_broker, first, 1) == [(WARM_KEY, b"")]
        assert records(kafka_broker, second, 1) == [(WARM_KEY, b"")]
        producer.send(source, [rec(1, 1.0), rec(2, -2.0), rec(3, 3.0)], partition=0)
        got = records(kafka_broker, first, 3)
        assert got[0] == (WARM_KEY, b"")
        assert [json.loads(v) for k, v in got[1:]] == [{"v": 1.0}, {"v": 3.0}]
        assert all(k.startswith(b"m:") for k, _ in got[1:])
    finally:
        rt.stop()


@pytest.mark.timeout(60)
def test_an_edge_skips_the_warm_record(kafka_broker, kafka_topic):
    """No row, no gap: the reader's first row is the record after it (its event id that
    record's position)."""
    from confluent_kafka import Producer
    topic = kafka_topic(1)
    out = Producer({"bootstrap.servers": kafka_broker.bootstrap, "acks": "all"})
    out.produce(topic, b"", WARM_KEY, partition=0)
    out.produce(topic, b'{"v":1}', b"m:e:0:0", partition=0)
    assert out.flush(30) == 0
    reader = TopicReader(DeliverySettings(kafka_broker.bootstrap,
                                          security_protocol="PLAINTEXT"), "h", topic, 0, None)
    reader.start()
    try:
        got = []
        deadline = time.monotonic() + 30
        while not [e for e in got if e.kind == "row"] and time.monotonic() < deadline:
            got += reader.read(None, timeout=0.5)
        got += reader.read(None, timeout=0.5)
        assert [(e.kind, e.id, e.data) for e in got] == [("row", 2, '{"v":1}')]
    finally:
        reader.close("released")


@pytest.mark.timeout(120)
def test_a_topic_the_broker_has_not_made_yet_is_warmed_on_a_later_try(spark, kafka_broker):
    """A broker still creating a topic's log fails the whole warm write (seen with 10,000 new
    topics on a loaded machine): the write is tried again."""
    from pep.runtime.delivery.warm import TopicWarmer
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT")
    topic = f"warm-later-{int(time.time() * 1000)}"
    warmer = TopicWarmer(spark, settings.spark_options())
    try:
        warmer.add(topic)  # not on the broker yet: the first write fails after max.block.ms
        deadline = time.monotonic() + 60
        while topic not in warmer._tries and time.monotonic() < deadline:
            time.sleep(0.1)
        assert warmer._tries.get(topic) == 1  # the first write failed
        kafka_broker.create_topic(topic, 1)
        assert warmer.idle(60)
        assert records(kafka_broker, topic, 1, timeout=15) == [(WARM_KEY, b"")]
        assert warmer.warmed == 1
    finally:
        warmer.close()
