"""An edge that does not acknowledge a revocation within the bound is fenced off the plan's
topic before the gateway answers: on the broker's SASL/SCRAM listener, each process with an
identity of its own and ACLs deciding (tests/kafka/broker.py), a real PostgreSQL store.

The ACL alone does not hold (Kafka authorizes a fetch when it arrives: a fetch parked before the
ACL returned a row written after the fence), so the fence also writes a fence record to the
topic, and an edge it names stops there. The race made deterministic: topics holding fence
records and no ACL at all, where only the record's place in the topic can stop the reader."""
from __future__ import annotations

import json
import time

import pytest

from pep.delivery.grants import apply_grants, delivery_grants, upsert_scram_users
from pep.delivery.settings import FENCE_KEY, DeliverySettings
from pep.delivery.store import DeliveryStore
from pep.delivery.topics import PlanTopics
from pep.edge.feed import EdgeFeed
from pep.edge.reader import TopicReader
from tests.kafka.conftest import topic_messages
from tests.kafka.test_delivery_realtime_holes import c, events, produce as produce_records, r


def produce(broker, dest: str, values: list[str]) -> None:
    """Rows to a plan's destination (`<topic>#<lane>`: keyed behind the lane)."""
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    topic, _, lane = dest.partition("#")
    for i, v in enumerate(values):
        key = f"m:e:{int(time.time() * 1000)}:{i}".encode()
        producer.produce(topic, v.encode(), lane.encode() + b"|" + key if lane else key,
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
    reader = neighbour = None
    try:
        topic, created = topics.topic_for("s", "plan")
        assert created and topics.topic_for("s", "plan") == (topic, False)
        # another plan of the stream: a lane of the same topic (`pep.delivery.lanes`)
        other, _ = topics.topic_for("s", "plan-2")
        kafka = topic.split("#")[0]
        assert other != topic and other.split("#")[0] == kafka
        produce(kafka_broker, topic, ['{"v":1}', '{"v":2}'])
        produce(kafka_broker, other, ['{"w":1}'])
        neighbour = TopicReader(edge, "h3", other, 0, None)  # of the other plan, same edge
        neighbour.start()
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
        assert topics.fence(silent, {kafka}) == ["User:edge-1"]
        assert store.fences(kafka) == ["User:edge-1"]
        # no new plan joins a fenced topic (the fence lasts as long as the topic)
        third, _ = topics.topic_for("s", "plan-3")
        assert third.split("#")[0] != kafka
        # the fence record is on the topic, naming the edge's principal and nothing else
        fences = topic_messages(kafka_broker, kafka, 4, 30)
        assert [k.startswith(FENCE_KEY) for k, _ in fences] == [False, False, False, True]
        assert json.loads(fences[-1][1]) == {"fenced": ["User:edge-1"]}
        produce(kafka_broker, topic, ['{"v":3}'])  # written after the fence
        deadline = time.monotonic() + 30
        later = []
        while not reader.closed and time.monotonic() < deadline:
            later += reader.read(None, timeout=0.5)
        assert reader.closed, "the fenced edge's reader went on"
        assert [e for e in later if e.kind == "row"] == []
        # the topic's other lane on that edge too: a fence cuts the edge off the whole topic
        deadline = time.monotonic() + 30
        while not neighbour.closed and time.monotonic() < deadline:
            neighbour.read(None, timeout=0.5)
        assert neighbour.closed
        # a new reader of that edge reads nothing of the topic either
        again = TopicReader(edge, "h2", topic, 0, None)
        again.start()
        deadline = time.monotonic() + 30
        rows = []
        while not again.closed and time.monotonic() < deadline:
            rows += [e for e in again.read(None, timeout=0.5) if e.kind == "row"]
        assert again.closed and rows == []
        # the fence goes with the topic (once its lanes have all ended)
        topics.retire([topic, other])
        topics._delete([kafka])
        assert store.fences(kafka) == []
    finally:
        if reader is not None:
            reader.close("shutdown")
        if neighbour is not None:
            neighbour.close("shutdown")
        topics.close()
        storage.close()


def fence(*principals: str) -> tuple[bytes, bytes]:
    """A fence record as `PlanTopics.fence` writes it."""
    return FENCE_KEY + b"0123abcd", json.dumps({"fenced": list(principals)}).encode()


def m(batch: int, index: int, value: str) -> tuple[bytes, bytes]:
    """A micro-batch's row record (`m:<epoch>:<batch>:<index>`)."""
    return f"m:e1:{batch}:{index}".encode(), value.encode()


def until_closed(reader: TopicReader, timeout: float = 30) -> list:
    got = events(reader, lambda out: reader.closed and reader.final_read, timeout)
    assert reader.closed, "the fenced edge's reader went on"
    return got


@pytest.mark.timeout(120)
def test_a_fence_record_ends_the_named_edge_s_readers_where_it_stands(kafka_broker):
    """No ACL: only the fence record stands between the named edge and the row after it. The
    named edge's readers (two on one feed) get the rows before it, then `shutdown`, never the
    row after, nor does a reader that joins later or one that reads the whole topic at once
    (rows, fence record, row in one fetch: the parked fetch of the race). An edge of another
    principal skips the record: every row, ids = offset + 1 across it, `Last-Event-ID` too."""
    prefix = f"g{int(time.time() * 1000) % 1000000}."
    admin = {"bootstrap.servers": kafka_broker.bootstrap}
    upsert_scram_users(admin, {"xsg-gw": "gw-secret", "edge-1": "edge-secret",
                               "edge-2": "edge-secret"})
    apply_grants(admin, delivery_grants(prefix, "xsg-gw", ["edge-1", "edge-2"]))
    topic = prefix + "plan.fencemark"
    kafka_broker.create_topic(topic, 1)
    sasl = {"brokers": kafka_broker.sasl_bootstrap, "prefix": prefix}
    edge1 = DeliverySettings(username="edge-1", password="edge-secret", **sasl)
    edge2 = DeliverySettings(username="edge-2", password="edge-secret", **sasl)
    feed = EdgeFeed(edge1)
    readers: list[TopicReader] = []

    def reader(settings: DeliverySettings, after: int | None = None,
               on: EdgeFeed | None = None) -> TopicReader:
        out = TopicReader(settings, f"h{len(readers)}", topic, 0, after)
        readers.append(out)
        out.start(on)
        return out

    try:
        produce_records(kafka_broker.bootstrap, topic, [m(0, 0, '{"v":1}'), m(0, 1, '{"v":2}')])
        a, b, other = reader(edge1, on=feed), reader(edge1, on=feed), reader(edge2)
        for x in (a, b):
            got = events(x, lambda out: len(out) >= 2, 30)
            assert [(e.kind, e.id, e.data) for e in got] == [
                ("row", 1, '{"v":1}'), ("row", 2, '{"v":2}')]
        # the fence record and a row after it, in one write: fetched together by the readers
        produce_records(kafka_broker.bootstrap, topic, [fence("User:edge-1"),
                                                        m(1, 0, '{"v":3}')])
        for x in (a, b):
            got = until_closed(x)
            assert [(e.kind, e.id) for e in got] == [("shutdown", 2)], got
        got = events(other, lambda out: any(e.id == 4 for e in out), 30)
        assert [(e.kind, e.id, e.data) for e in got] == [
            ("row", 1, '{"v":1}'), ("row", 2, '{"v":2}'), ("row", 4, '{"v":3}')], got
        assert not other.closed
        # a reader that joins the edge's feed later ends at once
        late = reader(edge1, on=feed)
        assert [e.kind for e in until_closed(late, 10)] == ["shutdown"]
        # an edge's new consumer reading the whole topic: what comes before the record at
        # most, never the row after it
        whole = reader(edge1)
        got = until_closed(whole)
        assert got[-1].kind == "shutdown"
        assert "may not read the handle's topic" in json.loads(got[-1].data)["reason"]
        rows = [(e.id, e.data) for e in got if e.kind == "row"]
        assert rows == [(1, '{"v":1}'), (2, '{"v":2}')][:len(rows)], got
        # the other edge resumes after event 2 (Last-Event-ID) with the row after the record
        resumed = reader(edge2, after=2)
        got = events(resumed, lambda out: bool(out), 30)
        assert [(e.kind, e.id, e.data) for e in got] == [("row", 4, '{"v":3}')], got
    finally:
        for x in readers:
            x.close("released")
        feed.close()


@pytest.mark.timeout(120)
def test_an_edge_not_named_skips_fence_records_as_no_row_no_hole_no_count(kafka_broker,
                                                                           kafka_topic):
    """Fence records naming another edge inside a micro-batch, inside a micro-batch's hole and
    between a real-time batch's records and its count marker: no event of their own, the
    batch whole where it is whole (no gap), the hole still told (a fence record fills none),
    the count marker's check not thrown off; ids stay offsets + 1."""
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT")
    topic = kafka_topic(1)
    produce_records(kafka_broker.bootstrap, topic, [
        m(0, 0, '{"i":0}'), m(0, 1, '{"i":1}'),      # 0-1
        fence("User:edge-9"),                        # 2
        m(0, 2, '{"i":2}'),                          # 3: batch 0 whole
        m(1, 0, '{"i":3}'),                          # 4
        m(2, 0, '{"i":4}'),                          # 5
        fence("User:edge-9", "User:edge-8"),         # 6: where batch 2's index 1 is missing
        m(2, 2, '{"i":5}'),                          # 7
        m(3, 0, '{"i":6}'),                          # 8: batch 2's hole told here
        c("oA", None),                               # 9
        r(0),                                        # 10
        fence("User:edge-9"),                        # 11
        r(1),                                        # 12
        c("b0", "oA", {"src/0": [0, 2]}, 2),         # 13: whole
        r(2),                                        # 14
    ])
    reader = TopicReader(settings, "h1", topic, 0, None)
    resumed = TopicReader(settings, "h2", topic, 0, 4)  # Last-Event-ID 4: offset 3's row
    try:
        reader.start()
        resumed.start()
        got = events(reader, lambda out: any(e.id == 15 for e in out), 30)
        time.sleep(0.5)
        got += reader.read(timeout=0.2)
        assert [(e.kind, e.id) for e in got] == [
            ("row", 1), ("row", 2), ("row", 4), ("row", 5), ("row", 6), ("row", 8),
            ("gap", 8), ("row", 9), ("row", 11), ("row", 13), ("row", 15)], got
        assert json.loads(got[6].data)["lost"] == 1
        got = events(resumed, lambda out: any(e.id == 15 for e in out), 30)
        assert [(e.kind, e.id) for e in got] == [
            ("row", 5), ("row", 6), ("row", 8), ("gap", 8), ("row", 9), ("row", 11),
            ("row", 13), ("row", 15)], got
        assert not reader.closed and not resumed.closed
    finally:
        reader.close("released")
        resumed.close("released")


def test_a_reader_handed_a_fence_record_naming_its_edge_ends_there():
    """Without a broker: records handed to the reader itself (the feed ends a named edge's
    readers before handing them the record; the reader holds the same line on its own). A fence
    record naming another edge gives no event; one naming this edge ends the reader with what
    it was given; one that cannot be read ends it too (deny when in doubt)."""
    edge = DeliverySettings("127.0.0.1:1", username="edge-1", password="x")
    reader = TopicReader(edge, "h", "t", 0, None)
    assert reader.offer(0, *m(0, 0, '{"v":1}'), 0)
    assert reader.offer(1, *fence("User:edge-2"), 0)
    assert reader.offer(2, *m(0, 1, '{"v":2}'), 0)
    reader.flush()
    assert [(e.kind, e.id) for e in reader.read()] == [("row", 1), ("row", 3)]
    assert reader.offer(3, *fence("User:edge-2", "User:edge-1"), 0)
    assert reader.closed
    assert reader.offer(4, *m(0, 2, '{"v":3}'), 0)
    reader.flush()
    assert [(e.kind, e.id) for e in reader.read()] == [("shutdown", 3)]
    assert reader.read() == []

    unreadable = TopicReader(edge, "h", "t", 0, None)
    assert unreadable.offer(0, FENCE_KEY + b"x", b"not json", 0)
    assert unreadable.closed
