"""Where a real-time row's time goes (issue 45): a Kafka stream in real-time mode
(`pep.runtime.query.realtime`) on a StreamRuntime of its own, one plan topic, a producer of
`--rate` records/s for `--seconds`; per row, from its produce call to Spark's write of it to
the plan topic (the plan record's CreateTime, set by Spark's Kafka producer), and from there to
a consumer of the plan topic fetching as the edge does (`fetch.wait.max.ms`
`pep.edge.feed.FETCH_WAIT_MS`). The worst rows are listed with the second of the run they were
produced in: a burst of late rows, each a little less late than the one before, is a pause of
the reading (a real-time batch's end: its commit, the next batch planned and its tasks started).

Run: .venv/bin/python tests/bench/bench_realtime_split.py [--batch 30] [--seconds 60]
                                                         [--rate 100]
(needs `make install`'s jars; starts a broker of its own; every loop is bounded.)
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=float, default=30.0, help="real-time batch seconds")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=100.0, help="records/s (all pass)")
    args = parser.parse_args()
    from confluent_kafka import Consumer, Producer, TopicPartition

    from pep.core.plan import ExecutionPlan, Predicate
    from pep.delivery.settings import DeliverySettings
    from pep.edge.feed import FETCH_WAIT_MS
    from pep.ports import TopicTarget
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    from pep.runtime.session import create_spark_session
    from tests.bench.harness import load_average
    from tests.kafka.broker import KafkaBroker
    from tests.kafka.test_kafka_runtime import kafka_stream, rec

    tmp = Path(tempfile.mkdtemp())
    broker = KafkaBroker(tmp / "kafka")
    broker.start()
    print("load average at the start:", load_average())
    try:
        broker.create_topic("src", 1)
        broker.create_topic("plan", 1)
        spark = create_spark_session("local[2]", "bench-realtime-split",
                                     {"spark.sql.shuffle.partitions": "2"})
        stream = kafka_stream(broker, "src")
        delivery = DeliverySettings(broker.bootstrap, security_protocol="PLAINTEXT",
                                    realtime=args.batch)
        runtime = StreamRuntime(spark, tmp / "work", settings=RuntimeSettings(
            trigger_interval=0.25, delivery=delivery))
        runtime.attach_handle("a", stream, ExecutionPlan(
            stream.name, ((Predicate("v", ">", 0.0),),), ("v",)), TopicTarget("plan", lambda: True))
        print("mode:", runtime._executors[stream.name].lifecycle.mode)
        time.sleep(4.0)  # the real-time tasks read the partition
        sent: dict[int, float] = {}
        got: list[tuple[str, float, float]] = []
        stop = threading.Event()

        def consume() -> None:
            consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "split",
                                 "fetch.wait.max.ms": FETCH_WAIT_MS,
                                 "enable.auto.commit": False})
            consumer.assign([TopicPartition("plan", 0, 0)])
            while not stop.is_set():
                msg = consumer.poll(0.05)
                if msg is not None and msg.error() is None:
                    got.append((bytes(msg.key() or b"").decode(), msg.timestamp()[1] / 1000.0,
                                time.time()))
            consumer.close()
        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                             "linger.ms": 0})
        start, i = time.time(), 0
        while time.time() - start < args.seconds:
            due = start + i / args.rate
            if due > time.time():
                time.sleep(due - time.time())
            now = time.time()

            def report(err: Any, msg: Any, now: float = now) -> None:
                if err is None:
                    sent[int(msg.offset())] = now
            producer.produce("src", json.dumps(rec(i, 1.0 + i)).encode(), on_delivery=report,
                             partition=0)
            producer.poll(0)
            i += 1
        producer.flush(10)
        time.sleep(3.0)
        stop.set()
        reader.join(5)
        rows = [(sent[o], written - sent[o], arrived - written, arrived - sent[o])
                for key, written, arrived in got
                if key.startswith("r:")  # rows, not the count markers (realtime_mode.py)
                and (o := int(key.rsplit("/", 1)[1])) in sent]
        print(f"real-time batches of {args.batch:g} s, {args.rate:g} records/s for "
              f"{args.seconds:g} s: {len(rows)} of {len(sent)} rows")
        for name, k in (("produce -> Spark's write", 1), ("Spark's write -> consumer", 2),
                        ("produce -> consumer", 3)):
            xs = [r[k] for r in rows]
            if xs:
                print(f"  {name:26s} p50 {percentile(xs, .5):7.1f} ms, p95 "
                      f"{percentile(xs, .95):7.1f} ms, p99 {percentile(xs, .99):7.1f} ms, max "
                      f"{max(xs) * 1000:7.1f} ms")
        worst = sorted(rows, key=lambda r: -r[3])[:10]
        print("  the worst (second of the run, ms):",
              [(round(r[0] - start, 2), round(r[3] * 1000)) for r in worst])
        runtime.stop()
        spark.stop()
    finally:
        broker.stop()
        print("load average at the end:", load_average())


if __name__ == "__main__":
    main()
