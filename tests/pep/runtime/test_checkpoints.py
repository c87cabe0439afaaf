"""No replay, bounded disk, visible stalls: per-stream checkpoints kept across restarts, a
stream's first handle starting at the stream's end, committed files archived and swept by the
retention settings, and stall detection."""
from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from pep.core.plan import ExecutionPlan, Field, SourceSpec, StreamDefinition, StreamSchema
from pep.runtime.sources.checkpoints import Retention
from pep.runtime.sources.replay import last_committed
from tests.pep.runtime.support import (
    Collector,
    query_checkpoint,
    stop_gate,
    wait_until,
    write_jsonl,
)

SCHEMA = StreamSchema((Field("n", "long"), Field("v", "double")))


def ingest(tmp_path, name="ck", kind="ingest"):
    return StreamDefinition(name, "o", SCHEMA, SourceSpec(kind, (("path", str(tmp_path / name)),)))


def recs(lo, hi):
    return [{"n": i, "v": i / 2, "_xsg_seq": i} for i in range(lo, hi)]


PLAN = ExecutionPlan("ck", None, ("n",))


def runtime_for(spark, work, **settings):
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    return StreamRuntime(spark, work, settings=RuntimeSettings(
        trigger_interval=0.2, max_files_per_trigger=2, **settings))


@pytest.mark.parametrize("files_before,kind", [(1, "ingest"), (5, "ingest"), (5, "files")])
def test_first_handle_starts_at_the_end_and_again_after_the_last_left(spark, tmp_path,
                                                                     files_before, kind):
    """Files present at a stream's first attach are skipped: up to maxFilesPerTrigger (2 here)
    by the query's first batch; more are moved to the archive (an ingest stream's directory is
    the gateway's) or, in an owner's `files` directory, committed unread by a one-batch query."""
    sd = ingest(tmp_path, kind=kind)
    (tmp_path / "ck").mkdir(exist_ok=True)
    for i in range(files_before):  # before any handle: never delivered
        write_jsonl(tmp_path / "ck", f"a{i}.json", recs(100 + i, 101 + i))
    rt = runtime_for(spark, tmp_path / "work")
    try:
        first = Collector()
        rt.attach_handle("h1", sd, PLAN, first)
        assert rt.stats()["ck"]["skipped_to_end"]
        archived = tmp_path / "work" / "archive" / "ck" / "not-delivered"
        moved = sorted(os.listdir(archived)) if archived.is_dir() else []
        assert moved == ([f"a{i}.json" for i in range(files_before)]
                         if files_before > 2 and kind == "ingest" else [])
        write_jsonl(tmp_path / "ck", "b.json", recs(5, 8))
        assert wait_until(lambda: len(first.rows) >= 3)
        time.sleep(0.6)
        assert [r["n"] for r in first.rows] == [5, 6, 7]
        rt.detach("h1")  # the last handle left: the next first handle starts at the end again
        write_jsonl(tmp_path / "ck", "c.json", recs(8, 10))
        second = Collector()
        rt.attach_handle("h2", sd, PLAN, second)
        write_jsonl(tmp_path / "ck", "d.json", recs(10, 12))
        assert wait_until(lambda: len(second.rows) >= 2)
        time.sleep(0.6)
        assert [r["n"] for r in second.rows] == [10, 11]
        assert second.batches[-1].last_position == 11
    finally:
        rt.stop()


def test_restarted_query_continues_where_it_stopped(spark, tmp_path, query_mode):
    sd = ingest(tmp_path)
    work = tmp_path / "work"
    rt = runtime_for(spark, work)
    try:
        a = Collector()
        rt.attach_handle("h", sd, PLAN, a)
        write_jsonl(tmp_path / "ck", "a.json", recs(0, 3))
        assert wait_until(lambda: len(a.rows) >= 3)
    finally:
        rt.stop()  # the gateway stops with the handle live: its stream resumes at next start
    write_jsonl(tmp_path / "ck", "b.json", recs(3, 6))  # ingested while the gateway was down
    assert (query_checkpoint(work, "ck", query_mode) / "commits").is_dir()
    # written through Hadoop's raw local filesystem: no checksum side files (session.py)
    assert not list((work / "checkpoints").rglob("*.crc"))
    rt = runtime_for(spark, work)
    try:
        b = Collector()
        rt.attach_handle("h", sd, PLAN, b)  # the handle resumes
        assert not rt.stats()["ck"]["skipped_to_end"]
        write_jsonl(tmp_path / "ck", "c.json", recs(6, 7))
        assert wait_until(lambda: len(b.rows) >= 4)
        time.sleep(0.6)
        assert [r["n"] for r in b.rows] == [3, 4, 5, 6]  # nothing replayed, nothing lost
        # the last batch before the stop had its files archived as the next batch ran
        assert wait_until(lambda: not (tmp_path / "ck" / "a.json").exists())
        assert "a.json" in {p.name for p in (work / "archive" / "ck").rglob("*.json")}
    finally:
        rt.stop()


def test_a_batch_delivered_whose_commit_the_stop_cut_off_is_not_delivered_again(spark, tmp_path,
                                                                                query_mode):
    """The stop lands after a batch's rows went out but before Spark wrote its commit (seen
    under load): the next query runs that batch again under the same id, and skips it."""
    sd = ingest(tmp_path)
    work = tmp_path / "work"
    rt = runtime_for(spark, work)
    try:
        a = Collector()
        rt.attach_handle("h", sd, PLAN, a)
        write_jsonl(tmp_path / "ck", "a.json", recs(0, 3))
        assert wait_until(lambda: len(a.rows) >= 3)
    finally:
        rt.stop()
    checkpoint = query_checkpoint(work, "ck", query_mode)
    last = last_committed(checkpoint)
    if last >= 0:  # (none: the stop itself came before Spark wrote the first one)
        for p in (checkpoint / "commits").iterdir():  # as if the stop came before Spark wrote it
            if p.name.lstrip(".").split(".")[0] == str(last):
                p.unlink()
    rt = runtime_for(spark, work)
    try:
        b = Collector()
        rt.attach_handle("h", sd, PLAN, b)
        write_jsonl(tmp_path / "ck", "b.json", recs(3, 5))
        assert wait_until(lambda: len(b.rows) >= 2)
        time.sleep(0.6)
        assert [r["n"] for r in b.rows] == [3, 4]  # the cut batch ran again, delivered nothing
    finally:
        rt.stop()


def test_committed_files_are_archived_and_swept_uncommitted_ones_never(spark, tmp_path,
                                                                       query_mode):
    sd = ingest(tmp_path)
    work = tmp_path / "work"
    rt = runtime_for(spark, work, retention_seconds=None, retention_bytes=None)
    try:
        sink = Collector()
        rt.attach_handle("h", sd, PLAN, sink)
        for i in range(4):
            write_jsonl(tmp_path / "ck", f"f{i}.json", recs(i * 10, i * 10 + 2))
            assert wait_until(lambda i=i: len(sink.rows) >= 2 * (i + 1))
        # Spark moves a batch's files when the next batch starts: all but the last are gone
        assert wait_until(lambda: len(os.listdir(tmp_path / "ck")) <= 2)
        assert {p.name for p in (work / "archive" / "ck").rglob("*.json")} >= {"f0.json"}
        # an uncommitted file (the stream is stopped) and old archived files
        rt.detach("h")
        write_jsonl(tmp_path / "ck", "late.json", recs(90, 91))
        old = time.time() - 7200
        for p in (work / "archive" / "ck").rglob("*.json"):
            os.utime(p, (old, old))
        before = set(os.listdir(tmp_path / "ck"))
        removed, freed = Retention(max_age=3600, max_bytes=None).sweep(work / "archive")
        assert removed >= 1 and freed > 0
        assert list((work / "archive" / "ck").rglob("*.json")) == []
        assert set(os.listdir(tmp_path / "ck")) == before  # the source directory is untouched
    finally:
        rt.stop()


def test_retention_by_age_and_by_size(tmp_path):
    root = tmp_path / "archive"
    (root / "s" / "deep").mkdir(parents=True)
    now = time.time()
    for i in range(6):
        p = root / "s" / "deep" / f"{i}.json"
        p.write_bytes(b"x" * 100)
        os.utime(p, (now - 1000 * (6 - i), now - 1000 * (6 - i)))  # 0 oldest ... 5 newest
    assert Retention(max_age=None, max_bytes=None).sweep(root) == (0, 0)
    assert Retention(max_age=3500, max_bytes=None).sweep(root, now) == (3, 300)
    assert sorted(p.name for p in root.rglob("*.json")) == ["3.json", "4.json", "5.json"]
    assert Retention(max_age=None, max_bytes=150).sweep(root, now) == (2, 200)
    assert [p.name for p in root.rglob("*.json")] == ["5.json"]
    assert Retention(max_age=0, max_bytes=None).sweep(root, now) == (1, 100)
    assert not (root / "s").exists()  # emptied directories go too
    assert Retention(max_age=0).sweep(tmp_path / "missing") == (0, 0)


def test_a_stall_is_reported_once_and_clears(spark, tmp_path, caplog, query_mode):
    sd = ingest(tmp_path)
    rt = runtime_for(spark, tmp_path / "work", stall_seconds=1.0, janitor_interval=0.2)
    release = threading.Event()
    blocked = threading.Event()
    got = []

    def slow(batch):
        got.append(batch)
        blocked.set()
        release.wait(20)  # the micro-batch thread is stuck in delivery
        return True
    try:
        rt.attach_handle("h", sd, PLAN, slow)
        assert rt.health()["ck"]["state"] in ("running", "idle")
        with caplog.at_level(logging.WARNING, logger="pep.runtime.runtime"):
            write_jsonl(tmp_path / "ck", "a.json", recs(0, 2))
            assert blocked.wait(60)
            # from here: the stall under test (a first batch longer than the 1 s bound, as
            # the shared query's cold first one can be, is a stall of its own, told before)
            caplog.clear()
            write_jsonl(tmp_path / "ck", "b.json", recs(2, 4))  # waits behind the stuck batch
            assert wait_until(lambda: rt.stats()["ck"]["stalled"], 20)
            stats = rt.stats()["ck"]
            assert stats["input_waiting"] and stats["waiting_since"] is not None
            health = rt.health()["ck"]
            assert health["state"] == "stalled" and health["last_error"] is None
            time.sleep(1.0)  # several janitor ticks: still one warning
            warnings = [r for r in caplog.records if "stalled" in r.getMessage()]
            assert len(warnings) == 1
        release.set()
        assert wait_until(lambda: len(got) >= 2, 30)
        assert wait_until(lambda: not rt.stats()["ck"]["stalled"], 10)
        assert rt.health()["ck"]["state"] == "running"
        assert rt.health()["ck"]["last_batch_at"] is not None
    finally:
        release.set()
        rt.stop()


def test_a_batch_that_starts_while_its_query_stops_ends_it_quietly(spark, tmp_path, caplog,
                                                                   query_mode):
    """Issue 42: a restart or the gateway's stop pauses the query between two batches; a batch
    starting meanwhile must deliver nothing and not be committed (the next query runs it). It
    used to raise `Paused`: the query "terminated with error", an ERROR with a 75-line stack
    from Spark and one from py4j at every restart. Now it waits for the stop and ends the query
    as Spark's own stop does: no error, no ERROR record, and the batch is delivered once, by
    the next query."""
    sd = ingest(tmp_path)
    work = tmp_path / "work"
    rt = runtime_for(spark, work)
    try:
        a = Collector()
        rt.attach_handle("h", sd, PLAN, a)
        write_jsonl(tmp_path / "ck", "a.json", recs(0, 3))
        assert wait_until(lambda: len(a.rows) >= 3)
        gate = stop_gate(rt, "ck", query_mode)
        query = gate._query
        gate._pausing = True  # what restart() and stop() set first: a stop has begun
        with caplog.at_level(logging.INFO):
            write_jsonl(tmp_path / "ck", "b.json", recs(3, 6))  # its batch starts paused
            assert wait_until(lambda: query.status["isTriggerActive"]
                              and query.status["isDataAvailable"], 30)
            time.sleep(1.5)  # the batch is in its foreachBatch by now (0.2 s triggers)
            assert query.isActive and [r["n"] for r in a.rows] == [0, 1, 2]
            rt.stop()
        assert not query.isActive
        assert query.exception() is None  # stopped, not "terminated with error"
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [], [r.getMessage() for r in errors]
    finally:
        rt.stop()
    rt = runtime_for(spark, work)
    try:
        b = Collector()
        rt.attach_handle("h", sd, PLAN, b)  # the handle resumes: the paused batch runs now
        assert wait_until(lambda: len(b.rows) >= 3)
        time.sleep(0.6)
        assert [r["n"] for r in b.rows] == [3, 4, 5]
    finally:
        rt.stop()


def test_late_micro_batches_are_logged_as_one_repeating_warning(spark, tmp_path, caplog,
                                                              query_mode):
    """Spark's own "falling behind" WARN is off (a line per trigger); the runtime reads the
    same figure from the queries' progress and logs each late batch as a repeating warning
    (`common.log_repeats`), which the gateway's log sums up. On the shared query a batch is late
    past the longest interval its adaptive trigger may choose, and each stream it carried is
    named. A query run's first batch (its start: planning, code generation, the sources
    opened) is not told."""
    from common.log_repeats import REPEAT, VALUE

    sd = ingest(tmp_path)
    rt = runtime_for(spark, tmp_path / "work", janitor_interval=3600)
    try:
        a = Collector()
        rt.attach_handle("h", sd, PLAN, a)
        late = rt._shared_late if query_mode == "shared" else rt._late
        late.trigger_interval = 0.001  # every batch is late against 1 ms
        limit = ("the shared query's longest trigger interval" if query_mode == "shared"
                 else "the trigger interval")
        for i in range(4):
            write_jsonl(tmp_path / "ck", f"{i}.json", recs(i, i + 1))
            assert wait_until(lambda i=i: len(a.rows) >= i + 1)
        query = spark.streams.get(rt.query_id("ck"))
        assert wait_until(lambda: len(query.recentProgress) >= 4)
        progress = query.recentProgress
        with caplog.at_level(logging.WARNING, logger="pep.runtime.lateness"):
            logged = rt.check_lateness()
            assert logged >= 3
            assert rt.check_lateness() == 0  # each batch once
        records = [r for r in caplog.records if r.name == "pep.runtime.lateness"]
        assert len(records) == logged
        told = {int(r.getMessage().split("micro-batch ")[1].split()[0]) for r in records}
        ran = [p["batchId"] for p in progress if "addBatch" in p["durationMs"]]
        if query_mode != "shared":  # the shared query's first batch ran before this test's
            assert ran[0] not in told, (ran, told)  # nor an empty trigger before it
            assert set(ran[1:]) <= told, (ran, told)
        assert {getattr(r, REPEAT) for r in records} == {"stream ck is falling behind"}
        assert all(getattr(r, VALUE) > 0.001 for r in records)
        assert all(r.getMessage().startswith("stream ck is falling behind: micro-batch ")
                   and f"longer than {limit} (0.00 s)" in r.getMessage() for r in records)
    finally:
        rt.stop()
