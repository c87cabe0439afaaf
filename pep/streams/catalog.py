"""The stream catalogue: which streams exist, who owns them, and the owner's record ingest.

A stream is registered once (name, schema, source, event-time attribute, visibility, settings)
and persisted in SQLite, so a restart keeps it. The owner of a stream is the authenticated
subject that registered it. What an owner may change afterwards (`update`: visibility,
description, lateness, retention, attributes added to the schema) is written in one
transaction; a store written before a column existed gets it, with its default, when it is
opened (`_migrate`).

Deletion (`begin_delete`, `finish_delete`, driven by `pep.streams.lifecycle`) first hides the
stream from every lookup here (so no request, ingest or event can start on it), and at the end
removes its row and moves its ingest directory out of the way, under the stream's ingest lock
(an append in progress finishes first; a later one finds no stream). The name is kept in
`deleted_streams` with its former owner: it stays reserved to that owner (and administrators),
because kept policies, the audit trail and ended handles name streams by name.

Ingest (`append_records`) is the HTTP way for an owner to feed an `ingest` stream. A batch is all
or nothing: every line is validated against the schema before anything is written, the batch is
written to a hidden temporary file in the stream's ingest directory (Spark's file source skips
names starting with `.`) and renamed into place with `os.replace`, so Spark never sees half a
batch. Each record gets `_xsg_seq`, a per-stream, strictly increasing integer that the runtime
uses to order tuples for tuple windows (the file source does not keep arrival order within a
micro-batch); the counter is persisted in the same database, so it keeps increasing after a
restart.

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
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pdp.db import Database
from pep.core.labels import Lattice
from pep.core.plan import Field, SourceSpec, StreamDefinition, StreamSchema
from pep.core.schemas import BUILTIN_SCHEMAS, BUILTIN_TIME_ATTRIBUTES
from pep.streams.definition import (LISTED, SEQ_FIELD, STREAM_NAME, InvalidStream,
                                    StreamConflict, StreamNotFound, describe, extend_schema,
                                    parse_combining, parse_description, parse_lateness,
                                    parse_retention, parse_schema, parse_source, parse_visibility)
from pep.streams.records import DEFAULT_MAX_LINES, BatchTooLarge, validate_records

if TYPE_CHECKING:  # confluent-kafka is imported with the first Kafka append, not before
    from pep.streams.kafka_producer import KafkaAppender

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# The column behind each setting an owner may change (`definition.PATCHABLE`); the schema
# fields are written as `schema_json` and `optional_json`.
_PATCH_COLUMNS = {"visibility": "visibility", "description": "description",
                  "lateness": "lateness", "retention": "retention", "combining": "combining"}

_SCHEMA = ("CREATE TABLE IF NOT EXISTS streams ("
           " name TEXT PRIMARY KEY COLLATE NOCASE, owner TEXT NOT NULL,"
           " schema_json TEXT NOT NULL, source_json TEXT NOT NULL, time_attribute TEXT,"
           " created_at TEXT NOT NULL, next_seq INTEGER NOT NULL DEFAULT 1,"
           " visibility TEXT NOT NULL DEFAULT 'listed', description TEXT NOT NULL DEFAULT '',"
           " lateness REAL, retention REAL, optional_json TEXT NOT NULL DEFAULT '[]',"
           " combining TEXT);"
           "CREATE TABLE IF NOT EXISTS deleted_streams ("
           " name TEXT PRIMARY KEY COLLATE NOCASE, owner TEXT NOT NULL,"
           " deleted_at TEXT NOT NULL, deleted_by TEXT NOT NULL)")
# Columns added since the first stores were written: (name, its definition for ALTER TABLE).
_ADDED_COLUMNS = (("visibility", "TEXT NOT NULL DEFAULT 'listed'"),
                  ("description", "TEXT NOT NULL DEFAULT ''"),
                  ("lateness", "REAL"), ("retention", "REAL"),
                  ("optional_json", "TEXT NOT NULL DEFAULT '[]'"), ("combining", "TEXT"))


def _schema_json(fields) -> str:
    """A schema as stored: [name, type] per attribute, and a label's lattice after them."""
    return json.dumps([[f.name, f.type] + ([f.lattice.to_json()] if f.lattice else [])
                       for f in fields])


@dataclass(frozen=True)
class StreamEntry:
    definition: StreamDefinition
    created_at: str
    next_seq: int
    visibility: str = LISTED  # `pep.streams.visibility`: listed or restricted
    description: str = ""
    retention: float | None = None  # seconds in the archive; None: the gateway's default
    optional: tuple[str, ...] = ()  # attributes added after registration: records may omit them
    combining: str | None = None  # `pep.core.union`: the owner's mode; None: the gateway's

    def settings(self) -> dict:
        """The owner's settings as `describe` shows them (None: the gateway's default)."""
        return {"description": self.description, "lateness": self.definition.lateness,
                "retention": self.retention}


@dataclass(frozen=True)
class DeletedStream:
    """A deleted stream's name, reserved to its former owner (`register`)."""

    name: str
    owner: str
    deleted_at: str
    deleted_by: str


class StreamCatalog:
    """Registered streams in SQLite, plus the ingest directory of each `ingest` stream."""

    def __init__(self, db_path: str | Path, data_dir: str | Path,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_lines: int = DEFAULT_MAX_LINES,
                 kafka_timeout: float | None = None) -> None:
        self.db_path = Path(db_path)
        self.data_dir = Path(data_dir)
        self.max_body_bytes = max_body_bytes
        self.max_lines = max_lines
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._ingest_locks: dict[str, threading.Lock] = {}
        self._change_locks: dict[str, threading.RLock] = {}
        self._deleting: set[str] = set()  # lower-cased names being deleted: found by no lookup
        self._feeds: dict[str, list[Path]] = {}
        self._db = Database(self.db_path, _SCHEMA)
        self._lock = self._db.lock
        self._migrate()
        # Called with the definition of every stream registered (its owner registered it).
        self._listeners: list[Callable[[StreamDefinition], None]] = []
        # `callback(entry, changes, by)` after an owner's change (`update`) is committed.
        self._change_listeners: list[Callable[[StreamEntry, dict, str], None]] = []
        # Each stream's visibility by lower-cased name: read on every call that names a stream,
        # written only through this object (register, update), so it cannot go stale.
        self._visibility: dict[str, str] = {
            str(n).lower(): v for n, v in self._db.fetchall("SELECT name, visibility FROM streams")}
        # Each stream's combining mode (set by its owner), read by every decision about it.
        self._combining: dict[str, str] = {
            str(n).lower(): c for n, c in self._db.fetchall(
                "SELECT name, combining FROM streams WHERE combining IS NOT NULL")}
        # Definitions by the name they were found under, forgotten whenever a stream changes or
        # goes (`_forget`). A re-decision of a thousand handles looks its stream up a thousand
        # times.
        self._found: dict[str, StreamDefinition] = {}
        # records appended to Kafka-backed streams go to their topics (made at the first one)
        self._kafka: KafkaAppender | None = None
        self.kafka_timeout = kafka_timeout

    def add_listener(self, callback: Callable[[StreamDefinition], None]) -> None:
        self._listeners.append(callback)

    def add_change_listener(self, callback: Callable[[StreamEntry, dict, str], None]) -> None:
        self._change_listeners.append(callback)

    def _migrate(self) -> None:
        """Bring a store written by an earlier version up to this schema (added columns get
        their default: an existing stream stays `listed`, as every stream was)."""
        with self._db.transaction() as db:
            have = {row[1] for row in db.execute("PRAGMA table_info(streams)").fetchall()}
            for column, definition in _ADDED_COLUMNS:
                if column not in have:
                    db.execute(f"ALTER TABLE streams ADD COLUMN {column} {definition}")
                    log.info("stream catalogue %s: added column %s", self.db_path, column)

    def close(self) -> None:
        if self._kafka is not None:
            self._kafka.close()
        self._db.close()

    def ingest_dir(self, name: str) -> Path:
        return self.data_dir / "streams" / name / "ingest"

    def stream_dir(self, name: str) -> Path:
        """Everything the catalogue keeps on disk for a stream (its ingest directory)."""
        return self.data_dir / "streams" / name

    def changing(self, name: str) -> threading.RLock:
        """The lock that serialises the life-cycle operations on one stream (change, delete,
        defining an event): hold it around a check and the change it allows."""
        with self._lock:
            return self._change_locks.setdefault(name.lower(), threading.RLock())

    def _forget(self) -> None:
        self._found = {}

    # -- registration ---------------------------------------------------------------------------

    def register(self, name: Any, owner: str, schema: Any, source: Any = None,
                 time_attribute: str | None = None, *, trusted: bool = False,
                 visibility: Any = LISTED, description: Any = None, lateness: Any = None,
                 retention: Any = None) -> StreamDefinition:
        """Register a stream; InvalidStream, SourceNotPermitted (privileged source) or
        StreamConflict (exists, or the name of another owner's deleted stream).

        `schema` may be omitted (None) for a generator source, which then uses its built-in one.
        `visibility` is `listed` (everyone sees it) or `restricted` (`pep.streams.visibility`).
        `trusted`: an administrator (privileged sources, any deleted stream's name).
        """
        if not isinstance(name, str) or not STREAM_NAME.fullmatch(name):
            raise InvalidStream(f"stream name must match {STREAM_NAME.pattern}, got {name!r}")
        if not isinstance(owner, str) or not owner:
            raise InvalidStream("a stream needs an owner")
        visibility = parse_visibility(visibility)
        description = parse_description(description)
        lateness = parse_lateness(lateness)
        retention = parse_retention(retention)
        spec = parse_source(source, self.ingest_dir(name), trusted)
        if spec.kind == "generator":
            builtin = BUILTIN_SCHEMAS[spec.option("schema") or ""]
            if schema is None:
                schema = builtin
                time_attribute = (time_attribute
                                  or BUILTIN_TIME_ATTRIBUTES[spec.option("schema") or ""])
            parsed = parse_schema(schema)
            if parsed != builtin:
                raise InvalidStream(f"a {spec.option('schema')} generator produces its built-in "
                                    "schema; omit 'schema' or give exactly that one")
        else:
            parsed = parse_schema(schema)
        if time_attribute is not None:
            if not isinstance(time_attribute, str):
                raise InvalidStream("time_attribute must be a field name")
            f = parsed.lookup(time_attribute)
            if f is None:
                raise InvalidStream(f"time_attribute {time_attribute!r} is not in the schema")
            if f.type not in ("timestamp", "double", "long"):
                raise InvalidStream(f"time_attribute {f.name!r} must be a timestamp or a "
                                    f"number of epoch seconds, not {f.type}")
            time_attribute = f.name
        if lateness is not None and time_attribute is None:
            raise InvalidStream("lateness applies to time windows, and the stream has no "
                                "time_attribute")
        definition = StreamDefinition(name, owner, parsed, spec, time_attribute, lateness)
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self._db.transaction() as db:
            if db.execute("SELECT 1 FROM streams WHERE name = ?", (name,)).fetchone() \
                    or name.lower() in self._deleting:
                raise StreamConflict(f"stream {name!r} already exists")
            former = db.execute("SELECT owner FROM deleted_streams WHERE name = ?",
                                (name,)).fetchone()
            if former is not None and former[0] != owner and not trusted:
                raise StreamConflict(f"stream name {name!r} belonged to a deleted stream and is "
                                     "reserved to its former owner (policies, the audit trail "
                                     "and ended handles name streams by name)")
            db.execute("DELETE FROM deleted_streams WHERE name = ?", (name,))
            db.execute(
                "INSERT INTO streams (name, owner, schema_json, source_json, time_attribute,"
                " created_at, next_seq, visibility, description, lateness, retention)"
                " VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?)",
                (name, owner, _schema_json(parsed.fields),
                 json.dumps([spec.kind, [list(o) for o in spec.options]]), time_attribute, now,
                 visibility, description, lateness, retention))
            if spec.kind == "ingest":
                self.ingest_dir(name).mkdir(parents=True, exist_ok=True)
            self._visibility[name.lower()] = visibility
        self._forget()
        for callback in list(self._listeners):
            try:
                callback(definition)
            except Exception:  # noqa: BLE001 - a listener must not undo a registration
                log.exception("stream listener failed for %s", name)
        return definition

    # -- an owner's changes ---------------------------------------------------------------------

    def update(self, name: str, changes: dict, by: str) -> StreamEntry:
        """Apply an owner's validated changes (`definition.parse_stream_patch`) to the stream, all
        in one transaction, and tell the change listeners; StreamNotFound if it is not there,
        InvalidStream (SchemaChange) for a schema change that is not an addition. Only the
        fields of `definition.PATCHABLE` exist."""
        unknown = set(changes) - set(_PATCH_COLUMNS) - {"add_attributes", "schema"}
        if unknown:
            raise InvalidStream(f"cannot change {', '.join(sorted(unknown))}")
        with self._db.transaction() as db:
            current = self.entry(name)
            if current is None:
                raise StreamNotFound(f"no stream named {name!r}")
            registered = current.definition.name
            if changes.get("lateness") is not None and current.definition.time_attribute is None:
                raise InvalidStream("lateness applies to time windows, and the stream has no "
                                    "time_attribute")
            schema = extend_schema(current.definition, changes)
            for field_name, value in changes.items():
                if field_name in _PATCH_COLUMNS:
                    db.execute(f"UPDATE streams SET {_PATCH_COLUMNS[field_name]} = ?"
                               " WHERE name = ?", (value, registered))
            if schema is not None:
                added = [f.name for f in schema.fields[len(current.definition.schema.fields):]]
                db.execute("UPDATE streams SET schema_json = ?, optional_json = ? WHERE name = ?",
                           (_schema_json(schema.fields),
                            json.dumps(list(current.optional) + added), registered))
            if "visibility" in changes:
                self._visibility[registered.lower()] = changes["visibility"]
            if "combining" in changes:
                if changes["combining"] is None:
                    self._combining.pop(registered.lower(), None)
                else:
                    self._combining[registered.lower()] = changes["combining"]
        self._forget()
        entry = self.entry(registered)
        if entry is None:  # deleted meanwhile (the life-cycle lock prevents it)
            raise StreamNotFound(f"no stream named {name!r}")
        # what changed, as JSON: the settings as given, the schema as the attributes it gained
        told = {k: v for k, v in changes.items() if k in _PATCH_COLUMNS}
        if schema is not None:
            told["add_attributes"] = [{"name": f.name, "type": f.type}
                                      for f in schema.fields[len(current.definition.schema.fields):]]
        for callback in list(self._change_listeners):
            try:
                callback(entry, told, by)
            except Exception:  # noqa: BLE001 - a listener must not undo a committed change
                log.exception("stream change listener failed for %s", registered)
        return entry

    def combining(self, name: str) -> str | None:
        """The owner's combining mode for the stream (`pep.core.union`), None when it chose
        none (or there is no such stream)."""
        return self._combining.get(name.lower()) if isinstance(name, str) else None

    def visibility(self, name: str) -> str | None:
        """The stream's visibility (name looked up case-insensitively), None when unknown."""
        return self._visibility.get(name.lower()) if isinstance(name, str) else None

    # -- deletion -------------------------------------------------------------------------------

    def begin_delete(self, name: str) -> StreamEntry:
        """Hide the stream from every lookup (`entry`, `get`, `all`, ingest, registration of the
        name) until `finish_delete` or `abort_delete`; StreamNotFound if it is not there."""
        entry = self.entry(name)
        if entry is None:
            raise StreamNotFound(f"no stream named {name!r}")
        with self._lock:
            self._deleting.add(entry.definition.name.lower())
        self._forget()
        return entry

    def abort_delete(self, name: str) -> None:
        with self._lock:
            self._deleting.discard(name.lower())
        self._forget()

    def finish_delete(self, name: str, by: str, move_to: Path | None) -> Path | None:
        """Remove the stream's row, keep its name reserved to its former owner, and move its
        directory (`stream_dir`) to `move_to` (None: remove it), all under the stream's ingest
        lock, so that an append in progress ends before and none starts after. Returns where
        the directory went (None: it had none, or it was removed)."""
        with self._ingest_lock(name):
            now = datetime.now(timezone.utc).isoformat(timespec="seconds")
            with self._db.transaction() as db:
                row = db.execute("SELECT name, owner FROM streams WHERE name = ?",
                                 (name,)).fetchone()
                if row is None:
                    raise StreamNotFound(f"no stream named {name!r}")
                registered, owner = row
                db.execute("DELETE FROM streams WHERE name = ?", (registered,))
                db.execute("INSERT OR REPLACE INTO deleted_streams (name, owner, deleted_at,"
                           " deleted_by) VALUES (?, ?, ?, ?)", (registered, owner, now, by))
            with self._lock:
                self._visibility.pop(registered.lower(), None)
                self._combining.pop(registered.lower(), None)
                self._feeds.pop(registered.lower(), None)
                self._deleting.discard(registered.lower())
            self._forget()
            directory = self.stream_dir(registered)
            if not directory.exists():
                return None
            if move_to is None:
                shutil.rmtree(directory, ignore_errors=True)
                return None
            move_to.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(directory), str(move_to))
            return move_to

    def ever_held(self) -> bool:
        """Has this catalogue ever held a stream (one now, or one deleted)?"""
        return bool(self._db.fetchone("SELECT 1 FROM streams UNION ALL"
                                      " SELECT 1 FROM deleted_streams LIMIT 1"))

    def deleted(self, name: str) -> DeletedStream | None:
        """The deleted stream that held this name (case-insensitively), if any."""
        if not isinstance(name, str):
            return None
        row = self._db.fetchone("SELECT name, owner, deleted_at, deleted_by FROM deleted_streams"
                                " WHERE name = ?", (name,))
        return DeletedStream(*row) if row else None

    # -- reads ------------------------------------------------------------------------------------

    @staticmethod
    def _entry(row: tuple) -> StreamEntry:
        name, owner, schema_json, source_json, time_attribute, created_at, next_seq, \
            visibility, description, lateness, retention, optional_json, combining = row
        schema = StreamSchema(tuple(
            Field(f[0], f[1], Lattice.from_json(f[2]) if len(f) > 2 else None)
            for f in json.loads(schema_json)))
        kind, options = json.loads(source_json)
        source = SourceSpec(kind, tuple((k, v) for k, v in options))
        return StreamEntry(StreamDefinition(name, owner, schema, source, time_attribute,
                                            lateness),
                           created_at, next_seq, visibility, description, retention,
                           tuple(json.loads(optional_json)), combining)

    _COLUMNS = ("name, owner, schema_json, source_json, time_attribute, created_at, next_seq,"
                " visibility, description, lateness, retention, optional_json, combining")

    def entry(self, name: str) -> StreamEntry | None:
        if not isinstance(name, str) or name.lower() in self._deleting:
            return None
        row = self._db.fetchone(f"SELECT {self._COLUMNS} FROM streams WHERE name = ?", (name,))
        return self._entry(row) if row else None

    def get(self, name: str) -> StreamDefinition | None:
        """The stream, looked up case-insensitively, or None."""
        cache = self._found
        found = cache.get(name) if isinstance(name, str) else None
        if found is not None:
            return found
        e = self.entry(name)
        if e is None:
            return None
        if len(cache) < 10_000:
            cache[name] = e.definition  # into the dict read above: a `_forget` since drops it
        return e.definition

    def schema(self, name: str) -> StreamSchema | None:
        """The schema of the stream spelled exactly `name` (the request processor's lookup: a
        plan must carry the registered spelling, which the runtime checks)."""
        d = self.get(name)
        return d.schema if d is not None and d.name == name else None

    def time_attribute(self, name: str) -> str | None:
        d = self.get(name)
        return d.time_attribute if d is not None and d.name == name else None

    def position(self, name: str) -> int | None:
        """The `_xsg_seq` of the last record ingested into an `ingest` stream (0: none yet);
        None for other sources, whose positions the gateway does not number."""
        entry = self.entry(name)
        if entry is None or entry.definition.source.kind != "ingest":
            return None
        return entry.next_seq - 1

    def definitions(self) -> list[StreamDefinition]:
        return [e.definition for e in self.all()]

    def all(self) -> list[StreamEntry]:
        rows = self._db.fetchall(f"SELECT {self._COLUMNS} FROM streams ORDER BY name")
        deleting = self._deleting
        return [self._entry(r) for r in rows if str(r[0]).lower() not in deleting]

    def list_visible(self, identity: Any, may_see: Callable[[Any, StreamEntry], bool] | None = None
                     ) -> list[dict]:
        """The streams this caller may see (`may_see(identity, entry)`, every one without it),
        described for it (`definition.describe` says what each caller is shown)."""
        return [describe(e.definition, e.created_at,
                         show_source=bool(identity.admin) or e.definition.owner == identity.subject,
                         visibility=e.visibility, settings=e.settings(), optional=e.optional,
                         combining=e.combining)
                for e in self.all() if may_see is None or may_see(identity, e)]

    # -- ingest -----------------------------------------------------------------------------------

    def _ingest_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._ingest_locks.setdefault(name.lower(), threading.Lock())

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
        with self._ingest_lock(name):
            feeds = self._feeds.setdefault(name.lower(), [])
            if directory not in feeds:
                feeds.append(directory)

    def close_feed(self, name: str, directory: Path) -> None:
        """Stop copying batches into `directory` (idempotent); its files are left as they are."""
        with self._ingest_lock(name):
            feeds = self._feeds.get(name.lower(), [])
            if Path(directory) in feeds:
                feeds.remove(Path(directory))

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
                    os.replace(hidden, target)
                except OSError as exc:
                    log.error("stream %s: could not feed %s into %s: %s", name, final.name,
                              feed, exc)

    def append_records(self, name: str, body: bytes) -> int:
        """Validate and append a batch of JSON lines; returns how many records were written.

        All or nothing: a RecordError (BatchTooLarge for a batch over the limits) leaves no file
        and no sequence numbers used (and sends nothing to a Kafka stream's topic).
        """
        entry = self.entry(name)
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
        records = validate_records(d.schema, body, d.time_attribute, self.max_lines,
                                   optional=frozenset(n.lower() for n in entry.optional))
        if not records:
            return 0
        if d.source.kind == "kafka":
            return self._kafka_appender().append(d, records)
        directory = self.ingest_dir(d.name)
        with self._ingest_lock(d.name):
            tmp = directory / f".incoming-{secrets.token_hex(8)}.json.tmp"
            with self._db.transaction() as db:
                row = db.execute("SELECT next_seq, schema_json FROM streams WHERE name = ?",
                                 (d.name,)).fetchone()
                if row is None or d.name.lower() in self._deleting:
                    # deleted since it was looked up: nothing written, nothing recreated
                    raise StreamNotFound(f"no stream named {name!r}")
                (first, _) = row
                directory.mkdir(parents=True, exist_ok=True)
                lines = []
                for i, r in enumerate(records):
                    r[SEQ_FIELD] = first + i
                    lines.append(json.dumps(r, separators=(",", ":"), ensure_ascii=False))
                data = ("\n".join(lines) + "\n").encode("utf-8")
                final = directory / f"{first:020d}-{secrets.token_hex(4)}.json"
                try:
                    with open(tmp, "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    db.execute("UPDATE streams SET next_seq = ? WHERE name = ?",
                               (first + len(records), d.name))
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
            # The counter is committed before the file appears: a crash in between wastes
            # sequence numbers (harmless) but can never reuse one.
            try:
                os.replace(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
            self._to_feeds(d.name, final)
            _fsync_dir(directory)
        return len(records)


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


def seed_streams(catalog: StreamCatalog, path: Path) -> list[str]:
    """Register the example streams of `path` (policies/streams.json) into an empty catalogue.

    Like the policy seeding, it happens once: a catalogue that has ever held a stream is left
    alone, so an owner's deletions and changes survive restarts. Returns the names registered."""
    if not path.is_file() or catalog.ever_held():
        return []
    names = []
    for entry in json.loads(path.read_text(encoding="utf-8")):
        catalog.register(entry["name"], entry["owner"], entry.get("schema"), entry.get("source"),
                         entry.get("time_attribute"), trusted=True,
                         visibility=entry.get("visibility", LISTED),
                         description=entry.get("description"))
        if entry.get("combining") is not None:  # the owner's choice, as a PATCH would set it
            catalog.update(entry["name"], {"combining": parse_combining(entry["combining"])},
                           by=entry["owner"])
        names.append(entry["name"])
    log.info("seeded the stream catalogue with %s from %s", ", ".join(names), path)
    return names


__all__ = ["StreamCatalog", "StreamEntry", "DeletedStream", "seed_streams",
           "DEFAULT_MAX_BODY_BYTES"]
