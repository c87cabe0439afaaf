"""An edge's one consumer for all its readers (`pep.edge.feed`): readers of one topic at
different positions, and of different topics, each get every record once from where they start;
a reader whose queue is full neither stops the others nor misses a record; a closed reader gets
nothing more. A real broker; records keyed as the Kafka sink keys them."""
from __future__ import annotations

import json
import time

import pytest

from pep.delivery.control import ensure_topics
from pep.delivery.settings import DeliverySettings
from pep.edge import reader as reader_module
from pep.edge.feed import EdgeFeed
from pep.edge.reader import TopicReader


def _rows(reader: TopicReader, want: int, timeout: float = 30.0) -> list[tuple[int, int]]:
    """(event id, value) of the rows read until `want` of them (or the time-out)."""
    out: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        out += [(e.id, json.loads(e.data)["v"]) for e in reader.read(timeout=0.2)
                if e.kind == "row"]
    return out


@pytest.mark.timeout(90)
def test_one_consumer_feeds_readers_at_their_own_positions_a_full_one_misses_nothing(
        kafka_broker, monkeypatch):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    monkeypatch.setattr(reader_module, "MAX_QUEUED", 4)  # a reader full after 4 rows
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT",
                                prefix=f"fd{int(time.time() * 1000) % 100000}.")
    one, two = settings.plan_prefix + "one", settings.plan_prefix + "two"
    three = settings.plan_prefix + "three"
    ensure_topics(AdminClient({"bootstrap.servers": kafka_broker.bootstrap}), settings,
                  (one, two, three))
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "acks": "all",
                         "enable.idempotence": True})
    for i in range(30):
        producer.produce(one, json.dumps({"v": i}).encode(), f"m:e:1:{i}".encode())
        producer.produce(two, json.dumps({"v": 100 + i}).encode(), f"m:e:1:{i}".encode())
        producer.produce(three, json.dumps({"v": 200 + i}).encode(), f"m:e:1:{i}".encode())
    assert producer.flush(30) == 0

    consumers = []
    feed = EdgeFeed(settings)
    made = feed._consumer
    monkeypatch.setattr(feed, "_consumer", lambda: consumers.append(1) or made())
    slow = TopicReader(settings, "h-slow", one, 0, None)  # reads nothing for a while
    fast = TopicReader(settings, "h-fast", one, 10, None)  # bound later: from offset 10
    other = TopicReader(settings, "h-other", two, 0, 25)  # resumes after event 25
    gone = TopicReader(settings, "h-gone", two, 0, None)
    stuck = TopicReader(settings, "h-stuck", three, 0, None)  # never reads: topic three paused
    late = TopicReader(settings, "h-late", three, 0, None)  # joins the paused topic
    readers = [slow, fast, other, gone, stuck, late]
    try:
        for r in (fast, other, gone, stuck):
            r.start(feed)
        assert _rows(fast, 20) == [(o + 1, o) for o in range(10, 30)]
        assert _rows(other, 5) == [(o + 1, 100 + o) for o in range(25, 30)]
        gone.close("revoked")
        slow.start(feed)  # joins topic one below `fast`: the consumer goes back for it
        time.sleep(1.0)  # its queue fills (4), the feed pauses topic one for it
        assert _rows(slow, 30) == [(o + 1, o) for o in range(30)]
        for i in range(30, 33):  # the others go on meanwhile and after
            producer.produce(one, json.dumps({"v": i}).encode(), f"m:e:2:{i - 30}".encode())
        assert producer.flush(30) == 0
        assert _rows(fast, 3) == [(31, 30), (32, 31), (33, 32)]
        assert _rows(slow, 3) == [(31, 30), (32, 31), (33, 32)]
        late.start(feed)  # topic three is paused for `stuck`, full all along
        assert _rows(late, 30) == [(o + 1, 200 + o) for o in range(30)]
        # the closed reader: its final event, then nothing
        final = gone.read(timeout=0.2)
        assert [e.kind for e in final] == ["revoked"] and gone.read(timeout=0.2) == []
        assert consumers == [1]  # one consumer for the six readers of three topics
    finally:
        for r in readers:
            r.close("shutdown")
        feed.close()
