"""What a stream is: its name, schema, source and event-time attribute, checked as an owner
writes them, and how a stream is shown to a caller.

What a caller sees (`describe`): a stream's name, owner, schema, event-time attribute, source
kind and visibility, for every stream the caller may see (all `listed` streams; a `restricted`
one only when `pep.streams.visibility` says so), because a consumer must know what it can ask
for. Only the stream's owner and administrators see the source's options (directory paths,
hosts, rates), which describe the server and not the data.

What an owner may change afterwards (`PATCH /streams/<name>`, `parse_stream_patch`): the fields
of `PATCHABLE`, each with its own parser; anything else is refused by name. The settings
(`description`, `lateness`, `retention`) may be given at registration too. A schema may only
grow (`extend_schema`): attributes are added after the existing ones, which keep their names,
types and order, so that every stored plan, compiled plan and record stays valid.
"""
from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn, NotRequired, TypedDict

from common.numbers import NumberError, parse_float, parse_int
from common.xmlsafe import json_too_deep
from pep.core.errors import Conflict, InvalidInput, NotFound, NotPermitted, Refusal
from pep.core.jsontypes import JsonObject, JsonValue
from pep.core.labels import LabelError, Lattice
from pep.core.plan import Field, SourceSpec, StreamDefinition, StreamSchema
from pep.core.schemas import BUILTIN_SCHEMAS

SEQ_FIELD = "_xsg_seq"
RESERVED_PREFIX = "_xsg"
FIELD_TYPES = ("double", "long", "string", "boolean", "timestamp", "label")
SOURCE_KINDS = ("ingest", "files", "generator", "socket", "kafka")
# Sources that reach into the server's file system or network: administrators only.
PRIVILEGED_SOURCE_KINDS = ("files", "socket", "kafka")
# sources whose owner may enable security punctuations (`pep.core.punctuations`)
PUNCTUATED_SOURCE_KINDS = ("ingest", "files", "kafka")
FILE_FORMATS = ("json", "csv", "parquet")
KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
# `kafka.<setting>` options of a Kafka source go to Spark's consumer (Java client names, e.g.
# kafka.security.protocol), `producer.<setting>` to the gateway's producer (librdkafka names, e.g.
# producer.sasl.username); these the runtime sets itself: where to start reading, which group,
# how to (de)serialise, how to acknowledge
KAFKA_CLIENT_OPTION = re.compile(r"(kafka|producer)\.[a-z][a-z0-9.]{0,99}")
KAFKA_RUNTIME_OWNED = frozenset({"kafka.bootstrap.servers", "kafka.group.id",
                                 "kafka.auto.offset.reset", "kafka.enable.auto.commit",
                                 "kafka.key.deserializer", "kafka.value.deserializer",
                                 "kafka.key.serializer", "kafka.value.serializer",
                                 "producer.bootstrap.servers", "producer.acks",
                                 "producer.enable.idempotence", "producer.message.timeout.ms",
                                 "producer.logger"})

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

def _json_object(body: bytes, what: str, expected: str) -> JsonObject:
    """The JSON object of a body an owner sends (`what` names it in a refusal), hardened like
    every parser of client input: a size and a nesting limit (Python's json module recurses), no
    NaN or Infinity, UTF-8 only. InvalidStream says `expected` and what is wrong, and where."""
    if len(body) > MAX_REGISTRATION_BYTES:
        raise InvalidStream(f"{what} is {len(body)} bytes, over the limit of "
                            f"{MAX_REGISTRATION_BYTES}")
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidStream(f"expected {expected}: not valid UTF-8 (byte {exc.start})") from None
    if json_too_deep(text, MAX_REGISTRATION_DEPTH) is not None:
        raise InvalidStream(f"expected {expected}: the document nests deeper than "
                            f"{MAX_REGISTRATION_DEPTH} levels")

    def reject_constant(name: str) -> NoReturn:
        raise InvalidStream(f"expected {expected}: {name} is not a JSON number")

    try:
        doc = json.loads(text, parse_constant=reject_constant)
    except json.JSONDecodeError as exc:
        raise InvalidStream(f"expected {expected}: {exc.msg} at line {exc.lineno}, "
                            f"column {exc.colno}") from None
    except ValueError as exc:  # e.g. an integer over Python's 4300-digit limit
        raise InvalidStream(f"expected {expected}: {str(exc)[:200]}") from None
    if not isinstance(doc, dict):
        raise InvalidStream(f"expected {expected}")
    return doc


def parse_registration(body: bytes) -> JsonObject:
    """The JSON object an owner sends to register a stream; InvalidStream says what is wrong
    and where (`_json_object`)."""
    return _json_object(body, "stream registration", _REGISTRATION)


def parse_visibility(value: JsonValue) -> str:
    """`listed` or `restricted`; InvalidStream names the accepted values."""
    if isinstance(value, str) and value in VISIBILITIES:
        return value
    shown = repr(value[:40]) if isinstance(value, str) else _json_type(value)
    raise InvalidStream(f"visibility must be one of {', '.join(VISIBILITIES)}, got {shown}")


def _json_type(value: JsonValue) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


COMBINING_MODES = ("intersection", "union")


def parse_combining(value: JsonValue) -> str | None:
    """How the obligations of several applicable rules combine on the stream
    (`pep.core.union`): `intersection`, `union`, or null for the gateway's setting."""
    if value is None or (isinstance(value, str) and value in COMBINING_MODES):
        return value
    shown = repr(value[:40]) if isinstance(value, str) else _json_type(value)
    raise InvalidStream(f"combining must be one of {', '.join(COMBINING_MODES)} or null (the "
                        f"gateway's setting), got {shown}")


MAX_DESCRIPTION = 2000
MAX_LATENESS = 7 * 86400.0     # a week
MAX_RETENTION = 366 * 86400.0  # a year
MAX_KEEP_DATA = 366 * 86400.0


def parse_description(value: JsonValue) -> str:
    """Free text about the stream, shown to everyone who sees it; `null` or "" clears it."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidStream(f"description must be a string, got {_json_type(value)}")
    if len(value) > MAX_DESCRIPTION:
        raise InvalidStream(f"description is {len(value)} characters; at most "
                            f"{MAX_DESCRIPTION} allowed")
    if any((ord(c) < 32 and c not in "\n\t") or "\ud800" <= c <= "\udfff" for c in value):
        raise InvalidStream("description has control characters or lone surrogates")
    return value.strip()


def _seconds(name: str, value: JsonValue, high: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not 0 <= value <= high:
        shown = repr(value)[:40] if isinstance(value, (int, float)) \
            and not isinstance(value, bool) else _json_type(value)
        raise InvalidStream(f"{name} must be a number of seconds in [0, {high:.0f}] or null "
                            f"(the gateway's default), got {shown}")
    return float(value)


def parse_lateness(value: JsonValue) -> float | None:
    """Seconds this stream's time windows wait for late tuples; null: the gateway's default."""
    return _seconds("lateness", value, MAX_LATENESS)


def parse_retention(value: JsonValue) -> float | None:
    """Seconds the stream's committed ingest files stay in the archive; null: the default."""
    return _seconds("retention", value, MAX_RETENTION)


def parse_keep_data(value: str | None) -> float:
    """`DELETE /streams/<name>?keep_data=<seconds>`: how long a deleted stream's files are kept
    (0, the default: removed at once)."""
    if value is None or value == "":
        return 0.0
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_KEEP_DATA:
        raise InvalidStream(f"keep_data must be a number of seconds in [0, {MAX_KEEP_DATA:.0f}], "
                            f"got {str(value)[:40]!r}")
    return seconds


def parse_added_attributes(value: JsonValue) -> tuple[Field, ...]:
    """`add_attributes`: `[{"name", "type"}, ...]`, checked as schema entries are."""
    if not isinstance(value, list) or not value:
        raise InvalidStream("add_attributes must be a non-empty list of {name, type} objects")
    return parse_schema(value).fields


def parse_whole_schema(value: JsonValue) -> tuple[Field, ...]:
    """`schema`: the whole new schema (`extend_schema` says which changes are possible)."""
    return parse_schema(value).fields


class StreamPatch(TypedDict, total=False):
    """An owner's change (`parse_stream_patch`): the fields it gives, each as its parser made
    it. A setting added here needs its column in `StreamCatalog.update`
    (`entries.PATCH_COLUMNS`); the two schema fields are turned into a new schema by
    `extend_schema`."""

    visibility: str
    description: str
    lateness: float | None
    retention: float | None
    add_attributes: tuple[Field, ...]
    schema: tuple[Field, ...]
    combining: str | None


def _patch_field(patch: StreamPatch, name: str, value: JsonValue) -> None:
    """One field of an owner's change, parsed by its own parser into `patch`."""
    if name == "visibility":
        patch["visibility"] = parse_visibility(value)
    elif name == "description":
        patch["description"] = parse_description(value)
    elif name == "lateness":
        patch["lateness"] = parse_lateness(value)
    elif name == "retention":
        patch["retention"] = parse_retention(value)
    elif name == "add_attributes":
        patch["add_attributes"] = parse_added_attributes(value)
    elif name == "schema":
        patch["schema"] = parse_whole_schema(value)
    elif name == "combining":
        patch["combining"] = parse_combining(value)
    else:  # parse_stream_patch refused it by name before
        raise InvalidStream(f"unknown or unchangeable field {name[:64]!r}")


# The fields an owner may change after registration (`StreamPatch`), each with its own parser.
PATCHABLE = ("visibility", "description", "lateness", "retention", "add_attributes", "schema",
             "combining")
SETTINGS = ("description", "lateness", "retention")  # also accepted at registration
_PATCH = f"a JSON object with one or more of: {', '.join(PATCHABLE)}"


def parse_stream_patch(body: bytes) -> StreamPatch:
    """An owner's change to a stream (`PATCH /streams/<name>`): `{field: new value}` for fields
    of `PATCHABLE`, each value parsed by its own parser. Refuses unknown fields by name, an empty
    change, and anything that is not such an object (same hardening as `parse_registration`)."""
    doc = _json_object(body, "stream change", _PATCH)
    unknown = sorted(str(k)[:64] for k in doc if k not in PATCHABLE)
    if unknown:
        raise InvalidStream(f"unknown or unchangeable field(s): {', '.join(unknown)}; a "
                            f"stream's {', '.join(PATCHABLE)} can be changed", fields=unknown)
    if not doc:
        raise InvalidStream(f"nothing to change: expected {_PATCH}")
    if "add_attributes" in doc and "schema" in doc:
        raise InvalidStream("give either add_attributes or the whole schema, not both")
    patch: StreamPatch = {}
    for name, value in doc.items():  # in the document's order: its first bad field is named
        _patch_field(patch, name, value)
    return patch


class SchemaChange(InvalidStream):
    """A schema change that is not an addition; `attributes` names the attributes it would
    remove or retype (the caller may name the policies that use them)."""

    def __init__(self, message: str, attributes: tuple[str, ...] = ()) -> None:
        super().__init__(message, attributes=list(attributes))
        self.attributes = attributes


def extend_schema(definition: StreamDefinition, changes: StreamPatch) -> StreamSchema | None:
    """The stream's new schema for a change holding `add_attributes` or `schema` (None when it
    holds neither, or the schema is the same). Only additions are possible: the existing
    attributes keep their names, types and order, and new ones come after them.

    Why additions only: plans (stored with live handles, compiled in the running query) read
    attributes by name and position, records already written carry the old attributes, and
    policies name them. Removing or retyping one could not be made safe for all of those at
    once, so it is refused (SchemaChange, naming the attributes)."""
    old = definition.schema.fields
    if "add_attributes" in changes:
        have = {f.name.lower() for f in old}
        for f in changes["add_attributes"]:
            if f.name.lower() in have:
                raise InvalidStream(f"add_attributes: duplicate field {f.name!r}: the stream has "
                                    "it already (names are case-insensitive)")
        new = old + tuple(changes["add_attributes"])
    elif "schema" in changes:
        new = tuple(changes["schema"])
    else:
        return None
    by_lower = {f.name.lower(): f for f in new}
    gone = tuple(f.name for f in old if f.name.lower() not in by_lower)
    retyped = tuple(f.name for f in old if f.name.lower() in by_lower
                    and (by_lower[f.name.lower()].type != f.type
                         or by_lower[f.name.lower()].name != f.name))
    if gone or retyped:
        parts = ([f"removes {', '.join(gone)}"] if gone else []) + \
                ([f"renames or retypes {', '.join(retyped)}"] if retyped else [])
        raise SchemaChange(f"the new schema {' and '.join(parts)}: a stream's attributes can "
                           "only be added to (stored plans, running queries, records already "
                           "written and policies refer to the existing ones)", gone + retyped)
    if tuple(f.name for f in new[:len(old)]) != tuple(f.name for f in old):
        raise SchemaChange("the existing attributes must keep their order; new attributes go "
                           "after them")
    if len(new) == len(old):
        return None
    if definition.source.kind != "ingest":
        raise InvalidStream(f"stream {definition.name!r} reads a {definition.source.kind} "
                            "source, whose schema the source fixes; attributes can be added to "
                            "'ingest' streams only")
    if len(new) > MAX_FIELDS:
        raise InvalidStream(f"the schema would have {len(new)} fields; at most {MAX_FIELDS} "
                            "allowed")
    for f in new[len(old):]:
        if f.type not in FIELD_TYPES:  # parse_schema checked it; a caller may build Fields
            raise InvalidStream(f"attribute {f.name!r}: type must be one of "
                                f"{', '.join(FIELD_TYPES)}")
    return StreamSchema(new)


# -- schema and source parsing ------------------------------------------------------------------

def parse_schema(fields: JsonValue | StreamSchema) -> StreamSchema:
    """Schema from JSON `[{"name", "type"}, ...]`; every error says which entry is wrong."""
    if isinstance(fields, StreamSchema):
        fields = [field_json(f) for f in fields.fields]
    if not isinstance(fields, list) or not fields:
        raise InvalidStream("schema must be a non-empty list of {name, type} objects")
    if len(fields) > MAX_FIELDS:
        raise InvalidStream(f"schema has {len(fields)} fields; at most {MAX_FIELDS} allowed")
    seen: set[str] = set()
    out: list[Field] = []
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


class FieldJson(TypedDict):
    """A schema entry as registrations write it and `describe` shows it: a label attribute
    with its lattice, an attribute added after registration marked `optional`."""

    name: str
    type: str
    levels: NotRequired[list[str]]
    categories: NotRequired[list[str]]
    optional: NotRequired[bool]


def field_json(f: Field) -> FieldJson:
    """A schema entry as registrations write it (a label attribute with its lattice)."""
    out: FieldJson = {"name": f.name, "type": f.type}
    if f.lattice is not None:
        lattice = f.lattice.to_json()
        out["levels"], out["categories"] = lattice["levels"], lattice["categories"]
    return out


def _option_text(kind: str, key: str, value: JsonValue) -> str:
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


def parse_source(source: JsonValue | SourceSpec, ingest_dir: Path, trusted: bool) -> SourceSpec:
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
    if "punctuations" in source and kind not in PUNCTUATED_SOURCE_KINDS:
        raise InvalidStream(f"source ({kind}): security punctuations are supported on ingest, "
                            "files (JSON lines) and kafka streams only (docs/punctuations.md)")
    allowed = {
        "ingest": {"punctuations"},
        "files": {"path", "format", "maxFilesPerTrigger", "punctuations"},
        "generator": {"schema", "rate"},
        "socket": {"host", "port"},
        "kafka": {"bootstrap.servers", "subscribe", "maxOffsetsPerTrigger", "punctuations"},
    }[kind]
    opts = {k: v for k, v in source.items() if k != "kind"}
    unknown = set(opts) - allowed
    if kind == "kafka":  # client settings (security, SASL) for Spark's consumer and producer
        unknown = {k for k in unknown if not (isinstance(k, str)
                                              and KAFKA_CLIENT_OPTION.fullmatch(k)
                                              and k not in KAFKA_RUNTIME_OWNED)}
        allowed = allowed | {"kafka.<consumer setting>", "producer.<producer setting>"}
    if unknown:
        raise InvalidStream(f"source ({kind}): unknown option(s) "
                            f"{', '.join(sorted(map(str, unknown)))}; allowed: "
                            f"{', '.join(sorted(allowed)) or 'none'}")
    text = {str(k): _option_text(kind, k, v) for k, v in opts.items()}
    if text.get("punctuations", "off") not in ("on", "off"):
        raise InvalidStream(f"source ({kind}): punctuations must be \"on\" or \"off\" "
                            "(security punctuations in the stream, docs/punctuations.md)")
    if text.get("kafka.isolation.level", "read_committed") not in ("read_committed",
                                                                   "read_uncommitted"):
        raise InvalidStream(f"source ({kind}): kafka.isolation.level must be \"read_committed\" "
                            "(the default) or \"read_uncommitted\"")
    if kind == "files" and text.get("punctuations") == "on" \
            and text.get("format", "json") != "json":
        raise InvalidStream("source (files): punctuations need format json (JSON lines: a "
                            "punctuation is a line {\"$punctuation\": ...}, docs/punctuations.md)")
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
        limit = text.get("maxOffsetsPerTrigger")
        if limit is not None and not (limit.isdigit() and 0 < int(limit) <= 10_000_000):
            raise InvalidStream("source (kafka): maxOffsetsPerTrigger must be an integer in "
                                "1..10000000")
        if not KAFKA_TOPIC.fullmatch(text["subscribe"]):
            raise InvalidStream("source (kafka): 'subscribe' must name one topic (letters, "
                                f"digits, '.', '_', '-'; at most 249), got {text['subscribe']!r}")
    return SourceSpec(kind, tuple(sorted(text.items())))


class StreamSettings(TypedDict):
    """An owner's settings of a stream as `describe` shows them (None: the gateway's
    default)."""

    description: str
    lateness: float | None
    retention: float | None


class DerivedFrom(TypedDict):
    """A derived stream's source and what it holds of it (`pep.core.derived.Derivation`)."""

    stream: str
    holds: dict[str, object]


class StreamJson(TypedDict):
    """A stream as a caller is shown it (`describe`); `source` holds its `kind`, and its
    options for the owner and administrators only. `derived_from` is a derived stream's, as
    its registration answers it (`pep.streams.derived`)."""

    name: str
    owner: str
    schema: list[FieldJson]
    time_attribute: str | None
    source: dict[str, str]
    visibility: NotRequired[str]
    description: NotRequired[str]
    lateness: NotRequired[float | None]
    retention: NotRequired[float | None]
    combining: NotRequired[str]
    created_at: NotRequired[str]
    derived_from: NotRequired[DerivedFrom]


def _shown_field(f: Field, optional: set[str]) -> FieldJson:
    out = field_json(f)
    if f.name.lower() in optional:
        out["optional"] = True
    return out


def describe(definition: StreamDefinition, created_at: str | None = None,
             show_source: bool = False, visibility: str | None = None,
             settings: StreamSettings | None = None, optional: Iterable[str] = (),
             combining: str | None = None) -> StreamJson:
    """JSON view of a stream for a caller (source options only for owners and admins).
    `settings`: description, lateness, retention (None: the gateway's default); `optional`:
    attributes added after registration, which records may leave out (marked so)."""
    src: dict[str, str] = {"kind": definition.source.kind}
    if show_source:
        src.update(dict(definition.source.options))
    lowered = {n.lower() for n in optional}
    out: StreamJson = {
        "name": definition.name,
        "owner": definition.owner,
        "schema": [_shown_field(f, lowered) for f in definition.schema.fields],
        "time_attribute": definition.time_attribute,
        "source": src,
    }
    if visibility is not None:
        out["visibility"] = visibility
    if settings is not None:
        out["description"] = settings["description"]
        out["lateness"] = settings["lateness"]
        out["retention"] = settings["retention"]
    if combining is not None:
        out["combining"] = combining
    if created_at:
        out["created_at"] = created_at
    return out
