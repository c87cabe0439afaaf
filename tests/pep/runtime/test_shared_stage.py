"""The shared query's one Python stage (pep/runtime/shared/stage.py, issue 49): every busy
stream's lines parsed and matched in one `mapInArrow` over the batch, its function built once
per change of the streams' plans, not per batch; a line it does not read exactly as Spark's
JSON reader does sends that stream's files of the batch to Spark's reader, so a stream's plans
see the same tuples whichever path read them."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from pep.core.plan import (
    ExecutionPlan,
    Field,
    Predicate,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
)
from tests.pep.runtime.support import Collector, write_jsonl

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("temp", "double"), Field("n", "long"),
                       Field("s", "string"), Field("b", "boolean")))
FIELDS = tuple((f.name, f.type) for f in SCHEMA.fields) + (("_xsg_seq", "long"),)
T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
ISO = "%Y-%m-%dT%H:%M:%S.%fZ"

# what the gateway's ingest accepts, written as it writes it (pep/streams/ingest.py)
INGESTED = [
    {"ts": "2024-05-01T12:00:00Z", "temp": 1.5, "n": 3, "s": "x", "b": True},
    {"ts": 1714564800.123456, "temp": 5, "n": -9223372036854775808, "s": "é😀\u2028",
     "b": False},
    {"ts": "0001-01-01T00:00:00", "temp": 1e16, "n": 9223372036854775807, "s": "",
     "b": None},
    {"ts": "9999-12-31T23:59:59.999999+00:00", "temp": -0.0, "n": None, "s": None},
    {"ts": "2024-05-01T14:00:00.5+02:00", "temp": 4.9e-324, "n": 0, "s": 'a"b\n\\'},
    {"ts": "2024-02-29 00:00:00", "temp": 1.7976931348623157e308, "n": 1, "s": "{}"},
]
# lines no ingest writes (files dropped in by other means): the stage reads them as Spark
# does, or leaves them to Spark's reader (parse_lines gives None)
ODD = [
    '{"ts":"2024-05-01T12:00:00"}', '{"ts":"2024-05-01 12:00:00"}', '{"ts":"2024-05-01"}',
    '{"ts":"2024-05-01T12:00Z"}', '{"ts":"2024-05-01T12Z"}', '{"ts":"20240501T120000Z"}',
    '{"ts":"2024-5-1T1:2:3Z"}', '{"ts":"+2024-05-01T12:00:00Z"}', '{"ts":1714564800}',
    '{"ts":"2024-05-01T12:00:00.1234567Z"}', '{"ts":"2024-02-30T00:00:00Z"}',
    '{"ts":"2024-05-01T12:00:00+02:00"}', '{"ts":"2024-05-01T24:00:00Z"}',
    '{"ts":"0000-01-01T00:00:00Z"}', '{"ts":"2024-05-01T12:00:60Z"}',
    '{"temp":NaN}', '{"temp":-NaN}', '{"temp":Infinity}', '{"temp":"1.5"}', '{"temp":1e400}',
    '{"n":5.0}', '{"n":"5"}', '{"n":9223372036854775808}', '{"n":-0}',
    '{"s":5}', '{"s":5.0}', '{"s":{"a":1}}', '{"s":true}', '{"s":"\\ud800"}',
    '{"b":1}', '{"b":"true"}', '{"S":"x"}', '{"s":"a","s":"b"}', '{"other":{"z":[1,2]}}',
    '[{"n":1},{"n":2}]', '{"n":1} {"n":2}', 'garbage', '{"n":1}garbage', '{}', ' {"n":7} ',
    '\ufeff{"n":1}', '{"ts":null,"temp":null,"n":null,"s":null,"b":null}',
]


def ingested_lines() -> list[str]:
    from pep.streams.records import validate_records
    body = "\n".join(json.dumps(r) for r in INGESTED).encode()
    records = validate_records(SCHEMA, body, "ts", optional=frozenset({"b"}))
    out = []
    for i, r in enumerate(records):
        r["_xsg_seq"] = 100 + i
        out.append(json.dumps(r, separators=(",", ":"), ensure_ascii=False))
    return out


def _exact(table: pa.Table) -> pa.Table:
    """Timestamps as their microseconds (Spark reads some texts into year 0, which Python's
    datetime cannot hold)."""
    return pa.table([c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c
                     for c in table.columns], names=table.column_names)


def test_the_stage_reads_every_line_as_sparks_json_reader_or_leaves_it_to_spark(spark,
                                                                               tmp_path):
    """Each line alone in a file, read by Spark's JSON reader with the stream's schema (what
    the per-stream path does), and by the stage's parser: the same rows, or the stage refuses
    the line. Every line the gateway's ingest writes is read by the stage itself."""
    from pep.runtime.shared.stage import parse_lines
    from pep.runtime.sources.frames import spark_schema
    canonical = ingested_lines()
    lines = canonical + ODD
    paths = []
    for i, line in enumerate(lines):
        path = tmp_path / f"{i:03d}.json"
        path.write_bytes(line.encode("utf-8", "surrogatepass") + b"\n")
        paths.append(str(path))
    frame = (spark.read.schema(spark_schema(SCHEMA, True)).json(paths)
             .selectExpr("*", "_metadata.file_name AS f"))
    table = frame.toArrow()
    by_file: dict[str, list[dict]] = {}
    for row in _exact(table).to_pylist():
        by_file.setdefault(row.pop("f"), []).append(row)
    refused = []
    for i, line in enumerate(lines):
        ours = parse_lines([line.encode("utf-8", "surrogatepass")], FIELDS)
        if ours is None:
            refused.append(line)
            continue
        assert ours.schema == pa.schema([(n, t) for n, t in zip(
            table.column_names, table.schema.types, strict=False) if n != "f"]), line
        assert _exact(ours).to_pylist() == by_file.get(f"{i:03d}.json", []), line
    assert not [line for line in canonical if line in refused]
    # what Spark reads differently from pyarrow is refused (and much else that is odd)
    for line in ('{"ts":"2024-05-01T12:00Z"}', '{"temp":-NaN}', '{"s":5}', '{"n":1} {"n":2}',
                 'garbage', '{"s":"a","s":"b"}'):
        assert line in refused


def test_blank_lines_are_no_tuples_and_utf8_is_checked():
    from pep.runtime.shared.stage import parse_lines
    got = parse_lines([b"", b"  \t", b'{"n":1,"_xsg_seq":4}', b"\r"], FIELDS)
    assert got is not None and got.column("n").to_pylist() == [1]
    assert got.column("_xsg_seq").to_pylist() == [4]
    assert parse_lines([b'{"s":"\xff"}'], FIELDS) is None
    empty = parse_lines([b" "], FIELDS)
    assert empty is not None and empty.num_rows == 0


def weather(tmp_path, name):
    return StreamDefinition(name, "nea", StreamSchema((Field("ts", "timestamp"),
                                                       Field("temp", "double"),
                                                       Field("station", "string"))),
                            SourceSpec("ingest", (("path", str(tmp_path / "in" / name)),)),
                            time_attribute="ts")


@pytest.fixture
def shared(spark, tmp_path):
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    rt = StreamRuntime(spark, tmp_path / "work", settings=RuntimeSettings(
        trigger_interval=0.25, max_files_per_trigger=10, shared_query=True,
        shared_trigger_min=0.2, shared_trigger_max=1.0))
    yield rt
    rt.stop()


def test_busy_streams_are_matched_in_one_stage_built_once(spark, shared, tmp_path):
    """Three streams, each with its row plans; batches where one, two or all three bring
    tuples: each stream's rows are its own, every batch is one job, and the stage's function
    was built once (the plans did not change), whichever streams were busy."""
    names = ["w0", "w1", "w2"]
    got = {n: Collector() for n in names}
    for k, n in enumerate(names):
        shared.attach_handle(f"h-{n}", weather(tmp_path, n), ExecutionPlan(
            n, ((Predicate("temp", ">", float(k)),),), ("station", "temp")), got[n])
    sq = shared._shared
    sq.wait_applied()
    seq = {n: 0 for n in names}
    want: dict[str, list[float]] = {n: [] for n in names}
    for busy in (names[:1], names[1:], names, names[2:]):
        for n in busy:
            k = names.index(n)
            temps = [float(seq[n] % 5) for _ in range(1)] + [float(seq[n] % 5 + 0.5)]
            write_jsonl(tmp_path / "in" / n, f"{seq[n]:04d}.json", [
                {"ts": (T0 + timedelta(seconds=seq[n] + i)).strftime(ISO), "temp": t,
                 "station": n, "_xsg_seq": seq[n] + i} for i, t in enumerate(temps)])
            want[n] += [t for t in temps if t > k]
            seq[n] += len(temps)
        for n in names:
            shared.process_available(n)
    for n in names:
        assert sorted(r["temp"] for r in got[n].rows) == sorted(want[n])
        assert {r["station"] for r in got[n].rows} <= {n}
        assert shared.stats()[n]["rows_in"] == seq[n]
    assert sq.staged >= 3 and sq.read_again == 0
    assert sq.stage_builds == 1


def test_a_line_the_stage_does_not_read_goes_to_sparks_reader(spark, shared, tmp_path):
    """A file dropped into the ingest directory with a number where a string is declared
    (Spark's reader takes the number's text; pyarrow's refuses it): the stream's files of that
    batch are read by Spark's reader, so the handle gets what a query of its own gives it."""
    w = weather(tmp_path, "odd")
    got = Collector()
    shared.attach_handle("h", w, ExecutionPlan("odd", ((Predicate("temp", ">", 0.0),),),
                                               ("station", "temp")), got)
    sq = shared._shared
    sq.wait_applied()
    directory = tmp_path / "in" / "odd"
    directory.mkdir(parents=True, exist_ok=True)
    at = T0.strftime(ISO)
    (directory / "0001.json").write_text(
        f'{{"ts":"{at}","temp":1.0,"station":5,"_xsg_seq":1}}\n'
        f'{{"ts":"{at}","temp":2.0,"station":"B","_xsg_seq":2}}\n'
        f'{{"ts":"{at}","temp":-1.0,"station":"C","_xsg_seq":3}}\n')
    shared.process_available("odd")
    assert sorted((r["station"], r["temp"]) for r in got.rows) == [("5", 1.0), ("B", 2.0)]
    assert sq.read_again == 1
    assert shared.stats()["odd"]["rows_in"] == 3
    write_jsonl(directory, "0002.json", [{"ts": at, "temp": 3.0, "station": "D",
                                          "_xsg_seq": 4}])
    shared.process_available("odd")
    assert got.rows[-1] == {"station": "D", "temp": 3.0}
    assert sq.read_again == 1 and sq.staged >= 2  # the next batch in the stage again
