"""A sharing rule: what an owner grants on one stream, in a few lines of JSON (or YAML).

    {"id": "urn:xsg:rule:weather:lta", "stream": "weather",
     "description": "LTA sees heavy rain, averaged",
     "who": {"subjects": ["lta"], "roles": ["transport"], "attributes": {"department": "roads"}},
     "actions": ["read", "subscribe"],
     "filter": "rainrate > 5",
     "attributes": ["samplingtime", "rainrate"],
     "mask": {"rainrate": "round:5", "samplingtime": "truncate:minute"},
     "window": {"type": "tuple", "size": 5, "step": 2, "aggregates": ["rainrate:avg"],
                "min_count": 1, "group_by": [], "filterable": ["rainrate"]},
     "valid": {"from": "2026-11-23T00:00:00Z", "until": "2026-11-24T00:00:00Z"},
     "events": ["storm"], "grant_option": false}

Only `stream` and `who` are required. `who` is a list of alternatives: the rule applies to a
caller who is one of `subjects`, OR holds one of `roles`, OR carries one of the `attributes`
values (attribute id -> value or list of values, as the gateway knows the caller: the auth
file's `attributes` or the token's mapped claims); `"who": "anyone"` applies to every
authenticated caller. `actions` defaults to read and subscribe (`"any"`: every action).
`attributes` empty or absent: every attribute. The window is the eXACML+ `stream-window`
obligation (size in tuples or seconds; `min_count` absent: the PEP's default for the type).
`mask` shows attributes coarser or hashed instead of raw (`pep.core.masks`: `round:<step>`,
`lat,lon: grid:<degrees>`, `truncate:<unit>`, `bands:<edges>`, `prefix:<n>`, `suffix:<n>`,
`hash`, `null`), compiled to the `exacml:obligation:stream-mask` obligation.
`valid` bounds the grant in time (either end may be absent), `events` names stream events of
the same stream that must all be open. `grant_option` (default false): the consumers the rule
names may re-share what they get as derived streams of their own, never wider than this grant
(the `exacml:obligation:stream-grant-option` obligation, `pep.core.obligations`). A rule compiles to
one XACML 3.0 Policy (`pep.core.rules.xacml`), which is what is stored, decided and revoked.

This module reads and writes the JSON form only (dicts, no I/O): every mistake is a `RuleError`
whose `path` is a JSON pointer to the field (`/window/aggregates/1`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, TypedDict

from pep.core.errors import InvalidInput
from pep.core.jsontypes import JsonObject, JsonValue
from pep.core.masks import MaskError, parse_mask

AttributeValue = str | int | float | bool

DEFAULT_ACTIONS = ("read", "subscribe")
WINDOW_TYPES = ("tuple", "time")
MAX_ITEMS = 1000  # subjects, roles, attribute values, actions, attributes, aggregates ...
MAX_TEXT = 1000   # one name, id or value
MAX_DESCRIPTION = 4000
MAX_FILTER = 10_000
MAX_WINDOW = 100_000_000  # as pep.core.obligations.MAX_WINDOW
POLICY_ID = re.compile(r"[^\s\x00-\x1f\x7f]{1,1000}")
VERSION = re.compile(r"\d{1,9}(\.\d{1,9}){0,9}")
EVENT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")  # as pep.streams.events.EVENT_NAME
KNOWN_FIELDS = ("id", "version", "stream", "description", "who", "actions", "filter",
                "attributes", "mask", "window", "valid", "events", "grant_option")
WINDOW_FIELDS = ("type", "size", "step", "aggregates", "min_count", "group_by", "filterable")
WHO_FIELDS = ("subjects", "roles", "attributes")


class RuleError(InvalidInput):
    """A rule that cannot be read or compiled; `path` is the JSON pointer of the field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path or '/'}: {message}", field=path or "/")
        self.path = path or "/"
        self.reason = message


@dataclass(frozen=True)
class AttributeMatch:
    """The caller carries `value` among the values of its attribute `id`."""

    id: str
    value: AttributeValue


@dataclass(frozen=True)
class Who:
    """Alternatives: any one of them makes the rule apply. `anyone`: every caller."""

    subjects: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    attributes: tuple[AttributeMatch, ...] = ()
    anyone: bool = False


@dataclass(frozen=True)
class RuleWindow:
    type: str
    size: int
    step: int
    aggregates: tuple[str, ...]  # "attribute:function", as written
    min_count: int | None = None
    group_by: tuple[str, ...] = ()
    filterable: tuple[str, ...] = ()


@dataclass(frozen=True)
class Validity:
    """A half-open interval [start, end) of the gateway's clock, UTC, `YYYY-MM-DDTHH:MM:SSZ`."""

    start: str | None = None
    end: str | None = None


@dataclass(frozen=True)
class SharingRule:
    id: str
    stream: str
    who: Who
    actions: tuple[str, ...] = DEFAULT_ACTIONS  # () means any action
    filter: str | None = None
    attributes: tuple[str, ...] = ()  # () means every attribute
    window: RuleWindow | None = None
    valid: Validity | None = None
    events: tuple[str, ...] = ()
    description: str | None = None
    version: str = "1.0"
    # (attributes as written, "speed" or "lat,lon"; the mask's canonical spec)
    masks: tuple[tuple[str, str], ...] = ()
    grant_option: bool = False  # the consumers may re-share it as derived streams


# -- reading the JSON form ------------------------------------------------------------------------

def _text(value: JsonValue, path: str, limit: int = MAX_TEXT, what: str = "a string") -> str:
    if not isinstance(value, str):
        raise RuleError(path, f"must be {what}, not {_kind(value)}")
    text = value.replace("\r\n", "\n").replace("\r", "\n").strip()
    if not text:
        raise RuleError(path, "must not be empty")
    if len(text) > limit:
        raise RuleError(path, f"is {len(text)} characters long, over the limit of {limit}")
    _plain(text, path)
    return text


def _plain(text: str, path: str) -> None:
    """Text that an XML document holds unchanged: no control characters (tab and newline
    aside: a carriage return would come back as a newline), nothing XML 1.0 cannot hold."""
    for c in text:
        code = ord(c)
        if (code < 32 and c not in "\t\n") or code == 0x7f or 0xD800 <= code <= 0xDFFF \
                or code in (0xFFFE, 0xFFFF):
            raise RuleError(path, f"holds the character U+{code:04X}, which is not allowed here")


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _names(value: JsonValue, path: str, what: str = "names") -> tuple[str, ...]:
    """A list of distinct non-empty strings (a lone string is a list of one)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise RuleError(path, f"must be a list of {what}, not {_kind(value)}")
    if len(value) > MAX_ITEMS:
        raise RuleError(path, f"holds {len(value)} items, over the limit of {MAX_ITEMS}")
    out: list[str] = []
    for i, item in enumerate(value):
        text = _text(item, f"{path}/{i}")
        if text in out:
            raise RuleError(f"{path}/{i}", f"{text!r} is listed twice")
        out.append(text)
    return tuple(out)


def _integer(value: object, path: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
            value = int(value.strip())
        else:
            raise RuleError(path, f"{what} must be a whole number, not {_kind(value)}")
    if value < 1:
        raise RuleError(path, f"{what} must be at least 1, not {value}")
    if value > MAX_WINDOW:
        raise RuleError(path, f"{what} {value} is over the limit of {MAX_WINDOW}")
    return value


def _object(value: JsonValue, path: str, known: tuple[str, ...]) -> JsonObject:
    if not isinstance(value, dict):
        raise RuleError(path, f"must be an object, not {_kind(value)}")
    for key in value:
        if key not in known:
            near = [k for k in known if k[:3] == str(key)[:3].lower()]
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise RuleError(f"{path}/{key}", f"unknown field{hint}; known: {', '.join(known)}")
    return value


def _attribute_value(value: JsonValue, path: str) -> AttributeValue:
    if isinstance(value, bool) or isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RuleError(path, "must be a finite number")
        return value
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise RuleError(path, f"is over the limit of {MAX_TEXT} characters")
        _plain(value, path)
        return value
    raise RuleError(path, f"must be a string, a number or a boolean, not {_kind(value)}")


def _who(value: JsonValue, path: str) -> Who:
    if value == "anyone":
        return Who(anyone=True)
    if isinstance(value, str):
        raise RuleError(path, "must be \"anyone\" or an object with subjects, roles or "
                              "attributes")
    data = _object(value, path, WHO_FIELDS)
    subjects = _names(data.get("subjects", []), f"{path}/subjects", "subject ids")
    roles = _names(data.get("roles", []), f"{path}/roles", "roles")
    matches: list[AttributeMatch] = []
    attributes = data.get("attributes", {})
    if not isinstance(attributes, dict):
        raise RuleError(f"{path}/attributes", "must be an object of attribute id -> value or "
                                              f"list of values, not {_kind(attributes)}")
    for attribute_id, values in attributes.items():
        at = f"{path}/attributes/{_pointer(attribute_id)}"
        name = _text(attribute_id, at, what="an attribute id")
        if name in ("subject-id", "role") or name.endswith((":subject-id", ":role")):
            raise RuleError(at, "the subject id and the roles are written under `subjects` and "
                                "`roles`")
        items = values if isinstance(values, list) else [values]
        if not items:
            raise RuleError(at, "lists no value")
        for i, item in enumerate(items):
            match = AttributeMatch(name, _attribute_value(
                item, f"{at}/{i}" if isinstance(values, list) else at))
            if any(m == match and type(m.value) is type(match.value) for m in matches):
                raise RuleError(f"{at}/{i}", f"{item!r} is listed twice")
            matches.append(match)
    if len(matches) > MAX_ITEMS:
        raise RuleError(f"{path}/attributes", f"over the limit of {MAX_ITEMS} values")
    if not (subjects or roles or matches):
        raise RuleError(path, "names nobody: give subjects, roles or attributes, or \"anyone\"")
    return Who(subjects, roles, tuple(matches))


def _pointer(key: object) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _window(value: JsonValue, path: str) -> RuleWindow:
    data = _object(value, path, WINDOW_FIELDS)
    for required in ("type", "size", "aggregates"):
        if required not in data:
            raise RuleError(f"{path}/{required}", "is required")
    kind = _text(data["type"], f"{path}/type").lower()
    if kind not in WINDOW_TYPES:
        raise RuleError(f"{path}/type", f"must be 'tuple' or 'time', not {data['type']!r}")
    size = _integer(data["size"], f"{path}/size", "the size")
    step = _integer(data.get("step", size), f"{path}/step", "the step")
    aggregates = _names(data["aggregates"], f"{path}/aggregates", "attribute:function pairs")
    if not aggregates:
        raise RuleError(f"{path}/aggregates", "lists no aggregate (attribute:function)")
    for i, text in enumerate(aggregates):
        if ":" not in text:
            raise RuleError(f"{path}/aggregates/{i}",
                            f"{text!r} must be written attribute:function (rainrate:avg)")
    min_count = None
    if data.get("min_count") is not None:
        min_count = _integer(data["min_count"], f"{path}/min_count", "the minimum count")
        if kind == "tuple" and min_count > size:
            raise RuleError(f"{path}/min_count", f"a tuple window of {size} tuples can never "
                                                 f"hold the minimum of {min_count}")
    return RuleWindow(kind, size, step, aggregates, min_count,
                      _names(data.get("group_by", []), f"{path}/group_by", "attributes"),
                      _names(data.get("filterable", []), f"{path}/filterable", "attributes"))


def parse_instant(value: JsonValue, path: str) -> str:
    """An instant as `YYYY-MM-DDTHH:MM:SSZ` (UTC). Without a zone it is taken as UTC, as the
    PDP takes values without one; a date alone is its midnight."""
    if isinstance(value, datetime):
        moment = value
    else:
        text = _text(value, path, 64, "a date and time (2026-11-23T08:00:00Z)")
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise RuleError(path, f"{value!r} is not a date and time such as "
                                  "2026-11-23T08:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)
    if moment.microsecond:
        raise RuleError(path, "give whole seconds")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _validity(value: JsonValue, path: str) -> Validity | None:
    data = _object(value, path, ("from", "until"))
    start = parse_instant(data["from"], f"{path}/from") if data.get("from") is not None else None
    end = parse_instant(data["until"], f"{path}/until") if data.get("until") is not None else None
    if start is None and end is None:
        return None
    if start is not None and end is not None and start >= end:
        raise RuleError(f"{path}/until", f"{end} is not after {start}")
    return Validity(start, end)


def _masks(value: JsonValue, path: str) -> tuple[tuple[str, str], ...]:
    """`{"speed": "round:10", "lat,lon": "grid:0.1"}`: the masks' syntax (the attributes are
    checked against the stream by `check_rule`)."""
    if not isinstance(value, dict):
        raise RuleError(path, "must be an object of attribute -> mask ({\"speed\": "
                              f"\"round:10\", \"lat,lon\": \"grid:0.1\"}}), not {_kind(value)}")
    if len(value) > MAX_ITEMS:
        raise RuleError(path, f"holds {len(value)} masks, over the limit of {MAX_ITEMS}")
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for key, spec in value.items():
        at = f"{path}/{_pointer(key)}"
        names = [n.strip() for n in _text(key, at, what="attribute names").split(",")]
        if not all(names):
            raise RuleError(at, "names an empty attribute")
        text = _text(spec, at, 2000, "a mask such as round:10")
        try:
            mask = parse_mask(text)
        except MaskError as exc:
            raise RuleError(at, str(exc)) from None
        for name in names:
            if name.lower() in seen:
                raise RuleError(at, f"attribute {name!r} is masked twice")
            seen.add(name.lower())
        out.append((",".join(names), mask.spec))
    return tuple(out)


def slug(text: str) -> str:
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")
    return out[:60] or "rule"


def default_id(stream: str, who: Who) -> str:
    """`urn:xsg:rule:<stream>:<who>`: what a rule without an id is stored as."""
    if who.anyone:
        part = "anyone"
    else:
        names = dict.fromkeys([*who.subjects, *who.roles, *(m.id for m in who.attributes)])
        part = "-".join(list(names)[:3])
    return f"urn:xsg:rule:{slug(stream)}:{slug(part)}"


def _version(value: JsonValue) -> str:
    if value is None:
        return "1.0"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)  # YAML reads `version: 1.0` as a number
    version = _text(value, "/version", 64, "a version")
    if not VERSION.fullmatch(version):
        raise RuleError("/version", f"{version!r} is not a XACML version (1.0, 2.3.1)")
    return version


def rule_from_json(data: JsonValue) -> SharingRule:
    """The rule a JSON (or YAML) document describes; RuleError names the field at fault."""
    data = _object(data, "", KNOWN_FIELDS)
    for required in ("stream", "who"):
        if required not in data:
            raise RuleError(f"/{required}", "is required")
    stream = _text(data["stream"], "/stream", 64, "a stream name")
    who = _who(data["who"], "/who")
    rule_id = default_id(stream, who) if data.get("id") is None else \
        _text(data["id"], "/id", what="a policy id")
    if not POLICY_ID.fullmatch(rule_id):
        raise RuleError("/id", "must not hold spaces or control characters")
    version = _version(data.get("version"))
    actions_value = data.get("actions", list(DEFAULT_ACTIONS))
    if actions_value == "any":
        actions: tuple[str, ...] = ()
    else:
        actions = _names(actions_value, "/actions", "action ids")
        if not actions:
            raise RuleError("/actions", "lists no action (\"any\" for every action)")
    filter_text = None
    if data.get("filter") is not None:
        filter_text = _text(data["filter"], "/filter", MAX_FILTER, "a condition")
    attributes = _names(data.get("attributes", []) or [], "/attributes", "attributes")
    masks = _masks(data["mask"], "/mask") if data.get("mask") is not None else ()
    window = _window(data["window"], "/window") if data.get("window") is not None else None
    valid = _validity(data["valid"], "/valid") if data.get("valid") is not None else None
    events = _names(data.get("events", []) or [], "/events", "event names")
    for i, name in enumerate(events):
        if not EVENT_NAME.fullmatch(name):
            raise RuleError(f"/events/{i}", f"{name!r} is not an event name "
                                            f"({EVENT_NAME.pattern})")
    description = None
    if data.get("description") is not None and str(data["description"]).strip():
        description = _text(data["description"], "/description", MAX_DESCRIPTION)
    option = data.get("grant_option", False)
    if option is None:
        option = False
    if not isinstance(option, bool):
        raise RuleError("/grant_option", f"must be true or false, not {_kind(option)}")
    return SharingRule(rule_id, stream, who, actions, filter_text, attributes, window, valid,
                       events, description, version, masks, option)


class WhoJson(TypedDict):
    subjects: list[str]
    roles: list[str]
    attributes: dict[str, AttributeValue | list[AttributeValue]]  # one value, or several


class RuleWindowJson(TypedDict):
    type: str
    size: int
    step: int
    aggregates: list[str]
    min_count: int | None
    group_by: list[str]
    filterable: list[str]


ValidityJson = TypedDict("ValidityJson", {"from": "str | None", "until": "str | None"})


class RuleJson(TypedDict):
    """A rule's JSON form with every default written out (`rule_to_json`)."""

    id: str
    version: str
    stream: str
    description: str | None
    who: Literal["anyone"] | WhoJson
    actions: list[str] | Literal["any"]
    filter: str | None
    attributes: list[str]
    mask: dict[str, str]
    window: RuleWindowJson | None
    valid: ValidityJson | None
    events: list[str]
    grant_option: bool


def rule_to_json(rule: SharingRule) -> RuleJson:
    """The JSON form, with every default written out (what `rule_from_json` reads back)."""
    who: Literal["anyone"] | WhoJson
    if rule.who.anyone:
        who = "anyone"
    else:
        attributes: dict[str, list[AttributeValue]] = {}
        for m in rule.who.attributes:
            attributes.setdefault(m.id, []).append(m.value)
        who = {"subjects": list(rule.who.subjects), "roles": list(rule.who.roles),
               "attributes": {k: v[0] if len(v) == 1 else v for k, v in attributes.items()}}
    out: RuleJson = {"id": rule.id, "version": rule.version, "stream": rule.stream,
                     "description": rule.description, "who": who,
                     "actions": list(rule.actions) if rule.actions else "any",
                     "filter": rule.filter, "attributes": list(rule.attributes),
                     "mask": {names: spec for names, spec in rule.masks},
                     "window": None, "valid": None, "events": list(rule.events),
                     "grant_option": rule.grant_option}
    if rule.window is not None:
        w = rule.window
        out["window"] = {"type": w.type, "size": w.size, "step": w.step,
                         "aggregates": list(w.aggregates), "min_count": w.min_count,
                         "group_by": list(w.group_by), "filterable": list(w.filterable)}
    if rule.valid is not None:
        out["valid"] = {"from": rule.valid.start, "until": rule.valid.end}
    return out


__all__ = ["SharingRule", "RuleJson", "Who", "AttributeMatch", "RuleWindow", "Validity",
           "RuleError", "rule_from_json", "rule_to_json", "default_id", "parse_instant",
           "DEFAULT_ACTIONS"]
