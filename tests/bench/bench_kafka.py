"""A Kafka stream through the gateway against the direct Structured Streaming query a user would
write on the same kind of topic; and what Spark's real-time mode gives.

Run: .venv/bin/python tests/bench/bench_kafka.py [--quick] [--trials 3] [--records 100000]
                                                [--rate 200] [--seconds 20] [--startup 5]
                                                [--parts throughput,latency,realtime,ingest]
                                                [--topics-caps 10000,30000,100000]
     (needs `make install`'s jars)

A single-node Kafka broker (KRaft, tests/kafka/broker.py); topics of 3 partitions; records carry
`ts` (ISO-8601 text, 1 ms apart), `v` (0-99) and `sent` (epoch seconds when produced); the
policy's filter `v < 50` passes half of them and its map keeps four columns. The sides
(tests/bench/harness.py says why these):
- gateway: one real gateway as `xsg serve` runs it (its SparkSession, StreamRuntime, HTTP server),
  a stream on the topic with the gateway's defaults (trigger 0.25 s, maxOffsetsPerTrigger
  10,000); a handle read over HTTP (NDJSON) by a reader process of its own;
- gateway-topics: the same gateway with `delivery = "kafka"` (a real PostgreSQL store, the
  broker): Spark writes the plan's topic (maxOffsetsPerTrigger 100,000), an edge (`xsg edge`, a
  process of its own) serves the reader;
- gateway-realtime: that gateway with real-time mode on (`delivery_realtime`, 30 s batches,
  `--realtime-batch`: each batch's end pauses the reading; a store, topic prefix and edge of its
  own), in part 3 only;
- user: the same parse, filter and projection as a user writes it, in an application of its own
  (its own process, JVM and SparkSession with Spark's defaults; no maxOffsetsPerTrigger, the
  default trigger), each micro-batch's rows brought to the driver with `toArrow()`;
- gateway-settings: that query in the gateway's session with the gateway's trigger and cap: the
  difference from `user` is what those settings cost.
Producers are processes of their own (confluent-kafka, acks=all).
1. throughput: a backlog of N records produced once the side is ready (the handle's query, or
   the direct query, at the topic's end); from the first record produced to the last row read.
   Start-up: each side's first run after a fresh start (the gateway just started, with its own
   warm-up; the user's application just started; the gateway-settings query in the gateway's
   JVM after the gateway's first run), reported apart; then `--trials` trials, the sides'
   order rotating. A run in which a row never arrives has no rate (infinitely late).
2. latency from produce to reader: `--rate` records/s for `--seconds`, one at a time, starting
   right after the side's query started; p50/p95/p99 over every record that passes, those that
   never arrive infinitely late; the first `--startup` seconds (start-up) apart from the rest
   (steady state). Same rotation of trials.
3. real-time mode (Spark 4.1+): gateway-topics against gateway-realtime on the same topic (one
   partition: a real-time task holds a slot per partition), one side at a time, the order
   rotating, as in 2; then a user's real-time query (`trigger(realTime=...)`, the same filter
   and projection, Kafka -> Kafka), latency read by a consumer process of the output topic; and
   whether a foreachBatch sink may run so (it may not).
   `--topics-caps 10000,30000,100000`: gateway-topics' backlog rate at each cap against the
   user's query (how KAFKA_TOPICS_MAX_OFFSETS was chosen). `--parts` picks the parts to run.
4. the gateway's records API into Kafka: records/s acknowledged through
   `POST /streams/<s>/records` against the same batches produced directly, each from a process
   of its own, alternating.
Only loopback traffic; every loop is bounded; everything started is stopped, even on error.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pep.core.exact import iso_from_micros
from tests.bench.direct import (
    USER,
    DirectSides,
    Handler,
    QuerySettings,
    UserApp,
    from_dict,
    gateway_settings,
    serve_user_app,
    started_user_app,
)
from tests.bench.harness import (
    SIDE_NAMES,
    Child,
    backlog_figures,
    backlog_summary,
    backlog_trials,
    bench_parser,
    latency_line,
    load_average,
    machine,
    pct,
    ratio,
    reply,
    rotations,
    run_child,
    run_command,
    secs,
    sleep_until,
    spread,
    with_missing,
)
from tests.bench.readers import ReadJob, handle_path, reader_result, start_reader, wait_ready
from tests.bench.served import (
    ADMIN_TOKEN,
    NDJSON,
    Gateway,
    accounts,
    consumer_token,
    hdr,
    inline_policy,
    request_json,
    started_spark,
)

FIELDS = [("ts", "timestamp"), ("station", "string"), ("v", "double"), ("sent", "double")]
COLUMNS = ["ts", "station", "v", "sent"]
CONDITION = "v < 50"  # half the records pass: record i has v = i % 100
POLICY_ID = "urn:xsg:bench:kafka"
SIDES = ("gateway", "gateway-topics", "user", "gateway-settings")
# the gateway's two ways of delivering: rows into the handle's buffer in the gateway process
# (`delivery = "process"`), or written by Spark to the plan's topic and served by an edge
GATEWAYS = ("gateway", "gateway-topics", "gateway-realtime")
# the same-topic comparison of the plan-topics path in micro-batches and in real-time mode
REALTIME_SIDES = ("gateway-topics", "gateway-realtime")
REALTIME_BATCH = 30.0  # seconds of a real-time batch (each batch end pauses the reading)
SINCE = "the first record"
GRACE = 5.0  # seconds after the last record a row may still arrive before it counts as never
LEAD = 3.0  # seconds from a latency run's set-up to its first record (the producer's start)
T0_MICROS = 1_700_000_000_000_000  # record 0's `ts`, epoch microseconds


def passes(i: int) -> bool:
    return i % 100 < 50


def expected_rows(n: int) -> int:
    return sum(1 for i in range(n) if passes(i))


def record(i: int) -> dict[str, Any]:
    """Record i: `ts` 1 ms after record i - 1's, in the text a Kafka stream's `timestamp` reads
    (ISO-8601, as the records API writes it: Spark's JSON parser makes a fractional number of
    epoch seconds null, and the gateway's query and the user's alike would carry no time)."""
    return {"ts": iso_from_micros(T0_MICROS + i * 1000), "station": "ABC"[i % 3],
            "v": float(i % 100), "sent": time.time()}


# -- producer and consumer processes ---------------------------------------------------------------

def producer(bootstrap: str, linger_ms: int = 5) -> Any:
    from confluent_kafka import Producer
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                     "linger.ms": linger_ms, "queue.buffering.max.messages": 1_000_000})


def produce(p: Any, topic: str, n: int) -> None:
    for i in range(n):
        while True:
            try:
                p.produce(topic, json.dumps(record(i)).encode())
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(120) == 0


def produce_backlog_main(bootstrap: str, topic: str, n: int) -> None:
    p = producer(bootstrap)
    start = time.time()
    produce(p, topic, n)
    reply({"start": start, "end": time.time()})


def produce_steady_main(bootstrap: str, topic: str, rate: float, seconds: float,
                        start_at: float) -> None:
    """One record at a time (linger.ms 0), `rate` per second for `seconds` from `start_at`;
    answers every record's `sent`."""
    p = producer(bootstrap, linger_ms=0)
    sleep_until(start_at)
    sent: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pause = start + len(sent) / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        r = record(len(sent))
        p.produce(topic, json.dumps(r).encode())
        p.poll(0)
        sent.append(r["sent"])
    assert p.flush(60) == 0
    reply({"sent": sent})


def produce_batches_main(bootstrap: str, topic: str, batches: int, per_batch: int) -> None:
    """Batches produced directly, each flushed (acknowledged) before the next, as the API does."""
    p = producer(bootstrap)
    start = time.perf_counter()
    for _ in range(batches):
        produce(p, topic, per_batch)
    reply({"rate": batches * per_batch / (time.perf_counter() - start)})


def post_batches_main(url: str, name: str, batches: int, per_batch: int) -> None:
    import requests
    body = ("\n".join(json.dumps(record(i)) for i in range(per_batch)) + "\n").encode()
    start = time.perf_counter()
    with requests.Session() as s:
        for _ in range(batches):
            r = s.post(f"{url}/streams/{name}/records", data=body, timeout=60,
                       headers=hdr(ADMIN_TOKEN, **NDJSON))
            assert r.status_code == 201, r.text
    reply({"rate": batches * per_batch / (time.perf_counter() - start)})


def consume_main(bootstrap: str, topic: str, seconds: float, want: int,
                 phases: list[list[float]]) -> None:
    """Read `topic` until `want` records or `seconds`; each record's latency (now - sent) under
    the phase its `sent` falls in."""
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": topic,
                  "auto.offset.reset": "earliest", "fetch.wait.max.ms": 5})
    c.subscribe([topic])
    lat: list[list[float]] = [[] for _ in phases]
    got = 0
    deadline = time.monotonic() + seconds
    try:
        while got < want and time.monotonic() < deadline:
            msg = c.poll(0.1)
            if msg is None or msg.error() is not None:
                continue
            now = time.time()
            sent = json.loads(msg.value())["sent"]
            got += 1
            for k, (lo, hi) in enumerate(phases):
                if lo <= sent < hi:
                    lat[k].append(now - sent)
    finally:
        c.close()
    reply({"lat": lat, "rows": got})


# -- the direct query (in the user's application, or in the gateway's session) ---------------------

class Direct:
    """The topic's records parsed, filtered and projected as the gateway's plan does, each
    micro-batch's rows brought to the driver as Arrow (what a user's application reads)."""

    def __init__(self, spark: Any, settings: QuerySettings, bootstrap: str, topic: str,
                 phases: list[list[float]] | None = None) -> None:
        from pyspark.sql import functions as F

        from pep.core.plan import Field, StreamSchema
        from pep.runtime.sources.frames import spark_schema
        schema = spark_schema(StreamSchema(tuple(Field(n, t) for n, t in FIELDS)))
        reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                  .option("subscribe", topic))
        self.frame = (settings.source(reader, "kafka").load()
                      .select(F.from_json(F.col("value").cast("string"), schema).alias("r"))
                      .select("r.*").filter(CONDITION).select(*COLUMNS))
        self.settings = settings
        self.phases = phases or []
        self.lat: list[list[float]] = [[] for _ in self.phases]
        self.rows = 0
        self.batches = 0  # micro-batches that brought rows
        self.first: float | None = None
        self.last: float | None = None
        self.query: Any = None
        self.checkpoint = tempfile.mkdtemp(prefix="xsg-bench-direct-")

    def _batch(self, df: Any, _id: int) -> None:
        table = df.toArrow()
        now = time.time()
        if not table.num_rows:
            return
        self.rows += table.num_rows
        self.batches += 1
        self.first = self.first or now
        self.last = now
        for sent in table.column("sent").to_pylist():
            for k, (lo, hi) in enumerate(self.phases):
                if lo <= sent < hi:
                    self.lat[k].append(now - sent)

    def start(self) -> Direct:
        """Started, and at the topic's end: records produced from now on are read."""
        from pep.runtime.sources.checkpoints import await_kafka_offsets
        writer = (self.frame.writeStream.foreachBatch(self._batch)
                  .option("checkpointLocation", self.checkpoint))
        self.query = self.settings.trigger_on(writer).start()
        await_kafka_offsets(Path(self.checkpoint), 1, self.query)
        return self

    def wait(self, want: int, until: float) -> None:
        while self.rows < want and time.time() < until:
            time.sleep(0.05)

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()


def direct_throughput(spark: Any, settings: dict[str, Any], bootstrap: str, topic: str,
                      n: int, timeout: float) -> dict[str, Any]:
    direct = Direct(spark, from_dict(settings), bootstrap, topic).start()
    try:
        produced = run_child(__file__, ["--produce-backlog", bootstrap, topic, n])
        direct.wait(expected_rows(n), time.time() + timeout)
    finally:
        direct.stop()
    return {"rows": direct.rows, "start": produced["start"], "first": direct.first,
            "last": direct.last, "lost": 0, "batches": direct.batches}


def direct_latency(spark: Any, settings: dict[str, Any], bootstrap: str, topic: str,
                   rate: float, seconds: float, startup: float) -> dict[str, Any]:
    direct = Direct(spark, from_dict(settings), bootstrap, topic).start()
    try:
        start_at = time.time() + LEAD
        direct.phases = phases(start_at, startup, seconds)
        direct.lat = [[], []]
        steady = Child(__file__, ["--produce-steady", bootstrap, topic, rate, seconds, start_at])
        sent = steady.result(seconds + 120)["sent"]
        direct.wait(expected_rows(len(sent)), time.time() + GRACE)
    finally:
        direct.stop()
    return {"sent": sent, "phases": direct.phases, "lat": direct.lat}


def phases(start_at: float, startup: float, seconds: float) -> list[list[float]]:
    """By a record's `sent`: the first `startup` seconds, then the rest of the run."""
    return [[start_at, start_at + startup], [start_at + startup, start_at + seconds + 1]]


def realtime_latency(spark: Any, bootstrap: str, topic: str, out_topic: str, rate: float,
                     seconds: float, startup: float, batch: float = 30.0) -> dict[str, Any]:
    """A user's real-time query: Kafka -> parse, filter, project -> Kafka output topic; a
    consumer process of the output topic measures the latency. `batch`: seconds of its
    real-time batches (the gateway's, `--realtime-batch`: each batch's end pauses the reading)."""
    from pyspark.sql import functions as F
    direct = Direct(spark, USER, bootstrap, topic)
    query = (direct.frame.select(F.to_json(F.struct(*COLUMNS)).alias("value"))
             .writeStream.format("kafka").outputMode("update")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("topic", out_topic).option("checkpointLocation", direct.checkpoint)
             .trigger(realTime=f"{int(batch)} seconds").start())
    try:
        time.sleep(5.0)  # the real-time query has started its long-running batch
        start_at = time.time() + LEAD
        split = phases(start_at, startup, seconds)
        want = expected_rows(int(rate * seconds) + 1)
        consumer = Child(__file__, ["--consume", bootstrap, out_topic, seconds + 1 + GRACE + 5,
                                    want, json.dumps(split)])
        sent = Child(__file__, ["--produce-steady", bootstrap, topic, rate, seconds,
                                start_at]).result(seconds + 120)["sent"]
        got = consumer.result(seconds + 120)
    finally:
        error = query.exception()
        query.stop()
    return {"sent": sent, "phases": split, "lat": got["lat"],
            "error": str(error)[:200] if error else None}


def foreach_batch_realtime(spark: Any, bootstrap: str, topic: str) -> dict[str, Any]:
    """Whether the shared query's sink (foreachBatch) may run in real-time mode."""
    direct = Direct(spark, USER, bootstrap, topic)
    try:
        q = (direct.frame.writeStream.foreachBatch(lambda df, i: None)
             .option("checkpointLocation", direct.checkpoint)
             .trigger(realTime="30 seconds").start())
        q.stop()
        return {"answer": "accepted"}
    except Exception as exc:  # noqa: BLE001 - the answer is the point
        return {"answer": str(exc).split("SQLSTATE")[0].strip()[:300]}


USER_APP: dict[str, Handler] = {"throughput": direct_throughput, "latency": direct_latency,
                                "realtime": realtime_latency,
                                "foreach_batch_realtime": foreach_batch_realtime}


# -- the benchmark ---------------------------------------------------------------------------------

class Bench:
    def __init__(self, spark: Any, gws: dict[str, Gateway], edge_ports: dict[str, int],
                 broker: Any, app: UserApp, tmp: Path) -> None:
        self.spark, self.gws, self.broker, self.app, self.tmp = spark, gws, broker, app, tmp
        self.gw = gws["gateway"]
        self.edge_ports = edge_ports  # per plan-topics gateway, the edge serving its handles
        self.sides = DirectSides(spark, app, USER_APP)
        self.count = 0
        self.streams = 0
        self.cap: int | None = None  # the streams' maxOffsetsPerTrigger, None: the gateway's

    def topic(self, partitions: int = 3) -> str:
        self.count += 1
        name = f"bench-{self.count}-{int(time.time())}"
        self.broker.create_topic(name, partitions)
        return name

    def stream(self, side: str = "gateway", topic: str | None = None) -> tuple[str, str]:
        """A gateway stream (its defaults) on `topic` (None: a fresh one of 3 partitions),
        granted to every consumer."""
        topic = topic or self.topic()
        self.streams += 1
        name = f"k{self.streams}"
        gw = self.gws[side]
        source = {"kind": "kafka", "bootstrap.servers": self.broker.bootstrap, "subscribe": topic}
        if self.cap is not None:
            source["maxOffsetsPerTrigger"] = str(self.cap)
        gw.register(name, FIELDS, source, "ts")
        gw.add_policy(inline_policy(f"{POLICY_ID}:{name}", [name], CONDITION, COLUMNS))
        return name, topic

    def reader(self, side: str, handle: str, **options: Any) -> tuple[Any, Any]:
        """The reader process of `handle`: on the gateway, or on the edge for plan topics."""
        out = self.tmp / f"read-{self.count}.out"
        ready = str(self.tmp / f"read-{self.count}.ready")
        if side in self.edge_ports:
            job = ReadJob("127.0.0.1", self.edge_ports[side], [(0, handle_path(handle),
                                                         consumer_token(1))], str(out),
                          ready=ready, **options)
        else:
            job = self.gws[side].reader([(0, handle, consumer_token(1))], out, ready=ready,
                                        **options)
        proc = start_reader(job)
        if not wait_ready(job, 60):
            raise RuntimeError("the reader process did not connect")
        return proc, job

    def throughput(self, side: str, n: int, timeout: float) -> dict[str, Any]:
        side, _, cap = side.partition("@")  # "gateway-topics@30000": that stream's cap
        if side not in GATEWAYS:
            res = self.sides.run(side, "throughput", wait=timeout + 300,
                                 bootstrap=self.broker.bootstrap, topic=self.topic(), n=n,
                                 timeout=timeout)
        else:
            gw = self.gws[side]
            before, self.cap = self.cap, int(cap) if cap else self.cap
            try:
                name, topic = self.stream(side)
            finally:
                self.cap = before
            handle = gw.open(consumer_token(1), request_json(name))["handle"]
            try:
                proc, job = self.reader(side, handle, want=expected_rows(n), seconds=timeout)
                produced = run_child(__file__, ["--produce-backlog", self.broker.bootstrap, topic,
                                                n])
                got = reader_result(proc, job, timeout + 60)
            finally:
                gw.release(consumer_token(1), handle)
            res = {"rows": got["rows"], "lost": got["lost"], "start": produced["start"],
                   "first": got["first"], "last": got["last"], "errors": got["errors"]}
        return backlog_figures(res, expected_rows(n))

    def latency(self, side: str, rate: float, seconds: float, startup: float,
                topic: str | None = None) -> dict[str, Any]:
        if side not in GATEWAYS:
            return self.sides.run(side, "latency", wait=seconds + 300,
                                  bootstrap=self.broker.bootstrap, topic=self.topic(), rate=rate,
                                  seconds=seconds, startup=startup)
        gw = self.gws[side]
        name, topic = self.stream(side, topic)
        handle = gw.open(consumer_token(1), request_json(name))["handle"]
        mode = None
        try:
            if side == "gateway-realtime":
                mode = wait_mode(gw, name, "realtime", 60.0)
                time.sleep(2.0)  # its real-time tasks are reading the partitions
            # rows produced before the reader is connected wait in the handle's buffer (or its
            # topic): the records start at `start_at` whether it is or not
            start_at = time.time() + LEAD
            split = phases(start_at, startup, seconds)
            proc, job = self.reader(side, handle, phases=split,
                                    seconds=seconds + LEAD + GRACE + 30)
            sent = run_child(__file__, ["--produce-steady", self.broker.bootstrap, topic, rate,
                                        seconds, start_at], seconds + 120)["sent"]
            time.sleep(max(0.0, sent[-1] + GRACE - time.time()) if sent else 0.0)
            got = reader_result(proc, job, 30, stop=True)
        finally:
            gw.release(consumer_token(1), handle)
        return {"sent": sent, "phases": split, "lat": got["lat"], "mode": mode}

    def ingest(self, how: str, batches: int, per_batch: int) -> float:
        name, topic = self.stream()
        if how == "api":
            return float(run_child(__file__, ["--post-batches", self.gw.url, name, batches,
                                              per_batch])["rate"])
        return float(run_child(__file__, ["--produce-batches", self.broker.bootstrap, topic,
                                          batches, per_batch])["rate"])


def phase_split(res: dict[str, Any]) -> list[tuple[list[float], int]]:
    """(latencies, rows expected) per phase, by the records' `sent`."""
    out = []
    for k, (lo, hi) in enumerate(res["phases"]):
        want = sum(1 for i, s in enumerate(res["sent"]) if passes(i) and lo <= s < hi)
        out.append((res["lat"][k], want))
    return out


def main() -> None:
    if run_command({"--user-app": (lambda: serve_user_app(USER_APP, kafka=True), ()),
                    "--produce-backlog": (produce_backlog_main, (str, str, int)),
                    "--produce-steady": (produce_steady_main, (str, str, float, float, float)),
                    "--produce-batches": (produce_batches_main, (str, str, int, int)),
                    "--post-batches": (post_batches_main, (str, str, int, int)),
                    "--consume": (consume_main, (str, str, float, int, json.loads))}):
        return
    parser = bench_parser("a smoke run of a few minutes (one trial, smaller sizes)")
    parser.add_argument("--records", type=int, default=100_000, help="throughput backlog")
    parser.add_argument("--rate", type=float, default=200.0, help="records/s for the latency")
    parser.add_argument("--seconds", type=float, default=20.0, help="latency run length")
    parser.add_argument("--startup", type=float, default=5.0,
                        help="the latency run's first seconds, reported as start-up")
    parser.add_argument("--timeout", type=float, default=300.0, help="per throughput run")
    parser.add_argument("--parts", default="throughput,latency,realtime,ingest",
                        help="which parts to run, comma-separated")
    parser.add_argument("--topics-caps", default="",
                        help="throughput of the plan-topics gateway at each of these "
                             "maxOffsetsPerTrigger (comma-separated) against the user's query")
    parser.add_argument("--realtime-batch", type=float, default=REALTIME_BATCH,
                        help="seconds of a real-time batch, the gateway's (delivery_realtime) "
                             "and the user's real-time query's alike")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help="the throughput part's sides, comma-separated (gateway-topics,user "
                             "for the plan-topics path against the user's query alone)")
    parser.add_argument("--cap", type=int, default=None,
                        help="the gateway streams' maxOffsetsPerTrigger (default: the gateway's)")
    args = parser.parse_args()
    n = 20_000 if args.quick else args.records
    trials = 1 if args.quick else args.trials
    seconds = 10.0 if args.quick else args.seconds
    print("machine:", machine())
    from pep.delivery.settings import DeliverySettings
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    from pep.runtime.session import kafka_connector_jars
    from tests.kafka.broker import KafkaBroker
    from tests.pg_server import start_server
    if not kafka_connector_jars():
        sys.exit("no Kafka connector for this pyspark: run `make install`")
    gws = gateway_settings()
    print(f"sides: gateway (its defaults); {SIDE_NAMES['user']} ({USER.describe()}, an "
          f"application of its own); {SIDE_NAMES['gateway-settings']} ({gws.describe()}, in the "
          f"gateway's session); filter {CONDITION!r}: half the records pass")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="xsg-bench-kafka-") as tmp_dir, ExitStack() as stack:
        tmp = Path(tmp_dir)
        broker = KafkaBroker(tmp / "kafka", heap="1g").start()
        stack.callback(broker.stop)
        postgres = start_server()
        stack.callback(postgres.close)
        spark = started_spark(stack)
        gws = {"gateway": Gateway(StreamRuntime(spark, tmp / "gw" / "runtime"), tmp / "gw",
                                  accounts(2))}
        stack.callback(gws["gateway"].close)
        # the same gateway delivering through plan topics (`delivery = "kafka"`) on a real store
        # and the broker, its handles read through an edge (`xsg edge`, a process of its own)
        store, brokers = postgres.new_url(), broker.bootstrap
        delivery = DeliverySettings(brokers, security_protocol="PLAINTEXT")
        gws["gateway-topics"] = Gateway(
            StreamRuntime(spark, tmp / "gwt" / "runtime",
                          settings=RuntimeSettings(delivery=delivery)),
            tmp / "gwt", accounts(2), store=store, delivery="kafka", delivery_brokers=brokers,
            delivery_security_protocol="PLAINTEXT")
        stack.callback(gws["gateway-topics"].close)
        # and with real-time mode on (`delivery_realtime`), a store, prefix and edge of its own
        rt_store = postgres.new_url()
        gws["gateway-realtime"] = Gateway(
            StreamRuntime(spark, tmp / "gwr" / "runtime", settings=RuntimeSettings(
                delivery=DeliverySettings(brokers, security_protocol="PLAINTEXT",
                                          prefix="xsgrt.", realtime=args.realtime_batch))),
            tmp / "gwr", accounts(2), store=rt_store, delivery="kafka",
            delivery_brokers=brokers, delivery_security_protocol="PLAINTEXT",
            delivery_topic_prefix="xsgrt.", delivery_realtime=args.realtime_batch)
        stack.callback(gws["gateway-realtime"].close)
        edges = [start_edge(tmp, "edge-topics", store, brokers, tmp / "gwt" / "auth.json",
                            "xsg."),
                 start_edge(tmp, "edge-realtime", rt_store, brokers,
                            tmp / "gwr" / "auth.json", "xsgrt.")]
        stack.callback(stop_edges, edges)
        app = started_user_app(stack, __file__)
        bench = Bench(spark, gws, {"gateway-topics": edges[0][1],
                                   "gateway-realtime": edges[1][1]}, broker, app, tmp)
        bench.cap = args.cap
        parts = set(args.parts.split(","))
        if "throughput" in parts:
            sides = tuple(x for x in args.sides.split(",") if x)
            unknown = set(sides) - set(SIDES)
            if unknown:
                sys.exit(f"--sides: unknown {sorted(unknown)}; known {list(SIDES)}")
            results["tp"] = throughput(bench, n, trials, args.timeout, sides)
        if args.topics_caps:
            results["caps"] = caps_sweep(bench, n, trials, args.timeout,
                                         [int(c) for c in args.topics_caps.split(",")])
        if "latency" in parts:
            results["lat"] = latency(bench, args.rate, seconds, args.startup, trials)
        if "realtime" in parts:
            results["rtm_gw"] = realtime_gateway(bench, args.rate, seconds, args.startup, trials,
                                                 args.realtime_batch)
            results["rtm"] = realtime(bench, args.rate, seconds, args.startup,
                                      args.realtime_batch)
        if "ingest" in parts:
            results["ingest"] = ingest_rates(bench, 10 if args.quick else 40, max(1, trials))
    summary(results)
    print("load average at the end:", load_average())


def start_edge(tmp: Path, name: str, store: str, brokers: str, auth: Path, prefix: str
               ) -> tuple[subprocess.Popen[bytes], int]:
    """An edge (`xsg edge`, a process of its own) of the gateway whose store and topic prefix
    these are; (process, port) once it listens."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XSG_STORE": store,
           "XSG_DELIVERY_BROKERS": brokers, "XSG_DELIVERY_SECURITY_PROTOCOL": "PLAINTEXT",
           "XSG_DELIVERY_TOPIC_PREFIX": prefix}
    log = tmp / f"{name}.out"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-u", "-m", "pep.cli", "edge", "--port", "0",
                                 "--id", name, "--auth", str(auth), "--log-level", "WARNING"],
                                stdout=f, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(f"xsg edge {name} on "):
                return proc, int(line.split()[4].rsplit(":", 1)[1])
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"edge {name} did not start: {log.read_text()[-2000:]}")


def wait_mode(gw: Gateway, stream: str, mode: str, timeout: float) -> str | None:
    """The mode of the stream's query (`QueryLifecycle.mode`) once it is `mode`, or what it is
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    now = None
    while time.monotonic() < deadline:
        executor = gw.runtime._executors.get(stream)
        now = executor.lifecycle.mode if executor is not None else None
        if now == mode and executor.lifecycle.active:
            return now
        time.sleep(0.1)
    return now


def stop_edges(edges: list[tuple[Any, int]]) -> None:
    for proc, _ in edges:
        proc.terminate()
        try:
            proc.wait(30)
        except Exception:  # noqa: BLE001 - it is killed instead
            proc.kill()


def throughput(bench: Bench, n: int, trials: int, timeout: float,
               sides: tuple[str, ...] = SIDES) -> dict[str, Any]:
    print(f"\n1. throughput: a backlog of {n:,} records ({expected_rows(n):,} pass), 3 partitions")
    tp = backlog_trials(lambda side: bench.throughput(side, n, timeout), sides, trials, SINCE)
    tp["sides"] = sides
    return tp


def caps_sweep(bench: Bench, n: int, trials: int, timeout: float,
               caps: list[int]) -> dict[str, Any]:
    """The plan-topics gateway's backlog rate at each records-per-micro-batch cap, against the
    user's query, in rotating trials (to choose the default, `KAFKA_TOPICS_MAX_OFFSETS`)."""
    print(f"\n1b. plan topics + edge by maxOffsetsPerTrigger, a backlog of {n:,} records")
    sides = [f"gateway-topics@{c}" for c in caps] + ["user"]
    names = {**SIDE_NAMES, **{f"gateway-topics@{c}": f"plan topics + edge, cap {c:,}"
                              for c in caps}}
    tp = backlog_trials(lambda side: bench.throughput(side, n, timeout), sides, trials, SINCE,
                        names)
    med = {s: statistics.median(t["rate"] for t in tp["runs"][s]) for s in sides}
    for c in caps:
        print(f"    cap {c:>7,}: {med[f'gateway-topics@{c}']:,.0f} rows/s, / user "
              f"{ratio(med[f'gateway-topics@{c}'], med['user'])}")
    return tp


def latency(bench: Bench, rate: float, seconds: float, startup: float,
            trials: int) -> dict[str, Any]:
    print(f"\n2. latency, produce -> reader, {rate:.0f} records/s for {seconds:.0f} s (half pass); "
          f"start-up = the first {startup:.0f} s after the query started")
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
    for k, order in enumerate(rotations(SIDES, trials)):
        for side in order:
            res = bench.latency(side, rate, seconds, startup)
            runs[side].append(res)
            for label, (lat, want) in zip(("start-up", "steady"), phase_split(res), strict=True):
                print(f"  trial {k + 1} {SIDE_NAMES[side]:32s} {label:8s} "
                      f"{latency_line(lat, want, 'ms')}")
            late = res["sent"][0] - res["phases"][0][0] if res["sent"] else 0.0
            if late > 0.2:
                print(f"  (the producer started {late:.1f} s late: the start-up phase is shorter)")
    return runs


def realtime_gateway(bench: Bench, rate: float, seconds: float, startup: float,
                     trials: int, batch: float) -> dict[str, Any]:
    """Through plan topics and an edge, micro-batches against real-time mode, on the same topic
    (one partition: real-time mode wants a task slot per partition and one more), one side at a
    time, the order rotating."""
    print(f"\n3. plan topics + edge, micro-batches against real-time mode ({batch:g} s "
          f"batches), the same topic (1 partition), {rate:.0f} records/s for {seconds:.0f} s "
          f"(half pass), start-up = the first {startup:.0f} s")
    topic = bench.topic(1)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in REALTIME_SIDES}
    for k, order in enumerate(rotations(REALTIME_SIDES, trials)):
        for side in order:
            res = bench.latency(side, rate, seconds, startup, topic=topic)
            runs[side].append(res)
            for label, (lat, want) in zip(("start-up", "steady"), phase_split(res), strict=True):
                print(f"  trial {k + 1} {SIDE_NAMES[side]:32s} {label:8s} "
                      f"{latency_line(lat, want, 'ms')}"
                      + (f" (query: {res['mode']})" if res.get("mode") else ""))
    return runs


def realtime(bench: Bench, rate: float, seconds: float, startup: float, batch: float
             ) -> dict[str, Any]:
    print(f"\n3b. a user's real-time query ({batch:g} s batches)")
    answer = bench.app.call("foreach_batch_realtime", bootstrap=bench.broker.bootstrap,
                            topic=bench.topic())["answer"]
    print(f"  foreachBatch (the shared query's sink) in real-time mode: {answer}")
    # one partition, as the gateway's real-time side: a real-time task holds a slot per
    # partition, and the user's application has two (of three partitions, a third of the
    # records were never read)
    topic = bench.topic(1)
    out_topic = f"{topic}-out"
    bench.broker.create_topic(out_topic, 1)
    rtm = bench.app.call("realtime", wait=seconds + 300, bootstrap=bench.broker.bootstrap,
                         topic=topic, out_topic=out_topic, rate=rate, seconds=seconds,
                         startup=startup, batch=batch)
    for label, (lat, want) in zip(("start-up", "steady"), phase_split(rtm), strict=True):
        print(f"  a user's real-time query -> Kafka, {label}: {latency_line(lat, want, 'ms')}")
    if rtm.get("error"):
        print(f"  (the query: {rtm['error']})")
    return rtm


def ingest_rates(bench: Bench, batches: int, trials: int) -> dict[str, list[float]]:
    print("\n4. records API into Kafka (acknowledged batches of 500), alternating")
    ing: dict[str, list[float]] = {"api": [], "producer": []}
    for order in rotations(("api", "producer"), trials):
        for how in order:
            ing[how].append(bench.ingest(how, batches, 500))
    print(f"  POST /streams/<s>/records {spread(ing['api'])} records/s, a producer directly "
          f"{spread(ing['producer'])} records/s")
    return ing


def summary(results: dict[str, Any]) -> None:
    tp, lat = results.get("tp"), results.get("lat")
    print("\nsummary (median of the trials, lowest-highest)")
    if tp and tuple(tp["sides"]) == SIDES:
        backlog_summary(tp, SIDES, "from the first record produced to the last row read")
    if tp:
        sides = tp["sides"]
        med = {s: statistics.median(t["rate"] for t in tp["runs"][s]) for s in sides}
        if tuple(sides) != SIDES:
            print("  throughput, rows/s from the first record produced to the last row read")
            for s in sides:
                print(f"    {SIDE_NAMES[s]:32s} {spread([t['rate'] for t in tp['runs'][s]])}")
        if "gateway-topics" in med:
            print("    " + "; ".join(f"gateway-topics / {SIDE_NAMES[s]}: "
                                     f"{ratio(med['gateway-topics'], med[s])}"
                                     for s in ("user", "gateway-settings") if s in med))
    if lat:
        print("  p95 latency produce -> reader, every passing record (never arrived = infinite)")
        p95: dict[str, dict[str, list[float]]] = {}
        for s in SIDES:
            p95[s] = {"start-up": [], "steady": []}
            for res in lat[s]:
                for label, (lats, want) in zip(
                    ("start-up", "steady"), phase_split(res), strict=True
                ):
                    p95[s][label].append(pct(with_missing(lats, want), 95) * 1000)
            print(f"    {SIDE_NAMES[s]:32s} start-up {spread(p95[s]['start-up'], '{:,.0f}')} ms,"
                  f" steady {spread(p95[s]['steady'], '{:,.0f}')} ms")
        for label in ("start-up", "steady"):
            u, d = (statistics.median(p95[s][label]) for s in ("user", "gateway-settings"))
            for g in (g for g in GATEWAYS if g in SIDES):
                m = statistics.median(p95[g][label])
                print(f"    {label}: {g} / user {ratio(m, u)}, {g} / gateway-settings "
                      f"{ratio(m, d)}")
    rtm_gw = results.get("rtm_gw")
    if rtm_gw:
        print("  plan topics + edge, same topic: p50 / p95 produce -> reader (never arrived = "
              "infinite)")
        for s in REALTIME_SIDES:
            for k, label in enumerate(("start-up", "steady")):
                p50 = [pct(with_missing(*phase_split(r)[k]), 50) * 1000 for r in rtm_gw[s]]
                p95 = [pct(with_missing(*phase_split(r)[k]), 95) * 1000 for r in rtm_gw[s]]
                print(f"    {SIDE_NAMES[s]:32s} {label:8s} p50 {spread(p50, '{:,.1f}')} ms, "
                      f"p95 {spread(p95, '{:,.1f}')} ms")
    rtm = results.get("rtm")
    if rtm:
        parts = [f"{label} p95 {secs(pct(with_missing(lats, w), 95), 'ms')}"
                 for label, (lats, w) in zip(("start-up", "steady"), phase_split(rtm), strict=True)]
        print(f"  a user's real-time query: {', '.join(parts)}")
    ing = results.get("ingest")
    if ing:
        a, p = statistics.median(ing["api"]), statistics.median(ing["producer"])
        print(f"  records acknowledged/s: API {a:,.0f}, producer {p:,.0f}, ratio {ratio(a, p)}")


if __name__ == "__main__":
    main()
