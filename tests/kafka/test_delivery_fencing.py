"""An edge that does not acknowledge a revocation within the bound is fenced off the plan's
topic before the gateway answers: on the broker's SASL/SCRAM listener, each process with an
identity of its own and ACLs deciding (tests/kafka/broker.py), a real PostgreSQL store."""
from __future__ import annotations

import time

import pytest

from pep.delivery.grants import apply_grants, delivery_grants, upsert_scram_users
from pep.delivery.settings import DeliverySettings
from pep.delivery.store import DeliveryStore
from pep.delivery.topics import PlanTopics
from pep.edge.reader import TopicReader


def produce(broker, topic: str, values: list[str]) -> None:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for i, v in enumerate(values):
        producer.produce(topic, v.encode(), f"m:e:{int(time.time() * 1000)}:{i}".encode(),
                         partition=0)
    assert producer.flush(30) == 0


@pytest.mark.timeout(120)
def test_a_silent_edge_is_fenced_off_the_plan_topic(kafka_broker, postgres, tmp_path):
    from common.db import open_storage
    from pep.handles.records import HandleStore

    prefix = f"f{int(time.time()) % 100000}."
    # the users and ACLs as an operator grants them (pep.delivery.grants, edges.md's table)
    admin = {"bootstrap.servers": kafka_broker.bootstrap}
    upsert_scram_users(admin, {"xsg-gw": "gw-secret", "edge-1": "edge-secret"})
    apply_grants(admin, delivery_grants(prefix, "xsg-gw", ["edge-1"]))
    storage = open_storage(tmp_path, postgres.new_url(), pool_size=4)
    HandleStore(storage.database("handles")).close()
    store = DeliveryStore(storage.database("delivery"))
    sasl = {"brokers": kafka_broker.sasl_bootstrap, "prefix": prefix, "ack_timeout": 1.0}
    gateway = DeliverySettings(username="xsg-gw", password="gw-secret", **sasl)
    edge = DeliverySettings(username="edge-1", password="edge-secret", **sasl)
    topics = PlanTopics(gateway, store, handle=lambda h: None, eligible=lambda r: False)
    reader = None
    try:
        topic, created = topics.topic_for("s", "plan")
        assert created and topics.topic_for("s", "plan") == (topic, False)
        produce(kafka_broker, topic, ['{"v":1}', '{"v":2}'])
        # an edge with its own identity reads the plan topic
        reader = TopicReader(edge, "h1", topic, 0, None)
        reader.start()
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            got += reader.read(None, timeout=0.5)
        assert [e.data for e in got] == ['{"v":1}', '{"v":2}']
        # registered as alive, but it never acknowledges: silent past the bound, then fenced
        store.register_edge("edge-1", edge.principal, "http://127.0.0.1:1", "h", 1)
        started = time.monotonic()
        silent = topics.revocations.publish(["h1"], "revoked", "a test")
        assert silent == ["edge-1"]
        assert 1.0 <= time.monotonic() - started < 3.0
        assert topics.fence(silent, {topic}) == ["User:edge-1"]
        assert store.fences(topic) == ["User:edge-1"]
        produce(kafka_broker, topic, ['{"v":3}'])  # written after the fence
        deadline = time.monotonic() + 30
        later = []
        while not reader.closed and time.monotonic() < deadline:
            later += reader.read(None, timeout=0.5)
        assert reader.closed, "the fenced edge's reader went on"
        assert [e for e in later if e.kind == "row"] == []
        # a new reader of that edge reads nothing of the topic either
        again = TopicReader(edge, "h2", topic, 0, None)
        again.start()
        deadline = time.monotonic() + 30
        rows = []
        while not again.closed and time.monotonic() < deadline:
            rows += [e for e in again.read(None, timeout=0.5) if e.kind == "row"]
        assert again.closed and rows == []
        # the fence goes with the topic
        topics.retire([topic])
        topics._delete([topic])
        assert store.fences(topic) == []
    finally:
        if reader is not None:
            reader.close("shutdown")
        topics.close()
        storage.close()
