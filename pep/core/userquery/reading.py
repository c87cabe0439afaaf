"""Which form a query is in (the media type, or its first character) and where it sits (beside
the request, or in the XACML request's resource Content)."""
from __future__ import annotations

from lxml import etree

from pep.core.userquery.json_form import parse_json_query, query_from_json
from pep.core.userquery.model import UserQuery, UserQueryError
from pep.core.userquery.xml_form import parse_xml_query, query_from_element


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


def query_from_content(content: object) -> UserQuery:
    """The query carried in a XACML request's resource Content (an element, JSON value or text)."""
    if isinstance(content, etree._Element):
        return query_from_element(content)
    if isinstance(content, str):
        return parse_user_query(content)
    return query_from_json(content)
