"""Many streams on one gateway (issue 49): a query per stream against the shared query
(`shared_query`, pep/runtime/shared/), side by side in one run.

Run: .venv/bin/python tests/bench/bench_many_streams.py [--quick] [--handles 1000] [--rate 200]
         [--seconds 30] [--startup 10] [--idle 15] [--scenarios 2:2,8:8,32:32,32:4,128:4,128:0]
         [--sides own,shared] [--trials 1]

A scenario `K:B` is K ingest streams of which B are busy (each `--rate` tuples/s), the others
quiet (no tuple). Each (scenario, side) trial is a fresh process (tests/bench/harness.py's
`run_child`): Spark with the gateway's warm-up and one real gateway as `xsg serve` runs it
(pep.services + pep.http.app + the StreamRuntime, `shared_query` on or off); then
  * K streams, a policy each; `--handles` subjects each open one handle on stream i mod K with a
    band of its own (`v` in [a, a + w), tests/bench/bench_many_readers.py's workload, each tuple
    passing `--pass-rate` of its stream's handles); every handle read as NDJSON over HTTP by
    reader processes of their own;
  * producer processes of their own (at most 4, the busy streams dealt among them) POST
    `PER_CALL` records per call to each busy stream, `--rate` per second each, stamped with
    their send time, for `--seconds`; a row's latency is its arrival at a reader minus that
    stamp, every row owed and never arrived counting as infinitely late; the first
    `--startup` seconds are start-up, the rest steady state;
  * Spark's JVM CPU (harness.spark_cpu_seconds: the JVM's own, and its Python workers apart)
    per second while the tuples come, then per second over `--idle` seconds after the last one
    (every handle still attached, every reader connected): what quiet streams cost.
Everything started is stopped, even on error; every wait is bounded.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_many_readers import (
    ADMIN,
    SCHEMA,
    bounds,
    open_handles,
    owed,
    policy,
    token,
    value,
)
from tests.bench.harness import (
    bench_parser,
    load_average,
    machine,
    pct,
    reply,
    run_child,
    run_command,
    secs,
    sleep_until,
    spark_cpu_seconds,
    with_missing,
)
from tests.bench.readers import ReadJob, reader_result, start_reader, write_start
from tests.bench.served import Gateway

TRIGGER = 0.25  # a stream's own query (the gateway's default)
SHARED_BOUNDS = (0.25, 2.0)  # the shared query's (the gateway's defaults)
PER_CALL = 50
GRACE = 3.0
READER_PROCS = 2


# -- producer process ---------------------------------------------------------------------------

def produce_main(url: str, streams_json: str, rate: int, seconds: float, start_at: float) -> None:
    """From `start_at`, POST PER_CALL records to each of `streams` every PER_CALL / rate s, each
    record stamped with its send time; answers every stream's puts (first seq, count, sent)."""
    streams = json.loads(streams_json)
    period = PER_CALL / rate
    seqs = {s: 0 for s in streams}
    puts: dict[str, list[tuple[int, int, float]]] = {s: [] for s in streams}
    late = 0
    with requests.Session() as session:
        sleep_until(start_at)
        start = time.monotonic()
        k = 0
        while time.monotonic() - start < seconds:
            for stream in streams:
                now = time.time()
                seq = seqs[stream]
                body = "".join(json.dumps({"ts": now, "seq": seq + j, "sent": now,
                                           "v": value(seq + j), "pad": "p" * 40}) + "\n"
                               for j in range(PER_CALL))
                r = session.post(f"{url}/streams/{stream}/records", data=body.encode(),
                                 timeout=30, headers={"Authorization": f"Bearer {ADMIN}",
                                                      "Content-Type": "application/x-ndjson"})
                if r.status_code != 201:
                    raise SystemExit(f"ingest {stream}: {r.status_code} {r.text[:200]}")
                puts[stream].append((seq, PER_CALL, now))
                seqs[stream] = seq + PER_CALL
            k += 1
            wait = start + k * period - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                late += 1
    reply({"puts": puts, "late": late})


# -- one trial ------------------------------------------------------------------------------------

def run_trial(n: int, streams: int, busy: int, shared: bool, rate: int, seconds: float,
              startup: float, idle: float, pass_rate: float, tmp: Path) -> dict[str, Any]:
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    from pep.runtime.session import create_spark_session

    spark = create_spark_session()
    settings = RuntimeSettings(trigger_interval=TRIGGER, shared_query=shared,
                               shared_trigger_min=SHARED_BOUNDS[0],
                               shared_trigger_max=SHARED_BOUNDS[1])
    runtime = StreamRuntime(spark, tmp / "gw" / "runtime", settings=settings)
    gw = Gateway(runtime, tmp / "gw",
                 [{"token": ADMIN, "subject": "nea", "roles": ["data-owner"], "admin": True}]
                 + [{"token": token(i), "subject": f"c{i:05d}", "roles": ["consumer"],
                     "admin": False} for i in range(n)],
                 max_connections=n + 1000, trigger_interval=TRIGGER)
    names = [f"m{streams}s{j}" for j in range(streams)]
    readers: list[tuple[subprocess.Popen[bytes], ReadJob]] = []
    producers: list[subprocess.Popen[str]] = []
    try:
        for name in names:
            r = requests.post(f"{gw.url}/streams", timeout=30, headers={
                "Authorization": f"Bearer {ADMIN}"}, json={
                "name": name, "time_attribute": "ts", "source": {"kind": "ingest"},
                "schema": SCHEMA})
            assert r.status_code == 201, r.text
            r = requests.post(f"{gw.url}/policies", data=policy(name), timeout=30, headers={
                "Authorization": f"Bearer {ADMIN}", "Content-Type": "application/xacml+xml"})
            assert r.status_code == 201, r.text
        t0 = time.perf_counter()
        ids = open_handles(gw, n, names, pass_rate)
        opened = time.perf_counter() - t0
        start_file = str(tmp / "start")
        phases = [(0.0, startup), (startup, seconds)]
        for k in range(READER_PROCS):
            job = ReadJob("127.0.0.1", gw.port,
                          [(i, f"/handles/{ids[i]}", token(i)) for i in range(k, n, READER_PROCS)],
                          str(tmp / f"reader-{k}.out"), ready=str(tmp / f"reader-{k}.ready"),
                          seconds=seconds + idle + 900, phases=phases, start_file=start_file)
            readers.append((start_reader(job), job))
        deadline = time.monotonic() + 120
        while (not all(Path(job.ready).exists() for _, job in readers)  # type: ignore[arg-type]
               and time.monotonic() < deadline):
            time.sleep(0.1)
        time.sleep(2.0)  # the shared query settles on its members
        start_at = time.time() + 1.0
        write_start(readers[0][1], start_at)
        busy_names = names[:busy]
        procs = min(4, busy)
        producers = [subprocess.Popen(
            [sys.executable, __file__, "--produce", gw.url, json.dumps(busy_names[p::procs]),
             str(rate), str(seconds), repr(start_at)], stdout=subprocess.PIPE, text=True)
            for p in range(procs)]
        sleep_until(start_at)
        w0, s0 = time.time(), spark_cpu_seconds()
        puts: dict[str, list] = {}
        late = 0
        for p in producers:
            text = p.communicate(timeout=seconds + 300)[0]
            got = [ln for ln in text.splitlines() if ln.startswith("@@")]
            out = json.loads(got[-1][2:])
            puts.update(out["puts"])
            late += out["late"]
        if not producers:
            sleep_until(start_at + seconds)
        w1, s1 = time.time(), spark_cpu_seconds()
        busy_cpu = [(b - a) / (w1 - w0) for a, b in zip(s0, s1, strict=True)]
        time.sleep(GRACE)
        w2, s2 = time.time(), spark_cpu_seconds()
        time.sleep(idle)
        w3, s3 = time.time(), spark_cpu_seconds()
        idle_cpu = [(b - a) / (w3 - w2) for a, b in zip(s2, s3, strict=True)]
        stats = runtime.stats()
        results = [reader_result(proc, job, 60, stop=True) for proc, job in readers]
        readers = []
    finally:
        for p in producers:
            if p.poll() is None:
                p.kill()
                p.wait()
        for proc, job in readers:
            if proc.poll() is None:
                reader_result(proc, job, 30, stop=True)
        gw.close()
        spark.stop()
    lat: list[list[float]] = [[], []]
    for res in results:
        for k in range(2):
            lat[k] += res["lat"][k]
    absolute = [(start_at + lo, start_at + hi) for lo, hi in phases]
    want = [0, 0]
    for j, name in enumerate(names):
        bands = [bounds(i, n, pass_rate) for i in range(j, n, len(names))]
        for k, count in enumerate(owed([tuple(x) for x in puts.get(name, [])], bands,
                                       absolute)):
            want[k] += count
    batches = [s.get("batches", 0) for s in stats.values()]
    shared_info = next((s["shared_query"] for s in stats.values() if "shared_query" in s), None)
    return {"n": n, "streams": streams, "busy": busy, "shared": shared, "opened_s": opened,
            "rate": rate, "seconds": seconds, "late_calls": late,
            "startup": figures(lat[0], want[0]), "steady": figures(lat[1], want[1]),
            "rows_per_s": (len(lat[0]) + len(lat[1])) / seconds,
            "busy_cpu": busy_cpu, "idle_cpu": idle_cpu,
            "stream_batches": sum(batches), "shared_info": shared_info}


def figures(lat: list[float], want: int) -> dict[str, Any]:
    full = with_missing(lat, want)
    return {"n": want, "got": len(lat), "missing": max(0, want - len(lat)),
            "p50": pct(full, 50), "p95": pct(full, 95), "p99": pct(full, 99)}


def line(r: dict[str, Any]) -> str:
    side = "shared query" if r["shared"] else "query per stream"
    st, up = r["steady"], r["startup"]
    busy = (f"{r['busy']} busy x {r['rate']}/s" if r["busy"] else "all quiet")
    lat = (f"steady p50/p95/p99 {secs(st['p50'])} / {secs(st['p95'])} / {secs(st['p99'])}, "
           f"start-up p95 {secs(up['p95'])}, missing {st['missing'] + up['missing']:,} of "
           f"{st['n'] + up['n']:,}, {r['rows_per_s']:,.0f} rows/s; " if r["busy"] else "")
    return (f"{r['streams']:>4} streams, {busy:<16} {side:<17} {lat}JVM "
            f"{r['busy_cpu'][0]:.2f} cores while ingesting (Python workers "
            f"{r['busy_cpu'][1]:.2f}), {r['idle_cpu'][0]:.3f} idle (workers "
            f"{r['idle_cpu'][1]:.3f}); producers late {r['late_calls']} rounds")


def trial_main(a: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="xsg-bench-streams-") as tmp:
        result = run_trial(**a, tmp=Path(tmp))
    print(line(result), flush=True)
    reply(result)


def main() -> None:
    if run_command({"--produce": (produce_main, (str, str, int, float, float)),
                    "--trial": (trial_main, (json.loads,))}):
        return
    ap = bench_parser("200 handles, 2:2 and 8:2 streams, 12 s (4 s start-up), 5 s idle: a "
                      "smoke run", "rounds of every (scenario, side), the sides alternating")
    ap.add_argument("--handles", type=int, default=1000)
    ap.add_argument("--rate", type=int, default=200, help="tuples/s of each busy stream")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--startup", type=float, default=10.0)
    ap.add_argument("--idle", type=float, default=15.0)
    ap.add_argument("--pass-rate", type=float, default=0.1)
    ap.add_argument("--scenarios", default="2:2,8:8,32:32,32:4,128:4,128:0",
                    help="streams:busy, comma-separated")
    ap.add_argument("--sides", default="own,shared")
    args = ap.parse_args()
    if args.quick:
        args.handles, args.seconds, args.startup, args.idle = 200, 12.0, 4.0, 5.0
        args.scenarios = "2:2,8:2"
        args.trials = 1
    scenarios = [tuple(int(x) for x in s.split(":")) for s in args.scenarios.split(",")]
    sides = [s == "shared" for s in args.sides.split(",")]
    print("machine:", machine())
    results = []
    for k in range(args.trials):
        for streams, busy in scenarios:
            for shared in (sides if k % 2 == 0 else sides[::-1]):
                print(f"\n== {streams} streams, {busy} busy, "
                      f"{'shared query' if shared else 'query per stream'}: a fresh gateway",
                      flush=True)
                trial = {"n": args.handles, "streams": streams, "busy": busy, "shared": shared,
                         "rate": args.rate, "seconds": args.seconds, "startup": args.startup,
                         "idle": args.idle, "pass_rate": args.pass_rate}
                results.append(run_child(__file__, ["--trial", json.dumps(trial)],
                                         timeout=args.seconds + args.idle + 1800, echo=True))
    print(f"\n== summary ({args.handles:,} handles, each tuple to {args.pass_rate:.0%} of its "
          f"stream's handles)")
    for r in results:
        if r:
            print(line(r))
    print("load average at the end:", load_average())


if __name__ == "__main__":
    main()
