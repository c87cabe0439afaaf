"""A stream changed or deleted under a running query (Spark): attributes added restart the
query on its checkpoint without losing or repeating a record, attached plans and their windows
carry over; a new lateness reaches the running query; a deleted stream's query stops; each
stream's own retention applies to its archive."""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace

from pep.core.plan import (
    Aggregate,
    ExecutionPlan,
    Field,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
    WindowSpec,
)
from tests.pep.runtime.support import Collector, query_run, wait_until, write_jsonl

SCHEMA = StreamSchema((Field("n", "long"), Field("v", "double")))


def stream(tmp_path, name="grow", **kw) -> StreamDefinition:
    return StreamDefinition(
        name, "o", SCHEMA, SourceSpec("ingest", (("path", str(tmp_path / name)),)), **kw
    )


def runtime_for(spark, work, **kw):
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    return StreamRuntime(spark, work, settings=RuntimeSettings(
        trigger_interval=0.2, max_files_per_trigger=3), **kw)


class SlowCollector(Collector):
    """A reader whose delivery takes a while: a restart is asked for while one is under way."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = threading.Event()

    def __call__(self, batch) -> bool:
        self.inside.set()
        time.sleep(0.5)
        return super().__call__(batch)


def test_added_attributes_restart_the_query_losing_and_repeating_nothing(spark, tmp_path,
                                                                         query_mode):
    old = stream(tmp_path)
    new = replace(old, schema=StreamSchema(SCHEMA.fields + (Field("w", "long"),)))
    directory = tmp_path / "grow"
    directory.mkdir()
    rt = runtime_for(spark, tmp_path / "work")
    total = 240
    try:
        plain, windows = SlowCollector(), Collector()
        rt.attach_handle("plain", old, ExecutionPlan("grow", None, ("n",)), plain)
        rt.attach_handle("windows", old, ExecutionPlan(
            "grow", None, ("n",), WindowSpec("tuple", 4, 4, (Aggregate("n", "sum"),))), windows)
        first_run = query_run(spark, rt, "grow")  # the same query id, a new run after a restart

        def produce() -> None:  # every record carries w; the old schema does not read it
            for i in range(0, total, 6):
                write_jsonl(directory, f"{i:06d}.json",
                            [{"n": k, "v": k / 2, "w": k * 10, "_xsg_seq": k + 1}
                             for k in range(i, i + 6)])
                time.sleep(0.03)

        writer = threading.Thread(target=produce)
        writer.start()
        assert wait_until(lambda: len(plain.rows) >= 30)
        plain.inside.clear()
        assert plain.inside.wait(30)  # a delivery is under way: the restart waits for its end
        assert rt.redefine(new)  # while records keep arriving
        # its own query starts again on its checkpoint; the shared query needs no restart: its
        # next batch reads the stream's files with the new schema (`SharedStreamExecutor.restart`)
        assert (query_run(spark, rt, "grow") != first_run) == (query_mode == "own")
        assert rt.stats()["grow"]["handles"] == 2
        wide = Collector()
        rt.attach_handle("wide", new, ExecutionPlan("grow", None, ("n", "w")), wide)
        writer.join(30)
        assert wait_until(lambda: len(plain.rows) >= total, timeout=60)
        time.sleep(0.8)
        # every record exactly once, in order, across the restart
        assert [r["n"] for r in plain.rows] == list(range(total))
        # the windows kept their state: every window sums 4 consecutive tuples
        sums = [r["sum_n"] for r in windows.rows]
        assert sums == [sum(range(4 * k, 4 * k + 4)) for k in range(total // 4)]
        # the new attribute is read from the restarted query on
        assert wide.rows and all(r["w"] == r["n"] * 10 for r in wide.rows)
        assert wide.rows[-1]["n"] == total - 1
        state = json.loads((tmp_path / "work" / "checkpoints" / "grow" / "state.json").read_text())
        from pep.runtime.sources.checkpoints import fingerprint
        assert state["fingerprint"] == fingerprint(new) and state["state"] == "running"
    finally:
        rt.stop()


def test_a_new_lateness_reaches_the_running_query_and_a_dropped_stream_stops(spark, tmp_path,
                                                                             query_mode):
    sd = stream(tmp_path, "late", lateness=7.0)
    (tmp_path / "late").mkdir()
    rt = runtime_for(spark, tmp_path / "work")
    try:
        sink = Collector()
        rt.attach_handle("h", sd, ExecutionPlan("late", None, ("n",)), sink)
        executor = rt._executors["late"]
        assert executor.handles.lateness == 7.0
        assert rt.redefine(replace(sd, lateness=None))  # back to the runtime's default
        assert executor.handles.lateness == 0.0 and executor.active  # the same query, not restarted
        assert rt.redefine(replace(sd, lateness=None)) is False  # nothing changed
        write_jsonl(tmp_path / "late", "a.json", [{"n": 1, "v": 0.5, "_xsg_seq": 1}])
        assert wait_until(lambda: len(sink.rows) == 1)
        assert rt.drop_stream("late")
        assert not executor.active and "late" not in rt.stats()
        rt.detach("h")  # already gone: nothing to do
        write_jsonl(tmp_path / "late", "b.json", [{"n": 2, "v": 1.0, "_xsg_seq": 2}])
        time.sleep(0.8)
        assert [r["n"] for r in sink.rows] == [1]
        assert rt.drop_stream("late") is False
    finally:
        rt.stop()


def test_each_stream_keeps_its_archive_for_its_own_retention(spark, tmp_path):
    work = tmp_path / "work"
    old = time.time() - 120
    for name in ("brief", "usual"):
        directory = work / "archive" / name
        directory.mkdir(parents=True)
        (directory / "f.json").write_text("{}\n")
        os.utime(directory / "f.json", (old, old))
    rt = runtime_for(spark, work, retention_for={"brief": 60.0}.get)
    try:
        removed, _ = rt.sweep()  # brief keeps 60 s; usual the default hour
        assert removed == 1
        assert not (work / "archive" / "brief" / "f.json").exists()
        assert (work / "archive" / "usual" / "f.json").exists()
    finally:
        rt.stop()
