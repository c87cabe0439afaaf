"""The stream catalogue: which streams exist, who owns them, what their owners changed.

A stream is registered once (name, schema, source, event-time attribute, visibility, settings)
and persisted in its store (a SQLite file, or the PostgreSQL database: `common.db`), so a restart
keeps it. The owner of a stream is the authenticated
subject that registered it. What an owner may change afterwards (`update`: visibility,
description, lateness, retention, attributes added to the schema) is written in one
transaction; the tables are a versioned schema (`pep.streams.entries.SCHEMA`), migrated when the
catalogue is opened.

Deletion (`begin_delete`, `finish_delete`, driven by `pep.streams.lifecycle`) first hides the
stream from every lookup here (so no request, ingest or event can start on it), and at the end
removes its row and moves its ingest directory out of the way, under the stream's ingest lock
(an append in progress finishes first; a later one finds no stream). The name is kept in
`deleted_streams` with its former owner: it stays reserved to that owner (and administrators),
because kept policies, the audit trail and ended handles name streams by name.

Ingest and feeds (`append_records`, `open_feed`, `close_feed`) are `pep.streams.ingest`'s; the
catalogue holds one `RecordIngest` over its database. Its tables and rows are
`pep.streams.entries`'.

Derived streams (issue 48) are registered with their derivation, in one transaction
(`register(derivation=...)`; the rows are `pep.streams.derivations`'); only their deriving handle
feeds them (`pep.streams.derived`): their owner's appends are refused, and so is a change of
their schema, which is their deriving plan's output.
"""
from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from common.auth import Identity
from common.db import Database, open_database, opening, upsert_sql
from common.migrations import migrate
from pep.core.errors import NotPermitted
from pep.core.jsontypes import JsonObject, JsonValue
from pep.core.plan import StreamDefinition, StreamSchema
from pep.core.schemas import BUILTIN_SCHEMAS, BUILTIN_TIME_ATTRIBUTES
from pep.streams.definition import (
    LISTED,
    STREAM_NAME,
    InvalidStream,
    StreamConflict,
    StreamJson,
    StreamNotFound,
    StreamPatch,
    describe,
    extend_schema,
    parse_combining,
    parse_description,
    parse_lateness,
    parse_retention,
    parse_schema,
    parse_source,
    parse_visibility,
)
from pep.streams.derivations import DerivationRecord, DerivationTable
from pep.streams.entries import (
    ENTRY_COLUMNS,
    PATCH_COLUMNS,
    SCHEMA,
    DeletedStream,
    StreamEntry,
    entry_from_row,
    schema_json,
)
from pep.streams.ingest import DEFAULT_MAX_BODY_BYTES, RecordIngest
from pep.streams.records import DEFAULT_MAX_LINES

log = logging.getLogger(__name__)

# `callback(entry, changes, by)` after an owner's change: the stream as it is now, what changed
# as JSON (the settings as given, the schema as the attributes it gained), who changed it
ChangeListener = Callable[[StreamEntry, JsonObject, str], None]


class StreamCatalog:
    """Registered streams in their store, plus the ingest directory of each `ingest` stream.
    `where`: the store's database, or the path of its SQLite file."""

    def __init__(self, where: Database | str | Path, data_dir: str | Path,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_lines: int = DEFAULT_MAX_LINES,
                 kafka_timeout: float | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._change_locks: dict[str, threading.RLock] = {}
        self._deleting: set[str] = set()  # lower-cased names being deleted: found by no lookup
        with opening("stream catalogue", str(where)):
            self._db = open_database(where, "streams")
        try:
            with opening("stream catalogue", self._db.describe()):
                migrate(self._db, SCHEMA)
        except BaseException:
            self._db.close()
            raise
        self._lock = self._db.lock
        # Called with the definition of every stream registered (its owner registered it).
        self._listeners: list[Callable[[StreamDefinition], None]] = []
        # `callback(entry, changes, by)` after an owner's change (`update`) is committed.
        self._change_listeners: list[ChangeListener] = []
        self._delete_listeners: list[Callable[[str], None]] = []
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
        # appends and feeds (pep/streams/ingest.py), on this database and these lookups
        self.ingest = RecordIngest(self._db, self.entry,
                                   lambda name: name.lower() in self._deleting, self.ingest_dir,
                                   max_body_bytes, max_lines, kafka_timeout)
        # derived streams: what each derives from (pep/streams/derivations.py)
        self.derivations = DerivationTable(self._db)

    def add_listener(self, callback: Callable[[StreamDefinition], None]) -> None:
        self._listeners.append(callback)

    def add_change_listener(self, callback: ChangeListener) -> None:
        self._change_listeners.append(callback)

    def add_delete_listener(self, callback: Callable[[str], None]) -> None:
        """`callback(name)` once a stream's deletion is committed (`finish_delete`)."""
        self._delete_listeners.append(callback)

    def close(self) -> None:
        self.ingest.close()
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

    def refresh(self) -> set[str]:
        """Read again what lookups answer from memory (visibility, combining, definitions):
        another process on the same store changed the catalogue (`pep.cluster`). Returns the
        registered names now."""
        rows = self._db.fetchall("SELECT name, visibility, combining FROM streams")
        with self._lock:
            self._visibility = {str(n).lower(): v for n, v, _ in rows}
            self._combining = {str(n).lower(): c for n, _, c in rows if c is not None}
        self._forget()
        return {str(n) for n, _, _ in rows}

    # -- registration ---------------------------------------------------------------------------

    def register(self, name: JsonValue, owner: str, schema: JsonValue | StreamSchema,
                 source: JsonValue = None, time_attribute: JsonValue = None, *,
                 trusted: bool = False, visibility: JsonValue = LISTED,
                 description: JsonValue = None, lateness: JsonValue = None,
                 retention: JsonValue = None,
                 derivation: DerivationRecord | None = None) -> StreamDefinition:
        """Register a stream; InvalidStream, SourceNotPermitted (privileged source) or
        StreamConflict (exists, or the name of another owner's deleted stream).
        `derivation`: a derived stream's record, written in the same transaction.

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
        now = datetime.now(UTC).isoformat(timespec="seconds")
        with self._lock:  # this store's writes, and memory changed in their order
            with self._db.transaction() as db:
                if db.execute("SELECT 1 FROM streams WHERE name = ?", (name,)).fetchone() \
                        or name.lower() in self._deleting:
                    raise StreamConflict(f"stream {name!r} already exists")
                former = db.execute("SELECT owner FROM deleted_streams WHERE name = ?",
                                    (name,)).fetchone()
                if former is not None and former[0] != owner and not trusted:
                    raise StreamConflict(f"stream name {name!r} belonged to a deleted stream and"
                                         " is reserved to its former owner (policies, the audit"
                                         " trail and ended handles name streams by name)")
                db.execute("DELETE FROM deleted_streams WHERE name = ?", (name,))
                # (ON CONFLICT: another process on the same store registering the name at
                # the same time waits for this one, or this one for it, and the second learns)
                if db.execute(
                        "INSERT INTO streams (name, owner, schema_json, source_json,"
                        " time_attribute, created_at, next_seq, visibility, description,"
                        " lateness, retention) VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?)"
                        " ON CONFLICT DO NOTHING",
                        (name, owner, schema_json(parsed.fields),
                         json.dumps([spec.kind, [list(o) for o in spec.options]]),
                         time_attribute, now, visibility, description, lateness,
                         retention)).rowcount == 0:
                    raise StreamConflict(f"stream {name!r} already exists")
                if derivation is not None:
                    self.derivations.insert(db, derivation)
                if spec.kind == "ingest":
                    self.ingest_dir(name).mkdir(parents=True, exist_ok=True)
            # what lookups answer from memory, once the row is committed (not before: a commit
            # that fails, a store lost meanwhile, leaves nothing of the stream anywhere)
            self._visibility[name.lower()] = visibility
            if derivation is not None:
                self.derivations.remember(derivation)
        self._forget()
        for callback in list(self._listeners):
            try:
                callback(definition)
            except Exception:  # a listener must not undo a registration
                log.exception("stream listener failed for %s", name)
        return definition

    # -- an owner's changes ---------------------------------------------------------------------

    def update(self, name: str, changes: StreamPatch, by: str) -> StreamEntry:
        """Apply an owner's validated changes (`definition.parse_stream_patch`) to the stream, all
        in one transaction, and tell the change listeners; StreamNotFound if it is not there,
        InvalidStream (SchemaChange) for a schema change that is not an addition. Only the
        fields of `definition.PATCHABLE` exist."""
        unknown = set(changes) - set(PATCH_COLUMNS) - {"add_attributes", "schema"}
        if unknown:
            raise InvalidStream(f"cannot change {', '.join(sorted(unknown))}")
        if {"add_attributes", "schema"} & set(changes) and self.derivations.get(name):
            raise StreamConflict(f"stream {name!r} is derived: its schema is its deriving "
                                 "handle's output and cannot change")
        with self._lock:  # this store's writes, and memory changed in their order
            with self._db.transaction() as db:
                current = self.entry(name)
                if current is None:
                    raise StreamNotFound(f"no stream named {name!r}")
                registered = current.definition.name
                if changes.get("lateness") is not None \
                        and current.definition.time_attribute is None:
                    raise InvalidStream("lateness applies to time windows, and the stream has no "
                                        "time_attribute")
                schema = extend_schema(current.definition, changes)
                for field_name, value in changes.items():
                    if field_name in PATCH_COLUMNS:
                        db.execute(f"UPDATE streams SET {PATCH_COLUMNS[field_name]} = ?"
                                   " WHERE name = ?", (value, registered))
                if schema is not None:
                    known = len(current.definition.schema.fields)
                    added = [f.name for f in schema.fields[known:]]
                    db.execute("UPDATE streams SET schema_json = ?, optional_json = ?"
                               " WHERE name = ?",
                               (schema_json(schema.fields),
                                json.dumps(list(current.optional) + added), registered))
            # what decisions read from memory changes once the change is committed, not before
            # (a commit that fails leaves the stream's visibility and combining mode as they were)
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
        told = {k: v for k, v in changes.items() if k in PATCH_COLUMNS}
        if schema is not None:
            told["add_attributes"] = [
                {"name": f.name, "type": f.type}
                for f in schema.fields[len(current.definition.schema.fields):]
            ]
        for callback in list(self._change_listeners):
            try:
                callback(entry, told, by)
            except Exception:  # a listener must not undo a committed change
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
            now = datetime.now(UTC).isoformat(timespec="seconds")
            with self._db.transaction() as db:
                row = db.execute("SELECT name, owner FROM streams WHERE name = ?",
                                 (name,)).fetchone()
                if row is None:
                    raise StreamNotFound(f"no stream named {name!r}")
                registered, owner = row
                db.execute("DELETE FROM streams WHERE name = ?", (registered,))
                self.derivations.remove(db, registered)
                db.execute(upsert_sql("deleted_streams",
                                      ("name", "owner", "deleted_at", "deleted_by"), ("name",)),
                           (registered, owner, now, by))
            with self._lock:
                self._visibility.pop(registered.lower(), None)
                self._combining.pop(registered.lower(), None)
                self._deleting.discard(registered.lower())
                self.derivations.forget(registered)
            self.ingest.drop_feeds(registered)
            self._forget()
            for callback in list(self._delete_listeners):
                try:
                    callback(registered)
                except Exception:  # a listener must not undo a deletion
                    log.exception("stream delete listener failed for %s", registered)
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

    def entry(self, name: str) -> StreamEntry | None:
        if not isinstance(name, str) or name.lower() in self._deleting:
            return None
        row = self._db.fetchone(f"SELECT {ENTRY_COLUMNS} FROM streams WHERE name = ?", (name,))
        return entry_from_row(row) if row else None

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
        rows = self._db.fetchall(f"SELECT {ENTRY_COLUMNS} FROM streams")
        deleting = self._deleting
        # by name, case-insensitively (SQLite's NOCASE order; the same on PostgreSQL)
        return [entry_from_row(r) for r in sorted(rows, key=lambda r: str(r[0]).lower())
                if str(r[0]).lower() not in deleting]

    def list_visible(self, identity: Identity,
                     may_see: Callable[[Identity, StreamEntry], bool] | None = None
                     ) -> list[StreamJson]:
        """The streams this caller may see (`may_see(identity, entry)`, every one without it),
        described for it (`definition.describe` says what each caller is shown)."""
        return [describe(e.definition, e.created_at,
                         show_source=identity.admin or e.definition.owner == identity.subject,
                         visibility=e.visibility, settings=e.settings(), optional=e.optional,
                         combining=e.combining)
                for e in self.all() if may_see is None or may_see(identity, e)]

    # -- ingest -----------------------------------------------------------------------------------

    # -- ingest (pep/streams/ingest.py) ---------------------------------------------------------

    @property
    def kafka_timeout(self) -> float | None:
        """Seconds a Kafka append waits for the broker (None: the producer's default)."""
        return self.ingest.kafka_timeout

    @kafka_timeout.setter
    def kafka_timeout(self, seconds: float | None) -> None:
        self.ingest.kafka_timeout = seconds

    def _ingest_lock(self, name: str) -> threading.Lock:
        return self.ingest.lock(name)

    def open_feed(self, name: str, directory: Path) -> None:
        """From now on, every batch appended to stream `name` also appears in `directory`."""
        self.ingest.open_feed(name, directory)

    def close_feed(self, name: str, directory: Path) -> None:
        """Stop copying batches into `directory` (idempotent); its files are left as they are."""
        self.ingest.close_feed(name, directory)

    def append_records(self, name: str, body: bytes) -> int:
        """Validate and append a batch of JSON lines (`RecordIngest.append_records`); returns
        how many records were written. A derived stream is fed by its deriving handle only
        (`pep.streams.derived`, through `ingest`): NotPermitted."""
        derivation = self.derivations.get(name)
        if derivation is not None:
            raise NotPermitted(f"stream {derivation.stream!r} is derived from stream "
                               f"{derivation.source!r}: only its deriving handle's rows feed "
                               "it, never appended records")
        return self.ingest.append_records(name, body)


def seed_streams(catalog: StreamCatalog, path: Path) -> list[str]:
    """Register the example streams of `path` (policies/streams.json) into an empty catalogue.

    Like the policy seeding, it happens once: a catalogue that has ever held a stream is left
    alone, so an owner's deletions and changes survive restarts. Returns the names registered."""
    if not path.is_file() or catalog.ever_held():
        return []
    names = []
    for entry in json.loads(path.read_text(encoding="utf-8")):
        try:
            catalog.register(entry["name"], entry["owner"], entry.get("schema"),
                             entry.get("source"), entry.get("time_attribute"), trusted=True,
                             visibility=entry.get("visibility", LISTED),
                             description=entry.get("description"))
        except StreamConflict:
            continue  # another process on the same store seeded it meanwhile
        if entry.get("combining") is not None:  # the owner's choice, as a PATCH would set it
            catalog.update(entry["name"], {"combining": parse_combining(entry["combining"])},
                           by=entry["owner"])
        names.append(entry["name"])
    log.info("seeded the stream catalogue with %s from %s", ", ".join(names), path)
    return names


__all__ = ["StreamCatalog", "StreamEntry", "DeletedStream", "seed_streams",
           "DEFAULT_MAX_BODY_BYTES"]
