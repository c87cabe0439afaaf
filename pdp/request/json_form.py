"""The JSON Profile form of a request (XACML JSON Profile 1.1) into the request model."""
from __future__ import annotations

import json
import math
import re
from typing import Any

from pdp.errors import RequestSyntaxError
from pdp.request.model import (
    CATEGORY_SHORTHANDS,
    DATATYPE_SHORTHANDS,
    STRING,
    CategoryInstance,
    RequestAttribute,
    RequestContext,
    UnsupportedRequestError,
    normalize_category,
    normalize_datatype,
)


def _json_bool(obj: dict[str, Any], key: str, where: str) -> bool:
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
