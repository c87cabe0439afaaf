"""Delivery through one process against delivery through plan topics and edges, side by side in
one run: ingest-to-reader latency (start-up and steady state, rows that never arrive infinitely
late) and revocation (each reader's `revoked` from the DELETE's start).

Run: .venv/bin/python tests/bench/bench_edges.py [--quick] [--handles 100] [--trials 3]
         [--rate 200] [--seconds 45] [--startup 15] [--pass-rate 0.1] [--edges 1,2]

The workload is bench_many_readers' (its ingest process, its handles: each a band of `v` of its
own, passing about `--pass-rate` of the tuples; its reader processes over raw sockets). Each
side of a trial is a fresh gateway in a process of its own (Spark with the gateway's warm-up):
  * `process`: `delivery = "process"`, the readers read the gateway;
  * `edges-K`: `delivery = "kafka"` on a real PostgreSQL store (tests/pg_server.py) and a real
    broker (tests/kafka/broker.py), both started once for the run; K edges (`xsg edge`, a
    process each) and the handles' readers spread over them (handle i on edge i mod K).
The sides' order rotates between trials. Revocation: with every reader connected, the owner
deletes the policy behind all the handles; with edges the DELETE answers after every edge
acknowledged (`pep.delivery.control`). Rows owed that never arrived are told apart: missing
before a reader's last row (lost) or after it (on their way when its stream ended), with the
readers' final events by kind and reason.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench import bench_many_readers as many
from tests.bench.harness import (
    bench_parser,
    load_average,
    machine,
    reply,
    rotations,
    run_child,
    run_command,
    secs,
    sleep_until,
    spread,
)
from tests.bench.readers import ReadJob, reader_result, start_reader, write_start
from tests.bench.served import Gateway

TRIGGER = 0.25


def start_edges(k: int, tmp: Path, store: str, brokers: str, auth: Path
                ) -> list[tuple[subprocess.Popen[bytes], int]]:
    """K edges (`xsg edge`), each a process of its own; (process, port) each once listening."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XSG_STORE": store,
           "XSG_DELIVERY_BROKERS": brokers, "XSG_DELIVERY_SECURITY_PROTOCOL": "PLAINTEXT"}
    out = []
    for j in range(k):
        log = tmp / f"edge-{j}.out"
        with open(log, "wb") as f:
            proc = subprocess.Popen([sys.executable, "-u", "-m", "pep.cli", "edge", "--port", "0",
                                     "--id", f"bench-edge-{j}", "--auth", str(auth),
                                     "--log-level", "WARNING"],
                                    stdout=f, stderr=subprocess.STDOUT, env=env,
                                    stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        port = None
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith(f"xsg edge bench-edge-{j} on "):
                    port = int(line.split()[4].rsplit(":", 1)[1])
            time.sleep(0.1)
        if port is None:
            proc.kill()
            raise RuntimeError(f"edge {j} did not start: {log.read_text()[-2000:]}")
        out.append((proc, port))
    return out


def run_side(side: str, n: int, rate: int, seconds: float, startup: float, pass_rate: float,
             store: str, brokers: str, tmp: Path) -> dict[str, Any]:
    """One side of a trial in this process: Spark and the gateway (and its edges), the handles
    and their readers, the ingest, the revocation."""
    from pep.delivery.settings import DeliverySettings
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    from pep.runtime.session import create_spark_session

    k = int(side.split("-")[1]) if side.startswith("edges") else 0
    delivery = DeliverySettings(brokers, security_protocol="PLAINTEXT") if k else None
    spark = create_spark_session()
    runtime = StreamRuntime(spark, tmp / "gw" / "runtime", settings=RuntimeSettings(
        trigger_interval=TRIGGER, delivery=delivery))
    config: dict[str, Any] = {"max_connections": n + 1000, "trigger_interval": TRIGGER}
    if k:
        config.update(store=store, delivery="kafka", delivery_brokers=brokers,
                      delivery_security_protocol="PLAINTEXT")
    gw = Gateway(runtime, tmp / "gw",
                 [{"token": many.ADMIN, "subject": "nea", "roles": ["data-owner"], "admin": True}]
                 + [{"token": many.token(i), "subject": f"c{i:05d}", "roles": ["consumer"],
                     "admin": False} for i in range(n)], **config)
    edges = start_edges(k, tmp, store, brokers, tmp / "gw" / "auth.json") if k else []
    stream = f"edges{n}{side.replace('-', '')}{int(time.time()) % 10000}"
    readers: list[tuple[subprocess.Popen[bytes], ReadJob]] = []
    ingest: subprocess.Popen[str] | None = None
    try:
        r = requests.post(f"{gw.url}/streams", timeout=30, json={
            "name": stream, "time_attribute": "ts", "source": {"kind": "ingest"},
            "schema": many.SCHEMA}, headers={"Authorization": f"Bearer {many.ADMIN}"})
        assert r.status_code == 201, r.text
        r = requests.post(f"{gw.url}/policies", data=many.policy(stream), timeout=30, headers={
            "Authorization": f"Bearer {many.ADMIN}", "Content-Type": "application/xacml+xml"})
        assert r.status_code == 201, r.text
        ids = many.open_handles(gw, n, [stream], pass_rate)
        phases = [(0.0, startup), (startup, seconds)]
        start_file = str(tmp / "start")
        targets = [gw.port] if not k else [port for _, port in edges]
        for j, port in enumerate(targets):
            job = ReadJob("127.0.0.1", port,
                          [(i, f"/handles/{ids[i]}", many.token(i))
                           for i in range(j, n, len(targets))],
                          str(tmp / f"reader-{j}.out"), ready=str(tmp / f"reader-{j}.ready"),
                          seconds=seconds + 900, phases=phases, start_file=start_file)
            readers.append((start_reader(job), job))
        deadline = time.monotonic() + 120
        while (not all(Path(str(job.ready)).exists() for _, job in readers)
               and time.monotonic() < deadline):
            time.sleep(0.1)
        start_at = time.time() + 1.0
        write_start(readers[0][1], start_at)
        absolute = [(start_at + lo, start_at + hi) for lo, hi in phases]
        ingest = subprocess.Popen([sys.executable, many.__file__, "--ingest", gw.url, stream,
                                   str(rate), str(seconds), "0", repr(start_at)],
                                  stdout=subprocess.PIPE, text=True)
        sleep_until(start_at)
        text = ingest.communicate(timeout=seconds + 120)[0]
        out = json.loads([ln for ln in text.splitlines() if ln.startswith("@@")][-1][2:])
        time.sleep(many.GRACE)
        t_revoke = time.time()
        r = requests.delete(f"{gw.url}/policies/urn:bench:many:{stream}", timeout=300,
                            headers={"Authorization": f"Bearer {many.ADMIN}"})
        assert r.status_code in (200, 204), r.text
        revoke_call = time.time() - t_revoke
        results = [reader_result(proc, job, 120) for proc, job in readers]
    finally:
        if ingest is not None and ingest.poll() is None:
            ingest.kill()
            ingest.wait()
        for proc, job in readers:
            if proc.poll() is None:
                reader_result(proc, job, 30, stop=True)
        for j, (proc, _) in enumerate(edges):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            said = [ln for ln in (tmp / f"edge-{j}.out").read_text(errors="replace").splitlines()
                    if " WARNING " in ln or " ERROR " in ln]
            for line in said[:5]:  # an edge that stopped serving says why
                print(f"  edge {j}: {line}")
        gw.close()
        spark.stop()
    lat: list[list[float]] = [[], []]
    revoked: list[float] = []
    after = gaps = 0
    errors: list[str] = []
    for res in results:
        for j in range(2):
            lat[j] += res["lat"][j]
        revoked += [t - t_revoke for t in res["revoked"]]
        after += res["after_final"]
        gaps += res["gaps"]
        errors += res["errors"]
    bands = [many.bounds(i, n, pass_rate) for i in range(n)]
    want = many.owed(out["puts"], bands, absolute)
    holes, cut = missing(out["puts"], bands, (absolute[0][0], absolute[-1][1]),
                         {int(i): t for res in results for i, t in res.get("tops", {}).items()})
    return {"side": side, "n": n, "phases": [many.phase_figures(lat[j], want[j])
                                             for j in range(2)],
            "revoke_call": revoke_call, "revoked": many.phase_figures(revoked, n),
            "after_revoked": after, "gaps": gaps, "errors": errors[:5],
            "missing_before_last": holes, "missing_after_last": cut,
            "readers": [{"rows": res["rows"], "open": res["still_open"],
                         "finals": res["finals"], "reasons": res.get("reasons", {})}
                        for res in results]}


def missing(puts: list[tuple[int, int, float]], bands: list[tuple[float, float]],
            window: tuple[float, float], tops: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """Rows owed that never arrived, split: (those below the highest seq the handle's reader
    got, lost in the middle of its stream; those above it, still on their way when the
    revocation ended the stream)."""
    before = [0] * len(bands)
    after = [0] * len(bands)
    for first, count, sent in puts:
        if not window[0] <= sent < window[1]:
            continue
        for seq in range(first, first + count):
            v = many.value(seq)
            for i, (a, b) in enumerate(bands):
                if a <= v < b:
                    rows, top = tops.get(i, (0, -1))
                    if seq <= top:
                        before[i] += 1
                    else:
                        after[i] += 1
    got = {i: t[0] for i, t in tops.items()}
    return (sum(max(0, before[i] - got.get(i, 0)) for i in range(len(bands))), sum(after))


def report(r: dict[str, Any]) -> None:
    up, steady = r["phases"]
    rv = r["revoked"]
    print(f"  {r['side']:>8}: p95 start-up {secs(up['p95'])} (max {secs(up['max'])}), steady "
          f"{secs(steady['p95'])} ({steady['arrived']:,} of {steady['owed']:,} rows); revocation "
          f"p99 {secs(rv['p99'], 'ms')} (DELETE {r['revoke_call'] * 1000:.0f} ms); rows after "
          f"`revoked` {r['after_revoked']}, gaps {r['gaps']}; rows owed that never arrived: "
          f"{r['missing_before_last']} before a reader's last row, "
          f"{r['missing_after_last']} after it"
          + (f"; errors {r['errors']}" if r["errors"] else ""))
    if any(x["open"] or set(x["finals"]) - {"revoked"} for x in r["readers"]):  # not all revoked
        print(f"    reader processes: {r['readers']}")


def side_main(a: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="xsg-bench-edges-") as tmp:
        figures = run_side(**a, tmp=Path(tmp))
    report(figures)
    reply(figures)


def main() -> None:
    if run_command({"--side": (side_main, (json.loads,))}):
        return
    ap = bench_parser("one trial of 20 s (10 s start-up) at 20 handles, a smoke run",
                      "trials, the sides' order rotating")
    ap.add_argument("--handles", type=int, default=100)
    ap.add_argument("--rate", type=int, default=200, help="tuples ingested per second")
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--startup", type=float, default=15.0)
    ap.add_argument("--pass-rate", type=float, default=0.1)
    ap.add_argument("--edges", default="1,2", help="edge counts, comma-separated")
    args = ap.parse_args()
    if args.quick:
        args.trials, args.seconds, args.startup, args.handles = 1, 20.0, 10.0, 20
    from tests.kafka.broker import KafkaBroker
    from tests.pg_server import start_server

    sides = ["process"] + [f"edges-{int(k)}" for k in args.edges.split(",")]
    print("machine:", machine("confluent_kafka"), f"; {args.handles} handles, {args.rate} "
          f"tuples/s, {args.pass_rate:.0%} of the handles per tuple")
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory(prefix="xsg-bench-edges-") as tmp:
        postgres = start_server()
        broker = KafkaBroker(Path(tmp) / "kafka")
        broker.start()
        try:
            for k, order in enumerate(rotations(sides, args.trials)):
                print(f"\n== trial {k + 1}")
                for side in order:
                    a = {"side": side, "n": args.handles, "rate": args.rate,
                         "seconds": args.seconds, "startup": args.startup,
                         "pass_rate": args.pass_rate, "store": postgres.new_url(),
                         "brokers": broker.bootstrap}
                    results[side].append(run_child(__file__, ["--side", json.dumps(a)],
                                                   timeout=args.seconds + 1200, echo=True))
        finally:
            broker.stop()
            postgres.close()
    print("\n== summary (median and range over the trials)")
    for side, runs in results.items():
        start = spread((r['phases'][0]['p95'] for r in runs), '{:.2f}')
        print(f"  {side:>8}: p95 start-up {start} s, "
              f"steady {spread((r['phases'][1]['p95'] for r in runs), '{:.3f}')} s, revocation "
              f"p99 {spread(r['revoked']['p99'] * 1000 for r in runs)} ms")
    print("load average at the end:", load_average())


if __name__ == "__main__":
    main()
