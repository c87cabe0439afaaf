"""AuthZEN benchmark: `POST /access/v1/evaluation(s)` beside `POST /pdp` on the same decisions,
over HTTP, in the same run (issue 47).

    .venv/bin/python tests/bench/bench_authzen.py [--policies 1000] [--requests 2000]
                                                  [--seconds 8] [--rounds 2] [--connections 1,8]

The workload is bench_pdp.py's (pdp_workload.py: seeded policies, subjects with roles, a level and
a department, requests over resources and actions). The gateway app (pep.http.app.create_app,
the policies seeded into its SQLite store) runs on its own server (server.serving) on loopback;
each subject of the workload has a bearer token whose identity carries its roles and attributes.
Each request is written four ways: XACML XML and XACML JSON for POST /pdp, an AuthZEN Access
Evaluation, and AuthZEN Access Evaluations in batches of 10 and of 100 (the same requests, one
subject per batch: the subject is the caller). Then:

  * correctness: every request once through each form over HTTP (http.client), every decision
    compared with the workload's reference semantics (Permit is AuthZEN's `true`);
  * in process, without HTTP: POST /pdp's fast path (`FastPdp.decide`, JSON in and out) and the
    AuthZEN route's own work (parse, decide as the caller, render) on the same requests;
  * over HTTP with `wrk` (apt-get install wrk, or `make wrk`), 1 thread and each --connections,
    --seconds per run, the forms interleaved in --rounds rounds (the machine's load moves): the
    requests per second, the decisions per second (a batch is N decisions), latency percentiles,
    the non-2xx count and the server process's CPU time per decision.

Figures are printed, never asserted; the machine, its load and what ran are printed with them.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import bench_pdp as bp
import pdp_workload as wl

XML = "application/xacml+xml"
JSON = "application/xacml+json"
EVALUATION = "/access/v1/evaluation"
EVALUATIONS = "/access/v1/evaluations"
BATCHES = (10, 100)


@dataclass
class Form:
    """One way of asking the workload's questions: the HTTP requests (path, token, body,
    content type) and how many decisions each carries."""

    label: str
    path: str
    content_type: str
    requests: list[tuple[str, bytes]]  # (token, body)
    per_request: int = 1
    wrk: list[dict] = field(default_factory=list)  # one entry per wrk run


def authzen_body(q: wl.Query) -> dict:
    return {"subject": {"type": "user", "id": q.subject.subject_id},
            "resource": {"type": "resource", "id": q.resource}, "action": {"name": q.action}}


def build_forms(
    workload: wl.Workload, tokens: dict[str, str]
) -> tuple[list[Form], list[list[str]]]:
    """The four forms (and the batches' expected decisions, per request)."""
    queries = workload.queries
    token = [tokens[q.subject.subject_id] for q in queries]
    forms = [
        Form("POST /pdp, XACML XML", "/pdp", XML,
             [(t, wl.request_xml(q)) for t, q in zip(token, queries, strict=True)]),
        Form("POST /pdp, XACML JSON", "/pdp", JSON,
             [(t, wl.request_json(q)) for t, q in zip(token, queries, strict=True)]),
        Form("AuthZEN evaluation", EVALUATION, "application/json",
             [(t, json.dumps(authzen_body(q)).encode())
              for t, q in zip(token, queries, strict=True)]),
    ]
    expected = workload.expected()
    batch_expected: list[list[str]] = []
    for size in BATCHES:
        by_subject: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            by_subject.setdefault(q.subject.subject_id, []).append(i)
        requests = []
        wanted_all = []
        for subject, indexes in by_subject.items():
            # a subject's requests, cycled to whole batches of `size`
            cycle = [indexes[k % len(indexes)] for k in range(max(size, len(indexes)))]
            for start in range(0, len(cycle) - size + 1, size):
                chunk = cycle[start:start + size]
                body = {"subject": {"type": "user", "id": subject},
                        "evaluations": [{"resource": {"type": "resource",
                                                      "id": queries[i].resource},
                                         "action": {"name": queries[i].action}} for i in chunk]}
                requests.append((tokens[subject], json.dumps(body).encode()))
                wanted_all.append([expected[i] for i in chunk])
        forms.append(Form(f"AuthZEN evaluations, batches of {size}", EVALUATIONS,
                          "application/json", requests, per_request=size))
        batch_expected.append(wanted_all)
    return forms, batch_expected


def decisions_of(form: Form, status: int, data: bytes) -> list[str]:
    """The decisions of one answer, as the workload's names (AuthZEN: Permit or not)."""
    if status != 200:
        return [f"HTTP {status}"] * form.per_request
    doc = json.loads(data)
    if form.path == "/pdp":
        if form.content_type == XML:
            return [bp._decision(data)] if b'"Decision"' in data else ["?"]
        return [doc["Response"][0]["Decision"]]
    items = doc["evaluations"] if "evaluations" in doc else [doc]
    return [wl.PERMIT if item["decision"] is True else "not Permit" for item in items]


def check_over_http(
    port: int, form: Form, wanted: Sequence[Sequence[str]]
) -> tuple[int, int, float]:
    """Every request of `form` once, sequentially on one keep-alive connection: (decisions,
    wrong, seconds)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    wrong = decided = 0
    accept = JSON if form.path == "/pdp" else "application/json"
    t0 = time.perf_counter()
    for (token, body), want in zip(form.requests, wanted, strict=True):
        conn.request("POST", form.path, body=body, headers={
            "Authorization": f"Bearer {token}", "Content-Type": form.content_type,
            "Accept": accept})
        r = conn.getresponse()
        got = decisions_of(form, r.status, r.read())
        if form.path != "/pdp":
            want = [wl.PERMIT if w == wl.PERMIT else "not Permit" for w in want]
        decided += len(got)
        wrong += sum(g != w for g, w in zip(got, want, strict=False)) + abs(len(got) - len(want))
    conn.close()
    return decided, wrong, time.perf_counter() - t0


def run_wrk(port: int, form: Form, connections: int, seconds: int) -> dict:
    """One wrk run over `form`'s requests (cycled); its figures, with this process's CPU time
    (the server's: wrk is another process)."""
    accept = JSON if form.path == "/pdp" else "application/json"
    wire = [(f"POST {form.path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer "
             f"{t}\r\nContent-Type: {form.content_type}\r\nAccept: {accept}\r\nContent-Length: "
             f"{len(b)}\r\n\r\n").encode() + b for t, b in form.requests]
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write("local reqs = {\n" + ",\n".join(bp._lua_string(r) for r in wire) + "\n}\n")
        f.write("local i = math.random(#reqs)\n"
                "request = function()\n  i = i % #reqs + 1\n  return reqs[i]\nend\n")
        script = f.name
    try:
        c0 = time.process_time()
        out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
                              "-s", script, f"http://127.0.0.1:{port}{form.path}"],
                             capture_output=True, text=True, timeout=seconds + 120)
        cpu = time.process_time() - c0
    finally:
        os.unlink(script)
    text = out.stdout
    rate = re.search(r"Requests/sec:\s+([\d.]+)", text)
    total = re.search(r"(\d+) requests in", text)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    lat = dict(re.findall(r"^\s+(50|90|99)%\s+(\S+)", text, re.M))
    if rate is None or total is None:
        return {"failed": (out.stderr or text)[-400:]}
    n = int(total.group(1))
    return {"connections": connections, "requests_per_s": float(rate.group(1)),
            "decisions_per_s": float(rate.group(1)) * form.per_request,
            "p50": lat.get("50"), "p90": lat.get("90"), "p99": lat.get("99"),
            "non_2xx": int(bad.group(1)) if bad else 0,
            "cpu_ms_per_decision": cpu / max(1, n * form.per_request) * 1000}


def in_process_rows(app, forms: list[Form], expected: list[str], n: int) -> list[bp.Timing]:
    """The same decisions without HTTP: POST /pdp's fast path, and the AuthZEN route's work
    (parse, decide as the caller, render), on the first n requests."""
    from pdp.authzen import decision_json, parse_evaluation
    from pdp.http.decisions import decide_as

    fast = app.extensions["xsg.fast_path"]
    services = app.extensions["xsg.services"]
    authenticator = services.authenticator
    environment = services.stream_events.environment_for
    pdp_json = forms[1]
    authzen = forms[2]
    want = expected[:n]

    def via_fast(item: tuple[str, bytes]) -> str:
        body, _ = fast.answer(f"Bearer {item[0]}", JSON, JSON, item[1], None)
        return bp._decision(body)

    def via_authzen(item: tuple[str, bytes]) -> str:
        identity = authenticator.authenticate_header(f"Bearer {item[0]}")
        evaluation = parse_evaluation(json.loads(item[1]))
        result = decide_as(services.policies, identity, evaluation.request, environment)
        body = json.dumps(decision_json(result.results[0]))
        return wl.PERMIT if body.startswith('{"decision": true') else "not Permit"

    rows = [bp.timed_loop("in process: POST /pdp fast path (JSON in, JSON out)",
                          pdp_json.requests[:n], via_fast, want),
            bp.timed_loop("in process: AuthZEN evaluation (parse, decide, render)",
                          authzen.requests[:n], via_authzen,
                          [wl.PERMIT if w == wl.PERMIT else "not Permit" for w in want])]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seconds", type=int, default=8, help="seconds per wrk run")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of wrk runs")
    ap.add_argument("--connections", default="1,8", help="wrk connections, comma-separated")
    ap.add_argument("--seed", type=int, default=20260522)
    args = ap.parse_args(argv)

    from pep.config import GatewayConfig
    from pep.http.app import create_app

    print(f"machine: {bp.machine()}")
    print(f"load average at start: {bp.load_average()}")
    workload = wl.generate(args.policies, args.requests, seed=args.seed)
    expected = workload.expected()
    print(f"workload: {len(workload.policies)} policies, {len(workload.queries)} requests "
          f"(seed {args.seed}); expected {wl.decision_counts(expected)}")
    with tempfile.TemporaryDirectory(prefix="xsg-bench-authzen-") as tmp:
        tmp_path = Path(tmp)
        policy_dir = tmp_path / "policies"
        policy_dir.mkdir()
        for name, xml in workload.xacml_policies():
            (policy_dir / name).write_bytes(xml)
        tokens: dict[str, str] = {}
        entries = []
        for q in workload.queries:
            s = q.subject
            if s.subject_id in tokens:
                continue
            tokens[s.subject_id] = f"bench-{s.subject_id}"
            attributes: dict[str, object] = {}
            if s.level is not None:
                attributes[wl.LEVEL_ID] = s.level
            if s.department is not None:
                attributes[wl.DEPARTMENT_ID] = s.department
            entries.append({"token": tokens[s.subject_id], "subject": s.subject_id,
                            "roles": list(s.roles), **({"attributes": attributes}
                                                       if attributes else {})})
        auth = tmp_path / "auth.json"
        auth.write_text(json.dumps(entries))
        config = GatewayConfig(host="127.0.0.1", port=0, data_dir=tmp_path / "data",
                               auth_file=auth, policies_dir=policy_dir)
        app = create_app(config)
        server = bp._Server(app, threads=config.threads)
        try:
            forms, batch_expected = build_forms(workload, tokens)
            wanted = [[[e] for e in expected]] * 3 + batch_expected
            print(f"\nserver: {server.via}, port {server.port}, {config.threads} threads")
            print("\ncorrectness over HTTP (every request once, one keep-alive connection):")
            for form, want in zip(forms, wanted, strict=True):
                decided, wrong, secs = check_over_http(server.port, form, want)
                print(f"  {form.label:40} {len(form.requests):5d} requests, {decided:6d} "
                      f"decisions, wrong {wrong}, {decided / secs:8,.0f} decisions/s "
                      f"(sequential)")

            print("\nin process, without HTTP (the same requests):")
            rows = in_process_rows(app, forms, expected, min(len(expected), 2000))
            bp.print_table(rows)

            if shutil.which("wrk") is None:
                print("\nwrk runs skipped: wrk is not installed (apt-get install wrk, or make "
                      "wrk)")
                return 0
            connections = [int(c) for c in args.connections.split(",")]
            print(f"\nwrk: 1 thread, {args.seconds} s per run, connections {connections}, "
                  f"{args.rounds} interleaved round(s)")
            for _ in range(args.rounds):
                for conns in connections:
                    for form in forms:
                        form.wrk.append(run_wrk(server.port, form, conns, args.seconds))
            print(f"{'form':40} {'conns':>5} {'req/s':>8} {'decisions/s':>12} {'p50':>8} "
                  f"{'p99':>8} {'non2xx':>7} {'CPU ms/dec':>10}")
            summary: dict[int, dict[str, float]] = {}
            for conns in connections:
                for form in forms:
                    runs = [r for r in form.wrk if r.get("connections") == conns]
                    failed = [r for r in form.wrk if "failed" in r]
                    if not runs:
                        print(f"{form.label:40} {conns:5d} wrk failed: "
                              f"{failed[0]['failed'] if failed else '?'}")
                        continue
                    best = max(runs, key=lambda r: r["decisions_per_s"])
                    med = statistics.median(r["decisions_per_s"] for r in runs)
                    cpu = statistics.median(r["cpu_ms_per_decision"] for r in runs)
                    summary.setdefault(conns, {})[form.label] = med
                    print(f"{form.label:40} {conns:5d} "
                          f"{statistics.median(r['requests_per_s'] for r in runs):8,.0f} "
                          f"{med:12,.0f} {best['p50']:>8} {best['p99']:>8} "
                          f"{sum(r['non_2xx'] for r in runs):7d} {cpu:10.3f}")
            print("(decisions/s and CPU: the median over the rounds; p50/p99: the best run's; "
                  "CPU: the server process's CPU time per decision)")
            for conns, figures in summary.items():
                base = figures.get("POST /pdp, XACML JSON")
                if not base:
                    continue
                ratios = ", ".join(f"{label} {value / base:.2f}x" for label, value
                                   in figures.items() if label != "POST /pdp, XACML JSON")
                print(f"  {conns} connection(s), decisions/s against POST /pdp (JSON): {ratios}")
        finally:
            server.stop()
            services = app.extensions.get("xsg.services")
            if services is not None:
                services.close()
    print(f"\nload average at end: {bp.load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
