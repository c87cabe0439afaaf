"""The XML form of a request (XACML 3.0 core schema) into the request model."""
from __future__ import annotations

from lxml import etree

from pdp.errors import RequestSyntaxError
from pdp.request.model import (
    CategoryInstance,
    RequestAttribute,
    RequestContext,
    UnsupportedRequestError,
    normalize_category,
    normalize_datatype,
)
from pdp.urns import XACML_NS

_NS = f"{{{XACML_NS}}}"
XML_ID = "{http://www.w3.org/XML/1998/namespace}id"
_ATTRIBUTES_TAG = _NS + "Attributes"
_ATTRIBUTE_TAG = _NS + "Attribute"
_VALUE_TAG = _NS + "AttributeValue"


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
