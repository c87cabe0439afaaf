"""Which form a request body is in (by its media type), and its parsing into the model."""
from __future__ import annotations

from common.xmlsafe import UnsafeDocumentError, parse_json, parse_xml
from pdp.errors import RequestSyntaxError
from pdp.request.json_form import parse_json_request
from pdp.request.model import RequestContext
from pdp.request.xml_form import parse_xml_request

XML_MEDIA_TYPES = frozenset({"application/xacml+xml", "application/xml", "text/xml"})
JSON_MEDIA_TYPES = frozenset({"application/xacml+json", "application/json"})

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
