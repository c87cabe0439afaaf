"""The shared query's one Python stage: every stream's raw lines of a micro-batch parsed with that
stream's schema and matched against that stream's row plans on Spark's workers, in one
`mapInArrow` over the batch itself (no Spark here: it runs there, and travels by value).

Reading each busy stream's files as a DataFrame of its own schema and building its jobs over it
cost the driver 15-30 ms per stream and micro-batch (a read, a select and a `mapInArrow`, each
analysed anew, then a union of all of them): at 32 busy streams the batch's driver work, not
the job, set the pace. Here the batch's DataFrame is what the shared query's file source read
(each line with the file it came from), and one function built once per change of the member
streams' plans (`StageStream` per stream: its directory, schema, the attributes its plans show
and read, its `GroupedMatcher`) does per task what each stream's rows job did:

1. the task's lines grouped by the directory of their file (a file of no stream in the stage is
   left alone: its stream is read the other way, or left the query);
2. each stream's lines parsed with its schema (`parse_lines`, pyarrow's JSON reader), the
   values its plans compare derived from them as `plan_expressions.value_elements` derives them
   in Spark (timestamps in epoch seconds or microseconds, booleans 0/1, longs as doubles);
3. its `GroupedMatcher` run over them (`matcher.admitted_rows`: the admitted tuples with a
   bitmap of their plans, and the task's figures row), packed as Arrow IPC with the stream's
   tag (`base/arrow_ipc.py`), as the per-stream path packs its rows job.

Parsing must give what Spark's JSON reader gives the per-stream path, or nothing: pyarrow's
reader is stricter than Spark's (it refuses a number where a string is declared, where Spark
takes the number's text; an invalid line, where Spark gives a row of nulls), and a few forms
Spark reads one way pyarrow would read another (timestamps written without seconds, `-NaN`). So
a stream's lines are parsed here only in the forms both read alike: the gateway's ingest writes
only those (`pep/streams/records.py`: ISO timestamps `...Z` with microseconds, finite numbers,
valid UTF-8, one object per line). Any other line makes the task answer `AGAIN` for that stream
(`parse_lines` returns None), and the driver reads that stream's files of the batch the
per-stream way, with Spark's own reader (`query.py`): what a stream's plans see never depends
on which path read it.
"""
from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from pep.runtime.base.arrow_ipc import packer
from pep.runtime.base.columns import BITS_COLUMN, READ_COLUMN, SEQ_COLUMN, TOP_COLUMN
from pep.runtime.plans.matcher import GroupedMatcher, admitted_rows, value_column

LINE_COLUMN = "value"  # the text source's line
PATH_COLUMN = "file"   # ... and its file (`_metadata.file_path`: a URI)
ROWS_TAG = "rows"      # a stream's admitted rows: tagged "<its tag>/rows"
AGAIN_TAG = "again"    # its lines need Spark's own reader: "<its tag>/again"

ARROW_TYPES = {"double": pa.float64(), "long": pa.int64(), "string": pa.string(),
               "label": pa.string(), "boolean": pa.bool_(),
               "timestamp": pa.timestamp("us", tz="UTC")}
# The one timestamp text both readers read alike (checked against Spark: test_shared_stage):
# ISO-8601 date and time with seconds, up to six fractional digits, UTC ("Z") or no zone (the
# session's time zone, UTC, as ingest assumes), years 1 to 9999. Spark reads some texts this
# excludes differently from pyarrow (no seconds: null in Spark, a time in pyarrow).
TIMESTAMP_TEXT = (r"^(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
                  r"-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
                  r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?Z?$")
_BLANK = b" \t\r"  # a line of these alone is no tuple (Spark's JSON reader skips it)


@dataclass(frozen=True, eq=False)
class StageStream:
    """One stream's share of the stage: its lines are those of files in `directory`; parsed
    with `fields` ((name, type) in schema order, `_xsg_seq` last); matched by `matcher`, which
    reads `values` ((attribute index 1-based, family, attribute type)); its admitted rows keep
    the columns `keep` (the shown attributes, then the order columns) and go out tagged
    `"<tag>/rows"` (or `"<tag>/again"`). Compared by identity (a matcher holds arrays)."""

    tag: str
    directory: str
    fields: tuple[tuple[str, str], ...]
    keep: tuple[str, ...]
    values: tuple[tuple[int, str, str], ...]
    matcher: GroupedMatcher


def _directory_of(uri: str) -> str:
    parsed = urlparse(uri)
    path = unquote(parsed.path) if parsed.scheme in ("", "file") else uri
    return os.path.dirname(path)


def parse_lines(lines: list[bytes], fields: tuple[tuple[str, str], ...]) -> pa.Table | None:
    """A stream's lines as a table of its schema's Arrow types (Spark's: timestamps in UTC), one
    row per line that is not blank; None when some line is in a form this reader does not read
    exactly as Spark's JSON reader does (see the module docstring)."""
    types = {name: (pa.string() if t == "timestamp" else ARROW_TYPES[t]) for name, t in fields}
    schema = pa.schema([(name, types[name]) for name, _ in fields])
    lines = [line for line in lines if line.strip(_BLANK)]
    if not lines:
        return pa.schema([(n, ARROW_TYPES[t]) for n, t in fields]).empty_table()
    data = b"\n".join(lines) + b"\n"
    try:
        pa.array([data], pa.binary()).cast(pa.string())  # valid UTF-8, or Spark's reader
        table = pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(
            use_threads=False, block_size=max(1 << 20, len(data) + 1)),
            parse_options=pj.ParseOptions(explicit_schema=schema,
                                          unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(lines):  # two values on a line: Spark reads the first only
        return None
    columns = []
    for name, t in fields:
        column = table.column(name).combine_chunks()
        if t == "double":
            finite = pc.is_finite(column)  # NaN and infinities: no ingest writes them
            if pc.any(pc.invert(finite.fill_null(True))).as_py():
                return None
        elif t == "timestamp":
            texts = column
            if texts.null_count < len(texts):
                if not pc.all(pc.match_substring_regex(texts, TIMESTAMP_TEXT)
                              .fill_null(True)).as_py():
                    return None
                try:  # a day the month has not: null in Spark
                    naive = pc.utf8_rtrim(texts, "Z").cast(pa.timestamp("us"))
                except pa.ArrowInvalid:
                    return None
                column = naive.cast(ARROW_TYPES["timestamp"])
            else:
                column = pa.nulls(len(texts), ARROW_TYPES["timestamp"])
        columns.append(column)
    return pa.Table.from_arrays(columns, names=[n for n, _ in fields])


def _value(column: pa.Array, family: str, ftype: str) -> pa.Array:
    """An attribute's value as the matcher reads it in `family` (d: double, l: 64-bit integer,
    s: text), derived as `plan_expressions.value_elements` derives it in Spark."""
    if family == "s":
        return column
    if ftype == "timestamp":
        micros = column.cast(pa.int64())
        if family == "l":
            return micros
        return pc.divide(micros.cast(pa.float64()), pa.scalar(1_000_000.0))
    if ftype == "boolean":
        as_long = column.cast(pa.int64())
        return as_long if family == "l" else as_long.cast(pa.float64())
    if family == "d":
        return column.cast(pa.float64(), safe=False)  # a long's nearest double, as Spark's cast
    return column


def _matched(stream: StageStream, table: pa.Table) -> Iterator[pa.RecordBatch]:
    """The stream's packed rows of one task: `admitted_rows` over its parsed lines."""
    names = list(stream.keep)
    arrays: list[pa.Array] = [table.column(n).combine_chunks() for n in names]
    by_index = [n for n, _ in stream.fields]
    for attribute, family, ftype in stream.values:
        name = by_index[attribute - 1]
        arrays.append(_value(table.column(name).combine_chunks(), family, ftype))
        names.append(value_column(attribute, family))
    if SEQ_COLUMN not in names:
        arrays.append(table.column(SEQ_COLUMN).combine_chunks())
        names.append(SEQ_COLUMN)
    batch = pa.RecordBatch.from_arrays(arrays, names=names)
    admit = admitted_rows(stream.matcher, SEQ_COLUMN, list(stream.keep), BITS_COLUMN,
                          (READ_COLUMN, TOP_COLUMN))
    yield from packer(f"{stream.tag}/{ROWS_TAG}", admit)(iter([batch]))


def _again(stream: StageStream) -> Iterator[pa.RecordBatch]:
    marker = pa.record_batch([pa.array([0], pa.int8())], names=[AGAIN_TAG])
    yield from packer(f"{stream.tag}/{AGAIN_TAG}")(iter([marker]))


def stage_function(streams: tuple[StageStream, ...]
                   ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The stage's `mapInArrow` function over the batch's (`LINE_COLUMN`, `PATH_COLUMN`)
    record batches: per stream of `streams` whose lines the task read, its packed rows (or its
    `AGAIN` marker); lines of other directories are left out."""
    place_of = {s.directory: i for i, s in enumerate(streams)}

    def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        lines: dict[str, list[bytes]] = {}
        of_file: dict[str, int] = {}  # a file's stream: its place in `streams`, -1 none
        for batch in batches:
            if not batch.num_rows:
                continue
            files = batch.column(PATH_COLUMN).dictionary_encode()
            places = []
            for uri in files.dictionary.to_pylist():
                if uri not in of_file:
                    of_file[uri] = place_of.get(_directory_of(uri), -1) if uri else -1
                places.append(of_file[uri])
            owner_of = np.array(places, dtype=np.int64)[
                files.indices.to_numpy(zero_copy_only=False)]
            # the batch's lines grouped by stream, each stream's in their order
            order = np.argsort(owner_of, kind="stable")
            owners = owner_of[order]
            kept = owners >= 0
            order, owners = order[kept], owners[kept]
            if not len(order):
                continue
            values = batch.column(LINE_COLUMN)
            # bytes, not decoded: `parse_lines` checks they are UTF-8
            values = values.cast(pa.large_binary() if pa.types.is_large_string(values.type)
                                 else pa.binary())
            taken = values.take(pa.array(order, pa.int64())).to_pylist()
            starts = np.flatnonzero(np.diff(owners)) + 1
            bounds = zip([0, *starts.tolist()], [*starts.tolist(), len(owners)], strict=True)
            for lo, hi in bounds:
                lines.setdefault(streams[int(owners[lo])].tag, []).extend(
                    b"" if line is None else line for line in taken[lo:hi])
        for stream in streams:
            got = lines.get(stream.tag)
            if got is None:
                continue
            table = parse_lines(got, stream.fields)
            if table is None:
                yield from _again(stream)
            else:
                yield from _matched(stream, table)
    return stage


__all__ = ["AGAIN_TAG", "ARROW_TYPES", "LINE_COLUMN", "PATH_COLUMN", "ROWS_TAG", "StageStream",
           "TIMESTAMP_TEXT", "parse_lines", "stage_function"]
