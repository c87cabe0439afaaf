"""Delivery through one process against delivery through plan topics and edges, side by side in
one run: ingest-to-reader latency (start-up and steady state, rows that never arrive infinitely
late) and revocation (each reader's `revoked` from the DELETE's start).

Run: .venv/bin/python tests/bench/bench_edges.py [--quick] [--handles 1000,5000] [--trials 3]
         [--rate 200] [--seconds 45] [--startup 15] [--pass-rate 0.1] [--edges 1,2,4]
         [--no-process] [--reader-procs 4]

The workload is bench_many_readers' (its ingest process, its handles: each a band of `v` of its
own, passing about `--pass-rate` of the tuples; its reader processes over raw sockets). Each
side of a trial is a fresh gateway in a process of its own (Spark with the gateway's warm-up):
  * `process`: `delivery = "process"`, the readers read the gateway;
  * `edges-K`: `delivery = "kafka"` on a real PostgreSQL store (tests/pg_server.py) and a real
    broker (tests/kafka/broker.py), both started once for the run; K edges (`xsg edge`, a
    process each) and the handles' readers spread over them as the gateway's redirect and the
    proxy place them: the readers of one plan topic on one edge, the edge first in the
    rendezvous order of the topic's key (`common/edge_affinity.py`; the handles' topics read
    from the store).
A reader answered 429 or 503 with `Retry-After` (an edge at its connection limit, one whose
store check did not come within 5 s, one that lost the brokers) asks again after it, as the
edges tell clients to; how many were refused is printed with the side's figures.
The sides' order rotates between trials. Revocation: with every reader connected, the owner
deletes the policy behind all the handles; with edges the DELETE answers after every edge
acknowledged (`pep.delivery.control`). Rows owed that never arrived are told apart: missing
before a reader's last row (lost) or after it (on their way when its stream ended), with the
readers' final events by kind and reason.
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

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench import bench_many_readers as many
from tests.bench.harness import (
    bench_parser,
    load_average,
    machine,
    ratio,
    reply,
    rotations,
    run_child,
    run_command,
    secs,
    sleep_until,
    spark_cpu_seconds,
    spread,
)
from tests.bench.readers import ReadJob, reader_result, start_reader, write_start
from tests.bench.served import Gateway

TRIGGER = 0.25


def start_edges(k: int, tmp: Path, store: str, brokers: str, auth: Path, readers: int
                ) -> list[tuple[subprocess.Popen[bytes], int]]:
    """K edges (`xsg edge`), each a process of its own; (process, port) each once listening.
    Each may hold every reader (`max_connections`, 4,096 by default: one edge takes 5,000)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XSG_STORE": store,
           "XSG_DELIVERY_BROKERS": brokers, "XSG_DELIVERY_SECURITY_PROTOCOL": "PLAINTEXT",
           "XSG_MAX_CONNECTIONS": str(readers + 1000)}
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


def placement(store: str, ids: list[str], ports: list[int]) -> list[list[int]]:
    """Per edge (by port), the indexes of the handles whose reads go there: the first in the
    rendezvous order of its plan topic's key, as the gateway's redirect and the proxy choose
    (`common.edge_affinity`)."""
    import psycopg

    from common.edge_affinity import affinity_key, rendezvous
    from pep.delivery.lanes import kafka_topic

    with psycopg.connect(store) as conn:
        bound = dict(conn.execute("SELECT handle_id, topic FROM delivery_handles").fetchall())
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    out: list[list[int]] = [[] for _ in ports]
    for i, handle in enumerate(ids):
        dest = bound.get(handle)
        first = urls.index(rendezvous(urls, affinity_key(kafka_topic(dest)))[0]) if dest \
            else i % len(ports)
        out[first].append(i)
    return out


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds a process used so far (/proc/<pid>/stat); nan if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raise_fd_limit() -> int:
    """The soft limit of open files raised to the hard one (inherited by the children)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def usage(edges: list[int]) -> dict[str, Any]:
    """CPU seconds so far: each edge's, this (the gateway's) process's, Spark's JVM and its
    Python workers'."""
    jvm, workers = spark_cpu_seconds()
    return {"edges": [cpu_seconds(pid) for pid in edges], "gateway": cpu_seconds(os.getpid()),
            "jvm": jvm, "workers": workers, "at": time.monotonic()}


def run_side(side: str, n: int, rate: int, seconds: float, startup: float, pass_rate: float,
             store: str, brokers: str, tmp: Path, procs: int = 4) -> dict[str, Any]:
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
    edges = start_edges(k, tmp, store, brokers, tmp / "gw" / "auth.json", n) if k else []
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
        opening = time.monotonic()
        ids = many.open_handles(gw, n, [stream], pass_rate)
        opened = time.monotonic() - opening
        phases = [(0.0, startup), (startup, seconds)]
        start_file = str(tmp / "start")
        targets = [gw.port] if not k else [port for _, port in edges]
        placed = placement(store, ids, targets) if k else [list(range(n))]
        # reader process j reads edge j mod K's handles, every (P / K)-th of them from j // K
        # on (P a multiple of K)
        p = -(-max(procs, len(targets)) // len(targets)) * len(targets)
        for j in range(p):
            share = placed[j % len(targets)][j // len(targets)::p // len(targets)]
            job = ReadJob("127.0.0.1", targets[j % len(targets)],
                          [(i, f"/handles/{ids[i]}", many.token(i)) for i in share],
                          str(tmp / f"reader-{j}.out"), ready=str(tmp / f"reader-{j}.ready"),
                          seconds=seconds + 900, phases=phases, start_file=start_file,
                          retry=True)
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
        sleep_until(start_at - 0.2)
        cpu_before = usage([proc.pid for proc, _ in edges])
        text = ingest.communicate(timeout=seconds + 120)[0]
        out = json.loads([ln for ln in text.splitlines() if ln.startswith("@@")][-1][2:])
        time.sleep(many.GRACE)
        cpu_after = usage([proc.pid for proc, _ in edges])
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
    after = gaps = never_served = 0
    errors: list[str] = []
    refused: dict[str, int] = {}
    for res in results:
        for status, count in res.get("refused", {}).items():
            refused[status] = refused.get(status, 0) + count
        never_served += res.get("never_served", 0)
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
    # rows each edge delivered (its readers' rows), and its CPU per million of them
    per_edge = [0] * max(1, k)
    for j, res in enumerate(results):
        per_edge[j % max(1, k)] += res["rows"]
    cpu = {key: cpu_after[key] - cpu_before[key] for key in ("gateway", "jvm", "workers")}
    edge_cpu = [b - a for a, b in zip(cpu_before["edges"], cpu_after["edges"], strict=True)]
    window = cpu_after["at"] - cpu_before["at"]
    return {"side": side, "n": n, "load": load_average(), "opened": opened,
            "edge_cpu": edge_cpu, "edge_rows": per_edge if k else [], "cpu_window": window,
            "edge_cpu_per_m": [c / r * 1e6 if r else float("nan")
                               for c, r in zip(edge_cpu, per_edge, strict=False)],
            "cpu": cpu, "rows": sum(per_edge),
            "phases": [many.phase_figures(lat[j], want[j]) for j in range(2)],
            "revoke_call": revoke_call, "revoked": many.phase_figures(revoked, n),
            "after_revoked": after, "gaps": gaps, "errors": errors[:5],
            "refused": refused, "never_served": never_served,
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
          + (f"; readers refused and asked again after Retry-After: {r['refused']} "
             f"({r['never_served']} never served)" if r.get("refused") else "")
          + (f"; reader errors (first {len(r['errors'])}): "
             + " | ".join(" ".join(e.split())[:160] for e in r["errors"][:2])
             if r["errors"] else ""))
    c = r["cpu"]
    line = (f"    CPU s over the ingest: gateway process {c['gateway']:.1f}, Spark JVM "
            f"{c['jvm']:.1f}, Python workers {c['workers']:.1f}; {r['rows']:,} rows delivered")
    if r["edge_cpu"]:
        per_m = r["edge_cpu_per_m"]
        line += ("; per edge: " + ", ".join(
            f"{cs:.1f} s / {rows:,} rows = {m:.0f} s per M" for cs, rows, m in
            zip(r["edge_cpu"], r["edge_rows"], per_m, strict=True))
            + f" (max/min {flatness(per_m):.2f}); an edge used "
            f"{statistics.mean(r['edge_cpu']) / r['cpu_window']:.0%} of a core on average over "
            f"the {r['cpu_window']:.0f} s (a fixed cost per second weighs more when rows are few)")
    print(line + f"; {r['n']:,} handles opened in {r.get('opened', float('nan')):.1f} s"
          f"; load average {r['load']}")
    if any(x["open"] or set(x["finals"]) - {"revoked"} for x in r["readers"]):  # not all revoked
        print(f"    reader processes: {r['readers']}")


def broker_state(pid: int, bootstrap: str) -> str:
    """The broker after a side: its topics (a side's gateway deletes its plan topics when it
    closes), its CPU seconds so far, and its heap (`jstat -gcutil`: old generation full, full
    GCs so far and their seconds), to tell a broker short of heap from a slow gateway."""
    from confluent_kafka.admin import AdminClient

    try:
        topics = len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(
            timeout=30).topics)
    except Exception as exc:  # noqa: BLE001 - a figure, not the run
        topics = f"? ({exc})"
    gc = "no jstat"
    try:
        out = subprocess.run(["jstat", "-gcutil", str(pid)], capture_output=True, text=True,
                             timeout=30).stdout.split("\n")
        row = dict(zip(out[0].split(), out[1].split(), strict=False))
        gc = (f"old generation {row['O']}% full, {row['FGC']} full GCs ({row['FGCT']} s), "
              f"{row['YGC']} young ({row['YGCT']} s)")
    except (OSError, IndexError, KeyError, subprocess.SubprocessError):
        pass
    return f"{topics} topics, {cpu_seconds(pid):.0f} CPU s so far, {gc}"


def flatness(values: list[float]) -> float:
    """The highest over the lowest (1.0: flat); nan without values."""
    v = [x for x in values if x == x and x > 0]
    return max(v) / min(v) if v else float("nan")


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
    ap.add_argument("--handles", default="1000", help="handle counts, comma-separated")
    ap.add_argument("--rate", type=int, default=200, help="tuples ingested per second")
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--startup", type=float, default=15.0)
    ap.add_argument("--pass-rate", type=float, default=0.1)
    ap.add_argument("--edges", default="1,2,4", help="edge counts, comma-separated")
    ap.add_argument("--no-process", action="store_true", help="edges only (no `process` side)")
    ap.add_argument("--reader-procs", type=int, default=4)
    args = ap.parse_args()
    sizes = [int(x) for x in args.handles.split(",")]
    if args.quick:
        args.trials, args.seconds, args.startup, sizes = 1, 20.0, 10.0, [20]
    from tests.kafka.broker import KafkaBroker, heap_for
    from tests.pg_server import start_server

    sides = ([] if args.no_process else ["process"]) + [f"edges-{int(k)}"
                                                        for k in args.edges.split(",")]
    print("machine:", machine("confluent_kafka"), f"; {sizes} handles, {args.rate} tuples/s, "
          f"{args.pass_rate:.0%} of the handles per tuple; open files up to {raise_fd_limit()}")
    results: dict[tuple[int, str], list[dict[str, Any]]] = {(n, s): [] for n in sizes
                                                            for s in sides}
    with tempfile.TemporaryDirectory(prefix="xsg-bench-edges-") as tmp:
        postgres = start_server()
        # sized for a plan topic per handle (tests/kafka/broker.py: 384 MB held 4,000)
        broker = KafkaBroker(Path(tmp) / "kafka", heap=heap_for(max(sizes)))
        print(f"broker heap {broker.heap} for {max(sizes):,} plan topics")
        broker.start()
        try:
            for t, order in enumerate(rotations(sides, args.trials)):
                for n in (sizes if t % 2 == 0 else sizes[::-1]):
                    print(f"\n== trial {t + 1}, {n:,} handles")
                    for side in order:
                        a = {"side": side, "n": n, "rate": args.rate, "seconds": args.seconds,
                             "startup": args.startup, "pass_rate": args.pass_rate,
                             "store": postgres.new_url(), "brokers": broker.bootstrap,
                             "procs": args.reader_procs}
                        results[(n, side)].append(run_child(
                            __file__, ["--side", json.dumps(a)], timeout=args.seconds + 1800,
                            echo=True))
                        assert broker.process is not None
                        print(f"    broker after {side}: "
                              f"{broker_state(broker.process.pid, broker.bootstrap)}")
        finally:
            broker.stop()
            postgres.close()
    print("\n== summary (median and range over the trials)")
    for (n, side), runs in results.items():
        start = spread((r['phases'][0]['p95'] for r in runs), '{:.2f}')
        per_m = [statistics.mean(r["edge_cpu_per_m"]) for r in runs if r["edge_cpu_per_m"]]
        print(f"  {n:>6,} {side:>8}: p95 start-up {start} s, "
              f"steady {spread((r['phases'][1]['p95'] for r in runs), '{:.3f}')} s, revocation "
              f"p99 {spread(r['revoked']['p99'] * 1000 for r in runs)} ms, gaps "
              f"{sum(r['gaps'] for r in runs)}, rows after `revoked` "
              f"{sum(r['after_revoked'] for r in runs)}, never arrived "
              f"{sum(r['missing_before_last'] for r in runs)} (before a reader's last row) + "
              f"{sum(r['missing_after_last'] for r in runs)} (after it), runs with reader errors "
              f"{sum(len(r['errors']) > 0 for r in runs)}"
              + (f"; edge CPU s per M rows {spread(per_m)} (max/min within a run "
                 f"{spread((flatness(r['edge_cpu_per_m']) for r in runs), '{:.2f}')})"
                 if per_m else "")
              + f"; gateway process CPU s {spread((r['cpu']['gateway'] for r in runs), '{:.1f}')}")
    for n in sizes:
        means = {side: statistics.median([statistics.mean(r["edge_cpu_per_m"]) for r in runs])
                 for (m, side), runs in results.items()
                 if m == n and side.startswith("edges") and runs}
        if len(means) > 1:
            base, *more = means
            print(f"  {n:,} handles: edge CPU s per M rows (the median of each side's mean over "
                  f"its edges) " + ", ".join(f"{side} {v:.1f}" for side, v in means.items())
                  + "; " + ", ".join(f"{side}/{base} {ratio(means[side], means[base])}"
                                     for side in more)
                  + f"; max/min {flatness(list(means.values())):.2f} (aim: within 1.20)")
    print("load average at the end:", load_average())


if __name__ == "__main__":
    main()
