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
from pep.edge.reader import TopicReader
from pep.ports import TopicTarget
from tests.kafka.test_kafka_runtime import rec


def read_rows(reader: TopicReader, want: int, timeout: float = 90.0,
              settle: float = 3.0) -> list[tuple[int, dict]]:
    """(event id, row) of every row event until `want` came, then `settle` seconds more (a
    row too many would come then). Nothing is lost here: a `gap` (the count markers of the
    real-time batches, across restarts and changes of mode) would be a false alarm."""
    out: list[tuple[int, dict]] = []

    def take() -> list[tuple[int, dict]]:
        got = reader.read(timeout=0.5)
        assert not [e for e in got if e.kind == "gap"], got
        return [(e.id, json.loads(e.data)) for e in got if e.kind == "row"]
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        out += take()
    end = time.monotonic() + settle
    while time.monotonic() < end:
        out += take()
    return out


def increasing(ids: list[int]) -> bool:
    """Event ids are positions in the plan topic: each row once, in the topic's order (the
    warm record and the count markers take positions too, so they need not be contiguous)."""
    return all(a < b for a, b in zip(ids, ids[1:], strict=False))


def wait_for(check, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def reading(rt, lifecycle) -> bool:
    """The stream's real-time query runs and has a task running: its batch's start offsets are
    fixed (a fresh checkpoint starts at the topic's end when the batch is planned) and the
    task reads the partition as records come, so a record sent now is read (Spark runs a
    query's jobs in a group named by its run id, as `RealTimeMode._await_tasks` reads them)."""
    query = lifecycle._query
    if lifecycle.mode != "realtime" or query is None or not query.isActive:
        return False
    tracker = rt.spark.sparkContext.statusTracker()
    for job in tracker.getJobIdsForGroup(str(query.runId)):
        info = tracker.getJobInfo(job)
        for stage in (info.stageIds if info is not None else ()):
            stage_info = tracker.getStageInfo(stage)
            if stage_info is not None and stage_info.numActiveTasks > 0:
                return True
    return False


@pytest.mark.parametrize("lanes", [False, True], ids=["topic-per-plan", "lanes-of-one-topic"])
def test_a_qualifying_stream_runs_in_real_time_mode_and_falls_back_for_a_window(
        kafka_topic, producer, caplog, plan_topics_runtime, lanes):
    """Also with the three plans on lanes of one topic (`pep.delivery.lanes`): the real-time
    records, their count markers (a false `gap` fails `read_rows`), the change of mode and
    the driver's windows, each reader given only its lane's rows."""
    # one source partition: the test session has 2 task slots, one for the partition
    setup = plan_topics_runtime(realtime=5.0)
    source, stream, settings, rt = setup.source, setup.stream, setup.settings, setup.rt
    if lanes:
        shared = kafka_topic(1)
        topic_a, topic_b, topic_w = f"{shared}#aa", f"{shared}#bb", f"{shared}#ww"
    else:
        topic_a, topic_b, topic_w = kafka_topic(1), kafka_topic(1), kafka_topic(1)
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
        assert wait_for(lambda: reading(rt, lifecycle))  # its tasks read the partition
        assert rt._warmer.idle(60)  # the topic's first record is in (warm.py)
        producer.send(source, [rec(1, 1.0), rec(2, -2.0), rec(3, 3.0, "B")], partition=0)
        got = read_rows(a, 2)
        assert [r for _, r in got] == [{"station": "A", "v": 1.0}, {"station": "B", "v": 3.0}]
        # event ids: the topic's offsets + 1 (before the rows: the record that made the new
        # topic known to the producer, pep/runtime/delivery/warm.py, and the query's opening
        # count marker, pep/runtime/query/realtime_mode.py)
        assert increasing([i for i, _ in got]) and got[0][0] >= 3, got
        last = got[-1][0]
        # the batch that read them commits before "b" comes: "b" has no cut (`start_offsets`),
        # so what the restarted query reads again since the last commit would reach it too
        read_at = time.time()
        assert wait_for(lambda: (lifecycle.last_batch_at or 0.0) > read_at)

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
        assert wait_for(lambda: reading(rt, lifecycle))  # the new query's tasks read it
        producer.send(source, [rec(4, 4.0), rec(5, -5.0)], partition=0)
        got_a = read_rows(a, 1)
        assert [r for _, r in got_a] == [{"station": "A", "v": 4.0}]
        assert increasing([last, got_a[0][0]]), got_a
        last = got_a[0][0]
        got_b = read_rows(b, 1)
        assert [r for _, r in got_b] == [{"v": -5.0}]

        # a real-time batch lasts its 5 s by design: never told as "falling behind" (the
        # runtime's janitor looks every 5 s; several batches ended by now)
        assert lifecycle.last_batch_at is not None
        assert not [r.getMessage() for r in caplog.records
                    if "falling behind" in r.getMessage() and stream.name in r.getMessage()]

        # a window plan does not qualify: the stream's query runs micro-batches again, and the
        # row plans' rows keep coming (through the micro-batches' writer)
        window = WindowSpec("tuple", 2, 2, (Aggregate("v", "sum"),))
        rt.attach_handle("w", stream, ExecutionPlan(stream.name, None, (), window),
                         TopicTarget(topic_w, open_))
        assert wait_for(lambda: lifecycle.mode == "micro-batch" and lifecycle.active)
        producer.send(source, [rec(6, 6.0), rec(7, 7.0)], partition=0)
        got_a = read_rows(a, 2)
        # every row exactly once (once seen twice in CI: the switch was reported before the
        # real-time query had stopped, and the micro-batch query wrote again what it had
        # written since its last commit; `pep.runtime.query.realtime_mode`)
        assert [r for _, r in got_a] == [{"station": "A", "v": 6.0},
                                         {"station": "A", "v": 7.0}], got_a
        assert increasing([last, *[i for i, _ in got_a]]), got_a
    finally:  # (the runtime is stopped by plan_topics_runtime, after the readers)
        for r in readers:
            r.close("released")


def test_a_change_of_mode_repeats_no_row_in_either_direction(
        kafka_topic, producer, plan_topics_runtime):
    """Rows a real-time query wrote after its last commit (its batch is long here: none
    commits during the test) are read again by the micro-batch query that follows it, which
    starts at the last committed offsets: they must not reach the reader a second time; nor
    may the real-time query that follows micro-batches write again what they delivered.
    Every row exactly once, by event id, across both changes of mode."""
    setup = plan_topics_runtime(realtime=120.0)
    source, stream, settings, rt = setup.source, setup.stream, setup.settings, setup.rt
    topic_a, topic_w = kafka_topic(1), kafka_topic(1)
    readers: list[TopicReader] = []
    try:
        open_ = lambda: True  # noqa: E731 - a callback that always answers True
        rt.attach_handle("a", stream, ExecutionPlan(stream.name, ((Predicate("v", ">", 0.0),),),
                                                    ("v",)),
                         TopicTarget(topic_a, open_))
        lifecycle = rt._executors[stream.name].lifecycle
        assert lifecycle.mode == "realtime"
        a = TopicReader(settings, "a", topic_a, 0, None)
        readers.append(a)
        a.start()
        assert rt._warmer.idle(60)  # the topic's first record (event 1) is in (warm.py)
        assert wait_for(lambda: reading(rt, lifecycle))  # its tasks read the partition
        producer.send(source, [rec(1, 1.0), rec(2, -2.0), rec(3, 3.0)], partition=0)
        got = read_rows(a, 2, settle=0.5)
        assert [r for _, r in got] == [{"v": 1.0}, {"v": 3.0}], got

        # to micro-batches (a window plan): no real-time batch has committed yet
        window = WindowSpec("tuple", 2, 2, (Aggregate("v", "sum"),))
        rt.attach_handle("w", stream, ExecutionPlan(stream.name, None, (), window),
                         TopicTarget(topic_w, open_))
        assert wait_for(lambda: lifecycle.mode == "micro-batch" and lifecycle.active)
        producer.send(source, [rec(4, 4.0), rec(5, 5.0)], partition=0)
        got += read_rows(a, 2)
        assert [r for _, r in got] == [{"v": 1.0}, {"v": 3.0}, {"v": 4.0}, {"v": 5.0}], got

        # and back to real-time mode (the window's handle leaves)
        rt.detach("w")
        assert wait_for(lambda: lifecycle.mode == "realtime" and lifecycle.active)
        assert wait_for(lambda: reading(rt, lifecycle))  # the new query's tasks read it
        producer.send(source, [rec(6, 6.0)], partition=0)
        got += read_rows(a, 1)
        assert increasing([i for i, _ in got]), got
        assert [r["v"] for _, r in got] == [1.0, 3.0, 4.0, 5.0, 6.0], got
    finally:  # (the runtime is stopped by plan_topics_runtime, after the readers)
        for r in readers:
            r.close("released")


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


def test_a_micro_batch_delivered_in_full_is_committed_before_real_time_mode(tmp_path):
    """`commit_delivered`: a real-time query cannot skip a micro-batch it would run again, so
    the last planned batch gets its commit when it was delivered in full and a stop cut the
    commit off; never a batch not delivered in full, never one committed already."""
    from pep.runtime.query.realtime_mode import commit_delivered
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for b in (0, 1, 2):
        (tmp_path / "offsets" / str(b)).write_text("v1\n{}\n{}")
    for b in (0, 1):
        (tmp_path / "commits" / str(b)).write_text('v1\n{"nextBatchWatermarkMs":7}')
    assert not commit_delivered(tmp_path, 1)  # batch 2 not delivered in full: run again
    assert not (tmp_path / "commits" / "2").exists()
    assert commit_delivered(tmp_path, 2)
    assert (tmp_path / "commits" / "2").read_text() == 'v1\n{"nextBatchWatermarkMs":7}'
    assert not commit_delivered(tmp_path, 2)  # committed already
    assert sorted(p.name for p in (tmp_path / "commits").iterdir()) == ["0", "1", "2"]
    assert not commit_delivered(tmp_path / "none", 5)  # no batch planned


def test_the_cuts_past_what_a_stopped_real_time_query_wrote():
    """`plan_cuts`: per plan, per source partition, the highest offset its topics were
    written + 1 (the lowest over a plan's topics); `source_place` reads the keys."""
    from pep.runtime.delivery.topic_rows import PlanRoute
    from pep.runtime.query.realtime import realtime_key, source_place
    from pep.runtime.query.realtime_mode import plan_cuts
    assert source_place((realtime_key("e1") + "src.t/2/17").encode()) == ("e1", 2, 17)
    assert source_place(b"m:e1:3:4") is None and source_place(b"r:e1:nonsense") is None
    routes = [PlanRoute(1, ("ta",), ("v",), ("v",)), PlanRoute(2, ("tb", "tc"), ("v",), ("v",)),
              PlanRoute(3, ("td",), ("v",), ("v",))]
    tops = {"ta": {0: 5, 2: 9}, "tb": {0: 4}, "tc": {0: 6, 1: 2}, "td": {}}
    assert plan_cuts(routes, tops) == {1: (6, 0, 10), 2: (5, 0)}


def test_raised_cuts_never_lower_a_plan_s_cut_and_make_a_new_version():
    """`PlanRegistry.raise_cuts`: per partition the higher of the plan's cut and the new one
    (a plan without a cut gets one); a plan gone meanwhile is passed over."""
    from pep.runtime.plans.compile import compile_plan
    from pep.runtime.query.registry import PlanRegistry
    from tests.kafka.test_kafka_runtime import SCHEMA
    registry = PlanRegistry(2)
    cut = ExecutionPlan("s", ((Predicate("v", ">", 0.0),),), ("v",), start_offsets=(4, 9))
    uncut = ExecutionPlan("s", ((Predicate("v", "<", 0.0),),), ("v",))
    registry.add_handle("h1", compile_plan(cut, SCHEMA, "ts"), lambda batch: True)
    registry.add_handle("h2", compile_plan(uncut, SCHEMA, "ts"), lambda batch: True)
    plans, version = registry.current()
    ids = {s.compiled.start_offsets is None: s.id for s in plans}
    registry.raise_cuts({ids[False]: (6, 2, 3), ids[True]: (0, 5), 99: (7,)})
    after, new_version = registry.current()
    assert new_version > version
    assert {s.id: s.compiled.start_offsets for s in after} == {ids[False]: (6, 9, 3),
                                                               ids[True]: (0, 5)}
    registry.raise_cuts({ids[False]: (1, 1)})  # lower: nothing changes
    assert registry.current()[1] == new_version


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
