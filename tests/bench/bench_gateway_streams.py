"""The stream gateway over HTTP against the direct Spark query a user would write on the same
source.

Run: .venv/bin/python tests/bench/bench_gateway_streams.py [--quick] [--trials 3]
                                                           [--records 50000] [--handles 20]

One real gateway as `xsg serve` runs it (pep.services + pep.http.app + StreamRuntime with its
defaults, on its HTTP server, loopback) in this process; every gateway figure is read over HTTP
by a reader process of its own (tests/bench/harness.py), records are ingested through
`POST /streams/<name>/records` by processes of their own. The direct query (readStream json on
the same files, same schema, filter and projection, each micro-batch's rows brought to the
driver with `toArrow()`) runs twice: as a user writes it, in an application of its own with
Spark's defaults (no maxFilesPerTrigger, the default trigger), and in the gateway's session with
the gateway's settings (0.25 s trigger, 50 files per micro-batch), to show what those cost.
1. request -> first result (start-up): `POST /requests` to the first row at the reader, against
   the direct query's start to its first row, on the same ingest directory while records are
   ingested; cold (the request starts its stream's query) for a plain filter+map policy and for
   NEA's windowed policy (Figure 2), and warm (another consumer's handle keeps the stream's query
   running). Each trial re-creates the streams (a directory of ~1.5 s of records). A direct query
   reads the files already there; a handle starts at its stream's end and waits for a record
   ingested after it opened. No first row within 60 s counts as never.
2. tuples/s (steady state): a backlog of files (half the records pass the filter) linked at once
   into the directory each side reads, once the side's query runs; from the link to the last row
   read. Each side's first run (after the gateway's start, or the user's application's) is the
   start-up figure; then the trials. A run in which a row never arrives has no rate.
3. revocation latency: K live handles of K consumers, read by one reader process, from the start
   of `DELETE /policies/<id>` to each reader's `revoked` event (never: infinitely late).
Every comparison runs `--trials` times, the sides' order rotating. Only loopback traffic; every
loop is bounded; everything started is stopped, even on error.
"""
from __future__ import annotations

import json
import logging
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.direct import (
    FILE_QUERY,
    USER,
    DirectSides,
    UserApp,
    gateway_settings,
    serve_user_app,
    started_user_app,
)
from tests.bench.harness import (
    INF,
    SIDE_NAMES,
    Child,
    backlog_figures,
    backlog_summary,
    backlog_trials,
    bench_parser,
    latency_line,
    link_all,
    load_average,
    machine,
    pct,
    ratio,
    reply,
    rotations,
    run_command,
    secs,
    spread,
)
from tests.bench.readers import reader_result, spawn_reader, submit, wait_ready
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

NEA_POLICY = ROOT / "policies" / "weather" / "nea-weather-policy.xml"
NEA_POLICY_ID = "urn:xsg:example:weather:nea-policy"
PLAIN_POLICY_ID = "urn:xsg:bench:plain"
TP_POLICY_ID = "urn:xsg:bench:tp"
ALL_POLICY_ID = "urn:xsg:bench:all"
FIELDS = (("samplingtime", "timestamp"), ("temperature", "double"), ("humidity", "double"),
          ("solarradiation", "double"), ("rainrate", "double"), ("windspeed", "double"),
          ("winddirection", "long"), ("barometer", "double"))
PLAIN = ("temperature > 30", ["samplingtime", "temperature", "rainrate"])
NEA = ("rainrate > 5", ["samplingtime", "rainrate", "windspeed"])  # what NEA's policy grants LTA
TP = ("temperature > 28.5", ["samplingtime", "temperature", "humidity", "rainrate"])  # half pass
FIRST_ROW_TIMEOUT = 60.0
SIDES = ("gateway", "user", "gateway-settings")
SINCE = "the files appeared"


# -- records ---------------------------------------------------------------------------------------

class RecordMaker:
    """Weather records with increasing sampling times: temperature uniform in 24-33 (about a
    third above 30, half above 28.5), about 2/3 with rainrate > 5."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.t = datetime(2024, 5, 1, tzinfo=UTC)

    def make(self, n: int) -> list[dict[str, Any]]:
        out = []
        for i in range(n):
            r = self.rnd
            self.t += timedelta(seconds=1)
            out.append({"samplingtime": self.t.strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "temperature": round(r.uniform(24, 33), 2),
                        "humidity": round(r.uniform(50, 95), 1),
                        "solarradiation": round(r.uniform(0, 900), 1),
                        "rainrate": round(r.uniform(0, 5) if i % 3 == 0
                                          else r.uniform(5.01, 80), 2),
                        "windspeed": round(r.uniform(0, 40), 2), "winddirection": r.randrange(360),
                        "barometer": round(r.uniform(1000, 1020), 1)})
        return out


def ndjson(records: list[dict[str, Any]]) -> bytes:
    return ("\n".join(json.dumps(r) for r in records) + "\n").encode()


def ingest_main(url: str, stream: str, per_batch: int, period: float, seed: int,
                max_seconds: float) -> None:
    """The owner appends `per_batch` records every `period` s through the API, until SIGTERM
    (or `max_seconds`)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    maker = RecordMaker(seed)
    batches, errors = 0, []
    deadline = time.monotonic() + max_seconds
    with requests.Session() as s:
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                r = s.post(f"{url}/streams/{stream}/records", timeout=30,
                           data=ndjson(maker.make(per_batch)), headers=hdr(ADMIN_TOKEN, **NDJSON))
                if r.status_code != 201:
                    errors.append(f"{r.status_code} {r.text[:200]}")
                batches += 1
            except requests.RequestException as exc:
                errors.append(repr(exc))
            stop.wait(period)
    reply({"batches": batches, "errors": errors[:3]})


def ingest(gw: Gateway, stream: str, seed: int) -> Child:
    """An ingest process: 20 records every 0.1 s into `stream` until stopped."""
    return Child(__file__, ["--ingest", gw.url, stream, 20, 0.1, seed, 900])


# -- the direct query: tests/bench/harness.py's FileQuery on the stream's files --------------------

SCHEMA = ", ".join(f"{n} {t}" for n, t in FIELDS) + ", _xsg_seq long"  # as the ingest writes them


# -- the bench -------------------------------------------------------------------------------------

class Bench:
    def __init__(self, spark: Any, gw: Gateway, app: UserApp, tmp: Path) -> None:
        self.spark, self.gw, self.app, self.tmp = spark, gw, app, tmp
        self.sides = DirectSides(spark, app, FILE_QUERY)
        self.count = 0

    def out(self, name: str) -> Path:
        self.count += 1
        return self.tmp / f"{name}-{self.count}.out"

    def direct(self, side: str, op: str, **args: Any) -> dict[str, Any]:
        return self.sides.run(side, op, schema=SCHEMA, **args)

    def gateway_first_row(self, token: str, body: bytes, media: str) -> dict[str, Any]:
        """POST /requests -> the first row at a reader process (spawned ahead, waiting for the
        handle), and the POST's own round trip; releases the handle."""
        out = self.out("first")
        proc = spawn_reader(str(out))
        started = time.time()
        opened = self.gw.open(token, body, media)
        answered = time.time()
        job = self.gw.reader([(0, opened["handle"], token)], out, want=1,
                             seconds=FIRST_ROW_TIMEOUT)
        submit(job)
        try:
            got = reader_result(proc, job, FIRST_ROW_TIMEOUT + 30)
        finally:
            self.gw.release(token, opened["handle"])
        return {"first": (got["first"] - started) if got["first"] else INF,
                "post": answered - started, "errors": got["errors"]}

    def gateway_backlog(self, stream: str, staging: Path, expected: int, trial: str,
                        timeout: float) -> dict[str, Any]:
        """A handle opened (its stream's query starts), read by a reader process; then the
        backlog's files linked into the stream's ingest directory at once."""
        token = consumer_token(2)
        opened = self.gw.open(token, request_json(stream))
        try:
            job = self.gw.reader([(0, opened["handle"], token)], self.out("tp"), want=expected,
                                 seconds=timeout, ready=str(self.tmp / f"tp-{trial}.ready"))
            proc = spawn_reader(job.out)
            submit(job)
            if not wait_ready(job, 60):
                raise RuntimeError("the reader process did not connect")
            with BatchSplit() as split:
                start = time.time()
                link_all(staging, self.gw.ingest_dir(stream), f"{trial}-")
                got = reader_result(proc, job, timeout + 60)
        finally:
            self.gw.release(token, opened["handle"])
        return {"rows": got["rows"], "lost": got["lost"], "start": start, "first": got["first"],
                "last": got["last"], "errors": got["errors"], "split": split.summary()}

    def streams(self, names: list[str]) -> None:
        """(Re-)create the ingest streams `names`: a fresh, empty directory each."""
        for name in names:
            requests.delete(f"{self.gw.url}/streams/{name}", headers=hdr(ADMIN_TOKEN), timeout=60)
            self.gw.register(name, list(FIELDS), {"kind": "ingest"}, "samplingtime")


class BatchSplit(logging.Handler):
    """The shared executor's own per-batch timing (its DEBUG line: plan table, the evaluation
    job incl. toArrow, routing to handles incl. delivery into their buffers)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.batches: list[tuple[float, float, float]] = []
        self.logger = logging.getLogger("pep.runtime.query.runner")
        self.level_before = self.logger.level

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith("batch %s: table"):
            self.batches.append(tuple(record.args[1:4]))  # type: ignore[index,arg-type]

    def __enter__(self) -> BatchSplit:
        self.logger.addHandler(self)
        self.logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_before)

    def summary(self) -> str:
        if not self.batches:
            return "no batch timings captured"
        t, e, r = (sum(b[i] for b in self.batches) for i in range(3))
        return (f"{len(self.batches)} batches: plan table {t:.2f} s, evaluation job + toArrow "
                f"{e:.2f} s, routing + delivery to the handle buffer {r:.2f} s")


# -- 1. request -> first result --------------------------------------------------------------------

def first_result(bench: Bench, trials: int) -> dict[str, Any]:
    gw = bench.gw
    lta = consumer_token(0)
    nea_body = (ROOT / "policies" / "weather" / "lta-request.xml").read_bytes()
    cases = {"plain-cold": ("fr", PLAIN, request_json("fr"), "application/xacml+json"),
             "nea-cold": ("weather", NEA, nea_body, "application/xacml+xml")}
    keys = (*cases, "plain-warm")
    out: dict[str, dict[str, list[float]]] = {k: {s: [] for s in (*SIDES, "post")} for k in keys}
    fresh: dict[str, dict[str, float]] = {k: {} for k in keys}
    print(f"\n1. request -> first result: a first round right after the gateway and the user's "
          f"application started, then {trials} trial(s), the sides' order rotating (cold: the "
          "request starts its stream's query; warm: another consumer's handle keeps it running)")
    for k, order in enumerate([SIDES, *rotations(SIDES, trials)]):
        bench.streams(["fr", "weather", "fw"])
        ingests = [ingest(gw, s, seed=10 * k + i) for i, s in enumerate(("fr", "weather", "fw"))]
        keeper = None
        try:
            time.sleep(1.5)  # a few files in each directory before the first query
            keeper = gw.open(consumer_token(1), request_json("fw"))
            keep_job = gw.reader([(0, keeper["handle"], consumer_token(1))], bench.out("keep"),
                                 want=10**9, seconds=900)
            keep_proc = spawn_reader(keep_job.out)
            submit(keep_job)
            for key, (stream, (cond, cols), body, media) in cases.items():
                for side in order:
                    if side == "gateway":
                        got = bench.gateway_first_row(lta, body, media)
                        out[key]["post"].append(got["post"])
                    else:
                        got = bench.direct(side, "first_row",
                                           directory=str(gw.ingest_dir(stream)), condition=cond,
                                           columns=cols, timeout=FIRST_ROW_TIMEOUT)
                    out[key][side].append(got["first"])
            time.sleep(1.0)  # the kept stream's query has caught up
            got = bench.gateway_first_row(lta, request_json("fw"), "application/xacml+json")
            out["plain-warm"]["gateway"].append(got["first"])
            out["plain-warm"]["post"].append(got["post"])
        finally:
            if keeper is not None:
                gw.release(consumer_token(1), keeper["handle"])
                reader_result(keep_proc, keep_job, 30, stop=True)
            for ing in ingests:
                res = ing.stop()
                if res.get("errors"):
                    print(f"  ingest: {res['errors'][0]}")
        line = "; ".join(f"{key} " + ", ".join(f"{s} {secs(v[s][-1])}" for s in SIDES if v[s])
                         for key, v in out.items())
        print(f"  {'after a fresh start' if k == 0 else f'trial {k}'}: {line}")
        if k == 0:  # the start-up figure, apart from the trials
            for key, v in out.items():
                fresh[key] = {s: v[s].pop() for s in (*SIDES, "post") if v[s]}
    for key, v in out.items():
        print(f"  {key:10s}: " + ", ".join(f"{SIDE_NAMES[s]} {spread(v[s], '{:.3f}')} s"
                                           for s in SIDES if v[s])
              + f"; POST /requests itself {spread([p * 1000 for p in v['post']], '{:.0f}')} ms")
    return {"runs": out, "fresh": fresh}


# -- 2. tuples per second --------------------------------------------------------------------------

def stage_records(directory: Path, total: int, per_file: int, condition: str) -> int:
    """The records as the ingest writes them (JSON lines with `_xsg_seq`), in files that sort in
    stream order; returns how many pass `condition` (`temperature > X`)."""
    bound = float(condition.split(">")[1])
    maker = RecordMaker(99)
    seq = passing = 0
    for i in range(total // per_file):
        records = maker.make(per_file)
        for r in records:
            r["_xsg_seq"] = seq
            seq += 1
            passing += r["temperature"] > bound
        (directory / f"{i:06d}.json").write_bytes(ndjson(records))
    return passing


def throughput(bench: Bench, total: int, per_file: int, trials: int,
               timeout: float) -> dict[str, Any]:
    staging = bench.tmp / "tp-staging"
    staging.mkdir()
    cond, cols = TP
    expected = stage_records(staging, total, per_file, cond)
    print(f"\n2. throughput: a backlog of {total:,} records in {total // per_file} files of "
          f"{per_file}, {expected:,} pass {cond!r}")
    bench.streams(["tp"])
    runs = 0

    def run(side: str) -> dict[str, Any]:
        nonlocal runs
        runs += 1
        if side == "gateway":
            res = bench.gateway_backlog("tp", staging, expected, f"t{runs}", timeout)
        else:
            res = bench.direct(side, "backlog", wait=timeout + 300, staging=str(staging),
                               directory=str(bench.tmp / f"direct-{runs}"), condition=cond,
                               columns=cols, expected=expected, timeout=timeout)
        return backlog_figures(res, expected)

    out = backlog_trials(run, SIDES, trials, SINCE)
    shutil.rmtree(staging, ignore_errors=True)
    return out


# -- 3. revocation latency ------------------------------------------------------------------------

def revocation(bench: Bench, k: int, rounds: int, profile: bool = False) -> dict[str, Any]:
    gw = bench.gw
    stream = "rev"
    bench.streams([stream])
    policy = inline_policy(ALL_POLICY_ID, [stream], "temperature > 25",
                           ["samplingtime", "temperature", "rainrate"])
    feed = ingest(gw, stream, seed=5)
    latencies: list[float] = []
    delete_rt: list[float] = []
    prof = None
    print(f"\n3. revocation latency, {k} live handles x {rounds} rounds (DELETE /policies start "
          "-> each reader's revoked event)")
    try:
        for rnd in range(rounds):
            gw.add_policy(policy)
            tokens = [consumer_token(3 + i) for i in range(k)]
            handles = [gw.open(t, request_json(stream))["handle"] for t in tokens]
            job = gw.reader(
                [(i, h, t) for i, (h, t) in enumerate(zip(handles, tokens, strict=True))],
                bench.out("rev"),
                seconds=120,
                ready=str(bench.tmp / f"rev-{rnd}.ready"),
            )
            proc = spawn_reader(job.out)
            submit(job)
            wait_ready(job, 60)
            time.sleep(2.0)  # rows flow to every reader
            if profile and rnd == rounds - 1:
                # the same deletion as DELETE /policies/<id> minus HTTP, in this thread so that
                # cProfile sees the revocation (the policy event is handled synchronously)
                import cProfile
                prof = cProfile.Profile()
                t0 = time.time()
                prof.enable()
                gw.services.policies.delete(ALL_POLICY_ID, owner="nea")
                prof.disable()
                t_ret = time.time()
            else:
                t0 = time.time()
                gw.delete_policy(ALL_POLICY_ID)
                t_ret = time.time()
            delete_rt.append(t_ret - t0)
            got = reader_result(proc, job, 30)
            lat = [t - t0 for t in got["revoked"]]
            latencies.extend(lat)
            latencies.extend([INF] * (k - len(lat)))
            print(f"  round {rnd + 1}: DELETE answered in {(t_ret - t0) * 1000:.0f} ms; "
                  f"`revoked` at {len(lat)}/{k} readers, max "
                  f"{secs(max(lat) if len(lat) == k else INF, 'ms')}; rows after it "
                  f"{got['after_final']}" + (f"; errors {got['errors']}" if got["errors"] else ""))
        if prof is not None:
            import pstats
            print("  profile of the last round's deletion (in-process, no HTTP), by cumulative "
                  "time:")
            pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(30)
    finally:
        feed.stop()
    print(f"  {latency_line([x for x in latencies if x != INF], len(latencies), 'ms')}; "
          f"DELETE round trip median {statistics.median(delete_rt) * 1000:.0f} ms "
          "(aim p99 < 500 ms)")
    return {"lat": latencies, "delete": delete_rt}


# -- main ------------------------------------------------------------------------------------------

def main() -> None:
    if run_command({"--user-app": (lambda: serve_user_app(FILE_QUERY), ()),
                    "--ingest": (ingest_main, (str, str, int, float, int, float))}):
        return
    parser = bench_parser("a smoke run (one trial, smaller sizes)")
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--only", default="first,tp,rev",
                        help="phases to run: first (first result), tp (throughput), rev")
    parser.add_argument("--per-file", type=int, default=200, help="records per ingest batch")
    parser.add_argument("--handles", type=int, default=20, help="live handles for revocation")
    parser.add_argument("--timeout", type=float, default=600.0, help="per throughput run")
    parser.add_argument("--profile-revocation", action="store_true",
                        help="delete the policy of the last revocation round in-process, "
                             "under cProfile, and print the profile")
    args = parser.parse_args()
    trials = 1 if args.quick else args.trials
    total = 10_000 if args.quick else args.records
    per_file = 50 if args.quick else args.per_file
    print("machine:", machine())
    from pep.runtime.runtime import StreamRuntime

    print(f"sides: gateway (its defaults); {SIDE_NAMES['user']} ({USER.describe()}, an "
          f"application of its own); {SIDE_NAMES['gateway-settings']} "
          f"({gateway_settings().describe()}, in the gateway's session)")
    results: dict[str, Any] = {}
    phases = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="xsg-bench-gw-") as tmp_dir, ExitStack() as stack:
        tmp = Path(tmp_dir)
        spark = started_spark(stack)
        gw = Gateway(StreamRuntime(spark, tmp / "gw" / "runtime"), tmp / "gw",
                     accounts(3 + args.handles))
        stack.callback(gw.close)
        bench = Bench(spark, gw, started_user_app(stack, __file__), tmp)
        gw.add_policy(NEA_POLICY.read_bytes())
        gw.add_policy(inline_policy(PLAIN_POLICY_ID, ["fr", "fw"], *PLAIN))
        gw.add_policy(inline_policy(TP_POLICY_ID, ["tp"], *TP))
        if "first" in phases:
            results["first"] = first_result(bench, trials)
        if "tp" in phases:
            results["tp"] = throughput(bench, total, per_file, trials, args.timeout)
        if "rev" in phases:
            results["rev"] = revocation(bench, args.handles, 3 if args.quick else 5,
                                        args.profile_revocation)
    summary(results)
    print("load average at the end:", load_average())


def summary(results: dict[str, Any]) -> None:
    print("\nsummary (median of the trials, lowest-highest)")
    if results.get("first"):
        first, fresh = results["first"]["runs"], results["first"]["fresh"]
        print("  request -> first result (s); right after a fresh start apart")
        for key, v in first.items():
            parts = [f"{SIDE_NAMES[s]} {spread(v[s], '{:.3f}')} (fresh {secs(fresh[key][s])})"
                     for s in SIDES if v[s]]
            print(f"    {key:10s}: " + "; ".join(parts))
        for key in ("plain-cold", "nea-cold", "plain-warm"):
            direct = first["plain-cold" if key == "plain-warm" else key]
            g = statistics.median(first[key]["gateway"])
            print(f"    {key:10s}: gateway / {SIDE_NAMES['user']} "
                  f"{ratio(g, statistics.median(direct['user']))}, gateway / "
                  f"{SIDE_NAMES['gateway-settings']} "
                  f"{ratio(g, statistics.median(direct['gateway-settings']))}"
                  + (" (the direct figures of plain-cold: a direct query has no warm start)"
                     if key == "plain-warm" else ""))
    tp = results.get("tp")
    if tp:
        backlog_summary(tp, SIDES, "from the files' appearance to the last row read")
    rev = results.get("rev")
    if rev and rev["lat"]:
        ms = rev["lat"]
        print(f"  revocation p50 {secs(pct(ms, 50), 'ms')}, p99 {secs(pct(ms, 99), 'ms')}, max "
              f"{secs(max(ms), 'ms')} (aim p99 < 500 ms)")


if __name__ == "__main__":
    main()
