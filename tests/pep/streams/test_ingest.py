"""The stream catalogue and record ingest: validation names line and field, batches are atomic."""
from __future__ import annotations

import json
import os

import pytest

from common.auth import Identity
from pep.core.errors import Conflict, InputTooLarge, InvalidInput, NotFound, NotPermitted
from pep.core.plan import SourceSpec
from pep.core.schemas import BUILTIN_SCHEMAS
from pep.streams.catalog import StreamCatalog
from pep.streams.definition import SEQ_FIELD, StreamError
from pep.streams.records import RecordError, normalise_timestamp

SCHEMA = [{"name": "samplingtime", "type": "timestamp"}, {"name": "rainrate", "type": "double"},
          {"name": "winddirection", "type": "long"}, {"name": "station", "type": "string"},
          {"name": "ok", "type": "boolean"}]


def line(**overrides) -> str:
    rec = {"samplingtime": "2024-05-01T10:00:00Z", "rainrate": 7.5, "winddirection": 180,
           "station": "S1", "ok": True}
    rec.update(overrides)
    return json.dumps(rec)


@pytest.fixture
def catalog(tmp_path, storage):
    """A catalogue on each database (`storage`: tests/conftest.py)."""
    c = StreamCatalog(storage.database("streams"), tmp_path / "data")
    c.register("weather", "nea", SCHEMA, {"kind": "ingest"}, "samplingtime")
    yield c
    c.close()


def ingest_files(catalog: StreamCatalog, name: str = "weather") -> list[str]:
    return sorted(os.listdir(catalog.ingest_dir(name)))


def read_all(catalog: StreamCatalog, name: str = "weather") -> list[dict]:
    out = []
    for f in ingest_files(catalog, name):
        with open(catalog.ingest_dir(name) / f) as fh:
            out.extend(json.loads(x) for x in fh if x.strip())
    return out


# -- registration -----------------------------------------------------------------------------

def test_register_and_get(catalog):
    d = catalog.get("weather")
    assert d.owner == "nea" and d.time_attribute == "samplingtime"
    assert d.schema.names == ("samplingtime", "rainrate", "winddirection", "station", "ok")
    assert d.source.kind == "ingest"
    assert d.source.option("path") == str(catalog.ingest_dir("weather"))
    assert catalog.get("WEATHER") == d  # names are case-insensitive
    assert catalog.get("nope") is None


@pytest.mark.parametrize("name", ["", "1abc", "a b", "a/b", "../x", "a" * 65, "x\n", None, 5])
def test_register_rejects_bad_names(catalog, name):
    with pytest.raises(StreamError) as e:
        catalog.register(name, "nea", SCHEMA)
    assert isinstance(e.value, InvalidInput)


def test_duplicate_is_409_case_insensitive(catalog):
    for name in ("weather", "Weather"):
        with pytest.raises(StreamError) as e:
            catalog.register(name, "other", SCHEMA)
        assert isinstance(e.value, Conflict)
    assert catalog.get("weather").owner == "nea"


@pytest.mark.parametrize("schema, fragment", [
    ([], "non-empty"),
    ("x", "non-empty"),
    ([{"name": "a", "type": "int"}], "type must be one of"),
    ([{"name": "a", "type": "double"}, {"name": "A", "type": "long"}], "duplicate"),
    ([{"name": "_xsg_seq", "type": "long"}], "must match"),
    ([{"name": "xsgx", "type": "long"}, {"name": "a b", "type": "long"}], "entry 1"),
    ([{"name": "a", "type": "double", "extra": 1}], "unknown key"),
])
def test_register_rejects_bad_schemas(catalog, schema, fragment):
    with pytest.raises(StreamError) as e:
        catalog.register("s2", "nea", schema)
    assert isinstance(e.value, InvalidInput) and fragment in e.value.message
    assert catalog.get("s2") is None


def test_time_attribute_must_exist_and_be_time_like(catalog):
    with pytest.raises(StreamError, match="not in the schema"):
        catalog.register("s3", "nea", SCHEMA, None, "nope")
    with pytest.raises(StreamError, match="timestamp or a number"):
        catalog.register("s3", "nea", SCHEMA, None, "station")
    d = catalog.register("s3", "nea", SCHEMA, None, "SAMPLINGTIME")
    assert d.time_attribute == "samplingtime"


def test_privileged_sources_need_trust(catalog, tmp_path):
    src = {"kind": "files", "path": str(tmp_path), "format": "csv"}
    with pytest.raises(StreamError) as e:
        catalog.register("f", "nea", SCHEMA, src)
    assert isinstance(e.value, NotPermitted)
    d = catalog.register("f", "root", SCHEMA, src, trusted=True)
    assert d.source == SourceSpec("files", (("format", "csv"), ("path", str(tmp_path))))
    with pytest.raises(StreamError, match="unknown option"):
        catalog.register("g", "root", SCHEMA, {"kind": "socket", "host": "h", "port": 1,
                                               "evil": 1}, trusted=True)
    for port in ("x", "²", "٣", "0", "65536", "1_0", "9" * 5000, True):  # '²'.isdigit() was
        with pytest.raises(StreamError, match="port"):                 # a 500 (int() refused)
            catalog.register("g", "root", SCHEMA, {"kind": "socket", "host": "h", "port": port},
                             trusted=True)
    for files in ("0", "²", "٣", "1e3", "x"):
        with pytest.raises(StreamError, match="maxFilesPerTrigger"):
            catalog.register("f2", "root", SCHEMA, {"kind": "files", "path": str(tmp_path),
                                                    "maxFilesPerTrigger": files}, trusted=True)


def test_generator_uses_its_builtin_schema(catalog):
    d = catalog.register("gen", "nea", None, {"kind": "generator", "schema": "weather",
                                              "rate": 5})
    assert d.schema == BUILTIN_SCHEMAS["weather"] and d.time_attribute == "samplingtime"
    with pytest.raises(StreamError, match="built-in"):
        catalog.register("gen2", "nea", SCHEMA, {"kind": "generator", "schema": "weather"})
    for rate in (-1, 0, "nan", "inf", "٣", "1_0", 1e999, "1e6"):  # float('٣') is 3.0
        with pytest.raises(StreamError, match="rate"):
            catalog.register("gen3", "nea", None, {"kind": "generator", "schema": "ais",
                                                   "rate": rate})
    assert catalog.register("gen4", "nea", None, {"kind": "generator", "schema": "ais",
                                                  "rate": "0.5"}).name == "gen4"


def test_catalogue_survives_restart(tmp_path, storage):
    c = StreamCatalog(storage.database("streams"), tmp_path / "d")
    d = c.register("w", "nea", SCHEMA, None, "samplingtime")
    c.append_records("w", (line() + "\n" + line()).encode())
    c.close()
    c2 = StreamCatalog(storage.database("streams"), tmp_path / "d")
    assert c2.get("w") == d
    c2.append_records("w", line().encode())
    assert [r[SEQ_FIELD] for r in read_all(c2, "w")] == [1, 2, 3]
    c2.close()


def test_visibility(catalog):
    catalog.register("gen", "nea", None, {"kind": "generator", "schema": "weather"})
    lta = catalog.list_visible(Identity("lta", ("consumer",)))
    assert {s["name"] for s in lta} == {"weather", "gen"}
    assert all(set(s["source"]) == {"kind"} for s in lta)  # no paths for consumers
    assert all(s["schema"] for s in lta)
    nea = {s["name"]: s for s in catalog.list_visible(Identity("nea"))}
    assert "path" in nea["weather"]["source"]
    admin = {s["name"]: s for s in catalog.list_visible(Identity("root", admin=True))}
    assert "path" in admin["weather"]["source"] and "rate" in admin["gen"]["source"]


# -- ingest -------------------------------------------------------------------------------------

def test_append_assigns_increasing_seq_and_normalises(catalog):
    body = "\n".join([line(), "", line(rainrate=3, samplingtime=1714557600),
                      line(samplingtime="2024-05-01T12:00:00+02:00").replace(
                          '"winddirection": 180', '"WindDirection": 5')]) + "\n"
    assert catalog.append_records("weather", body.encode()) == 3
    assert catalog.append_records("weather", line().encode()) == 1
    rows = read_all(catalog)
    assert [r[SEQ_FIELD] for r in rows] == [1, 2, 3, 4]
    assert rows[1]["rainrate"] == 3.0 and isinstance(rows[1]["rainrate"], float)
    assert rows[1]["samplingtime"] == "2024-05-01T10:00:00.000000Z"
    assert rows[2]["samplingtime"] == "2024-05-01T10:00:00.000000Z"
    assert rows[2]["winddirection"] == 5  # written with the schema's spelling
    assert len(ingest_files(catalog)) == 2
    assert not [f for f in ingest_files(catalog) if f.startswith(".")]


def test_nulls_allowed_except_time(catalog):
    assert catalog.append_records("weather", line(rainrate=None, station=None).encode()) == 1
    with pytest.raises(RecordError) as e:
        catalog.append_records("weather", line(samplingtime=None).encode())
    assert e.value.field == "samplingtime"


HOSTILE = [
    (b'{"samplingtime": "2024-05-01T10:00:00Z", ', "bad JSON", None),
    (line(rainrate="7.5").encode(), "expected a number", "rainrate"),
    (line(rainrate=True).encode(), "expected a number", "rainrate"),
    (line(winddirection=1.5).encode(), "expected an integer", "winddirection"),
    (line(winddirection=True).encode(), "expected an integer", "winddirection"),
    (line(winddirection=2 ** 63).encode(), "out of range", "winddirection"),
    (line(station=5).encode(), "expected a string", "station"),
    (line(ok="true").encode(), "expected true or false", "ok"),
    (line(samplingtime="yesterday").encode(), "ISO-8601", "samplingtime"),
    (line(samplingtime=[1]).encode(), "found array", "samplingtime"),
    (line(extra=1).encode(), "unknown field", "extra"),
    (line(_xsg_seq=99).encode(), "unknown field", "_xsg_seq"),
    (json.dumps({"samplingtime": "2024-05-01T10:00:00Z"}).encode(), "missing", "rainrate"),
    (line().replace("7.5", "NaN").encode(), "bad JSON", None),
    (line().replace("7.5", "1e999").encode(), "out of range", "rainrate"),
    (line()[:-1].encode() + b', "rainrate": 1}', "duplicate key", None),
    (line()[:-1].encode() + b', "RAINRATE": 1}', "given twice", "rainrate"),
    (b"[1, 2]", "expected a JSON object", None),
    (b"42", "expected a JSON object", None),
    (b"[" * 100_000 + b"]" * 100_000, "bad JSON", None),
    (b'{"station": "\xff\xfe"}', "UTF-8", None),
    (("1" * 5000).encode(), "bad JSON", None),
    (line(station="x" * 70_000).encode(), "longer than", "station"),
    # issue 9, item 4: these were internal errors (500s) or wrote what the runtime cannot read
    (line(samplingtime=10 ** 400).encode(), "out of range", "samplingtime"),  # OverflowError
    (line(samplingtime=1e300).encode(), "out of range", "samplingtime"),
    (line(samplingtime=253402300800).encode(), "out of range", "samplingtime"),
    (line(samplingtime=-62135596801).encode(), "out of range", "samplingtime"),
    (line(samplingtime="0001-01-01T00:00:00+01:00").encode(), "outside years 1 to 9999",
     "samplingtime"),  # OverflowError converting to UTC
    (line(rainrate=10 ** 400).encode(), "out of range", "rainrate"),
    (line(winddirection=2 ** 64).encode(), "out of range", "winddirection"),
    # "\ud800" as a JSON escape: a string UTF-8 cannot write (UnicodeEncodeError writing the file)
    (line(station="\ud800").encode(), "lone UTF-16 surrogate U+D800", "station"),
    (line(station="ok\udfff").encode(), "lone UTF-16 surrogate U+DFFF", "station"),
]


@pytest.mark.parametrize("bad, fragment, field", HOSTILE)
def test_hostile_line_is_rejected_with_line_and_field(catalog, bad, fragment, field):
    body = (line() + "\n" + line() + "\n").encode() + bad + b"\n" + line().encode()
    with pytest.raises(RecordError) as e:
        catalog.append_records("weather", body)
    assert isinstance(e.value, InvalidInput)
    assert e.value.line == 3, e.value.message
    assert e.value.field == field
    assert fragment in e.value.message and "line 3" in e.value.message
    # all or nothing: no file, no sequence number used
    assert ingest_files(catalog) == []
    catalog.append_records("weather", line().encode())
    assert [r[SEQ_FIELD] for r in read_all(catalog)] == [1]


def test_limits(tmp_path):
    c = StreamCatalog(tmp_path / "s.db", tmp_path / "d", max_body_bytes=2000, max_lines=3)
    c.register("w", "nea", SCHEMA, None, "samplingtime")
    with pytest.raises(RecordError) as e:
        c.append_records("w", "\n".join([line()] * 4).encode())
    assert isinstance(e.value, InputTooLarge)
    assert c.append_records("w", ("\n".join([line()] * 3) + "\n").encode()) == 3
    with pytest.raises(RecordError) as e:
        c.append_records("w", b" " * 2001)
    assert isinstance(e.value, InputTooLarge)
    c.close()


def test_append_to_unknown_or_non_ingest_stream(catalog):
    with pytest.raises(StreamError) as e:
        catalog.append_records("nope", line().encode())
    assert isinstance(e.value, NotFound)
    catalog.register("gen", "nea", None, {"kind": "generator", "schema": "weather"})
    with pytest.raises(StreamError) as e:
        catalog.append_records("gen", line().encode())
    assert isinstance(e.value, Conflict)


def test_concurrent_appends_get_distinct_sequence_numbers(catalog):
    import threading

    def worker():
        for _ in range(10):
            catalog.append_records("weather", (line() + "\n" + line()).encode())

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = sorted(r[SEQ_FIELD] for r in read_all(catalog))
    assert seqs == list(range(1, 81))


@pytest.mark.parametrize("value, expected", [
    ("2024-05-01T10:00:00", "2024-05-01T10:00:00.000000Z"),
    ("2024-05-01T10:00:00.5Z", "2024-05-01T10:00:00.500000Z"),
    (0, "1970-01-01T00:00:00.000000Z"),
    (1.25, "1970-01-01T00:00:01.250000Z"),
    # the first and last instants, with four-digit years (strftime wrote "1-01-01...")
    (-62135596800, "0001-01-01T00:00:00.000000Z"),
    ("9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59.999999Z"),
])
def test_normalise_timestamp(value, expected):
    assert normalise_timestamp(value) == expected


def test_importing_the_catalogue_needs_no_spark():
    import subprocess
    import sys

    code = ("import sys, pep.streams.catalog, pep.handles.service, pep.handles.revocation; "
            "print('pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- issue 9, item 4: the registration document is parsed like any client input ---------------

@pytest.mark.parametrize("body, fragment", [
    (b"[" * 100_000 + b"]" * 100_000, "nests deeper than"),  # was a RecursionError, a 500
    (b'{"name": ' * 50 + b"1" + b"}" * 50, "nests deeper than"),
    (b'{"name": "w", "source": {"kind": "generator", "schema": "weather", "rate": NaN}}',
     "NaN is not a JSON number"),
    (b'{"name": ' + b"9" * 5000 + b"}", "expected a JSON object"),
    (b'{"name": "w"', "line 1, column 13"),
    (b"\xff{}", "not valid UTF-8"),
    (b"[]", "expected a JSON object"),
    (b"x" * (1024 * 1024 + 1), "over the limit"),
])
def test_registration_document_errors_are_invalid_stream(body, fragment):
    from pep.streams.definition import InvalidStream, parse_registration
    with pytest.raises(InvalidStream) as e:
        parse_registration(body)
    assert isinstance(e.value, InvalidInput) and fragment in e.value.message


@pytest.mark.parametrize("body, fragment", [
    (b'{"lateness": ' * 50 + b"1" + b"}" * 50, "nests deeper than"),
    (b'{"retention": NaN}', "NaN is not a JSON number"),
    (b"\xff{}", "not valid UTF-8"),
    (b"[]", "expected a JSON object"),
])
def test_a_change_document_is_parsed_like_a_registration_and_says_what_it_expects(body, fragment):
    from pep.streams.definition import InvalidStream, parse_stream_patch
    with pytest.raises(InvalidStream) as e:
        parse_stream_patch(body)
    assert fragment in e.value.message
    assert "expected a JSON object with one or more of: visibility" in e.value.message


def test_registration_document_parses():
    from pep.streams.definition import parse_registration
    doc = {"name": "w", "schema": SCHEMA, "source": {"kind": "ingest"}}
    assert parse_registration(json.dumps(doc).encode()) == doc
    assert parse_registration(b"\xef\xbb\xbf" + json.dumps(doc).encode()) == doc


def test_source_options_refuse_lone_surrogates_and_non_finite_numbers(catalog):
    with pytest.raises(StreamError, match="lone surrogates"):
        catalog.register("f", "root", SCHEMA, {"kind": "files", "path": "/tmp/\ud800"},
                         trusted=True)
    with pytest.raises(StreamError, match="finite"):
        catalog.register("g", "nea", None, {"kind": "generator", "schema": "weather",
                                            "rate": float("inf")})


def test_a_feed_receives_every_batch_after_it_opened_and_none_before(catalog, tmp_path):
    catalog.append_records("weather", line(rainrate=1.0).encode())
    feed = tmp_path / "feed" / "left"
    catalog.open_feed("WEATHER", feed)  # names are case-insensitive, as everywhere
    assert os.listdir(feed) == []
    catalog.append_records("weather", (line(rainrate=2.0) + "\n" + line(rainrate=3.0)).encode())
    catalog.append_records("weather", line(rainrate=4.0).encode())
    fed = sorted(os.listdir(feed))
    assert fed == ingest_files(catalog)[1:]  # same names, only the later batches
    rows = [json.loads(x) for f in fed for x in (feed / f).read_text().splitlines()]
    assert [r["rainrate"] for r in rows] == [2.0, 3.0, 4.0]
    # the stream's own reader may move its files away: the feed keeps its own
    os.remove(catalog.ingest_dir("weather") / fed[0])
    assert (feed / fed[0]).exists()
    catalog.close_feed("weather", feed)
    catalog.append_records("weather", line(rainrate=5.0).encode())
    assert sorted(os.listdir(feed)) == fed


# -- issue 21, part 3: longs and timestamps reach the ingest file exactly ----------------------

def test_longs_beyond_2_53_and_epoch_fractions_are_written_exactly(catalog):
    big = [2 ** 53 + 1, 2 ** 63 - 1, -(2 ** 63), -(2 ** 53) - 1]
    seconds = ("253402300799.999999", "1.0000015", "-62135596800", "1704067200.000001")
    # epoch seconds as JSON numbers, written as they are (not through a float)
    body = "\n".join(line(winddirection=v, samplingtime="S").replace('"S"', s)
                     for v, s in zip(big, seconds, strict=True))
    catalog.append_records("weather", body.encode())
    records = read_all(catalog)
    # the file's text holds every digit (json reads it back as the same int)
    assert [r["winddirection"] for r in records] == big
    raw = "".join(open(catalog.ingest_dir("weather") / f).read() for f in ingest_files(catalog))
    assert all(str(v) in raw for v in big)
    # epoch seconds are read as the decimals they are, to the microsecond (half-even)
    assert [r["samplingtime"] for r in records] == [
        "9999-12-31T23:59:59.999999Z", "1970-01-01T00:00:01.000002Z",
        "0001-01-01T00:00:00.000000Z", "2024-01-01T00:00:00.000001Z"]
    assert records[0]["rainrate"] == 7.5 and isinstance(records[0]["rainrate"], float)


@pytest.mark.parametrize("value, fragment", [
    (2 ** 63, "out of range for a 64-bit long"),
    (-(2 ** 63) - 1, "out of range for a 64-bit long"),
    ("9007199254740993.0", "expected an integer, found number"),
    ("1e3", "expected an integer, found number"),
])
def test_longs_outside_64_bits_or_not_integers_are_refused_naming_line_and_field(catalog, value,
                                                                                 fragment):
    body = line() + "\n" + line(winddirection=0).replace('"winddirection": 0',
                                                         f'"winddirection": {value}')
    with pytest.raises(RecordError) as e:
        catalog.append_records("weather", body.encode())
    assert e.value.line == 2 and e.value.field == "winddirection" and fragment in str(e.value)
    assert read_all(catalog) == []


def test_an_append_waiting_on_its_disk_holds_back_no_other_streams_append(catalog, monkeypatch):
    """Issue 49: the numbers are reserved in a short transaction and the file written after it,
    so the catalogue's write lock is not held through a file's fsync (a busy gateway's appends
    queued there, one behind the other)."""
    import threading

    catalog.register("other", "nea", SCHEMA, {"kind": "ingest"}, "samplingtime")
    in_fsync, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if threading.current_thread().name == "slow-append":
            in_fsync.set()
            assert release.wait(30)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    slow = threading.Thread(target=catalog.append_records, name="slow-append",
                            args=("weather", (line(rainrate=1.0) + "\n").encode()))
    slow.start()
    try:
        assert in_fsync.wait(30)
        done = threading.Event()
        other = threading.Thread(target=lambda: (catalog.append_records(
            "other", (line(rainrate=2.0) + "\n").encode()), done.set()))
        other.start()
        assert done.wait(10), "the other stream's append waited for this one's disk write"
    finally:
        release.set()
        slow.join(30)
    assert [r["rainrate"] for r in read_all(catalog, "weather")] == [1.0]
    assert [r["rainrate"] for r in read_all(catalog, "other")] == [2.0]


# -- the files' times: the order Spark's file source reads a stream's batches in ---------------

MS = 1_000_000  # ns: Spark's file source orders files by their times in milliseconds


def test_each_file_is_timed_after_the_one_before_even_in_one_clock_tick_and_after_a_restart(
        catalog, storage, tmp_path, monkeypatch):
    """Spark's file source takes a micro-batch's files oldest first by modification time in
    milliseconds, a tie in listing order (ext4: the names' hash order): files written in one
    tick of the clock (a burst of appends; a kernel's coarse file times), or after the clock
    was set back, would be read in any order, later tuples delivered first. Each file of a
    stream is timed in a later millisecond than the one before, in this process and the next
    (behind the files still waiting in the directory)."""
    from tests.pep.runtime.support import files_in_one_clock_tick
    files_in_one_clock_tick(monkeypatch)
    feed = tmp_path / "feed"
    catalog.open_feed("weather", feed)
    for k in range(4):
        catalog.append_records("weather", line(rainrate=float(k)).encode())
    again = StreamCatalog(storage.database("streams"), tmp_path / "data")  # a restart
    try:
        again.append_records("weather", line(rainrate=4.0).encode())
    finally:
        again.close()
    names = ingest_files(catalog)
    times = [os.stat(catalog.ingest_dir("weather") / f).st_mtime_ns // MS for f in names]
    # in name order (the stream's order: the first sequence number, zero-padded)
    assert [r["rainrate"] for r in read_all(catalog)] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert all(a < b for a, b in zip(times, times[1:], strict=False)), times
    # a feed's file is the same file (a link, or a copy with its time): its reader reads in order
    assert [os.stat(feed / f).st_mtime_ns // MS for f in names[:4]] == times[:4]
