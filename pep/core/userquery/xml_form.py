"""The XML form of a consumer's query (eXACML+ Figure 4(a); the package docstring has it),
parsed with a hardened parser (no DTD, no entities, no network, bounded size and depth); errors
name the line and column."""
from __future__ import annotations

import re
from typing import Literal

from lxml import etree

from pep.core.obligations import parse_window_kind, parse_window_number
from pep.core.privacy import parse_delta, parse_epsilon
from pep.core.userquery.model import (
    MAX_QUERY_BYTES,
    MAX_QUERY_DEPTH,
    JoinQuery,
    UserQuery,
    UserQueryError,
    WindowPrivacy,
    privacy_ask,
    within_seconds,
)


class _XmlWindow(WindowPrivacy, total=False):
    """An <Aggregation> as read (type, size and step are always there once it is)."""

    kind: Literal["tuple", "time"]
    size: int
    step: int
    aggregates: list[str]
    keys: list[str]
    min_count: int
    coarsen: bool


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
    """Parse the XML form from bytes, hardened: no DTD, no entities, no network, size/depth
    limits."""
    if isinstance(data, str):
        data = _utf8(data)
    if len(data) > MAX_QUERY_BYTES:
        raise UserQueryError(
            f"user query is {len(data)} bytes, over the limit of {MAX_QUERY_BYTES}"
        )
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
            raise UserQueryError(
                f"user query nests deeper than {MAX_QUERY_DEPTH} elements", _at(el)
            )
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
    window: _XmlWindow = {}
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
                     window.get("coarsen", False), join, privacy_ask(window), tuple(masks))


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
            within = within_seconds(_text(child), _at(child))
    side = query_from_element(el, in_join=True)
    if side.stream is None:
        raise UserQueryError('<Join> needs <Stream name="..."/>: the stream to join', _at(el))
    if not on:
        raise UserQueryError("<Join> needs at least one <On left=\"...\" right=\"...\"/>",
                             _at(el))
    return JoinQuery(side.stream, tuple(on), within, side)


def _xml_window(el: etree._Element) -> _XmlWindow:
    out: _XmlWindow = {"aggregates": []}
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
                which: Literal["epsilon", "delta"] = "epsilon" if name == "Epsilon" else "delta"
                if which in out:
                    raise UserQueryError(f"<Aggregation> has more than one <{name}>", _at(child))
                out[which] = (parse_epsilon(_text(child)) if which == "epsilon"
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
