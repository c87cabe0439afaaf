"""Real-time mode (issue 45, `pep.runtime.query.realtime`): a Kafka stream whose plans all
compile to Spark expressions runs one real-time query from its topic to the plan topics; its
rows are read through the edge's own reader of a plan topic (`pep.edge.reader.TopicReader`:
event ids, skipping what a restarted query writes again). A plan that does not qualify (a
window) makes the stream's query micro-batches again."""
from __future__ import annotations

import json
import time

import pytest

from pep.core.plan import Aggregate, ExecutionPlan, Predicate, WindowSpec
from pep.delivery.settings import DeliverySettings
from pep.edge.reader import TopicReader
from pep.ports import TopicTarget
from tests.kafka.test_kafka_runtime import kafka_stream, rec


def read_rows(reader: TopicReader, want: int, timeout: float = 90.0,
              settle: float = 3.0) -> list[tuple[int, dict]]:
    """(event id, row) of every row event until `want` came, then `settle` seconds more (a
    row too many would come then)."""
    out: list[tuple[int, dict]] = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        out += [(e.id, json.loads(e.data)) for e in reader.read(timeout=0.5) if e.kind == "row"]
    end = time.monotonic() + settle
    while time.monotonic() < end:
        out += [(e.id, json.loads(e.data)) for e in reader.read(timeout=0.5) if e.kind == "row"]
    return out


def wait_for(check, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_a_qualifying_stream_runs_in_real_time_mode_and_falls_back_for_a_window(
        spark, tmp_path, kafka_broker, kafka_topic, producer):
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    source = kafka_topic(1)  # the test session has 2 task slots: one for the partition
    stream = kafka_stream(kafka_broker, source)
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT",
                                realtime=5.0)
    topic_a, topic_b, topic_w = kafka_topic(1), kafka_topic(1), kafka_topic(1)
    rt = StreamRuntime(spark, tmp_path / "work", settings=RuntimeSettings(
        trigger_interval=0.25, delivery=settings))
    readers: list[TopicReader] = []
    try:
        open_ = lambda: True  # noqa: E731 - a callback that always answers True
        rt.attach_handle("a", stream, ExecutionPlan(stream.name, ((Predicate("v", ">", 0.0),),),
                                                    ("station", "v")),
                         TopicTarget(topic_a, open_))
        lifecycle = rt._executors[stream.name].lifecycle
        assert lifecycle.mode == "realtime"
        a = TopicReader(settings, "a", topic_a, 0, None)
        readers.append(a)
        a.start()
        time.sleep(3.0)  # the real-time batch's tasks read the partition
        assert rt._warmer.idle(60)  # the topic's first record is in (warm.py)
        producer.send(source, [rec(1, 1.0), rec(2, -2.0), rec(3, 3.0, "B")], partition=0)
        got = read_rows(a, 2)
        assert [r for _, r in got] == [{"station": "A", "v": 1.0}, {"station": "B", "v": 3.0}]
        # event ids: the topic's offsets + 1 (offset 0: the record that made the new topic
        # known to the producer, pep/runtime/delivery/warm.py)
        assert [i for i, _ in got] == [2, 3]

        # a second qualifying plan: the query starts again with both (its plans are literals),
        # and may write again what it read since its last commit: the edge's reader skips it
        rt.attach_handle("b", stream, ExecutionPlan(stream.name, ((Predicate("v", "<", 0.0),),),
                                                    ("v",)),
                         TopicTarget(topic_b, open_))
        assert wait_for(lambda: lifecycle.mode == "realtime" and lifecycle.active
                        and len(lifecycle.realtime_plans) == 2)
        b = TopicReader(settings, "b", topic_b, 0, None)
        readers.append(b)
        b.start()
        time.sleep(3.0)
        producer.send(source, [rec(4, 4.0), rec(5, -5.0)], partition=0)
        got_a = read_rows(a, 1)
        assert [r for _, r in got_a] == [{"station": "A", "v": 4.0}]
        got_b = read_rows(b, 1)
        assert [r for _, r in got_b] == [{"v": -5.0}]

        # a window plan does not qualify: the stream's query runs micro-batches again, and the
        # row plans' rows keep coming (through the micro-batches' writer)
        window = WindowSpec("tuple", 2, 2, (Aggregate("v", "sum"),))
        rt.attach_handle("w", stream, ExecutionPlan(stream.name, None, (), window),
                         TopicTarget(topic_w, open_))
        assert wait_for(lambda: lifecycle.mode == "micro-batch" and lifecycle.active)
        producer.send(source, [rec(6, 6.0), rec(7, 7.0)], partition=0)
        got_a = read_rows(a, 2)
        late = [r["v"] for _, r in got_a if r["v"] >= 6.0]
        assert sorted(set(late)) == [6.0, 7.0], got_a  # every row comes, in order of first
        assert late[0] == 6.0 and len(late) <= 3, got_a
        # but one may come twice around a change of mode: seen once in CI (6.0 sent right after
        # the switch, given as events 4 and 5), a known limit of real-time mode
        # (docs/operate/edges.md, "Real-time mode"), not yet understood
    finally:
        for r in readers:
            r.close("released")
        rt.stop()


def test_which_plans_qualify():
    """`refusal`: each reason a stream's plans keep it in micro-batches."""
    from pep.core.plan import SpatialPredicate
    from pep.runtime.plans.compile import compile_plan
    from pep.runtime.query.realtime import refusal
    from pep.runtime.query.registry import AttachedHandle, PlanState
    from tests.kafka.test_kafka_runtime import SCHEMA

    topic = TopicTarget("xsg.plan.x", lambda: True)

    def state(plan: ExecutionPlan, deliver=topic, pid: int = 1) -> PlanState:
        compiled = compile_plan(plan, SCHEMA, "ts")
        return PlanState(pid, compiled, compiled.window is None,
                         {"h": AttachedHandle("h", pid, deliver)})

    plain = ExecutionPlan("s", ((Predicate("v", ">", 0.0), Predicate("station", "=", "A")),),
                          ("station", "v"))
    assert refusal([state(plain)], punctuated=False) is None
    assert "punctuations" in refusal([state(plain)], punctuated=True)
    assert "more than" in refusal([state(plain, pid=i) for i in range(1, 10)], False)
    window = ExecutionPlan("s", None, (), WindowSpec("tuple", 2, 2, (Aggregate("v", "sum"),)))
    assert "window" in refusal([state(window)], False)
    near = ExecutionPlan("s", ((SpatialPredicate("distance", "lat", "lon", "<", 1000.0,
                                                 points=(1.3, 103.8)),),), ("v",))
    assert "spatial" in refusal([state(near)], False)
    masked = ExecutionPlan("s", None, ("v",), masks=(("v", "round:10"),))
    assert "masks" in refusal([state(masked)], False)
    in_process = state(plain, deliver=lambda batch: True)
    assert "gateway process" in refusal([in_process], False)


def test_an_edge_skips_what_a_restarted_real_time_query_writes_again():
    """`SourceLog`: per source partition, a record not above the highest offset read is a
    repeat; another epoch (a new checkpoint) starts afresh; micro-batch keys are not its."""
    from pep.edge.reader import SourceLog, parse_key, parse_source_key
    key = parse_source_key(b"r:abc:src.t-1/0000000002/00000000000000000017")
    assert key == ("abc", "src.t-1/2", 17)
    assert parse_source_key(b"m:abc:3:4") is None and parse_key(b"r:abc:t/1/2") is None
    assert parse_source_key(b"r:abc:nonsense") is None
    log = SourceLog()
    assert [log.note(("e", "t/0", o)) for o in (5, 6, 7)] == [True, True, True]
    assert log.note(("e", "t/1", 3))  # another partition: its own offsets
    assert not log.note(("e", "t/0", 6)) and not log.note(("e", "t/0", 7))  # written again
    assert log.note(("e", "t/0", 8))
    assert log.note(("f", "t/0", 1))  # a new checkpoint's query


def test_real_time_batches_are_off_or_at_least_spark_s_minimum():
    from pep.config.model import GatewayConfig
    assert GatewayConfig().delivery_realtime == 0.0
    assert GatewayConfig(delivery_realtime=5.0).delivery_realtime == 5.0
    with pytest.raises(ValueError, match="delivery_realtime .* at least 5 seconds"):
        GatewayConfig(delivery_realtime=2.0)
