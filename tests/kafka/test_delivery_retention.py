"""Delivery topics keep their rows no longer than the gateway's retention says (issue 45,
`DeliverySettings.topic_config`): segments that roll by a quarter of the retention, so that
Kafka, which deletes whole segments, can delete them; and an offset-index entry per MiB, so that
topics written at the same pace do not all touch their index files in the same batch."""
from __future__ import annotations

import itertools
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from pep.delivery.control import ensure_topics
from pep.delivery.settings import DeliverySettings

pytestmark = pytest.mark.timeout(90)
_names = itertools.count()


def _settings(broker, retention: float, size: int = 256 * 1024 * 1024) -> DeliverySettings:
    return DeliverySettings(brokers=broker.bootstrap, security_protocol="PLAINTEXT",
                            prefix=f"ret{next(_names)}-{int(time.time() * 1000) % 100000}.",
                            retention_seconds=retention, retention_bytes=size)


def _created(broker, settings: DeliverySettings) -> str:
    name = settings.prefix + "plan.t"
    ensure_topics(AdminClient({"bootstrap.servers": broker.bootstrap}), settings, [name])
    return name


def test_a_delivery_topic_rolls_its_segments_by_a_quarter_of_the_retention(kafka_broker):
    settings = _settings(kafka_broker, retention=3600, size=64 * 1024 * 1024)
    topic = _created(kafka_broker, settings)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    [future] = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]
                                      ).values()
    got = {name: entry.value for name, entry in future.result(30).items()}
    assert {k: got[k] for k in ("retention.ms", "retention.bytes", "segment.ms",
                                "segment.jitter.ms", "segment.bytes", "index.interval.bytes",
                                "cleanup.policy")} == {
        "retention.ms": "3600000", "retention.bytes": str(64 * 1024 * 1024),
        "segment.ms": "900000", "segment.jitter.ms": "225000",
        "segment.bytes": str(16 * 1024 * 1024), "index.interval.bytes": str(1024 * 1024),
        "cleanup.policy": "delete"}


def test_segments_stay_in_kafkas_bounds():
    small = DeliverySettings(brokers="b", retention_seconds=0.001, retention_bytes=1).topic_config()
    assert (small["segment.ms"], small["segment.bytes"], small["index.interval.bytes"]) == (
        "1", str(1 << 20), str(1 << 20))
    big = DeliverySettings(brokers="b", retention_bytes=1 << 40).topic_config()
    assert big["segment.bytes"] == str(1 << 30)


def test_a_topic_written_all_the_time_lets_rows_older_than_its_retention_go(kafka_broker):
    """With Kafka's segments (1 GiB or 7 days) a topic written to every moment never rolls, and
    retention deleted nothing: its first row stayed."""
    retention = 3.0
    topic = _created(kafka_broker, _settings(kafka_broker, retention=retention))
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 0})
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": "ret",
                         "enable.auto.commit": False})
    try:
        start = time.time()
        low = 0
        while time.time() - start < 40:
            producer.produce(topic, b"{}", key=b"m:e:0:0")
            producer.flush(10)
            low, _ = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
            if low > 0:
                break
            time.sleep(0.1)
        assert low > 0, "nothing deleted in 40 s of a 3 s retention"
        consumer.assign([TopicPartition(topic, 0, low)])
        first = None
        while first is None:
            msg = consumer.poll(10)
            assert msg is not None
            if msg.error() is None:
                first = msg
        _, millis = first.timestamp()
        # a row goes between the retention and 1.25 times it, plus the broker's check (1 s in
        # the tests) and a segment's roll waiting for the next record
        assert time.time() - millis / 1000 < retention * 1.25 + 1 + 2
    finally:
        consumer.close()
