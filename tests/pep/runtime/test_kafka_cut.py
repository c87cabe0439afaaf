"""A Kafka handle's cut (issue 41): a plan given `start_offsets` receives only records at or after
its offset in their partition (a partition beyond the cut: every record), on every path that
filters: the compiled few-plans Column, the grouped matcher on the workers, the plan table's
rows job (a masked plan), the panes job (tuple and time windows aggregated in Spark), and a
join side. One micro-batch shaped as a Kafka stream's (`_xsg_file` = topic/partition/offset),
no broker needed; the expected rows are recomputed in Python."""
from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pep.core.plan import (
    Aggregate,
    ExecutionPlan,
    Field,
    Predicate,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
    WindowSpec,
)
from pep.runtime.plans.compile import PlanError, compile_plan

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("k", "long"), Field("v", "double")))
SPARK_SCHEMA = "ts timestamp, k long, v double, _xsg_seq long, _xsg_file string"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
PARTITIONS = 4
# record k: partition k % 4, offset k // 4 (0..7 per partition); times in k order
ROWS = [(k, k % PARTITIONS, k // PARTITIONS) for k in range(32)]


def stream() -> StreamDefinition:
    return StreamDefinition("kcut", "nea", SCHEMA,
                            SourceSpec("kafka", (("bootstrap.servers", "127.0.0.1:1"),
                                                 ("subscribe", "topic.a-b"))),
                            time_attribute="ts")


@pytest.fixture(scope="module")
def frame(spark):
    data = [(T0 + timedelta(seconds=k), k, float(k % 5), None,
             f"topic.a-b/{p:010d}/{o:020d}") for k, p, o in ROWS]
    # shuffled: the executor orders the batch itself
    return spark.createDataFrame(list(reversed(data)), SPARK_SCHEMA).repartition(3).cache()


def admitted(cut: tuple[int, ...] | None, v_min: float = -1.0) -> list[int]:
    return [k for k, p, o in ROWS
            if (cut is None or p >= len(cut) or o >= cut[p]) and k % 5 > v_min]


def run(spark, frame, plans: list[ExecutionPlan]) -> list[list[dict]]:
    from pep.runtime.query.executor import StreamExecutor
    work = Path(tempfile.mkdtemp(prefix="xsg-kcut-"))
    ex = StreamExecutor(spark, stream(), work, 0.25, 2, 0.0, lambda h: None)
    got: list[list[dict]] = [[] for _ in plans]
    for i, plan in enumerate(plans):
        ex.handles.add_handle(f"h{i}", compile_plan(plan, SCHEMA, "ts"),
                              lambda batch, i=i: got[i].extend(json.loads(t) for t in batch.rows)
                              or True)
    ex.lifecycle.on_batch(frame, 0)
    ex.wait_delivered()
    return got


def plain(cut: tuple[int, ...] | None, v_min: float = -1.0) -> ExecutionPlan:
    return replace(ExecutionPlan("kcut", ((Predicate("v", ">", v_min),),), ("k",)),
                   start_offsets=cut)


CUTS = [(0, 0, 0, 0), (3, 0, 8, 1), (8, 8, 8), (2,), (), (5, 1, 0, 7, 2)]


def test_the_few_plans_column_admits_only_records_at_or_after_the_cut(spark, frame):
    plans = [plain((3, 0, 8, 1)), plain(None), plain((1, 6), 1.0)]
    got = run(spark, frame, plans)
    assert [r["k"] for r in got[0]] == admitted((3, 0, 8, 1))
    assert [r["k"] for r in got[1]] == admitted(None)
    assert [r["k"] for r in got[2]] == admitted((1, 6), 1.0)


def test_the_grouped_matcher_admits_only_records_at_or_after_the_cut(spark, frame):
    plans = [plain(cut, float(i % 3)) for i, cut in enumerate(CUTS)] \
        + [plain(None, 0.0), plain(None, 1.0), plain((4, 4, 4, 4), -1.0)]
    assert len(plans) > 8  # past FEW_PLANS: the grouped matcher
    got = run(spark, frame, plans)
    for plan, rows in zip(plans, got, strict=True):
        assert [r["k"] for r in rows] == admitted(plan.start_offsets,
                                                  plan.filter_dnf[0][0].value), plan


def test_the_plan_table_and_the_panes_job_admit_only_records_at_or_after_the_cut(spark, frame):
    cut = (3, 0, 8, 1)
    masked = replace(plain(cut), masks=(("v", "round:2"),), projection=("k", "v"))
    tuples = replace(ExecutionPlan("kcut", None, (), WindowSpec(
        "tuple", 8, 8, (Aggregate("k", "count"), Aggregate("k", "sum"),
                        Aggregate("k", "firstval")))), start_offsets=cut)
    times = replace(ExecutionPlan("kcut", None, (), WindowSpec(
        "time", 10, 10, (Aggregate("k", "count"), Aggregate("k", "sum")),
        time_attribute="ts")), start_offsets=cut)
    got = run(spark, frame, [masked, tuples, times])
    expected = admitted(cut)
    assert [r["k"] for r in got[0]] == expected
    assert [(w["count_k"], w["sum_k"], w["firstval_k"]) for w in got[1]] == [
        (8, sum(expected[i:i + 8]), expected[i]) for i in range(0, len(expected) - 7, 8)]
    # time windows of 10 s (the last one still open: its watermark has not passed)
    closed = [w for w in range(0, 30, 10) if any(k >= w + 10 for k in expected)]
    assert [(w["count_k"], w["sum_k"]) for w in got[2]] == [
        (len(ks), sum(ks)) for ks in ([k for k in expected if w <= k < w + 10]
                                      for w in closed) if ks]


def test_a_join_side_admits_only_records_at_or_after_the_cut(spark, frame):
    from pep.runtime.joins.frames import side_frame
    cut = (5, 1, 0, 7)
    plan = replace(plain(cut), projection=("ts", "k"))
    side, _ = side_frame(spark, stream(), plan, "ts", "l", 10.0, 2, source=frame)
    ks = sorted(r[0] for r in side.select("l1").collect())
    assert ks == admitted(cut)


def test_a_cut_is_for_kafka_streams_only_and_holds_offsets(spark, tmp_path):
    from pep.runtime.runtime import StreamRuntime
    ingest = StreamDefinition("kcut", "nea", SCHEMA, SourceSpec("ingest", (("path", str(
        tmp_path / "in")),)), time_attribute="ts")
    rt = StreamRuntime(spark, tmp_path / "work")
    try:
        with pytest.raises(PlanError, match="Kafka streams only"):
            rt.attach_handle("h", ingest, plain((1, 2)), lambda batch: True)
    finally:
        rt.stop()
    with pytest.raises(PlanError, match="start_offsets"):
        compile_plan(plain((1, -2)), SCHEMA, "ts")


def test_a_new_kafka_query_counts_its_batches_on_and_skips_no_batch_of_its_own(tmp_path):
    """A positioned handle's ids come from its stream's micro-batch ids: a Kafka stream's new
    query (its checkpoint dropped when its last handle left) counts on from the last one's; and
    the batch the last query's stop had delivered is forgotten, or the new query's batch of
    that number would be taken for a re-run and skipped."""
    from pep.runtime.sources.checkpoints import StreamCheckpoint
    checkpoint = StreamCheckpoint.for_stream(tmp_path, stream())
    assert checkpoint.prepare() is True and checkpoint.batch_base() == 0
    checkpoint.mark_running()
    offsets = checkpoint.location / "offsets"
    offsets.mkdir(parents=True)
    for batch in range(6):
        (offsets / str(batch)).write_text("v1\n{}\n{}")
    checkpoint.release(5)
    assert checkpoint.delivered_batch() == 5
    checkpoint.mark_idle()  # the last handle left
    assert checkpoint.prepare() is True  # a first handle: a new query
    assert checkpoint.batch_base() == 6 and checkpoint.delivered_batch() == -1
    assert not checkpoint.location.exists()

