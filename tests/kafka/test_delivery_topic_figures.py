"""A micro-batch whose only rows go to plan topics, with many plans (the grouped matcher): the
stream's figures (tuples read, highest position) come from the writing tasks themselves, and no
second job runs over the batch to count it (it cost as much as a pass over the batch, once per
micro-batch, issue 45's edge benchmark). An ingest stream (its figures are not Spark's progress,
as a Kafka stream's are), a real broker."""
from __future__ import annotations

import pytest

from pep.core.plan import (
    ExecutionPlan,
    Field,
    Predicate,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
)
from pep.delivery.settings import DeliverySettings
from pep.ports import TopicTarget
from pep.runtime.query import runner as runner_module
from tests.kafka.test_delivery_plan_topics import topic_records
from tests.pep.runtime.support import wait_until, write_jsonl

SCHEMA = StreamSchema((Field("n", "long"), Field("v", "double")))
PLANS = 12  # past FEW_PLANS: the grouped matcher


@pytest.mark.timeout(240)
def test_topic_only_batches_are_counted_by_their_writing_tasks(spark, tmp_path, kafka_broker,
                                                               kafka_topic, monkeypatch):
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime

    counted_apart = []
    observed = runner_module.observed
    monkeypatch.setattr(runner_module, "observed",
                        lambda shape: counted_apart.append(1) or observed(shape))
    source = tmp_path / "in"
    stream = StreamDefinition("figs", "o", SCHEMA, SourceSpec("ingest", (("path", str(source)),)))
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT")
    topics = [kafka_topic(1) for _ in range(PLANS)]
    rt = StreamRuntime(spark, tmp_path / "work", settings=RuntimeSettings(
        trigger_interval=0.2, delivery=settings))
    try:
        for i, topic in enumerate(topics):  # plan i passes v in [i, i + 1)
            rt.attach_handle(f"h{i}", stream, ExecutionPlan(
                stream.name, ((Predicate("v", ">=", float(i)), Predicate("v", "<", i + 1.0)),),
                ("n", "v")), TopicTarget(topic, lambda: True))
        write_jsonl(source, "a.jsonl", [{"n": n, "v": n % PLANS + 0.5} for n in range(24)])
        assert len(topic_records(kafka_broker, topics[3], 2)) == 2
        write_jsonl(source, "b.jsonl", [{"n": n, "v": n % PLANS + 0.5} for n in range(24, 60)])
        got = topic_records(kafka_broker, topics[5], 5)
        assert sorted(r["n"] for _, r in got) == [5, 17, 29, 41, 53]  # (order: not this test's)
        assert wait_until(lambda: rt.stats()["figs"]["rows_in"] == 60, timeout=30), \
            rt.stats()["figs"]
        assert rt.stats()["figs"]["batches"] >= 2
        assert counted_apart == []  # no batch ran a job of its own to be counted (main: [1, 1])
    finally:
        rt.stop()
