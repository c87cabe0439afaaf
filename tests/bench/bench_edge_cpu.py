"""Edges' CPU per million rows delivered, 1 edge against K, with the plan topics written
straight to the broker: no gateway, no Spark (issue 45).

bench_edges.py measures the edges behind a gateway; on a shared 2-core machine at load 16-32 its
gateway's micro-batches took 14-35 s and the edges delivered 0.2-15% of the rows owed, so its
"per million rows" was the edges' fixed costs over a handful of rows. Here a producer process
writes each plan topic's rows as the gateway's query does (keys `m:<epoch>:<batch>:<index>`,
a batch every 0.25 s, values with `sent` and `seq`), so the edges get every row at the rate
asked, and only their own CPU is measured.

Per trial and edge count K: a fresh store schema with N live handles (handle i of subject
c<i>, bound to plan topic i from offset 0), K edges (`xsg edge`, a process each), reader
processes over raw sockets (tests/bench/readers.py; handle i read on edge i mod K), the
producer for `--seconds`; each edge's CPU (user + system, /proc) from the producer's first row
to 3 s after its last, divided by the rows its readers got.

Run: .venv/bin/python tests/bench/bench_edge_cpu.py [--handles 1000] [--rate 20000]
         [--seconds 30] [--edges 1,4] [--trials 3]
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_edges import cpu_seconds, raise_fd_limit, start_edges
from tests.bench.harness import bench_parser, load_average, machine, rotations
from tests.bench.readers import ReadJob, reader_result, start_reader

BATCH = 0.25  # seconds between two "micro-batches" of the producer
GRACE = 3.0


def token(i: int) -> str:
    return f"tok-edgecpu-{i:05d}-0123456789"


def handle_id(i: int) -> str:
    return f"bench-{i:05d}-handle"


def prepare(store: str, tmp: Path, n: int, brokers: str, prefix: str) -> list[str]:
    """N live handles bound to N fresh plan topics (one partition), and the delivery topics."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from common.auth import write_auth_file
    from common.db import open_storage
    from common.migrations import migrate
    from pep.delivery.control import ensure_topics
    from pep.delivery.settings import DeliverySettings
    from pep.delivery.store import DeliveryStore
    from pep.handles.records import HandleRecord, HandleStore, StoredRequest
    from pep.streams.entries import SCHEMA as CATALOG_SCHEMA

    settings = DeliverySettings(brokers, security_protocol="PLAINTEXT", prefix=prefix)
    topics = [f"{settings.plan_prefix}{i:05d}" for i in range(n)]
    admin = AdminClient({"bootstrap.servers": brokers})
    for lo in range(0, n, 500):
        ensure_topics(admin, settings, topics[lo:lo + 500], timeout=120)
    ensure_topics(admin, settings, (settings.control_topic, settings.acks_topic))
    deadline = time.monotonic() + 180  # until every topic has a leader (the broker is slow)
    wanted = {*topics, settings.control_topic, settings.acks_topic}
    while time.monotonic() < deadline:
        try:
            meta = admin.list_topics(timeout=30).topics
        except KafkaException:  # the broker is busy creating them: asked again
            continue
        if all(t in meta and meta[t].partitions and meta[t].partitions[0].leader >= 0
               for t in wanted):
            break
        time.sleep(1)
    storage = open_storage(tmp, store, pool_size=2)
    try:
        handles = HandleStore(storage.database("handles"))
        migrate(storage.database("streams"), CATALOG_SCHEMA)
        delivery = DeliveryStore(storage.database("delivery"))
        for i in range(n):
            handles.insert(HandleRecord(handle_id(i), f"c{i:05d}", (), False, "s", "{}", "k", (),
                                        StoredRequest(b"<Request/>", "application/xacml+xml")))
            delivery.bind(handle_id(i), topics[i], 0)
    finally:
        storage.close()
    write_auth_file(tmp / "auth.json", [{"token": token(i), "subject": f"c{i:05d}",
                                         "roles": ["consumer"], "admin": False}
                                        for i in range(n)])
    return topics


def drop_topics(brokers: str, topics: list[str]) -> None:
    """A side's plan topics deleted (a broker of this benchmark's holding thousands of topics
    stopped answering metadata requests in time)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": brokers})
    for future in admin.delete_topics(topics, request_timeout=120).values():
        try:
            future.result(120)
        except Exception as exc:  # noqa: BLE001 - a benchmark goes on; said once
            print(f"  a plan topic was not deleted: {exc}")
            break


def produce(brokers: str, topics: list[str], rate: int, seconds: float, start: float) -> int:
    """(The producer process.) `rate` rows a second over the topics, a batch every 0.25 s."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": brokers, "linger.ms": 5, "acks": 1,
                         "queue.buffering.max.messages": 1_000_000})
    per_batch = max(1, int(rate * BATCH))
    sent = 0
    batch = 0
    while time.time() < start:
        time.sleep(0.01)
    while time.time() < start + seconds:
        now = time.time()
        index: dict[int, int] = {}
        for j in range(per_batch):
            t = (sent + j) % len(topics)
            k = index[t] = index.get(t, -1) + 1
            value = json.dumps({"sent": now, "seq": sent + j, "v": float(j)}).encode()
            while True:
                try:
                    producer.produce(topics[t], value, key=f"m:bench:{batch}:{k}".encode(),
                                     partition=0)
                    break
                except BufferError:  # the broker is behind: wait for room
                    producer.poll(0.05)
            if j % 1000 == 0:
                producer.poll(0)
        sent += per_batch
        batch += 1
        producer.poll(0)
        pause = start + batch * BATCH - time.time()
        if pause > 0:
            time.sleep(pause)
    producer.flush(60)
    return sent


def run(k: int, n: int, rate: int, seconds: float, store: str, brokers: str, tmp: Path,
        procs: int) -> dict[str, Any]:
    prefix = f"ec{int(time.time() * 1000) % 10_000_000}."
    topics = prepare(store, tmp, n, brokers, prefix)
    os.environ["XSG_DELIVERY_TOPIC_PREFIX"] = prefix  # the edges' (start_edges passes os.environ)
    edges = start_edges(k, tmp, store, brokers, tmp / "auth.json")
    readers: list[tuple[subprocess.Popen[bytes], ReadJob]] = []
    try:
        p = -(-max(procs, k) // k) * k
        for j in range(p):
            job = ReadJob("127.0.0.1", edges[j % k][1],
                          [(i, f"/handles/{handle_id(i)}", token(i)) for i in range(j, n, p)],
                          str(tmp / f"reader-{j}.out"), ready=str(tmp / f"reader-{j}.ready"),
                          seconds=seconds + 600)
            readers.append((start_reader(job), job))
        deadline = time.monotonic() + 120
        while (not all(Path(str(job.ready)).exists() for _, job in readers)
               and time.monotonic() < deadline):
            time.sleep(0.1)
        start = time.time() + 1.0
        producer = subprocess.Popen([sys.executable, __file__, "--produce", brokers,
                                     json.dumps(topics), str(rate), str(seconds), repr(start)],
                                    stdout=subprocess.PIPE, text=True)
        while time.time() < start:
            time.sleep(0.01)
        before = [cpu_seconds(proc.pid) for proc, _ in edges]
        sent = int(producer.communicate(timeout=seconds + 120)[0].split()[-1])
        time.sleep(GRACE)
        after = [cpu_seconds(proc.pid) for proc, _ in edges]
        load = load_average()
        results = [reader_result(proc, job, 30, stop=True) for proc, job in readers]
    finally:
        for proc, _ in readers:
            if proc.poll() is None:
                proc.kill()
        for proc, _ in edges:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        drop_topics(brokers, topics)
    rows = [0] * k
    for j, res in enumerate(results):
        rows[j % k] += int(res.get("rows", 0))
    cpu = [b - a for a, b in zip(before, after, strict=True)]
    return {"k": k, "sent": sent, "rows": rows, "cpu": cpu, "load": load,
            "per_m": [c / r * 1e6 if r else float("nan") for c, r in zip(cpu, rows, strict=True)]}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--produce":
        brokers, topics, rate, seconds, start = sys.argv[2:7]
        print(produce(brokers, json.loads(topics), int(rate), float(seconds), float(start)))
        return
    ap = bench_parser("one trial of 10 s at 100 handles, a smoke run")
    ap.add_argument("--handles", type=int, default=1000)
    ap.add_argument("--rate", type=int, default=20000, help="rows written per second (all topics)")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--edges", default="1,4", help="edge counts, comma-separated")
    ap.add_argument("--reader-procs", type=int, default=4)
    args = ap.parse_args()
    if args.quick:
        args.trials, args.seconds, args.handles = 1, 10.0, 100
    from tests.kafka.broker import KafkaBroker
    from tests.pg_server import start_server

    counts = [int(x) for x in args.edges.split(",")]
    print("machine:", machine("confluent_kafka"), f"; {args.handles} handles, {args.rate} rows/s "
          f"for {args.seconds:.0f} s; open files up to {raise_fd_limit()}")
    figures: dict[int, list[float]] = {k: [] for k in counts}
    with tempfile.TemporaryDirectory(prefix="xsg-bench-edge-cpu-") as tmp:
        postgres = start_server()
        broker = KafkaBroker(Path(tmp) / "kafka")
        broker.start()
        try:
            for t, order in enumerate(rotations(counts, args.trials)):
                for k in order:
                    side = Path(tmp) / f"t{t}-k{k}"
                    side.mkdir()
                    r = run(k, args.handles, args.rate, args.seconds, postgres.new_url(),
                            broker.bootstrap, side, args.reader_procs)
                    mean = statistics.mean(r["per_m"])
                    figures[k].append(mean)
                    print(f"trial {t + 1}, {k} edge(s): {r['sent']:,} rows written, "
                          f"{sum(r['rows']):,} delivered; edge CPU s "
                          + ", ".join(f"{c:.1f}" for c in r["cpu"])
                          + "; per M rows " + ", ".join(f"{x:.1f}" for x in r["per_m"])
                          + f"; load {r['load']}", flush=True)
        finally:
            broker.stop()
            postgres.stop()
    print("\nedge CPU s per M rows delivered (median over trials, mean over a side's edges):")
    base = statistics.median(figures[counts[0]])
    for k in counts:
        med = statistics.median(figures[k])
        print(f"  {k} edge(s): {med:.1f} ({med / base:.2f}x of {counts[0]}); trials "
              + ", ".join(f"{x:.1f}" for x in figures[k]))


if __name__ == "__main__":
    main()
