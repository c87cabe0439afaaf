"""Canonical keys: same request in any spelling -> same key; any real difference -> another key."""
from __future__ import annotations

import json

import pytest
from urllib3 import encode_multipart_formdata

from proxy.app import _multipart
from proxy.canonical import NotCacheable, cache_key, canonical_query, canonical_request, subject_key

SALT = b"s" * 32
XML_CT = "application/xacml+xml"
JSON_CT = "application/xacml+json"

XML = b"""<?xml version="1.0" encoding="UTF-8"?>
<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
         ReturnPolicyIdList="false" CombinedDecision="false">
  <Attributes Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject">
    <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:subject:subject-id" IncludeInResult="false">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">LTA</AttributeValue>
    </Attribute>
    <Attribute AttributeId="clearance" IncludeInResult="false">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#integer">3</AttributeValue>
    </Attribute>
  </Attributes>
  <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource">
    <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" IncludeInResult="false">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">weather</AttributeValue>
    </Attribute>
    <Content>
      <Query xmlns=""><Filter>rainrate &gt; 5</Filter><Map><Attr>rainrate</Attr><Attr>windspeed</Attr></Map></Query>
    </Content>
  </Attributes>
  <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:action">
    <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:action:action-id" IncludeInResult="false">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">subscribe</AttributeValue>
    </Attribute>
  </Attributes>
</Request>"""

# Same request: other prefix, other category and attribute order, attributes on one line,
# no indentation, the Content laid out differently.
XML_REORDERED = b"""<x:Request xmlns:x="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" CombinedDecision="false" ReturnPolicyIdList="false"><x:Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:action"><x:Attribute IncludeInResult="false" AttributeId="urn:oasis:names:tc:xacml:1.0:action:action-id"><x:AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">subscribe</x:AttributeValue></x:Attribute></x:Attributes><x:Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"><x:Content>
<Query>
   <Filter>rainrate &gt; 5</Filter>
   <Map>
      <Attr>rainrate</Attr>
      <Attr>windspeed</Attr>
   </Map>
</Query></x:Content><x:Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"><x:AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">weather</x:AttributeValue></x:Attribute></x:Attributes>
<x:Attributes Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"><x:Attribute AttributeId="clearance"><x:AttributeValue DataType="http://www.w3.org/2001/XMLSchema#integer">3</x:AttributeValue></x:Attribute><x:Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:subject:subject-id"><x:AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">LTA</x:AttributeValue></x:Attribute></x:Attributes></x:Request>"""

JSON_DOC = {"Request": {
    "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                              "Value": "subscribe"}]},
    "AccessSubject": {"Attribute": [
        {"AttributeId": "clearance", "Value": 3},
        {"AttributeId": "urn:oasis:names:tc:xacml:1.0:subject:subject-id", "Value": "LTA",
         "DataType": "string"}]},
    "Resource": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
                                "Value": "weather"}],
                 "Content": "<Query><Filter>rainrate &gt; 5</Filter><Map><Attr>rainrate</Attr>"
                            "<Attr>windspeed</Attr></Map></Query>"}}}


def key(body: bytes | dict, ctype: str = XML_CT, token: str = "tok-a", query=None) -> str:
    if isinstance(body, dict):
        body, ctype = json.dumps(body).encode(), JSON_CT
    subject = subject_key(f"Bearer {token}", SALT)
    return cache_key(subject, "/requests", [], canonical_request(body, ctype), query)


def test_xml_spellings_and_json_profile_share_one_key():
    base = key(XML)
    assert key(XML_REORDERED) == base
    assert key(JSON_DOC) == base


def test_json_member_order_and_category_array_form_share_the_key():
    doc = {"Request": {"Category": [
        {"CategoryId": "urn:oasis:names:tc:xacml:3.0:attribute-category:resource",
         "Content": JSON_DOC["Request"]["Resource"]["Content"],
         "Attribute": JSON_DOC["Request"]["Resource"]["Attribute"]},
        {"CategoryId": "urn:oasis:names:tc:xacml:3.0:attribute-category:action",
         "Attribute": JSON_DOC["Request"]["Action"]["Attribute"]},
        {"CategoryId": "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject",
         "Attribute": list(reversed(JSON_DOC["Request"]["AccessSubject"]["Attribute"]))}]}}
    assert key(doc) == key(JSON_DOC)


def test_split_attribute_elements_form_the_same_bag():
    one = XML.replace(b'<AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">LTA'
                      b'</AttributeValue>',
                      b'<AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">LTA'
                      b'</AttributeValue><AttributeValue DataType="http://www.w3.org/2001/'
                      b'XMLSchema#string">NEA</AttributeValue>')
    doc = json.loads(json.dumps(JSON_DOC))
    doc["Request"]["AccessSubject"]["Attribute"][1]["Value"] = ["LTA", "NEA"]
    assert key(one) == key(doc)
    # Bag order is kept: the PEP may substitute "the first value" of an attribute.
    doc["Request"]["AccessSubject"]["Attribute"][1]["Value"] = ["NEA", "LTA"]
    assert key(one) != key(doc)


@pytest.mark.parametrize("old,new", [
    (b">weather<", b">ships<"),  # another resource
    (b">LTA<", b"> LTA<"),  # whitespace inside a value is data
    (b">subscribe<", b">read<"),
    (b'ReturnPolicyIdList="false"', b'ReturnPolicyIdList="true"'),
    (b"rainrate &gt; 5", b"rainrate &gt; 6"),  # the user query inside Content
    (b"#integer\">3<", b"#string\">3<"),  # datatype
])
def test_real_differences_change_the_key(old, new):
    changed = XML.replace(old, new)
    assert changed != XML
    assert key(changed) != key(XML)


def test_another_token_is_another_key():
    assert key(XML, token="tok-a") != key(XML, token="tok-b")
    with pytest.raises(NotCacheable):
        subject_key(None, SALT)
    with pytest.raises(NotCacheable):
        subject_key("Basic dXNlcjpwdw==", SALT)


def test_key_hides_the_token():
    digest = subject_key("Bearer secret-token", SALT)
    assert "secret-token" not in digest
    assert digest != subject_key("Bearer secret-token", b"t" * 32)


HOSTILE = {
    "billion laughs": b"""<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">
<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17">&lol3;</Request>""",
    "external entity": b"""<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17">&x;</Request>""",
    "deep nesting": b"<a>" * 5000 + b"</a>" * 5000,
    "malformed": b"<Request xmlns='urn:oasis:names:tc:xacml:3.0:core:schema:wd-17'><Attributes>",
    "oversized": b"<Request>" + b" " * (1024 * 1024 + 1) + b"</Request>",
    "not xacml": b"<html><body>hi</body></html>",
    "multi requests": b"""<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17">
      <MultiRequests/></Request>""",
    "utf16 doctype": '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE r [<!ENTITY a "b">]><r/>'
                     .encode("utf-16"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_xml_is_not_cacheable(name):
    with pytest.raises(NotCacheable):
        canonical_request(HOSTILE[name], XML_CT)


@pytest.mark.parametrize("body", [
    b"[" * 200 + b"]" * 200,  # nesting bomb
    b'{"Request": {"Resource": {"Attribute": [{"AttributeId": "a", "Value": {"x": 1}}]}}}',
    b'{"Request": {"Bogus": {}}}',
    b'{"Request": {}, "Extra": 1}',
    b'{"Request": {"Resource": {"Attribute": [{"AttributeId": "a", "Value": [1, "x"]}]}}}',
    b"\xff\xfe not utf-8",
    b"{",
])
def test_bad_json_is_not_cacheable(body):
    with pytest.raises(NotCacheable):
        canonical_request(body, JSON_CT)


def test_unknown_media_type_is_not_cacheable():
    with pytest.raises(NotCacheable):
        canonical_request(XML, "application/pdf")
    # No Content-Type at all: the first character decides.
    assert canonical_request(XML, None) == canonical_request(XML, XML_CT)


def _multipart_body(request_part, query_part=None):
    fields = {"request": request_part}
    if query_part is not None:
        fields["query"] = query_part
    return encode_multipart_formdata(fields)


def test_multipart_request_and_query_parts():
    query_xml = b"<Query><Filter>rainrate &gt; 5</Filter></Query>"
    query_pretty = b"<Query>\n  <Filter>rainrate &gt; 5</Filter>\n</Query>\n"
    body1, ct1 = _multipart_body(("r.xml", XML, XML_CT), ("q.xml", query_xml, "application/xml"))
    body2, ct2 = _multipart_body(("r.json", json.dumps(JSON_DOC).encode(), JSON_CT),
                                 query_pretty.decode())  # a plain form field: sniffed as XML
    r1, q1 = _multipart(body1, ct1)
    r2, q2 = _multipart(body2, ct2)
    assert r1 == r2 and q1 == q2
    body3, ct3 = _multipart_body(("r.xml", XML, XML_CT), ("q.xml", query_xml.replace(b"5", b"9"),
                                                          "application/xml"))
    assert _multipart(body3, ct3)[1] != q1
    extra, ct = encode_multipart_formdata({"request": ("r.xml", XML, XML_CT), "other": "x"})
    with pytest.raises(NotCacheable):
        _multipart(extra, ct)


def test_text_and_json_queries():
    assert canonical_query(b"  rainrate > 5\n", "text/plain") == ["text", "rainrate > 5"]
    assert canonical_query(b'{"b": 1, "a": [1, 2]}', "application/json") == \
        canonical_query(b'{"a":[1,2],"b":1}', None)
    with pytest.raises(NotCacheable):
        canonical_query(b"<Query>", "application/xml")


def test_content_namespace_is_kept():
    # A query element in the XACML namespace is not the same document as one in no namespace.
    namespaced = XML.replace(b'<Query xmlns="">', b"<Query>")
    assert key(namespaced) != key(XML)


def test_the_projects_example_lta_request_in_xml_and_json_share_a_key():
    from pathlib import Path
    folder = Path(__file__).resolve().parents[2] / "policies" / "weather"
    xml_file, json_file = folder / "lta-request.xml", folder / "lta-request.json"
    if not (xml_file.exists() and json_file.exists()):
        pytest.skip("example requests not present")
    assert key(xml_file.read_bytes()) == key(json.loads(json_file.read_text()))
