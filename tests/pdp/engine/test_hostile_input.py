"""Hostile XML and JSON: nothing expands, nothing is fetched, limits hold, errors say where."""
from __future__ import annotations

import pytest

from common.xmlsafe import UnsafeDocumentError, parse_json, parse_xml
from pdp.engine import PolicyEngine, PolicySource, inspect_policy
from pdp.errors import PolicyLoadError, RequestSyntaxError
from pdp.request import parse_request
from pdp.results import STATUS_SYNTAX_ERROR, Decision

from ._gen import request_xml, simple_policy

BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17">&lol9;</Request>"""

XXE = b"""<?xml version="1.0"?>
<!DOCTYPE r [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" ReturnPolicyIdList="false"
 CombinedDecision="false"><Attributes
   Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource">
 <Attribute AttributeId="x" IncludeInResult="true"><AttributeValue
  DataType="http://www.w3.org/2001/XMLSchema#string">&xxe;</AttributeValue></Attribute>
 </Attributes></Request>"""


def test_billion_laughs_is_refused_without_expansion():
    with pytest.raises(UnsafeDocumentError, match="DOCTYPE"):
        parse_xml(BILLION_LAUGHS)


def test_external_entity_is_refused_and_never_read():
    with pytest.raises(RequestSyntaxError, match="DOCTYPE") as info:
        parse_request(XXE, "application/xacml+xml")
    assert "root:" not in str(info.value)


def test_external_entity_in_utf16_is_refused():
    with pytest.raises(UnsafeDocumentError, match="DOCTYPE"):
        parse_xml(XXE.replace(b'<?xml version="1.0"?>', b"").decode().encode("utf-16"))


def test_plain_doctype_is_refused():
    with pytest.raises(UnsafeDocumentError, match="DOCTYPE"):
        parse_xml(b'<!DOCTYPE Request SYSTEM "http://example.com/x.dtd"><Request/>')


def test_deep_nesting_is_refused_with_a_line():
    doc = b"<a>\n" * 200 + b"</a>" * 200
    with pytest.raises(UnsafeDocumentError, match="deeper than 100") as info:
        parse_xml(doc)
    assert info.value.line == 101


def test_nesting_at_the_limit_is_accepted():
    assert parse_xml(b"<a>" * 100 + b"</a>" * 100).tag == "a"


def test_oversized_document_is_refused_before_parsing():
    big = b"<a>" + b"x" * (20 * 1024 * 1024) + b"</a>"
    with pytest.raises(UnsafeDocumentError, match="over the limit"):
        parse_xml(big)
    with pytest.raises(UnsafeDocumentError, match="over the limit"):
        parse_json(b'"' + b"x" * (20 * 1024 * 1024) + b'"')


def test_size_limit_is_configurable():
    with pytest.raises(UnsafeDocumentError):
        parse_xml(b"<a>hello</a>", max_bytes=5)


def test_malformed_xml_reports_the_line():
    with pytest.raises(UnsafeDocumentError) as info:
        parse_xml(b"<Request>\n<Attributes>\n</Request>")
    assert info.value.line == 3
    assert "line 3" in str(info.value)


def test_deep_json_is_refused():
    with pytest.raises(UnsafeDocumentError, match="deeper than 100"):
        parse_json(b"[" * 200 + b"]" * 200)
    with pytest.raises(UnsafeDocumentError, match="deeper than 100"):
        parse_json(b"[" * 100000 + b"]" * 100000)


def test_brackets_inside_json_strings_do_not_count():
    assert parse_json('{"a": "' + "[" * 500 + '"}') == {"a": "[" * 500}


def test_malformed_json_reports_line_and_column():
    with pytest.raises(UnsafeDocumentError) as info:
        parse_json(b'{"Request":\n {"Category": [,]}}')
    assert info.value.line == 2 and "column" in str(info.value)


def test_facade_answers_syntax_error_for_hostile_request():
    engine = PolicyEngine.compile([PolicySource("p", simple_policy(1, "r", "read"))])
    for body, media in ((XXE, "application/xacml+xml"), (BILLION_LAUGHS, "application/xml"),
                        (b"[" * 500 + b"]" * 500, "application/xacml+json"),
                        (b"<Request", "application/xacml+xml")):
        response = engine.decide_bytes(body, media)
        (result,) = response.results
        assert result.decision is Decision.INDETERMINATE
        assert result.status.code == STATUS_SYNTAX_ERROR
        assert result.status.message


def test_hostile_policy_is_a_load_error_with_source():
    with pytest.raises(PolicyLoadError) as info:
        inspect_policy(PolicySource("store:evil", BILLION_LAUGHS))
    assert info.value.source == "store:evil"
    with pytest.raises(PolicyLoadError) as info:
        inspect_policy(PolicySource("bad.xml", b"<Policy>\n<Rule>\n</Policy>"))
    assert info.value.line == 3


def test_request_syntax_errors_say_where():
    bad_value = request_xml("alice", "r", "read", 5).replace(b">5<", b">five<")
    with pytest.raises(RequestSyntaxError, match="urn:example:level"):
        parse_request(bad_value, "application/xacml+xml")
    with pytest.raises(RequestSyntaxError, match=r"Request.Category\[0\].Attribute\[0\]"):
        parse_request(b'{"Request": {"Category": [{"CategoryId": "Resource", "Attribute": '
                      b'[{"AttributeId": "x"}]}]}}', "application/xacml+json")
    with pytest.raises(RequestSyntaxError, match="unsupported media type"):
        parse_request(b"<Request/>", "text/plain")


def test_json_integer_over_the_digit_limit_is_a_clear_error():
    body = b'{"Request": {"Resource": {"Attribute": [{"AttributeId": "a", "Value": ' + \
        b"9" * 5000 + b"}]}}}"
    with pytest.raises(RequestSyntaxError, match="invalid JSON"):
        parse_request(body, "application/xacml+json")


def test_default_limits_are_configurable():
    from common import xmlsafe
    saved = xmlsafe.get_limits()
    try:
        xmlsafe.set_limits(max_bytes=64, max_depth=3)
        with pytest.raises(UnsafeDocumentError, match="over the limit of 64"):
            parse_xml(b"<a>" + b"x" * 100 + b"</a>")
        with pytest.raises(UnsafeDocumentError, match="deeper than 3"):
            parse_json(b"[[[[1]]]]")
    finally:
        xmlsafe.set_limits(*saved)
    assert parse_json(b"[[[[1]]]]") == [[[[1]]]]
