"""Holes in real-time mode's plan topics (issue 45): a record lost between Spark's real-time
tasks and the edge is told to the reader as a `gap` with its count, as in micro-batch mode, and
nothing lost is never told. The gateway writes a count marker per plan topic after each
real-time batch (`pep.runtime.query.realtime_mode.CountMarkers`); the edge compares it with
what it read (`pep.edge.reader.CountLog`). Real broker; the second test a real real-time query."""
from __future__ import annotations

import json
import threading
import time

import pytest

from pep.delivery.settings import DeliverySettings
from pep.edge.reader import TopicReader

pytestmark = pytest.mark.timeout(240)


def events(reader: TopicReader, until, timeout: float) -> list:
    """Every event read until `until(events)` holds or `timeout` seconds passed."""
    out: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not until(out):
        out += reader.read(timeout=0.3)
    return out


def rows_and_gaps(got: list) -> tuple[list, list]:
    return ([json.loads(e.data) for e in got if e.kind == "row"],
            [json.loads(e.data)["lost"] for e in got if e.kind == "gap"])


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, value, key)
    assert producer.flush(30) == 0


def r(offset: int, partition: int = 0) -> tuple[bytes, bytes]:
    """A real-time record of source offset `offset` (its value says which)."""
    return (f"r:e1:src/{partition:010d}/{offset:020d}".encode(),
            json.dumps({"o": offset}).encode())


def c(mark: str, after: str | None, ranges: dict | None = None, rows: int = 0
      ) -> tuple[bytes, bytes]:
    body: dict = {"after": after}
    if ranges is not None:
        body.update(ranges=ranges, rows=rows)
    return f"c:e1:{mark}".encode(), json.dumps(body).encode()


def test_an_edge_tells_a_real_time_batch_s_missing_records_as_a_gap(kafka_broker, kafka_topic):
    """A topic as a real-time query and the gateway write it, with a record lost (batch 1 lacks
    source offset 7): the reader gets every row once, the markers never as rows, and one gap of
    1 after batch 1's rows; batch 0 (a record written twice by a restarted query) is whole, no
    gap. A reader that joined within batch 0 cannot check it (no alarm) but checks batch 1; a
    marker whose `after` no reader read checks nothing."""
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT")
    topic = kafka_topic(1)
    produce(kafka_broker.bootstrap, topic, [
        c("oA", None),                                      # 0: the query's opening marker
        r(0), r(1), r(2),                                   # 1-3
        r(2),                                               # 4: written again (a restart)
        r(3), r(4),                                         # 5-6
        r(5),                                               # 7: batch 1, before marker b0
        c("b0", "oA", {"src/0": [0, 5]}, 5),                # 8: whole
        r(6), r(8),                                         # 9-10: offset 7 lost
        c("b1", "b0", {"src/0": [5, 9]}, 4),                # 11: one lacking
        r(9),                                               # 12
        c("b2", "zz", {"src/0": [9, 12]}, 3),               # 13: after a marker nobody read
    ])
    whole = TopicReader(settings, "h1", topic, 0, None)
    late = TopicReader(settings, "h2", topic, 5, None)  # joined at source offset 3
    readers = [whole, late]
    try:
        whole.start()
        late.start()
        got = events(whole, lambda out: any(e.id == 13 for e in out), 60)
        rows, gaps = rows_and_gaps(got)
        assert [r_["o"] for r_ in rows] == [0, 1, 2, 3, 4, 5, 6, 8, 9], got
        assert gaps == [1], got
        gap = next(e for e in got if e.kind == "gap")
        assert gap.id == 11 and json.loads(gap.data)["resume_from"] == 12  # at marker b1
        assert [e.id for e in got if e.kind == "row"] == [2, 3, 4, 6, 7, 8, 10, 11, 13]

        got = events(late, lambda out: any(e.id == 13 for e in out), 60)
        rows, gaps = rows_and_gaps(got)
        assert [r_["o"] for r_ in rows] == [3, 4, 5, 6, 8, 9], got
        assert gaps == [1], got  # batch 0 not checked (it lacks 0-2), batch 1 is
        time.sleep(1.0)
        assert not whole.read(timeout=0.2) and not late.read(timeout=0.2)  # nothing more

        # a reader resuming (Last-Event-ID) after the gap's marker is not told it again; the
        # markers' positions count as the warm record's do: the next row is the next event
        resumed = TopicReader(settings, "h1", topic, 0, 12)
        readers.append(resumed)
        resumed.start()
        got = events(resumed, lambda out: any(e.id == 13 for e in out), 60)
        assert [(e.kind, e.id) for e in got] == [("row", 13)], got
    finally:
        for reader in readers:
            reader.close("released")


def test_a_real_time_query_s_lost_record_reaches_the_reader_as_a_gap(
        spark, tmp_path, kafka_broker, kafka_topic, producer):
    """A real real-time query writes a plan topic; a relay copies it record for record to a
    second topic but drops one row (lost between the writer and the edge). The reader of the
    relayed topic gets a gap of 1 once the batch's count marker comes; the reader of the
    plan topic itself gets every row and never a gap."""
    from confluent_kafka import Consumer, Producer

    from pep.core.plan import ExecutionPlan, Predicate
    from pep.ports import TopicTarget
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    from tests.kafka.test_kafka_runtime import kafka_stream, rec

    source = kafka_topic(1)
    stream = kafka_stream(kafka_broker, source)
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT",
                                realtime=5.0)
    topic, relayed = kafka_topic(1), kafka_topic(1)
    rt = StreamRuntime(spark, tmp_path / "work", settings=RuntimeSettings(
        trigger_interval=0.25, delivery=settings))
    stop = threading.Event()
    markers: list[dict] = []

    def relay() -> None:
        consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": "relay",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        out = Producer({"bootstrap.servers": kafka_broker.bootstrap, "acks": "all",
                        "enable.idempotence": True, "linger.ms": 0})
        consumer.subscribe([topic])
        try:
            while not stop.is_set():
                msg = consumer.poll(0.2)
                if msg is None or msg.error() is not None:
                    continue
                key, value = msg.key() or b"", msg.value() or b""
                if key.startswith(b"c:"):
                    markers.append(json.loads(value))
                if key.startswith(b"r:") and json.loads(value).get("v") == 2.0:
                    continue  # lost on its way
                out.produce(relayed, value, key)
                out.flush(10)
        finally:
            consumer.close()

    thread = threading.Thread(target=relay, daemon=True)
    readers: list[TopicReader] = []
    try:
        rt.attach_handle("a", stream, ExecutionPlan(stream.name, ((Predicate("v", ">", 0.0),),),
                                                    ("v",)), TopicTarget(topic, lambda: True))
        assert rt._executors[stream.name].lifecycle.mode == "realtime"
        direct = TopicReader(settings, "a", topic, 0, None)
        lossy = TopicReader(settings, "a", relayed, 0, None)
        readers += [direct, lossy]
        direct.start()
        lossy.start()
        thread.start()
        time.sleep(3.0)  # the real-time batch's tasks read the partition
        producer.send(source, [rec(1, 1.0), rec(2, -9.0), rec(3, 2.0), rec(4, 3.0)], partition=0)
        time.sleep(2.0)
        producer.send(source, [rec(5, 4.0)], partition=0)

        def told(out: list) -> bool:
            """The gap and the last row: with 5 s batches, record 5 lands in the first
            batch or the next one, so the gap may come before or after its row."""
            return any(e.kind == "gap" for e in out) and \
                any(e.kind == "row" and json.loads(e.data).get("v") == 4.0 for e in out)
        got = events(lossy, told, 90)
        rows, gaps = rows_and_gaps(got)
        assert gaps == [1], (got, markers)
        assert [r_["v"] for r_ in rows] == [1.0, 3.0, 4.0], got
        # the plan topic itself: every row, and no gap over the markers of several batches
        got = events(direct, lambda out: False, 1.0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and \
                sum(1 for m in markers if m.get("ranges")) < 3:
            got += direct.read(timeout=0.5)
        got += direct.read(timeout=0.5)
        rows, gaps = rows_and_gaps(got)
        assert [r_["v"] for r_ in rows] == [1.0, 2.0, 3.0, 4.0], got
        assert gaps == [], (got, markers)
        checked = [m for m in markers if m.get("rows") and m.get("after")]
        assert sum(m["rows"] for m in checked) == 4, markers  # the counts were checked
    finally:
        stop.set()
        for r_ in readers:
            r_.close("released")
        rt.stop()
        thread.join(10)


def test_a_marker_names_its_batch_s_ranges_and_an_earlier_marker_acknowledged_before_it():
    """`batch_ranges`: [start, end) per source partition from a progress's offsets (a new
    checkpoint's first batch has no start: from 0); `_Anchors.before`: the latest marker of
    the topic acknowledged before the batch began, none when there is none."""
    from types import SimpleNamespace

    from pep.runtime.query.realtime import batch_ranges, marker_value
    from pep.runtime.query.realtime_mode import _Anchors
    first = SimpleNamespace(startOffset=None, endOffset='{"src": {"0": 3, "1": 5}}')
    later = SimpleNamespace(startOffset='{"src": {"0": 3, "1": 5}}',
                            endOffset='{"src": {"0": 9, "1": 5, "2": 4}}')
    assert batch_ranges([first]) == {"src/0": (0, 3), "src/1": (0, 5)}
    assert batch_ranges([later]) == {"src/0": (3, 9), "src/1": (5, 5), "src/2": (0, 4)}
    assert json.loads(marker_value({"src/0": (3, 9)}, 4, "b1")) == {
        "after": "b1", "ranges": {"src/0": [3, 9]}, "rows": 4}
    assert json.loads(marker_value(None, None, None)) == {"after": None}
    anchors = _Anchors()
    assert anchors.before("t", 100.0) is None
    anchors.add("t", "oX", 10.0)
    anchors.add("t", "b0", 20.0)
    anchors.add("u", "b0", 5.0)
    assert anchors.before("t", 15.0) == "oX" and anchors.before("t", 25.0) == "b0"
    assert anchors.before("t", 20.0) == "oX"  # acknowledged at the batch's start: not before
