"""Benchmark of the stream gateway over HTTP against a direct Spark query on the same source.

Run: .venv/bin/python tests/bench/bench_gateway_streams.py [--quick]

One SparkSession and one real gateway (pep.services + pep.http.app + StreamRuntime, served by
server.serving.HttpServer on a free loopback port); every figure is measured through HTTP:
1. request -> first result: `POST /requests` to the first row read from the handle (NDJSON),
   vs a direct Structured Streaming query (readStream json, same schema, same filter,
   foreachBatch collecting) on the same ingest directory, start -> first row; records are
   ingested continuously through `POST /streams/<name>/records`. Cold (the handle starts its
   stream's shared query) and warm (another handle keeps the query running), for a plain
   filter+map policy and for NEA's windowed policy (Figure 2).
2. tuples/s delivered through the handle (reader over HTTP) vs the direct query, over the same
   backlog of files (linked into the ingest directory right after the handle opened: a handle
   starts at its stream's current end, nothing is replayed).
3. revocation latency: K live handles of K consumers, each read by its own thread, from the
   start of `DELETE /policies/<id>` to each reader's `revoked` event.
Only loopback traffic; every loop is bounded; everything started is stopped, even on error.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

NEA_POLICY = ROOT / "policies" / "weather" / "nea-weather-policy.xml"
NEA_POLICY_ID = "urn:xsg:example:weather:nea-policy"
PLAIN_POLICY_ID = "urn:xsg:bench:plain"
ALL_POLICY_ID = "urn:xsg:bench:all"
FIELDS = (("samplingtime", "timestamp"), ("temperature", "double"), ("humidity", "double"),
          ("solarradiation", "double"), ("rainrate", "double"), ("windspeed", "double"),
          ("winddirection", "long"), ("barometer", "double"))
ADMIN_TOKEN = "tok-bench-nea-0123456789"
XML = {"Content-Type": "application/xacml+xml"}
NDJSON = {"Content-Type": "application/x-ndjson"}
TRIGGER = 0.25          # the gateway runtime's trigger interval; the direct query uses the same
MAX_FILES = 50          # maxFilesPerTrigger, same on both sides
FIRST_ROW_TIMEOUT = 60.0
FINAL_EVENTS = ("revoked", "released", "ended", "shutdown")


def consumer_token(i: int) -> str:
    return f"tok-bench-c{i:03d}-0123456789"


def hdr(token: str, **extra) -> dict:
    return {"Authorization": f"Bearer {token}", **extra}


# -- policies ---------------------------------------------------------------------------------------

def inline_policy(policy_id: str, streams: list[str], condition: str, fields: list[str]) -> bytes:
    """A plain filter+map grant for every authenticated subject on the given streams."""
    s = "http://www.w3.org/2001/XMLSchema#string"
    rid = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"
    res = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
    eq = "urn:oasis:names:tc:xacml:1.0:function:string-equal"
    all_ofs = "".join(
        f'<AllOf><Match MatchId="{eq}"><AttributeValue DataType="{s}">{name}</AttributeValue>'
        f'<AttributeDesignator Category="{res}" AttributeId="{rid}" DataType="{s}" '
        f'MustBePresent="false"/></Match></AllOf>' for name in streams)
    maps = "".join(
        f'<AttributeAssignmentExpression AttributeId="exacml:obligation:stream-map-attribute-id">'
        f'<AttributeValue DataType="{s}">{f}</AttributeValue></AttributeAssignmentExpression>'
        for f in fields)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="{policy_id}" Version="1.0"
 RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
 <Target><AnyOf>{all_ofs}</AnyOf></Target>
 <Rule RuleId="{policy_id}:read" Effect="Permit">
  <ObligationExpressions>
   <ObligationExpression ObligationId="exacml:obligation:stream-filter" FulfillOn="Permit">
    <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-filter-condition-id">
     <AttributeValue DataType="{s}">{condition.replace('>', '&gt;').replace('<', '&lt;')}</AttributeValue>
    </AttributeAssignmentExpression>
   </ObligationExpression>
   <ObligationExpression ObligationId="exacml:obligation:stream-map" FulfillOn="Permit">{maps}
   </ObligationExpression>
  </ObligationExpressions>
 </Rule>
</Policy>""".encode()


def request_json(stream: str) -> bytes:
    return json.dumps({"Request": {
        "AccessSubject": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:subject:subject-id",
                                         "Value": "whoever"}]},
        "Resource": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
                                    "Value": stream}]},
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                  "Value": "read"}]}}}).encode()


# -- records ----------------------------------------------------------------------------------------

class RecordMaker:
    """Weather records with increasing sampling times; about 2/3 have rainrate > 5 and about
    a third temperature > 30 (the plain policy's filter)."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.t = datetime(2024, 5, 1, tzinfo=timezone.utc)

    def make(self, n: int) -> list[dict]:
        out = []
        for i in range(n):
            r = self.rnd
            self.t += timedelta(seconds=1)
            out.append({"samplingtime": self.t.strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "temperature": round(r.uniform(24, 33), 2),
                        "humidity": round(r.uniform(50, 95), 1),
                        "solarradiation": round(r.uniform(0, 900), 1),
                        "rainrate": round(r.uniform(0, 5) if i % 3 == 0 else r.uniform(5.01, 80), 2),
                        "windspeed": round(r.uniform(0, 40), 2), "winddirection": r.randrange(360),
                        "barometer": round(r.uniform(1000, 1020), 1)})
        return out


def ndjson(records: list[dict]) -> bytes:
    return ("\n".join(json.dumps(r) for r in records) + "\n").encode()


class Ingester(threading.Thread):
    """The owner appends `per_batch` records every `period` s through the API (bounded in time)."""

    def __init__(self, base: str, stream: str, per_batch: int = 20, period: float = 0.1,
                 max_seconds: float = 900.0, seed: int = 1) -> None:
        super().__init__(daemon=True, name=f"ingest-{stream}")
        self.base, self.stream, self.per_batch, self.period = base, stream, per_batch, period
        self.max_seconds = max_seconds
        self.maker = RecordMaker(seed)
        self.stop_event = threading.Event()
        self.batches = 0
        self.errors: list[str] = []

    def run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        with requests.Session() as s:
            while not self.stop_event.is_set() and time.monotonic() < deadline:
                try:
                    r = s.post(f"{self.base}/streams/{self.stream}/records", timeout=30,
                               data=ndjson(self.maker.make(self.per_batch)),
                               headers=hdr(ADMIN_TOKEN, **NDJSON))
                    if r.status_code != 201:
                        self.errors.append(f"{r.status_code} {r.text[:200]}")
                    self.batches += 1
                except requests.RequestException as exc:
                    self.errors.append(repr(exc))
                self.stop_event.wait(self.period)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(10)


# -- a handle reader (NDJSON over HTTP) -------------------------------------------------------------

class Reader(threading.Thread):
    """Reads a handle's NDJSON like a consumer's application; stamps the first row, counts rows
    and gaps, and stamps the final event (time.perf_counter)."""

    def __init__(self, url: str, token: str, want_rows: int | None = None,
                 max_seconds: float = 600.0) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.want_rows, self.max_seconds = url, token, want_rows, max_seconds
        self.first_row_at: float | None = None
        self.last_row_at: float | None = None
        self.final_at: float | None = None
        self.final: dict | None = None
        self.rows = 0
        self.lost = 0
        self.status: int | None = None
        self.error: str | None = None
        self.got_row = threading.Event()
        self.done = threading.Event()
        self.response = None

    def run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        try:
            with requests.get(self.url, headers=hdr(self.token, Accept="application/x-ndjson"),
                              stream=True, timeout=(10, 30)) as r:
                self.response = r
                self.status = r.status_code
                if r.status_code != 200:
                    self.error = r.text[:300]
                    return
                # the response is chunked: iter_lines hands over each chunk as it arrives
                for raw in r.iter_lines(chunk_size=65536):
                    if not raw:
                        continue
                    now = time.perf_counter()
                    if raw.startswith(b'{"id":') and b',"row":' in raw[:40]:
                        self.rows += 1
                        self.last_row_at = now
                        if self.first_row_at is None:
                            self.first_row_at = now
                            self.got_row.set()
                        if self.want_rows is not None and self.rows >= self.want_rows:
                            return
                        continue
                    obj = json.loads(raw)
                    kind = obj.get("event")
                    if kind == "gap":
                        self.lost += obj.get("lost") or 0
                    elif kind in FINAL_EVENTS:
                        self.final_at, self.final = now, obj
                        return
                    if time.monotonic() > deadline:
                        self.error = "reader time limit"
                        return
        except Exception as exc:  # noqa: BLE001 -- reported, never hidden
            self.error = repr(exc)
        finally:
            self.done.set()
            self.got_row.set()


# -- the gateway ------------------------------------------------------------------------------------

class Gateway:
    def __init__(self, spark, data_dir: Path, consumers: int) -> None:
        from common.auth import write_auth_file
        from pep.http.app import create_app
        from pep.services import build_services
        from pep.config import GatewayConfig
        from pep.runtime.runtime import StreamRuntime
        from server.serving import HttpServer

        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        auth = data_dir / "auth.json"
        write_auth_file(auth, [{"token": ADMIN_TOKEN, "subject": "nea", "roles": ["data-owner"],
                                "admin": True},
                               {"token": consumer_token(0), "subject": "lta",
                                "roles": ["consumer"], "admin": False}]
                        + [{"token": consumer_token(i), "subject": f"c{i:03d}",
                            "roles": ["consumer"], "admin": False} for i in range(1, consumers + 1)])
        self.runtime = StreamRuntime(spark, data_dir / "runtime", trigger_interval=TRIGGER,
                                     max_files_per_trigger=MAX_FILES)
        self.attach_seconds: list[float] = []
        attach = self.runtime.attach_handle

        def timed_attach(*args, **kwargs):  # where POST /requests spends its time
            t = time.perf_counter()
            try:
                return attach(*args, **kwargs)
            finally:
                self.attach_seconds.append(time.perf_counter() - t)
        self.runtime.attach_handle = timed_attach
        config = GatewayConfig(data_dir=data_dir, auth_file=auth, policies_dir=None, port=0,
                               heartbeat=1.0, reevaluation_interval=1.0)
        self.services = build_services(config, runtime=self.runtime)
        self.app = create_app(services=self.services)
        self.server = HttpServer(self.app, host="127.0.0.1", port=0, threads=16,
                                    max_threads=max(200, consumers + 100))
        self.server.start()
        self.url = self.server.url

    def ingest_dir(self, stream: str) -> Path:
        return self.data_dir / "streams" / stream / "ingest"

    def close(self) -> None:
        for step in (self.services.close_stream_side, self.server.stop, self.services.close, self.runtime.stop):
            try:
                step()
            except Exception as exc:  # noqa: BLE001
                print(f"(cleanup: {step.__qualname__} failed: {exc!r})")

    # -- HTTP helpers --

    def register(self, name: str) -> None:
        schema = [{"name": n, "type": t} for n, t in FIELDS]
        r = requests.post(f"{self.url}/streams", headers=hdr(ADMIN_TOKEN), timeout=30,
                          json={"name": name, "schema": schema, "source": {"kind": "ingest"},
                                "time_attribute": "samplingtime"})
        assert r.status_code == 201, r.text

    def add_policy(self, xml: bytes) -> None:
        r = requests.post(f"{self.url}/policies", headers=hdr(ADMIN_TOKEN, **XML), data=xml,
                          timeout=30)
        assert r.status_code == 201, r.text

    def open(self, token: str, body: bytes, media: str = "application/xacml+json") -> dict:
        r = requests.post(f"{self.url}/requests", headers=hdr(token, **{"Content-Type": media}),
                          data=body, timeout=60)
        assert r.status_code in (200, 201), (r.status_code, r.text)
        return r.json()

    def release(self, token: str, handle: str) -> None:
        requests.delete(handle, headers=hdr(token), timeout=30)


# -- the direct query -------------------------------------------------------------------------------

class DirectQuery:
    """readStream json on the ingest directory with the stream's schema, the same filter and
    projection, foreachBatch collecting the rows to the driver (as Arrow, then Python rows)."""

    live: list = []

    def __init__(self, spark, directory: Path, condition: str, columns: list[str],
                 want_rows: int | None = None) -> None:
        from pep.core.plan import Field, StreamSchema
        from pep.runtime.sources import spark_schema

        self.spark, self.directory = spark, directory
        self.condition, self.columns, self.want_rows = condition, columns, want_rows
        self.schema = spark_schema(StreamSchema(tuple(Field(n, t) for n, t in FIELDS)),
                                   with_seq=True)
        self.rows = 0
        self.first_row_at: float | None = None
        self.last_row_at: float | None = None
        self.got_row = threading.Event()
        self.done = threading.Event()
        self.query = None
        self.started_at = 0.0
        self.stopping = False

    def _batch(self, df, _batch_id) -> None:
        try:
            rows = df.toArrow().to_pylist()
        except Exception:
            if self.stopping:
                return  # stop() interrupted this batch's job
            raise
        if not rows:
            return
        now = time.perf_counter()
        self.rows += len(rows)
        self.last_row_at = now
        if self.first_row_at is None:
            self.first_row_at = now
            self.got_row.set()
        if self.want_rows is not None and self.rows >= self.want_rows:
            self.done.set()

    def start(self) -> "DirectQuery":
        self.started_at = time.perf_counter()
        self.query = (self.spark.readStream.schema(self.schema)
                      .option("maxFilesPerTrigger", MAX_FILES).json(str(self.directory))
                      .filter(self.condition).select(*self.columns)
                      .writeStream.foreachBatch(self._batch)
                      .trigger(processingTime=f"{int(TRIGGER * 1000)} milliseconds").start())
        DirectQuery.live.append(self.query)
        return self

    def stop(self) -> None:
        self.stopping = True
        if self.query is not None:
            try:
                self.query.stop()
            finally:
                if self.query in DirectQuery.live:
                    DirectQuery.live.remove(self.query)


# -- 1. request -> first result ---------------------------------------------------------------------

BREAKDOWN: dict[str, list[float]] = {}


def note(key: str, value: float | None) -> None:
    if value is not None:
        BREAKDOWN.setdefault(key, []).append(value)


def direct_first_row(spark, gw: Gateway, stream: str, condition: str, columns: list[str],
                     case: str = "") -> float:
    q = DirectQuery(spark, gw.ingest_dir(stream), condition, columns).start()
    note(f"{case} direct start() call", time.perf_counter() - q.started_at)
    try:
        if not q.got_row.wait(FIRST_ROW_TIMEOUT):
            raise RuntimeError(f"direct query on {stream}: no row in {FIRST_ROW_TIMEOUT} s")
        first = q.first_row_at - q.started_at
        deadline = time.monotonic() + 3  # the batch's progress is posted after foreachBatch
        while not q.query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.02)
        progress = q.query.recentProgress
        if progress:
            d = progress[0]["durationMs"]
            note(f"{case} direct batch 0 addBatch", d.get("addBatch", 0) / 1000)
            note(f"{case} direct batch 0 getBatch+latestOffset+planning",
                 (d.get("getBatch", 0) + d.get("latestOffset", 0) + d.get("queryPlanning", 0))
                 / 1000)
        return first
    finally:
        q.stop()


def gateway_first_row(gw: Gateway, token: str, body: bytes, media: str, case: str = ""
                      ) -> tuple[float, float]:
    """(POST /requests -> first row, POST /requests round trip); releases the handle."""
    n_attach = len(gw.attach_seconds)
    split = BatchSplit().__enter__()
    try:
        started = time.perf_counter()
        opened = gw.open(token, body, media)
        answered = time.perf_counter()
    except BaseException:
        split.__exit__()
        raise
    if len(gw.attach_seconds) > n_attach:
        note(f"{case} gateway runtime.attach_handle in POST", gw.attach_seconds[-1])
    reader = Reader(opened["handle"], token, want_rows=1, max_seconds=FIRST_ROW_TIMEOUT)
    reader.start()
    try:
        reader.got_row.wait(FIRST_ROW_TIMEOUT)
        split.__exit__()
        if split.batches and "cold" in case:
            note(f"{case} gateway batch 0 evaluation job + toArrow", split.batches[0][1])
        if reader.first_row_at is None:
            raise RuntimeError(f"no row on {opened['handle']}: {reader.status} {reader.error} "
                               f"{reader.final}")
        return reader.first_row_at - started, answered - started
    finally:
        split.__exit__()
        gw.release(token, opened["handle"])
        reader.join(10)


def first_result(spark, gw: Gateway, rounds: int) -> dict:
    plain_cond, plain_cols = "temperature > 30", ["samplingtime", "temperature", "rainrate"]
    nea_cond, nea_cols = "rainrate > 5", ["samplingtime", "rainrate", "windspeed"]
    lta = consumer_token(0)
    out: dict[str, dict[str, list[float]]] = {
        k: {"direct": [], "gateway": [], "post": []} for k in ("plain-cold", "plain-warm", "nea-cold")}
    ingesters = [Ingester(gw.url, s, seed=i) for i, s in enumerate(("fr", "weather", "fw"))]
    for ing in ingesters:
        ing.start()
    keeper = None
    try:
        time.sleep(1.5)  # a few files in each directory before the first query
        warm_body = request_json("fw")
        keeper = gw.open(consumer_token(1), warm_body)
        keeper_reader = Reader(keeper["handle"], consumer_token(1), max_seconds=900)
        keeper_reader.start()
        keeper_reader.got_row.wait(FIRST_ROW_TIMEOUT)
        time.sleep(2)  # let the shared query catch up with the backlog
        plain_body = request_json("fr")
        nea_body = (ROOT / "policies" / "weather" / "lta-request.xml").read_bytes()
        for i in range(rounds):
            # cold: the handle's request starts the stream's shared query (none is running)
            cases = [("plain-cold", "fr", plain_cond, plain_cols, plain_body, "application/xacml+json"),
                     ("nea-cold", "weather", nea_cond, nea_cols, nea_body, "application/xacml+xml")]
            for key, stream, cond, cols, body, media in cases:
                gw_first = i % 2 == 1  # alternate which side runs first
                for side in (("gateway", "direct") if gw_first else ("direct", "gateway")):
                    if side == "direct":
                        out[key]["direct"].append(direct_first_row(spark, gw, stream, cond, cols,
                                                                   key))
                    else:
                        first, post = gateway_first_row(gw, lta, body, media, key)
                        out[key]["gateway"].append(first)
                        out[key]["post"].append(post)
            # warm: a long-lived handle of another consumer keeps the shared query of "fw"
            # running (and caught up); the request attaches to it
            first, post = gateway_first_row(gw, lta, warm_body, "application/xacml+json",
                                            "plain-warm")
            out["plain-warm"]["gateway"].append(first)
            out["plain-warm"]["post"].append(post)
            out["plain-warm"]["direct"].append(direct_first_row(spark, gw, "fw", plain_cond,
                                                                plain_cols, "plain-warm"))
    finally:
        if keeper is not None:
            gw.release(consumer_token(1), keeper["handle"])
        for ing in ingesters:
            ing.stop()
            if ing.errors:
                print(f"ingest {ing.stream}: {len(ing.errors)} errors, first {ing.errors[0]}")
    print("\n1. request -> first result (s), medians over", rounds, "rounds (cold: the request "
          "starts its stream's shared query; warm: the stream's query is already running for "
          "another consumer; the direct query always starts its own)")
    for key, v in out.items():
        d, g, p = (statistics.median(v[x]) for x in ("direct", "gateway", "post"))
        print(f"  {key:10s}: direct start->first row {d:.3f}  gateway POST->first row {g:.3f} "
              f"(POST /requests itself {p * 1000:.0f} ms)  ratio {g / d:.2f}  (aim <= 1.2)")
        print(f"  {'':10s}  direct {['%.2f' % x for x in v['direct']]}  "
              f"gateway {['%.2f' % x for x in v['gateway']]}")
    print("  where the time goes (medians, s):")
    for key, values in sorted(BREAKDOWN.items()):
        print(f"    {key:60s} {statistics.median(values):.3f}")
    return out


# -- 2. tuples per second -------------------------------------------------------------------------

class BatchSplit(logging.Handler):
    """Collects the shared executor's own per-batch timing (its DEBUG line: plan table, the
    evaluation job incl. toArrow, routing to handles incl. delivery into their buffers)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.batches: list[tuple[float, float, float]] = []
        self.logger = logging.getLogger("pep.runtime.executor")
        self.level_before = self.logger.level

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("batch %s: table"):
            self.batches.append(tuple(record.args[1:4]))

    def __enter__(self) -> "BatchSplit":
        self.logger.addHandler(self)
        self.logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_before)

    def summary(self) -> str:
        if not self.batches:
            return "no batch timings captured"
        t, e, r = (sum(b[i] for b in self.batches) for i in range(3))
        return (f"{len(self.batches)} batches: plan table {t:.2f} s, evaluation job + toArrow "
                f"{e:.2f} s, routing + delivery to the handle buffer {r:.2f} s")


def read_in_subprocess(url: str, token: str, want: int) -> dict:
    """The consumer as its own process (as a real application would be): no GIL shared with the
    gateway. perf_counter is CLOCK_MONOTONIC here, so its stamps compare across processes."""
    proc = subprocess.Popen([sys.executable, __file__, "--read-handle", url, token, str(want)],
                            stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return json.loads(out.strip().splitlines()[-1])


def reader_process_main(url: str, token: str, want: int) -> None:
    rd = Reader(url, token, want_rows=want, max_seconds=600)
    rd.run()
    print(json.dumps({"rows": rd.rows, "lost": rd.lost, "first_row_at": rd.first_row_at,
                      "last_row_at": rd.last_row_at, "error": rd.error, "status": rd.status}))

def direct_trial(spark, staging: Path, total: int) -> dict:
    cond, cols = "temperature > -100", ["samplingtime", "temperature", "humidity", "rainrate"]
    q = DirectQuery(spark, staging, cond, cols, want_rows=total).start()
    try:
        q.done.wait(600)
    finally:
        q.stop()
    assert q.rows >= total, f"direct query saw {q.rows} of {total}"
    return {"rate": total / (q.last_row_at - q.started_at),
            "steady": (q.rows - 1) / max(1e-3, q.last_row_at - q.first_row_at),
            "first": q.first_row_at - q.started_at, "rows": q.rows, "lost": 0, "split": ""}


def gateway_trial(gw: Gateway, stream: str, staging: Path, trial: str, total: int,
                  own_process: bool) -> dict:
    """A handle starts at its stream's current end (nothing is replayed), so the records arrive
    after it opened: the staged files are linked into the ingest directory at once, as a
    backlog that the stream's query reads 50 files per micro-batch, like the direct query."""
    token = consumer_token(2)
    with BatchSplit() as split:
        started = time.perf_counter()
        opened = gw.open(token, request_json(stream))
        for f in sorted(staging.iterdir()):
            os.link(f, gw.ingest_dir(stream) / f"{trial}-{f.name}")
        try:
            if own_process:
                got = read_in_subprocess(opened["handle"], token, total)
            else:
                reader = Reader(opened["handle"], token, want_rows=total, max_seconds=600)
                reader.run()
                got = {"rows": reader.rows, "lost": reader.lost, "error": reader.error,
                       "first_row_at": reader.first_row_at, "last_row_at": reader.last_row_at}
        finally:
            gw.release(token, opened["handle"])
    if got.get("error") or not got["rows"]:
        print(f"  (reader: {got.get('error')}, {got['rows']} rows)")
    last = got["last_row_at"] or time.perf_counter()
    first = got["first_row_at"] or last
    return {"rate": got["rows"] / (last - started),
            "steady": (got["rows"] - 1) / max(1e-3, last - first),
            "first": first - started, "rows": got["rows"], "lost": got["lost"],
            "split": split.summary()}


def stage_records(directory: Path, total: int, per_file: int) -> None:
    """The records as the ingest writes them (JSON lines with `_xsg_seq`), in files that sort in
    stream order."""
    maker = RecordMaker(99)
    seq = 0
    for i in range(total // per_file):
        records = maker.make(per_file)
        for r in records:
            r["_xsg_seq"] = seq
            seq += 1
        (directory / f"{i:06d}.json").write_bytes(ndjson(records))


def throughput(spark, gw: Gateway, total: int, per_file: int, trials: int) -> dict:
    """Each trial: the direct query over a staged backlog of files, then a handle read
    in-process, then a handle read by a consumer process, each handed the same backlog (linked
    into the stream's ingest directory right after the handle opened)."""
    stream = "tp"
    staging = Path(tempfile.mkdtemp(prefix="xsg-bench-tp-"))
    stage_records(staging, total, per_file)
    print(f"\n2. throughput over {total:,} records ({total // per_file} files of "
          f"{per_file}, maxFilesPerTrigger {MAX_FILES}, trigger {TRIGGER} s), {trials} trials")
    if total // per_file <= MAX_FILES:
        print("  (all files fit one micro-batch: first->last row rates are meaningless; "
              "use more files)")
    modes = ("direct", "in-process", "own process")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for trial in range(trials):
        for mode in modes:
            if mode == "direct":
                t = direct_trial(spark, staging, total)
            else:
                t = gateway_trial(gw, stream, staging, f"t{trial}{mode[0]}", total,
                                  own_process=mode == "own process")
            runs[mode].append(t)
            print(f"  trial {trial + 1} {mode:12s}: {t['rows']:,} rows, {t['rate']:,.0f} tuples/s "
                  f"from start (first row at {t['first']:.2f} s), first->last row "
                  f"{t['steady']:,.0f} tuples/s, lost {t['lost']}"
                  + (f"; executor {t['split']}" if t["split"] else ""))
    shutil.rmtree(staging, ignore_errors=True)
    res: dict = {}
    for mode in modes:
        res[mode] = {"gateway" if mode != "direct" else "rate":
                     statistics.median(t["rate"] for t in runs[mode]),
                     "steady": statistics.median(t["steady"] for t in runs[mode])}
    res["direct"] = {"direct": res["direct"]["rate"], "direct_steady": res["direct"]["steady"]}
    d, ds = res["direct"]["direct"], res["direct"]["direct_steady"]
    print(f"  medians: direct {d:,.0f} tuples/s from start, {ds:,.0f} first->last row")
    for mode in modes[1:]:
        g, gs = res[mode]["gateway"], res[mode]["steady"]
        res[mode]["gateway_steady"] = gs
        print(f"  medians: gateway, reader {mode}: {g:,.0f} tuples/s from start (ratio "
              f"{g / d:.2f}), {gs:,.0f} first->last row (ratio {gs / ds:.2f})  (aim >= 0.9)")
    return {"direct": d, "direct_steady": ds, "in-process": res["in-process"],
            "own process": res["own process"]}


# -- 3. revocation latency ------------------------------------------------------------------------

def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))]


def revocation(gw: Gateway, k: int, rounds: int, profile: bool = False) -> dict:
    stream = "rev"
    policy = inline_policy(ALL_POLICY_ID, [stream], "temperature > 25",
                           ["samplingtime", "temperature", "rainrate"])
    ing = Ingester(gw.url, stream, seed=5)
    ing.start()
    latencies: list[float] = []
    delete_rt: list[float] = []
    missing = 0
    prof = None
    try:
        for rnd in range(rounds):
            if rnd:
                gw.add_policy(policy)
            readers = []
            for i in range(k):
                token = consumer_token(3 + i)
                opened = gw.open(token, request_json(stream))
                rd = Reader(opened["handle"], token, max_seconds=120)
                rd.start()
                readers.append(rd)
            deadline = time.monotonic() + 30
            for rd in readers:
                rd.got_row.wait(max(0.0, deadline - time.monotonic()))
            live = sum(1 for rd in readers if rd.rows and not rd.done.is_set())
            if profile and rnd == rounds - 1:
                # the same deletion as DELETE /policies/<id> minus HTTP, in this thread so that
                # cProfile sees the revocation (the policy event is handled synchronously)
                import cProfile
                import pstats
                prof = cProfile.Profile()
                t0 = time.perf_counter()
                prof.enable()
                gw.services.policies.delete(ALL_POLICY_ID, owner="nea")
                prof.disable()
                t_ret = time.perf_counter()
            else:
                t0 = time.perf_counter()
                r = requests.delete(f"{gw.url}/policies/{ALL_POLICY_ID}", headers=hdr(ADMIN_TOKEN),
                                    timeout=30)
                t_ret = time.perf_counter()
                assert r.status_code == 204, r.text
            delete_rt.append(t_ret - t0)
            for rd in readers:
                rd.done.wait(10)
            got = [rd.final_at - t0 for rd in readers
                   if rd.final is not None and rd.final.get("event") == "revoked"]
            missing += k - len(got)
            latencies.extend(got)
            print(f"  round {rnd + 1}: {live}/{k} readers had rows; DELETE answered in "
                  f"{(t_ret - t0) * 1000:.0f} ms; revoked events {len(got)}/{k}, "
                  f"max {max(got) * 1000 if got else float('nan'):.0f} ms")
            for rd in readers:
                rd.join(5)
        if prof is not None:
            print(f"  profile of the last round's deletion (in-process, no HTTP), by cumulative time:")
            pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(30)
    finally:
        ing.stop()
    print(f"\n3. revocation latency, {k} live handles x {rounds} rounds "
          f"(DELETE /policies start -> reader's revoked event)")
    if latencies:
        ms = [x * 1000 for x in latencies]
        print(f"  p50 {pct(ms, 50):.0f} ms  p99 {pct(ms, 99):.0f} ms  max {max(ms):.0f} ms  "
              f"(n={len(ms)}, missing {missing}); DELETE round trip median "
              f"{statistics.median(delete_rt) * 1000:.0f} ms  (aim p99 < 500 ms)")
    return {"ms": [x * 1000 for x in latencies], "delete_ms": [x * 1000 for x in delete_rt],
            "missing": missing}


# -- main -------------------------------------------------------------------------------------------

def machine() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import pyspark
    return (f"{platform.platform()}; CPU {model}; {os.cpu_count()} cores; Python "
            f"{platform.python_version()}; PySpark {pyspark.__version__}; load average "
            f"{' '.join('%.2f' % x for x in os.getloadavg())}")


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--read-handle":
        reader_process_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    sys.stdout.reconfigure(line_buffering=True)  # figures stay in order with Spark's stderr
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--only", default="first,tp,rev",
                        help="phases to run: first (first result), tp (throughput), rev")
    parser.add_argument("--trials", type=int, default=3, help="throughput trials")
    parser.add_argument("--per-file", type=int, default=200, help="records per ingest batch")
    parser.add_argument("--handles", type=int, default=20, help="live handles for revocation")
    parser.add_argument("--profile-revocation", action="store_true",
                        help="delete the policy of the last revocation round in-process, "
                             "under cProfile, and print the profile")
    args = parser.parse_args()
    rounds = 2 if args.quick else 5
    total = 10_000 if args.quick else args.records
    print("machine:", machine())
    from pep.runtime.session import create_spark_session

    t = time.perf_counter()
    spark = create_spark_session(extra_conf={"spark.driver.memory": "4g"})
    print(f"session + warm-up: {time.perf_counter() - t:.1f} s")
    gw = None
    results: dict = {}
    try:
        with tempfile.TemporaryDirectory(prefix="xsg-bench-gw-") as tmp:
            gw = Gateway(spark, Path(tmp) / "gw", consumers=3 + args.handles)
            try:
                for name in ("fr", "fw", "weather", "tp", "rev"):
                    gw.register(name)
                gw.add_policy(NEA_POLICY.read_bytes())
                gw.add_policy(inline_policy(PLAIN_POLICY_ID, ["fr", "fw", "tp"], "temperature > 30",
                                            ["samplingtime", "temperature", "rainrate"]))
                phases = set(args.only.split(","))
                if "first" in phases:
                    results["first"] = first_result(spark, gw, rounds)
                # the throughput policy: everything, four columns
                r = requests.delete(f"{gw.url}/policies/{PLAIN_POLICY_ID}",
                                    headers=hdr(ADMIN_TOKEN), timeout=30)
                assert r.status_code == 204, r.text
                gw.add_policy(inline_policy(PLAIN_POLICY_ID, ["fr", "fw", "tp"], "temperature > -100",
                                            ["samplingtime", "temperature", "humidity", "rainrate"]))
                if "tp" in phases:
                    results["tp"] = throughput(spark, gw, total,
                                               50 if args.quick else args.per_file,
                                               1 if args.quick else args.trials)
                if "rev" in phases:
                    gw.add_policy(inline_policy(ALL_POLICY_ID, ["rev"], "temperature > 25",
                                                ["samplingtime", "temperature", "rainrate"]))
                    results["rev"] = revocation(gw, args.handles, 3 if args.quick else 5,
                                                args.profile_revocation)
            finally:
                for q in list(DirectQuery.live):
                    try:
                        q.stop()
                    except Exception:  # noqa: BLE001
                        pass
                gw.close()
    finally:
        spark.stop()
    summary(results)
    print("load average at the end (other work on the machine skews every figure): "
          f"{' '.join('%.2f' % x for x in os.getloadavg())}")


def summary(results: dict) -> None:
    print("\nsummary                               gateway      direct     ratio   aim")
    for key in ("plain-cold", "plain-warm", "nea-cold"):
        v = results.get("first", {}).get(key)
        if v:
            g, d = statistics.median(v["gateway"]), statistics.median(v["direct"])
            print(f"  first result {key:12s} (s)     {g:8.3f}    {d:8.3f}    {g / d:6.2f}   <= 1.2")
    tp = results.get("tp")
    for mode in ("in-process", "own process"):
        v = (tp or {}).get(mode)
        if v:
            print(f"  tuples/s, reader {mode:12s}     {v['gateway']:9,.0f}   {tp['direct']:9,.0f}"
                  f"    {v['gateway'] / tp['direct']:6.2f}   >= 0.9")
            print(f"    first->last row                 {v['gateway_steady']:9,.0f}   "
                  f"{tp['direct_steady']:9,.0f}    {v['gateway_steady'] / tp['direct_steady']:6.2f}")
    rev = results.get("rev")
    if rev and rev["ms"]:
        print(f"  revocation p50/p99/max (ms)       {pct(rev['ms'], 50):.0f}/{pct(rev['ms'], 99):.0f}"
              f"/{max(rev['ms']):.0f}                         p99 < 500")


if __name__ == "__main__":
    main()
