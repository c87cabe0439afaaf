"""The shared query (pep/runtime/shared/, issue 49) on real Spark: several ingest streams of
different schemas and owners on one Structured Streaming query, one Spark job per micro-batch
for all of them; each stream's rows exactly its own; a tuple a consumer may not see (of its own
stream or of another stream in the same job) moves none of its time; a stream joining or
leaving moves no other stream's position; the trigger adapts between its bounds."""
from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from pep.core.plan import (
    Aggregate,
    ExecutionPlan,
    Field,
    Predicate,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
    WindowSpec,
)
from tests.pep.runtime.support import Collector, wait_until, write_jsonl

WEATHER = StreamSchema((Field("ts", "timestamp"), Field("temp", "double"),
                        Field("station", "string")))
SHIPS = StreamSchema((Field("mmsi", "long"), Field("speed", "double"), Field("at", "timestamp"),
                      Field("flag", "string")))
T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
ISO = "%Y-%m-%dT%H:%M:%S.%fZ"
POLICY = ((Predicate("station", "=", "A"),),)


def weather(tmp_path, name="weather"):
    return StreamDefinition(name, "nea", WEATHER,
                            SourceSpec("ingest", (("path", str(tmp_path / "in" / name)),)),
                            time_attribute="ts")


def ships(tmp_path, name="ships"):
    return StreamDefinition(name, "port", SHIPS,
                            SourceSpec("ingest", (("path", str(tmp_path / "in" / name)),)),
                            time_attribute="at")


@pytest.fixture
def shared(spark, tmp_path):
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    rt = StreamRuntime(spark, tmp_path / "work", settings=RuntimeSettings(
        trigger_interval=0.25, max_files_per_trigger=2, shared_query=True,
        shared_trigger_min=0.2, shared_trigger_max=1.0))
    yield rt
    rt.stop()


def jobs_of(spark, query_id_run) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(query_id_run))


def test_streams_of_different_schemas_share_one_query_and_one_job_per_batch(spark, shared,
                                                                             tmp_path):
    w, s = weather(tmp_path), ships(tmp_path)
    hot, fast = Collector(), Collector()
    shared.attach_handle("h-hot", w, ExecutionPlan("weather", ((Predicate("temp", ">", 20.0),),),
                                                   ("station", "temp")), hot)
    shared.attach_handle("h-fast", s, ExecutionPlan("ships", ((Predicate("speed", ">=", 10.0),),),
                                                    ("mmsi", "flag")), fast)
    ex_w, ex_s = shared._executors["weather"], shared._executors["ships"]
    assert type(ex_w).__name__ == "SharedStreamExecutor"
    shared._shared.wait_applied()
    assert ex_w.query_id == ex_s.query_id is not None  # one query for both
    for k in range(3):
        write_jsonl(tmp_path / "in" / "weather", f"{k:04d}.json", [
            {"ts": (T0 + timedelta(seconds=10 * k + i)).strftime(ISO), "temp": 18.0 + i + k,
             "station": "A", "_xsg_seq": 10 * k + i} for i in range(5)])
        write_jsonl(tmp_path / "in" / "ships", f"{k:04d}.json", [
            {"mmsi": 2 ** 40 + i, "speed": 8.0 + 2 * i, "at": (T0 + timedelta(seconds=i))
             .strftime(ISO), "flag": "NO" if i % 2 else "SE", "_xsg_seq": 10 * k + i}
            for i in range(4)])
    shared.process_available("weather")
    shared.process_available("ships")
    want_hot = sorted((18.0 + i + k) for k in range(3) for i in range(5) if 18.0 + i + k > 20)
    assert sorted(r["temp"] for r in hot.rows) == want_hot
    assert all(set(r) == {"station", "temp"} for r in hot.rows)
    assert sorted(r["mmsi"] for r in fast.rows) == sorted(
        [2 ** 40 + i for i in range(4) if 8.0 + 2 * i >= 10] * 3)
    assert all(set(r) == {"mmsi", "flag"} for r in fast.rows)
    stats = shared.stats()
    assert stats["weather"]["rows_in"] == 15 and stats["ships"]["rows_in"] == 12
    assert stats["weather"]["max_position"] == 24
    # one Spark job per micro-batch that carried tuples, whatever the streams in it
    query = next(q for q in spark.streams.active if str(q.id) == ex_w.query_id)
    collected = shared._shared.jobs_run
    assert 1 <= collected <= stats["weather"]["batches"] + stats["ships"]["batches"]
    assert jobs_of(spark, str(query.runId)) == collected
    # both streams' row plans matched in the shared stage (pep/runtime/shared/stage.py)
    assert shared._shared.staged >= 2 and shared._shared.read_again == 0
    # committed files leave the ingest directories for each stream's own archive (as Spark's
    # cleanSource moves them: when the next batch starts)
    write_jsonl(tmp_path / "in" / "weather", "9999.json", [
        {"ts": T0.strftime(ISO), "temp": 0.0, "station": "A", "_xsg_seq": 99}])
    shared.process_available("weather")
    archived = tmp_path / "work" / "archive" / "weather"
    assert sorted(p.name for p in archived.iterdir()) == ["0000.json", "0001.json", "0002.json"]
    assert sorted(p.name for p in (tmp_path / "work" / "archive" / "ships").iterdir()) == [
        "0000.json", "0001.json", "0002.json"]


def _run_consumer(spark, tmp_path, hidden: bool, windows: bool = True):
    """A consumer's time windows and rows on `weather` (its policy: station A) while, in the
    same micro-batches, tuples it may not see arrive on its own stream (station B) and on a
    stream of another owner (`ships`), all with far-future and far-past times. Without
    `windows`, its rows alone: its stream's row plans are matched in the shared stage, with
    the other stream's, in the same Python tasks."""
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    rt = StreamRuntime(spark, tmp_path / "work", settings=RuntimeSettings(
        trigger_interval=0.25, max_files_per_trigger=50, shared_query=True,
        shared_trigger_min=0.2, shared_trigger_max=0.5))
    try:
        w, s = weather(tmp_path), ships(tmp_path)
        panes, rows, other = Collector(), Collector(), Collector()
        if windows:
            rt.attach_handle("win", w, ExecutionPlan("weather", POLICY, (), WindowSpec(
                "time", 10, 5, (Aggregate("temp", "sum"), Aggregate("temp", "count"),
                                Aggregate("ts", "lastval")), "ts")), panes)
        rt.attach_handle("rows", w, ExecutionPlan("weather", POLICY, ("ts", "temp")), rows)
        rt.attach_handle("other", s, ExecutionPlan("ships", None, ("mmsi",)), other)
        rt._shared.wait_applied()
        seq = 0
        for k in range(6):
            records = []
            for i in range(4):
                records.append({"ts": (T0 + timedelta(seconds=7 * k + i)).strftime(ISO),
                                "temp": float(k * 10 + i), "station": "A", "_xsg_seq": seq})
                seq += 1
                if hidden:
                    far = T0 + timedelta(days=400 * (1 if (k + i) % 2 else -1))
                    records.append({"ts": far.strftime(ISO), "temp": 1e6, "station": "B",
                                    "_xsg_seq": seq})
                    seq += 1
            write_jsonl(tmp_path / "in" / "weather", f"{k:04d}.json", records)
            if hidden:
                write_jsonl(tmp_path / "in" / "ships", f"{k:04d}.json", [
                    {"mmsi": k, "speed": 1.0, "at": (T0 + timedelta(days=900)).strftime(ISO),
                     "flag": "X", "_xsg_seq": k}])
            rt.process_available("weather")
            rt.process_available("ships")
        staged = rt._shared.staged
        return panes.rows, rows.rows, other.rows, staged
    finally:
        rt.stop()


def test_hidden_tuples_of_its_stream_and_of_another_owners_move_none_of_its_time(
        spark, tmp_path_factory):
    """Non-interference on the shared query: the consumer's windows and rows with the hidden
    tuples (its own stream's station B, another owner's stream, in the same Spark jobs) are
    exactly those without them."""
    clean = _run_consumer(spark, tmp_path_factory.mktemp("clean"), hidden=False)
    noisy = _run_consumer(spark, tmp_path_factory.mktemp("noisy"), hidden=True)
    assert clean[0], "the consumer's windows were emitted"
    assert noisy[0] == clean[0]
    assert noisy[1] == clean[1]
    assert len(noisy[2]) == 6 and clean[2] == []  # the other stream's tuples were in the jobs
    assert all(v < 1e6 for w in clean[0] for v in w.values() if isinstance(v, float))


def test_hidden_tuples_in_the_shared_stage_change_none_of_its_rows(spark, tmp_path_factory):
    """The same with row plans only: the consumer's stream and the other owner's are parsed and
    matched in the same Python stage (and tasks); its rows with the hidden tuples are exactly
    those without them, in the same order."""
    clean = _run_consumer(spark, tmp_path_factory.mktemp("clean"), hidden=False, windows=False)
    noisy = _run_consumer(spark, tmp_path_factory.mktemp("noisy"), hidden=True, windows=False)
    assert len(clean[1]) == 24 and noisy[1] == clean[1]
    assert len(noisy[2]) == 6
    assert noisy[3] >= 6  # the stage served them (both streams in the noisy run's batches)


def test_a_stream_joining_or_leaving_moves_no_other_streams_position(spark, shared, tmp_path):
    w = weather(tmp_path)
    got = Collector()
    shared.attach_handle("a", w, ExecutionPlan("weather", None, ("temp",)), got)
    shared._shared.wait_applied()

    def write(k):
        write_jsonl(tmp_path / "in" / "weather", f"{k:04d}.json", [
            {"ts": T0.strftime(ISO), "temp": float(k), "station": "A", "_xsg_seq": k}])
    write(0)
    shared.process_available("weather")
    run_before = str(shared._shared._query.runId)
    for k in range(1, 3):
        write(k)
    other = Collector()
    shared.attach_handle("b", ships(tmp_path), ExecutionPlan("ships", None, ("mmsi",)), other)
    for k in range(3, 5):
        write(k)
    shared._shared.wait_applied()
    assert str(shared._shared._query.runId) != run_before  # started again, same checkpoint
    shared.process_available("weather")
    shared.detach("b")
    write(5)
    shared._shared.wait_applied()
    shared.process_available("weather")
    # every row by now, each once (a restart that cut the source's log from the batch's
    # offsets once left the last row for a file yet to come:
    # test_files_a_stop_left_logged_but_in_no_batch_are_delivered_with_the_next)
    assert sorted(r["temp"] for r in got.rows) == [float(k) for k in range(6)]


@pytest.mark.parametrize("before", [1, 3])
def test_a_first_handle_starts_at_its_streams_end(spark, shared, tmp_path, before):
    """As on a query of its own: files present at the first attach are never delivered (up to
    the files a batch lists, 2 here, dropped from the batches that list them; more moved to the
    archive's not-delivered)."""
    for i in range(before):
        write_jsonl(tmp_path / "in" / "weather", f"old{i}.json", [
            {"ts": T0.strftime(ISO), "temp": -1.0, "station": "A", "_xsg_seq": i}])
    got = Collector()
    shared.attach_handle("a", weather(tmp_path), ExecutionPlan("weather", None, ("temp",)), got)
    write_jsonl(tmp_path / "in" / "weather", "new.json", [
        {"ts": T0.strftime(ISO), "temp": 1.0, "station": "A", "_xsg_seq": 9}])
    shared.process_available("weather")
    assert [r["temp"] for r in got.rows] == [1.0]
    moved = tmp_path / "work" / "archive" / "weather" / "not-delivered"
    assert (sorted(p.name for p in moved.iterdir()) if moved.is_dir() else []) == (
        [f"old{i}.json" for i in range(before)] if before > 2 else [])
    assert shared.stats()["weather"]["skipped_to_end"]


def test_streams_other_than_ingest_keep_a_query_of_their_own(spark, shared, tmp_path):
    files = StreamDefinition("owned", "nea", WEATHER,
                             SourceSpec("files", (("path", str(tmp_path / "owned")),
                                                  ("format", "json"))), time_attribute="ts")
    (tmp_path / "owned").mkdir()
    shared.attach_handle("f", files, ExecutionPlan("owned", None, ("temp",)), Collector())
    assert type(shared._executors["owned"]).__name__ == "StreamExecutor"
    # security punctuations: the stream's shield is its own query's (deny when in doubt)
    from pep.core.punctuations import SOURCE_OPTION
    punctuated = StreamDefinition("shielded", "nea", WEATHER, SourceSpec("ingest", (
        ("path", str(tmp_path / "in" / "shielded")), (SOURCE_OPTION, "on"))),
        time_attribute="ts")
    shared.attach_handle("p", punctuated, ExecutionPlan("shielded", None, ("temp",)),
                         Collector())
    assert type(shared._executors["shielded"]).__name__ == "StreamExecutor"


def test_the_trigger_is_short_alone_and_longer_while_many_streams_are_busy():
    from pep.runtime.shared.trigger import TriggerBounds
    bounds = TriggerBounds(0.25, 2.0, duty=0.5)
    assert bounds.interval(0.3, 1) == 0.25 and bounds.pause(0.3, 1) == 0.0
    assert bounds.interval(0.6, 20) == pytest.approx(1.2)
    assert bounds.pause(0.6, 20) == pytest.approx(0.35)
    assert bounds.interval(5.0, 100) == 2.0
    assert bounds.interval(0.05, 3) == 0.25
    with pytest.raises(ValueError):
        TriggerBounds(2.0, 1.0)


def test_results_of_different_schemas_travel_packed_and_come_back_alike():
    from pep.runtime.base.arrow_ipc import packer, unpack
    a = pa.record_batch([pa.array([1, 2], pa.int64()), pa.array(["x", None])], names=["n", "s"])
    b = pa.record_batch([pa.array([b"\x01"], pa.binary())], names=["bits"])
    rows = list(packer("0/rows")(iter([a, a]))) + list(packer("1/rows")(iter([b])))
    rows += list(packer("2/rows")(iter([])))
    out = unpack(pa.Table.from_batches(rows))
    assert set(out) == {"0/rows", "1/rows"}
    assert out["0/rows"].to_pylist() == pa.Table.from_batches([a, a]).to_pylist()
    assert out["1/rows"].schema == b.schema


def _offsets(checkpoint, batch_id, log_offset):
    """An offset log file as Spark writes it: `v1`, the batch's metadata, the source's offset."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch_id)).write_text(
        "v1\n" + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}) + "\n"
        + json.dumps({"logOffset": log_offset}))


def test_a_batchs_files_read_from_the_end_of_a_compact_log(tmp_path):
    from pep.runtime.sources.shared_files import batch_files, glob_path, logged_files
    log = tmp_path / "sources" / "0"
    log.mkdir(parents=True)
    lines = ["v1"] + [json.dumps({"path": f"file:///d/{b}-{i}.json", "timestamp": 1,
                                  "batchId": b}) for b in range(3000) for i in range(2)]
    (log / "2999.compact").write_text("\n".join(lines))
    (log / "3000").write_text("v1\n" + json.dumps({"path": "file:///d/x%20y.json",
                                                   "timestamp": 1, "batchId": 3000}))
    _offsets(tmp_path, 2998, 2998)
    _offsets(tmp_path, 2999, 2999)
    _offsets(tmp_path, 3000, 3000)
    assert batch_files(tmp_path, 2999) == ["/d/2999-0.json", "/d/2999-1.json"]
    assert batch_files(tmp_path, 3000) == ["/d/x y.json"]
    assert logged_files(tmp_path, 3000, 3000) == []
    # a compacted entry whose own file was cleaned up: read from the compact file after it
    assert logged_files(tmp_path, 2996, 2998) == ["/d/2997-0.json", "/d/2997-1.json",
                                                  "/d/2998-0.json", "/d/2998-1.json"]
    with pytest.raises(ValueError):
        batch_files(tmp_path, 3001)  # no offsets of its own: never a guess
    assert glob_path(["/a/in/x", "/a/in/y"]) == "/a/in/{x,y}"
    assert glob_path(["/a/in/x"]) == "/a/in/{x}"  # a glob: no base path for Spark to check


def test_a_batch_reads_the_source_entries_its_offsets_name_not_its_number(tmp_path):
    """Batch 5 of a query whose file source logged an entry no batch named (a stop between the
    source's log and the offset log): its offsets name entries 5 and 6, the next batch's 7."""
    from pep.runtime.sources.shared_files import batch_files, source_range
    log = tmp_path / "sources" / "0"
    log.mkdir(parents=True)
    for n in range(8):
        (log / str(n)).write_text("v1\n" + json.dumps({"path": f"file:///d/{n}.json",
                                                       "timestamp": 1, "batchId": n}))
    for batch, offset in ((0, 0), (4, 4), (5, 6), (6, 7)):
        _offsets(tmp_path, batch, offset)
    assert source_range(tmp_path, 0) == (-1, 0)
    assert batch_files(tmp_path, 0) == ["/d/0.json"]
    assert batch_files(tmp_path, 5) == ["/d/5.json", "/d/6.json"]
    assert batch_files(tmp_path, 6) == ["/d/7.json"]


def test_attributes_added_while_records_arrive_lose_and_repeat_nothing(spark, shared,
                                                                       tmp_path):
    """The shared query needs no restart for a stream's added attributes: its next batch reads
    the stream's files with the new schema; the handles attached before and after get every
    record once, in order."""
    import threading
    from dataclasses import replace
    old = weather(tmp_path)
    new = replace(old, schema=StreamSchema(WEATHER.fields + (Field("w", "long"),)))
    plain = Collector()
    shared.attach_handle("plain", old, ExecutionPlan("weather", None, ("temp",)), plain)
    total = 120

    def produce() -> None:
        for i in range(0, total, 6):
            write_jsonl(tmp_path / "in" / "weather", f"{i:06d}.json", [
                {"ts": T0.strftime(ISO), "temp": float(k), "station": "A", "w": k * 10,
                 "_xsg_seq": k + 1} for k in range(i, i + 6)])
            time.sleep(0.05)
    writer = threading.Thread(target=produce)
    writer.start()
    try:
        assert wait_until(lambda: len(plain.rows) >= 12, timeout=60)
        assert shared.redefine(new)
        wide = Collector()
        shared.attach_handle("wide", new, ExecutionPlan("weather", None, ("temp", "w")), wide)
    finally:
        writer.join(60)
    shared.process_available("weather")
    assert [r["temp"] for r in plain.rows] == [float(k) for k in range(total)]
    assert wide.rows and all(r["w"] == int(r["temp"]) * 10 for r in wide.rows)
    first = int(wide.rows[0]["temp"])
    assert [r["temp"] for r in wide.rows] == [float(k) for k in range(first, total)]


def test_files_a_stop_left_logged_but_in_no_batch_are_delivered_with_the_next(spark, tmp_path):
    """A stop that lands after the file source logged new files (`sources/0/<n>`) but before
    the query wrote the batch's offsets (seen under load when a stream joining or leaving
    restarts the shared query) leaves an entry that no batch names; the next query's first
    batch takes it together with the files it finds itself. Both are delivered by that batch,
    before `process_available` returns (they were read one batch late, the last files only
    when another came)."""
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime

    def runtime():
        return StreamRuntime(spark, tmp_path / "work", settings=RuntimeSettings(
            trigger_interval=0.25, max_files_per_trigger=2, shared_query=True,
            shared_trigger_min=0.2, shared_trigger_max=1.0))

    def write(k):
        write_jsonl(tmp_path / "in" / "weather", f"{k:04d}.json", [
            {"ts": T0.strftime(ISO), "temp": float(k), "station": "A", "_xsg_seq": k}])
    w = weather(tmp_path)
    rt = runtime()
    try:
        first = Collector()
        rt.attach_handle("a", w, ExecutionPlan("weather", None, ("temp",)), first)
        write(0)
        rt.process_available("weather")
        assert [r["temp"] for r in first.rows] == [0.0]
    finally:
        rt.stop()  # the handle stays: its stream resumes at the next start
    # what the stop cut: the source logged file 1 as its next entry, no offsets name it
    write(1)
    log = tmp_path / "work" / "shared-query" / "checkpoint" / "sources" / "0"
    entry = 1 + max(int(p.name.split(".")[0]) for p in log.iterdir()
                    if p.name.split(".")[0].isdigit())
    path = tmp_path / "in" / "weather" / "0001.json"
    (log / str(entry)).write_text("v1\n" + json.dumps({
        "path": path.as_uri(), "timestamp": int(path.stat().st_mtime * 1000),
        "batchId": entry}))
    write(2)  # the next query's first batch finds it: one batch, two entries
    rt = runtime()
    try:
        second = Collector()
        rt.attach_handle("a", w, ExecutionPlan("weather", None, ("temp",)), second)
        assert not rt.stats()["weather"]["skipped_to_end"]  # resumed where it stopped
        rt.process_available("weather")
        assert [r["temp"] for r in second.rows] == [1.0, 2.0]
    finally:
        rt.stop()
