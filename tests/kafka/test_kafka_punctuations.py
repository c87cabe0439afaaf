"""Security punctuations in a Kafka stream's records (`pep/runtime/query/source_shield.py`), on a
real broker: an outside producer sends `{"$punctuation": ...}` values between the tuples of two
partitions, each partition its own stream order. Each consumer of the ingest test gets exactly
what the brute-force oracle (`pep.core.punctuations.oracle`), run over each partition on its
own, lets through, across a restart of the query (the segment in force at the end of each
partition is carried in the stream's punctuation log); a query that starts after a punctuation
was sent still applies it (the records before its first offset are read for punctuations)."""
from __future__ import annotations

import json
import time

import pytest

from pep.core.plan import SourceSpec, StreamDefinition
from tests.kafka.conftest import CLIENT_LOG
from tests.pep.runtime.support import Collector, wait_until
from tests.pep.runtime.test_punctuations import CONSUMERS, SCHEMA, expected, history, plan_of


def vitals(broker, topic: str) -> StreamDefinition:
    return StreamDefinition("vitals", "hospital", SCHEMA, SourceSpec(
        "kafka", (("bootstrap.servers", broker.bootstrap), ("punctuations", "on"),
                  ("subscribe", topic))))


def runtime(spark, work):
    from pep.runtime.runtime import StreamRuntime
    return StreamRuntime(spark, work, trigger_interval=0.25)


def stable(rows: list[dict]) -> list[dict]:
    """Rows in a stable order (Kafka has no order across partitions)."""
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def attach(rt, stream, names=tuple(CONSUMERS)) -> dict[str, Collector]:
    got = {h: Collector() for h in names}
    for handle, collector in got.items():
        rt.attach_handle(handle, stream, plan_of(handle), collector)
    return got


def settle(got, want) -> None:
    wait_until(lambda: all(len(got[h].rows) >= len(want[h]) for h in got), timeout=120)
    time.sleep(1.5)  # nothing more comes


def test_each_partition_s_punctuations_give_each_consumer_its_segments_across_a_restart(
        spark, tmp_path, kafka_broker, kafka_topic, producer):
    topic = kafka_topic(2)
    stream = vitals(kafka_broker, topic)
    before = [history(70, 30, 0, 10), history(71, 30, 100, 10)]  # per partition
    after = [history(72, 30, 1000, 20), history(73, 30, 1100, 5)]  # partition 1: older ts
    work = tmp_path / "work"
    rt = runtime(spark, work)
    try:
        got = attach(rt, stream)
        for p, records in enumerate(before):
            producer.send(topic, records, partition=p)
        first = {h: [expected(before[p], h) for p in range(2)] for h in CONSUMERS}
        want = {h: stable(first[h][0] + first[h][1]) for h in CONSUMERS}
        settle(got, want)
        for handle in CONSUMERS:
            assert stable(got[handle].rows) == want[handle], handle
    finally:
        rt.stop()  # stopped with its handles: the query resumes from its checkpoint
    for p, records in enumerate(after):  # sent while the query is down
        producer.send(topic, records, partition=p)
    rt = runtime(spark, work)
    try:
        again = attach(rt, stream)
        rest: dict[str, list[dict]] = {}
        for h in CONSUMERS:
            # each partition's segments run on from where they were at the stop
            rest[h] = stable([r for p in range(2)
                              for r in expected(before[p] + after[p], h)[len(first[h][p]):]])
        settle(again, rest)
        for handle in CONSUMERS:
            assert stable(again[handle].rows) == rest[handle], handle
        assert len({json.dumps(rest[h]) for h in CONSUMERS}) == len(CONSUMERS)
        # a partition's punctuations say nothing of the other's: the oracle over the two as
        # one stream differs, so the test would see a shield that mixed them
        mixed = {h: stable(expected(after[0] + after[1], h)) for h in CONSUMERS}
        assert any(mixed[h] != stable([r for p in range(2) for r in expected(after[p], h)])
                   for h in CONSUMERS)
    finally:
        rt.stop()


def test_a_query_started_after_a_punctuation_still_applies_it(
        spark, tmp_path, kafka_broker, kafka_topic, producer):
    """A new query starts at the topic's end: the punctuation sent before it (and an
    unreadable one on the other partition) govern the tuples it reads."""
    topic = kafka_topic(2)
    stream = vitals(kafka_broker, topic)
    producer.send(topic, [{"$punctuation": {"srp": ["doctor"], "ts": 1}},
                          {"patient": 1, "hr": 70.0, "temp": 37.0, "ward": "er"}], partition=0)
    producer.send(topic, [{"$punctuation": {"srp": ["doctor"], "ts": 1, "sn": "x"}}],
                  partition=1)
    rt = runtime(spark, tmp_path / "work")
    try:
        got = attach(rt, stream, ("doctor", "nurse"))
        tuples = [{"patient": i, "hr": 80.0, "temp": 37.0, "ward": "er"} for i in range(2, 8)]
        producer.send(topic, tuples[:3], partition=0)
        producer.send(topic, tuples[3:], partition=1)
        assert wait_until(lambda: len(got["doctor"].rows) >= 3, timeout=120)
        time.sleep(1.5)
        # partition 0: doctors only; partition 1: in doubt, nobody
        assert sorted(r["patient"] for r in got["doctor"].rows) == [2, 3, 4]
        assert got["nurse"].rows == []
        assert rt.stats()["vitals"]["punctuations_unreadable"] == 1
    finally:
        rt.stop()


@pytest.mark.timeout(180)
def test_an_aborted_transaction_s_punctuation_and_tuples_have_no_effect(
        spark, tmp_path, kafka_broker, kafka_topic, producer):
    """A punctuation that would let nurses see the partition, written in a Kafka transaction
    that is then aborted, loosens nothing, and the aborted tuples reach nobody: the gateway
    reads its Kafka streams `read_committed` (`sources/frames.py`, `kafka_options`). Both
    ways a punctuation is read: sent before the query started (the shield's bounded read of
    the records before its first offset) and in the query's own micro-batches."""
    from confluent_kafka import Producer

    topic = kafka_topic(1)
    stream = vitals(kafka_broker, topic)
    reading = {"hr": 80.0, "temp": 37.0, "ward": "er"}
    aborted = Producer({"bootstrap.servers": kafka_broker.bootstrap,
                        "transactional.id": f"xsg-abort-{topic}", "linger.ms": 0,
                        "logger": CLIENT_LOG})
    aborted.init_transactions(30)

    def abort(client: Producer, ts: int, patient: int) -> None:
        client.begin_transaction()
        for record in ({"$punctuation": {"srp": ["doctor", "nurse"], "ts": ts}},
                       {"patient": patient, **reading}):
            client.produce(topic, json.dumps(record).encode(), partition=0)
        assert client.flush(30) == 0  # on the broker, in the partition's log
        client.abort_transaction(30)
    producer.send(topic, [{"$punctuation": {"srp": ["doctor"], "ts": 1}},
                          {"patient": 1, **reading}], partition=0)
    abort(aborted, 2, 2)  # before the query: read by the shield's bounded read
    rt = runtime(spark, tmp_path / "work")
    try:
        got = attach(rt, stream, ("doctor", "nurse"))
        producer.send(topic, [{"patient": 3, **reading}], partition=0)
        abort(aborted, 3, 4)  # read by the query's micro-batches
        producer.send(topic, [{"patient": 5, **reading}, {"patient": 6, **reading}],
                      partition=0)
        assert wait_until(lambda: len(got["doctor"].rows) >= 3, timeout=120)
        time.sleep(1.5)  # nothing more comes
        assert sorted(r["patient"] for r in got["doctor"].rows) == [3, 5, 6]
        assert got["nurse"].rows == []
        assert rt.stats()["vitals"]["punctuations_unreadable"] == 0
        # the rows read are the tuples (3, 5, 6) and no punctuation record
        assert rt.stats()["vitals"]["rows_in"] == 3
    finally:
        rt.stop()
        del aborted  # its client ends here, not at the broker's stop
