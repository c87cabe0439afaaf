"""One gateway as 1 process and as 2 processes on one PostgreSQL store, side by side in one run on
one machine: ingest-to-reader latency and revocation at N handles, the time a dead process's
streams take to move, and two processes writing policies at once.

Run: .venv/bin/python tests/bench/bench_cluster.py [--handles 1000] [--rate 200] [--seconds 45]
                                                   [--startup 15] [--reader-procs 4]
                                                   [--pass-rate 0.1]
                                                   [--processes 1,2] [--kills 1]
                                                   [--writes 60] [--spark-master local[2]]

For each process count P (each a fresh schema of one throw-away PostgreSQL server,
tests/pg_server.py, and a fresh shared data directory), P `xsg serve --cluster` child processes
(Spark local to each, `--spark-master`, unless given a standalone master's URL):
  * two streams, `a` and `b`, each taken by process 0 and process 1 % P (the first request for a
    stream claims it where it arrives: with 2 processes, one stream each); one policy covers
    both (its target names both);
  * N handles, each with a query of its own (bench_many_readers.py's bands over `v`, `--pass-
    rate` of the handles per tuple), handle i on stream i % 2;
  * readers: `--reader-procs` processes (tests/bench/readers.py), each connected to the
    process serving its handles (a client behind a proxy would add the proxy's hop; one behind
    another process, a forwarded hop);
  * once every reader is connected, an ingest process per stream (bench_many_readers.py's) at
    `--rate` tuples/s for `--seconds`, to the stream's process; a row's latency is its arrival
    at a reader minus its send stamp; the first `--startup` seconds are the start-up figure,
    the rest the steady state, and every row a handle is owed (its band) that did not arrive
    within 3 s of the ingest's end counts as infinitely late (bench_many_readers.py's rules);
  * revocation: the owner deletes the one policy, through process 0, while every reader is
    connected; a reader's `revoked` arrival is counted from the DELETE's start (with 2
    processes, half the handles are revoked by the other process, which the DELETE waits for).
With 2 processes also:
  * failover (`--kills` times): a stream with handles and a steady 20 tuples/s is served by one
    process; it is killed (SIGKILL) and started again afterwards. Measured from the kill: the
    stream's lease held by the survivor (`moved`), and the first row sent after the kill read
    by a reader that resumes (through the survivor) with Last-Event-ID (`first row`);
  * policy writes: two clients, one per process, add, update (one shared policy) and delete
    policies for `--writes` seconds; every store version must be present once and both
    processes must list the store's policies.
Everything started is stopped, even on error; every wait is bounded.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# the workload of bench_many_readers.py (its bands, ingest process and owed rows), its reader
# processes (readers.py) and figures (harness.py: rows that never arrive count infinitely late)
from tests.bench.bench_many_readers import (
    ADMIN,
    SCHEMA,
    S,
    band,
    bounds,
    owed,
    phase_figures,
    request_for,
    token,
)
from tests.bench.harness import last_reply, load_average, machine, secs
from tests.bench.readers import ReadJob, reader_result, start_reader, write_start

INGEST = str(ROOT / "tests" / "bench" / "bench_many_readers.py")  # its --ingest process
POLICY_ID = "urn:bench:cluster:both"
GRACE = 3.0  # seconds after the ingest's end before the readers' figures are taken


def policy(streams: list[str], policy_id: str = POLICY_ID, version: str = "1") -> bytes:
    """Permits every consumer on these streams (its target names them all)."""
    matches = "".join(f"""<AllOf><Match
      MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
      <AttributeValue DataType="{S}">{s}</AttributeValue>
      <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
        AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" DataType="{S}"
        MustBePresent="false"/></Match></AllOf>""" for s in streams)
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
  PolicyId="{policy_id}" Version="{version}"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
  <Target><AnyOf>{matches}</AnyOf></Target>
  <Rule RuleId="all" Effect="Permit"/></Policy>""".encode()


def admin(**extra: str) -> dict:
    return {"Authorization": f"Bearer {ADMIN}", **extra}


class Processes:
    """P `xsg serve --cluster` children on one store and one data directory."""

    def __init__(self, count: int, store: str, tmp: Path, subjects: int, master: str,
                 lease: float) -> None:
        from common.auth import write_auth_file

        self.store, self.tmp, self.master, self.lease = store, tmp, master, lease
        self.data = tmp / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.auth = tmp / "auth.json"
        write_auth_file(self.auth, [{"token": ADMIN, "subject": "nea", "roles": ["data-owner"],
                                     "admin": True}]
                        + [{"token": token(i), "subject": f"c{i:05d}", "roles": ["consumer"],
                            "admin": False} for i in range(subjects)])
        self.empty = tmp / "no-policies"
        self.empty.mkdir(exist_ok=True)
        self.procs: list[subprocess.Popen | None] = [None] * count
        self.urls: list[str] = [""] * count
        for n in range(count):
            self.start(n)
        for n in range(count):
            self.urls[n] = self.wait(n)

    def start(self, n: int) -> None:
        out = open(self.tmp / f"gw{n}.out", "wb")
        err = open(self.tmp / f"gw{n}.err", "ab")
        self.procs[n] = subprocess.Popen(
            [sys.executable, "-u", "-m", "pep.cli", "serve", "--cluster", "--port", "0",
             "--data-dir", str(self.data), "--auth", str(self.auth), "--policies",
             str(self.empty), "--spark-master", self.master, "--lease-seconds", str(self.lease),
             "--max-connections", "5000", "--max-readers-per-subject", "64",
             "--log-level", "WARNING", "--stall-seconds", "600"],
            stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=self.tmp,
            env={**os.environ, "PYTHONPATH": str(ROOT), "XSG_STORE": self.store})

    def wait(self, n: int, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs[n]
            if proc is None or proc.poll() is not None:
                break
            for line in (self.tmp / f"gw{n}.out").read_text(errors="replace").splitlines():
                if line.startswith("xsg gateway listening on "):
                    return line.split()[4]
            time.sleep(0.3)
        raise RuntimeError(f"gateway process {n} did not come up; see {self.tmp}/gw{n}.err")

    def member(self, n: int) -> str:
        return requests.get(f"{self.urls[n]}/cluster", headers=admin(), timeout=30
                            ).json()["member"]

    def holder(self, n: int, stream: str) -> str | None:
        state = requests.get(f"{self.urls[n]}/cluster", headers=admin(), timeout=30).json()
        return next((lease["member"] for lease in state["leases"]
                     if lease["stream"] == stream and lease["expires_in"] > 0), None)

    def kill(self, n: int) -> None:
        proc = self.procs[n]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)

    def close(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by the gateway processes and their descendants (Spark's
        JVMs, its Python workers), from /proc."""
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
            parent[int(entry.name)] = int(fields[1])
            used[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
        roots = {p.pid for p in self.procs if p is not None and p.poll() is None}
        total = 0.0
        for pid, seconds in used.items():
            up: int | None = pid
            while up is not None and up > 1 and up not in roots:
                up = parent.get(up)
            if up in roots:
                total += seconds
        return total


def open_handles(urls: list[str], n: int, streams: list[str], pass_rate: float) -> list[str]:
    """N handles, each with a query of its own (`band`), handle i on streams[i % 2] asked at
    `urls[i % 2]`."""
    ids: list[str | None] = [None] * n

    def work(lo: int, hi: int) -> None:
        with requests.Session() as s:
            for i in range(lo, hi):
                a, b = band(i, n, pass_rate)
                query = json.dumps({"filter": f"v >= {a:.3f} AND v < {b:.3f}"})
                r = s.post(f"{urls[i % len(urls)]}/requests", timeout=180,
                           headers={"Authorization": f"Bearer {token(i)}"},
                           files={"request": ("r.json", request_for(streams[i % len(streams)]),
                                              "application/xacml+json"),
                                  "query": ("q.json", query, "application/json")})
                if r.status_code not in (200, 201):
                    raise RuntimeError(f"handle {i}: {r.status_code} {r.text[:300]}")
                ids[i] = r.json()["id"]

    # the first request for each stream alone: it claims the stream where it arrives
    work(0, min(n, 2))
    parts = 8
    threads = [threading.Thread(target=work, args=(2 + k * (n - 2) // parts,
                                                   2 + (k + 1) * (n - 2) // parts))
               for k in range(parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    if any(x is None for x in ids):
        raise RuntimeError("not every handle opened")
    return ids  # type: ignore[return-value]


def measure(gw: Processes, n: int, rate: int, seconds: float, startup: float,
            reader_procs: int, pass_rate: float, tmp: Path) -> dict:
    """Latency (start-up and steady state, every row owed counted) and revocation at N handles
    over two streams (the module docstring)."""
    streams = ["a", "b"]
    for stream in streams:
        r = requests.post(f"{gw.urls[0]}/streams", headers=admin(), timeout=60, json={
            "name": stream, "time_attribute": "ts", "source": {"kind": "ingest"},
            "schema": SCHEMA})
        assert r.status_code == 201, r.text
    r = requests.post(f"{gw.urls[0]}/policies", data=policy(streams), timeout=60,
                      headers=admin(**{"Content-Type": "application/xacml+xml"}))
    assert r.status_code == 201, r.text
    where = [gw.urls[k % len(gw.urls)] for k in range(2)]  # stream k's process
    t0 = time.perf_counter()
    ids = open_handles(where, n, streams, pass_rate)
    opened = time.perf_counter() - t0
    served = {s: gw.holder(0, s) for s in streams}
    phases = [(0.0, startup), (startup, seconds)]
    start_file = str(tmp / f"start-{len(gw.urls)}")
    readers: list[tuple[subprocess.Popen, ReadJob]] = []
    ingests: list[subprocess.Popen] = []
    try:
        per_stream = max(1, reader_procs // 2)
        for k in range(2 * per_stream):
            stream = k % 2
            parts = urlsplit(where[stream])
            mine = [(i, f"/handles/{ids[i]}", token(i))
                    for i in range(stream, n, 2)][k // 2::per_stream]
            job = ReadJob(parts.hostname or "127.0.0.1", parts.port or 80, mine,
                          str(tmp / f"reader-{len(gw.urls)}-{k}.out"),
                          ready=str(tmp / f"reader-{len(gw.urls)}-{k}.ready"),
                          seconds=seconds + 900, phases=phases, start_file=start_file)
            readers.append((start_reader(job), job))
        deadline = time.monotonic() + 180
        while (not all(Path(str(job.ready)).exists() for _, job in readers)
               and time.monotonic() < deadline):
            time.sleep(0.1)
        start_at = time.time() + 1.0  # the first tuple
        write_start(readers[0][1], start_at)
        absolute = [(start_at + lo, start_at + hi) for lo, hi in phases]
        ingests = [subprocess.Popen([sys.executable, INGEST, "--ingest", where[k], stream,
                                     str(rate), str(seconds), "0", repr(start_at)],
                                    stdout=subprocess.PIPE, text=True)
                   for k, stream in enumerate(streams)]
        c0, w0 = gw.cpu_seconds(), time.time()
        outs = []
        for p in ingests:
            got = last_reply(p.communicate(timeout=seconds + 180)[0])
            if got is None:
                raise RuntimeError("an ingest process gave no figures")
            outs.append(got)
        cpu = (gw.cpu_seconds() - c0) / (time.time() - w0)
        time.sleep(GRACE)  # the last rows reach their readers; later ones count as never
        t_revoke = time.time()
        r = requests.delete(f"{gw.urls[0]}/policies/{POLICY_ID}", headers=admin(), timeout=300)
        assert r.status_code in (200, 204), r.text
        revoke_call = time.time() - t_revoke
        results = [reader_result(proc, job, 180) for proc, job in readers]
    finally:
        for p in ingests:
            if p.poll() is None:
                p.kill()
                p.wait()
        for proc, job in readers:
            if proc.poll() is None:
                reader_result(proc, job, 30, stop=True)
    lat: list[list[float]] = [[], []]
    revoked: list[float] = []
    rows = gaps = after = 0
    errors: list[str] = []
    for res in results:
        for k in range(2):
            lat[k] += res["lat"][k]
        rows += res["rows"]
        gaps += res["gaps"]
        after += res["after_final"]
        errors += res["errors"]
        revoked += [t - t_revoke for t in res["revoked"]]
    want = [0, 0]
    for j in range(2):
        bands = [bounds(i, n, pass_rate) for i in range(j, n, 2)]
        for k, count in enumerate(owed(outs[j]["puts"], bands, absolute)):
            want[k] += count
    return {"processes": len(gw.urls), "n": n, "opened": opened, "served": served,
            "phases": [phase_figures(lat[k], want[k]) for k in range(2)],
            "rows_per_s": sum(len(x) for x in lat) / seconds, "rows": rows, "gaps": gaps,
            "errors": errors[:5], "revoked": phase_figures(revoked, n),
            "revoke_call": revoke_call, "after_revoked": after, "cpu": cpu,
            "startup": startup, "late": sum(o["late"] for o in outs),
            "calls": sum(o["calls"] for o in outs),
            "call_p95": max(o.get("call_p95", float("nan")) for o in outs)}


def failover(gw: Processes, kills: int, tmp: Path) -> list[dict]:
    """Kill the process serving a busy stream, `kills` times (module docstring)."""
    stream = "move"
    r = requests.post(f"{gw.urls[0]}/streams", headers=admin(), timeout=60, json={
        "name": stream, "time_attribute": "ts", "source": {"kind": "ingest"}, "schema": SCHEMA})
    assert r.status_code == 201, r.text
    r = requests.post(f"{gw.urls[0]}/policies", data=policy([stream], "urn:bench:move"),
                      timeout=60, headers=admin(**{"Content-Type": "application/xacml+xml"}))
    assert r.status_code == 201, r.text
    out = []
    for round_ in range(kills):
        victim = round_ % 2
        survivor = 1 - victim
        r = requests.post(f"{gw.urls[victim]}/requests", timeout=180,
                          headers={"Authorization": f"Bearer {token(round_)}"},
                          files={"request": ("r.json", request_for(stream),
                                             "application/xacml+json")})
        assert r.status_code in (200, 201), r.text
        handle = r.json()["id"]
        if gw.holder(survivor, stream) != gw.member(victim):
            raise RuntimeError("the stream is not served by the process to kill")
        got: list[tuple[float, float]] = []  # (arrival, sent) of rows
        stop = threading.Event()
        last = [None]

        # the loop's values are passed in: a thread outliving its round's join(30) must not
        # read the next round's
        def read(stop: threading.Event, round_: int, survivor: int, handle: str,
                 last: list, got: list) -> None:  # resumes through the survivor, as a client would
            while not stop.is_set():
                headers = {"Authorization": f"Bearer {token(round_)}",
                           "Accept": "application/x-ndjson"}
                if last[0] is not None:
                    headers["Last-Event-ID"] = str(last[0])
                try:
                    with requests.get(f"{gw.urls[survivor]}/handles/{handle}", headers=headers,
                                      stream=True, timeout=(5, 20)) as resp:
                        if resp.status_code != 200:
                            time.sleep(0.2)
                            continue
                        for raw in resp.iter_lines(chunk_size=1):
                            if stop.is_set():
                                return
                            if not raw:
                                continue
                            obj = json.loads(raw)
                            if "id" in obj:
                                last[0] = obj["id"]
                            if "row" in obj:
                                got.append((time.time(), obj["row"]["sent"]))
                            if obj.get("event") == "shutdown":
                                break
                except requests.RequestException:
                    time.sleep(0.2)

        def ingest(stop: threading.Event, round_: int, survivor: int) -> None:
            seq = 10_000_000 * (round_ + 1)
            while not stop.is_set():
                now = time.time()
                body = "".join(json.dumps({"ts": now, "seq": seq + k, "sent": now, "v": 1.0,
                                           "pad": "p"}) + "\n" for k in range(2))
                seq += 2
                try:
                    requests.post(f"{gw.urls[survivor]}/streams/{stream}/records",
                                  data=body.encode(), timeout=30,
                                  headers=admin(**{"Content-Type": "application/x-ndjson"}))
                except requests.RequestException:
                    pass
                time.sleep(0.1)

        threads = [threading.Thread(target=read, daemon=True,
                                    args=(stop, round_, survivor, handle, last, got)),
                   threading.Thread(target=ingest, daemon=True, args=(stop, round_, survivor))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while not got and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.0)
        killed = time.time()
        gw.kill(victim)
        moved = None
        while time.time() < killed + 120:
            if gw.holder(survivor, stream) == gw.member(survivor):
                moved = time.time() - killed
                break
            time.sleep(0.05)
        first = None
        while time.time() < killed + 180:
            after = [arrival for arrival, sent in got if sent > killed]
            if after:
                first = min(after) - killed
                break
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(30)
        out.append({"moved": moved, "first_row": first})
        gw.start(victim)  # back, for the next round (and the writes)
        gw.urls[victim] = gw.wait(victim)
        requests.delete(f"{gw.urls[survivor]}/handles/{handle}",
                        headers={"Authorization": f"Bearer {token(round_)}"}, timeout=60)
    return out


def policy_writes(gw: Processes, seconds: float) -> dict:
    """Two clients, one per process, write policies for `seconds` (module docstring)."""
    import psycopg

    answered: list[int] = []
    deleted: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    until = time.monotonic() + seconds
    xml = admin(**{"Content-Type": "application/xacml+xml"})
    r = requests.post(f"{gw.urls[0]}/policies", data=policy(["w"], "urn:w:shared"),
                      headers=xml, timeout=60)
    assert r.status_code == 201, r.text

    def write(base: str, who: int) -> None:
        n = 0
        with requests.Session() as http:
            while time.monotonic() < until:
                n += 1
                pid = f"urn:w:{who}:{n}"
                calls = [("POST", f"{base}/policies", policy(["w"], pid)),
                         ("PUT", f"{base}/policies/urn:w:shared",
                          policy(["w"], "urn:w:shared", f"{who + 1}.{n}"))]
                if n % 3 == 0:
                    calls.append(("DELETE", f"{base}/policies/{pid}", b""))
                for method, url, body in calls:
                    resp = http.request(method, url, data=body or None, headers=xml,
                                        timeout=60)
                    with lock:
                        if method == "DELETE" and resp.status_code == 204:
                            deleted.append(pid)
                        elif resp.status_code in (200, 201):
                            answered.append(resp.json()["store_version"])
                        else:
                            errors.append(f"{method}: {resp.status_code} {resp.text[:120]}")

    started = time.monotonic()
    threads = [threading.Thread(target=write, args=(url, k)) for k, url in enumerate(gw.urls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 120)
    took = time.monotonic() - started
    with psycopg.connect(gw.store) as conn:
        versions = [v for (v,) in conn.execute(
            "SELECT store_version FROM policy_versions WHERE policy_id LIKE 'urn:w:%'"
            " ORDER BY store_version").fetchall()]
        every = [v for (v,) in conn.execute(
            "SELECT store_version FROM policy_versions ORDER BY store_version").fetchall()]
        current = sorted(conn.execute("SELECT policy_id, store_version FROM policy_current"
                                      ).fetchall())
    listed = [sorted((p["id"], p["store_version"]) for p in requests.get(
        f"{url}/policies", headers=admin(), timeout=60).json()) for url in gw.urls]
    return {"writes": len(versions), "seconds": took, "errors": errors[:3],
            "serial": every == list(range(1, len(every) + 1)),
            "answered_once": len(set(answered)) == len(answered),
            "accounted": len(versions) == len(answered) + len(deleted) + 1,
            "processes_agree": all(sorted(map(tuple, x)) == current for x in listed)}


def report(r: dict) -> str:
    served = ", ".join(f"{s}: {m}" for s, m in r["served"].items())
    up, steady, rv = r["phases"][0], r["phases"][1], r["revoked"]
    return (f"{r['processes']} process(es), {r['n']:,} handles ({served}), opened in "
            f"{r['opened']:.0f} s; ingest -> reader, start-up (first {r['startup']:.0f} s): p95 "
            f"{secs(up['p95'])}; steady: p50 {secs(steady['p50'])}, p95 {secs(steady['p95'])}, "
            f"p99 {secs(steady['p99'])} over {steady['owed']:,} rows owed "
            f"({steady['owed'] - steady['arrived']:,} never arrived); {r['rows_per_s']:,.0f} "
            f"rows/s to readers, gaps {r['gaps']}, ingest calls late {r['late']} of "
            f"{r['calls']}, call p95 {secs(r['call_p95'], 'ms')}; revocation: DELETE "
            f"{r['revoke_call'] * 1000:.0f} ms, `revoked` reached {rv['arrived']:,} of "
            f"{rv['owed']:,} readers, p50 {secs(rv['p50'], 'ms')}, p99 {secs(rv['p99'], 'ms')}; "
            f"rows after `revoked` {r['after_revoked']}; the gateway processes with their Spark: "
            f"{r['cpu']:.2f} cores" + (f"; reader errors {r['errors'][:2]}" if r["errors"]
                                        else ""))


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--handles", type=int, default=1000)
    ap.add_argument("--rate", type=int, default=200, help="tuples/s ingested per stream")
    ap.add_argument("--seconds", type=float, default=45.0,
                    help="seconds of ingest, from the first tuple")
    ap.add_argument("--startup", type=float, default=15.0,
                    help="the first seconds, reported as start-up (the rest: steady state)")
    ap.add_argument("--reader-procs", type=int, default=4)
    ap.add_argument("--pass-rate", type=float, default=0.1)
    ap.add_argument("--processes", default="1,2")
    ap.add_argument("--kills", type=int, default=1, help="failovers measured (2 processes)")
    ap.add_argument("--writes", type=float, default=60.0,
                    help="seconds two processes write policies at once (0: not measured)")
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument("--lease", type=float, default=5.0, help="the processes' lease_seconds")
    args = ap.parse_args()
    print("machine:", machine("psycopg"))
    from tests.pg_server import start_server

    server = start_server()
    lines: list[str] = []
    moves: list[dict] = []
    writes: dict | None = None
    try:
        for count in [int(x) for x in args.processes.split(",")]:
            with tempfile.TemporaryDirectory(prefix=f"xsg-bench-cluster-{count}-") as tmp:
                gw = Processes(count, server.new_url(), Path(tmp), args.handles,
                               args.spark_master, args.lease)
                try:
                    result = measure(gw, args.handles, args.rate, args.seconds, args.startup,
                                     args.reader_procs, args.pass_rate, Path(tmp))
                    lines.append(report(result))
                    print(lines[-1])
                    if count == 2 and args.kills:
                        moves = failover(gw, args.kills, Path(tmp))
                        print("failover:", moves)
                    if count == 2 and args.writes > 0:
                        writes = policy_writes(gw, args.writes)
                        print("policy writes:", writes)
                finally:
                    gw.close()
    finally:
        server.close()
    print("\nsummary (one run, same machine)")
    for line in lines:
        print(" ", line)
    if moves:
        print(f"  failover after kill -9 (lease {args.lease:g} s):",
              "; ".join(f"stream moved {m['moved']:.1f} s, first row sent after the kill read "
                        f"{m['first_row']:.1f} s" if m["moved"] is not None
                        and m["first_row"] is not None else str(m) for m in moves))
    if writes is not None:
        print(f"  policy writes by 2 processes at once: {writes['writes']} versions in "
              f"{writes['seconds']:.0f} s, serial {writes['serial']}, each answered once "
              f"{writes['answered_once']}, every write accounted for {writes['accounted']}, "
              f"processes agree with the store {writes['processes_agree']}, errors "
              f"{writes['errors']}")
    print("load average at the end:", load_average())


if __name__ == "__main__":
    main()
