"""Canonical cache keys: one key for every spelling of the same stream request by the same caller.

Two requests share a key only when the gateway must treat them alike, so the canonical form
forgets exactly what XACML says carries no meaning, and keeps everything else:

* forgotten: XML vs JSON Profile, namespace prefixes, attribute order inside a category, whether
  a bag's values sit in one `Attribute` or several, JSON Profile shorthands (`AccessSubject`,
  `string`) vs full URIs, indentation (whitespace-only text between XML elements), comments,
  the order of unrelated categories, key order of JSON objects;
* kept: the exact text of every value (a string's spaces are data), the order of values inside a
  bag and of repeated categories (the PEP may read "the first value"), issuers, IncludeInResult,
  the request flags, and `Content`.

Anything the canonicaliser does not fully understand (an unknown element or member, a DOCTYPE, an
oversized or too deeply nested document, broken syntax, an unexpected multipart part) raises
`NotCacheable`: the proxy then passes the request through uncached, and the gateway gives the
precise error. A miss costs one upstream call; a wrong hit would hand out another request's handle.

The caller's identity enters the key as a keyed hash of the bearer token: the gateway binds the
subject to the token, so the same token always means the same subject, and the proxy never needs
to know who that is. Two tokens of one subject get different keys (a miss, never a leak).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
from typing import Any, TypedDict

from lxml import etree

from common.xmlsafe import UnsafeDocumentError, parse_json, parse_xml

XACML_NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
_NS = f"{{{XACML_NS}}}"
XML_ID = "{http://www.w3.org/XML/1998/namespace}id"
XSI_SCHEMA_LOCATION = "{http://www.w3.org/2001/XMLSchema-instance}schemaLocation"
KEY_VERSION = "xsg-proxy-key/1"

MAX_BYTES = 1024 * 1024
MAX_DEPTH = 64

_XS = "http://www.w3.org/2001/XMLSchema#"
_DATATYPES = {name: _XS + name for name in (
    "string", "boolean", "integer", "double", "time", "date", "dateTime", "dayTimeDuration",
    "yearMonthDuration", "anyURI", "hexBinary", "base64Binary")}
_DATATYPES.update({
    "rfc822Name": "urn:oasis:names:tc:xacml:1.0:data-type:rfc822Name",
    "x500Name": "urn:oasis:names:tc:xacml:1.0:data-type:x500Name",
    "ipAddress": "urn:oasis:names:tc:xacml:2.0:data-type:ipAddress",
    "dnsName": "urn:oasis:names:tc:xacml:2.0:data-type:dnsName",
    "xpathExpression": "urn:oasis:names:tc:xacml:3.0:data-type:xpathExpression",
})
_CATEGORIES = {
    "AccessSubject": "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject",
    "Resource": "urn:oasis:names:tc:xacml:3.0:attribute-category:resource",
    "Action": "urn:oasis:names:tc:xacml:3.0:attribute-category:action",
    "Environment": "urn:oasis:names:tc:xacml:3.0:attribute-category:environment",
    "RecipientSubject": "urn:oasis:names:tc:xacml:1.0:subject-category:recipient-subject",
    "IntermediarySubject": "urn:oasis:names:tc:xacml:1.0:subject-category:intermediary-subject",
    "Codebase": "urn:oasis:names:tc:xacml:1.0:subject-category:codebase",
    "RequestingMachine": "urn:oasis:names:tc:xacml:1.0:subject-category:requesting-machine",
}


class NotCacheable(ValueError):
    """The request cannot be put in canonical form; it is forwarded uncached."""


# The canonical forms are JSON-able values hashed into the key (`cache_key`): nested lists of
# texts, flags and the JSON Profile's values. Decoded JSON, before it is checked, is `Any`.
Canon = list[object]


class CanonicalCategory(TypedDict):
    """One category instance: its attributes grouped in bags, [id, data type, issuer,
    IncludeInResult, [values...]], in a stable order."""

    category: str
    id: str | None
    content: Canon | None
    attributes: list[Canon]


class CanonicalRequest(TypedDict):
    """A request document in canonical form: its flags and its categories (see the module
    docstring for what is kept and what is forgotten)."""

    flags: dict[str, object]
    categories: list[CanonicalCategory]


# (AttributeId, DataType, Issuer, IncludeInResult, value) of one attribute value
AttributeValue = tuple[str, str, str, bool, object]


# -- identity ----------------------------------------------------------------------------------

def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def subject_key(authorization: str | None, salt: bytes) -> str:
    """Keyed hash of the bearer token; raises NotCacheable without one (the gateway answers 401)."""
    token = bearer_token(authorization)
    if token is None:
        raise NotCacheable("no bearer token")
    return hmac.new(salt, token.encode("utf-8"), hashlib.sha256).hexdigest()


# -- documents ---------------------------------------------------------------------------------

def media_kind(content_type: str | None, body: bytes) -> str:
    """'xml' or 'json' from the media type, or by the first character when none is given."""
    base = (content_type or "").split(";", 1)[0].strip().lower()
    if base in ("application/xacml+xml", "application/xml", "text/xml") or base.endswith("+xml"):
        return "xml"
    if base in ("application/xacml+json", "application/json") or base.endswith("+json"):
        return "json"
    if base in ("", "text/plain", "application/octet-stream"):
        head = body.lstrip()[:1]
        if head == b"<":
            return "xml"
        if head in (b"{", b"["):
            return "json"
    raise NotCacheable(f"unsupported media type {content_type!r}")


def _xml(body: bytes) -> etree._Element:
    try:
        return parse_xml(body, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH)
    except UnsafeDocumentError as exc:
        raise NotCacheable(f"XML: {exc}") from None


def _json(body: bytes | str) -> Any:
    try:
        return parse_json(body, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH)
    except UnsafeDocumentError as exc:
        raise NotCacheable(f"JSON: {exc}") from None


def xml_tree(elem: etree._Element) -> Canon:
    """Prefix-free, attribute-order-free, indentation-free form of an element."""
    attrs = sorted([str(k), v] for k, v in elem.attrib.items())
    out: Canon = [str(elem.tag), attrs]
    if elem.text and elem.text.strip():
        out.append(["#text", elem.text])
    for child in elem:
        if not isinstance(child.tag, str):
            continue  # comments and PIs are removed by the parser; entities cannot occur
        out.append(xml_tree(child))
        if child.tail and child.tail.strip():
            out.append(["#text", child.tail])
    return out


def _content(value: Any) -> Canon:
    if isinstance(value, etree._Element):
        return ["xml", xml_tree(value)]
    if isinstance(value, str):
        if value.lstrip().startswith("<"):
            return ["xml", xml_tree(_xml(value.encode("utf-8")))]
        return ["text", value]
    if isinstance(value, (dict, list)):
        return ["json", value]
    raise NotCacheable("Content must be XML, a string or a JSON object")


# -- the XACML request -------------------------------------------------------------------------

def _instance(category: str, xml_id: str | None, content: Canon | None,
              attributes: list[AttributeValue]) -> CanonicalCategory:
    bags: dict[tuple[str, str, str, bool], list[object]] = {}
    for attr_id, datatype, issuer, include, value in attributes:
        bags.setdefault((attr_id, datatype, issuer, include), []).append(value)
    return {"category": category, "id": xml_id, "content": content,
            "attributes": [[*k, v] for k, v in sorted(bags.items(), key=lambda kv: kv[0])]}


def _finish(instances: list[CanonicalCategory], flags: dict[str, object]
            ) -> CanonicalRequest:
    # Stable sort: unrelated categories lose their order, repeated ones keep theirs.
    return {"flags": flags, "categories": sorted(instances, key=lambda i: i["category"])}


def _local(elem: etree._Element, where: str) -> str:
    tag = elem.tag
    if not isinstance(tag, str) or not tag.startswith(_NS):
        raise NotCacheable(f"unexpected element {tag} in {where}")
    return tag[len(_NS):]


def _xml_bool(elem: etree._Element, name: str) -> bool:
    raw = (elem.get(name) or "false").strip()
    if raw in ("true", "1"):
        return True
    if raw in ("false", "0"):
        return False
    raise NotCacheable(f"{name}={raw!r} is not a boolean")


def canonical_xml_request(root: etree._Element) -> CanonicalRequest:
    if _local(root, "document") != "Request":
        raise NotCacheable("root element is not <Request>")
    unknown = set(root.attrib) - {"ReturnPolicyIdList", "CombinedDecision", XSI_SCHEMA_LOCATION}
    if unknown:
        raise NotCacheable(f"unknown attributes on <Request>: {sorted(unknown)}")
    if root.text and root.text.strip():
        raise NotCacheable("text inside <Request>")
    flags: dict[str, object] = {"ReturnPolicyIdList": _xml_bool(root, "ReturnPolicyIdList"),
                             "CombinedDecision": _xml_bool(root, "CombinedDecision")}
    instances: list[CanonicalCategory] = []
    for child in root:
        name = _local(child, "<Request>")
        if name == "Attributes":
            instances.append(_xml_attributes(child))
        elif name == "RequestDefaults":
            flags["RequestDefaults"] = xml_tree(child)
        else:
            raise NotCacheable(f"<{name}> in <Request> is not cached")
    return _finish(instances, flags)


def _xml_attributes(elem: etree._Element) -> CanonicalCategory:
    category = (elem.get("Category") or "").strip()
    if not category or set(elem.attrib) - {"Category", XML_ID}:
        raise NotCacheable("<Attributes> without Category or with unknown attributes")
    content: Canon | None = None
    attributes: list[AttributeValue] = []
    for child in elem:
        name = _local(child, "<Attributes>")
        if name == "Content":
            kids = [k for k in child if isinstance(k.tag, str)]
            if content is not None or len(kids) != 1:
                raise NotCacheable("<Content> must appear once and hold one element")
            content = ["xml", xml_tree(kids[0])]
        elif name == "Attribute":
            attributes.extend(_xml_attribute(child))
        else:
            raise NotCacheable(f"<{name}> in <Attributes>")
    return _instance(_CATEGORIES.get(category, category), elem.get(XML_ID), content, attributes)


def _xml_attribute(elem: etree._Element) -> list[AttributeValue]:
    attr_id = elem.get("AttributeId")
    if not attr_id or set(elem.attrib) - {"AttributeId", "Issuer", "IncludeInResult"}:
        raise NotCacheable("<Attribute> without AttributeId or with unknown attributes")
    issuer = elem.get("Issuer") or ""
    include = _xml_bool(elem, "IncludeInResult")
    out: list[AttributeValue] = []
    for child in elem:
        if _local(child, "<Attribute>") != "AttributeValue" or len(child):
            raise NotCacheable("<Attribute> may hold only simple <AttributeValue> elements")
        datatype = child.get("DataType")
        if not datatype:
            raise NotCacheable("<AttributeValue> without DataType")
        extras = sorted([str(k), v] for k, v in child.attrib.items() if k != "DataType")
        value: object = child.text or ""
        if extras:
            value = [value, extras]
        out.append((attr_id, _DATATYPES.get(datatype, datatype), issuer, include, value))
    if not out:
        raise NotCacheable(f"<Attribute> {attr_id} has no value")
    return out


def _json_flag(obj: dict[str, Any], key: str) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise NotCacheable(f"{key} must be a JSON boolean")
    return value


def canonical_json_request(doc: Any) -> CanonicalRequest:
    if not isinstance(doc, dict) or set(doc) != {"Request"} or not isinstance(doc["Request"], dict):
        raise NotCacheable('JSON request must be exactly {"Request": {...}}')
    req = doc["Request"]
    flags: dict[str, object] = {"ReturnPolicyIdList": _json_flag(req, "ReturnPolicyIdList"),
                             "CombinedDecision": _json_flag(req, "CombinedDecision")}
    if "XPathVersion" in req:
        flags["RequestDefaults"] = ["json-xpath-version", req["XPathVersion"]]
    instances: list[CanonicalCategory] = []
    for key, value in req.items():
        if key in ("ReturnPolicyIdList", "CombinedDecision", "XPathVersion"):
            continue
        if key != "Category" and key not in _CATEGORIES:
            raise NotCacheable(f"Request.{key} is not cached")
        for obj in value if isinstance(value, list) else [value]:
            instances.append(_json_category(obj, _CATEGORIES.get(key)))
    return _finish(instances, flags)


def _json_category(obj: Any, category: str | None) -> CanonicalCategory:
    if not isinstance(obj, dict) or set(obj) - {"CategoryId", "Attribute", "Content", "Id"}:
        raise NotCacheable("category must be an object with CategoryId, Attribute, Content, Id")
    cat = obj.get("CategoryId", category)
    if not isinstance(cat, str) or not cat:
        raise NotCacheable("category without CategoryId")
    xml_id = obj.get("Id")
    if xml_id is not None and not isinstance(xml_id, str):
        raise NotCacheable("category Id must be a string")
    attrs = obj.get("Attribute", [])
    attrs = [attrs] if isinstance(attrs, dict) else attrs
    if not isinstance(attrs, list):
        raise NotCacheable("Attribute must be an array")
    out: list[AttributeValue] = []
    for a in attrs:
        out.extend(_json_attribute(a))
    content = _content(obj["Content"]) if obj.get("Content") is not None else None
    return _instance(_CATEGORIES.get(cat, cat.strip()), xml_id, content, out)


def _lexical(value: Any) -> tuple[str, str]:
    if isinstance(value, bool):
        return ("true" if value else "false"), _DATATYPES["boolean"]
    if isinstance(value, int):
        return str(value), _DATATYPES["integer"]
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise NotCacheable("non-finite JSON number")
        return repr(value), _DATATYPES["double"]
    if isinstance(value, str):
        return value, _DATATYPES["string"]
    raise NotCacheable("attribute values must be strings, numbers or booleans")


def _json_attribute(a: Any) -> list[AttributeValue]:
    if not isinstance(a, dict) or set(a) - {"AttributeId", "Value", "DataType", "Issuer",
                                             "IncludeInResult"}:
        raise NotCacheable("attribute must be an object with the JSON Profile members")
    attr_id = a.get("AttributeId")
    if not isinstance(attr_id, str) or not attr_id or "Value" not in a:
        raise NotCacheable("attribute without AttributeId or Value")
    raw = a["Value"] if isinstance(a["Value"], list) else [a["Value"]]
    if not raw:
        raise NotCacheable(f"attribute {attr_id} has no value")
    lexicals = [_lexical(v) for v in raw]
    datatype = a.get("DataType")
    if datatype is None:
        kinds = {dt for _, dt in lexicals}
        if kinds == {_DATATYPES["integer"], _DATATYPES["double"]}:
            datatype = _DATATYPES["double"]
        elif len(kinds) == 1:
            datatype = kinds.pop()
        else:
            raise NotCacheable(f"attribute {attr_id} mixes JSON types without DataType")
    elif not isinstance(datatype, str):
        raise NotCacheable("DataType must be a string")
    issuer = a.get("Issuer")
    if issuer is not None and not isinstance(issuer, str):
        raise NotCacheable("Issuer must be a string")
    include = _json_flag(a, "IncludeInResult")
    datatype = _DATATYPES.get(datatype, datatype)
    return [(attr_id, datatype, issuer or "", include, lex) for lex, _ in lexicals]


def canonical_request(body: bytes, content_type: str | None) -> CanonicalRequest:
    """Canonical form of one XACML request document (XML or JSON Profile)."""
    if len(body) > MAX_BYTES:
        raise NotCacheable(f"request of {len(body)} bytes is over {MAX_BYTES}")
    if media_kind(content_type, body) == "xml":
        return canonical_xml_request(_xml(body))
    return canonical_json_request(_json(body))


def canonical_query(body: bytes, content_type: str | None) -> Canon:
    """Canonical form of a user query sent beside the request: XML, JSON, or trimmed text."""
    if len(body) > MAX_BYTES:
        raise NotCacheable(f"query of {len(body)} bytes is over {MAX_BYTES}")
    try:
        kind = media_kind(content_type, body)
    except NotCacheable:
        try:
            return ["text", body.decode("utf-8").strip()]
        except UnicodeDecodeError:
            raise NotCacheable("user query is neither XML, JSON nor UTF-8 text") from None
    if kind == "xml":
        return ["xml", xml_tree(_xml(body))]
    return ["json", _json(body)]


RESOURCE_ID = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"


def resource_ids(request: CanonicalRequest) -> frozenset[str]:
    """The resource-id values (category resource, data type string) of a canonical request:
    the streams it asks for, whose policies decide it."""
    found: set[object] = set()
    for instance in request.get("categories", ()):
        if instance.get("category") != _CATEGORIES["Resource"]:
            continue
        for attr_id, datatype, _issuer, _include, values in instance.get("attributes", ()):
            # a bag's values are a list (`_instance`); a value with extra XML attributes is
            # [value, extras]
            if attr_id == RESOURCE_ID and datatype == _DATATYPES["string"] \
                    and isinstance(values, list):
                found.update(v[0] if isinstance(v, list) else v for v in values)
    return frozenset(v for v in found if isinstance(v, str))


def cache_key(subject: str, path: str, args: list[tuple[str, str]], request: CanonicalRequest,
              query: Canon | None) -> str:
    """The key: version, subject hash, path (as the client sent it, undecoded), sorted
    query-string, canonical request and query."""
    material = [KEY_VERSION, subject, path, sorted(args), request, query]
    text = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()
