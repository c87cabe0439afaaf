"""A Kafka handle resumed after a restart (issue 41, item 3), on the runtime with a real broker:
its buffer names rows by micro-batch, the restart reads the stream's micro-batches again, and a
reader resuming from the id it last had gets exactly what followed. `gap` only when rows were
lost: with their count when the buffer dropped them, and `lost: null` (said so) only when the
records themselves are gone from the topic, so that nobody can tell how many of them the
policy would have let through."""
from __future__ import annotations

import json
from dataclasses import replace

from pep.core.plan import ExecutionPlan, Predicate, UnionPlan, with_start_offsets
from pep.core.rows import RowBatch
from pep.handles.buffer import HandleBuffer
from tests.kafka.test_kafka_runtime import kafka_stream, rec
from tests.pep.runtime.support import wait_until


def rows(events) -> list[float]:
    return [json.loads(e.data)["v"] for e in events if e.kind == "row"]


def gaps(events) -> list[dict]:
    return [json.loads(e.data) for e in events if e.kind == "gap"]


def first_run(spark, work, stream, plan, producer, topic, union=None
              ) -> tuple[HandleBuffer, int, HandleBuffer]:
    """A runtime reads 12 matching records (and hidden ones) into a positioned buffer whose
    reader takes the first 3 (and, with `union`, into a union's); then the gateway stops.
    (buffer, the reader's last id, the union's buffer)."""
    from pep.runtime.runtime import StreamRuntime
    rt = StreamRuntime(spark, work, trigger_interval=0.25)
    buffer = HandleBuffer(100, 1 << 20, positioned=True)
    merged = HandleBuffer(100, 1 << 20, positioned=True)
    try:
        rt.attach_handle("h", stream, plan, buffer.put)
        if union is not None:
            rt.attach_handle("u", stream, union, merged.put)
        producer.send(topic, [rec(i, float(i)) for i in range(1, 5)], partition=0)
        assert wait_until(lambda: len(buffer) >= 4, 90)
        seen = buffer.read(None, timeout=0, limit=3)
        assert rows(seen) == [1.0, 2.0, 3.0]
        producer.send(topic, [rec(i, -1.0) for i in range(5, 8)], partition=1)  # hidden
        producer.send(topic, [rec(i, float(i)) for i in range(8, 16)], partition=1)
        assert wait_until(lambda: len(buffer) >= 12, 90)
    finally:
        rt.stop()
    return buffer, seen[-1].id, merged


def restored(spark, work, stream, plan, max_rows: int, union=None
             ) -> tuple[object, HandleBuffer, HandleBuffer]:
    """The next start: the handles restored into fresh positioned buffers, `max_rows` each."""
    from pep.runtime.runtime import StreamRuntime
    rt = StreamRuntime(spark, work, trigger_interval=0.25)
    buffer = HandleBuffer(max_rows, 1 << 20, positioned=True)
    merged = HandleBuffer(max_rows, 1 << 20, positioned=True)
    with rt.restoring():
        rt.attach_handle("h", stream, plan, buffer.put)
        if union is not None:
            rt.attach_handle("u", stream, union, merged.put)
    return rt, buffer, merged


def test_a_restart_gives_exactly_what_followed_and_counts_what_its_buffer_dropped(
        spark, tmp_path, kafka_broker, kafka_topic, producer):
    from pep.runtime.sources.kafka_offsets import KafkaOffsets
    topic = kafka_topic(2)
    stream = kafka_stream(kafka_broker, topic)
    cut = KafkaOffsets().end_offsets(stream)
    plan = replace(ExecutionPlan(stream.name, ((Predicate("v", ">", 0.0),),), ("v",)),
                   start_offsets=cut)
    # a union of two grants (pep.core.union): every tuple once, each member's attributes
    union = with_start_offsets(UnionPlan(stream.name, (
        ExecutionPlan(stream.name, ((Predicate("v", ">", 10.0),),), ("ts", "v")),
        ExecutionPlan(stream.name, ((Predicate("v", "<", 3.0),),), ("station",)))), cut)
    before, last, merged = first_run(spark, tmp_path / "work", stream, plan, producer, topic,
                                     union)
    wanted = [float(i) for i in range(4, 16) if i not in (5, 6, 7)]
    # what the first process would have given next
    ids = {json.loads(e.data)["v"]: e.id for e in before.read(last, timeout=0)}
    was = [(e.id, e.data) for e in merged.read(None, timeout=0)]
    assert len(was) == 10  # v < 3: 1, 2 and the three at -1; v > 10: 11 to 15
    # a buffer that holds all of it: exactly the rest, under the same ids, no gap
    rt, again, union_again = restored(spark, tmp_path / "work", stream, plan, 100, union)
    try:
        events = again.read(last, timeout=0)
        assert not gaps(events) and rows(events) == wanted
        assert {json.loads(e.data)["v"]: e.id for e in events} == ids
        assert [(e.id, e.data) for e in union_again.read(None, timeout=0)] == was
        # and what comes next continues them
        producer.send(topic, [rec(16, 16.0)], partition=0)
        assert wait_until(lambda: again.last_id > max(ids.values()), 90)
        assert rows(again.read(max(ids.values()), timeout=0)) == [16.0]
    finally:
        rt.stop()
    # a buffer of 4 rows: the 6 oldest of the 10 rows the reader had not read were dropped
    rt, small, _ = restored(spark, tmp_path / "work", stream, plan, 4)
    try:
        events = small.read(last, timeout=0)
        assert gaps(events) == [{"event": "gap", "lost": 6, "resume_from": events[0].id,
                                 "reason": "buffer full"}]
        assert rows(events) == [13.0, 14.0, 15.0, 16.0]
        # a reader that had read up to 13: nothing lost
        assert rows(small.read(ids[13.0], timeout=0)) == [14.0, 15.0, 16.0]
        assert not gaps(small.read(ids[13.0], timeout=0))
    finally:
        rt.stop()


def test_records_gone_from_the_topic_are_a_gap_of_unknown_size(spark, tmp_path, kafka_broker,
                                                               kafka_topic, producer):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from pep.runtime.sources.kafka_offsets import KafkaOffsets
    topic = kafka_topic(2)
    stream = kafka_stream(kafka_broker, topic)
    plan = replace(ExecutionPlan(stream.name, ((Predicate("v", ">", 0.0),),), ("v",)),
                   start_offsets=KafkaOffsets().end_offsets(stream))
    _, last, _ = first_run(spark, tmp_path / "work", stream, plan, producer, topic)
    # while no gateway runs, the owner deletes the records (as retention would)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, p, -1) for p in (0, 1)]).values():
        future.result(30)
    rt, again, _ = restored(spark, tmp_path / "work", stream, plan, 100)
    try:
        producer.send(topic, [rec(20, 20.0)], partition=0)
        assert wait_until(lambda: len(again) >= 1, 90)
        events = again.read(last, timeout=0)
        gap = gaps(events)
        assert len(gap) == 1 and gap[0]["lost"] is None and gap[0]["reason"] == \
            "gateway restarted"
        assert rows(events) == [20.0]
        # a reader that starts afresh (no id) is told of nothing lost: it names no position
        assert not gaps(again.read(None, timeout=0))
    finally:
        rt.stop()


def test_a_window_or_an_uncut_handle_is_not_positioned(spark):
    """Only replayable plans get positioned buffers: their rows depend on each batch alone."""
    from pep.core.plan import Aggregate, WindowSpec, replayable
    plain = ExecutionPlan("k", None, ("v",))
    assert not replayable(plain)
    assert replayable(replace(plain, start_offsets=(0,)))
    windowed = replace(ExecutionPlan("k", None, (), WindowSpec(
        "tuple", 2, 2, (Aggregate("v", "sum"),))), start_offsets=(0,))
    assert not replayable(windowed)
    assert RowBatch((), 0, resumed_from=0).resumed_from == 0
