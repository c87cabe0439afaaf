"""What a stream is: its name, schema, source and event-time attribute, checked as an owner
writes them, and how a stream is shown to a caller.

What a caller sees (`describe`): a stream's name, owner, schema, event-time attribute, source
kind and visibility, for every stream the caller may see (all `listed` streams; a `restricted`
one only when `pep.streams.visibility` says so), because a consumer must know what it can ask
for. Only the stream's owner and administrators see the source's options (directory paths,
hosts, rates), which describe the server and not the data.

What an owner may change afterwards (`PATCH /streams/<name>`, `parse_stream_patch`): the fields
of `PATCHABLE`, each with its own parser; anything else is refused by name.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from pdp.numbers import NumberError, parse_float, parse_int
from pep.core.errors import Conflict, InvalidInput, NotFound, NotPermitted, Refusal
from pep.core.labels import LabelError, Lattice
from pep.core.plan import Field, SourceSpec, StreamDefinition, StreamSchema
from pep.core.schemas import BUILTIN_SCHEMAS

SEQ_FIELD = "_xsg_seq"
RESERVED_PREFIX = "_xsg"
FIELD_TYPES = ("double", "long", "string", "boolean", "timestamp", "label")
SOURCE_KINDS = ("ingest", "files", "generator", "socket", "kafka")
# Sources that reach into the server's file system or network: administrators only.
PRIVILEGED_SOURCE_KINDS = ("files", "socket", "kafka")
FILE_FORMATS = ("json", "csv", "parquet")

LISTED = "listed"          # every authenticated caller sees the stream (the default)
RESTRICTED = "restricted"  # only its owner, administrators and callers the PDP may permit
VISIBILITIES = (LISTED, RESTRICTED)

STREAM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
FIELD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
MAX_FIELDS = 256
MAX_REGISTRATION_BYTES = 1024 * 1024
MAX_REGISTRATION_DEPTH = 16  # a registration nests 3 levels: {"schema": [{...}]}
_REGISTRATION = "a JSON object {name, schema, source, time_attribute}"


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


# -- the registration document -----------------------------------------------------------------

def _reject_constant(name: str) -> Any:
    raise InvalidStream(f"expected {_REGISTRATION}: {name} is not a JSON number")


def _json_depth_ok(text: str, limit: int) -> None:
    """Bracket nesting outside strings, counted before the (recursive) JSON parser runs."""
    if text.count("[") + text.count("{") <= limit:
        return
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                raise InvalidStream(f"expected {_REGISTRATION}: the document nests deeper than "
                                    f"{limit} levels")
        elif ch in "]}":
            depth -= 1


def parse_registration(body: bytes) -> dict:
    """The JSON object an owner sends to register a stream; InvalidStream says what is wrong
    and where. Hardened like every parser of client input: a size and a nesting limit (Python's
    json module recurses), no NaN or Infinity, UTF-8 only."""
    if len(body) > MAX_REGISTRATION_BYTES:
        raise InvalidStream(f"stream registration is {len(body)} bytes, over the limit of "
                            f"{MAX_REGISTRATION_BYTES}")
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidStream(f"expected {_REGISTRATION}: not valid UTF-8 (byte {exc.start})") \
            from None
    _json_depth_ok(text, MAX_REGISTRATION_DEPTH)
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise InvalidStream(f"expected {_REGISTRATION}: {exc.msg} at line {exc.lineno}, "
                            f"column {exc.colno}") from None
    except ValueError as exc:  # e.g. an integer over Python's 4300-digit limit
        raise InvalidStream(f"expected {_REGISTRATION}: {str(exc)[:200]}") from None
    if not isinstance(doc, dict):
        raise InvalidStream(f"expected {_REGISTRATION}")
    return doc


def parse_visibility(value: Any) -> str:
    """`listed` or `restricted`; InvalidStream names the accepted values."""
    if isinstance(value, str) and value in VISIBILITIES:
        return value
    shown = repr(value[:40]) if isinstance(value, str) else _json_type(value)
    raise InvalidStream(f"visibility must be one of {', '.join(VISIBILITIES)}, got {shown}")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return "an array" if isinstance(value, list) else "an object"


COMBINING_MODES = ("intersection", "union")


def parse_combining(value: Any) -> str | None:
    """How the obligations of several applicable rules combine on the stream
    (`pep.core.union`): `intersection`, `union`, or null for the gateway's setting."""
    if value is None or (isinstance(value, str) and value in COMBINING_MODES):
        return value
    shown = repr(value[:40]) if isinstance(value, str) else _json_type(value)
    raise InvalidStream(f"combining must be one of {', '.join(COMBINING_MODES)} or null (the "
                        f"gateway's setting), got {shown}")


# The fields an owner may change after registration, each with the parser of its new value. A
# field added here needs its column in `StreamCatalog.update` (`catalog._PATCH_COLUMNS`).
PATCHABLE: dict[str, Any] = {"visibility": parse_visibility, "combining": parse_combining}
_PATCH = f"a JSON object with one or more of: {', '.join(PATCHABLE)}"


def parse_stream_patch(body: bytes) -> dict:
    """An owner's change to a stream (`PATCH /streams/<name>`): `{field: new value}` for fields
    of `PATCHABLE`, each value parsed by its own parser. Refuses unknown fields by name, an empty
    change, and anything that is not such an object (same hardening as `parse_registration`)."""
    if len(body) > MAX_REGISTRATION_BYTES:
        raise InvalidStream(f"stream change is {len(body)} bytes, over the limit of "
                            f"{MAX_REGISTRATION_BYTES}")
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidStream(f"expected {_PATCH}: not valid UTF-8 (byte {exc.start})") from None
    _json_depth_ok(text, MAX_REGISTRATION_DEPTH)
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise InvalidStream(f"expected {_PATCH}: {exc.msg} at line {exc.lineno}, "
                            f"column {exc.colno}") from None
    except ValueError as exc:
        raise InvalidStream(f"expected {_PATCH}: {str(exc)[:200]}") from None
    if not isinstance(doc, dict):
        raise InvalidStream(f"expected {_PATCH}")
    unknown = sorted(str(k)[:64] for k in doc if k not in PATCHABLE)
    if unknown:
        raise InvalidStream(f"unknown or unchangeable field(s): {', '.join(unknown)}; a "
                            f"stream's {', '.join(PATCHABLE)} can be changed", fields=unknown)
    if not doc:
        raise InvalidStream(f"nothing to change: expected {_PATCH}")
    return {name: PATCHABLE[name](value) for name, value in doc.items()}


# -- schema and source parsing ------------------------------------------------------------------

def parse_schema(fields: Any) -> StreamSchema:
    """Schema from JSON `[{"name", "type"}, ...]`; every error says which entry is wrong."""
    if isinstance(fields, StreamSchema):
        fields = [field_json(f) for f in fields.fields]
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
        unknown = set(item) - ({"name", "type", "levels", "categories"}
                               if item.get("type") == "label" else {"name", "type"})
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
        lattice = None
        if ftype == "label":
            try:
                lattice = Lattice.from_json(item)
            except LabelError as exc:
                raise InvalidStream(f"{at} ({name}): {exc} (a label attribute lists its "
                                    "levels, lowest first, and its categories)") from None
        out.append(Field(name, ftype, lattice))
    return StreamSchema(tuple(out))


def field_json(f: Field) -> dict:
    """A schema entry as registrations write it (a label attribute with its lattice)."""
    out: dict[str, Any] = {"name": f.name, "type": f.type}
    if f.lattice is not None:
        out.update(f.lattice.to_json())
    return out


def _option_text(kind: str, key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InvalidStream(f"source ({kind}): option {key!r} must be a string or a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidStream(f"source ({kind}): option {key!r} must be a finite number")
    text = str(value)
    if not text or len(text) > 4096 or any(ord(c) < 32 or "\ud800" <= c <= "\udfff"
                                           for c in text):
        raise InvalidStream(f"source ({kind}): option {key!r} is empty, too long or has "
                            "control characters or lone surrogates")
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
    text = {str(k): _option_text(kind, k, v) for k, v in opts.items()}
    if kind == "ingest":
        text["path"] = str(ingest_dir)
    elif kind == "files":
        if "path" not in text:
            raise InvalidStream("source (files): 'path' is required")
        if not os.path.isabs(text["path"]):
            raise InvalidStream("source (files): 'path' must be absolute")
        text.setdefault("format", "json")
        if "maxFilesPerTrigger" in text:
            try:
                parse_int(text["maxFilesPerTrigger"], "source (files): 'maxFilesPerTrigger'",
                          low=1, high=1_000_000)
            except NumberError as exc:
                raise InvalidStream(exc.message) from None
        if text["format"] not in FILE_FORMATS:
            raise InvalidStream(f"source (files): format must be one of "
                                f"{', '.join(FILE_FORMATS)}")
    elif kind == "generator":
        if text.get("schema") not in BUILTIN_SCHEMAS:
            raise InvalidStream(f"source (generator): schema must be one of "
                                f"{', '.join(BUILTIN_SCHEMAS)}")
        try:
            rate = parse_float(text.setdefault("rate", "10"), "source (generator): rate",
                               low=0, high=100_000)
        except NumberError:
            rate = 0.0
        if not rate > 0:
            raise InvalidStream("source (generator): rate must be a number of rows per second "
                                "in (0, 100000]")
    elif kind == "socket":
        if "host" not in text or "port" not in text:
            raise InvalidStream("source (socket): 'host' and 'port' are required")
        try:
            parse_int(text["port"], "source (socket): 'port'", low=1, high=65535)
        except NumberError:
            raise InvalidStream("source (socket): 'port' must be an integer in 1..65535") \
                from None
    elif kind == "kafka":
        if "bootstrap.servers" not in text or "subscribe" not in text:
            raise InvalidStream("source (kafka): 'bootstrap.servers' and 'subscribe' are "
                                "required")
    return SourceSpec(kind, tuple(sorted(text.items())))  # type: ignore[arg-type]


def describe(definition: StreamDefinition, created_at: str | None = None,
             show_source: bool = False, visibility: str | None = None,
             combining: str | None = None) -> dict:
    """JSON view of a stream for a caller (source options only for owners and admins)."""
    src: dict[str, Any] = {"kind": definition.source.kind}
    if show_source:
        src.update(dict(definition.source.options))
    out = {
        "name": definition.name,
        "owner": definition.owner,
        "schema": [field_json(f) for f in definition.schema.fields],
        "time_attribute": definition.time_attribute,
        "source": src,
    }
    if visibility is not None:
        out["visibility"] = visibility
    if combining is not None:
        out["combining"] = combining
    if created_at:
        out["created_at"] = created_at
    return out
