"""Many handles, each with its own query, each read over HTTP by reader processes; records
ingested through the API at a steady rate. Ingest-to-reader latency, and where it goes.

Run: .venv/bin/python tests/bench/bench_many_readers.py [--handles 1000,2000] [--rate 200]
                                                        [--seconds 30] [--reader-procs 4]
                                                        [--runtime spark|fake]
                                                        [--streams 1] [--trigger 0.25]

One SparkSession and one real gateway (pep.services + pep.http.app + the Spark StreamRuntime,
on server.serving); per size N:
  * N subjects each open one handle on stream `lat` with a query of its own (a band
    `v >= a AND v < a + w` with a different `a`, `w` = 1000 x `--pass-rate`: every tuple
    matches about that share of them, 10% by default; the issue's workload is 0.5);
  * the handles are read (NDJSON) by `--reader-procs` processes (not threads of the gateway),
    each a selector over raw sockets; a row line's `sent` and `seq` are read out of its bytes
    (events are parsed whole): parsing 100,000 rows/s whole took most of the two cores;
  * an ingest process POSTs `--rate` records/s to /streams/lat/records (20 per call), each
    stamped with its send time; a row's latency is its arrival at a reader minus that stamp;
  * the split: the gateway notes when each put reached a handle's buffer (the seq range of
    its rows: constant work per put, not per row), so ingest->buffer is the runtime's part
    (the ingest call, the wait for the next 0.25 s trigger, the micro-batch: plan table, Spark
    job, routing) and buffer->reader is delivery's (wake-up, the server's I/O thread, the
    socket, the reader); the runtime's own per-batch timings (its DEBUG line) are summarised
    too.
Then revocation at that size: with every reader still connected, the owner deletes the one
policy behind all the handles; reported are the DELETE call's duration (handles are revoked
before it returns) and when each reader's `revoked` event arrived, counted from the call's start.
`--streams K` spreads the handles over K streams (handle i on stream i mod K), each with its own
policy and its own ingest process at `--rate`: the rows delivered stay the same while Spark runs
K queries, each with its own micro-batches (what many busy streams cost one gateway); the
revocation then deletes the K policies one after the other.
`--runtime fake` measures delivery alone: no Spark and no ingest calls; a stand-in runtime in
the gateway process makes the tuples and pushes each handle's rows as a RowBatch every 0.25 s.
Everything started is stopped, even on error; every wait is bounded.
"""
from __future__ import annotations

import argparse
import bisect
import json
import logging
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ADMIN = "tok-many-admin-0123456789"
TRIGGER = 0.25
SAMPLE = 7  # readers match rows with seq % SAMPLE == 0 with their put, for the split
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


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))] if s else float("nan")


# -- reader process -----------------------------------------------------------------------------------

# The two numbers a row line is measured by (the gateway writes compact JSON: no space after
# a colon). Found with one regex scan per received chunk rather than a Python loop per row: at
# 100,000 rows/s a per-row loop made the four reader processes take half a core of the two that
# the gateway they measure runs on.
SENT = re.compile(rb'"sent":(-?[0-9][0-9.eE+-]*)')
SEQ = re.compile(rb'"seq":(-?[0-9]+)')
ROW_LINE = re.compile(rb'^\{"id":[0-9]+,"row":', re.M)


def reader_main(job_path: str) -> None:
    """Read every handle of the job until SIGTERM; write latencies (arrival - sent) and the
    sampled arrivals to the job's output file."""
    job = json.loads(Path(job_path).read_text())
    host, port = job["host"], job["port"]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sel = selectors.DefaultSelector()
    state = {}
    for index, hid, tok in job["handles"]:
        s = socket.create_connection((host, port), timeout=30)
        # HTTP/1.0: the stream is delimited by the connection's end, no chunk framing to undo
        s.sendall(f"GET /handles/{hid} HTTP/1.0\r\nAccept: application/x-ndjson\r\n"
                  f"Authorization: Bearer {tok}\r\n\r\n".encode())
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, index)
        state[index] = [s, b"", False, False]  # socket, pending bytes, head seen, revoked
    latencies: list[float] = []
    revoked: list[float] = []  # arrival times of `revoked` events
    samples: list[tuple[int, int, float]] = []
    rows = gaps = after_revoked = 0
    window = job["window"]
    errors = []
    while not stop.is_set() and state:
        for key, _ in sel.select(0.5):
            index = key.data
            entry = state.get(index)
            if entry is None:
                continue
            try:
                data = entry[0].recv(262144)
            except BlockingIOError:
                continue
            except OSError as exc:
                data = b""
                errors.append(repr(exc))
            now = time.time()
            if not data:
                sel.unregister(entry[0])
                entry[0].close()
                del state[index]
                continue
            buf = entry[1] + data
            if not entry[2]:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    entry[1] = buf
                    continue
                if b" 200 " not in buf[:20]:
                    errors.append(buf[:200].decode(errors="replace"))
                buf = buf[end + 4:]
                entry[2] = True
            cut = buf.rfind(b"\n") + 1
            chunk, entry[1] = buf[:cut], buf[cut:]
            n = len(ROW_LINE.findall(chunk))
            if entry[3]:
                after_revoked += n  # rows after their handle's `revoked`: must stay 0
            elif b'"event":' in chunk:  # events are rare: those lines are parsed whole
                at = 0
                for line in chunk.split(b"\n"):
                    at += len(line) + 1
                    if line.startswith(b'{"id":') and b',"row":' not in line[:32]:
                        obj = json.loads(line)
                        gaps += obj.get("event") == "gap"
                        if obj.get("event") == "revoked" and not entry[3]:
                            revoked.append(now)
                            entry[3] = True
                            after_revoked += len(ROW_LINE.findall(chunk, at))
            if not n:
                continue
            rows += n
            sents = SENT.findall(chunk)
            seqs = SEQ.findall(chunk) if len(sents) == n else None
            if seqs is None or len(seqs) != n:
                errors.append(f"a row without sent/seq in {chunk[:200]!r}")
                continue
            lo, hi = window
            for sent_text, seq_text in zip(sents, seqs):
                sent = float(sent_text)
                if lo <= sent <= hi:
                    latencies.append(now - sent)
                    seq = int(seq_text)
                    if seq % SAMPLE == 0:
                        samples.append((index, seq, now))
    for entry in state.values():
        entry[0].close()
    Path(job["out"]).write_text(json.dumps({"latencies": latencies, "samples": samples,
                                            "revoked": revoked,
                                            "rows": rows, "gaps": gaps, "errors": errors[:5],
                                            "after_revoked": after_revoked,
                                            "still_open": len(state)}))


# -- ingest process -------------------------------------------------------------------------------------

def ingest_main(url: str, stream: str, rate: int, seconds: float, first_seq: int) -> None:
    """POST `rate` records/s for `seconds` s (20 per call), each stamped with its send time."""
    per_call = 20
    period = per_call / rate
    seq = first_seq
    calls = late = 0
    durations: list[float] = []  # each call's, sent to answered: part of every row's latency
    with requests.Session() as s:
        start = time.monotonic()
        next_at = start
        while time.monotonic() - start < seconds:
            now = time.time()
            body = "".join(json.dumps({
                "ts": now, "seq": seq + k, "sent": now, "v": ((seq + k) * 7.31) % 1000.0,
                "pad": "p" * 40}) + "\n" for k in range(per_call))
            seq += per_call
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
    print(json.dumps({"calls": calls, "late": late, "last_seq": seq,
                      "call_p50": pct(durations, 50), "call_p95": pct(durations, 95)}))


# -- the gateway --------------------------------------------------------------------------------------

class BatchLog(logging.Handler):
    """The runtime's per-batch timings (its DEBUG line), with the time each batch ended."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.batches: list[tuple[float, float, float, float]] = []
        self.logger = logging.getLogger("pep.runtime.executor")

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("batch %s: table"):
            self.batches.append((record.created, *record.args[1:4]))

    def __enter__(self) -> "BatchLog":
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
        log = logging.getLogger("pep.runtime.executor")
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
                              for q, t, v in zip(seqs, sent, values)], dtype=object)
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


class Gateway:
    def __init__(self, spark, data_dir: Path, subjects: int, rate: int = 200) -> None:
        from common.auth import write_auth_file
        from pep.config import GatewayConfig
        from pep.http.app import create_app
        from server.serving import tune_gc
        from pep.serve import gateway_server
        from pep.services import build_services

        if spark is not None:
            from pep.runtime.runtime import StreamRuntime
        data_dir.mkdir(parents=True, exist_ok=True)
        auth = data_dir / "auth.json"
        write_auth_file(auth, [{"token": ADMIN, "subject": "nea", "roles": ["data-owner"],
                                "admin": True}]
                        + [{"token": token(i), "subject": f"c{i:05d}", "roles": ["consumer"],
                            "admin": False} for i in range(subjects)])
        self.runtime = (StreamRuntime(spark, data_dir / "runtime", trigger_interval=TRIGGER)
                        if spark is not None else FakeRuntime(rate))
        config = GatewayConfig(data_dir=data_dir, auth_file=auth, policies_dir=None, port=0,
                               heartbeat=15.0, max_connections=subjects + 1000, threads=16)
        self.services = build_services(config, runtime=self.runtime)
        self.server = gateway_server(create_app(services=self.services), config).start()
        self.url = self.server.url
        tune_gc()  # as `xsg serve` does once started (server.serving.GC_THRESHOLDS)

    def close(self) -> None:
        for step in (self.services.close_stream_side, self.server.stop, self.services.close):
            try:
                step()
            except Exception as exc:  # noqa: BLE001
                print(f"(cleanup: {step.__qualname__} failed: {exc!r})")


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


def open_handles(gw: Gateway, n: int, streams: list[str], pass_rate: float = 0.1) -> list[str]:
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


def run_size(gw: Gateway, n: int, rate: int, seconds: float, procs: int, tmp: Path,
             first_seq: int, pass_rate: float = 0.1, warm: float = 8.0,
             stream_count: int = 1) -> dict:
    from pep.handles.buffer import HandleBuffer

    # streams of their own: a restarted query would re-read older records
    streams = ([f"lat{n}"] if stream_count == 1
               else [f"lat{n}s{j}" for j in range(stream_count)])
    for stream in streams:
        r = requests.post(f"{gw.url}/streams", timeout=30, headers={
            "Authorization": f"Bearer {ADMIN}"}, json={
            "name": stream, "time_attribute": "ts", "source": {"kind": "ingest"},
            "schema": SCHEMA})
        assert r.status_code == 201, r.text
        r = requests.post(f"{gw.url}/policies", data=policy(stream), timeout=30, headers={
            "Authorization": f"Bearer {ADMIN}", "Content-Type": "application/xacml+xml"})
        assert r.status_code == 201, r.text
    put_times: dict = {}
    original_put = stamp_puts(put_times)  # before the handles attach their buffers' put
    readers = []
    ingests: list[subprocess.Popen] = []
    try:
        t0 = time.perf_counter()
        ids = open_handles(gw, n, streams, pass_rate)
        opened = time.perf_counter() - t0
        start_at = time.time() + 3.0 + warm  # the measurement window, by send time
        window = (start_at, start_at + seconds)
        for k in range(procs):
            job = tmp / f"reader-{n}-{k}.json"
            job.write_text(json.dumps({
                "host": "127.0.0.1", "port": gw.server.port, "window": window,
                "out": str(tmp / f"reader-{n}-{k}.out"),
                "handles": [(i, ids[i], token(i)) for i in range(k, n, procs)]}))
            readers.append(subprocess.Popen([sys.executable, __file__, "--reader", str(job)]))
        deadline = time.monotonic() + 120
        while gw.server.stream_count < n and time.monotonic() < deadline:
            time.sleep(0.2)
        connected = gw.server.stream_count
        fake = isinstance(gw.runtime, FakeRuntime)
        if not fake:
            ingests = [subprocess.Popen([sys.executable, __file__, "--ingest", gw.url, stream,
                                         str(rate), str(3.0 + warm + seconds + 1.0),
                                         str(first_seq)], stdout=subprocess.PIPE, text=True)
                       for stream in streams]
        with BatchLog() as batches:
            c0, w0 = time.process_time(), time.time()
            s0 = spark_cpu_seconds()
            p0, n0 = put_times["put_seconds"], put_times["puts"]
            if fake:
                gw.runtime.running.set()
                time.sleep(max(0.0, window[1] + 1.0 - time.time()))
                gw.runtime.running.clear()
                outs = [json.dumps({"calls": 0, "late": 0, "last_seq": gw.runtime.seq})]
            else:
                outs = [p.communicate(timeout=3.0 + warm + seconds + 120)[0] for p in ingests]
            put_share = (put_times["put_seconds"] - p0, put_times["puts"] - n0)
            gateway_cpu = (time.process_time() - c0) / (time.time() - w0)
            s1 = spark_cpu_seconds()
            spark_cpu = tuple((b - a) / (time.time() - w0) for a, b in zip(s0, s1))
            memory = rss_mib()
            time.sleep(3.0)  # the last rows reach their readers
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
        for p in readers:
            p.wait(timeout=120)
    finally:
        for p in ingests:
            if p.poll() is None:
                p.kill()
                p.wait()
        for p in readers:
            p.send_signal(signal.SIGTERM)
        for p in readers:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        HandleBuffer.put = original_put
    lat: list[float] = []
    revoked: list[float] = []
    samples = []
    rows = gaps = after_revoked = 0
    errors = []
    for k in range(procs):
        res = json.loads((tmp / f"reader-{n}-{k}.out").read_text())
        lat += res["latencies"]
        samples += res["samples"]
        rows += res["rows"]
        gaps += res["gaps"]
        after_revoked += res["after_revoked"]
        errors += res["errors"]
        revoked += [t - t_revoke for t in res["revoked"]]
    delivery_part = []
    for index, seq, arrived in samples:
        put = put_at(put_times, key_of.get(index), seq)
        if put is not None:
            delivery_part.append(arrived - put)
    in_window = [b for b in batches.batches if window[0] <= b[0] <= window[1] + 1]
    each = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    # one stream: its ingest's own report (with the call durations); several: their sums
    ingested = each[0] if len(each) == 1 else {
        "calls": sum(e["calls"] for e in each), "late": sum(e["late"] for e in each),
        "last_seq": max(e["last_seq"] for e in each)}
    return {"n": n, "opened_s": opened, "connected": connected, "lat": lat, "rows": rows,
            "gaps": gaps, "errors": errors, "delivery": delivery_part, "batches": in_window,
            "ingest": ingested, "seconds": seconds, "gateway_cpu": gateway_cpu,
            "last_seq": ingested["last_seq"], "procs": procs, "put": put_share,
            "revoke_call": revoke_call, "revoked": revoked, "pass_rate": pass_rate,
            "after_revoked": after_revoked, "memory": memory,
            "spark_cpu": spark_cpu, "streams": len(streams)}


def rss_mib() -> tuple[float, float]:
    """Resident memory (MiB) of this process (the gateway) and of Spark's JVM (nan if none)."""
    def of(pid: int) -> float:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return float("nan")
    jvm = float("nan")
    try:
        from pyspark import SparkContext
        proc = getattr(SparkContext._gateway, "proc", None)
        if proc is not None:
            jvm = of(proc.pid)
    except Exception:  # noqa: BLE001 - no Spark (fake runtime)
        pass
    return of(os.getpid()), jvm


def spark_cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by Spark's JVM and by its Python workers (the JVM's descendant
    processes: pyspark.daemon and the workers it forks), from /proc; (nan, nan) without Spark.
    A steadier figure than latency on a shared machine: what the runtime's per-batch work
    costs the two cores the readers, the gateway and Spark share."""
    try:
        from pyspark import SparkContext
        proc = getattr(SparkContext._gateway, "proc", None)
    except Exception:  # noqa: BLE001 - no Spark (fake runtime)
        proc = None
    if proc is None:
        return float("nan"), float("nan")
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        used[pid] = (int(fields[11]) + int(fields[12])) / tick
    workers = 0.0
    for pid in used:
        up = parent.get(pid)
        while up is not None and up > 1 and up != proc.pid:
            up = parent.get(up)
        if up == proc.pid:
            workers += used[pid]
    return used.get(proc.pid, float("nan")), workers


def report(r: dict, rate: int) -> None:
    lat, dl, b = r["lat"], r["delivery"], r["batches"]
    print(f"\n{r['n']:,} handles (distinct queries, each ~{r['pass_rate']:.0%} of the tuples), "
          + (f"over {r['streams']} streams, {rate} tuples/s each " if r["streams"] > 1
             else f"{rate} tuples/s ")
          + f"ingested for {r['seconds']:.0f} s; {r['connected']:,} readers connected from "
          f"{r['procs']} reader processes; handles opened in {r['opened_s']:.1f} s")
    if not lat:  # the gateway fell behind: no row sent in the window arrived; the rest still
        print(f"  no rows measured (none sent in the window arrived): {r['rows']:,} rows in "
              f"all, ingest {r['ingest']}")
    else:
        print(f"  ingest -> reader latency: p50 {pct(lat, 50):.3f} s, p95 {pct(lat, 95):.3f} s, "
              f"p99 {pct(lat, 99):.3f} s, max {max(lat):.3f} s over {len(lat):,} rows "
              f"({len(lat) / r['seconds']:,.0f} rows/s to readers); gaps {r['gaps']}; "
              f"ingest calls late {r['ingest']['late']}")
        if "call_p50" in r["ingest"]:
            print(f"  of which the ingest call (POST /streams/<name>/records, 20 records, sent -> "
                  f"answered): p50 {r['ingest']['call_p50'] * 1000:.0f} ms, p95 "
                  f"{r['ingest']['call_p95'] * 1000:.0f} ms")
    if dl:
        print(f"  of which delivery (in the handle's buffer -> at the reader, sampled "
              f"{len(dl):,} rows): p50 {pct(dl, 50) * 1000:.0f} ms, p95 {pct(dl, 95) * 1000:.0f} ms,"
              f" p99 {pct(dl, 99) * 1000:.0f} ms")
    if b:
        total = [x[1] + x[2] + x[3] for x in b]
        print(f"  runtime micro-batches in the window: {len(b)}, each p50 {pct(total, 50):.3f} s "
              f"p95 {pct(total, 95):.3f} s (plan table p50 {pct([x[1] for x in b], 50):.3f}, "
              f"Spark job + toArrow p50 {pct([x[2] for x in b], 50):.3f}, routing + delivery "
              f"into buffers p50 {pct([x[3] for x in b], 50):.3f}); trigger every {TRIGGER} s")
    if r["put"][1]:
        print(f"  in HandleBuffer.put (with lists of dicts: each handle's rows encoded as JSON "
              f"there; appending; waking the readers): {r['put'][0] / r['put'][1] * 1e6:.1f} us "
              f"per row, {r['put'][0]:.2f} s for {r['put'][1]:,} rows; the rest of routing is "
              f"the runtime's own")
    print(f"  gateway process CPU: {r['gateway_cpu']:.2f} cores on average; resident memory "
          f"at the end of ingest: gateway (Python) {r['memory'][0]:.0f} MiB, Spark's JVM "
          f"{r['memory'][1]:.0f} MiB")
    print(f"  Spark's CPU in the same window: JVM {r['spark_cpu'][0]:.2f} cores, its Python "
          f"workers {r['spark_cpu'][1]:.2f} cores")
    rv = r["revoked"]
    deletes, calls = (("the policy behind all", "DELETE") if r["streams"] == 1 else
                      (f"the {r['streams']} policies, one after the other, behind all", "DELETEs"))
    print(f"  revocation (the owner deletes {deletes} {r['n']:,} handles): the {calls} "
          f"returned in {r['revoke_call'] * 1000:.0f} ms; {len(rv):,} readers got "
          f"`revoked`" + (f", p50 {pct(rv, 50) * 1000:.0f} ms, p99 {pct(rv, 99) * 1000:.0f} ms, "
                          f"max {max(rv) * 1000:.0f} ms after the call began" if rv else "")
          + f"; rows after `revoked`: {r['after_revoked']}")
    if r["errors"]:
        print("  reader errors:", r["errors"][:3])


def machine() -> str:
    """The machine line (CPU model, cores, PySpark, load): the host under this project's VM
    has changed between sessions, and its figures with it."""
    from tests.bench.bench_gateway_streams import machine as describe

    return describe()


def main() -> None:
    global TRIGGER
    if sys.argv[1:2] == ["--reader"]:
        reader_main(sys.argv[2])
        return
    if sys.argv[1:2] == ["--ingest"]:
        ingest_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]),
                    int(sys.argv[6]))
        return
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--handles", default="1000", help="sizes, comma-separated (e.g. 1000,2000)")
    ap.add_argument("--rate", type=int, default=200, help="tuples ingested per second")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds per size")
    ap.add_argument("--reader-procs", type=int, default=4)
    ap.add_argument("--warm", type=float, default=8.0,
                    help="seconds of ingest before the measured window")
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
    TRIGGER = args.trigger
    sizes = [int(x) for x in args.handles.split(",")]
    print("machine:", machine(), "; runtime:", args.runtime)
    spark = None
    if args.runtime == "spark":
        from pep.runtime.session import create_spark_session

        conf = {"spark.driver.memory": "4g"}
        for item in args.conf:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                ap.error(f"--conf wants KEY=VALUE, got {item!r}")
            conf[key.strip()] = value.strip()
        if args.conf:
            print("Spark settings:", ", ".join(f"{k}={v}" for k, v in conf.items()))
        spark = create_spark_session(extra_conf=conf)
    gw = None
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="xsg-bench-many-") as tmp:
            gw = Gateway(spark, Path(tmp) / "gw", max(sizes), args.rate)
            seq = 0
            for n in sizes:
                res = run_size(gw, n, args.rate, args.seconds, args.reader_procs, Path(tmp), seq,
                               args.pass_rate, args.warm, args.streams)
                seq = res["last_seq"] + 1
                report(res, args.rate)
                results.append(res)
    finally:
        if gw is not None:
            gw.close()
        if spark is not None:
            spark.stop()
    print("\nsummary: handles, p95 ingest->reader (s), p95 delivery part (ms), rows/s to readers")
    for r in results:
        print(f"  {r['n']:>6,}  {pct(r['lat'], 95):.3f}  {pct(r['delivery'], 95) * 1000:.0f}  "
              f"{len(r['lat']) / r['seconds']:,.0f}")
    print("load average at the end:", " ".join("%.2f" % x for x in os.getloadavg()))


if __name__ == "__main__":
    main()
