"""XACML 3.0 requests, from XML or the JSON Profile, into one immutable RequestContext.

Both formats end in the same model, so the evaluator never knows which one the client used. Values
are parsed into their datatype once, here: a value that does not fit its datatype is a syntax
error of the request (said with where it is), not an evaluation error later on.

Multiple Decision Profile: only the "repeated categories" scheme is supported. A request with two
`Attributes` of the same category asks for one decision per combination; `individuals()` expands
them. MultiRequests and CombinedDecision=true are refused with a processing-error status, which is
what the profile allows a PDP that does not implement them to do.
"""
from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any, Iterable, NamedTuple, Sequence

from lxml import etree

from pdp.errors import RequestSyntaxError, ValueSyntaxError
from pdp.results import (STATUS_PROCESSING_ERROR, ResultAttribute, ResultCategory)
from pdp.xmlsafe import UnsafeDocumentError, parse_json, parse_xml
from pdp.urns import (ACCESS_SUBJECT, ACTION, CURRENT_DATE, CURRENT_DATETIME, CURRENT_TIME,
                      ENVIRONMENT, RESOURCE, SUBJECT_ID, SUBJECT_ROLE, XACML_NS)

_NS = "{%s}" % XACML_NS
XML_ID = "{http://www.w3.org/XML/1998/namespace}id"
_ATTRIBUTES_TAG = _NS + "Attributes"
_ATTRIBUTE_TAG = _NS + "Attribute"
_VALUE_TAG = _NS + "AttributeValue"

XML_MEDIA_TYPES = frozenset({"application/xacml+xml", "application/xml", "text/xml"})
JSON_MEDIA_TYPES = frozenset({"application/xacml+json", "application/json"})


CATEGORY_SHORTHANDS = {
    "AccessSubject": ACCESS_SUBJECT,
    "Resource": RESOURCE,
    "Action": ACTION,
    "Environment": ENVIRONMENT,
    "RecipientSubject": "urn:oasis:names:tc:xacml:1.0:subject-category:recipient-subject",
    "IntermediarySubject": "urn:oasis:names:tc:xacml:1.0:subject-category:intermediary-subject",
    "Codebase": "urn:oasis:names:tc:xacml:1.0:subject-category:codebase",
    "RequestingMachine": "urn:oasis:names:tc:xacml:1.0:subject-category:requesting-machine",
}

_XS = "http://www.w3.org/2001/XMLSchema#"
DATATYPE_SHORTHANDS = {
    "string": _XS + "string",
    "boolean": _XS + "boolean",
    "integer": _XS + "integer",
    "double": _XS + "double",
    "time": _XS + "time",
    "date": _XS + "date",
    "dateTime": _XS + "dateTime",
    "dayTimeDuration": _XS + "dayTimeDuration",
    "yearMonthDuration": _XS + "yearMonthDuration",
    "anyURI": _XS + "anyURI",
    "hexBinary": _XS + "hexBinary",
    "base64Binary": _XS + "base64Binary",
    "rfc822Name": "urn:oasis:names:tc:xacml:1.0:data-type:rfc822Name",
    "x500Name": "urn:oasis:names:tc:xacml:1.0:data-type:x500Name",
    "ipAddress": "urn:oasis:names:tc:xacml:2.0:data-type:ipAddress",
    "dnsName": "urn:oasis:names:tc:xacml:2.0:data-type:dnsName",
    "xpathExpression": "urn:oasis:names:tc:xacml:3.0:data-type:xpathExpression",
}
STRING = DATATYPE_SHORTHANDS["string"]

# Repeated categories multiply: 10 instances of each of 4 categories would be 10,000 decisions.
MAX_INDIVIDUAL_DECISIONS = 1000


def normalize_category(category: str) -> str:
    """Full category URI for a URI or a JSON Profile shorthand name."""
    return CATEGORY_SHORTHANDS.get(category, category)


def normalize_datatype(datatype: str) -> str:
    return DATATYPE_SHORTHANDS.get(datatype, datatype)


class UnsupportedRequestError(RequestSyntaxError):
    """A well-formed request that asks for a feature this PDP refuses (answered processing-error)."""

    status_code = STATUS_PROCESSING_ERROR


_DATATYPES = None


def _datatypes():
    # Imported lazily (once) so that this module does not depend on import order.
    global _DATATYPES
    if _DATATYPES is None:
        from pdp import datatypes
        _DATATYPES = datatypes
    return _DATATYPES


class RequestAttribute(NamedTuple):
    """One Attribute of one category; values are lexical, all of one datatype."""

    attribute_id: str
    datatype: str
    values: tuple[str, ...]
    issuer: str | None = None
    include_in_result: bool = False


class CategoryInstance:
    """One `Attributes` element (or JSON Category object) of the request; build with `build`.

    `bags` maps (attribute_id, datatype) and (attribute_id, datatype, issuer) to parsed values.
    """

    __slots__ = ("category", "attributes", "content", "xml_id", "bags", "included_result")

    def __init__(self, category: str, attributes: tuple[RequestAttribute, ...], content: Any,
                 xml_id: str | None, bags: dict, included_result: ResultCategory | None) -> None:
        self.category = category
        self.attributes = attributes
        self.content = content
        self.xml_id = xml_id
        self.bags = bags
        self.included_result = included_result

    def __repr__(self) -> str:
        return f"CategoryInstance({self.category!r}, {self.attributes!r})"

    @classmethod
    def build(cls, category: str, attributes: Sequence[RequestAttribute], content: Any = None,
              xml_id: str | None = None, where: str = "") -> "CategoryInstance":
        bags: dict[tuple, tuple] = {}
        dts = _datatypes()
        known = dts.DATATYPES
        canonical = dts.canonical_datatype_id
        included = []
        for attr in attributes:
            dt = known.get(attr.datatype)
            if dt is None:
                parsed = tuple(attr.values)  # unknown datatype: no policy can designate it anyway
            else:
                try:
                    values = attr.values
                    parsed = (dt.parse(values[0]),) if len(values) == 1 else \
                        tuple([dt.parse(v) for v in values])
                except ValueSyntaxError as exc:
                    raise RequestSyntaxError(
                        f"invalid {attr.datatype} value for attribute {attr.attribute_id} in "
                        f"category {category}{where}: {exc}") from None
            dt_key = canonical(attr.datatype)
            key = (attr.attribute_id, dt_key)
            prev = bags.get(key)
            bags[key] = parsed if prev is None else prev + parsed
            if attr.issuer is not None:
                ikey = (attr.attribute_id, dt_key, attr.issuer)
                bags[ikey] = bags.get(ikey, ()) + parsed
            if attr.include_in_result:
                included.append(ResultAttribute(attr.attribute_id, attr.datatype, attr.values,
                                                attr.issuer))
        result = ResultCategory(category, tuple(included), xml_id) if included else None
        return cls(category, tuple(attributes), content, xml_id, bags, result)

    def included(self) -> ResultCategory | None:
        """The attributes to echo in the Result (IncludeInResult=true), or None."""
        return self.included_result


class Individual:
    """One individual decision request: at most one instance per category (after MDP expansion).

    `bags` maps (category, attribute_id, datatype[, issuer]) to the tuple of parsed values; it is
    the only thing attribute designators look at during evaluation.
    """

    __slots__ = ("instances", "bags", "return_policy_id_list", "content_by_category")

    def __init__(self, instances: Sequence[CategoryInstance], return_policy_id_list: bool) -> None:
        self.instances = tuple(instances)
        bags: dict[tuple, tuple] = {}
        for inst in self.instances:
            cat = inst.category
            for key, values in inst.bags.items():
                bags[(cat,) + key] = values
        self.bags = bags
        self.return_policy_id_list = return_policy_id_list
        self.content_by_category = {i.category: i.content for i in self.instances
                                    if i.content is not None}

    def included_attributes(self) -> tuple[ResultCategory, ...]:
        out = []
        for inst in self.instances:
            inc = inst.included()
            if inc is not None:
                out.append(inc)
        return tuple(out)


class RequestContext:
    """A parsed request: category instances in request order plus the request-level flags."""

    __slots__ = ("instances", "return_policy_id_list", "combined_decision", "_individuals")

    def __init__(self, instances: Sequence[CategoryInstance], return_policy_id_list: bool = False,
                 combined_decision: bool = False) -> None:
        self.instances = tuple(instances)
        self.return_policy_id_list = return_policy_id_list
        self.combined_decision = combined_decision
        self._individuals: tuple[Individual, ...] | None = None
        counts: dict[str, int] = {}
        for inst in self.instances:
            counts[inst.category] = counts.get(inst.category, 0) + 1
        total = 1
        for n in counts.values():
            total *= n
        if total > MAX_INDIVIDUAL_DECISIONS:
            raise UnsupportedRequestError(
                f"the repeated categories ask for {total} individual decisions; at most "
                f"{MAX_INDIVIDUAL_DECISIONS} are allowed in one request")

    @property
    def categories(self) -> tuple[str, ...]:
        """Distinct category URIs, in request order."""
        seen: dict[str, None] = {}
        for inst in self.instances:
            seen.setdefault(inst.category, None)
        return tuple(seen)

    def values(self, category: str, attribute_id: str) -> list[str]:
        """Lexical values of an attribute over every instance of the category (any datatype)."""
        category = normalize_category(category)
        out: list[str] = []
        for inst in self.instances:
            if inst.category == category:
                for attr in inst.attributes:
                    if attr.attribute_id == attribute_id:
                        out.extend(attr.values)
        return out

    def content(self, category: str) -> Any | None:
        category = normalize_category(category)
        for inst in self.instances:
            if inst.category == category and inst.content is not None:
                return inst.content
        return None

    def with_attribute(self, category: str, attribute_id: str, datatype: str,
                       values: Sequence[str]) -> "RequestContext":
        """A copy where the attribute is replaced (or added) in every instance of the category.

        The PEP uses this to bind the authenticated subject: whatever the request claimed for
        that attribute is dropped, under any datatype or issuer.
        """
        category = normalize_category(category)
        datatype = normalize_datatype(datatype)
        new_attr = RequestAttribute(attribute_id, datatype, tuple(values))
        instances = []
        found = False
        for inst in self.instances:
            if inst.category == category:
                found = True
                attrs = [a for a in inst.attributes if a.attribute_id != attribute_id]
                attrs.append(new_attr)
                inst = CategoryInstance.build(category, attrs, inst.content, inst.xml_id)
            instances.append(inst)
        if not found:
            instances.append(CategoryInstance.build(category, [new_attr]))
        return RequestContext(instances, self.return_policy_id_list, self.combined_decision)

    def individuals(self) -> tuple[Individual, ...]:
        """Individual decision requests (Multiple Decision Profile, repeated categories)."""
        if self._individuals is None:
            groups: dict[str, list[CategoryInstance]] = {}
            for inst in self.instances:
                groups.setdefault(inst.category, []).append(inst)
            if all(len(g) == 1 for g in groups.values()):
                self._individuals = (Individual(self.instances, self.return_policy_id_list),)
            else:
                self._individuals = tuple(
                    Individual(combo, self.return_policy_id_list)
                    for combo in itertools.product(*groups.values()))
        return self._individuals


# ---------------------------------------------------------------------------------------------
# Parsing


_MEDIA_KIND = {"application/xacml+xml": "xml", "application/xml": "xml", "text/xml": "xml",
               "application/xacml+json": "json", "application/json": "json"}


def media_kind(media_type: str) -> str:
    """'xml' or 'json' for a Content-Type value (parameters such as charset are ignored)."""
    kind = _MEDIA_KIND.get(media_type)
    if kind is not None:
        return kind
    base = (media_type or "").split(";", 1)[0].strip().lower()
    if base in XML_MEDIA_TYPES or base.endswith("+xml"):
        return "xml"
    if base in JSON_MEDIA_TYPES or base.endswith("+json"):
        return "json"
    raise RequestSyntaxError(f"unsupported media type {media_type!r}: use application/xacml+xml "
                             "or application/xacml+json")


def parse_request(body: bytes, media_type: str) -> RequestContext:
    """Parse an XML or JSON Profile request; raises RequestSyntaxError saying what and where."""
    kind = media_kind(media_type)
    if kind == "xml":
        try:
            root = parse_xml(body)
        except UnsafeDocumentError as exc:
            raise RequestSyntaxError(f"request: {exc}") from None
        return parse_xml_request(root)
    try:
        doc = parse_json(body)
    except UnsafeDocumentError as exc:
        raise RequestSyntaxError(f"request: {exc}") from None
    return parse_json_request(doc)


def _bool_attr(elem: etree._Element, name: str, default: bool = False) -> bool:
    raw = elem.get(name)
    if raw is None:
        return default
    raw = raw.strip()
    if raw in ("true", "1"):
        return True
    if raw in ("false", "0"):
        return False
    raise RequestSyntaxError(f"attribute {name}={raw!r} of <{etree.QName(elem).localname}> is not "
                             f"a boolean (line {elem.sourceline})")


def _local(elem: etree._Element) -> str:
    tag = elem.tag
    if not isinstance(tag, str):
        return ""
    if tag.startswith(_NS):
        return tag[len(_NS):]
    raise RequestSyntaxError(f"unexpected element {tag} (line {elem.sourceline}): "
                             f"expected an element of namespace {XACML_NS}")


def parse_xml_request(root: etree._Element) -> RequestContext:
    if _local(root) != "Request":
        raise RequestSyntaxError(f"root element is <{etree.QName(root).localname}>, expected "
                                 f"<Request> (line {root.sourceline})")
    rpil = _bool_attr(root, "ReturnPolicyIdList")
    combined = _bool_attr(root, "CombinedDecision")
    if combined:
        raise UnsupportedRequestError("CombinedDecision=true is not supported by this PDP")
    instances = []
    for child in root:
        if child.tag == _ATTRIBUTES_TAG:
            instances.append(_parse_xml_attributes(child))
            continue
        name = _local(child)
        if name == "Attributes":
            instances.append(_parse_xml_attributes(child))
        elif name == "RequestDefaults":
            continue  # only carries the XPath version; XPath is not supported anyway
        elif name == "MultiRequests":
            raise UnsupportedRequestError(
                "MultiRequests is not supported; repeat <Attributes> categories instead "
                f"(line {child.sourceline})")
        elif name:
            raise RequestSyntaxError(f"unexpected element <{name}> in <Request> "
                                     f"(line {child.sourceline})")
    return RequestContext(instances, rpil, combined)


def _parse_xml_attributes(elem: etree._Element) -> CategoryInstance:
    category = elem.get("Category")
    if not category:
        raise RequestSyntaxError(f"<Attributes> without Category (line {elem.sourceline})")
    category = normalize_category(category.strip())
    content = None
    attrs: list[RequestAttribute] = []
    for child in elem:
        if child.tag == _ATTRIBUTE_TAG:
            attrs.extend(_parse_xml_attribute(child, category))
            continue
        name = _local(child)
        if name == "Content":
            if content is not None:
                raise RequestSyntaxError(f"more than one <Content> (line {child.sourceline})")
            kids = [c for c in child if isinstance(c.tag, str)]
            if len(kids) != 1:
                raise RequestSyntaxError(f"<Content> must hold exactly one element "
                                         f"(line {child.sourceline})")
            content = kids[0]
        elif name == "Attribute":
            attrs.extend(_parse_xml_attribute(child, category))
        elif name:
            raise RequestSyntaxError(f"unexpected element <{name}> in <Attributes> "
                                     f"(line {child.sourceline})")
    return CategoryInstance.build(category, attrs, content, elem.get(XML_ID),
                                  f" (line {elem.sourceline})")


def _parse_xml_attribute(elem: etree._Element, category: str) -> list[RequestAttribute]:
    attr_id = elem.get("AttributeId")
    if not attr_id:
        raise RequestSyntaxError(f"<Attribute> without AttributeId in category {category} "
                                 f"(line {elem.sourceline})")
    issuer = elem.get("Issuer")
    raw_include = elem.get("IncludeInResult")
    include = False if raw_include is None or raw_include == "false" else \
        _bool_attr(elem, "IncludeInResult")
    pairs: list[tuple[str, str]] = []
    for child in elem:
        if child.tag != _VALUE_TAG:
            name = _local(child)
            if name:
                raise RequestSyntaxError(f"unexpected element <{name}> in <Attribute> "
                                         f"(line {child.sourceline})")
            continue
        datatype = child.get("DataType")
        if not datatype:
            raise RequestSyntaxError(f"<AttributeValue> without DataType for attribute {attr_id} "
                                     f"(line {child.sourceline})")
        if len(child):
            raise RequestSyntaxError(f"structured <AttributeValue> content is not supported for "
                                     f"attribute {attr_id} (line {child.sourceline})")
        pairs.append((datatype, child.text or ""))
    if not pairs:
        raise RequestSyntaxError(f"<Attribute> {attr_id} has no <AttributeValue> "
                                 f"(line {elem.sourceline})")
    first = pairs[0][0]
    if all(dt == first for dt, _ in pairs):  # the usual case: one datatype
        return [RequestAttribute(attr_id, normalize_datatype(first),
                                 tuple(v for _, v in pairs), issuer, include)]
    by_type: dict[str, list[str]] = {}
    for dt, v in pairs:
        by_type.setdefault(normalize_datatype(dt), []).append(v)
    return [RequestAttribute(attr_id, dt, tuple(vals), issuer, include)
            for dt, vals in by_type.items()]


# JSON Profile ---------------------------------------------------------------------------------


def _json_bool(obj: dict, key: str, where: str) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise RequestSyntaxError(f"{where}.{key} must be a JSON boolean, got {value!r}")
    return value


def parse_json_request(doc: Any) -> RequestContext:
    if not isinstance(doc, dict) or not isinstance(doc.get("Request"), dict):
        raise RequestSyntaxError('JSON request must be an object with a "Request" object')
    req = doc["Request"]
    rpil = _json_bool(req, "ReturnPolicyIdList", "Request")
    combined = _json_bool(req, "CombinedDecision", "Request")
    if combined:
        raise UnsupportedRequestError("CombinedDecision=true is not supported by this PDP")
    if "MultiRequests" in req:
        raise UnsupportedRequestError("MultiRequests is not supported; repeat categories instead")
    instances: list[CategoryInstance] = []
    for key, value in req.items():
        if key in ("ReturnPolicyIdList", "CombinedDecision", "XPathVersion"):
            continue
        if key == "Category":
            objs = value if isinstance(value, list) else [value]
            for i, obj in enumerate(objs):
                instances.append(_parse_json_category(obj, None, f"Request.Category[{i}]"))
        elif key in CATEGORY_SHORTHANDS:
            objs = value if isinstance(value, list) else [value]
            for i, obj in enumerate(objs):
                instances.append(_parse_json_category(obj, CATEGORY_SHORTHANDS[key],
                                                      f"Request.{key}[{i}]"))
        else:
            # the name as a quoted literal: it is the client's text, and may hold anything
            # (a lone surrogate from a "\\ud800" escape cannot even be written out as UTF-8)
            raise RequestSyntaxError(f"unknown member Request.{ascii(key)}")
    return RequestContext(instances, rpil, combined)


def _parse_json_category(obj: Any, category: str | None, where: str) -> CategoryInstance:
    if not isinstance(obj, dict):
        raise RequestSyntaxError(f"{where} must be an object")
    cat = obj.get("CategoryId", category)
    if not isinstance(cat, str) or not cat:
        raise RequestSyntaxError(f"{where} has no CategoryId")
    _json_lexical(cat, f"{where}.CategoryId")
    cat = normalize_category(cat)
    attrs_json = obj.get("Attribute", [])
    if isinstance(attrs_json, dict):
        attrs_json = [attrs_json]
    if not isinstance(attrs_json, list):
        raise RequestSyntaxError(f"{where}.Attribute must be an array")
    attrs: list[RequestAttribute] = []
    for i, a in enumerate(attrs_json):
        attrs.append(_parse_json_attribute(a, f"{where}.Attribute[{i}]"))
    content = obj.get("Content")
    xml_id = obj.get("Id")
    if xml_id is not None:
        if not isinstance(xml_id, str):
            raise RequestSyntaxError(f"{where}.Id must be a string")
        _json_lexical(xml_id, f"{where}.Id")
    return CategoryInstance.build(cat, attrs, content, xml_id, f" ({where})")


# Characters XML 1.0 cannot carry: a JSON value must stay renderable in an XML response.
_NON_XML_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _json_lexical(value: Any, where: str) -> tuple[str, str]:
    """Lexical form and inferred datatype of one JSON value."""
    if isinstance(value, bool):
        return ("true" if value else "false"), DATATYPE_SHORTHANDS["boolean"]
    if isinstance(value, int):
        return str(value), DATATYPE_SHORTHANDS["integer"]
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN", DATATYPE_SHORTHANDS["double"]
        if math.isinf(value):
            return ("INF" if value > 0 else "-INF"), DATATYPE_SHORTHANDS["double"]
        return repr(value), DATATYPE_SHORTHANDS["double"]
    if isinstance(value, str):
        bad = _NON_XML_CHARS.search(value)
        if bad:
            raise RequestSyntaxError(f"{where}: value contains the character "
                                     f"U+{ord(bad.group()):04X}, which XACML values cannot hold")
        return value, STRING
    raise RequestSyntaxError(f"{where}: value {json.dumps(value)[:80]} is not a string, number "
                             "or boolean")


def _parse_json_attribute(a: Any, where: str) -> RequestAttribute:
    if not isinstance(a, dict):
        raise RequestSyntaxError(f"{where} must be an object")
    attr_id = a.get("AttributeId")
    if not isinstance(attr_id, str) or not attr_id:
        raise RequestSyntaxError(f"{where} has no AttributeId")
    _json_lexical(attr_id, f"{where}.AttributeId")
    if "Value" not in a:
        raise RequestSyntaxError(f"{where} ({attr_id}) has no Value")
    raw = a["Value"]
    raw_values = raw if isinstance(raw, list) else [raw]
    if not raw_values:
        raise RequestSyntaxError(f"{where} ({attr_id}) has an empty Value array")
    lexicals = [_json_lexical(v, f"{where}.Value") for v in raw_values]
    datatype = a.get("DataType")
    if datatype is None:
        inferred = {dt for _, dt in lexicals}
        if inferred == {DATATYPE_SHORTHANDS["integer"], DATATYPE_SHORTHANDS["double"]}:
            datatype = DATATYPE_SHORTHANDS["double"]
        elif len(inferred) != 1:
            raise RequestSyntaxError(f"{where} ({attr_id}): values of mixed JSON types need an "
                                     "explicit DataType")
        else:
            datatype = inferred.pop()
    elif not isinstance(datatype, str):
        raise RequestSyntaxError(f"{where}.DataType must be a string")
    _json_lexical(datatype, f"{where}.DataType")
    datatype = normalize_datatype(datatype)
    issuer = a.get("Issuer")
    if issuer is not None:
        if not isinstance(issuer, str):
            raise RequestSyntaxError(f"{where}.Issuer must be a string")
        _json_lexical(issuer, f"{where}.Issuer")
    include = _json_bool(a, "IncludeInResult", where)
    return RequestAttribute(attr_id, datatype, tuple(lex for lex, _ in lexicals), issuer, include)


def iter_individuals(requests: Iterable[RequestContext]) -> Iterable[Individual]:
    for r in requests:
        yield from r.individuals()


def bind_subject(ctx: "RequestContext", identity) -> "RequestContext":
    """The request as it is decided: the access subject is the authenticated caller.

    Every access-subject attribute the request brought is dropped (under any id, datatype or
    issuer, in every repeated access-subject element, which collapse into one), and the
    category holds exactly what the gateway knows of the caller: subject-id, roles, and the
    identity's other attributes (`identity.attributes`). Nothing a request claims about its
    subject reaches a decision or an obligation."""
    attributes = [RequestAttribute(SUBJECT_ID, STRING, (identity.subject,)),
                  RequestAttribute(SUBJECT_ROLE, STRING, tuple(identity.roles))]
    for attribute_id, values in getattr(identity, "attributes", ()):
        datatype, lexical = _identity_values(values)
        attributes.append(RequestAttribute(attribute_id, datatype, lexical))
    others = [inst for inst in ctx.instances if inst.category != ACCESS_SUBJECT]
    subject = CategoryInstance.build(ACCESS_SUBJECT, attributes)
    return RequestContext([subject, *others], ctx.return_policy_id_list, ctx.combined_decision)


CURRENT_TIME_IDS = frozenset({CURRENT_TIME, CURRENT_DATE, CURRENT_DATETIME})
GATEWAY_ENVIRONMENT_PREFIX = "urn:xsg:"


def bind_environment(ctx: "RequestContext",
                     attributes: Sequence[tuple[str, str, Sequence[str]]] = ()) -> "RequestContext":
    """The request as it is decided: the environment's clock and the gateway's own environment
    attributes are the gateway's, whatever the request claimed.

    Dropped from the request: current-time, current-date and current-dateTime (the PDP then
    reads its own clock) and every attribute under `urn:xsg:`; added: `attributes`, as
    (attribute id, datatype, lexical values), e.g. the state of stream events."""
    kept = []
    for inst in ctx.instances:
        if inst.category == ENVIRONMENT:
            attrs = [a for a in inst.attributes if a.attribute_id not in CURRENT_TIME_IDS
                     and not a.attribute_id.startswith(GATEWAY_ENVIRONMENT_PREFIX)]
            inst = CategoryInstance.build(ENVIRONMENT, attrs, inst.content, inst.xml_id)
        kept.append(inst)
    ctx = RequestContext(kept, ctx.return_policy_id_list, ctx.combined_decision)
    for attribute_id, datatype, values in attributes:
        ctx = ctx.with_attribute(ENVIRONMENT, attribute_id, datatype, list(values))
    return ctx


JOIN_WITH = "urn:xsg:resource:join-with"
GATEWAY_RESOURCE_PREFIX = "urn:xsg:"


def bind_join(ctx: "RequestContext", other: str | None = None) -> "RequestContext":
    """The request as it is decided: which stream it is joined with is the gateway's to say.

    Dropped from the request: every resource attribute under `urn:xsg:` (a request for a stream
    alone could otherwise claim to be part of a join and meet a grant given only for joins);
    added, when the request is one side of a join: `urn:xsg:resource:join-with`, the other
    stream's name. A policy grants a stream only in a join with another by matching it."""
    kept = []
    for inst in ctx.instances:
        if inst.category == RESOURCE:
            attrs = [a for a in inst.attributes
                     if not a.attribute_id.startswith(GATEWAY_RESOURCE_PREFIX)]
            inst = CategoryInstance.build(RESOURCE, attrs, inst.content, inst.xml_id)
        kept.append(inst)
    ctx = RequestContext(kept, ctx.return_policy_id_list, ctx.combined_decision)
    if other is not None:
        ctx = ctx.with_attribute(RESOURCE, JOIN_WITH, STRING, [other])
    return ctx


def _identity_values(values) -> tuple[str, tuple[str, ...]]:
    """XACML datatype and lexical forms of an identity attribute's values (one Python type)."""
    first = values[0] if values else ""
    if isinstance(first, bool):
        return DATATYPE_SHORTHANDS["boolean"], tuple("true" if v else "false" for v in values)
    if isinstance(first, int):
        return DATATYPE_SHORTHANDS["integer"], tuple(str(int(v)) for v in values)
    if isinstance(first, float):
        return DATATYPE_SHORTHANDS["double"], tuple(repr(float(v)) for v in values)
    return STRING, tuple(str(v) for v in values)
