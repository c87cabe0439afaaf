"""A consumer's own query on a stream, in XML (eXACML+ Figure 4(a)) or JSON, as a query graph.

XML form (element names as in the paper; the query may sit in the XACML request's resource
`<Content>` or travel beside the request):

    <UserQuery>
      <Stream name="weather"/>                         optional; must match the request's stream
      <Filter><FilterCondition>RainRate > 50</FilterCondition></Filter>
      <Map><Attribute>RainRate</Attribute></Map>        one <Attribute> per visible attribute
      <Mask><Attribute>RainRate:round:10</Attribute></Mask>   optional: coarser masks (below)
      <Aggregation>
        <WindowType>tuple</WindowType>                  tuple | time (seconds)
        <WindowSize>10</WindowSize>
        <WindowStep>2</WindowStep>
        <Attribute>avg(RainRate)</Attribute>            or RainRate:avg; repeated
        <Key>station</Key>                              optional, repeated: group by
        <MinCount>5</MinCount>                          optional: fewest tuples per window
        <Coarsen>true</Coarsen>                         optional: raise a finer window to the
                                                          policy's instead of refusing it
        <Epsilon>0.1</Epsilon>                          optional, under a differentially private
        <Delta>0</Delta>                                  window: less privacy loss per window
      </Aggregation>                                      than the policy's (never more)
    </UserQuery>

The paper's figure writes `<WindowSize>10<WindowSize>` (unclosed). That is not well-formed XML
and is refused, with lxml's line and column and a hint naming the element; a lenient parser in
front of an access-control decision is not worth the ambiguity.

JSON form (same meaning; every key optional except that a window needs type, size and step):

    {"stream": "weather", "filter": "rainrate > 50", "map": ["rainrate"],
     "mask": {"rainrate": "round:10"},
     "window": {"type": "tuple", "size": 10, "step": 2, "aggregates": ["rainrate:avg"],
                "keys": ["station"], "min_count": 5, "coarsen": true,
                "epsilon": 0.1, "delta": 0}}

`mask` asks for attributes in a coarser form than the policy's masks (`pep.core.masks`): an
object attribute -> mask (`{"speed": "round:20", "lat,lon": "grid:1"}`) or a list of
`attribute:mask` texts; in XML one `<Attribute>attribute:mask</Attribute>` per mask. A mask finer
than the policy's is refused (403). The query's filter, group-by keys, aggregates and a join's
condition read the masked values, never the raw ones.

Joins (a second stream, each side enforced by its own policy before the join; see
pep/core/join.py for the semantics): the top-level filter, map and window are the request's
stream's side, and a `join` names the second stream, the equalities that must hold between the
two sides' outputs, optionally a time bound, and the second side's own filter, map and window:

    {"filter": "rainrate > 5", "map": ["samplingtime", "station", "rainrate"],
     "join": {"stream": "ais", "on": [["station", "area"]], "within": 60,
              "filter": "speed > 1", "map": ["ts", "area", "mmsi"],
              "window": {...}}}

`on` is a non-empty list of [left attribute, right attribute] pairs (an attribute of a windowed
side is one of its window outputs: window_start, window_end, a group-by key or an aggregate's
output name such as avg_rainrate); `within` is in seconds (a number >= 0): a left and a right row
meet when their times are at most that far apart (a plain side's time is its stream's event-time
attribute, a windowed side's its window_end). `within` is required unless both sides are
time-windowed (then it defaults to 0: windows that end together meet). In XML, a `<Join>` element
inside `<UserQuery>` holds the same parts:

    <Join>
      <Stream name="ais"/>                             required
      <On left="station" right="area"/>                repeated, at least one
      <Within>60</Within>                              seconds
      <Filter>...</Filter> <Map>...</Map> <Aggregation>...</Aggregation>   the second side's
    </Join>

A join joins exactly two streams (no `join` inside a `join`), and two different ones.

An object `{"UserQuery": {...}}` is accepted too. Aggregates are "attr:function",
"function(attr)" or {"attribute": ..., "function": ...}. A window without aggregates asks for
whatever the policy's window allows, one without keys for the policy's group-by keys (`"keys": []`
for none); a minimum count below the policy's has no effect (the larger wins). Errors are `UserQueryError(message, position)` (HTTP 400);
the position is "line L, column C" for XML, a JSON path such as "$.window.size" for JSON, or
"filter, column C" for a condition.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from lxml import etree

from pep.core.conditions import ConditionError, parse_condition
from pep.core.graph import QueryGraph, pipeline_graph
from pep.core.masks import Mask, MaskError, ordered, parse_assignment, view_schema
from pep.core.obligations import (MAX_WINDOW, parse_aggregate, parse_window_kind,
                                  parse_window_number)
from pep.core.plan import Aggregate, StreamSchema, WindowAsk, WindowSpec
from pep.core.privacy import PrivacyAsk, parse_delta, parse_epsilon

MAX_QUERY_BYTES = 64 * 1024
MAX_QUERY_DEPTH = 16


class UserQueryError(ValueError):
    """The user's query is malformed or does not fit the stream."""

    def __init__(self, message: str, position: str | None = None) -> None:
        self.message = message
        self.position = position
        super().__init__(f"{message} ({position})" if position else message)


@dataclass(frozen=True)
class UserQuery:
    """A parsed, not yet schema-checked, user query."""

    stream: str | None = None
    filter: str | None = None
    map: tuple[str, ...] | None = None
    window_kind: Literal["tuple", "time"] | None = None
    window_size: int | None = None
    window_step: int | None = None
    aggregates: tuple[str, ...] = ()
    has_window: bool = False
    filter_position: str | None = None  # where the filter text sits in the document
    window_keys: tuple[str, ...] | None = None  # None: the policy's
    window_min_count: int = 1
    window_coarsen: bool = False
    join: "JoinQuery | None" = None  # a second stream joined with this one
    window_privacy: PrivacyAsk | None = None  # a smaller epsilon/delta than the policy's
    masks: tuple[str, ...] = ()  # "attribute:mask" texts: coarser masks asked for

    @property
    def is_empty(self) -> bool:
        return (self.filter is None and self.map is None and not self.has_window
                and self.join is None and not self.masks)


@dataclass(frozen=True)
class JoinQuery:
    """The join part of a user query: the second stream, the condition, the second side's query.

    `side` is the second stream's own filter, map and window (its `stream` is the join's)."""

    stream: str
    on: tuple[tuple[str, str], ...]  # (attribute of the request's side, attribute of the second)
    within: float | None
    side: UserQuery


# -- XML ------------------------------------------------------------------------------------------

def _local(el: etree._Element) -> str:
    tag = el.tag
    if not isinstance(tag, str):
        return ""
    return tag.rsplit("}", 1)[-1]


def _at(el: etree._Element) -> str | None:
    return f"line {el.sourceline}" if el.sourceline else None


def _parser() -> etree.XMLParser:
    return etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                           dtd_validation=False, huge_tree=False, remove_comments=True,
                           remove_pis=True)


def _utf8(text: str) -> bytes:
    """Text (e.g. a JSON string that carried the query) as UTF-8; a lone surrogate, which a JSON
    escape such as "\\ud800" can make and no encoding can write, is refused with its place."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        before = text[:exc.start]
        line = before.count("\n") + 1
        column = exc.start - (before.rfind("\n") + 1) + 1
        raise UserQueryError(f"user query has a lone UTF-16 surrogate "
                             f"U+{ord(text[exc.start]):04X}, which is not a character",
                             f"line {line}, column {column}") from None


def parse_xml_query(data: bytes | str) -> UserQuery:
    """Parse the XML form from bytes, hardened: no DTD, no entities, no network, size/depth limits."""
    if isinstance(data, str):
        data = _utf8(data)
    if len(data) > MAX_QUERY_BYTES:
        raise UserQueryError(f"user query is {len(data)} bytes, over the limit of {MAX_QUERY_BYTES}")
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise UserQueryError("user query contains a DOCTYPE/ENTITY declaration, which is refused")
    try:
        root = etree.fromstring(data, _parser())
    except etree.XMLSyntaxError as exc:
        line, column = exc.position if exc.position else (exc.lineno, None)
        where = f"line {line}, column {column}" if column else (f"line {line}" if line else None)
        message = f"malformed user query XML: {exc.msg}"
        m = re.search(rb"<(Window\w+)>\s*[^<]*<\1>", data)
        if m:
            name = m.group(1).decode()
            message += (f" (hint: <{name}> is not closed; write <{name}>...</{name}>, the paper's "
                        "Figure 4(a) has this typo)")
        raise UserQueryError(message, where) from None
    except ValueError as exc:
        raise UserQueryError(f"malformed user query XML: {exc}") from None
    if root.getroottree().docinfo.doctype:
        raise UserQueryError("user query contains a DOCTYPE declaration, which is refused")
    return query_from_element(root)


def _depth_ok(root: etree._Element) -> None:
    stack = [(root, 1)]
    while stack:
        el, depth = stack.pop()
        if depth > MAX_QUERY_DEPTH:
            raise UserQueryError(f"user query nests deeper than {MAX_QUERY_DEPTH} elements", _at(el))
        stack.extend((c, depth + 1) for c in el)


def _text(el: etree._Element) -> str:
    if len(el):
        raise UserQueryError(f"<{_local(el)}> must contain text only", _at(el))
    return (el.text or "").strip()


def _children(el: etree._Element) -> list[etree._Element]:
    return [c for c in el if isinstance(c.tag, str)]


def query_from_element(root: etree._Element, in_join: bool = False) -> UserQuery:
    """The XML form from an already parsed element (for example the request's <Content> child).
    With `in_join`, `root` is a `<Join>` and this reads the second side's parts of it."""
    _depth_ok(root)
    if not in_join and _local(root) != "UserQuery":
        raise UserQueryError(f"expected a <UserQuery> element, found <{_local(root)}>", _at(root))
    join_el = None
    stream = filter_text = None
    filter_pos = None
    attributes: list[str] | None = None
    window: dict[str, Any] = {}
    masks: list[str] = []
    has_window = False
    seen: set[str] = set()
    for child in _children(root):
        name = _local(child)
        if in_join and name in ("On", "Within"):
            continue  # read by _xml_join
        if name in seen:
            raise UserQueryError(f"<{_local(root)}> has more than one <{name}>", _at(child))
        seen.add(name)
        if name == "Stream":
            stream = (child.get("name") or _text(child)).strip()
            if not stream:
                raise UserQueryError("<Stream> needs a name attribute", _at(child))
        elif name == "Filter":
            conds = _children(child)
            if len(conds) != 1 or _local(conds[0]) != "FilterCondition":
                raise UserQueryError("<Filter> must hold exactly one <FilterCondition>", _at(child))
            filter_text = _text(conds[0])
            filter_pos = _at(conds[0])
            if not filter_text:
                raise UserQueryError("<FilterCondition> is empty", _at(conds[0]))
        elif name == "Map":
            attributes = []
            for a in _children(child):
                if _local(a) != "Attribute":
                    raise UserQueryError(f"<Map> may hold only <Attribute>, found <{_local(a)}>",
                                         _at(a))
                attributes.append(_text(a))
            if not attributes:
                raise UserQueryError("<Map> lists no <Attribute>", _at(child))
        elif name == "Mask":
            for a in _children(child):
                if _local(a) != "Attribute":
                    raise UserQueryError(f"<Mask> may hold only <Attribute>, found <{_local(a)}>",
                                         _at(a))
                masks.append(_text(a))
            if not masks:
                raise UserQueryError("<Mask> lists no <Attribute> (attribute:mask)", _at(child))
        elif name == "Aggregation":
            has_window = True
            window = _xml_window(child)
        elif name == "Join" and not in_join:
            join_el = child
        else:
            expected = "Stream, On, Within, Filter, Map, Mask or Aggregation" if in_join else \
                "Stream, Filter, Map, Mask, Aggregation or Join"
            if name == "Join":
                raise UserQueryError("a <Join> cannot hold another <Join>: a join joins exactly "
                                     "two streams", _at(child))
            raise UserQueryError(f"unknown element <{name}> in <{_local(root)}>; expected "
                                 f"{expected}", _at(child))
    keys = window.get("keys")
    join = _xml_join(join_el) if join_el is not None else None
    return UserQuery(stream, filter_text, tuple(attributes) if attributes is not None else None,
                     window.get("kind"), window.get("size"), window.get("step"),
                     tuple(window.get("aggregates", ())), has_window, filter_pos,
                     tuple(keys) if keys is not None else None, window.get("min_count", 1),
                     window.get("coarsen", False), join, _ask(window), tuple(masks))


def _ask(window: dict[str, Any]) -> PrivacyAsk | None:
    if "epsilon" not in window and "delta" not in window:
        return None
    return PrivacyAsk(window.get("epsilon"), window.get("delta"))


def _xml_join(el: etree._Element) -> JoinQuery:
    """`<Join>`: Stream, On (repeated), Within, and the second side's Filter, Map, Aggregation."""
    on: list[tuple[str, str]] = []
    within = None
    for child in _children(el):
        name = _local(child)
        if name == "On":
            if _children(child) or (child.text or "").strip():
                raise UserQueryError("<On> takes attributes left and right, and no content",
                                     _at(child))
            left, right = (child.get("left") or "").strip(), (child.get("right") or "").strip()
            if not left or not right:
                raise UserQueryError("<On> needs both a left and a right attribute", _at(child))
            on.append((left, right))
        elif name == "Within":
            if within is not None:
                raise UserQueryError("<Join> has more than one <Within>", _at(child))
            within = _within(_text(child), _at(child))
    side = query_from_element(el, in_join=True)
    if side.stream is None:
        raise UserQueryError('<Join> needs <Stream name="..."/>: the stream to join', _at(el))
    if not on:
        raise UserQueryError("<Join> needs at least one <On left=\"...\" right=\"...\"/>",
                             _at(el))
    return JoinQuery(side.stream, tuple(on), within, side)


def _within(value: Any, where: str | None) -> float:
    """A join's time bound in seconds: a finite number >= 0 (and not absurdly large)."""
    if isinstance(value, bool):
        raise UserQueryError("within must be a number of seconds", where)
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise UserQueryError(f"within {value!r} is not a number of seconds", where) from None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise UserQueryError("within must be a finite number of seconds, at least 0", where)
    if value > MAX_WINDOW:
        raise UserQueryError(f"within {value} is over the limit of {MAX_WINDOW} seconds", where)
    return float(value)


def _xml_window(el: etree._Element) -> dict[str, Any]:
    out: dict[str, Any] = {"aggregates": []}
    for child in _children(el):
        name = _local(child)
        try:
            if name == "WindowType":
                out["kind"] = parse_window_kind(_text(child))
            elif name == "WindowSize":
                out["size"] = parse_window_number(_text(child), "size")
            elif name == "WindowStep":
                out["step"] = parse_window_number(_text(child), "step")
            elif name == "Attribute":
                out["aggregates"].append(_text(child))
            elif name == "Key":
                out.setdefault("keys", []).append(_text(child))
            elif name == "MinCount":
                out["min_count"] = parse_window_number(_text(child), "minimum count")
            elif name == "Coarsen":
                flag = _text(child).strip().lower()
                if flag not in ("true", "false"):
                    raise UserQueryError("<Coarsen> is true or false", _at(child))
                out["coarsen"] = flag == "true"
            elif name in ("Epsilon", "Delta"):
                key = name.lower()
                if key in out:
                    raise UserQueryError(f"<Aggregation> has more than one <{name}>", _at(child))
                out[key] = (parse_epsilon(_text(child)) if key == "epsilon"
                            else parse_delta(_text(child)))
            else:
                raise UserQueryError(f"unknown element <{name}> in <Aggregation>", _at(child))
        except ValueError as exc:
            if isinstance(exc, UserQueryError):
                raise
            raise UserQueryError(str(exc), _at(child)) from None
    for key, element in (("kind", "WindowType"), ("size", "WindowSize"), ("step", "WindowStep")):
        if key not in out:
            raise UserQueryError(f"<Aggregation> needs <{element}>", _at(el))
    return out


# -- JSON -----------------------------------------------------------------------------------------

_JSON_KEYS = {"stream", "filter", "map", "mask", "window", "join"}
_JSON_JOIN_KEYS = {"stream", "on", "within", "filter", "map", "mask", "window"}
_JSON_WINDOW_KEYS = {"type", "size", "step", "aggregates", "keys", "min_count", "coarsen",
                     "epsilon", "delta"}


def parse_json_query(data: bytes | str) -> UserQuery:
    if isinstance(data, (bytes, bytearray)):
        if len(data) > MAX_QUERY_BYTES:
            raise UserQueryError(
                f"user query is {len(data)} bytes, over the limit of {MAX_QUERY_BYTES}")
        try:
            data = bytes(data).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise UserQueryError(f"user query is not UTF-8: {exc}") from None
    if len(data) > MAX_QUERY_BYTES:
        raise UserQueryError(f"user query is over the limit of {MAX_QUERY_BYTES} bytes")
    if data.count("[") + data.count("{") > 4 * MAX_QUERY_DEPTH + 200:
        raise UserQueryError("user query JSON has too many nested values")
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as exc:
        raise UserQueryError(f"malformed user query JSON: {exc.msg}",
                             f"line {exc.lineno}, column {exc.colno}") from None
    except ValueError as exc:  # an integer over Python's 4300-digit conversion limit
        raise UserQueryError(f"malformed user query JSON: {str(exc)[:120]}") from None
    except RecursionError:
        raise UserQueryError("user query JSON nests too deeply") from None
    return query_from_json(doc)


def query_from_json(doc: Any, path: str = "$", in_join: bool = False) -> UserQuery:
    """The JSON form from an already decoded value (for example the JSON request's Content).
    With `in_join`, `doc` is a query's `join` object and this reads the second side's parts."""
    if not in_join and isinstance(doc, dict) and set(doc) == {"UserQuery"}:
        doc, path = doc["UserQuery"], "$.UserQuery"
    if not isinstance(doc, dict):
        raise UserQueryError(f"a user query must be a JSON object, found {type(doc).__name__}", path)
    allowed = _JSON_JOIN_KEYS if in_join else _JSON_KEYS
    unknown = sorted(set(doc) - allowed)
    if unknown:
        if in_join and "join" in unknown:
            raise UserQueryError("a join cannot hold another join: a join joins exactly two "
                                 "streams", f"{path}.join")
        raise UserQueryError(f"unknown key(s) {', '.join(map(repr, unknown))}; expected "
                             f"{', '.join(sorted(allowed))}", path)
    stream = doc.get("stream")
    if stream is not None and (not isinstance(stream, str) or not stream.strip()):
        raise UserQueryError("'stream' must be a non-empty string", f"{path}.stream")
    filt = doc.get("filter")
    if filt is not None and (not isinstance(filt, str) or not filt.strip()):
        raise UserQueryError("'filter' must be a non-empty condition string", f"{path}.filter")
    attrs = doc.get("map")
    if attrs is not None:
        if not isinstance(attrs, list) or not attrs or not all(isinstance(a, str) for a in attrs):
            raise UserQueryError("'map' must be a non-empty list of attribute names", f"{path}.map")
    window = doc.get("window")
    kind = size = step = None
    aggregates: list[str] = []
    keys: tuple[str, ...] | None = None
    min_count = 1
    coarsen = False
    asked: dict[str, float] = {}
    if window is not None:
        wpath = f"{path}.window"
        if not isinstance(window, dict):
            raise UserQueryError("'window' must be an object", wpath)
        unknown = sorted(set(window) - _JSON_WINDOW_KEYS)
        if unknown:
            raise UserQueryError(f"unknown key(s) {', '.join(map(repr, unknown))}; expected "
                                 "type, size, step, aggregates, keys, min_count, coarsen, "
                                 "epsilon, delta", wpath)
        for key in ("type", "size", "step"):
            if key not in window:
                raise UserQueryError(f"window needs '{key}'", wpath)
        if not isinstance(window["type"], str):
            raise UserQueryError("window type must be 'tuple' or 'time'", f"{wpath}.type")
        try:
            kind = parse_window_kind(window["type"])
        except ValueError as exc:
            raise UserQueryError(str(exc), f"{wpath}.type") from None
        for key in ("size", "step"):
            value = window[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserQueryError(f"window {key} must be a positive integer", f"{wpath}.{key}")
            try:
                parse_window_number(str(value), key)
            except ValueError as exc:
                raise UserQueryError(str(exc), f"{wpath}.{key}") from None
        size, step = window["size"], window["step"]
        raw = window.get("aggregates", [])
        if not isinstance(raw, list):
            raise UserQueryError("'aggregates' must be a list", f"{wpath}.aggregates")
        for i, item in enumerate(raw):
            if isinstance(item, str):
                aggregates.append(item)
            elif (isinstance(item, dict) and set(item) == {"attribute", "function"}
                  and all(isinstance(v, str) for v in item.values())):
                aggregates.append(f"{item['attribute']}:{item['function']}")
            else:
                raise UserQueryError("an aggregate is \"attribute:function\" or "
                                     "{\"attribute\": ..., \"function\": ...}",
                                     f"{wpath}.aggregates[{i}]")
        if "keys" in window:
            raw_keys = window["keys"]
            if not isinstance(raw_keys, list) or not all(isinstance(k, str) for k in raw_keys):
                raise UserQueryError("'keys' must be a list of attribute names", f"{wpath}.keys")
            keys = tuple(raw_keys)
        if "min_count" in window:
            value = window["min_count"]
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserQueryError("min_count must be a positive integer", f"{wpath}.min_count")
            try:
                min_count = parse_window_number(str(value), "minimum count")
            except ValueError as exc:
                raise UserQueryError(str(exc), f"{wpath}.min_count") from None
        if "coarsen" in window:
            if not isinstance(window["coarsen"], bool):
                raise UserQueryError("coarsen must be true or false", f"{wpath}.coarsen")
            coarsen = window["coarsen"]
        for key in ("epsilon", "delta"):
            if key not in window:
                continue
            value = window[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UserQueryError(f"{key} must be a number", f"{wpath}.{key}")
            try:
                asked[key] = (parse_epsilon(repr(float(value))) if key == "epsilon"
                              else parse_delta(repr(float(value))))
            except (ValueError, OverflowError) as exc:
                raise UserQueryError(str(exc), f"{wpath}.{key}") from None
    join = _json_join(doc["join"], f"{path}.join") if "join" in doc else None
    masks = _json_masks(doc["mask"], f"{path}.mask") if doc.get("mask") is not None else ()
    return UserQuery(stream, filt.strip() if filt else None,
                     tuple(attrs) if attrs is not None else None, kind, size, step,
                     tuple(aggregates), window is not None, f"{path}.filter", keys, min_count,
                     coarsen, join, _ask(asked), masks)


def _json_masks(value: Any, path: str) -> tuple[str, ...]:
    """`{"speed": "round:10", "lat,lon": "grid:1"}` or `["speed:round:10", ...]` as
    "attribute:mask" texts."""
    if isinstance(value, dict):
        out = []
        for name, spec in value.items():
            if not isinstance(spec, str) or not spec.strip() or not name.strip():
                raise UserQueryError("each mask is \"attribute\": \"mask\" (\"speed\": "
                                     "\"round:10\")", f"{path}.{name}")
            out.append(f"{name}:{spec}")
        return tuple(out)
    if isinstance(value, list) and all(isinstance(v, str) and v.strip() for v in value):
        return tuple(value)
    raise UserQueryError("'mask' must be an object attribute -> mask ({\"speed\": "
                         "\"round:10\"}) or a list of \"attribute:mask\" texts", path)


def _json_join(doc: Any, path: str) -> JoinQuery:
    if not isinstance(doc, dict):
        raise UserQueryError("'join' must be an object", path)
    if not isinstance(doc.get("stream"), str) or not doc["stream"].strip():
        raise UserQueryError("a join needs 'stream': the name of the stream to join",
                             f"{path}.stream")
    raw_on = doc.get("on")
    if not isinstance(raw_on, list) or not raw_on:
        raise UserQueryError("a join needs 'on': a non-empty list of [left attribute, right "
                             "attribute] pairs", f"{path}.on")
    on = []
    for i, pair in enumerate(raw_on):
        if (not isinstance(pair, list) or len(pair) != 2
                or not all(isinstance(a, str) and a.strip() for a in pair)):
            raise UserQueryError("each 'on' item is a pair [left attribute, right attribute]",
                                 f"{path}.on[{i}]")
        on.append((pair[0].strip(), pair[1].strip()))
    within = _within(doc["within"], f"{path}.within") if doc.get("within") is not None else None
    name = doc["stream"].strip()
    side = replace(query_from_json(doc, path, in_join=True), stream=name)
    return JoinQuery(name, tuple(on), within, side)


def parse_user_query(data: bytes | str, kind: str | None = None) -> UserQuery:
    """`kind` is 'xml', 'json' or a media type; without it the first character decides."""
    text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else data
    k = (kind or "").lower()
    if "json" in k:
        return parse_json_query(data)
    if "xml" in k:
        return parse_xml_query(data)
    if k:
        raise UserQueryError(f"unsupported user query type {kind!r}; use XML or JSON")
    return parse_xml_query(data) if text.lstrip().startswith("<") else parse_json_query(data)


def query_from_content(content: Any) -> UserQuery:
    """The query carried in a XACML request's resource Content (an element, JSON value or text)."""
    if isinstance(content, etree._Element):
        return query_from_element(content)
    if isinstance(content, str):
        return parse_user_query(content)
    return query_from_json(content)


# -- to a graph -----------------------------------------------------------------------------------

def _schema_names(schema: StreamSchema, names: Sequence[str], unknown: str) -> tuple[str, ...]:
    """The attributes named (case-insensitive, trimmed) by their schema names, in schema order;
    an unknown one is refused with `unknown` and the stream's attributes."""
    found = set()
    for name in names:
        field = schema.lookup(name.strip())
        if field is None:
            raise UserQueryError(f"{unknown} {name!r}; the stream has: {', '.join(schema.names)}")
        found.add(field.name)
    return tuple(n for n in schema.names if n in found)


def user_graph(query: UserQuery, stream: str, schema: StreamSchema,
               masks: Mapping[str, Mask] | None = None) -> QueryGraph:
    """The user's graph with names checked against the schema (placeholders are not allowed).
    `masks`: the policy's masks; the filter is read against the values the consumer sees
    (a hashed attribute is text), the consumer's own masks replacing the policy's."""
    if query.stream is not None and query.stream != stream:
        raise UserQueryError(f"the user query is for stream {query.stream!r} but the request is "
                             f"for {stream!r}")
    asked: dict[str, Mask] = {}
    for text in query.masks:
        try:
            for name, mask in parse_assignment(text, schema):
                if name in asked:
                    raise UserQueryError(f"mask: attribute {name!r} is masked twice")
                asked[name] = mask
        except MaskError as exc:
            raise UserQueryError(f"mask: {exc}") from None
    view = view_schema(schema, {**(masks or {}), **asked})
    filter_part = None
    if query.filter is not None:
        try:
            expr = parse_condition(query.filter, view, allow_placeholders=False)
        except ConditionError as exc:
            where = query.filter_position
            raise UserQueryError(f"filter condition: {exc}", where) from None
        filter_part = (expr, query.filter)
    map_part = None
    if query.map is not None:
        map_part = _schema_names(schema, query.map, "map: unknown attribute")
    window_part = ask = None
    if query.has_window:
        aggregates: list[Aggregate] = []
        for text in query.aggregates:
            try:
                aggregates.append(parse_aggregate(text, view))
            except ValueError as exc:
                raise UserQueryError(f"window: {exc}") from None
        keys = None
        if query.window_keys is not None:
            keys = _schema_names(schema, query.window_keys, "window: unknown group-by key")
        kind, size, step = query.window_kind, query.window_size, query.window_step
        if kind is None or size is None or step is None:  # the parsers never leave one out
            raise UserQueryError("a window needs its type, size and step")
        window_part = WindowSpec(kind, size, step, tuple(dict.fromkeys(aggregates)),
                                 min_count=query.window_min_count)
        ask = WindowAsk(keys, query.window_coarsen, query.window_privacy)
    return pipeline_graph(stream, filter=filter_part, map=map_part, window=window_part,
                          window_ask=ask, mask=ordered(asked, schema) if asked else None)
