"""Render a Response as XACML 3.0 XML or as the XACML JSON Profile.

Values stay in their XACML lexical form in both formats (the JSON Profile allows native JSON
numbers and booleans, but strings keep doubles such as NaN and INF exact).
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import NotRequired, TypedDict

from lxml import etree

from pdp.request import XACML_NS, XML_ID, media_kind
from pdp.results import (
    AttributeAssignment,
    MissingAttributeDetail,
    Obligation,
    PolicyIdentifier,
    Response,
    Result,
    ResultAttribute,
    ResultCategory,
    Status,
)

XML_MEDIA_TYPE = "application/xacml+xml"
JSON_MEDIA_TYPE = "application/xacml+json"

_NS = f"{{{XACML_NS}}}"
_NON_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def render_response(response: Response, media_type: str) -> bytes:
    """Serialize a Response; media_type decides XML or JSON (as for requests)."""
    if media_kind(media_type) == "json":
        # A status message may quote what the client sent, lone surrogates included (a JSON
        # escape such as "\\ud800" decodes to one). UTF-8 cannot carry them: they are written
        # back as the JSON escapes they came as, which is what "backslashreplace" produces
        # inside a JSON string (and json.dumps puts raw characters nowhere else).
        text = json.dumps(response_to_json(response), ensure_ascii=False)
        return text.encode("utf-8", "backslashreplace")
    data: bytes = etree.tostring(response_to_xml(response), xml_declaration=True, encoding="UTF-8")
    return data


# ----------------------------------------------------------------------------- XML


def _sub(parent: etree._Element, name: str, attrib: Mapping[str, str | None] | None = None,
         text: str | None = None) -> etree._Element:
    attrs = {k: v for k, v in (attrib or {}).items() if v is not None}
    try:
        elem = etree.SubElement(parent, _NS + name, attrs)
    except ValueError:
        elem = etree.SubElement(parent, _NS + name,
                                {k: _NON_XML.sub("\ufffd", v) for k, v in attrs.items()})
    if text is not None:
        try:
            elem.text = text
        except ValueError:  # a character XML cannot carry: never fail the whole response
            elem.text = _NON_XML.sub("\ufffd", text)
    return elem


def response_to_xml(response: Response) -> etree._Element:
    root = etree.Element(_NS + "Response", nsmap={None: XACML_NS})
    for result in response.results:
        _result_xml(root, result)
    return root


def _status_xml(parent: etree._Element, status: Status) -> None:
    st = _sub(parent, "Status")
    code = _sub(st, "StatusCode", {"Value": status.code})
    for sub in status.subcodes:
        code = _sub(code, "StatusCode", {"Value": sub})
    if status.message:
        _sub(st, "StatusMessage", text=status.message)
    if status.missing_attributes:
        detail = _sub(st, "StatusDetail")
        for m in status.missing_attributes:
            _sub(detail, "MissingAttributeDetail", {"Category": m.category,
                                                    "AttributeId": m.attribute_id,
                                                    "DataType": m.datatype, "Issuer": m.issuer})


def _obligation_xml(parent: etree._Element, name: str, id_attr: str, ob: Obligation) -> None:
    el = _sub(parent, name, {id_attr: ob.id})
    for a in ob.assignments:
        _sub(el, "AttributeAssignment", {"AttributeId": a.attribute_id, "DataType": a.datatype,
                                         "Category": a.category, "Issuer": a.issuer}, a.value)


def _result_xml(root: etree._Element, result: Result) -> None:
    res = _sub(root, "Result")
    _sub(res, "Decision", text=result.decision.value)
    _status_xml(res, result.status)
    if result.obligations:
        obs = _sub(res, "Obligations")
        for ob in result.obligations:
            _obligation_xml(obs, "Obligation", "ObligationId", ob)
    if result.advice:
        adv = _sub(res, "AssociatedAdvice")
        for ad in result.advice:
            _obligation_xml(adv, "Advice", "AdviceId", ad)
    for cat in result.attributes:
        attrs = _sub(res, "Attributes", {"Category": cat.category})
        if cat.id:
            attrs.set(XML_ID, cat.id)
        for a in cat.attributes:
            at = _sub(attrs, "Attribute", {"AttributeId": a.attribute_id,
                                           "IncludeInResult": "true", "Issuer": a.issuer})
            for v in a.values:
                _sub(at, "AttributeValue", {"DataType": a.datatype}, v)
    if result.policy_identifiers is not None:
        pil = _sub(res, "PolicyIdentifierList")
        for p in result.policy_identifiers:
            _sub(pil, "PolicySetIdReference" if p.is_policy_set else "PolicyIdReference",
                 {"Version": p.version}, p.id)


# ----------------------------------------------------------------------------- JSON
# The shapes of the JSON Profile's Response, as rendered here (optional members are left out
# rather than null; the members keep the order in which they are written below).


class StatusCodeJson(TypedDict):
    Value: str
    StatusCode: NotRequired[StatusCodeJson]  # a subcode


class MissingAttributeDetailJson(TypedDict):
    Category: str
    AttributeId: str
    DataType: str
    Issuer: NotRequired[str]


class StatusDetailJson(TypedDict):
    MissingAttributeDetail: list[MissingAttributeDetailJson]


class StatusJson(TypedDict):
    StatusCode: StatusCodeJson
    StatusMessage: NotRequired[str]
    StatusDetail: NotRequired[StatusDetailJson]


class AttributeAssignmentJson(TypedDict):
    AttributeId: str
    Value: str
    DataType: str
    Category: NotRequired[str]
    Issuer: NotRequired[str]


class ObligationJson(TypedDict):  # an Obligation or an Advice
    Id: str
    AttributeAssignment: NotRequired[list[AttributeAssignmentJson]]


class AttributeJson(TypedDict):
    AttributeId: str
    Value: list[str]
    DataType: str
    Issuer: NotRequired[str]
    IncludeInResult: bool


class CategoryJson(TypedDict):
    CategoryId: str
    Id: NotRequired[str]
    Attribute: list[AttributeJson]


class PolicyReferenceJson(TypedDict):
    Id: str
    Version: str


# {"PolicyIdReference" or "PolicySetIdReference": [reference, ...]}, kinds in order of appearance
PolicyIdentifierListJson = dict[str, list[PolicyReferenceJson]]


class ResultJson(TypedDict):
    Decision: str
    Status: StatusJson
    Obligations: NotRequired[list[ObligationJson]]
    AssociatedAdvice: NotRequired[list[ObligationJson]]
    Category: NotRequired[list[CategoryJson]]
    PolicyIdentifierList: NotRequired[PolicyIdentifierListJson]


class ResponseJson(TypedDict):
    Response: list[ResultJson]


def _status_json(status: Status) -> StatusJson:
    code: StatusCodeJson = {"Value": status.code}
    inner = code
    for sub in status.subcodes:
        nxt: StatusCodeJson = {"Value": sub}
        inner["StatusCode"] = nxt
        inner = nxt
    out: StatusJson = {"StatusCode": code}
    if status.message:
        out["StatusMessage"] = status.message
    if status.missing_attributes:
        out["StatusDetail"] = {"MissingAttributeDetail": [
            _missing_json(m) for m in status.missing_attributes]}
    return out


def _missing_json(m: MissingAttributeDetail) -> MissingAttributeDetailJson:
    out: MissingAttributeDetailJson = {"Category": m.category, "AttributeId": m.attribute_id,
                                       "DataType": m.datatype}
    if m.issuer is not None:
        out["Issuer"] = m.issuer
    return out


def _assignment_json(a: AttributeAssignment) -> AttributeAssignmentJson:
    out: AttributeAssignmentJson = {"AttributeId": a.attribute_id, "Value": a.value,
                                    "DataType": a.datatype}
    if a.category is not None:
        out["Category"] = a.category
    if a.issuer is not None:
        out["Issuer"] = a.issuer
    return out


def _obligation_json(ob: Obligation) -> ObligationJson:
    out: ObligationJson = {"Id": ob.id}
    if ob.assignments:
        out["AttributeAssignment"] = [_assignment_json(a) for a in ob.assignments]
    return out


def _attribute_json(a: ResultAttribute) -> AttributeJson:
    if a.issuer is None:
        return {"AttributeId": a.attribute_id, "Value": list(a.values), "DataType": a.datatype,
                "IncludeInResult": True}
    return {"AttributeId": a.attribute_id, "Value": list(a.values), "DataType": a.datatype,
            "Issuer": a.issuer, "IncludeInResult": True}


def _category_json(cat: ResultCategory) -> CategoryJson:
    if cat.id:
        return {"CategoryId": cat.category, "Id": cat.id,
                "Attribute": [_attribute_json(a) for a in cat.attributes]}
    return {"CategoryId": cat.category, "Attribute": [_attribute_json(a) for a in cat.attributes]}


def _policy_ids_json(ids: tuple[PolicyIdentifier, ...]) -> PolicyIdentifierListJson:
    out: PolicyIdentifierListJson = {}
    for p in ids:
        key = "PolicySetIdReference" if p.is_policy_set else "PolicyIdReference"
        out.setdefault(key, []).append({"Id": p.id, "Version": p.version})
    return out


def result_to_json(result: Result) -> ResultJson:
    out: ResultJson = {"Decision": result.decision.value, "Status": _status_json(result.status)}
    if result.obligations:
        out["Obligations"] = [_obligation_json(o) for o in result.obligations]
    if result.advice:
        out["AssociatedAdvice"] = [_obligation_json(a) for a in result.advice]
    if result.attributes:
        out["Category"] = [_category_json(c) for c in result.attributes]
    if result.policy_identifiers is not None:
        out["PolicyIdentifierList"] = _policy_ids_json(result.policy_identifiers)
    return out


def response_to_json(response: Response) -> ResponseJson:
    return {"Response": [result_to_json(r) for r in response.results]}


__all__ = ["render_response", "response_to_xml", "response_to_json", "result_to_json",
           "XML_MEDIA_TYPE", "JSON_MEDIA_TYPE", "ResponseJson", "ResultJson"]
