"""PDP benchmark: xsg's XACML engine against py-abac 0.4.1 on the same policies and requests.

    .venv/bin/python tests/bench/bench_pdp.py [--policies 1000] [--requests 2000]
                                              [--pyabac-requests 1000] [--http-requests 1000]
                                              [--profile] [--no-http]

Measures, with the workload of pdp_workload.py (equivalent policies in both systems):
  * policy load time: XACML parse + compile of the whole set (the paper reports 0.25 s per policy);
  * in-process decisions/s and p50/p99 latency, the request parsed from XML inside the timed loop,
    then from the JSON Profile, then pre-parsed (evaluation alone, to split the cost);
  * py-abac on the same requests in the same run (JSON text -> dict -> Request -> is_allowed), and
    the ratio xsg/py-abac;
  * over HTTP: the gateway app (pep.http.app.create_app, policies seeded into its SQLite store) on
    its own server (server.serving: uvicorn) on loopback, `POST /pdp` with each subject's
    bearer token, XML in, JSON out: raw-socket clients in another process (every answer checked),
    then `wrk` (apt-get install wrk, or `make wrk`) with 1 and 8 connections; against the same
    decisions in process through the same code without HTTP (token, XML parsed, decided, JSON
    rendered: `FastPdp.decide`), side by side in the same run; each wrk run is also set against
    in-process runs just before and after it (the machine's load moves), and every HTTP run is
    compared by CPU time too (in-process CPU per decision / the server's CPU per request).
Every decision is checked against the workload's reference semantics (column 'wrong').
--profile adds cProfile listings of the in-process XML path and of the app behind POST /pdp.
Timings are printed, never asserted. On a busy machine, read the CPU-time columns too.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import pdp_workload as wl

XML = "application/xacml+xml"
JSON = "application/xacml+json"
PAPER_LOAD_S_PER_POLICY = 0.25
# py-abac with 1,000 policies as measured for the issue on this machine (its workload unstated).
# py-abac evaluates every policy's rules on every request, so its speed depends on the conditions;
# this workload's are heavier, and the ratio is also given against the issue's figure.
ISSUE_PYABAC_PER_SECOND = 470
WARMUP = 100


@dataclass
class Timing:
    label: str
    latencies_ns: list[int]
    wall_s: float
    mismatches: int = 0
    cpu_ns: list[int] | None = None  # this thread's CPU time per call: blind to preemption


    @property
    def n(self) -> int:
        return len(self.latencies_ns)

    @property
    def per_second(self) -> float:
        return self.n / self.wall_s if self.wall_s else float("nan")

    def percentile_ms(self, q: float, cpu: bool = False) -> float:
        ordered = sorted(self.cpu_ns if cpu else self.latencies_ns)
        index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
        return ordered[index] / 1e6

    @property
    def per_cpu_second(self) -> float:
        """Decisions per second of the calling thread's CPU time (robust to a busy machine)."""
        return self.n / (sum(self.cpu_ns) / 1e9)

    @property
    def mean_ms(self) -> float:
        return sum(self.latencies_ns) / len(self.latencies_ns) / 1e6


def timed_loop(label: str, items: Sequence, call: Callable, expected: Sequence[str]) -> Timing:
    """Call `call(item)` for each item, timing each call; the call returns a decision string."""
    for item in items[:WARMUP]:
        call(item)
    latencies, cpu = [], []
    mismatches = 0
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    start = clock()
    for item, want in zip(items, expected, strict=True):
        c0 = cpu_clock()
        t0 = clock()
        got = call(item)
        latencies.append(clock() - t0)
        cpu.append(cpu_clock() - c0)
        if got != want:
            mismatches += 1
    wall = (clock() - start) / 1e9
    return Timing(label, latencies, wall, mismatches, cpu)


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = os.cpu_count()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = cores
    return (f"{platform.platform()} | Python {platform.python_version()} "
            f"({platform.python_implementation()}) | {cpu} | {cores} cores ({usable} usable)")


# ---------------------------------------------------------------------------------------------
# xsg in process


def load_xsg(workload: wl.Workload):
    from pdp.engine import PolicyEngine, PolicySource

    sources = [PolicySource(name, xml) for name, xml in workload.xacml_policies()]
    gc.collect()
    t0 = time.perf_counter()
    engine = PolicyEngine.compile(sources, root_combining_alg="deny-overrides")
    return engine, time.perf_counter() - t0


def xsg_bytes_call(engine, media_type: str) -> Callable[[bytes], str]:
    def call(body: bytes) -> str:
        return engine.decide_bytes(body, media_type=media_type).results[0].decision.value
    return call


def xsg_preparsed(engine, bodies: Sequence[bytes]) -> tuple[list, Callable]:
    from pdp.request import parse_request

    contexts = [parse_request(b, XML) for b in bodies]

    def call(ctx) -> str:
        return engine.decide(ctx).results[0].decision.value
    return contexts, call


# ---------------------------------------------------------------------------------------------
# py-abac in process


def load_pyabac(workload: wl.Workload):
    docs = workload.pyabac_policies()
    gc.collect()
    t0 = time.perf_counter()
    pdp, _storage = wl.build_pyabac(docs)
    return pdp, time.perf_counter() - t0


def pyabac_call(pdp) -> Callable[[bytes], str]:
    from py_abac import Request

    def call(body: bytes) -> str:
        allowed = pdp.is_allowed(Request.from_json(json.loads(body)))
        return wl.PERMIT if allowed else "not Permit"
    return call


# ---------------------------------------------------------------------------------------------
# xsg over HTTP


class _Server:
    """The gateway app on the gateway's own server (server.serving) on a loopback port."""

    def __init__(self, app, threads: int) -> None:
        from server.serving import HttpServer

        self.via = "served by server.serving.HttpServer"
        self._gateway = HttpServer(app, host="127.0.0.1", port=0, threads=threads)
        self._gateway.start()
        self.port = self._gateway.port

    def stop(self) -> None:
        self._gateway.stop()


class _AppTimer:
    """WSGI middleware timing the gateway app for POST /pdp inside the server thread, so that the
    HTTP figure splits into the app's own time and the rest (client, socket, server). With a
    profiler set, it also profiles the app (requests are sequential, so one profiler will do)."""

    def __init__(self, app) -> None:
        self.app = app
        self.wall_ns: list[int] = []
        self.cpu_ns: list[int] = []
        self.profiler: cProfile.Profile | None = None

    enabled = True

    def __call__(self, environ, start_response):
        if not self.enabled or environ.get("PATH_INFO") != "/pdp":
            return self.app(environ, start_response)
        prof = self.profiler
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        if prof is not None:
            prof.enable()
        try:
            return self.app(environ, start_response)  # Flask builds non-streamed bodies eagerly
        finally:
            if prof is not None:
                prof.disable()
            self.wall_ns.append(time.perf_counter_ns() - t0)
            self.cpu_ns.append(time.thread_time_ns() - c0)


def http_client_main(payload_path: str) -> None:
    """The HTTP clients, in a process of their own (`--http-client FILE`): `threads` threads,
    each with one keep-alive connection (http.client), POST /pdp XML in, JSON out; prints one
    JSON line with every latency and the count of wrong decisions."""
    import http.client
    import socket

    job = json.loads(Path(payload_path).read_text())
    host, port, threads, per_thread = job["host"], job["port"], job["threads"], job["per_thread"]
    items = job["items"]
    barrier = threading.Barrier(threads + 1)
    results: list[tuple[list[int], int]] = []
    samples: list[str] = []
    lock = threading.Lock()

    def run(k: int) -> None:
        mine = items[k::threads] or items
        if job.get("client") == "http.client":
            conn = http.client.HTTPConnection(host, port, timeout=60)
            headers = [{"Authorization": f"Bearer {t}", "Content-Type": XML, "Accept": JSON}
                       for t, _, _ in mine]

            def exchange(i: int) -> tuple[int, bytes]:
                conn.request("POST", "/pdp", body=mine[i][1].encode(), headers=headers[i])
                r = conn.getresponse()
                return r.status, r.read()
        else:  # raw: the requests' bytes built beforehand, a minimal reader of the answers
            conn = socket.create_connection((host, port), timeout=60)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            wire = [(f"POST /pdp HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {t}"
                     f"\r\nContent-Type: {XML}\r\nAccept: {JSON}\r\nContent-Length: "
                     f"{len(b.encode())}\r\n\r\n").encode() + b.encode() for t, b, _ in mine]
            pending = [b""]

            def exchange(i: int) -> tuple[int, bytes]:
                conn.sendall(wire[i])
                buf = pending[0]
                while b"\r\n\r\n" not in buf:
                    buf += conn.recv(65536)
                head, _, rest = buf.partition(b"\r\n\r\n")
                at = head.lower().find(b"content-length:")
                end = head.find(b"\r\n", at)
                length = int(head[at + 15:end if end >= 0 else len(head)].strip())
                while len(rest) < length:
                    rest += conn.recv(65536)
                pending[0] = rest[length:]
                return int(head[9:12]), rest[:length]

        def one(i: int) -> bool:
            i %= len(mine)
            status, data = exchange(i)
            want = mine[i][2]
            ok = status == 200 and json.loads(data)["Response"][0]["Decision"] == want
            if not ok and len(samples) < 3:
                samples.append(f"{status} want {want}: {data[:300]!r}")
            return ok

        for i in range(min(WARMUP, len(mine))):
            one(i)
        barrier.wait()
        lat, wrong = [], 0
        clock = time.perf_counter_ns
        for i in range(per_thread):
            t0 = clock()
            ok = one(i)
            lat.append(clock() - t0)
            wrong += not ok
        conn.close()
        with lock:
            results.append((lat, wrong))

    def guarded(k: int) -> None:
        try:
            run(k)
        except BaseException:  # noqa: BLE001 - a dead client thread would leave the barrier
            import traceback

            traceback.print_exc()
            os._exit(1)

    workers = [threading.Thread(target=guarded, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    c0, t0 = time.process_time(), time.perf_counter()
    for w in workers:
        w.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"wall": wall, "cpu": cpu, "wrong": sum(w for _, w in results),
                      "wrong_samples": samples,
                      "lat": [x for lat, _ in results for x in lat]}))


def _clients_in_a_process(port: int, items: list, threads: int, n: int,
                          client: str = "raw") -> dict:
    """Run `threads` client threads in another process; n requests in all."""
    import subprocess

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"host": "127.0.0.1", "port": port, "threads": threads, "client": client,
                   "per_thread": max(1, n // threads), "items": items}, f)
        path = f.name
    try:
        out = subprocess.run([sys.executable, __file__, "--http-client", path],
                             capture_output=True, text=True, timeout=900)
    finally:
        os.unlink(path)
    if out.returncode != 0:
        raise RuntimeError(f"HTTP clients failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_http(workload: wl.Workload, bodies: Sequence[bytes], expected: Sequence[str],
             n_requests: int, profile_top: int = 0, client_threads: Sequence[int] = (1, 4),
             py_spy: str | None = None, client: str = "raw") -> tuple[list[Timing], list[str]]:
    """The gateway app on its server in this process; clients in another process (1 and 4
    threads by default), so that the figure is the server's, not the client's GIL's."""
    try:
        from pep.config import GatewayConfig
        from pep.http.app import create_app
    except ImportError as exc:
        return [], [f"HTTP part skipped: the gateway is not importable yet ({exc})"]

    rows: list[Timing] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="xsg-bench-") as tmp:
        tmp_path = Path(tmp)
        policy_dir = tmp_path / "policies"
        policy_dir.mkdir()
        for name, xml in workload.xacml_policies():
            (policy_dir / name).write_bytes(xml)
        # The gateway decides for the authenticated caller: subject-id and roles come from the
        # token, so every distinct subject of the workload gets its own token.
        tokens: dict[str, str] = {}
        entries = [{"token": "bench-admin", "subject": "bench-admin", "roles": [], "admin": True}]
        for q in workload.queries:
            s = q.subject
            if s.subject_id not in tokens:
                tokens[s.subject_id] = f"bench-{s.subject_id}"
                # the gateway takes the subject's attributes from the token, never the request
                attributes = {}
                if s.level is not None:
                    attributes[wl.LEVEL_ID] = s.level
                if s.department is not None:
                    attributes[wl.DEPARTMENT_ID] = s.department
                entries.append({"token": tokens[s.subject_id], "subject": s.subject_id,
                                "roles": list(s.roles), "admin": False,
                                **({"attributes": attributes} if attributes else {})})
        auth = tmp_path / "auth.json"
        auth.write_text(json.dumps(entries))
        config = GatewayConfig(host="127.0.0.1", port=0, data_dir=tmp_path / "data",
                               auth_file=auth, policies_dir=policy_dir)
        t0 = time.perf_counter()
        app = create_app(config)
        startup = time.perf_counter() - t0
        timer = _AppTimer(app.wsgi_app)
        app.wsgi_app = timer
        server = _Server(app, threads=config.threads)
        spy = None
        try:
            import urllib.request

            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=30) as r:
                health = json.loads(r.read())
            items = [(tokens[q.subject.subject_id], body.decode(), want)
                     for q, body, want in zip(workload.queries, bodies, expected, strict=True)]
            server_cpu_ms: dict[str, float] = {}  # the server's CPU per request, per run
            for threads in client_threads:
                if py_spy and threads == max(client_threads):
                    import subprocess

                    spy = subprocess.Popen(["py-spy", "record", "--pid", str(os.getpid()),
                                            "--threads", "--gil", "--rate", "250", "--format",
                                            "speedscope", "--output", py_spy, "--nonblocking"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(1.0)
                # the app's own time is taken with one client only: the timer's clock calls
                # would cost the concurrent run a tenth of its throughput
                timer.enabled = threads == 1
                n_app = len(timer.cpu_ns)
                c0 = time.process_time()
                got = _clients_in_a_process(server.port, items, threads, n_requests, client)
                server_cpu = time.process_time() - c0
                if spy is not None:
                    spy.send_signal(2)  # SIGINT: py-spy writes its profile and exits
                    spy.wait(timeout=60)
                    spy = None
                n = len(got["lat"])
                if got["wrong"]:
                    notes.append(f"wrong answers over HTTP, e.g.: {got['wrong_samples']}")
                rows.append(Timing(f"xsg over HTTP, {threads} client thread{'s' * (threads > 1)}"
                                   " (other process)", got["lat"], got["wall"], got["wrong"]))
                app_cpu = timer.cpu_ns[n_app:]
                app_part = (f" (the app itself {sum(app_cpu) / len(app_cpu) / 1e6:.3f} ms, the "
                            f"rest is HTTP: parsing, the socket, threads)" if app_cpu else "")
                notes.append(
                    f"HTTP, {threads} client thread(s): {n / got['wall']:,.0f} decisions/s; per "
                    f"request the server process used {server_cpu / n * 1000:.3f} ms of CPU"
                    f"{app_part}, the client process {got['cpu'] / n * 1000:.3f} ms")
                server_cpu_ms[f"{threads} raw client thread(s)"] = server_cpu / n * 1000
            fast = app.extensions["xsg.fast_path"]
            by_token = [(f"Bearer {t}", b.encode(), want) for t, b, want in items]
            in_process = timed_loop(
                "xsg in process as POST /pdp without HTTP (token, XML parsed, decided, JSON "
                "rendered)", by_token, lambda item: _decision(fast.answer(
                    item[0], XML, JSON, item[1], None)[0]), [w for _, _, w in by_token])
            rows.insert(0, in_process)
            def alongside() -> Timing:
                sample = by_token[:1000]
                return timed_loop("in process, beside a wrk run", sample, lambda item: _decision(
                    fast.answer(item[0], XML, JSON, item[1], None)[0]), [w for _, _, w in sample])

            notes.extend(run_wrk(server.port, items, in_process, server_cpu_ms=server_cpu_ms,
                                 alongside=alongside))
            notes.append(cpu_ratios(in_process, server_cpu_ms))
            profile_text = ""
            if profile_top:
                import http.client

                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
                timer.profiler = cProfile.Profile()
                for token, body, _ in items[:n_requests]:
                    conn.request("POST", "/pdp", body=body.encode(), headers={
                        "Authorization": f"Bearer {token}", "Content-Type": XML, "Accept": JSON})
                    conn.getresponse().read()
                timer.profiler.disable()
                conn.close()
                profile_text = _stats_text(timer.profiler, profile_top)
        finally:
            if spy is not None:
                spy.kill()
            server.stop()
            services = app.extensions.get("xsg.services")
            if services is not None:
                services.close()
    notes.insert(0, f"HTTP: gateway start with {health.get('policies')} policies seeded into "
                    f"SQLite: {startup:.2f} s; {server.via}; clients ({client}, keep-alive, "
                    f"XML in, JSON out) in another process")
    if py_spy:
        notes.append(f"py-spy profile of the server during the {max(client_threads)}-thread run: "
                     f"{py_spy} (speedscope format)")
    if profile_text:
        notes.append(f"\n--- cProfile: gateway app serving POST /pdp (server thread), "
                     f"{n_requests} requests, sorted by own time ---\n{profile_text}")
    return rows, notes


def _decision(body: bytes) -> str:
    at = body.find(b'"Decision"')
    start = body.find(b'"', body.find(b":", at)) + 1
    return body[start:body.find(b'"', start)].decode()


def _lua_string(data: bytes) -> str:
    """A Lua string literal of `data` (long brackets would turn CRLF into LF)."""
    return '"' + "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:03d}"
                         for b in data) + '"'


def cpu_ratios(in_process: Timing, server_cpu_ms: dict[str, float]) -> str:
    """Over HTTP against in process by CPU time: the in-process call's mean CPU time over the
    server process's CPU time per request. Blind to how a busy machine shares its cores
    between the server, the load generator and other jobs, which moves the wall-clock ratio."""
    mean_ms = sum(in_process.cpu_ns or [0]) / max(1, len(in_process.cpu_ns or [])) / 1e6
    parts = [f"{label} {mean_ms / ms:.2f}x" for label, ms in server_cpu_ms.items() if ms > 0]
    return (f"by CPU time (in process {mean_ms:.3f} ms per decision / the server's CPU per "
            f"request): " + "; ".join(parts))


def run_wrk(port: int, items: list, in_process: Timing, seconds: int = 10,
            connections: Sequence[int] = (1, 8),
            server_cpu_ms: dict[str, float] | None = None,
            alongside: Callable[[], Timing] | None = None) -> list[str]:
    """`wrk` against POST /pdp, cycling through the workload's requests (each with its subject's
    token); the figures and their ratio to the in-process row, as notes. With `alongside` (a
    short in-process run), each wrk run is also compared with in-process runs just before and
    just after it: on a machine whose load moves, that ratio compares like with like."""
    import re
    import shutil
    import subprocess

    if shutil.which("wrk") is None:
        return ["wrk rows skipped: wrk is not installed (apt-get install wrk, or make wrk)"]
    requests_lua = [
        (f"POST /pdp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {t}\r\n"
         f"Content-Type: {XML}\r\nAccept: {JSON}\r\nContent-Length: {len(b.encode())}\r\n"
         f"\r\n").encode() + b.encode() for t, b, _ in items]
    notes = []
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write("local reqs = {\n" + ",\n".join(_lua_string(r) for r in requests_lua) + "\n}\n")
        f.write("local i = math.random(#reqs)\n"
                "request = function()\n  i = i % #reqs + 1\n  return reqs[i]\nend\n")
        script = f.name
    try:
        for conns in connections:
            before = alongside() if alongside is not None else None
            c0 = time.process_time()
            out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--latency",
                                  "-s", script, f"http://127.0.0.1:{port}/pdp"],
                                 capture_output=True, text=True, timeout=seconds + 60)
            server_cpu = time.process_time() - c0
            after = alongside() if alongside is not None else None
            text = out.stdout
            rate = re.search(r"Requests/sec:\s+([\d.]+)", text)
            total = re.search(r"(\d+) requests in", text)
            bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
            lat = dict(re.findall(r"^\s+(50|90|99)%\s+(\S+)", text, re.M))
            if rate is None or total is None:
                notes.append(f"wrk with {conns} connection(s) failed: {out.stderr[-500:]}")
                continue
            per_s = float(rate.group(1))
            if server_cpu_ms is not None:
                server_cpu_ms[f"wrk -c{conns}"] = server_cpu / int(total.group(1)) * 1000
            notes.append(
                f"wrk, 1 thread, {conns} connection(s), {seconds} s: {per_s:,.0f} decisions/s "
                f"(p50 {lat.get('50')}, p90 {lat.get('90')}, p99 {lat.get('99')}; non-2xx "
                f"{bad.group(1) if bad else 0}); server process CPU "
                f"{server_cpu / int(total.group(1)) * 1000:.3f} ms per request; over HTTP / in "
                f"process (same code without HTTP, {in_process.per_second:,.0f}/s): "
                f"{per_s / in_process.per_second:.2f}x")
            if before is not None and after is not None:
                near = (before.per_second + after.per_second) / 2
                cpu_ms = (sum(before.cpu_ns or [0]) + sum(after.cpu_ns or [0])) / max(
                    1, before.n + after.n) / 1e6
                notes.append(
                    f"  the same against in-process runs just before and after it "
                    f"({before.per_second:,.0f} and {after.per_second:,.0f}/s): "
                    f"{per_s / near:.2f}x; by CPU time ({cpu_ms:.3f} ms in process / "
                    f"{server_cpu / int(total.group(1)) * 1000:.3f} ms in the server): "
                    f"{cpu_ms / (server_cpu / int(total.group(1)) * 1000):.2f}x")
    finally:
        os.unlink(script)
    return notes


# ---------------------------------------------------------------------------------------------
# Reporting


def print_table(rows: list[Timing]) -> None:
    print(f"{'measurement':44} {'n':>6} {'dec/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'mean ms':>8} {'cpu p99':>8} {'wrong':>6}")
    for t in rows:
        cpu = f"{t.percentile_ms(99, cpu=True):8.3f}" if t.cpu_ns else f"{'-':>8}"
        print(f"{t.label:44} {t.n:6d} {t.per_second:9.0f} {t.percentile_ms(50):8.3f} "
              f"{t.percentile_ms(99):8.3f} {t.mean_ms:8.3f} {cpu} {t.mismatches:6d}")


def _stats_text(prof: cProfile.Profile, top: int) -> str:
    out = io.StringIO()
    pstats.Stats(prof, stream=out).strip_dirs().sort_stats("tottime").print_stats(top)
    return out.getvalue()


def profile(label: str, items: Sequence, call: Callable, top: int = 25) -> None:
    prof = cProfile.Profile()
    prof.enable()
    for item in items:
        call(item)
    prof.disable()
    print(f"\n--- cProfile: {label}, {len(items)} requests, sorted by own time ---")
    print(_stats_text(prof, top))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--http-client"]:
        http_client_main(argv[1])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--pyabac-requests", type=int, default=1000,
                    help="py-abac is slow; it decides the first N requests (default 1000)")
    ap.add_argument("--http-requests", type=int, default=4000,
                    help="requests per HTTP measurement (all client threads together)")
    ap.add_argument("--client-threads", default="1,4",
                    help="HTTP client threads to measure with, comma-separated")
    ap.add_argument("--client", choices=("raw", "http.client"), default="raw",
                    help="HTTP client: raw sockets with the requests built beforehand (the "
                         "server's figure), or the standard library's http.client")
    ap.add_argument("--py-spy", metavar="FILE",
                    help="record the server with py-spy during the largest HTTP run")
    ap.add_argument("--only-http", action="store_true", help="skip py-abac and the in-process "
                    "rows except the XML one")
    ap.add_argument("--seed", type=int, default=20260522)
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the in-process XML path and the app behind POST /pdp")
    ap.add_argument("--no-http", action="store_true")
    args = ap.parse_args(argv)

    print(f"machine: {machine()}")
    load_start = load_average()
    workload = wl.generate(args.policies, args.requests, seed=args.seed)
    expected = workload.expected()
    counts = wl.decision_counts(expected)
    print(f"workload: {len(workload.policies)} policies, {len(workload.queries)} requests "
          f"(seed {args.seed}); expected {counts}")
    xml_bodies = [wl.request_xml(q) for q in workload.queries]
    json_bodies = [wl.request_json(q) for q in workload.queries]

    rows: list[Timing] = []
    notes: list[str] = []
    xsg_xml = None
    try:
        engine, xsg_load = load_xsg(workload)
    except ImportError as exc:
        engine, xsg_load = None, None
        notes.append(f"xsg in-process part skipped: pdp.engine is not importable yet ({exc})")
    if engine is not None:
        xsg_xml = timed_loop("xsg in process, XML parsed in loop", xml_bodies,
                             xsg_bytes_call(engine, XML), expected)
        rows.append(xsg_xml)
        if not args.only_http:
            rows.append(timed_loop("xsg in process, JSON parsed in loop", json_bodies,
                                   xsg_bytes_call(engine, JSON), expected))
            contexts, decide = xsg_preparsed(engine, xml_bodies)
            rows.append(timed_loop("xsg in process, pre-parsed (evaluation only)", contexts,
                                   decide, expected))

    abac = pyabac_load = None
    if not args.only_http:
        pyabac_pdp, pyabac_load = load_pyabac(workload)
        n_abac = min(args.pyabac_requests, len(workload.queries))
        abac_bodies = [json.dumps(wl.pyabac_request(q)).encode()
                       for q in workload.queries[:n_abac]]
        abac_expected = [wl.PERMIT if e == wl.PERMIT else "not Permit" for e in expected[:n_abac]]
        abac = timed_loop("py-abac in process, JSON parsed in loop", abac_bodies,
                          pyabac_call(pyabac_pdp), abac_expected)
        rows.append(abac)

    if engine is not None and not args.no_http:
        http_rows, http_notes = run_http(
            workload, xml_bodies, expected, args.http_requests,
            profile_top=25 if args.profile else 0,
            client_threads=[int(x) for x in args.client_threads.split(",")],
            py_spy=args.py_spy, client=args.client)
        rows.extend(http_rows)
        notes.extend(http_notes)

    print()
    if xsg_load is not None:
        per = xsg_load / len(workload.policies)
        print(f"xsg policy load:     {xsg_load:8.3f} s total, {per * 1e3:7.3f} ms per policy "
              f"(paper: {PAPER_LOAD_S_PER_POLICY * 1e3:.0f} ms per policy, "
              f"{PAPER_LOAD_S_PER_POLICY / per:,.0f}x faster)")
    if pyabac_load is not None:
        print(f"py-abac policy load: {pyabac_load:8.3f} s total, "
              f"{pyabac_load / len(workload.policies) * 1e3:7.3f} ms per policy")
    print()
    print_table(rows)
    print("(latencies are wall-clock per call; 'cpu p99' is the calling thread's CPU time, which "
          "a busy machine's preemption does not inflate (over HTTP it leaves out the server's "
          "threads); 'wrong': decisions differing from the workload's reference semantics, "
          "py-abac scored on Permit vs not-Permit)")
    print(f"load average at start {load_start}, at end {load_average()}")
    http_rows = [r for r in rows if "over HTTP" in r.label]
    if xsg_xml is not None and http_rows:
        best = max(http_rows, key=lambda r: r.per_second)
        print(f"\nover HTTP / in process (XML parsed in loop), side by side in this run: "
              f"{best.per_second:,.0f} / {xsg_xml.per_second:,.0f} decisions/s = "
              f"{best.per_second / xsg_xml.per_second:.2f} (aim: 2,000 decisions/s over HTTP)")
    if xsg_xml is not None and abac is not None:
        ratio = xsg_xml.per_second / abac.per_second
        print(f"\nratio xsg (XML parsed in loop) / py-abac, decisions/s: {ratio:.1f}x "
              f"(aim >= 20x: {'met' if ratio >= 20 else 'MISSED'}); "
              f"xsg p99 {xsg_xml.percentile_ms(99):.3f} ms "
              f"(aim < 1 ms: {'met' if xsg_xml.percentile_ms(99) < 1 else 'MISSED'}; "
              f"CPU-time p99 {xsg_xml.percentile_ms(99, cpu=True):.3f} ms)")
        print(f"ratio by CPU time (decisions per CPU-second, insensitive to other load): "
              f"{xsg_xml.per_cpu_second / abac.per_cpu_second:.1f}x "
              f"({xsg_xml.per_cpu_second:.0f} vs {abac.per_cpu_second:.0f})")
        if len(workload.policies) == 1000:
            print(f"ratio against the issue's py-abac figure ({ISSUE_PYABAC_PER_SECOND} dec/s with "
                  f"1,000 policies): {xsg_xml.per_second / ISSUE_PYABAC_PER_SECOND:.1f}x")
    for note in notes:
        print(note)

    if args.profile and engine is not None:
        profile("xsg decide_bytes(XML)", xml_bodies, xsg_bytes_call(engine, XML))
    return 0


if __name__ == "__main__":
    sys.exit(main())
