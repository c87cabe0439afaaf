"""PAP benchmark: the cost of changing the policy set, next to a from-scratch compile.

    .venv/bin/python tests/bench/bench_pap.py [--sizes 1000,2000] [--adds 15] [--bulk 1000]
                                              [--requests 2000] [--seed N]

With the workload of pdp_workload.py (the policies of bench_pdp.py), for each size N:
  * PolicyService.add of one policy to a service holding N stored policies (SQLite store in a
    temporary directory, synchronous=FULL: the figure includes the fsync), median and p90 of
    `--adds` consecutive adds; and its phases measured apart: compiling the document, the
    engine change (with_changes of one compiled document on the N-policy engine) and the store
    transaction (the fsync makes this one depend on the disk and on other I/O);
  * side by side, in the same run: a from-scratch compile of the same N+1 documents (parse,
    compile, link, index: what a restart does), and a rebuild of the engine from the N+1 already
    compiled documents (what every change cost before the engine became incremental);
  * decisions/s on pre-parsed requests of the engine built by the adds and of a from-scratch
    engine over the same documents (they must agree, and so must the workload's reference
    semantics), so that an incrementally built index is seen to cost nothing at decision time
    (best of interleaved rounds).
Then add_many of `--bulk` policies into an empty service (one transaction, one engine change)
against a from-scratch compile of the same documents and against adding them one by one.
Timings are printed, never asserted.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import pdp_workload as wl
from bench_pdp import load_average, machine

from pdp.engine import PolicyEngine, PolicySource, compile_policy
from pdp.policy_parser import compile_document
from pdp.request import parse_request
from pdp.service import PolicyService
from pdp.store import SQLitePolicyStore

XML = "application/xacml+xml"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.3f} ms"


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def timed(call, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def throughput(engines: list[PolicyEngine], contexts: list,
               rounds: int = 5) -> list[tuple[float, list[str]]]:
    """Best decisions/s of each engine over `rounds` interleaved rounds (a busy machine slows
    some rounds; interleaving gives every engine the same chances)."""
    best = [0.0] * len(engines)
    decisions: list[list[str]] = [[] for _ in engines]
    for _ in range(rounds):
        for i, engine in enumerate(engines):
            gc.collect()
            t0 = time.perf_counter()
            decisions[i] = [engine.decide(c).results[0].decision.value for c in contexts]
            best[i] = max(best[i], len(contexts) / (time.perf_counter() - t0))
    return list(zip(best, decisions, strict=True))


def run_size(n: int, adds: int, workload: wl.Workload, contexts: list, expected: list[str],
             tmp: Path) -> None:
    sources = [PolicySource(name, xml) for name, xml in workload.xacml_policies()]
    base, extra = sources[:n], sources[n:n + adds]
    store = SQLitePolicyStore(tmp / f"pap-{n}.db")
    docs = [compile_policy(s) for s in base]
    store.put_all([(d.info.id, d.info.version, "bench", d.source.data, d.info.is_policy_set)
                   for d in docs])
    t0 = time.perf_counter()
    service = PolicyService(store)
    start_s = time.perf_counter() - t0
    engine_n = service.engine

    # The phases of an add, apart: compiling the document, the engine change (always on the
    # N-policy engine, so N stays N) and the store transaction (into a copy of the store).
    compile_s = [timed(lambda src=src: compile_document(src), 1)[0] for src in extra]
    one = compile_policy(PolicySource("one more", extra[0].data))
    change = timed(lambda: engine_n.with_changes(upsert=[one]), 25)
    side = SQLitePolicyStore(tmp / f"pap-{n}-side.db")
    side.put_all([(d.info.id, d.info.version, "bench", d.source.data, False) for d in docs])
    put_s = [timed(lambda i=i: side.put(f"side-{i}", "1.0", "bench", one.source.data,
                                        must_exist=False), 1)[0] for i in range(adds)]
    side.close()
    # Adds through the service: compile + engine change + store transaction (+ events: none).
    add_times = []
    for src in extra:
        gc.collect()
        t0 = time.perf_counter()
        service.add(src.data, owner="bench", source=src.name)
        add_times.append(time.perf_counter() - t0)
    # From scratch, same run: N+1 documents parsed and compiled, and the engine rebuilt from
    # N+1 compiled documents (the old per-change cost).
    plus_one = base + extra[:1]
    scratch = timed(lambda: PolicyEngine.compile(plus_one), 3)
    compiled_plus_one = docs + [one]
    rebuild = timed(lambda: PolicyEngine(compiled_plus_one, "deny-overrides", None), 5)

    print(f"\n== {n} stored policies (service start-up: {start_s:.2f} s)")
    print(f"  PolicyService.add, one policy   median {ms(statistics.median(add_times))}   "
          f"p90 {ms(p90(add_times))}   ({adds} adds: {n} -> {n + adds})")
    print(f"    its phases apart: compile     median {ms(statistics.median(compile_s))}")
    print(f"                      engine change median {ms(statistics.median(change))}   "
          f"(with_changes of one compiled document)")
    print(f"                      store write   median {ms(statistics.median(put_s))}   "
          f"p90 {ms(p90(put_s))}   (one SQLite transaction, fsync)")
    print(f"  from-scratch compile of {n + 1}   median {ms(statistics.median(scratch))}")
    print(f"  engine rebuilt from {n + 1} compiled documents (the old per-change cost) "
          f"median {ms(statistics.median(rebuild))}")
    # Decisions: the engine built by the adds against a fresh compile of the same documents.
    fresh = PolicyEngine.compile(base + extra)
    (inc_rate, inc_dec), (fresh_rate, fresh_dec) = throughput([service.engine, fresh], contexts)
    wrong = sum(a != b for a, b in zip(inc_dec, expected, strict=True))
    differ = sum(a != b for a, b in zip(inc_dec, fresh_dec, strict=True))
    print(f"  decisions/s (pre-parsed), engine built by adds {inc_rate:10,.0f}   "
          f"fresh compile {fresh_rate:10,.0f}   (differing: {differ}, wrong vs reference: "
          f"{wrong} of {len(contexts)})")
    store.close()


def run_bulk(bulk: int, tmp: Path, seed: int) -> None:
    workload = wl.generate(bulk, 1, seed=seed + 1)
    sources = [PolicySource(name, xml) for name, xml in workload.xacml_policies()]
    bulk_times, one_by_one = [], []
    for attempt in range(3):
        store = SQLitePolicyStore(tmp / f"bulk-{attempt}.db")
        service = PolicyService(store)
        gc.collect()
        t0 = time.perf_counter()
        service.add_many(sources, owner="bench")
        bulk_times.append(time.perf_counter() - t0)
        store.close()
    store = SQLitePolicyStore(tmp / "one-by-one.db")
    service = PolicyService(store)
    gc.collect()
    t0 = time.perf_counter()
    for src in sources:
        service.add(src.data, owner="bench", source=src.name)
    one_by_one.append(time.perf_counter() - t0)
    store.close()
    scratch = timed(lambda: PolicyEngine.compile(sources), 3)
    print(f"\n== add_many of {bulk} policies into an empty service")
    print(f"  add_many (compile, one engine change, one transaction) median "
          f"{ms(statistics.median(bulk_times))}   ({statistics.median(bulk_times) / bulk * 1e3:.3f}"
          f" ms per policy)")
    print(
        f"  from-scratch compile of the same {bulk}       median {ms(statistics.median(scratch))}"
    )
    print(f"  the same {bulk} added one by one (add)        total  {ms(one_by_one[0])}   "
          f"({one_by_one[0] / bulk * 1e3:.3f} ms per policy)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,2000")
    ap.add_argument("--adds", type=int, default=15)
    ap.add_argument("--bulk", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=20260522)
    args = ap.parse_args(argv)
    print(f"machine: {machine()}")
    print(f"load average at start {load_average()}")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    with tempfile.TemporaryDirectory(prefix="xsg-bench-pap-") as tmp:
        for n in sizes:
            workload = wl.generate(n + args.adds, args.requests, seed=args.seed)
            contexts = [parse_request(wl.request_xml(q), XML) for q in workload.queries]
            run_size(n, args.adds, workload, contexts, workload.expected(), Path(tmp))
        if args.bulk:
            run_bulk(args.bulk, Path(tmp), args.seed)
    print(f"\nload average at end {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
