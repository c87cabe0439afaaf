"""An edge's one consumer for all its readers (`pep.edge.feed`): readers of one topic at
different positions, and of different topics, each get every record once from where they start;
a reader whose queue is full neither stops the others nor misses a record; a closed reader gets
nothing more. A real broker; records keyed as the Kafka sink keys them.

Plan lanes (`pep.delivery.lanes`, several plans on one topic): each lane's readers get their
lane's records only, with its holes, repeats and the topic's losses told per lane; most through
a fake consumer (`FakeBroker`: no broker, offsets and retention as Kafka's), one on the real
broker."""
from __future__ import annotations

import json
import threading
import time

import pytest

from pep.delivery.control import ensure_topics
from pep.delivery.lanes import destination, lane_key
from pep.delivery.settings import FENCE_KEY, WARM_KEY, DeliverySettings
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


# -- plan lanes (`pep.delivery.lanes`): plans sharing a topic, through a fake consumer ----------


class _Msg:
    def __init__(self, topic: str, offset: int, key: bytes | None, value: bytes | None) -> None:
        self._at = (topic, offset, key, value)

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._at[0]

    def offset(self) -> int:
        return self._at[1]

    def key(self) -> bytes | None:
        return self._at[2]

    def value(self) -> bytes | None:
        return self._at[3]


class FakeBroker:
    """Partition 0 of some topics, and a consumer of them that behaves as librdkafka's does
    for the feed: reads from an assigned offset (the earliest kept when below it), hands the
    records it fetched even after `pause` (the feed drops them), goes on after `resume` from
    the last record handed; records deleted below an offset stand for a retention that passed.
    It notes every assign, unassign and seek."""

    def __init__(self) -> None:
        self.logs: dict[str, list[tuple[int, bytes | None, bytes | None]]] = {}
        self.ends: dict[str, int] = {}
        self.calls: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()

    def produce(self, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> None:
        with self.lock:
            log = self.logs.setdefault(topic, [])
            for key, value in records:
                end = self.ends.get(topic, 0)
                log.append((end, key, value))
                self.ends[topic] = end + 1

    def delete_below(self, topic: str, offset: int) -> None:
        with self.lock:
            self.logs[topic] = [r for r in self.logs[topic] if r[0] >= offset]

    def consumer(self) -> FakeConsumer:
        return FakeConsumer(self)


class FakeConsumer:
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.at: dict[str, int] = {}
        self.paused: set[str] = set()

    def incremental_assign(self, parts) -> None:
        for p in parts:
            self.at[p.topic] = p.offset
            self.broker.calls.append(("assign", p.topic, p.offset))

    def incremental_unassign(self, parts) -> None:
        for p in parts:
            self.at.pop(p.topic, None)
            self.paused.discard(p.topic)
            self.broker.calls.append(("unassign", p.topic, -1))

    def seek(self, part) -> None:
        self.at[part.topic] = part.offset
        self.broker.calls.append(("seek", part.topic, part.offset))

    def pause(self, parts) -> None:
        self.paused.update(p.topic for p in parts)
        self.broker.calls += [("pause", p.topic, -1) for p in parts]

    def resume(self, parts) -> None:
        self.paused.difference_update(p.topic for p in parts)
        self.broker.calls += [("resume", p.topic, -1) for p in parts]

    def _take(self, n: int) -> list[_Msg]:
        out: list[_Msg] = []
        with self.broker.lock:
            for topic, at in list(self.at.items()):
                if topic in self.paused:
                    continue
                for offset, key, value in self.broker.logs.get(topic, []):
                    if len(out) >= n:
                        break
                    if offset >= at:
                        out.append(_Msg(topic, offset, key, value))
                        self.at[topic] = at = offset + 1
        return out

    def poll(self, timeout: float) -> _Msg | None:
        got = self._take(1)
        if not got:
            time.sleep(min(timeout, 0.01))
        return got[0] if got else None

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        return self._take(n)

    def close(self) -> None:
        pass


EDGE = DeliverySettings("127.0.0.1:1", username="edge-1", password="x",
                        security_protocol="SASL_PLAINTEXT")


def _fake_feed(broker: FakeBroker, monkeypatch) -> EdgeFeed:
    monkeypatch.setattr(EdgeFeed, "_consumer", lambda self: broker.consumer())
    return EdgeFeed(EDGE)


def _events(reader: TopicReader, until, timeout: float = 10.0) -> list[tuple[str, int, object]]:
    """(kind, id, value or `lost`) of the events read until `until(events)` holds."""
    out: list[tuple[str, int, object]] = []
    deadline = time.monotonic() + timeout
    while not until(out) and time.monotonic() < deadline:
        for e in reader.read(timeout=0.05):
            data = json.loads(e.data)
            out.append((e.kind, e.id, data.get("v", data.get("lost")) if e.kind in (
                "row", "gap") else None))
    return out


def _rec(lane: str, key: str, v: int | None = None) -> tuple[bytes, bytes | None]:
    return (lane_key(lane, key.encode()), None if v is None else json.dumps({"v": v}).encode())


def _fence(*principals: str) -> tuple[bytes, bytes]:
    return FENCE_KEY + b"0123", json.dumps({"fenced": list(principals)}).encode()


def _lane_rows(events) -> list[tuple[int, object]]:
    return [(i, v) for kind, i, v in events if kind == "row"]


@pytest.mark.timeout(30)
def test_two_lanes_of_one_topic_each_reader_gets_its_lane_s_rows_holes_and_repeats(
        monkeypatch):
    """Each lane's reader gets exactly its lane's rows, ids = offsets + 1; the same keys in the
    other lane are neither repeats nor fill its holes; a repeat is skipped in its lane only; the
    warm record and a fence record naming another edge give nothing; no false gap for the
    offsets of the other lane."""
    broker = FakeBroker()
    topic = "xsg.plan.shared"
    broker.produce(topic, [
        (WARM_KEY, b""),                  # 0
        _rec("a", "m:e:0:0", 1),          # 1
        _rec("b", "m:e:0:0", 101),        # 2
        _rec("b", "m:e:0:1", 102),        # 3: lane a's index 1 is missing
        _rec("a", "m:e:0:2", 3),          # 4
        _fence("User:edge-9"),            # 5
        _rec("b", "m:e:0:2", 103),        # 6
        _rec("a", "m:e:0:0", 1),          # 7: a repeat of lane a's 0 (not of lane b's)
        _rec("b", "m:e:1:0", 104),        # 8: lane b's batch 0 whole: no gap
        _rec("a", "m:e:1:0", 4),          # 9: lane a's batch 0 hole told here
        _rec("b", "m:e:1:0", 104),        # 10: a repeat in lane b
        _rec("c", "m:e:1:0", 999),        # 11: a lane nobody reads here
    ])
    feed = _fake_feed(broker, monkeypatch)
    a = TopicReader(EDGE, "ha", destination(topic, "a"), 0, None)
    b = TopicReader(EDGE, "hb", destination(topic, "b"), 0, None)
    late = TopicReader(EDGE, "hb2", destination(topic, "b"), 0, 3)  # Last-Event-ID 3
    try:
        for r in (a, b, late):
            r.start(feed)
        got_a = _events(a, lambda out: any(i == 10 for _, i, _ in out))
        got_b = _events(b, lambda out: any(i == 9 for _, i, _ in out))
        got_late = _events(late, lambda out: any(i == 9 for _, i, _ in out))
        time.sleep(0.2)
        got_a += _events(a, lambda out: False, 0.2)
        got_b += _events(b, lambda out: False, 0.2)
        assert got_a == [("row", 2, 1), ("row", 5, 3), ("gap", 9, 1), ("row", 10, 4)]
        assert got_b == [("row", 3, 101), ("row", 4, 102), ("row", 7, 103), ("row", 9, 104)]
        assert got_late == [("row", 4, 102), ("row", 7, 103), ("row", 9, 104)]
        assert (a.skipped, b.skipped) == (1, 1)
        assert [c for c in broker.calls if c[0] == "assign"] == [("assign", topic, 0)]
    finally:
        for r in (a, b, late):
            r.close("released")
        feed.close()


@pytest.mark.timeout(30)
def test_a_topic_s_lost_records_are_a_gap_of_unknown_count_on_a_lane_exact_on_a_topic_of_one(
        monkeypatch):
    """Retention: records deleted before the readers join, and while they read. A lane's
    reader is told a gap with `lost` null (how many were its own, nobody knows), a topic of one
    plan's reader the exact count; the other lanes' offsets between two of a lane's records are
    no loss."""
    broker = FakeBroker()
    shared, single = "xsg.plan.lanes", "xsg.plan.one"
    broker.produce(shared, [_rec("a" if i % 2 else "b", f"m:e:0:{i // 2}", i)
                            for i in range(10)])
    broker.produce(single, [_rec("", f"m:e:0:{i}", i) for i in range(10)])
    broker.delete_below(shared, 4)
    broker.delete_below(single, 4)
    feed = _fake_feed(broker, monkeypatch)
    a = TopicReader(EDGE, "ha", destination(shared, "a"), 0, None)
    b = TopicReader(EDGE, "hb", destination(shared, "b"), 0, None)
    one = TopicReader(EDGE, "h1", single, 0, None)
    try:
        for r in (a, b, one):
            r.start(feed)
        assert _events(a, lambda out: len(out) >= 4) == [
            ("gap", 5, None), ("row", 6, 5), ("row", 8, 7), ("row", 10, 9)]
        assert _events(b, lambda out: len(out) >= 4) == [
            ("gap", 4, None), ("row", 5, 4), ("row", 7, 6), ("row", 9, 8)]
        assert _events(one, lambda out: len(out) >= 7) == [
            ("gap", 4, 4), *[("row", i + 1, i) for i in range(4, 10)]]
        # lost while reading: 10-13 written, 10-11 gone before they were read
        broker.produce(shared, [_rec("a", "m:e:1:0", 10), _rec("b", "m:e:1:0", 11),
                                _rec("b", "m:e:1:1", 12), _rec("a", "m:e:1:1", 13)])
        broker.produce(single, [_rec("", f"m:e:1:{i}", 10 + i) for i in range(4)])
        broker.delete_below(shared, 12)
        broker.delete_below(single, 12)
        assert _events(a, lambda out: len(out) >= 2) == [("gap", 13, None), ("row", 14, 13)]
        assert _events(b, lambda out: len(out) >= 2) == [("gap", 12, None), ("row", 13, 12)]
        assert _events(one, lambda out: len(out) >= 3) == [
            ("gap", 12, 2), ("row", 13, 12), ("row", 14, 13)]
        time.sleep(0.2)
        assert not a.read(timeout=0.1) and not b.read(timeout=0.1)
    finally:
        for r in (a, b, one):
            r.close("released")
        feed.close()


@pytest.mark.timeout(30)
def test_a_fence_record_naming_this_edge_ends_the_readers_of_every_lane(monkeypatch):
    broker = FakeBroker()
    topic, other = "xsg.plan.fenced", "xsg.plan.other"
    broker.produce(topic, [_rec("a", "m:e:0:0", 1), _rec("b", "m:e:0:0", 2)])
    broker.produce(other, [_rec("a", "m:e:0:0", 5)])
    feed = _fake_feed(broker, monkeypatch)
    a = TopicReader(EDGE, "ha", destination(topic, "a"), 0, None)
    b = TopicReader(EDGE, "hb", destination(topic, "b"), 0, None)
    elsewhere = TopicReader(EDGE, "hc", destination(other, "a"), 0, None)
    late = TopicReader(EDGE, "hd", destination(topic, "c"), 0, None)
    try:
        for r in (a, b, elsewhere):
            r.start(feed)
        assert _events(a, lambda out: bool(out)) == [("row", 1, 1)]
        assert _events(b, lambda out: bool(out)) == [("row", 2, 2)]
        # the fence and rows after it, fetched together: no reader is handed those rows
        broker.produce(topic, [_fence("User:edge-2", "User:edge-1"),
                               _rec("a", "m:e:0:1", 3), _rec("b", "m:e:0:1", 4)])

        def until_final(out: list[tuple[str, int, object]]) -> bool:
            return any(k == "shutdown" for k, _, _ in out)

        assert _events(a, until_final) == [("shutdown", 1, None)]
        assert _events(b, until_final) == [("shutdown", 2, None)]
        assert _events(elsewhere, lambda out: bool(out)) == [("row", 1, 5)]
        late.start(feed)  # a lane of the fenced topic: ends at once
        assert _events(late, until_final) == [("shutdown", 0, None)]
        assert not elsewhere.closed
    finally:
        for r in (a, b, elsewhere, late):
            r.close("released")
        feed.close()


@pytest.mark.timeout(30)
def test_a_full_lane_reader_neither_stops_the_other_lanes_nor_misses_a_record(monkeypatch):
    """Lane a's reader reads nothing for a while (full after 4 rows): lane b's goes on, the
    topic is not paused for it; then lane a's gets every row, and the consumer goes back no
    further than lane a's reader needs (not to the next offset of a quiet lane's reader, far
    behind). Both full: the topic pauses, and goes on when one has room; nothing is lost."""
    monkeypatch.setattr(reader_module, "MAX_QUEUED", 4)
    broker = FakeBroker()
    topic = "xsg.plan.slow"
    feed = _fake_feed(broker, monkeypatch)
    quiet = TopicReader(EDGE, "hq", destination(topic, "q"), 0, None)
    a = TopicReader(EDGE, "ha", destination(topic, "a"), 0, None)
    b = TopicReader(EDGE, "hb", destination(topic, "b"), 0, None)
    try:
        for r in (quiet, a, b):
            r.start(feed)
        # the records once every reader is there (a reader added after the feed read on
        # would rightly take it back to offset 0: a loaded machine's CI saw that seek)
        broker.produce(topic, [_rec("q", "m:e:0:0", -1)])  # the quiet lane's only row: offset 0
        broker.produce(topic, [rec for i in range(10) for rec in (
            _rec("a", f"m:e:{i}:0", i), _rec("b", f"m:e:{i}:0", 100 + i))])  # offsets 1-20
        assert _events(quiet, lambda out: bool(out)) == [("row", 1, -1)]
        assert _lane_rows(_events(b, lambda out: len(out) >= 10)) == [
            (2 * i + 3, 100 + i) for i in range(10)]
        assert _lane_rows(_events(a, lambda out: len(out) >= 10)) == [
            (2 * i + 2, i) for i in range(10)]
        seeks = [offset for kind, _, offset in broker.calls if kind == "seek"]
        # back to a full reader's next offset at most (a's after its 4th row, offset 7), never
        # to the quiet lane's (1)
        assert seeks and min(seeks) >= 8, broker.calls
        broker.produce(topic, [_rec("q", "m:e:1:0", -2)])  # offset 21: no gap for it
        assert _events(quiet, lambda out: bool(out)) == [("row", 22, -2)]
        # the quiet reader gone, both full: the topic pauses (not while a reader of any lane
        # takes records); nothing lost when they read again
        quiet.close("released")
        broker.produce(topic, [rec for i in range(10, 20) for rec in (
            _rec("a", f"m:e:{i}:0", i), _rec("b", f"m:e:{i}:0", 100 + i))])  # offsets 22-41
        time.sleep(0.5)
        assert ("pause", topic, -1) in broker.calls
        assert _lane_rows(_events(a, lambda out: len(out) >= 10)) == [
            (2 * i + 3, i) for i in range(10, 20)]
        assert _lane_rows(_events(b, lambda out: len(out) >= 10)) == [
            (2 * i + 4, 100 + i) for i in range(10, 20)]
        time.sleep(0.2)
        assert not a.read(timeout=0.1) and not b.read(timeout=0.1)
    finally:
        for r in (quiet, a, b):
            r.close("released")
        feed.close()


@pytest.mark.timeout(30)
def test_a_topic_whose_last_reader_that_takes_records_goes_is_paused(monkeypatch):
    """Lane a's reader is full; lane b's, the only one that takes records, ends: the topic is
    paused (not read for nobody) until lane a's has room, and it misses nothing."""
    monkeypatch.setattr(reader_module, "MAX_QUEUED", 2)
    broker = FakeBroker()
    topic = "xsg.plan.last"
    broker.produce(topic, [rec for i in range(6) for rec in (
        _rec("a", f"m:e:{i}:0", i), _rec("b", f"m:e:{i}:0", 100 + i))])
    feed = _fake_feed(broker, monkeypatch)
    a = TopicReader(EDGE, "ha", destination(topic, "a"), 0, None)
    b = TopicReader(EDGE, "hb", destination(topic, "b"), 0, None)
    try:
        a.start(feed)
        b.start(feed)
        assert len(_lane_rows(_events(b, lambda out: len(out) >= 6))) == 6

        def paused(want: bool) -> bool:
            deadline = time.monotonic() + 5
            while feed._topics[topic].paused != want and time.monotonic() < deadline:
                time.sleep(0.05)
            return feed._topics[topic].paused == want

        assert paused(False)  # b takes records: read on, a full all along
        assert id(a) in feed._topics[topic].blocked
        b.close("released")
        assert paused(True)
        assert _lane_rows(_events(a, lambda out: len(out) >= 6)) == [
            (2 * i + 1, i) for i in range(6)]
    finally:
        a.close("released")
        feed.close()


@pytest.mark.timeout(30)
def test_a_topic_is_assigned_with_its_first_lane_s_reader_and_let_go_with_the_last(monkeypatch):
    broker = FakeBroker()
    topic = "xsg.plan.assign"
    broker.produce(topic, [_rec("a", "m:e:0:0", 1), _rec("b", "m:e:0:0", 2)])
    feed = _fake_feed(broker, monkeypatch)
    a = TopicReader(EDGE, "ha", destination(topic, "a"), 0, None)
    b = TopicReader(EDGE, "hb", destination(topic, "b"), 1, None)
    try:
        a.start(feed)
        assert _events(a, lambda out: bool(out)) == [("row", 1, 1)]
        b.start(feed)
        assert _events(b, lambda out: bool(out)) == [("row", 2, 2)]
        a.close("released")
        time.sleep(0.3)

        def assigns() -> list[tuple[str, str, int]]:
            return [c for c in broker.calls if "assign" in c[0]]  # (b joined below: a seek)

        assert assigns() == [("assign", topic, 0)]
        b.close("released")
        deadline = time.monotonic() + 5
        while len(assigns()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert assigns() == [("assign", topic, 0), ("unassign", topic, -1)]
    finally:
        feed.close()


@pytest.mark.timeout(30)
def test_a_lane_reader_on_a_feed_of_its_own(monkeypatch):
    broker = FakeBroker()
    topic = "xsg.plan.own"
    broker.produce(topic, [(WARM_KEY, b""), _rec("b", "m:e:0:0", 2), _rec("a", "m:e:0:0", 1)])
    monkeypatch.setattr(EdgeFeed, "_consumer", lambda self: broker.consumer())
    reader = TopicReader(EDGE, "ha", destination(topic, "a"), 0, None)
    try:
        reader.start()
        assert _events(reader, lambda out: bool(out)) == [("row", 3, 1)]
    finally:
        reader.close("released")


def test_a_reader_tells_a_loss_only_below_the_feed_s_run():
    """`offer` directly: offsets that jump within the feed's run are other lanes' (no gap);
    a run that begins above the next offset needed is a loss, counted on a topic of one plan
    (less what the reader was given already: `Last-Event-ID`)."""
    lane = TopicReader(EDGE, "h", "t#a", 0, None)
    assert lane.offer(3, b"m:e:0:0", b'{"v":0}', 0)
    assert lane.offer(7, b"m:e:0:1", b'{"v":1}', 0)
    assert lane.offer(12, b"m:e:0:2", b'{"v":2}', 10)
    lane.flush()
    assert [(e.kind, e.id, json.loads(e.data).get("lost")) for e in lane.read()] == [
        ("row", 4, None), ("row", 8, None), ("gap", 12, None), ("row", 13, None)]
    one = TopicReader(EDGE, "h", "t", 0, 5)  # given up to event 5 (offset 4)
    assert one.offer(7, b"m:e:0:0", b'{"v":0}', 7)  # 0-6 gone, 5-6 not given yet
    one.flush()
    assert [(e.kind, e.id, json.loads(e.data).get("lost")) for e in one.read()] == [
        ("gap", 7, 2), ("row", 8, None)]


@pytest.mark.timeout(90)
def test_two_plans_lanes_of_one_real_topic_read_through_one_edge_feed(kafka_broker):
    """A real broker: two destinations on one topic, read by one edge's consumer; each reader
    gets its lane's rows (ids = offsets + 1), its lane's hole and repeat, and nothing else."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT",
                                prefix=f"ln{int(time.time() * 1000) % 100000}.")
    topic = settings.plan_prefix + "lanes"
    ensure_topics(AdminClient({"bootstrap.servers": kafka_broker.bootstrap}), settings, [topic])
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "acks": "all",
                         "enable.idempotence": True})
    for key, value in [(WARM_KEY, b""),             # 0
                       _rec("a", "m:e:0:0", 1),      # 1
                       _rec("b", "m:e:0:0", 11),     # 2
                       _rec("a", "m:e:0:2", 3),      # 3: lane a lacks index 1
                       _rec("b", "m:e:0:1", 12),     # 4
                       _rec("b", "m:e:0:0", 11),     # 5: a repeat in lane b
                       _rec("a", "m:e:1:0", 4),      # 6: lane a's hole told here
                       _rec("b", "m:e:1:0", 14)]:    # 7
        producer.produce(topic, value, key)
    assert producer.flush(30) == 0
    feed = EdgeFeed(settings)
    a = TopicReader(settings, "ha", destination(topic, "a"), 0, None)
    b = TopicReader(settings, "hb", destination(topic, "b"), 0, None)
    try:
        a.start(feed)
        b.start(feed)
        assert _events(a, lambda out: len(out) >= 4, 30) == [
            ("row", 2, 1), ("row", 4, 3), ("gap", 6, 1), ("row", 7, 4)]
        assert _events(b, lambda out: len(out) >= 3, 30) == [
            ("row", 3, 11), ("row", 5, 12), ("row", 8, 14)]
        time.sleep(0.3)
        assert not a.read(timeout=0.1) and not b.read(timeout=0.1)
    finally:
        a.close("released")
        b.close("released")
        feed.close()
