"""The stream catalogue: which streams exist, who owns them, and the owner's record ingest.

A stream is registered once (name, schema, source, event-time attribute) and persisted in SQLite,
so a restart keeps it. The owner of a stream is the authenticated subject that registered it.

Ingest (`append_records`) is the HTTP way for an owner to feed an `ingest` stream. A batch is all
or nothing: every line is validated against the schema before anything is written, the batch is
written to a hidden temporary file in the stream's ingest directory (Spark's file source skips
names starting with `.`) and renamed into place with `os.replace`, so Spark never sees half a
batch. Each record gets `_xsg_seq`, a per-stream, strictly increasing integer that the runtime
uses to order tuples for tuple windows (the file source does not keep arrival order within a
micro-batch); the counter is persisted in the same database, so it keeps increasing after a
restart.

What a caller sees (`list_visible`/`describe`): everyone authenticated sees every stream's name,
owner, schema, event-time attribute and source kind, because a consumer must know what it can
ask for. Only the stream's owner and administrators see the source's options (directory paths,
hosts, rates), which describe the server and not the data.
"""
from __future__ import annotations

import json
import math
import os
import re
import secrets
import sqlite3
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from pep.errors import RefusedError
from pep.plan import Field, SourceSpec, StreamDefinition, StreamSchema
from pep.schemas import BUILTIN_SCHEMAS, BUILTIN_TIME_ATTRIBUTES

SEQ_FIELD = "_xsg_seq"
RESERVED_PREFIX = "_xsg"
FIELD_TYPES = ("double", "long", "string", "boolean", "timestamp")
SOURCE_KINDS = ("ingest", "files", "generator", "socket", "kafka")
# Sources that reach into the server's file system or network: administrators only.
PRIVILEGED_SOURCE_KINDS = ("files", "socket", "kafka")
FILE_FORMATS = ("json", "csv", "parquet")

STREAM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
FIELD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
MAX_FIELDS = 256

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_LINES = 100_000
MAX_STRING_CHARS = 65_536
LONG_MIN, LONG_MAX = -(2 ** 63), 2 ** 63 - 1




class StreamError(RefusedError):
    """A catalogue operation was refused; `status` is the HTTP status it maps to."""


class RecordError(StreamError):
    """A batch of records was rejected; names the line (1-based) and, when known, the field."""

    def __init__(self, message: str, line: int | None = None, field: str | None = None,
                 status: int = 400) -> None:
        where = ", ".join(p for p in (f"line {line}" if line else "",
                                      f"field {field!r}" if field else "") if p)
        super().__init__(status, f"{where}: {message}" if where else message)
        self.line = line
        self.field = field
        self.detail = message

    def to_json(self) -> dict:
        return {"error": self.message, "line": self.line, "field": self.field}


# -- schema and source parsing ------------------------------------------------------------------

def parse_schema(fields: Any) -> StreamSchema:
    """Schema from JSON `[{"name", "type"}, ...]`; every error says which entry is wrong."""
    if isinstance(fields, StreamSchema):
        fields = [{"name": f.name, "type": f.type} for f in fields.fields]
    if not isinstance(fields, list) or not fields:
        raise StreamError(400, "schema must be a non-empty list of {name, type} objects")
    if len(fields) > MAX_FIELDS:
        raise StreamError(400, f"schema has {len(fields)} fields; at most {MAX_FIELDS} allowed")
    seen: set[str] = set()
    out = []
    for i, item in enumerate(fields):
        at = f"schema entry {i}"
        if not isinstance(item, dict):
            raise StreamError(400, f"{at}: expected an object with name and type")
        unknown = set(item) - {"name", "type"}
        if unknown:
            raise StreamError(400, f"{at}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        name, ftype = item.get("name"), item.get("type")
        if not isinstance(name, str) or not FIELD_NAME.fullmatch(name):
            raise StreamError(400, f"{at}: name must match {FIELD_NAME.pattern}, got {name!r}")
        if name.lower().startswith(RESERVED_PREFIX):
            raise StreamError(400, f"{at}: names starting with {RESERVED_PREFIX!r} are reserved")
        if name.lower() in seen:
            raise StreamError(400, f"{at}: duplicate field {name!r} (names are case-insensitive)")
        if ftype not in FIELD_TYPES:
            raise StreamError(400, f"{at} ({name}): type must be one of {', '.join(FIELD_TYPES)}, "
                                   f"got {ftype!r}")
        seen.add(name.lower())
        out.append(Field(name, ftype))
    return StreamSchema(tuple(out))


def _option_text(kind: str, key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise StreamError(400, f"source ({kind}): option {key!r} must be a string or a number")
    text = str(value)
    if not text or len(text) > 4096 or any(ord(c) < 32 for c in text):
        raise StreamError(400, f"source ({kind}): option {key!r} is empty, too long or has "
                               "control characters")
    return text


def parse_source(source: Any, ingest_dir: Path, trusted: bool) -> SourceSpec:
    """Source from JSON `{"kind": ..., options...}`; `trusted` callers (admins) may use sources
    that read the server's files or network."""
    if isinstance(source, SourceSpec):
        source = {"kind": source.kind, **dict(source.options)}
    if source is None:
        source = {"kind": "ingest"}
    if not isinstance(source, dict):
        raise StreamError(400, "source must be an object with a 'kind'")
    kind = source.get("kind")
    if kind not in SOURCE_KINDS:
        raise StreamError(400, f"source kind must be one of {', '.join(SOURCE_KINDS)}, "
                               f"got {kind!r}")
    if kind in PRIVILEGED_SOURCE_KINDS and not trusted:
        raise StreamError(403, f"only administrators may register a {kind!r} source "
                               "(it reads the server's files or network)")
    allowed = {
        "ingest": set(),
        "files": {"path", "format", "maxFilesPerTrigger"},
        "generator": {"schema", "rate"},
        "socket": {"host", "port"},
        "kafka": {"bootstrap.servers", "subscribe", "startingOffsets"},
    }[kind]
    opts = {k: v for k, v in source.items() if k != "kind"}
    unknown = set(opts) - allowed
    if unknown:
        raise StreamError(400, f"source ({kind}): unknown option(s) "
                               f"{', '.join(sorted(map(str, unknown)))}; allowed: "
                               f"{', '.join(sorted(allowed)) or 'none'}")
    text = {k: _option_text(kind, k, v) for k, v in opts.items()}
    if kind == "ingest":
        text["path"] = str(ingest_dir)
    elif kind == "files":
        if "path" not in text:
            raise StreamError(400, "source (files): 'path' is required")
        if not os.path.isabs(text["path"]):
            raise StreamError(400, "source (files): 'path' must be absolute")
        text.setdefault("format", "json")
        if text["format"] not in FILE_FORMATS:
            raise StreamError(400, f"source (files): format must be one of "
                                   f"{', '.join(FILE_FORMATS)}")
    elif kind == "generator":
        if text.get("schema") not in BUILTIN_SCHEMAS:
            raise StreamError(400, f"source (generator): schema must be one of "
                                   f"{', '.join(BUILTIN_SCHEMAS)}")
        try:
            rate = float(text.setdefault("rate", "10"))
        except ValueError:
            rate = math.nan
        if not (0 < rate <= 100_000):
            raise StreamError(400, "source (generator): rate must be a number of rows per second "
                                   "in (0, 100000]")
    elif kind == "socket":
        if "host" not in text or "port" not in text:
            raise StreamError(400, "source (socket): 'host' and 'port' are required")
        if not text["port"].isdigit() or not 0 < int(text["port"]) < 65536:
            raise StreamError(400, "source (socket): 'port' must be an integer in 1..65535")
    elif kind == "kafka":
        if "bootstrap.servers" not in text or "subscribe" not in text:
            raise StreamError(400, "source (kafka): 'bootstrap.servers' and 'subscribe' are "
                                   "required")
    return SourceSpec(kind, tuple(sorted(text.items())))  # type: ignore[arg-type]


# -- record validation ----------------------------------------------------------------------------

class _BadJson(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _BadJson(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _BadJson(f"duplicate key {k!r}")
        out[k] = v
    return out


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


def normalise_timestamp(value: Any) -> str:
    """ISO-8601 text or epoch seconds -> ISO-8601 UTC with microseconds (`...Z`), the one form
    the runtime reads. Naive text is taken as UTC."""
    if isinstance(value, bool):
        raise ValueError("expected an ISO-8601 timestamp or epoch seconds, found boolean")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError("timestamp must be finite")
        try:
            ts = datetime.fromtimestamp(value, tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise ValueError(f"epoch seconds {value!r} out of range") from None
    elif isinstance(value, str):
        if len(value) > 64:
            raise ValueError("timestamp text is too long")
        try:
            ts = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO-8601 timestamp") from None
        ts = ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)
    else:
        raise ValueError(f"expected an ISO-8601 timestamp or epoch seconds, "
                         f"found {_type_name(value)}")
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _check_value(ftype: str, value: Any) -> Any:
    """The value as written to the ingest file, or ValueError saying what is wrong."""
    if ftype == "double":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, found {_type_name(value)}")
        try:
            out = float(value)
        except OverflowError:
            raise ValueError("number out of range for a double") from None
        if not math.isfinite(out):
            raise ValueError("number out of range for a double")
        return out
    if ftype == "long":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, found {_type_name(value)}")
        if not LONG_MIN <= value <= LONG_MAX:
            raise ValueError("integer out of range for a 64-bit long")
        return value
    if ftype == "string":
        if not isinstance(value, str):
            raise ValueError(f"expected a string, found {_type_name(value)}")
        if len(value) > MAX_STRING_CHARS:
            raise ValueError(f"string longer than {MAX_STRING_CHARS} characters")
        return value
    if ftype == "boolean":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, found {_type_name(value)}")
        return value
    return normalise_timestamp(value)


def validate_records(schema: StreamSchema, body: bytes, time_attribute: str | None = None,
                     max_lines: int = DEFAULT_MAX_LINES) -> list[dict]:
    """Parse and check JSON lines against the schema; raises RecordError at the first problem.

    Every field of the schema must be present in every record (field names match
    case-insensitively and are written with the schema's spelling). A value may be `null`
    (a sensor without a reading), except the event-time attribute, which orders the stream.
    Blank lines are skipped but counted, so line numbers match the client's file.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = body[: exc.start].count(b"\n") + 1
        raise RecordError(f"not valid UTF-8 (byte {exc.start})", line=line) from None
    lines = text.split("\n")
    if len(lines) > max_lines + 1 or (len(lines) == max_lines + 1 and lines[-1].strip()):
        raise RecordError(f"more than {max_lines} lines in one batch", status=413)
    by_lower = {f.name.lower(): f for f in schema.fields}
    time_key = time_attribute.lower() if time_attribute else None
    records = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            obj = json.loads(line, parse_constant=_reject_constant,
                             object_pairs_hook=_no_duplicates)
        except _BadJson as exc:
            raise RecordError(f"bad JSON: {exc}", line=number) from None
        except json.JSONDecodeError as exc:
            raise RecordError(f"bad JSON: {exc.msg} at column {exc.colno}", line=number) from None
        except (ValueError, RecursionError) as exc:
            raise RecordError(f"bad JSON: {str(exc)[:200]}", line=number) from None
        if not isinstance(obj, dict):
            raise RecordError(f"expected a JSON object, found {_type_name(obj)}", line=number)
        record: dict[str, Any] = {}
        for key, value in obj.items():
            f = by_lower.get(key.lower())
            if f is None:
                raise RecordError("unknown field (not in the stream's schema)", line=number,
                                  field=key[:100])
            if f.name in record:
                raise RecordError("field given twice (names are case-insensitive)", line=number,
                                  field=f.name)
            if value is None:
                if f.name.lower() == time_key:
                    raise RecordError("the event-time attribute may not be null", line=number,
                                      field=f.name)
                record[f.name] = None
                continue
            try:
                record[f.name] = _check_value(f.type, value)
            except ValueError as exc:
                raise RecordError(str(exc), line=number, field=f.name) from None
        for f in schema.fields:
            if f.name not in record:
                raise RecordError("missing required field", line=number, field=f.name)
        records.append(record)
    return records


# -- the catalogue ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class StreamEntry:
    definition: StreamDefinition
    created_at: str
    next_seq: int


def describe(definition: StreamDefinition, created_at: str | None = None,
             show_source: bool = False) -> dict:
    """JSON view of a stream for a caller (source options only for owners and admins)."""
    src: dict[str, Any] = {"kind": definition.source.kind}
    if show_source:
        src.update(dict(definition.source.options))
    out = {
        "name": definition.name,
        "owner": definition.owner,
        "schema": [{"name": f.name, "type": f.type} for f in definition.schema.fields],
        "time_attribute": definition.time_attribute,
        "source": src,
    }
    if created_at:
        out["created_at"] = created_at
    return out


class StreamCatalog:
    """Registered streams in SQLite, plus the ingest directory of each `ingest` stream."""

    def __init__(self, db_path: str | Path, data_dir: str | Path,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_lines: int = DEFAULT_MAX_LINES) -> None:
        self.db_path = Path(db_path)
        self.data_dir = Path(data_dir)
        self.max_body_bytes = max_body_bytes
        self.max_lines = max_lines
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._ingest_locks: dict[str, threading.Lock] = {}
        self._db = sqlite3.connect(str(self.db_path), check_same_thread=False,
                                   isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS streams ("
            " name TEXT PRIMARY KEY COLLATE NOCASE, owner TEXT NOT NULL,"
            " schema_json TEXT NOT NULL, source_json TEXT NOT NULL, time_attribute TEXT,"
            " created_at TEXT NOT NULL, next_seq INTEGER NOT NULL DEFAULT 1)")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def ingest_dir(self, name: str) -> Path:
        return self.data_dir / "streams" / name / "ingest"

    # -- registration ---------------------------------------------------------------------------

    def register(self, name: str, owner: str, schema: Any, source: Any = None,
                 time_attribute: str | None = None, *, trusted: bool = False) -> StreamDefinition:
        """Register a stream; StreamError 400 (invalid), 403 (privileged source), 409 (exists).

        `schema` may be omitted (None) for a generator source, which then uses its built-in one.
        """
        if not isinstance(name, str) or not STREAM_NAME.fullmatch(name):
            raise StreamError(400, f"stream name must match {STREAM_NAME.pattern}, got {name!r}")
        if not isinstance(owner, str) or not owner:
            raise StreamError(400, "a stream needs an owner")
        spec = parse_source(source, self.ingest_dir(name), trusted)
        if spec.kind == "generator":
            builtin = BUILTIN_SCHEMAS[spec.option("schema") or ""]
            if schema is None:
                schema = builtin
                time_attribute = time_attribute or BUILTIN_TIME_ATTRIBUTES[spec.option("schema")]
            parsed = parse_schema(schema)
            if parsed != builtin:
                raise StreamError(400, f"a {spec.option('schema')} generator produces its built-in "
                                       "schema; omit 'schema' or give exactly that one")
        else:
            parsed = parse_schema(schema)
        if time_attribute is not None:
            if not isinstance(time_attribute, str):
                raise StreamError(400, "time_attribute must be a field name")
            f = parsed.lookup(time_attribute)
            if f is None:
                raise StreamError(400, f"time_attribute {time_attribute!r} is not in the schema")
            if f.type not in ("timestamp", "double", "long"):
                raise StreamError(400, f"time_attribute {f.name!r} must be a timestamp or a "
                                       f"number of epoch seconds, not {f.type}")
            time_attribute = f.name
        definition = StreamDefinition(name, owner, parsed, spec, time_attribute)
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self._transaction() as db:
            if db.execute("SELECT 1 FROM streams WHERE name = ?", (name,)).fetchone():
                raise StreamError(409, f"stream {name!r} already exists")
            db.execute(
                "INSERT INTO streams (name, owner, schema_json, source_json, time_attribute,"
                " created_at, next_seq) VALUES (?, ?, ?, ?, ?, ?, 1)",
                (name, owner, json.dumps([[f.name, f.type] for f in parsed.fields]),
                 json.dumps([spec.kind, [list(o) for o in spec.options]]), time_attribute, now))
            if spec.kind == "ingest":
                self.ingest_dir(name).mkdir(parents=True, exist_ok=True)
        return definition

    # -- reads ------------------------------------------------------------------------------------

    @staticmethod
    def _entry(row: tuple) -> StreamEntry:
        name, owner, schema_json, source_json, time_attribute, created_at, next_seq = row
        schema = StreamSchema(tuple(Field(n, t) for n, t in json.loads(schema_json)))
        kind, options = json.loads(source_json)
        source = SourceSpec(kind, tuple((k, v) for k, v in options))
        return StreamEntry(StreamDefinition(name, owner, schema, source, time_attribute),
                           created_at, next_seq)

    _COLUMNS = "name, owner, schema_json, source_json, time_attribute, created_at, next_seq"

    def entry(self, name: str) -> StreamEntry | None:
        if not isinstance(name, str):
            return None
        with self._lock:
            row = self._db.execute(f"SELECT {self._COLUMNS} FROM streams WHERE name = ?",
                                   (name,)).fetchone()
        return self._entry(row) if row else None

    def get(self, name: str) -> StreamDefinition | None:
        """The stream, looked up case-insensitively, or None."""
        e = self.entry(name)
        return e.definition if e else None

    def schema(self, name: str) -> StreamSchema | None:
        """The schema of the stream spelled exactly `name` (the request processor's lookup: a
        plan must carry the registered spelling, which the runtime checks)."""
        d = self.get(name)
        return d.schema if d is not None and d.name == name else None

    def time_attribute(self, name: str) -> str | None:
        d = self.get(name)
        return d.time_attribute if d is not None and d.name == name else None

    def all(self) -> list[StreamEntry]:
        with self._lock:
            rows = self._db.execute(f"SELECT {self._COLUMNS} FROM streams ORDER BY name").fetchall()
        return [self._entry(r) for r in rows]

    def list_visible(self, identity: Any) -> list[dict]:
        """Every stream, described for this caller (see the module docstring for who sees what)."""
        return [describe(e.definition, e.created_at,
                         show_source=bool(identity.admin) or e.definition.owner == identity.subject)
                for e in self.all()]

    # -- ingest -----------------------------------------------------------------------------------

    def _ingest_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._ingest_locks.setdefault(name.lower(), threading.Lock())

    def append_records(self, name: str, body: bytes) -> int:
        """Validate and append a batch of JSON lines; returns how many records were written.

        All or nothing: a RecordError (400, or 413 for a batch over the limits) leaves no file
        and no sequence numbers used.
        """
        entry = self.entry(name)
        if entry is None:
            raise StreamError(404, f"no stream named {name!r}")
        d = entry.definition
        if d.source.kind != "ingest":
            raise StreamError(409, f"stream {d.name!r} reads from a {d.source.kind} source; "
                                   "records can only be appended to an 'ingest' stream")
        if len(body) > self.max_body_bytes:
            raise RecordError(f"batch of {len(body)} bytes is over the limit of "
                              f"{self.max_body_bytes}", status=413)
        records = validate_records(d.schema, body, d.time_attribute, self.max_lines)
        if not records:
            return 0
        directory = self.ingest_dir(d.name)
        directory.mkdir(parents=True, exist_ok=True)
        with self._ingest_lock(d.name):
            tmp = directory / f".incoming-{secrets.token_hex(8)}.json.tmp"
            with self._transaction() as db:
                (first,) = db.execute("SELECT next_seq FROM streams WHERE name = ?",
                                      (d.name,)).fetchone()
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


def stream_schema_lookup(catalog: StreamCatalog):
    """The `schema_lookup` callable the request processor wants."""
    return catalog.schema


__all__ = ["StreamCatalog", "StreamEntry", "StreamError", "RecordError", "BUILTIN_SCHEMAS",
           "BUILTIN_TIME_ATTRIBUTES", "SEQ_FIELD", "parse_schema", "parse_source",
           "validate_records", "normalise_timestamp", "describe", "stream_schema_lookup"]
