"""Benchmark of a Kafka stream through the gateway against a direct Structured Streaming query on
the same kind of topic, and what Spark's real-time mode gives.

Run: .venv/bin/python tests/bench/bench_kafka.py [--quick]     (needs `make install`'s jars)

A single-node Kafka broker (KRaft, tests/kafka/broker.py), one SparkSession, one real gateway
(pep.services + pep.http.app + StreamRuntime on server.serving.HttpServer, uvicorn, loopback). Topics of
3 partitions; records carry `sent` (epoch seconds when produced). Every gateway figure is read
over HTTP by a consumer process of its own (NDJSON), as bench_gateway_streams does.
1. throughput at saturation: a backlog of N records produced (confluent-kafka, acks=all, by a
   process of its own) right after the handle opened (or the direct query started), both sides
   at the latest offsets and with maxOffsetsPerTrigger 10,000 (the gateway's default);
   tuples/s from the first produce to the last row read. One untimed run of each first, of
   the trials' size (a fresh JVM's first Kafka batches run several times slower, and the
   gateway's first trial after a shorter warm-up still ran ~15% below its later ones); then
   the trials, alternating.
2. latency from produce to reader: R records/s for S seconds, one at a time (linger.ms 0);
   p50/p95/p99 of (time read - `sent`), for the gateway (reader over HTTP, another process) and
   a direct micro-batch query (foreachBatch in this process, same 0.25 s trigger).
3. real-time mode (Spark 4.1+): the same filter and projection as a direct real-time query
   (`trigger(realTime=...)`) into a Kafka output topic, latency measured by a consumer of that
   topic; and whether the gateway's shared query could run so (its sink is foreachBatch).
4. the gateway's records API into Kafka: records/s acknowledged through `POST
   /streams/<s>/records` against the same batches produced directly.
Only loopback traffic; every loop is bounded; everything started is stopped, even on error.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_gateway_streams import (ADMIN_TOKEN, XML, Gateway, consumer_token,  # noqa: E402
                                               hdr, inline_policy, machine, request_json)

FIELDS = [("ts", "timestamp"), ("station", "string"), ("v", "double"), ("sent", "double")]
COLUMNS = ["ts", "station", "v", "sent"]
CONDITION = "v > -1"  # every record passes: throughput counts every tuple
TRIGGER = 0.25
POLICY_ID = "urn:xsg:bench:kafka"
LATENCY_RUN = 10**9  # a reader asked for this many rows measures latency until its time is up


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))] if s else float("nan")


def record(i: int) -> dict:
    return {"ts": 1_700_000_000 + i * 0.001, "station": "ABC"[i % 3], "v": float(i % 100),
            "sent": time.time()}


class Producer:
    def __init__(self, bootstrap: str, linger_ms: int = 5) -> None:
        from confluent_kafka import Producer as KafkaProducer
        self.p = KafkaProducer({"bootstrap.servers": bootstrap, "acks": "all",
                                "enable.idempotence": True, "linger.ms": linger_ms,
                                "queue.buffering.max.messages": 1_000_000})

    def backlog(self, topic: str, n: int) -> None:
        for i in range(n):
            while True:
                try:
                    self.p.produce(topic, json.dumps(record(i)).encode())
                    break
                except BufferError:
                    self.p.poll(0.05)
            if i % 1000 == 0:
                self.p.poll(0)
        assert self.p.flush(120) == 0

    def steady(self, topic: str, rate: float, seconds: float) -> int:
        """One record at a time, `rate` per second, for `seconds`."""
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            due = start + n / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            self.p.produce(topic, json.dumps(record(n)).encode())
            self.p.poll(0)
            n += 1
        assert self.p.flush(60) == 0
        return n


def produce_backlog(bootstrap: str, topic: str, n: int) -> float:
    """Produce `n` records in a process of their own, as an owner's producer is; the epoch
    second of its first produce (the throughput's start). In the gateway's process the
    producer's json.dumps and produce calls held its GIL for seconds, slowing the gateway's
    batch thread (each py4j call waits for the GIL) more than the direct query's."""
    out = subprocess.run([sys.executable, __file__, "--produce-backlog", bootstrap, topic,
                          str(n)], capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the producer process failed: {out.stderr[-500:]}")
    return float(json.loads(lines[-1])["start"])


def producer_main(bootstrap: str, topic: str, n: int) -> None:
    producer = Producer(bootstrap)
    start = time.time()
    producer.backlog(topic, n)
    print(json.dumps({"start": start, "end": time.time()}))


# -- the reader process ----------------------------------------------------------------------------

def reader_main(url: str, token: str, want: int, seconds: float) -> None:
    """Reads the handle until `want` rows or `seconds`; prints counts, first/last row times
    (epoch) and every row's latency (now - sent)."""
    lat: list[float] = []
    rows, lost, first, last, error = 0, 0, None, None, None
    measure = want >= LATENCY_RUN
    deadline = time.monotonic() + seconds
    try:
        with requests.get(url, headers=hdr(token, Accept="application/x-ndjson"), stream=True,
                          timeout=(10, 30)) as r:
            for raw in r.iter_lines(chunk_size=65536):
                if raw and raw.startswith(b'{"id":') and b',"row":' in raw[:40]:
                    now = time.time()
                    if measure:  # latency runs parse each row; throughput runs only count
                        lat.append(now - json.loads(raw)["row"]["sent"])
                    rows += 1
                    first = first or now
                    last = now
                    if rows + lost >= want:
                        break
                elif raw and b'"event":"gap"' in raw:  # a reader too slow: rows lost
                    lost += json.loads(raw).get("lost") or 0
                    if rows + lost >= want:
                        break
                if time.monotonic() > deadline:
                    break
    except Exception as exc:  # noqa: BLE001 - reported
        error = repr(exc)
    print(json.dumps({"rows": rows, "lost": lost, "first": first, "last": last, "lat": lat,
                      "error": error}))


class ReaderProcess:
    def __init__(self, url: str, token: str, want: int, seconds: float) -> None:
        self.out = tempfile.NamedTemporaryFile(prefix="xsg-bench-reader-", delete=False)
        self.proc = subprocess.Popen([sys.executable, __file__, "--read-handle", url, token,
                                      str(want), str(seconds)], stdout=self.out,
                                     stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        self.seconds = seconds

    def result(self) -> dict:
        try:
            self.proc.wait(self.seconds + 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        text = Path(self.out.name).read_text().strip().splitlines()
        os.unlink(self.out.name)
        return json.loads(text[-1]) if text else {"rows": 0, "lat": [], "error": "no output"}


# -- the direct query ------------------------------------------------------------------------------

class Direct:
    """The same topic, parse, filter and projection in Structured Streaming, foreachBatch
    collecting the rows to the driver as Arrow."""

    def __init__(self, spark, bootstrap: str, topic: str, realtime: bool = False) -> None:
        from pyspark.sql import functions as F

        from pep.core.plan import Field, StreamSchema
        from pep.runtime.sources import KAFKA_MAX_OFFSETS, spark_schema
        schema = spark_schema(StreamSchema(tuple(Field(n, t) for n, t in FIELDS)))
        reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                  .option("subscribe", topic).option("startingOffsets", "latest"))
        if not realtime:  # real-time mode refuses a bound per micro-batch
            reader = reader.option("maxOffsetsPerTrigger", KAFKA_MAX_OFFSETS)
        self.frame = (reader.load()
                      .select(F.from_json(F.col("value").cast("string"), schema).alias("r"))
                      .select("r.*").filter(CONDITION).select(*COLUMNS))
        self.rows, self.first, self.last, self.lat = 0, None, None, []
        self.query = None
        self.checkpoint = tempfile.mkdtemp(prefix="xsg-bench-direct-")

    def _batch(self, df, _id) -> None:
        table = df.toArrow()
        now = time.time()
        if table.num_rows:
            self.rows += table.num_rows
            self.first = self.first or now
            self.last = now
            self.lat.extend(now - s for s in table.column("sent").to_pylist())

    def start(self) -> "Direct":
        from pep.runtime.checkpoints import await_kafka_offsets
        self.query = (self.frame.writeStream.foreachBatch(self._batch)
                      .option("checkpointLocation", self.checkpoint)
                      .trigger(processingTime=f"{int(TRIGGER * 1000)} milliseconds").start())
        await_kafka_offsets(Path(self.checkpoint), 1, self.query)
        return self

    def wait(self, want: int, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.rows < want and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()


# -- phases ----------------------------------------------------------------------------------------

class Bench:
    def __init__(self, spark, gw: Gateway, broker) -> None:
        self.spark, self.gw, self.broker = spark, gw, broker
        self.producer = Producer(broker.bootstrap)
        self.count = 0

    def stream(self, partitions: int = 3) -> tuple[str, str]:
        """A fresh topic and a gateway stream on it, granted to everyone by POLICY_ID."""
        self.count += 1
        name, topic = f"k{self.count}", f"bench-{self.count}-{int(time.time())}"
        self.broker.create_topic(topic, partitions)
        r = requests.post(f"{self.gw.url}/streams", headers=hdr(ADMIN_TOKEN), timeout=30, json={
            "name": name, "time_attribute": "ts",
            "schema": [{"name": n, "type": t} for n, t in FIELDS],
            "source": {"kind": "kafka", "bootstrap.servers": self.broker.bootstrap,
                       "subscribe": topic}})
        assert r.status_code == 201, r.text
        r = requests.post(f"{self.gw.url}/policies", headers=hdr(ADMIN_TOKEN, **XML), timeout=30,
                          data=inline_policy(f"{POLICY_ID}:{name}", [name], CONDITION, COLUMNS))
        assert r.status_code == 201, r.text
        return name, topic

    def open(self, name: str) -> str:
        return self.gw.open(consumer_token(1), request_json(name))["handle"]

    def gateway_throughput(self, n: int) -> dict:
        name, topic = self.stream()
        handle = self.open(name)
        reader = ReaderProcess(handle, consumer_token(1), n, 300)
        time.sleep(1.0)  # the reader process is connected
        start = produce_backlog(self.broker.bootstrap, topic, n)
        got = reader.result()
        self.gw.release(consumer_token(1), handle)
        return {"rows": got["rows"], "rate": got["rows"] / max(1e-3, (got["last"] or start) - start),
                "error": got.get("error") or (f"{got['lost']} rows lost" if got.get("lost")
                                              else None)}

    def direct_throughput(self, n: int) -> dict:
        _, topic = self.stream()
        direct = Direct(self.spark, self.broker.bootstrap, topic).start()
        try:
            start = produce_backlog(self.broker.bootstrap, topic, n)
            direct.wait(n, 300)
        finally:
            direct.stop()
        return {"rows": direct.rows, "rate": direct.rows / max(1e-3, (direct.last or start) - start)}

    def gateway_latency(self, rate: float, seconds: float) -> dict:
        name, topic = self.stream()
        handle = self.open(name)
        reader = ReaderProcess(handle, consumer_token(1), LATENCY_RUN, seconds + 5)
        time.sleep(1.0)
        steady = Producer(self.broker.bootstrap, linger_ms=0)
        sent = steady.steady(topic, rate, seconds)
        got = reader.result()
        self.gw.release(consumer_token(1), handle)
        return {"sent": sent, "rows": got["rows"], "lat": got["lat"]}

    def direct_latency(self, rate: float, seconds: float) -> dict:
        _, topic = self.stream()
        direct = Direct(self.spark, self.broker.bootstrap, topic).start()
        try:
            sent = Producer(self.broker.bootstrap, linger_ms=0).steady(topic, rate, seconds)
            direct.wait(sent, 10)
        finally:
            direct.stop()
        return {"sent": sent, "rows": direct.rows, "lat": direct.lat}

    def realtime_latency(self, rate: float, seconds: float) -> dict:
        """A direct real-time query: Kafka -> parse, filter, project -> Kafka output topic; a
        consumer of the output topic measures the latency."""
        from confluent_kafka import Consumer
        from pyspark.sql import functions as F
        _, topic = self.stream()
        out_topic = f"{topic}-out"
        self.broker.create_topic(out_topic, 1)
        direct = Direct(self.spark, self.broker.bootstrap, topic, realtime=True)
        checkpoint = tempfile.mkdtemp(prefix="xsg-bench-rtm-")
        query = (direct.frame.select(F.to_json(F.struct(*COLUMNS)).alias("value"))
                 .writeStream.format("kafka").outputMode("update")
                 .option("kafka.bootstrap.servers", self.broker.bootstrap)
                 .option("topic", out_topic).option("checkpointLocation", checkpoint)
                 .trigger(realTime="30 seconds").start())
        consumer = Consumer({"bootstrap.servers": self.broker.bootstrap, "group.id": out_topic,
                             "auto.offset.reset": "earliest", "fetch.wait.max.ms": 5})
        consumer.subscribe([out_topic])
        lat: list[float] = []
        stop = threading.Event()

        def consume() -> None:
            while not stop.is_set():
                msg = consumer.poll(0.1)
                if msg is not None and msg.error() is None:
                    lat.append(time.time() - json.loads(msg.value())["sent"])
        t = threading.Thread(target=consume, daemon=True)
        t.start()
        try:
            time.sleep(5.0)  # the real-time query has started its long-running batch
            sent = Producer(self.broker.bootstrap, linger_ms=0).steady(topic, rate, seconds)
            deadline = time.monotonic() + 15
            while len(lat) < sent and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            stop.set()
            t.join(5)
            consumer.close()
            error = query.exception()
            query.stop()
        return {"sent": sent, "rows": len(lat), "lat": lat,
                "error": str(error)[:200] if error else None}

    def foreach_batch_realtime(self) -> str:
        """Whether the shared query's sink (foreachBatch) may run in real-time mode."""
        _, topic = self.stream()
        direct = Direct(self.spark, self.broker.bootstrap, topic, realtime=True)
        try:
            q = (direct.frame.writeStream.foreachBatch(lambda df, i: None)
                 .option("checkpointLocation", tempfile.mkdtemp(prefix="xsg-bench-rtm-"))
                 .trigger(realTime="30 seconds").start())
            q.stop()
            return "accepted"
        except Exception as exc:  # noqa: BLE001 - the answer is the point
            return str(exc).split("SQLSTATE")[0].strip()[:300]

    def ingest_api(self, batches: int, per_batch: int) -> dict:
        """records/s acknowledged through POST /streams/<s>/records vs produced directly."""
        name, topic = self.stream()
        body = ("\n".join(json.dumps(record(i)) for i in range(per_batch)) + "\n").encode()
        start = time.perf_counter()
        for _ in range(batches):
            r = requests.post(f"{self.gw.url}/streams/{name}/records", data=body, timeout=60,
                              headers=hdr(ADMIN_TOKEN, **{"Content-Type": "application/x-ndjson"}))
            assert r.status_code == 201, r.text
        api = batches * per_batch / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(batches):
            self.producer.backlog(topic, per_batch)  # each batch waits for its acks, as the API
        direct = batches * per_batch / (time.perf_counter() - start)
        return {"api": api, "direct": direct}


def latency_line(label: str, res: dict) -> str:
    lat = res["lat"]
    return (f"  {label:40s} {res['rows']:6,}/{res['sent']:<6,} rows  p50 {pct(lat, 50) * 1000:7.1f} ms"
            f"  p95 {pct(lat, 95) * 1000:7.1f} ms  p99 {pct(lat, 99) * 1000:7.1f} ms")


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--read-handle":
        reader_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
        return
    if len(sys.argv) == 5 and sys.argv[1] == "--produce-backlog":
        producer_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    sys.stdout.reconfigure(line_buffering=True)
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--rate", type=float, default=200.0, help="records/s for the latency")
    parser.add_argument("--seconds", type=float, default=20.0, help="latency run length")
    args = parser.parse_args()
    n = 20_000 if args.quick else args.records
    trials = 1 if args.quick else args.trials
    seconds = 8.0 if args.quick else args.seconds
    print("machine:", machine())
    from pep.runtime.session import create_spark_session, kafka_connector_jars
    from tests.kafka.broker import KafkaBroker
    if not kafka_connector_jars():
        sys.exit("no Kafka connector for this pyspark: run `make install`")
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="xsg-bench-kafka-") as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka", heap="1g").start()
        spark = create_spark_session(extra_conf={"spark.driver.memory": "4g"})
        gw = None
        try:
            gw = Gateway(spark, Path(tmp) / "gw", consumers=2)
            bench = Bench(spark, gw, broker)
            print(f"\n1. throughput at saturation: {n:,} records, {trials} trial(s), "
                  "3 partitions")
            warm = n  # the JVM's code for either side is compiled before the trials
            bench.gateway_throughput(warm)
            bench.direct_throughput(warm)
            print(f"  (warmed up: one untimed run of {warm:,} records each)")
            runs: dict[str, list[float]] = {"gateway": [], "direct": []}
            for trial in range(trials):
                order = ("gateway", "direct") if trial % 2 == 0 else ("direct", "gateway")
                for mode in order:
                    res = (bench.gateway_throughput(n) if mode == "gateway"
                           else bench.direct_throughput(n))
                    runs[mode].append(res["rate"])
                    print(f"  trial {trial + 1} {mode:8s}: {res['rows']:,} rows, "
                          f"{res['rate']:,.0f} tuples/s" + (f" ({res['error']})"
                                                            if res.get("error") else ""))
            g, d = statistics.median(runs["gateway"]), statistics.median(runs["direct"])
            results["tp"] = (g, d)
            print(f"  medians: gateway {g:,.0f}, direct {d:,.0f} tuples/s: ratio {g / d:.2f} "
                  "(aim >= 0.9)")
            print(f"\n2. latency, produce -> reader, {args.rate:.0f} records/s for {seconds:.0f} s")
            results["lat_gw"] = bench.gateway_latency(args.rate, seconds)
            print(latency_line("gateway (reader over HTTP, own process)", results["lat_gw"]))
            results["lat_direct"] = bench.direct_latency(args.rate, seconds)
            print(latency_line("direct micro-batch (foreachBatch)", results["lat_direct"]))
            print("\n3. real-time mode")
            results["rtm_foreach_batch"] = bench.foreach_batch_realtime()
            print(f"  foreachBatch (the shared query's sink) in real-time mode: "
                  f"{results['rtm_foreach_batch']}")
            results["lat_rtm"] = bench.realtime_latency(args.rate, seconds)
            print(latency_line("direct real-time query -> Kafka sink", results["lat_rtm"])
                  + (f" ({results['lat_rtm']['error']})" if results["lat_rtm"]["error"] else ""))
            print("\n4. records API into Kafka (acknowledged batches of 500)")
            results["ingest"] = bench.ingest_api(10 if args.quick else 40, 500)
            print(f"  POST /streams/<s>/records {results['ingest']['api']:,.0f} records/s, "
                  f"producer directly {results['ingest']['direct']:,.0f} records/s")
        finally:
            if gw is not None:
                gw.close()
            spark.stop()
            broker.stop()
    g, d = results["tp"]
    lg, ld = pct(results["lat_gw"]["lat"], 95), pct(results["lat_direct"]["lat"], 95)
    print("\nsummary                                   gateway      direct     ratio   aim")
    print(f"  tuples/s at saturation                {g:9,.0f}   {d:9,.0f}    {g / d:6.2f}   >= 0.9")
    print(f"  p95 latency produce -> reader (ms)    {lg * 1000:9.1f}   {ld * 1000:9.1f}    "
          f"{lg / ld:6.2f}")
    print(f"  p95 latency, real-time mode direct (ms)           "
          f"{pct(results['lat_rtm']['lat'], 95) * 1000:9.1f}")
    print("load average at the end: " + " ".join("%.2f" % x for x in os.getloadavg()))


if __name__ == "__main__":
    main()
