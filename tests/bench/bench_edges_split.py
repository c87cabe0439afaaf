"""Where a row's time goes on the edges path: bench_edges' `edges-K` sides run with timing taps.

Run: .venv/bin/python tests/bench/bench_edges_split.py [--edges 1,2] [--handles 1000]
         [--heap 448m] [--options '{"kafka.batch.size": "16384"}'] [--out DIR]

Each side is bench_edges' (`run_side`: a fresh gateway process, its edges, the readers, the
ingest) with, in the side's process:
  * every micro-batch of the stream query: its foreachBatch span and Spark's progress report
    (`durationMs` per phase, input rows);
  * every write of the rows to the plan topics (`TopicRows.write`) and of the warm records
    (`TopicWarmer._write`);
  * Spark's event log (`events-<side>/`): per micro-batch of the side's query, its jobs and
    their stages (tasks' run, deserialize and GC time);
  * a cProfile of the first micro-batches with plans (`profile-<side>-<batch>.txt`) and of the
    revocation (`profile-<side>-revocation.txt`: `HandleService.finish_many`), and the spans of
    the revocation's steps from the DELETE's start (the pass's transaction, the edges told,
    their acknowledgements);
and in this process, for the whole run:
  * a consumer of every plan topic (`fetch.wait.max.ms` 100: it adds its own fetches to the
    broker's load, fewer than an edge's): per record, the tuple's ingest time (`sent` in the
    row), the record's Kafka timestamp (CreateTime: when Spark's producer took it) and when the
    consumer got it;
  * the broker's garbage collections (`jstat -gc`, when a JDK's jstat is on PATH).
`--options` adds Spark Kafka sink options (an experiment: e.g. another batch.size).
Printed per side: ingest -> producer (the gateway's share) and producer -> consumer (the
producer's queue, the broker, a fetch) per 5 s of ingest; the batches' durations and their
write's share; the first batches' jobs; the revocation's steps; the broker's full GCs over the
side. Raw data stays in --out.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench import bench_edges as edges
from tests.bench.harness import load_average, reply, run_child, run_command


def install_taps(out: Path, options: dict[str, str]) -> None:
    """Wrap the write paths and add a progress listener to the side's Spark session."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    import pep.runtime.session as session
    from pep.delivery import control, settings, topics
    from pep.runtime.delivery import topic_rows, warm
    from pep.runtime.query import runner

    sink = open(out, "a", buffering=1)
    lock = threading.Lock()

    def emit(**kw: Any) -> None:
        with lock:
            sink.write(json.dumps(kw) + "\n")

    if options:
        spark_options = settings.DeliverySettings.spark_options
        settings.DeliverySettings.spark_options = (  # type: ignore[method-assign]
            lambda self: {**spark_options(self), **options})

    def timed(kind: str, fn: Any, **fields: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.time()
            try:
                return fn(*a, **k)
            finally:
                extra = {name: get(a) for name, get in fields.items()}
                emit(kind=kind, start=t, end=time.time(), **extra)
        return wrapper

    topic_rows.TopicRows.write = timed("rows_write",  # type: ignore[method-assign]
                                       topic_rows.TopicRows.write)
    warm.TopicWarmer._write = timed("warm_write", warm.TopicWarmer._write,  # type: ignore[method-assign]
                                    n=lambda a: len(a[1]))
    topics.PlanTopics.ended = timed("ended", topics.PlanTopics.ended,  # type: ignore[method-assign]
                                    n=lambda a: len(a[1]))
    control.Revocations.publish = timed(  # type: ignore[method-assign]
        "publish", control.Revocations.publish, n=lambda a: len(list(a[1])))
    from pep.handles import service as handles_service

    finish_many = handles_service.HandleService.finish_many

    def finish_profiled(self: Any, endings: Any, *a: Any, **k: Any) -> Any:
        """A revocation of many handles under cProfile (`profile-<side>-revocation.txt`)."""
        import cProfile
        import pstats

        endings = list(endings)
        if len(endings) < 100:
            return finish_many(self, endings, *a, **k)
        prof = cProfile.Profile()
        t = time.time()
        try:
            return prof.runcall(finish_many, self, endings, *a, **k)
        finally:
            emit(kind="finish_many", start=t, end=time.time(), n=len(endings))
            side = out.stem.removeprefix("spans-")
            with open(out.parent / f"profile-{side}-revocation.txt", "w") as f:
                pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
    handles_service.HandleService.finish_many = finish_profiled  # type: ignore[method-assign]
    import requests

    requests.delete = timed("delete", requests.delete)  # the side's revocation
    run = timed("batch", runner.MicroBatchRunner.run, batch=lambda a: a[2])
    profiled: list[int] = []

    def run_profiled(self: Any, batch: Any, batch_id: int) -> Any:
        """The first micro-batches with rows of the side's query under cProfile (in
        `profile-<side>-<batch>.txt`): where a slow first batch's driver time goes."""
        import cProfile
        import pstats

        if batch_id > 2 or len(profiled) >= 3 or not self._registry.plan_sets().plans:
            return run(self, batch, batch_id)
        profiled.append(batch_id)
        prof = cProfile.Profile()
        try:
            return prof.runcall(run, self, batch, batch_id)
        finally:
            side = out.stem.removeprefix("spans-")
            with open(out.parent / f"profile-{side}-{batch_id}.txt", "w") as f:
                pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
    runner.MicroBatchRunner.run = run_profiled  # type: ignore[method-assign]

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            emit(kind="progress", t=time.time(), batch=p.batchId, rows=p.numInputRows,
                 dur=dict(p.durationMs))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    create = session.create_spark_session
    events = out.parent / f"events-{out.stem.removeprefix('spans-')}"
    events.mkdir(exist_ok=True)

    def created(*a: Any, **k: Any) -> Any:
        k["extra_conf"] = {**(k.get("extra_conf") or {}), "spark.eventLog.enabled": "true",
                           "spark.eventLog.dir": events.as_uri(),
                           "spark.eventLog.compress": "false"}
        spark = create(*a, **k)
        spark.streams.addListener(Progress())
        return spark

    session.create_spark_session = created


def side_main(a: dict[str, Any]) -> None:
    install_taps(Path(a.pop("spans")), a.pop("options"))
    with tempfile.TemporaryDirectory(prefix="xsg-bench-split-") as tmp:
        figures = edges.run_side(**a, tmp=Path(tmp))
    edges.report(figures)
    reply(figures)


def consume(brokers: str, stop: threading.Event, path: list[Path]) -> None:
    """Every plan topic's records: (got, Kafka timestamp, sent) to the current side's file."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": brokers, "group.id": "split", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
                  "topic.metadata.refresh.interval.ms": 1000, "log_level": 2})
    c.subscribe([r"^xsg\.plan\..*"])
    current, f = None, None
    try:
        while not stop.is_set():
            if path[0] != current:
                current = path[0]
                f = open(current, "a", buffering=1 << 16)
            for m in c.consume(500, 0.05):
                if m.error() is not None or not m.value():
                    continue
                now = time.time()
                kind, ts = m.timestamp()
                try:
                    sent = json.loads(m.value() or b"{}").get("sent")
                except ValueError:
                    continue
                if sent is not None and ts > 0 and f is not None:
                    f.write(f"{now} {ts / 1000} {sent}\n")
    finally:
        c.close()


def cpu_watch(pid: int, stop: threading.Event, out: Path) -> None:
    """Every second: (time, the broker's CPU seconds so far, the machine's idle and busy
    jiffies so far): whether the broker waits for a core while the gateway waits on it."""
    with open(out, "a") as f:
        while not stop.is_set():
            fields = Path("/proc/stat").read_text().split("\n")[0].split()[1:]
            idle = int(fields[3]) + int(fields[4])
            busy = sum(int(x) for x in fields[:8]) - idle
            f.write(f"{time.time()} {edges.cpu_seconds(pid)} {idle} {busy}\n")
            f.flush()
            stop.wait(1)


def gc_watch(pid: int, stop: threading.Event, out: Path) -> None:
    """`jstat -gc` of the broker every 2 s: (time, full GCs, their seconds, young GCs' seconds,
    old generation used MB)."""
    jstat = shutil.which("jstat")
    if jstat is None:
        return
    with open(out, "a") as f:
        while not stop.is_set():
            got = subprocess.run([jstat, "-gc", str(pid)], capture_output=True, text=True)
            lines = got.stdout.split("\n")
            if len(lines) > 1 and lines[1].strip():
                head, row = lines[0].split(), lines[1].split()
                v = dict(zip(head, row, strict=False))
                f.write(f"{time.time()} {v.get('FGC')} {v.get('FGCT')} {v.get('YGCT')} "
                        f"{float(v.get('OU', 'nan')) / 1024:.0f} "
                        f"{float(v.get('OC', 'nan')) / 1024:.0f}\n")
                f.flush()
            stop.wait(2)


def jobs_by_batch(events: Path, batches: int) -> None:
    """Spark's event log of a side: per micro-batch of the stream query, its jobs (from their
    submission to their end) and each job's stages (tasks; summed run, deserialize and GC
    time of the tasks, ms), so a slow batch shows which step is slow."""
    logs = sorted(events.glob("*")) if events.exists() else []
    if not logs:
        return
    jobs: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}
    stages: dict[int, dict[str, Any]] = {}
    files = sorted(logs[-1].glob("events_*")) if logs[-1].is_dir() else [logs[-1]]
    lines = [ln for f in files for ln in f.read_text().splitlines() if ln.strip()]
    for line in lines:
        e = json.loads(line)
        kind = e.get("Event")
        if kind == "SparkListenerJobStart":
            props = e.get("Properties") or {}
            batch = props.get("streaming.sql.batchId")
            jobs[e["Job ID"]] = {"batch": None if batch is None else int(batch),
                                 "query": props.get("sql.streaming.queryId")
                                 or props.get("spark.job.description", "").split("\n")[0],
                                 "start": e["Submission Time"], "end": None,
                                 "stages": [s["Stage ID"] for s in e["Stage Infos"]]}
            for s in e["Stage Infos"]:
                stage_job[s["Stage ID"]] = e["Job ID"]
        elif kind == "SparkListenerJobEnd" and e["Job ID"] in jobs:
            jobs[e["Job ID"]]["end"] = e["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = e["Stage Info"]
            stages[info["Stage ID"]] = {"name": info["Stage Name"].split(" at ")[0],
                                        "tasks": info["Number of Tasks"],
                                        "start": info.get("Submission Time"),
                                        "end": info.get("Completion Time"),
                                        "run": 0, "deser": 0, "gc": 0}
        elif kind == "SparkListenerTaskEnd" and e.get("Task Metrics"):
            m = e["Task Metrics"]
            s = stages.setdefault(e["Stage ID"], {"name": "?", "tasks": 0, "start": None,
                                                  "end": None, "run": 0, "deser": 0, "gc": 0})
            s["run"] += m.get("Executor Run Time", 0)
            s["deser"] += m.get("Executor Deserialize Time", 0)
            s["gc"] += m.get("JVM GC Time", 0)
    per_query: dict[str, int] = {}
    for job in jobs.values():
        if job["batch"] is not None and job["query"]:
            per_query[job["query"]] = per_query.get(job["query"], 0) + 1
    if not per_query:
        return
    busiest = max(per_query, key=lambda k: per_query[k])  # the side's stream, not the warm-up
    per_batch: dict[int, list[dict[str, Any]]] = {}
    for job in jobs.values():
        if job["batch"] is not None and job["query"] == busiest:
            per_batch.setdefault(job["batch"], []).append(job)
    for batch in sorted(per_batch)[:batches]:
        parts = []
        for job in sorted(per_batch[batch], key=lambda j: j["start"]):
            inner = []
            for sid in job["stages"]:
                s = stages.get(sid)
                if s is None or s["start"] is None:
                    continue
                inner.append(f"{s['name']} x{s['tasks']} {s['end'] - s['start']} ms "
                             f"(run {s['run']}, deser {s['deser']}, gc {s['gc']})")
            took = (job["end"] or job["start"]) - job["start"]
            parts.append(f"job {took} ms [" + "; ".join(inner) + "]")
        print(f"    batch {batch}: " + " | ".join(parts))


def q(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")


def summary(side: str, out: Path, cpu: list[tuple[float, ...]]) -> None:
    """The split of one side (the module docstring); `cpu` is `cpu_watch`'s samples."""
    records = [tuple(map(float, ln.split())) for ln in
               (out / f"kafka-{side}.txt").read_text().splitlines() if ln.strip()]
    if records:
        t0 = min(r[2] for r in records)
        print(f"  {side}: ingest -> producer (Kafka CreateTime - sent) and producer -> a consumer"
              f" of the plan topics, per 5 s of ingest (p50 / p95 s):")
        buckets: dict[int, list[tuple[float, float]]] = {}
        for got, ts, sent in records:
            buckets.setdefault(int((sent - t0) // 5) * 5, []).append((ts - sent, got - ts))
        for b in sorted(buckets):
            v = buckets[b]
            a, c = [x[0] for x in v], [x[1] for x in v]
            print(f"    {b:>3}-{b + 5:<3}s {len(v):>7,} records: ingest->producer "
                  f"{q(a, .5):6.2f} / {q(a, .95):6.2f}; producer->consumer "
                  f"{q(c, .5):5.2f} / {q(c, .95):5.2f}")
    spans = [json.loads(ln) for ln in (out / f"spans-{side}.jsonl").read_text().splitlines()]
    batches = [s for s in spans if s["kind"] == "batch"]
    writes = [s for s in spans if s["kind"] == "rows_write"]
    warms = [s for s in spans if s["kind"] == "warm_write"]
    progress = [s for s in spans if s["kind"] == "progress"]
    deletes = [s for s in spans if s["kind"] == "delete"]
    t0 = deletes[-1]["start"] if deletes else None
    for kind in ("delete", "finish_many", "ended", "publish"):
        for x in [s for s in spans if s["kind"] == kind]:
            at = f" from {1000 * (x['start'] - t0):.0f} ms" if t0 is not None else ""
            print(f"    {kind}: {x.get('n', '')} handles, {1000 * (x['end'] - x['start']):.0f} ms"
                  f"{at} after the DELETE's start")
    if batches:
        d = [s["end"] - s["start"] for s in batches]
        w = sum(s["end"] - s["start"] for s in writes)
        print(f"    micro-batches: {len(d)}, seconds p50 {statistics.median(d):.2f} max "
              f"{max(d):.2f}; the plan-topic writes {w / max(sum(d), 1e-9):.0%} of their time; "
              f"warm writes {sum(s['n'] for s in warms):,} topics in {len(warms)} writes, "
              f"{sum(s['end'] - s['start'] for s in warms):.1f} s")
        print("    batch (input rows, triggerExecution / addBatch ms): " + "; ".join(
            f"{p['batch']} ({p['rows']}, {p['dur'].get('triggerExecution')}/"
            f"{p['dur'].get('addBatch')})" for p in progress[:14]))
        for x in batches[:10]:  # the broker's CPU and the machine's idle share meanwhile
            inside = [c for c in cpu if x["start"] <= c[0] <= x["end"]]
            if len(inside) > 1:
                first, last = inside[0], inside[-1]
                idle = (last[2] - first[2]) / max(1.0, last[2] - first[2] + last[3] - first[3])
                share = (last[1] - first[1]) / (last[0] - first[0])
                print(f"    batch {x['batch']} {x['end'] - x['start']:.1f} s: broker CPU "
                      f"{share:.0%} of a core, machine idle {idle:.0%}")


def main() -> None:
    if run_command({"--side": (side_main, (json.loads,))}):
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--edges", default="1,2")
    ap.add_argument("--handles", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--heap", default=None, help="the broker's heap (bench_edges: heap_for)")
    ap.add_argument("--options", default="{}", help="extra Spark Kafka sink options (JSON)")
    ap.add_argument("--out", default=None, help="where the raw data stays")
    args = ap.parse_args()
    from tests.kafka.broker import KafkaBroker, heap_for
    from tests.pg_server import start_server

    out = Path(args.out or tempfile.mkdtemp(prefix="xsg-split-"))
    out.mkdir(parents=True, exist_ok=True)
    edges.raise_fd_limit()
    stop = threading.Event()
    current = [out / "kafka-none.txt"]
    sides = [f"edges-{int(k)}" for k in args.edges.split(",")]
    with tempfile.TemporaryDirectory(prefix="xsg-bench-split-") as tmp:
        postgres = start_server()
        broker = KafkaBroker(Path(tmp) / "kafka", heap=args.heap or heap_for(args.handles))
        broker.start()
        print(f"broker heap {broker.heap}; raw data in {out}")
        threads = [threading.Thread(target=consume, args=(broker.bootstrap, stop, current),
                                    daemon=True)]
        if broker.process is not None:
            threads.append(threading.Thread(target=gc_watch, daemon=True, args=(
                broker.process.pid, stop, out / "broker-gc.txt")))
            threads.append(threading.Thread(target=cpu_watch, daemon=True, args=(
                broker.process.pid, stop, out / "cpu.txt")))
        for t in threads:
            t.start()
        marks = []
        try:
            for side in sides:
                current[0] = out / f"kafka-{side}.txt"
                a = {"side": side, "n": args.handles, "rate": 200, "seconds": args.seconds,
                     "startup": 15.0, "pass_rate": 0.1, "store": postgres.new_url(),
                     "brokers": broker.bootstrap, "procs": 4,
                     "spans": str(out / f"spans-{side}.jsonl"),
                     "options": json.loads(args.options)}
                print(f"\n== {side}; load average {load_average()}")
                started = time.time()
                run_child(__file__, ["--side", json.dumps(a)], timeout=args.seconds + 1800,
                          echo=True)
                marks.append((side, started, time.time()))
        finally:
            stop.set()
            for t in threads:
                t.join(10)
            broker.stop()
            postgres.close()
    print("\n== split")
    gc = [tuple(map(float, ln.split())) for ln in (out / "broker-gc.txt").read_text()
          .splitlines()] if (out / "broker-gc.txt").exists() else []
    cpu = [tuple(map(float, ln.split())) for ln in (out / "cpu.txt").read_text()
           .splitlines()] if (out / "cpu.txt").exists() else []
    for side, lo, hi in marks:
        summary(side, out, cpu)
        jobs_by_batch(out / f"events-{side}", 8)
        inside = [g for g in gc if lo <= g[0] <= hi]
        if len(inside) > 1:
            print(f"    broker: {inside[-1][1] - inside[0][1]:.0f} full GCs "
                  f"({inside[-1][2] - inside[0][2]:.1f} s) and young GCs "
                  f"{inside[-1][3] - inside[0][3]:.1f} s over the side; old generation "
                  f"{min(g[4] for g in inside):.0f}-{max(g[4] for g in inside):.0f} MB of "
                  f"{inside[-1][5]:.0f}")


if __name__ == "__main__":
    main()
