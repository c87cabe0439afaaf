"""A micro-batch's write that failed half-way and ran again, as a plan topic then holds it: the
records after a hole (the producer's earlier batch expired, the later ones went on), then the
whole batch again under the same keys. An edge's reader gives every distinct row once, the hole
filled by the second write included, and a `gap` for a hole no write filled (issue 45: the
reader skipped every key not above the highest, so the rows that filled a hole were dropped,
silently). A real broker, records written as the Kafka sink writes them (the same keys)."""
from __future__ import annotations

import json
import time

import pytest

from pep.delivery.control import ensure_topics
from pep.delivery.settings import DeliverySettings
from pep.edge.reader import TopicReader

# (key, value) in topic order: batch 1 written with index 1 missing, then again in full;
# batch 2 with index 1 missing and never written again; batch 3
RECORDS = [("m:e:1:0", "a0"), ("m:e:1:2", "a2"),
           ("m:e:1:0", "a0"), ("m:e:1:1", "a1"), ("m:e:1:2", "a2"),
           ("m:e:2:0", "b0"), ("m:e:2:2", "b2"),
           ("m:e:3:0", "c0")]


def _events(reader: TopicReader, want: int, timeout: float = 30.0) -> list[tuple[int, str, str]]:
    out: list[tuple[int, str, str]] = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        out += [(e.id, e.kind, e.data) for e in reader.read(timeout=0.2)]
    return out


@pytest.mark.timeout(60)
def test_a_rewritten_batch_fills_its_hole_and_an_unfilled_hole_is_a_gap(kafka_broker):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT",
                                prefix=f"w{int(time.time() * 1000) % 100000}.")
    topic = settings.plan_prefix + "rewritten"
    ensure_topics(AdminClient({"bootstrap.servers": kafka_broker.bootstrap}), settings, (topic,))
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "acks": "all",
                         "enable.idempotence": True})
    for key, value in RECORDS:
        producer.produce(topic, json.dumps({"v": value}).encode(), key.encode())
    assert producer.flush(30) == 0

    reader = TopicReader(settings, "h-rewritten", topic, 0, None)
    reader.start()
    try:
        events = _events(reader, 7)
    finally:
        reader.close("shutdown")
    rows = [(i, json.loads(d)["v"]) for i, k, d in events if k == "row"]
    # event ids are positions: the row at offset o is event o + 1
    assert rows == [(1, "a0"), (2, "a2"), (4, "a1"), (6, "b0"), (7, "b2"), (8, "c0")]
    gaps = [(i, json.loads(d)) for i, k, d in events if k == "gap"]
    assert gaps == [(7, {"event": "gap", "lost": 1, "resume_from": 8})]
    assert [k for _, k, _ in events].index("gap") == 5  # before the next batch's row
    assert reader.skipped == 2

    # a reader resuming on another edge after event 4 gets what follows, the same way
    again = TopicReader(settings, "h-rewritten", topic, 0, 4)
    again.start()
    try:
        resumed = _events(again, 4)
    finally:
        again.close("shutdown")
    assert [(i, k) for i, k, _ in resumed] == [(6, "row"), (7, "row"), (7, "gap"), (8, "row")]
