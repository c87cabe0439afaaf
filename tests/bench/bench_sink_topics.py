"""Spark's Kafka sink writing a micro-batch's records over many one-partition topics: the
gateway's producer settings (`DeliverySettings.spark_options`) against the sink as a user
writes it (the bootstrap servers and nothing else: Kafka's defaults), side by side in one
process, one broker, writes alternating.

Run: .venv/bin/python tests/bench/bench_sink_topics.py [--topics 4,1000] [--trials 3]
         [--options '{"name": {"kafka.batch.size": "65536"}}'] [--quick]

Per topic count, the writes are of 20 and of 100 records per topic (bench_edges' 1,000 handles
at 200 tuples/s, a tenth passing each plan: 20,000 records a second); below FEW topics (a
stream with few plans, bench_kafka's), bursts of 200,000 and 1,000,000 records. The first
write of each side (its producer's start and its lookup of every topic) is start-up, reported
apart; steady state is the median of the trials (min-max beside it). Records are ~100 bytes of JSON,
keyed as plan topics are. `--options` adds sides with the gateway's settings and these
instead (an experiment: another batch.size or buffer.memory).
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.harness import bench_parser, machine, ratio, rotations, spread

FEW = 100  # topics below which a write is a stream's burst rather than a batch over plans


def main() -> None:
    parser = bench_parser("one trial of 4 and 200 topics")
    parser.add_argument("--topics", default="4,1000", help="topic counts (default 4,1000)")
    parser.add_argument("--options", default="{}",
                        help="more sides: {name: {Spark Kafka sink option: value}} over the "
                             "gateway's settings")
    args = parser.parse_args()
    counts = [4, 200] if args.quick else [int(x) for x in args.topics.split(",")]
    trials = 1 if args.quick else args.trials

    from confluent_kafka.admin import AdminClient, NewTopic
    from pyspark.sql import DataFrame, functions as F

    from pep.delivery.settings import DeliverySettings
    from pep.runtime.session import create_spark_session
    from tests.kafka.broker import KafkaBroker, heap_for

    print(machine("confluent_kafka"))
    with tempfile.TemporaryDirectory() as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka", heap=heap_for(sum(counts))).start()
        try:
            settings = DeliverySettings(brokers=broker.bootstrap, security_protocol="PLAINTEXT")
            gateway = settings.spark_options()
            sides: dict[str, dict[str, str]] = {
                "gateway": gateway,
                "user": {"kafka.bootstrap.servers": broker.bootstrap}}
            for name, extra in json.loads(args.options).items():
                sides[name] = {**gateway, **extra}
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            spark = create_spark_session(app_name="bench-sink-topics")
            for n in counts:
                print(f"\n== {n} topics (broker heap {heap_for(sum(counts))})")
                # each side its own topics: a producer's first write looks each one up
                topics = {side: [f"s{n}-{side}-{i}" for i in range(n)] for side in sides}
                for names in topics.values():
                    for i in range(0, n, 500):
                        futures = admin.create_topics(
                            [NewTopic(t, 1, 1, config=settings.topic_config())
                             for t in names[i:i + 500]])
                        for future in futures.values():
                            future.result(60)

                def frame(side: str, rows: int, n: int = n) -> DataFrame:
                    prefix = f"s{n}-{side}-"
                    return spark.range(rows, numPartitions=2).select(
                        F.concat(F.lit(prefix), (F.col("id") % n).cast("string")).alias("topic"),
                        F.concat(F.lit("m:e:1:"), F.col("id").cast("string")
                                 ).cast("binary").alias("key"),
                        F.concat(F.lit('{"v": '), F.col("id").cast("string"),
                                 F.lit(', "sent": 1765000000.123456, "band": "b0042"}')
                                 ).alias("value"))

                def write(side: str, rows: int) -> float:
                    began = time.perf_counter()
                    frame(side, rows).write.format("kafka").options(**sides[side]).save()
                    return time.perf_counter() - began

                start = {side: write(side, n) for side in sides}
                print("  start-up (a producer's first write, one record per topic): "
                      + "; ".join(f"{s} {t:.2f} s" for s, t in start.items()))
                sizes = (20 * n, 100 * n) if n >= FEW else (200_000, 1_000_000)
                taken: dict[tuple[str, int], list[float]] = {}
                for order in rotations(list(sides), trials):
                    for rows in sizes:
                        for side in order:
                            taken.setdefault((side, rows), []).append(write(side, rows))
                for rows in sizes:
                    med = {s: statistics.median(taken[(s, rows)]) for s in sides}
                    cells = "; ".join(
                        f"{s} {spread(taken[(s, rows)], '{:.2f}')} s "
                        f"({rows / med[s]:,.0f} records/s)" for s in sides)
                    print(f"  {rows:,} records: {cells}; gateway/user time "
                          f"{ratio(med['gateway'], med['user'])}")
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
