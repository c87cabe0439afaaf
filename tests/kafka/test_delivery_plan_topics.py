"""Each plan's rows written once to its plan topic by the stream's query: row plans by Spark's
Kafka sink on the workers, windows by the driver's producer; filtered, projected and windowed
as the plan says; keys that name the micro-batch and the row's place in it."""
from __future__ import annotations

import json
import logging

import pytest

from pep.core.plan import Aggregate, ExecutionPlan, Predicate, WindowSpec
from pep.delivery.settings import WARM_KEY
from tests.kafka.conftest import topic_messages
from tests.kafka.test_kafka_runtime import rec


def topic_records(broker, topic: str, want: int, timeout: float = 90.0) -> list[tuple[str, dict]]:
    """(key, row) of a plan topic's records, from its start, until `want` came (the record
    that made the topic known to the producer left out: pep/runtime/delivery/warm.py)."""
    return [(key.decode(), json.loads(value)) for key, value in topic_messages(
        broker, topic, want, timeout, keep=lambda key: key != WARM_KEY, settle=1.5)]


def test_row_plans_and_windows_are_written_to_their_plan_topics(kafka_broker, kafka_topic,
                                                                 producer, plan_topics_runtime):
    setup = plan_topics_runtime(partitions=3)
    name = setup.stream.name
    rows_topic, window_topic = kafka_topic(1), kafka_topic(1)
    setup.attach("a", ExecutionPlan(name, ((Predicate("v", ">", 0.0),),), ("station", "v")),
                 rows_topic)
    # a second handle of the same plan and topic: its rows are written once
    setup.attach("b", ExecutionPlan(name, ((Predicate("v", ">", 0.0),),), ("station", "v")),
                 rows_topic)
    window = WindowSpec("tuple", 2, 2, (Aggregate("v", "sum"),))
    setup.attach("w", ExecutionPlan(name, None, (), window), window_topic)
    producer.send(setup.source, [rec(1, 1.0), rec(2, -2.0), rec(3, 3.0), rec(4, 4.0)],
                  partition=0)
    got = topic_records(kafka_broker, rows_topic, 3)
    assert [r for _, r in got] == [{"station": "A", "v": 1.0}, {"station": "A", "v": 3.0},
                                   {"station": "A", "v": 4.0}]
    producer.send(setup.source, [rec(5, 5.0), rec(6, 6.0)], partition=1)  # a later micro-batch
    got = topic_records(kafka_broker, rows_topic, 5)
    assert [r["v"] for _, r in got] == [1.0, 3.0, 4.0, 5.0, 6.0]
    assert len({k.rsplit(":", 1)[0] for k, _ in got}) == 2  # two micro-batches' keys
    assert all(k.startswith("m:") for k, _ in got)
    windows = topic_records(kafka_broker, window_topic, 3)
    assert [w["sum_v"] for _, w in windows] == [-1.0, 7.0, 11.0], windows


@pytest.mark.parametrize("values_before", [None, 4, 0],
                         ids=["window", "worker-values-made-before", "worker-values-after"])
def test_rows_that_tie_in_stream_order_are_keyed_alike_whatever_order_they_come_in(
        spark, monkeypatch, values_before):
    """A batch's write run again (after a half-failed write) must key every row as the first
    did: an edge skips a key it read, so a row keyed differently the second time is skipped
    or repeated. Rows that tie in the order columns (one tuple on one topic through two
    plans; two tuples the order columns do not tell apart) were numbered in the order the
    tasks gave them (issue 45). The native window's numbering (a few plans) and the worker's
    (the grouped matcher's way), with the values made before the records (a few projections)
    and after: the same keys."""
    from pyspark.sql import types as T

    from pep.runtime.base.columns import PIDS_COLUMN
    from pep.runtime.delivery import topic_rows
    from pep.runtime.delivery.topic_rows import PlanRoute, TopicRows

    if values_before is not None:
        monkeypatch.setattr(topic_rows, "VALUES_BEFORE", values_before)

    schema = T.StructType([T.StructField(PIDS_COLUMN, T.ArrayType(T.LongType())),
                           T.StructField("v", T.DoubleType()),
                           T.StructField("_seq", T.LongType())])
    rows = [([1, 2], 1.0, 7), ([2], 2.0, 7), ([1], 3.0, 7), ([1, 3], 4.0, 8), ([3], 5.0, None)]
    routes = [PlanRoute(1, ("t",), ("v",), ("v",)), PlanRoute(2, ("t", "u"), ("v",), ("v",))]
    writer = TopicRows({})

    def keyed(data: list, partitions: int) -> dict[tuple[str, str], str]:
        frame = spark.createDataFrame(data, schema).repartition(partitions)
        records = writer.from_pids if values_before is None else writer.from_pids_on_worker
        out = records(frame, routes, ["_seq"], "m:e:0:").collect()
        return {(r["topic"], bytes(r["key"]).decode()): r["value"] for r in out}

    first = keyed(rows, 1)
    assert first == {("t", "m:e:0:0"): '{"v":1.0}', ("t", "m:e:0:1"): '{"v":3.0}',
                     ("t", "m:e:0:2"): '{"v":1.0}', ("t", "m:e:0:3"): '{"v":2.0}',
                     ("t", "m:e:0:4"): '{"v":4.0}',  # stream order first, then plan, value
                     ("u", "m:e:0:0"): '{"v":1.0}', ("u", "m:e:0:1"): '{"v":2.0}'}, first
    for order, partitions in ((list(reversed(rows)), 1), ([rows[2], rows[0], rows[3], rows[1]]
                                                           + rows[4:], 3), (rows, 2)):
        assert keyed(order, partitions) == first


@pytest.mark.parametrize("values_before", [None, 4, 0],
                         ids=["window", "worker-values-made-before", "worker-values-after"])
def test_plans_sharing_a_topic_are_numbered_and_keyed_per_lane(spark, monkeypatch,
                                                                values_before):
    """Plans of one stream share a topic, each under a lane (`pep.delivery.lanes`): a record
    goes to the destination's Kafka topic, keyed `<lane>|m:...`, numbered per lane from 0 (an
    edge checks a lane's holes as a topic of its own); a destination without a lane is written
    as before. Every numbering path the same."""
    from pyspark.sql import types as T

    from pep.runtime.base.columns import PIDS_COLUMN
    from pep.runtime.delivery import topic_rows
    from pep.runtime.delivery.topic_rows import PlanRoute, TopicRows

    if values_before is not None:
        monkeypatch.setattr(topic_rows, "VALUES_BEFORE", values_before)
    schema = T.StructType([T.StructField(PIDS_COLUMN, T.ArrayType(T.LongType())),
                           T.StructField("v", T.DoubleType()),
                           T.StructField("_seq", T.LongType())])
    rows = [([1, 2], 1.0, 7), ([2], 2.0, 7), ([1], 3.0, 7), ([1, 3], 4.0, 8)]
    routes = [PlanRoute(1, ("t#a1",), ("v",), ("v",)),
              PlanRoute(2, ("t#b2", "u"), ("v",), ("v",))]
    writer = TopicRows({})
    frame = spark.createDataFrame(rows, schema)
    records = writer.from_pids if values_before is None else writer.from_pids_on_worker
    got = sorted((r["topic"], bytes(r["key"]).decode(), r["value"])
                 for r in records(frame, routes, ["_seq"], "m:e:0:").collect())
    assert got == [("t", "a1|m:e:0:0", '{"v":1.0}'), ("t", "a1|m:e:0:1", '{"v":3.0}'),
                   ("t", "a1|m:e:0:2", '{"v":4.0}'),
                   ("t", "b2|m:e:0:0", '{"v":1.0}'), ("t", "b2|m:e:0:1", '{"v":2.0}'),
                   ("u", "m:e:0:0", '{"v":1.0}'), ("u", "m:e:0:1", '{"v":2.0}')], got


@pytest.mark.timeout(180)
def test_two_plans_write_their_lanes_of_one_topic(kafka_broker, kafka_topic, producer,
                                                  plan_topics_runtime):
    """Through the stream's query and Spark's Kafka sink: two plans on lanes of one topic,
    each lane's rows under its own keys, numbered from 0, in stream order; a third handle
    of the first plan adds nothing (a plan's rows are written once per destination)."""
    setup = plan_topics_runtime()
    name = setup.stream.name
    topic = kafka_topic(1)
    setup.attach("a", ExecutionPlan(name, ((Predicate("v", ">", 0.0),),), ("v",)),
                 f"{topic}#aa")
    setup.attach("b", ExecutionPlan(name, ((Predicate("v", ">", 3.0),),), ("station",)),
                 f"{topic}#bb")
    setup.attach("c", ExecutionPlan(name, ((Predicate("v", ">", 0.0),),), ("v",)),
                 f"{topic}#aa")
    producer.send(setup.source, [rec(1, 1.0), rec(2, -2.0), rec(3, 3.0), rec(4, 4.0)])
    got = topic_records(kafka_broker, topic, 4)
    lanes: dict[str, list[tuple[int, dict]]] = {}
    for key, row in got:
        lane, _, rest = key.partition("|")
        assert rest.startswith("m:"), key
        lanes.setdefault(lane, []).append((int(rest.rsplit(":", 1)[1]), row))
    assert lanes == {"aa": [(0, {"v": 1.0}), (1, {"v": 3.0}), (2, {"v": 4.0})],
                     "bb": [(0, {"station": "A"})]}, got


@pytest.mark.timeout(120)
def test_a_failed_write_logs_no_value_of_its_rows(spark, kafka_broker, kafka_topic, caplog):
    """Spark's error of a failed write may quote a row's value (here a cast's: ANSI mode names
    the value it could not cast); the warning says the exception's class and condition, never
    its text, so what a policy hides reaches no log line."""
    from pyspark.sql import functions as F

    from pep.runtime.delivery.topic_rows import TopicRows

    topic = kafka_topic(1)
    secret = "Mrs Secret 0451"
    frame = spark.createDataFrame([(secret,)], "s string")
    records = frame.select(F.lit(topic).alias("topic"),
                           F.col("s").cast("int").cast("string").alias("value"))
    writer = TopicRows({"kafka.bootstrap.servers": kafka_broker.bootstrap})
    asked: list[int] = []

    def stopping() -> bool:  # the first failure is tried again (and warned of), the second ends
        asked.append(1)
        return len(asked) > 1

    caplog.set_level(logging.DEBUG, logger="pep.runtime.delivery")
    with pytest.raises(Exception) as failed:
        writer.write(records, stopping)
    assert secret in str(failed.value)  # Spark's text does quote it
    warnings = [r for r in caplog.records if r.name.startswith("pep.runtime.delivery")]
    assert any("could not be written" in r.getMessage() and "CAST_INVALID_INPUT" in
               r.getMessage() for r in warnings), [r.getMessage() for r in warnings]
    assert "Secret" not in caplog.text
    assert writer.retried == 1 and writer.written == 0
