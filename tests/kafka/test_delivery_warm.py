"""A new plan topic is made known to Spark's Kafka producer before its first rows (issue 45):
the producer otherwise looks each new topic up on its first record, one round trip after the
other inside the rows' task, and a fresh gateway's first batches waited seconds on it. The
runtime writes one `WARM_KEY` record to each new topic as soon as a handle is attached with
it, from the rows' own producer; an edge skips that record."""
from __future__ import annotations

import json
import time

import pytest

from pep.core.plan import ExecutionPlan, Predicate
from pep.delivery.settings import WARM_KEY, DeliverySettings
from pep.edge.reader import TopicReader
from tests.kafka.conftest import topic_messages
from tests.kafka.test_kafka_runtime import rec


@pytest.mark.timeout(180)
def test_a_new_plan_topic_gets_its_warm_record_before_any_row(kafka_broker, kafka_topic,
                                                              producer, plan_topics_runtime):
    setup = plan_topics_runtime()
    first, second = kafka_topic(1), kafka_topic(1)
    plan = ExecutionPlan(setup.stream.name, ((Predicate("v", ">", 0.0),),), ("v",))
    setup.attach("a", plan, first)
    setup.attach("b", plan, first)  # the same topic
    setup.attach("c", plan, second)
    # no tuple yet: what the topics hold is the warm record alone, once each
    assert topic_messages(kafka_broker, first, 1, 60) == [(WARM_KEY, b"")]
    assert topic_messages(kafka_broker, second, 1, 60) == [(WARM_KEY, b"")]
    producer.send(setup.source, [rec(1, 1.0), rec(2, -2.0), rec(3, 3.0)], partition=0)
    got = topic_messages(kafka_broker, first, 3, 60)
    assert got[0] == (WARM_KEY, b"")
    assert [json.loads(v) for k, v in got[1:]] == [{"v": 1.0}, {"v": 3.0}]
    assert all(k.startswith(b"m:") for k, _ in got[1:])


@pytest.mark.timeout(60)
def test_an_edge_skips_the_warm_record(kafka_broker, kafka_topic):
    """No row, no gap: the reader's first row is the record after it (its event id that
    record's position)."""
    from confluent_kafka import Producer
    topic = kafka_topic(1)
    out = Producer({"bootstrap.servers": kafka_broker.bootstrap, "acks": "all"})
    out.produce(topic, b"", WARM_KEY, partition=0)
    out.produce(topic, b'{"v":1}', b"m:e:0:0", partition=0)
    assert out.flush(30) == 0
    reader = TopicReader(DeliverySettings(kafka_broker.bootstrap,
                                          security_protocol="PLAINTEXT"), "h", topic, 0, None)
    reader.start()
    try:
        got = []
        deadline = time.monotonic() + 30
        while not [e for e in got if e.kind == "row"] and time.monotonic() < deadline:
            got += reader.read(None, timeout=0.5)
        got += reader.read(None, timeout=0.5)
        assert [(e.kind, e.id, e.data) for e in got] == [("row", 2, '{"v":1}')]
    finally:
        reader.close("released")


@pytest.mark.timeout(120)
def test_a_topic_the_broker_has_not_made_yet_is_warmed_on_a_later_try(spark, kafka_broker):
    """A broker still creating a topic's log fails the whole warm write (seen with 10,000 new
    topics on a loaded machine): the write is tried again."""
    from pep.runtime.delivery.warm import TopicWarmer
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT")
    topic = f"warm-later-{int(time.time() * 1000)}"
    warmer = TopicWarmer(spark, settings.spark_options())
    try:
        warmer.add(topic)  # not on the broker yet: the first write fails after max.block.ms
        deadline = time.monotonic() + 60
        while topic not in warmer._tries and time.monotonic() < deadline:
            time.sleep(0.1)
        assert warmer._tries.get(topic) == 1  # the first write failed
        kafka_broker.create_topic(topic, 1)
        assert warmer.idle(60)
        assert topic_messages(kafka_broker, topic, 1, 15) == [(WARM_KEY, b"")]
        assert warmer.warmed == 1
    finally:
        warmer.close()


@pytest.mark.timeout(180)
def test_many_new_topics_are_warmed_a_chunk_at_a_time_in_one_task_each(spark, kafka_broker):
    """A warm write takes one task slot, a `CHUNK` of topics at a time: 5,000 new topics in 8
    tasks held both slots of a 2-core machine for over 30 s, and the stream's first micro-batch
    waited behind them (issue 45's 5,000-handle benchmark)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from pep.runtime.delivery.warm import CHUNK, JOB_GROUP, TopicWarmer
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT")
    stamp = int(time.time() * 1000)
    topics = [f"warm-many-{stamp}-{i}" for i in range(2 * CHUNK + 1)]
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics],
                                      operation_timeout=60, request_timeout=60).values():
        future.result(60)
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(JOB_GROUP))
    warmer = TopicWarmer(spark, settings.spark_options())
    try:
        for topic in topics:
            warmer.add(topic)
        assert warmer.idle(120)
        assert warmer.warmed == len(topics)
        jobs = sorted(set(tracker.getJobIdsForGroup(JOB_GROUP)) - before)
        tasks = [tracker.getStageInfo(s).numTasks for j in jobs
                 for s in tracker.getJobInfo(j).stageIds if tracker.getStageInfo(s)]
        assert len(jobs) >= 3 and tasks and all(n == 1 for n in tasks), (jobs, tasks)
        assert topic_messages(kafka_broker, topics[-1], 1, 15) == [(WARM_KEY, b"")]
    finally:
        warmer.close()
