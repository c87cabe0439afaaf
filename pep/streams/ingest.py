"""Records appended to a stream through the gateway, and the feeds that copy them.

Ingest (`append_records`) is the HTTP way for an owner to feed an `ingest` stream. A batch is all
or nothing: every line is validated against the schema before anything is written, the batch is
written to a hidden temporary file in the stream's ingest directory (Spark's file source skips
names starting with `.`) and renamed into place with `os.replace`, so Spark never sees half a
batch. Each record gets `_xsg_seq`, a per-stream, strictly increasing integer that the runtime
uses to order tuples for tuple windows (the file source does not keep arrival order within a
micro-batch); the counter is persisted in the catalogue's database, so it keeps increasing after
a restart. Across micro-batches the order is the files': Spark's file source takes a batch's
files oldest first by modification time, in whole milliseconds, and files of the same
millisecond in the directory's listing order (on ext4 the hash order of their names), so each
file of a stream gets a modification time in a later millisecond than the stream's file before
it (`_file_time`): two batches appended within one millisecond are never read the later one
first.

For a `kafka` stream, `append_records` validates the batch the same way and produces its
records to the stream's topic, returning once the broker acknowledged them all
(`pep/streams/kafka_producer.py`; a broker that refuses or does not answer: Unavailable, 503).
No `_xsg_seq` is added: a Kafka stream is ordered by time, partition and offset.

Feeds (`open_feed` / `close_feed`) give a reader other than the stream's own query (a join)
every batch written after it opened, and none before: each new file is also hard-linked (copied
where links are impossible) into the feed's directory, under the same lock that numbers the
batches, so a feed starts exactly between two batches. The stream's own query moves the files
it has committed to its archive; a feed's files are its reader's to consume.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from common.db import Database
from pep.core import punctuations
from pep.core.jsontypes import JsonValue
from pep.streams.definition import SEQ_FIELD, StreamConflict, StreamNotFound
from pep.streams.entries import StreamEntry
from pep.streams.records import (
    DEFAULT_MAX_LINES,
    BatchTooLarge,
    RecordError,
    validate_records,
)

if TYPE_CHECKING:  # confluent-kafka is imported with the first Kafka append, not before
    from pep.streams.kafka_producer import KafkaAppender

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


class RecordIngest:
    """The catalogue's ingest (`StreamCatalog` makes one and hands it its database): batches
    appended, numbered and written whole, copied into the open feeds, or produced to a Kafka
    stream's topic. `lookup(name)` finds a stream as the catalogue shows it, `deleting(name)`
    says it is being deleted, `ingest_dir(name)` is where its files go."""

    def __init__(self, db: Database, lookup: Callable[[str], StreamEntry | None],
                 deleting: Callable[[str], bool], ingest_dir: Callable[[str], Path],
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_lines: int = DEFAULT_MAX_LINES, kafka_timeout: float | None = None) -> None:
        self._db = db
        self._lock = db.lock
        self._lookup = lookup
        self._deleting = deleting
        self._ingest_dir = ingest_dir
        self.max_body_bytes = max_body_bytes
        self.max_lines = max_lines
        self._locks: dict[str, threading.Lock] = {}
        self._feeds: dict[str, list[Path]] = {}
        # per stream, the modification time (ns) given to its last file (`_file_time`)
        self._file_times: dict[str, int] = {}
        # records appended to Kafka-backed streams go to their topics (made at the first one)
        self._kafka: KafkaAppender | None = None
        # called with an `ingest` stream's name before its batch is numbered and written:
        # with several gateway processes, only the stream's own writes it (`pep.cluster`;
        # the hook raises to send the append there)
        self.before_append: Callable[[str], None] | None = None
        self.kafka_timeout = kafka_timeout

    def close(self) -> None:
        if self._kafka is not None:
            self._kafka.close()

    def lock(self, name: str) -> threading.Lock:
        """The stream's ingest lock: appends hold it, and so does the end of a deletion."""
        with self._lock:
            return self._locks.setdefault(name.lower(), threading.Lock())

    def _kafka_appender(self) -> KafkaAppender:
        from pep.streams.kafka_producer import DEFAULT_TIMEOUT, KafkaAppender
        with self._lock:
            if self._kafka is None:
                self._kafka = KafkaAppender()
            self._kafka.timeout = self.kafka_timeout or DEFAULT_TIMEOUT
            return self._kafka

    def open_feed(self, name: str, directory: Path) -> None:
        """From now on, every batch appended to stream `name` also appears in `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with self.lock(name):
            feeds = self._feeds.setdefault(name.lower(), [])
            if directory not in feeds:
                feeds.append(directory)

    def close_feed(self, name: str, directory: Path) -> None:
        """Stop copying batches into `directory` (idempotent); its files are left as they are."""
        with self.lock(name):
            feeds = self._feeds.get(name.lower(), [])
            if Path(directory) in feeds:
                feeds.remove(Path(directory))

    def drop_feeds(self, name: str) -> None:
        """Forget the feeds of a deleted stream (their directories are their readers')."""
        with self._lock:
            self._feeds.pop(name.lower(), None)

    def _file_time(self, name: str, directory: Path, written: int) -> int:
        """The modification time (ns) for the stream's next file, written at `written`: that
        time if it is in a later millisecond than the stream's last file's, else the next
        millisecond. Spark's file source reads a stream's files in the order of their times in
        milliseconds (ties in listing order, not in the order written): a file written in the
        same millisecond as the one before it (a burst of appends on a fast disk; on a kernel
        whose file times have the clock tick's resolution, 1-10 ms, every file of one tick),
        or after the clock was set back, would otherwise be read before it, its tuples
        delivered ahead of earlier ones, and with `maxFilesPerTrigger` a micro-batch could
        hold it without the file before it. The first file of a stream in this process comes
        after the newest file still waiting in its directory (written by an earlier process).
        Called under the stream's lock."""
        key = name.lower()
        last = self._file_times.get(key)
        if last is None:
            last = _newest_file_time(directory)
        stamp = written if written // _MS > last // _MS else (last // _MS + 1) * _MS
        self._file_times[key] = stamp
        return stamp

    def _to_feeds(self, name: str, final: Path) -> None:
        for feed in self._feeds.get(name.lower(), ()):
            target = feed / final.name
            try:
                os.link(final, target)
            except FileExistsError:
                pass
            except OSError:
                try:  # another filesystem: a hidden copy renamed into place, never half a file
                    hidden = feed / f".incoming-{secrets.token_hex(8)}.json.tmp"
                    shutil.copyfile(final, hidden)
                    shutil.copystat(final, hidden)  # its time orders it, as a link's does
                    os.replace(hidden, target)
                except OSError as exc:
                    log.error("stream %s: could not feed %s into %s: %s", name, final.name,
                              feed, exc)

    def append_records(self, name: str, body: bytes) -> int:
        """Validate and append a batch of JSON lines; returns how many records were written.

        All or nothing: a RecordError (BatchTooLarge for a batch over the limits) leaves no file
        and no sequence numbers used (and sends nothing to a Kafka stream's topic).
        """
        entry = self._lookup(name)
        if entry is None:
            raise StreamNotFound(f"no stream named {name!r}")
        d = entry.definition
        if d.source.kind not in ("ingest", "kafka"):
            raise StreamConflict(f"stream {d.name!r} reads from a {d.source.kind} source; "
                                 "records can only be appended to an 'ingest' or a 'kafka' "
                                 "stream")
        if len(body) > self.max_body_bytes:
            raise BatchTooLarge(f"batch of {len(body)} bytes is over the limit of "
                                f"{self.max_body_bytes}")
        # each punctuation precedes the tuples after it: how many tuples come before it
        placed: list[tuple[int, punctuations.Punctuation]] = []
        reader: Callable[[JsonValue, int, int], None] | None = None
        if punctuations.enabled(d):
            def reader(doc: JsonValue, line: int, before: int) -> None:
                if d.source.kind == "kafka":
                    # the gateway's producer spreads records over the partitions, and a
                    # punctuation holds within its partition only: its owner sends it itself
                    raise RecordError("a security punctuation cannot be appended through the "
                                      "gateway to a kafka stream: send it to the topic, to "
                                      "each partition it governs (docs/punctuations.md)",
                                      line=line, field=punctuations.PUNCTUATION_KEY)
                placed.append((before, punctuations.parse_punctuation(doc, d.schema,
                                                                      f"line {line}")))
        records = validate_records(d.schema, body, d.time_attribute, self.max_lines,
                                   optional=frozenset(n.lower() for n in entry.optional),
                                   punctuation=reader)
        if d.source.kind == "kafka":
            return self._kafka_appender().append(d, records) if records else 0
        if not records and not placed:
            return 0
        if self.before_append is not None:
            self.before_append(d.name)
        directory = self._ingest_dir(d.name)
        with self.lock(d.name):
            with self._db.transaction() as db:
                # the stream's row stays locked until the counter is written (PostgreSQL: also
                # against another process appending to the same stream)
                row = db.execute("SELECT next_seq, schema_json FROM streams WHERE name = ?"
                                 + self._db.dialect.for_update, (d.name,)).fetchone()
                if row is None or self._deleting(d.name):
                    # deleted since it was looked up: nothing written, nothing recreated
                    raise StreamNotFound(f"no stream named {name!r}")
                (first, _) = row
                directory.mkdir(parents=True, exist_ok=True)
                log_lines = [punctuations.log_line(first + i, sp) for i, sp in placed]
                if not records:  # punctuations only: they precede the next batch's tuples
                    _append_log(directory / punctuations.LOG_NAME, log_lines)
                    return 0
                # The numbers are reserved, and the file written after the commit: the
                # catalogue's write lock (SQLite's is the whole database's) is held for the
                # counter, not for a file's fsync, so the appends of other streams do not
                # queue behind this one (they did: 41% of a busy gateway's time, issue 49).
                # This stream's own appends stay in order: `self.lock` is held throughout.
                db.execute("UPDATE streams SET next_seq = ? WHERE name = ?",
                           (first + len(records), d.name))
            # The counter is committed before the file appears: a crash or a failed write in
            # between wastes sequence numbers (harmless) but can never reuse one. The batch's
            # punctuations are in the stream's log before its tuples can be read: the runtime
            # never reads a tuple whose segment's policy it does not know
            # (`pep/runtime/query/shield.py`).
            lines = []
            for i, r in enumerate(records):
                r[SEQ_FIELD] = first + i
                lines.append(json.dumps(r, separators=(",", ":"), ensure_ascii=False))
            data = ("\n".join(lines) + "\n").encode("utf-8")
            tmp = directory / f".incoming-{secrets.token_hex(8)}.json.tmp"
            final = directory / f"{first:020d}-{secrets.token_hex(4)}.json"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                if log_lines:
                    _append_log(directory / punctuations.LOG_NAME, log_lines)
                written = os.stat(tmp).st_mtime_ns
                stamp = self._file_time(d.name, directory, written)
                if stamp != written:
                    os.utime(tmp, ns=(stamp, stamp))  # before Spark can list it
                os.replace(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
            self._to_feeds(d.name, final)
            _fsync_dir(directory)
        return len(records)


_MS = 1_000_000  # ns: the resolution of the modification times Spark's file source orders by


def _newest_file_time(directory: Path) -> int:
    """The latest modification time (ns) of the batch files in `directory` (0: none)."""
    newest = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.name.endswith(".json"):
                    continue
                try:
                    newest = max(newest, entry.stat().st_mtime_ns)
                except OSError:
                    continue  # read and archived meanwhile
    except OSError:
        return 0
    return newest


def _append_log(path: Path, lines: list[str]) -> None:
    """Lines appended to a stream's punctuation log, on disk before this returns."""
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["DEFAULT_MAX_BODY_BYTES", "RecordIngest"]
