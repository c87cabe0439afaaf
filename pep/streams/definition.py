"""What a stream is: its name, schema, source and event-time attribute, checked as an owner
writes them, and how a stream is shown to a caller.

What a caller sees (`describe`): everyone authenticated sees every stream's name, owner, schema,
event-time attribute and source kind, because a consumer must know what it can ask for. Only the
stream's owner and administrators see the source's options (directory paths, hosts, rates),
which describe the server and not the data.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from pep.core.errors import Conflict, InvalidInput, NotFound, NotPermitted, Refusal
from pep.core.plan import Field, SourceSpec, StreamDefinition, StreamSchema
from pep.core.schemas import BUILTIN_SCHEMAS

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


class StreamError(Refusal):
    """A catalogue operation was refused (the subclasses say which kind of refusal)."""


class InvalidStream(StreamError, InvalidInput):
    """A stream definition that is malformed or impossible."""


class StreamNotFound(StreamError, NotFound):
    """No stream has that name."""


class StreamConflict(StreamError, Conflict):
    """The stream exists already, or cannot take the operation (e.g. ingest into a generator)."""


class SourceNotPermitted(StreamError, NotPermitted):
    """The caller may not register a source of that kind."""


# -- schema and source parsing ------------------------------------------------------------------

def parse_schema(fields: Any) -> StreamSchema:
    """Schema from JSON `[{"name", "type"}, ...]`; every error says which entry is wrong."""
    if isinstance(fields, StreamSchema):
        fields = [{"name": f.name, "type": f.type} for f in fields.fields]
    if not isinstance(fields, list) or not fields:
        raise InvalidStream("schema must be a non-empty list of {name, type} objects")
    if len(fields) > MAX_FIELDS:
        raise InvalidStream(f"schema has {len(fields)} fields; at most {MAX_FIELDS} allowed")
    seen: set[str] = set()
    out = []
    for i, item in enumerate(fields):
        at = f"schema entry {i}"
        if not isinstance(item, dict):
            raise InvalidStream(f"{at}: expected an object with name and type")
        unknown = set(item) - {"name", "type"}
        if unknown:
            raise InvalidStream(f"{at}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        name, ftype = item.get("name"), item.get("type")
        if not isinstance(name, str) or not FIELD_NAME.fullmatch(name):
            raise InvalidStream(f"{at}: name must match {FIELD_NAME.pattern}, got {name!r}")
        if name.lower().startswith(RESERVED_PREFIX):
            raise InvalidStream(f"{at}: names starting with {RESERVED_PREFIX!r} are reserved")
        if name.lower() in seen:
            raise InvalidStream(f"{at}: duplicate field {name!r} (names are case-insensitive)")
        if ftype not in FIELD_TYPES:
            raise InvalidStream(f"{at} ({name}): type must be one of {', '.join(FIELD_TYPES)}, "
                                f"got {ftype!r}")
        seen.add(name.lower())
        out.append(Field(name, ftype))
    return StreamSchema(tuple(out))


def _option_text(kind: str, key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InvalidStream(f"source ({kind}): option {key!r} must be a string or a number")
    text = str(value)
    if not text or len(text) > 4096 or any(ord(c) < 32 for c in text):
        raise InvalidStream(f"source ({kind}): option {key!r} is empty, too long or has "
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
        raise InvalidStream("source must be an object with a 'kind'")
    kind = source.get("kind")
    if kind not in SOURCE_KINDS:
        raise InvalidStream(f"source kind must be one of {', '.join(SOURCE_KINDS)}, "
                            f"got {kind!r}")
    if kind in PRIVILEGED_SOURCE_KINDS and not trusted:
        raise SourceNotPermitted(f"only administrators may register a {kind!r} source "
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
        raise InvalidStream(f"source ({kind}): unknown option(s) "
                            f"{', '.join(sorted(map(str, unknown)))}; allowed: "
                            f"{', '.join(sorted(allowed)) or 'none'}")
    text = {k: _option_text(kind, k, v) for k, v in opts.items()}
    if kind == "ingest":
        text["path"] = str(ingest_dir)
    elif kind == "files":
        if "path" not in text:
            raise InvalidStream("source (files): 'path' is required")
        if not os.path.isabs(text["path"]):
            raise InvalidStream("source (files): 'path' must be absolute")
        text.setdefault("format", "json")
        if text["format"] not in FILE_FORMATS:
            raise InvalidStream(f"source (files): format must be one of "
                                f"{', '.join(FILE_FORMATS)}")
    elif kind == "generator":
        if text.get("schema") not in BUILTIN_SCHEMAS:
            raise InvalidStream(f"source (generator): schema must be one of "
                                f"{', '.join(BUILTIN_SCHEMAS)}")
        try:
            rate = float(text.setdefault("rate", "10"))
        except ValueError:
            rate = math.nan
        if not (0 < rate <= 100_000):
            raise InvalidStream("source (generator): rate must be a number of rows per second "
                                "in (0, 100000]")
    elif kind == "socket":
        if "host" not in text or "port" not in text:
            raise InvalidStream("source (socket): 'host' and 'port' are required")
        if not text["port"].isdigit() or not 0 < int(text["port"]) < 65536:
            raise InvalidStream("source (socket): 'port' must be an integer in 1..65535")
    elif kind == "kafka":
        if "bootstrap.servers" not in text or "subscribe" not in text:
            raise InvalidStream("source (kafka): 'bootstrap.servers' and 'subscribe' are "
                                "required")
    return SourceSpec(kind, tuple(sorted(text.items())))  # type: ignore[arg-type]


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
