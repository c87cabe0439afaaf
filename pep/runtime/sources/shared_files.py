"""The file side of the shared query (`pep/runtime/shared/`): one Structured Streaming file source
over the ingest directories of several streams, and each stream's files of a micro-batch read
as that stream's own source frame.

- **One source, many directories.** The shared query reads one path, a Hadoop glob naming the
  member streams' directories (`glob_path`: their common parent, then `{a,b,...}`). A stream
  joining or leaving changes the glob, and the query is started again on the same checkpoint:
  Spark's file source keeps the files it has seen by their paths (`sources/0`), not by the
  glob, so no other stream's position moves (the files it has committed stay committed, those
  it has not are read by the next query).
- **Which files a batch holds.** The micro-batch's DataFrame of a foreachBatch sink is an RDD
  without its files, and asking Spark would be a job; the file source writes them before the
  batch runs into its own log, `sources/0/<n>` (JSON lines after a `v1` line; every tenth entry
  a `<n>.compact` file holding every entry so far, its own last), which `batch_files` reads,
  from the end for a compact one. That log is numbered by the source, not by the query's
  batches: a stop that lands after the source logged new files but before the query wrote the
  batch's offsets leaves an entry no batch names, and the next query's first batch takes it
  with the entry it logs itself. So the batch's own offsets say which entries it holds
  (`offsets/<batch>`: the source's last entry; the batch before's: where it starts), never its
  number alone (read so, every later batch read the entry of the batch before it, and a
  stream's last files waited for the next file to come, `process_available` done).
- **Each stream read as itself.** `batch_frame` reads a stream's files of the batch with its
  own schema, shaped as its streaming source is (`sources/frames.py`: the attributes,
  `_xsg_seq`, `_xsg_file`), so every job of the per-stream query runs on it unchanged.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyspark.sql import DataFrame, SparkSession, functions as F

from pep.core.plan import StreamDefinition
from pep.runtime.base.columns import FILE_COLUMN, SEQ_COLUMN
from pep.runtime.sources.frames import local_dir, spark_schema

# characters a Hadoop glob gives a meaning to: a directory holding one is not shared
_GLOB_CHARS = frozenset("{}[]*?\\,^!")
_TAIL_BLOCK = 1 << 16


def shareable_dir(definition: StreamDefinition) -> str | None:
    """The local ingest directory of a stream the shared query can read (None: not an
    `ingest` stream, not local, or a path a glob cannot name)."""
    if definition.source.kind != "ingest":
        return None
    path = definition.source.option("path")
    local = local_dir(path) if path else None
    if not local or any(c in _GLOB_CHARS for c in local):
        return None
    return os.path.abspath(local)


def glob_path(directories: list[str]) -> str:
    """One Hadoop glob naming exactly `directories` (absolute, none with glob characters):
    their common parent, then the alternatives below it. Always a glob, one directory too
    (`parent/{name}`): Spark's file source takes a plain directory for the base path of every
    file it reads again, and a batch logged before the members changed holds files of other
    directories ("Wrong basePath" when the query starts again)."""
    if not directories:
        raise ValueError("a glob of no directory")
    dirs = sorted(set(directories))
    if len(dirs) == 1:
        parent, name = os.path.split(dirs[0])
        return os.path.join(parent, "{" + name + "}")
    parent = os.path.commonpath(dirs)
    rest = [os.path.relpath(d, parent) for d in dirs]
    if "." in rest:  # one directory holds another: name each in full below the root
        parent, rest = os.path.sep, [d.lstrip(os.path.sep) for d in dirs]
    return os.path.join(parent, "{" + ",".join(rest) + "}")


def _path_of(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("", "file") else uri


def batch_files(checkpoint: Path, batch_id: int) -> list[str]:
    """The local paths of the files the shared query's file source put in batch `batch_id`, in
    the order it logged them (`checkpoint`: the query's checkpoint directory)."""
    first, last = source_range(checkpoint, batch_id)
    return logged_files(checkpoint, first, last)


def source_range(checkpoint: Path, batch_id: int) -> tuple[int, int]:
    """The file source's log entries batch `batch_id` holds, (after, last]: the source's offset
    in the offset log of the batch before (-1 for the first batch), and in the batch's own.
    Raises OSError or ValueError when the batch's offsets cannot be read (the batch fails,
    never runs on a guess)."""
    last = _logged_offset(checkpoint / "offsets" / str(batch_id))
    if last is None:
        raise ValueError(f"shared stream query: batch {batch_id} has no offsets of its source")
    after = -1
    if batch_id > 0:
        before = _logged_offset(checkpoint / "offsets" / str(batch_id - 1))
        if before is not None:
            after = before
    return after, last


def _logged_offset(path: Path) -> int | None:
    """The file source's offset in one offset log file (`v1`, the batch's metadata, then one
    line per source: `{"logOffset":n}`), None when the file is not there."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    sources = [line for line in lines[2:] if line.strip()]
    if len(sources) != 1:
        raise ValueError(f"{path}: one source's offset expected, found {len(sources)}")
    return int(json.loads(sources[0])["logOffset"])


def logged_files(checkpoint: Path, after: int, last: int) -> list[str]:
    """The local paths of the file source's log entries after `after` up to `last`, in order."""
    log_dir = checkpoint / "sources" / "0"
    found: list[str] = []
    compacts: list[int] | None = None
    for entry in range(after + 1, last + 1):
        plain = log_dir / str(entry)
        if plain.is_file():
            lines = plain.read_text(encoding="utf-8").splitlines()[1:]
            found += [_path_of(json.loads(line)["path"]) for line in lines if line.strip()]
            continue
        # compacted: in the first compact file from this entry on (its own, or a later one
        # once the plain file was cleaned up)
        if compacts is None:
            compacts = sorted(int(p.name.split(".")[0]) for p in log_dir.glob("*.compact")
                              if p.name.split(".")[0].isdigit())
        holder = next((c for c in compacts if c >= entry), None)
        if holder is not None:
            found += _tail_entries(log_dir / f"{holder}.compact", entry)
    return found


def _tail_entries(path: Path, batch_id: int) -> list[str]:
    """A compact log's entries of `batch_id`, read back from the end, a block at a time, until
    an entry of an earlier one (never the whole log, which holds every file the source ever
    read)."""
    size = path.stat().st_size
    found: list[str] = []
    with open(path, "rb") as f:
        end, carry = size, b""
        while end > 0:
            start = max(0, end - _TAIL_BLOCK)
            f.seek(start)
            chunk = f.read(end - start) + carry
            lines = chunk.split(b"\n")
            carry = lines[0] if start > 0 else b""
            body = lines[1:] if start > 0 else lines
            for raw in reversed(body):
                line = raw.strip()
                if not line or line == b"v1":
                    continue
                entry = json.loads(line)
                logged = int(entry["batchId"])
                if logged < batch_id:
                    found.reverse()
                    return found
                if logged == batch_id:
                    found.append(_path_of(entry["path"]))
            end = start
    found.reverse()
    return found


def batch_frame(spark: SparkSession, definition: StreamDefinition, files: list[str]
                ) -> DataFrame:
    """A stream's files of one micro-batch as its source frame: the attributes in its schema's
    types, `_xsg_seq`, `_xsg_file` (the columns `sources/frames.py` gives a streaming one). A
    file removed meanwhile is skipped, as the streaming source skips it."""
    schema = spark_schema(definition.schema, True)
    df = (spark.read.schema(schema).option("ignoreMissingFiles", "true").json(files))
    cols = [F.col(f"`{f.name}`") for f in definition.schema.fields]
    cols.append(F.col(f"`{SEQ_COLUMN}`").cast("long").alias(SEQ_COLUMN))
    cols.append(F.col("_metadata.file_path").cast("string").alias(FILE_COLUMN))
    return df.select(*cols)


def archive_files(files: list[str], archive: Path) -> int:
    """Committed files of a stream leave its ingest directory for its archive (what the
    per-stream query's `cleanSource=archive` does), where retention removes them; returns how
    many moved (a file already gone is skipped)."""
    moved = 0
    for path in files:
        try:
            archive.mkdir(parents=True, exist_ok=True)
            os.replace(path, archive / os.path.basename(path))
            moved += 1
        except FileNotFoundError:
            continue
    return moved


__all__ = ["archive_files", "batch_files", "batch_frame", "glob_path", "logged_files",
           "shareable_dir", "source_range"]
