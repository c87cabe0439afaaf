"""Many handles, each with its own query, each read over HTTP by reader processes; records
ingested through the API at a steady rate. Ingest-to-reader latency from the first tuple on,
start-up apart from steady state, and where it goes.

Run: .venv/bin/python tests/bench/bench_many_readers.py [--quick] [--handles 1000,5000]
         [--trials 3] [--rate 200] [--seconds 45] [--startup 15] [--pass-rate 0.1]
         [--reader-procs 4] [--runtime spark|fake] [--streams 1] [--trigger 0.25]

Each trial of each size is a fresh start: a process of its own starts Spark (with the gateway's
warm-up) and one real gateway as `xsg serve` runs it (pep.services + pep.http.app + the Spark
StreamRuntime on server.serving), then:
  * N subjects each open one handle on stream `lat<N>` with a query of its own (a band
    `v >= a AND v < a + w`, a different `a` each, `w` = 1000 x `--pass-rate`: every tuple
    passes about that share of the handles);
  * the handles are read (NDJSON) by `--reader-procs` processes (tests/bench/harness.py's
    reader: a selector over raw sockets, a row's `sent` and `seq` read out of its bytes);
  * once every reader is connected, an ingest process POSTs `--rate` records/s to
    /streams/<s>/records (20 per call, every 0.1 s at 200/s), each stamped with its send time,
    for `--seconds`; a row's latency is its arrival at a reader minus that stamp. Nothing is
    left out: the first `--startup` seconds after the first tuple are the start-up figure, the
    rest the steady state. Every row a handle should get (its band, computed from the tuples
    sent) and did not get within 3 s of the ingest's end counts as infinitely late;
  * the split: the gateway notes when each put reached a handle's buffer (the seq range of
    its rows: constant work per put, not per row), so ingest->buffer is the runtime's part
    (the ingest call, the wait for the next trigger, the micro-batch: plan table, Spark job,
    routing) and buffer->reader is delivery's; the runtime's own per-batch timings (its DEBUG
    line) are summarised too.
Then revocation at that size: with every reader still connected, the owner deletes the one
policy behind all the handles; reported are the DELETE call's duration (handles are revoked
before it returns) and when each reader's `revoked` event arrived, counted from the call's start
(a reader that never gets it counts as infinitely late).
The trials rotate the sizes' order; the summary gives each size's median and range.
`--streams K` spreads the handles over K streams (handle i on stream i mod K), each with its own
policy and its own ingest process at `--rate`: the rows delivered stay the same while Spark runs
K queries, each with its own micro-batches (what many busy streams cost one gateway); the
revocation then deletes the K policies one after the other.
`--runtime fake` measures delivery alone: no Spark and no ingest calls; a stand-in runtime in
the gateway process makes the tuples and pushes each handle's rows as a RowBatch every trigger.
Everything started is stopped, even on error; every wait is bounded.
"""
from __future__ import annotations

import bisect
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.harness import (
    bench_parser,
    load_average,
    machine,
    pct,
    reply,
    rotations,
    rss_mib,
    run_child,
    run_command,
    secs,
    sleep_until,
    spark_cpu_seconds,
    spread,
    with_missing,
)
from tests.bench.readers import ReadJob, reader_result, start_reader, write_start
from tests.bench.served import Gateway

ADMIN = "tok-many-admin-0123456789"
TRIGGER = 0.25
SAMPLE = 7  # readers note the arrival of rows with seq % SAMPLE == 0, for the split
GRACE = 3.0  # seconds after the ingest's end before the readers' figures are taken
PER_CALL = 20
S = "http://www.w3.org/2001/XMLSchema#string"
SCHEMA = [{"name": "ts", "type": "timestamp"}, {"name": "seq", "type": "long"},
          {"name": "sent", "type": "double"}, {"name": "v", "type": "double"},
          {"name": "pad", "type": "string"}]
POLICY = """<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
  PolicyId="urn:bench:many:STREAM" Version="1"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
  <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
    <AttributeValue DataType="S">STREAM</AttributeValue>
    <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
      AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" DataType="S"
      MustBePresent="false"/></Match></AllOf></AnyOf></Target>
  <Rule RuleId="all" Effect="Permit"><ObligationExpressions>
    <ObligationExpression ObligationId="exacml:obligation:stream-filter" FulfillOn="Permit">
      <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-filter-condition-id">
        <AttributeValue DataType="S">v &gt; -1</AttributeValue>
      </AttributeAssignmentExpression></ObligationExpression>
  </ObligationExpressions></Rule></Policy>""".replace('DataType="S"', f'DataType="{S}"')


def policy(stream: str) -> bytes:
    return POLICY.replace("STREAM", stream).encode()


def request_for(stream: str) -> str:
    return json.dumps({"Request": {"Resource": {"Attribute": [{
        "AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id", "Value": stream}]}}})


def token(i: int) -> str:
    return f"tok-many-{i:05d}-0123456789"


def value(seq: int) -> float:
    """Tuple `seq`'s v: spread over [0, 1000) so that a band of width w passes w/1000 of them."""
    return (seq * 7.31) % 1000.0


# -- ingest process --------------------------------------------------------------------------------

def ingest_main(url: str, stream: str, rate: int, seconds: float, first_seq: int,
                start_at: float) -> None:
    """From `start_at`, POST `rate` records/s for `seconds` s (PER_CALL per call), each stamped
    with its send time; answers each call's first seq and time (the rows the handles are owed)."""
    period = PER_CALL / rate
    seq = first_seq
    calls = late = 0
    durations: list[float] = []  # each call's, sent to answered: part of every row's latency
    puts: list[tuple[int, int, float]] = []
    with requests.Session() as s:
        sleep_until(start_at)
        start = time.monotonic()
        next_at = start
        while time.monotonic() - start < seconds:
            now = time.time()
            body = "".join(json.dumps({
                "ts": now, "seq": seq + k, "sent": now, "v": value(seq + k),
                "pad": "p" * 40}) + "\n" for k in range(PER_CALL))
            puts.append((seq, PER_CALL, now))
            seq += PER_CALL
            t_call = time.perf_counter()
            r = s.post(f"{url}/streams/{stream}/records", data=body.encode(), timeout=30,
                       headers={"Authorization": f"Bearer {ADMIN}",
                                "Content-Type": "application/x-ndjson"})
            durations.append(time.perf_counter() - t_call)
            if r.status_code != 201:
                print(f"ingest: {r.status_code} {r.text[:200]}", file=sys.stderr)
            calls += 1
            next_at += period
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                late += 1
    reply({"calls": calls, "late": late, "last_seq": seq, "puts": puts,
           "call_p50": pct(durations, 50), "call_p95": pct(durations, 95)})


# -- the gateway's side ----------------------------------------------------------------------------

class BatchLog(logging.Handler):
    """The runtime's per-batch timings (its DEBUG line), with the time each batch ended."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.batches: list[tuple[float, float, float, float]] = []
        self.logger = logging.getLogger("pep.runtime.query.runner")

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("batch %s: table"):
            self.batches.append((record.created, *record.args[1:4]))

    def __enter__(self) -> BatchLog:
        self.logger.addHandler(self)
        self.logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self)


class FakeRuntime:
    """`--runtime fake`: delivery alone. Stands in for Spark in the gateway process: every
    trigger it makes `rate * trigger` tuples (stamped as sent evenly over the last interval),
    finds each handle's rows by its plan's filter (numpy), and pushes them as one RowBatch of
    texts encoded once per tuple. Latency is then the trigger's wait plus delivery."""

    def __init__(self, rate: int) -> None:
        import numpy as np

        self.np = np
        self.rate = rate
        self.lock = threading.Lock()
        self.handles: dict[str, tuple] = {}
        self.stop_event = threading.Event()
        self.seq = 0
        self.made: list[tuple[int, int, float]] = []  # (seq, 1, sent) of every tuple made
        self.running = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="fake-runtime")
        self.thread.start()

    def attach_handle(self, handle_id, stream, plan, deliver) -> None:
        np = self.np
        lo, hi = -np.inf, np.inf
        for conjunct in plan.filter_dnf or ((),):
            for p in conjunct:  # the bands: v > -1 AND v >= a AND v < a + 100
                v = float(p.value)
                if p.op in (">", ">="):
                    lo = max(lo, v)
                elif p.op in ("<", "<="):
                    hi = min(hi, v)
        with self.lock:
            self.handles[handle_id] = (lo, hi, deliver)

    def detach(self, handle_id) -> None:
        with self.lock:
            self.handles.pop(handle_id, None)

    def stats(self) -> dict:
        return {}

    def health(self) -> dict:  # the rest of `pep.ports.StreamRuntimePort`
        return {}

    def redefine(self, stream) -> bool:
        return False

    def drop_stream(self, name: str) -> bool:
        return False

    def _run(self) -> None:
        np = self.np
        log = logging.getLogger("pep.runtime.query.runner")
        batch_id = 0
        while not self.stop_event.wait(TRIGGER):
            if not self.running.is_set():
                continue
            from pep.core.rows import RowBatch

            t0 = time.perf_counter()
            now = time.time()
            n = max(1, int(self.rate * TRIGGER))
            seqs = np.arange(self.seq, self.seq + n)
            self.seq += n
            values = (seqs * 7.31) % 1000.0
            sent = now - TRIGGER + (np.arange(n) + 1) * (TRIGGER / n)
            texts = np.array([json.dumps({"ts": round(t, 6), "seq": int(q), "sent": round(t, 6),
                                          "v": round(float(v), 6), "pad": "p" * 40},
                                         separators=(",", ":"))
                              for q, t, v in zip(seqs, sent, values, strict=True)], dtype=object)
            self.made.extend(
                (int(q), 1, round(float(t), 6)) for q, t in zip(seqs, sent, strict=True)
            )
            t1 = time.perf_counter()
            with self.lock:
                handles = list(self.handles.values())
            for lo, hi, deliver in handles:
                mask = (values > lo) & (values < hi) if lo == -1 else \
                    (values >= lo) & (values < hi)
                picked = texts[mask]
                if len(picked):
                    deliver(RowBatch.of_texts(picked.tolist()))
            log.debug("batch %s: table %.3f eval %.3f route %.3f", batch_id, 0.0, t1 - t0,
                      time.perf_counter() - t1)
            batch_id += 1

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(10)


def put_at(put_times: dict, key: int | None, seq: int) -> float | None:
    """When the row `seq` was put into the buffer `key` (see `stamp_puts`), or None."""
    ranges = put_times.get(("ranges", key))
    if not ranges:
        return None
    i = bisect.bisect_right(ranges, (seq, float("inf"), float("inf"))) - 1
    if i >= 0 and ranges[i][0] <= seq <= ranges[i][1]:
        return ranges[i][2]
    return None


def stamp_puts(put_times: dict):
    """Record when rows are in their handle's buffer (this process: the gateway's): per put,
    its rows' first and last `seq` and the time, under ("ranges", buffer id); `put_at` finds a
    row's. Constant work per put: parsing every row's seq here (150,000 rows per micro-batch at
    1,000 handles) cost the gateway's batch thread ~0.15 s per batch and distorted the split.
    Returns the original `put`, to put back."""
    from pep.core.rows import RowBatch
    from pep.handles.buffer import HandleBuffer

    original = HandleBuffer.put
    put_times.setdefault("put_seconds", 0.0)
    put_times.setdefault("puts", 0)

    def seq_of(row) -> int:
        if isinstance(row, str):
            at = row.find('"seq":')
            return int(row[at + 6:row.find(",", at)]) if at >= 0 else -1
        seq = row.get("seq", -1)
        return -1 if seq is None else int(seq)

    def put(self, rows):
        c = time.perf_counter()
        ok = original(self, rows)
        t = time.time()
        put_times["put_seconds"] += time.perf_counter() - c
        put_times["puts"] += len(rows)
        texts = rows.rows if isinstance(rows, RowBatch) else list(rows)
        if texts:  # a batch's rows come in stream order: seq ascending
            put_times.setdefault(("ranges", id(self)), []).append(
                (seq_of(texts[0]), seq_of(texts[-1]), t))
        return ok
    HandleBuffer.put = put
    return original


def band(i: int, n: int, pass_rate: float) -> tuple[float, float]:
    """Handle i's query `v >= a AND v < a + width`: the values are spread evenly over
    [0, 1000), so each tuple passes about `pass_rate` of the handles."""
    width = 1000.0 * pass_rate
    a = (i * (1000.0 - width) / n) + (i % 7) * 0.001
    return a, a + width


def bounds(i: int, n: int, pass_rate: float) -> tuple[float, float]:
    """Handle i's band as its query states it (three decimals) and the gateway compares it."""
    a, b = band(i, n, pass_rate)
    return float(f"{a:.3f}"), float(f"{b:.3f}")


def open_handles(gw: Gateway, n: int, streams: list[str], pass_rate: float) -> list[str]:
    """N handles, each with a query of its own: v in [a, a + width), a different for each;
    handle i on `streams[i % len(streams)]`."""
    ids: list[str | None] = [None] * n

    def work(lo: int, hi: int) -> None:
        with requests.Session() as s:
            for i in range(lo, hi):
                a, b = band(i, n, pass_rate)
                query = json.dumps({"filter": f"v >= {a:.3f} AND v < {b:.3f}"})
                r = s.post(f"{gw.url}/requests", timeout=120,
                           headers={"Authorization": f"Bearer {token(i)}"},
                           files={"request": ("r.json", request_for(streams[i % len(streams)]),
                                              "application/xacml+json"),
                                  "query": ("q.json", query, "application/json")})
                if r.status_code not in (200, 201):
                    raise RuntimeError(f"handle {i}: {r.status_code} {r.text[:300]}")
                ids[i] = r.json()["id"]

    parts = 8
    threads = [threading.Thread(target=work, args=(k * n // parts, (k + 1) * n // parts))
               for k in range(parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    if any(x is None for x in ids):
        raise RuntimeError("not every handle opened")
    return ids  # type: ignore[return-value]


def owed(puts: list[tuple[int, int, float]], bands: list[tuple[float, float]],
         phases: list[tuple[float, float]]) -> list[int]:
    """Rows the handles with `bands` are owed per phase (by send time) for the tuples `puts`
    (first seq, count, sent): a tuple with v passes the handles with a <= v < b."""
    lows = sorted(a for a, _ in bands)
    highs = sorted(b for _, b in bands)
    out = [0] * len(phases)
    for first, count, sent in puts:
        k = next((i for i, (lo, hi) in enumerate(phases) if lo <= sent < hi), None)
        if k is None:
            continue
        for seq in range(first, first + count):
            v = value(seq)
            out[k] += bisect.bisect_right(lows, v) - bisect.bisect_right(highs, v)
    return out


def run_trial(n: int, rate: int, seconds: float, startup: float, procs: int, pass_rate: float,
              stream_count: int, runtime_kind: str, conf: dict[str, str], tmp: Path
              ) -> dict[str, Any]:
    """One fresh start at size `n` in this process: Spark and the gateway, the handles, the
    readers, the ingest from the first tuple on, then the revocation. Returns its figures."""
    from pep.handles.buffer import HandleBuffer

    t_start = time.time()
    if runtime_kind == "spark":
        from pep.runtime.runtime import StreamRuntime
        from pep.runtime.session import create_spark_session
        spark = create_spark_session(extra_conf=conf)
        runtime: Any = StreamRuntime(spark, tmp / "gw" / "runtime", trigger_interval=TRIGGER)
    else:
        spark, runtime = None, FakeRuntime(rate)
    gw = Gateway(runtime, tmp / "gw",
                 [{"token": ADMIN, "subject": "nea", "roles": ["data-owner"], "admin": True}]
                 + [{"token": token(i), "subject": f"c{i:05d}", "roles": ["consumer"],
                     "admin": False} for i in range(n)],
                 max_connections=n + 1000, trigger_interval=TRIGGER)
    started = time.time() - t_start
    streams = [f"lat{n}"] if stream_count == 1 else [f"lat{n}s{j}" for j in range(stream_count)]
    readers: list[tuple[subprocess.Popen[bytes], ReadJob]] = []
    ingests: list[subprocess.Popen[str]] = []
    put_times: dict = {}
    original_put = None
    try:
        for stream in streams:
            r = requests.post(f"{gw.url}/streams", timeout=30, headers={
                "Authorization": f"Bearer {ADMIN}"}, json={
                "name": stream, "time_attribute": "ts", "source": {"kind": "ingest"},
                "schema": SCHEMA})
            assert r.status_code == 201, r.text
            r = requests.post(f"{gw.url}/policies", data=policy(stream), timeout=30, headers={
                "Authorization": f"Bearer {ADMIN}", "Content-Type": "application/xacml+xml"})
            assert r.status_code == 201, r.text
        original_put = stamp_puts(put_times)  # before the handles attach their buffers' put
        t0 = time.perf_counter()
        ids = open_handles(gw, n, streams, pass_rate)
        opened = time.perf_counter() - t0
        start_file = str(tmp / "start")
        phases = [(0.0, startup), (startup, seconds)]
        for k in range(procs):
            job = ReadJob("127.0.0.1", gw.port,
                          [(i, f"/handles/{ids[i]}", token(i)) for i in range(k, n, procs)],
                          str(tmp / f"reader-{k}.out"), ready=str(tmp / f"reader-{k}.ready"),
                          seconds=seconds + 900, phases=phases, sample=SAMPLE,
                          start_file=start_file)
            readers.append((start_reader(job), job))
        deadline = time.monotonic() + 120
        while (not all(Path(job.ready).exists() for _, job in readers)  # type: ignore[arg-type]
               and time.monotonic() < deadline):
            time.sleep(0.1)
        connected = gw.server.stream_count
        start_at = time.time() + 1.0  # the first tuple
        write_start(readers[0][1], start_at)
        absolute = [(start_at + lo, start_at + hi) for lo, hi in phases]
        fake = isinstance(runtime, FakeRuntime)
        if not fake:
            ingests = [subprocess.Popen([sys.executable, __file__, "--ingest", gw.url, stream,
                                         str(rate), str(seconds), "0", repr(start_at)],
                                        stdout=subprocess.PIPE, text=True)
                       for stream in streams]
        with BatchLog() as batches:
            sleep_until(start_at)
            c0, w0 = time.process_time(), time.time()
            s0 = spark_cpu_seconds()
            p0, n0 = put_times["put_seconds"], put_times["puts"]
            if fake:
                runtime.running.set()
                sleep_until(start_at + seconds)
                runtime.running.clear()
                outs = [{"calls": 0, "late": 0, "last_seq": runtime.seq, "puts": runtime.made}]
            else:
                outs = []
                for p in ingests:
                    text = p.communicate(timeout=seconds + 120)[0]
                    got = [ln for ln in text.splitlines() if ln.startswith("@@")]
                    outs.append(json.loads(got[-1][2:]))
            put_share = (put_times["put_seconds"] - p0, put_times["puts"] - n0)
            gateway_cpu = (time.process_time() - c0) / (time.time() - w0)
            s1 = spark_cpu_seconds()
            spark_cpu = tuple((b - a) / (time.time() - w0) for a, b in zip(s0, s1, strict=True))
            memory = rss_mib()
            time.sleep(GRACE)  # the last rows reach their readers; later ones count as never
        # which buffer is whose, while they are live (revocation drops them)
        buffers = dict(gw.services.handles._buffers)
        key_of = {i: id(buffers[hid]) for i, hid in enumerate(ids) if hid in buffers}
        # Revocation: the owner deletes the one policy behind every handle while all readers
        # are connected; each reader notes when its `revoked` event arrives, and a reader
        # process ends when all of its streams have ended.
        t_revoke = time.time()
        for stream in streams:  # one after the other
            r = requests.delete(f"{gw.url}/policies/urn:bench:many:{stream}", timeout=300,
                                headers={"Authorization": f"Bearer {ADMIN}"})
            assert r.status_code in (200, 204), r.text
        revoke_call = time.time() - t_revoke
        results = [reader_result(proc, job, 120) for proc, job in readers]
    finally:
        for p in ingests:
            if p.poll() is None:
                p.kill()
                p.wait()
        for proc, job in readers:
            if proc.poll() is None:
                reader_result(proc, job, 30, stop=True)
        if original_put is not None:
            HandleBuffer.put = original_put  # type: ignore[method-assign]
        gw.close()
        if spark is not None:
            spark.stop()
    lat: list[list[float]] = [[], []]
    revoked: list[float] = []
    samples: list = []
    rows = gaps = after_revoked = 0
    errors: list[str] = []
    for res in results:
        for k in range(2):
            lat[k] += res["lat"][k]
        samples += res["samples"]
        rows += res["rows"]
        gaps += res["gaps"]
        after_revoked += res["after_final"]
        errors += res["errors"]
        revoked += [t - t_revoke for t in res["revoked"]]
    delivery = []
    for index, seq, arrived in samples:
        put = put_at(put_times, key_of.get(index), seq)
        if put is not None:
            delivery.append(arrived - put)
    want = [0, 0]
    for j in range(len(streams)):
        bands = [bounds(i, n, pass_rate) for i in range(j, n, len(streams))]
        for k, count in enumerate(owed(outs[j]["puts"], bands, absolute)):
            want[k] += count
    for k in range(2):
        if len(lat[k]) > want[k]:
            errors.append(f"phase {k}: {len(lat[k]):,} rows arrived, {want[k]:,} owed")
    in_window = [b for b in batches.batches if absolute[0][0] <= b[0] <= absolute[1][1] + 1]
    ingested = {"calls": sum(o["calls"] for o in outs), "late": sum(o["late"] for o in outs)}
    if len(outs) == 1 and "call_p50" in outs[0]:
        ingested.update(call_p50=outs[0]["call_p50"], call_p95=outs[0]["call_p95"])
    figures = {
        "n": n, "streams": len(streams), "pass_rate": pass_rate, "seconds": seconds,
        "startup": startup, "started_s": started, "opened_s": opened, "connected": connected,
        "procs": procs, "phases": [phase_figures(lat[k], want[k]) for k in range(2)],
        "rows_per_s": sum(len(x) for x in lat) / seconds, "rows": rows, "gaps": gaps,
        "delivery": [pct(delivery, p) for p in (50, 95, 99)], "delivery_n": len(delivery),
        "batches": len(in_window), "ingest": ingested, "gateway_cpu": gateway_cpu,
        "spark_cpu": spark_cpu, "memory": memory, "put": put_share,
        "revoke_call": revoke_call, "revoked": phase_figures(revoked, n),
        "after_revoked": after_revoked, "errors": errors[:5]}
    if in_window:
        total = [x[1] + x[2] + x[3] for x in in_window]
        figures["batch"] = {"p50": pct(total, 50), "p95": pct(total, 95),
                            "table": pct([x[1] for x in in_window], 50),
                            "job": pct([x[2] for x in in_window], 50),
                            "route": pct([x[3] for x in in_window], 50)}
    return figures


def phase_figures(lat: list[float], want: int) -> dict[str, Any]:
    """Percentiles over every row owed, those that never arrived infinitely late."""
    full = with_missing(lat, want)
    return {"owed": want, "arrived": len(lat), "p50": pct(full, 50), "p95": pct(full, 95),
            "p99": pct(full, 99), "max": max(full) if full else float("nan")}


def report(r: dict[str, Any], rate: int) -> None:
    print(f"\n{r['n']:,} handles (distinct queries, each ~{r['pass_rate']:.0%} of the tuples), "
          + (f"over {r['streams']} streams, {rate} tuples/s each " if r["streams"] > 1
             else f"{rate} tuples/s ")
          + f"ingested for {r['seconds']:.0f} s; gateway and Spark started in "
          f"{r['started_s']:.1f} s; handles opened in {r['opened_s']:.1f} s; "
          f"{r['connected']:,} readers connected from {r['procs']} reader processes")
    for label, ph in zip((f"start-up (first {r['startup']:.0f} s)",
                          f"steady (after {r['startup']:.0f} s)"), r["phases"], strict=True):
        print(f"  ingest -> reader, {label}: p50 {secs(ph['p50'])}, p95 {secs(ph['p95'])}, "
              f"p99 {secs(ph['p99'])}, max {secs(ph['max'])} over {ph['owed']:,} rows owed "
              f"({ph['owed'] - ph['arrived']:,} never arrived)")
    print(f"  {r['rows_per_s']:,.0f} rows/s to readers; gaps {r['gaps']}; ingest calls late "
          f"{r['ingest']['late']} of {r['ingest']['calls']}")
    if "call_p50" in r["ingest"]:
        print(f"  of which the ingest call (POST /streams/<name>/records, {PER_CALL} records, sent "
              f"-> answered): p50 {secs(r['ingest']['call_p50'], 'ms')}, p95 "
              f"{secs(r['ingest']['call_p95'], 'ms')}")
    if r["delivery_n"]:
        d = r["delivery"]
        print(f"  of which delivery (in the handle's buffer -> at the reader, sampled "
              f"{r['delivery_n']:,} rows): p50 {secs(d[0], 'ms')}, p95 {secs(d[1], 'ms')}, "
              f"p99 {secs(d[2], 'ms')}")
    b = r.get("batch")
    if b:
        print(f"  runtime micro-batches in the run: {r['batches']}, each p50 {b['p50']:.3f} s p95 "
              f"{b['p95']:.3f} s (plan table p50 {b['table']:.3f}, Spark job + toArrow p50 "
              f"{b['job']:.3f}, routing + delivery into buffers p50 {b['route']:.3f}); trigger "
              f"every {TRIGGER} s")
    if r["put"][1]:
        print(f"  in HandleBuffer.put: {r['put'][0] / r['put'][1] * 1e6:.1f} us per row, "
              f"{r['put'][0]:.2f} s for {r['put'][1]:,} rows")
    print(f"  gateway process CPU: {r['gateway_cpu']:.2f} cores on average; resident memory at "
          f"the end of ingest: gateway (Python) {r['memory'][0]:.0f} MiB, Spark's JVM "
          f"{r['memory'][1]:.0f} MiB; Spark's CPU: JVM {r['spark_cpu'][0]:.2f} cores, its Python "
          f"workers {r['spark_cpu'][1]:.2f} cores")
    rv = r["revoked"]
    deletes, calls = (("the policy behind all", "DELETE") if r["streams"] == 1 else
                      (f"the {r['streams']} policies, one after the other, behind all", "DELETEs"))
    print(f"  revocation (the owner deletes {deletes} {r['n']:,} handles): the {calls} returned "
          f"in {r['revoke_call'] * 1000:.0f} ms; `revoked` reached {rv['arrived']:,} of "
          f"{rv['owed']:,} readers: p50 {secs(rv['p50'], 'ms')}, p99 {secs(rv['p99'], 'ms')}, "
          f"max {secs(rv['max'], 'ms')} after the call began; rows after `revoked`: "
          f"{r['after_revoked']}")
    if r["errors"]:
        print("  errors:", r["errors"][:3])


def summary(results: dict[int, list[dict[str, Any]]]) -> None:
    print("\nsummary: median of the trials (lowest-highest); every row owed counted, those that "
          "never arrived infinitely late")
    print("  handles  p95 start-up (s)      p95 steady (s)        revocation p99 (ms)   "
          "rows/s to readers")
    for n, runs in results.items():
        up = [r["phases"][0]["p95"] for r in runs]
        steady = [r["phases"][1]["p95"] for r in runs]
        rev = [r["revoked"]["p99"] * 1000 for r in runs]
        print(f"  {n:>7,}  {spread(up, '{:.2f}'):20s}  {spread(steady, '{:.2f}'):20s}  "
              f"{spread(rev, '{:,.0f}'):20s}  {spread([r['rows_per_s'] for r in runs])}")


def trial_main(a: dict[str, Any]) -> None:
    """One trial (a fresh gateway) in this process: its report, and its figures to the parent."""
    global TRIGGER
    TRIGGER = a.pop("trigger")
    from common.logs import configure_logging
    configure_logging("WARNING").setLevel("WARNING")  # the gateway's log, as in bench_parser
    with tempfile.TemporaryDirectory(prefix="xsg-bench-many-") as tmp:
        figures = run_trial(**a, tmp=Path(tmp))
    report(figures, a["rate"])
    reply(figures)


def main() -> None:
    if run_command({"--ingest": (ingest_main, (str, str, int, float, int, float)),
                    "--trial": (trial_main, (json.loads,))}):
        return
    ap = bench_parser("one trial of 20 s (10 s start-up), a smoke run",
                      "fresh starts per size, the sizes' order rotating")
    ap.add_argument("--handles", default="1000", help="sizes, comma-separated (e.g. 1000,5000)")
    ap.add_argument("--rate", type=int, default=200, help="tuples ingested per second")
    ap.add_argument("--seconds", type=float, default=45.0,
                    help="seconds of ingest per trial, from the first tuple")
    ap.add_argument("--startup", type=float, default=15.0,
                    help="the first seconds, reported as start-up (the rest: steady state)")
    ap.add_argument("--reader-procs", type=int, default=4)
    ap.add_argument("--pass-rate", type=float, default=0.1,
                    help="share of the handles each tuple passes (0.5: the issue's workload)")
    ap.add_argument("--runtime", choices=("spark", "fake"), default="spark",
                    help="fake: delivery alone, rows made in the gateway process (no Spark)")
    ap.add_argument("--streams", type=int, default=1,
                    help="the handles spread over this many streams, each ingesting --rate "
                         "tuples/s: the rows delivered stay the same, Spark runs a query each")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting for the gateway's session (repeatable), over the "
                         "gateway's own (pep.runtime.session.DEFAULT_CONF)")
    ap.add_argument("--trigger", type=float, default=TRIGGER,
                    help="seconds between the stream query's micro-batches (the gateway's "
                         "trigger_interval, default %(default)s)")
    args = ap.parse_args()
    if args.streams < 1 or args.trigger <= 0:
        ap.error("--streams wants 1 or more, --trigger more than 0 seconds")
    if args.quick:
        args.trials, args.seconds, args.startup = 1, 20.0, 10.0
    if not 0 < args.startup < args.seconds:
        ap.error("--startup wants more than 0 and less than --seconds")
    conf: dict[str, str] = {}
    for item in args.conf:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            ap.error(f"--conf wants KEY=VALUE, got {item!r}")
        conf[key.strip()] = val.strip()
    sizes = [int(x) for x in args.handles.split(",")]
    print("machine:", machine(), "; runtime:", args.runtime)
    if conf:
        print("Spark settings over the gateway's:", ", ".join(f"{k}={v}" for k, v in conf.items()))
    results: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    for k, order in enumerate(rotations(sizes, args.trials)):
        for n in order:
            print(f"\n== trial {k + 1}, {n:,} handles: a fresh gateway process")
            trial = {"n": n, "rate": args.rate, "seconds": args.seconds, "startup": args.startup,
                     "procs": args.reader_procs, "pass_rate": args.pass_rate,
                     "stream_count": args.streams, "runtime_kind": args.runtime, "conf": conf,
                     "trigger": args.trigger}
            results[n].append(run_child(__file__, ["--trial", json.dumps(trial)],
                                        timeout=args.seconds + 1800, echo=True))
    summary(results)
    print("load average at the end:", load_average())


if __name__ == "__main__":
    main()
