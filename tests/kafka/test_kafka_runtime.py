"""Kafka streams on the shared runtime: a real broker, topics of three partitions, records from an
outside producer (confluent-kafka), every kind of plan checked against what it must give."""
from __future__ import annotations

import time

import pytest

from pep.core.plan import (
    Aggregate,
    ExecutionPlan,
    Field,
    Predicate,
    SourceSpec,
    SpatialPredicate,
    StreamDefinition,
    StreamSchema,
    WindowSpec,
)
from tests.pep.runtime.support import Collector, wait_until

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("station", "string"),
                       Field("v", "double"), Field("lat", "double"), Field("lon", "double")))
T0 = 1_700_000_000


def kafka_stream(broker, topic: str, name: str | None = None) -> StreamDefinition:
    return StreamDefinition(name or f"k_{topic.replace('-', '_')}", "owner", SCHEMA,
                            SourceSpec("kafka", (("bootstrap.servers", broker.bootstrap),
                                                 ("subscribe", topic))),
                            time_attribute="ts")


def rec(t: float, v: float, station: str = "A", lat: float = 1.30, lon: float = 103.80) -> dict:
    return {"ts": T0 + t, "station": station, "v": v, "lat": lat, "lon": lon}


def one_batch(spark, work, stream: StreamDefinition, plans: dict[str, ExecutionPlan],
              produce) -> tuple[object, dict[str, Collector]]:
    """Attach the plans, stop the query with them attached (it resumes from its checkpoint),
    produce, start again: everything produced meanwhile comes in the resumed query's first
    micro-batch, so the order within one micro-batch is checked whole."""
    from pep.runtime.runtime import StreamRuntime
    first = StreamRuntime(spark, work, trigger_interval=0.25)
    try:
        for handle, plan in plans.items():
            first.attach_handle(handle, stream, plan, Collector())
    finally:
        first.stop()
    produce()
    second = StreamRuntime(spark, work, trigger_interval=0.25)
    sinks = {handle: Collector() for handle in plans}
    for handle, plan in plans.items():
        second.attach_handle(handle, stream, plan, sinks[handle])
    return second, sinks


def committed(work, stream: StreamDefinition) -> bool:
    """Every micro-batch the stream's query planned is committed in its checkpoint."""
    query = work / "checkpoints" / stream.name / "query"
    ids = [{int(p.name) for p in (query / d).glob("[0-9]*")} for d in ("offsets", "commits")]
    return bool(ids[0]) and max(ids[0]) == max(ids[1], default=-1)


@pytest.fixture
def kafka_runtime(spark, tmp_path, kafka_broker):
    from pep.runtime.runtime import StreamRuntime
    rt = StreamRuntime(spark, tmp_path / "work", trigger_interval=0.25)
    yield rt
    rt.stop()


def test_filters_maps_and_stream_order_across_partitions(spark, tmp_path, kafka_broker,
                                                         kafka_topic, producer):
    """One micro-batch's rows in the documented stream order: event time, then partition, then
    offset; a value that is not a JSON object is dropped."""
    topic = kafka_topic(3)
    stream = kafka_stream(kafka_broker, topic)
    plan = ExecutionPlan(stream.name, ((Predicate("v", ">", 0.0),),), ("station", "v"))

    def produce() -> None:
        producer.send(topic, [rec(5, 5.0), rec(2, 2.0), rec(7, -7.0), rec(9, 9.2, "C")],
                      partition=2)
        producer.send(topic, [rec(1, 1.0), rec(9, 9.1, "B"), rec(9, 9.0, "B2"), rec(4, 4.0)],
                      partition=1)
        producer.send(topic, [b"not json", b"[1, 2]", rec(3, 3.0), rec(9, 9.3, "A")],
                      partition=0)
    rt, sinks = one_batch(spark, tmp_path / "work", stream, {"h": plan}, produce)
    try:
        rows = sinks["h"]
        assert wait_until(lambda: len(rows.rows) >= 8, 90), rows.rows
        time.sleep(0.5)
        # ties at ts 9: partition 0, then 1 (offset order: 9.1 before 9.0), then 2
        assert [(r["station"], r["v"]) for r in rows.rows] == [
            ("A", 1.0), ("A", 2.0), ("A", 3.0), ("A", 4.0), ("A", 5.0),
            ("A", 9.3), ("B", 9.1), ("B2", 9.0), ("C", 9.2)]
        assert len(rows.batches) == 1
    finally:
        rt.stop()


def test_a_new_handle_starts_at_the_latest_offsets(kafka_runtime, kafka_broker, kafka_topic,
                                                   producer):
    topic = kafka_topic(3)
    stream = kafka_stream(kafka_broker, topic)
    producer.send(topic, [rec(0, 99.0)], partition=0)  # before any handle: never delivered
    rows = Collector()
    kafka_runtime.attach_handle("h", stream, ExecutionPlan(stream.name, None, ("v",)), rows)
    # attach returned: the query has fixed its starting offsets, so this is read
    producer.send(topic, [rec(1, 1.0)], partition=0)
    producer.send(topic, [rec(2, 2.0)], partition=2)
    assert wait_until(lambda: len(rows.rows) >= 2, 90)
    time.sleep(0.5)
    assert sorted(r["v"] for r in rows.rows) == [1.0, 2.0]


def test_tuple_windows_count_in_stream_order_across_partitions(spark, tmp_path, kafka_broker,
                                                                kafka_topic, producer):
    topic = kafka_topic(3)
    stream = kafka_stream(kafka_broker, topic)
    window = WindowSpec("tuple", 3, 3, (Aggregate("v", "firstval"), Aggregate("v", "lastval"),
                                        Aggregate("v", "sum")))
    keyed = WindowSpec("tuple", 2, 2, (Aggregate("v", "max"), Aggregate("v", "firstval")),
                       keys=("station",))
    plans = {"w": ExecutionPlan(stream.name, None, (), window),
             "k": ExecutionPlan(stream.name, None, (), keyed)}

    def produce() -> None:
        # event times interleave across partitions; ts 3 twice (partition 0 before 2)
        producer.send(topic, [rec(1, 1.0, "A"), rec(3, 30.0, "B"), rec(6, 6.0, "B")],
                      partition=0)
        producer.send(topic, [rec(2, 2.0, "B"), rec(4, 4.0, "A")], partition=1)
        producer.send(topic, [rec(3, 31.0, "A"), rec(5, 5.0, "B")], partition=2)
    rt, sinks = one_batch(spark, tmp_path / "work", stream, plans, produce)
    try:
        assert wait_until(lambda: len(sinks["w"].rows) >= 2 and len(sinks["k"].rows) >= 3, 90)
        time.sleep(0.5)
        # stream order: 1, 2, 30, 31, 4, 5, 6
        assert sinks["w"].rows == [
            {"window_start": 0, "window_end": 2, "firstval_v": 1.0, "lastval_v": 30.0,
             "sum_v": 33.0},
            {"window_start": 3, "window_end": 5, "firstval_v": 31.0, "lastval_v": 5.0,
             "sum_v": 40.0}]
        # per station: A = 1, 31, 4; B = 2, 30, 5, 6
        got = {(r["station"], r["window_start"]): (r["max_v"], r["firstval_v"])
               for r in sinks["k"].rows}
        assert got == {("A", 0): (31.0, 1.0), ("B", 0): (30.0, 2.0), ("B", 2): (6.0, 5.0)}
    finally:
        rt.stop()


def test_time_windows_group_by_and_spatial_filter(kafka_runtime, kafka_broker, kafka_topic,
                                                  producer):
    topic = kafka_topic(3)
    stream = kafka_stream(kafka_broker, topic)
    windows, near = Collector(), Collector()
    window = WindowSpec("time", 10, 10, (Aggregate("v", "avg"), Aggregate("v", "count")),
                        time_attribute="ts", min_count=2, keys=("station",))
    kafka_runtime.attach_handle("t", stream, ExecutionPlan(stream.name, None, (), window), windows)
    # within 5 km of (1.30, 103.80): the far station (1.50, 104.10) never passes
    spatial = ExecutionPlan(stream.name, ((SpatialPredicate("distance", "lat", "lon", "<=",
                                                            5000.0, (1.30, 103.80)),),),
                            ("station", "v"))
    kafka_runtime.attach_handle("s", stream, spatial, near)
    start = (T0 + 1000) // 10 * 10 - T0  # [T0+start, T0+start+10) is one epoch-aligned window
    producer.send(topic, [rec(start + 1, 1.0, "A"), rec(start + 2, 3.0, "B")], partition=0)
    producer.send(topic, [rec(start + 3, 5.0, "A"), rec(start + 4, 5.0, "B", 1.50, 104.10)],
                  partition=1)
    producer.send(topic, [rec(start + 5, 9.0, "A"), rec(start + 25, 0.0, "A")], partition=2)
    assert wait_until(lambda: len(windows.rows) >= 2 and len(near.rows) >= 5, 90), (
        windows.rows, near.rows)
    time.sleep(0.5)
    got = {r["station"]: (r["avg_v"], r["count_v"]) for r in windows.rows}
    assert got == {"A": (5.0, 3), "B": (4.0, 2)}
    assert sorted((r["station"], r["v"]) for r in near.rows) == [
        ("A", 0.0), ("A", 1.0), ("A", 5.0), ("A", 9.0), ("B", 3.0)]


def test_a_stopped_query_resumes_from_its_checkpoint(spark, tmp_path, kafka_broker, kafka_topic,
                                                     producer):
    """The gateway stopping with handles attached: the next start reads what was produced
    meanwhile, nothing twice; after the last handle left, a new handle starts at the end."""
    from pep.runtime.runtime import StreamRuntime
    topic = kafka_topic(2)
    stream = kafka_stream(kafka_broker, topic)
    plan = ExecutionPlan(stream.name, None, ("v",))
    first = StreamRuntime(spark, tmp_path / "work", trigger_interval=0.25)
    rows = Collector()
    try:
        first.attach_handle("h", stream, plan, rows)
        producer.send(topic, [rec(1, 1.0), rec(2, 2.0)], partition=0)
        assert wait_until(lambda: len(rows.rows) >= 2, 90)
        # a micro-batch is committed after its delivery; one stopped before that is run again
        assert wait_until(lambda: committed(tmp_path / "work", stream), 30)
    finally:
        first.stop()
    producer.send(topic, [rec(3, 3.0)], partition=0)
    producer.send(topic, [rec(4, 4.0)], partition=1)  # while no query runs
    second = StreamRuntime(spark, tmp_path / "work", trigger_interval=0.25)
    again = Collector()
    try:
        second.attach_handle("h", stream, plan, again)
        assert wait_until(lambda: len(again.rows) >= 2, 90)
        time.sleep(0.5)
        assert sorted(r["v"] for r in again.rows) == [3.0, 4.0]
        second.detach("h")  # the last handle left: the next one starts at the latest offsets
        producer.send(topic, [rec(5, 5.0)], partition=0)
        late = Collector()
        second.attach_handle("h2", stream, plan, late)
        producer.send(topic, [rec(6, 6.0)], partition=1)
        assert wait_until(lambda: len(late.rows) >= 1, 90)
        time.sleep(0.5)
        assert [r["v"] for r in late.rows] == [6.0]
    finally:
        second.stop()
