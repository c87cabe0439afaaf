"""POST /pdp: any body, any Content-Type and Accept -> below 500, refusals say what and where."""
from __future__ import annotations

from hypothesis import given, strategies as st

from tests.fuzz.support import (
    FUZZ_MORE,
    LTA_REQUEST_JSON,
    LTA_REQUEST_XML,
    ODD_BODIES,
    check,
    content_type,
    headers,
    mostly,
    mutated,
    one_of,
    xacml_json_request,
    xacml_xml_request,
)
from tests.pep.conftest import auth_header

ACCEPTS = (None, "*/*", "application/xacml+json", "application/xacml+xml", "application/json",
           "text/html", "application/xacml+json;q=0, */*;q=0", "application/*", ";;", "x" * 500,
           "application/xacml+xml;q=nan", "application/json;q=1e309")

requests = mostly(
    one_of(st.tuples(xacml_xml_request(with_query=False), content_type("xml")),
           st.tuples(xacml_json_request(with_query=False), content_type("json"))),
    one_of(st.tuples(mutated(LTA_REQUEST_XML), content_type("xml")),
           st.tuples(mutated(LTA_REQUEST_JSON), content_type("json")),
           st.tuples(st.sampled_from(ODD_BODIES), content_type())))


@FUZZ_MORE
@given(request=requests, accept=mostly(st.sampled_from(ACCEPTS[:4]), st.sampled_from(ACCEPTS)),
       who=st.sampled_from(["lta", "nea", "other"]))
def test_pdp_answers_below_500(gateway, request, accept, who):
    body, ctype = request
    r = gateway.client.post("/pdp", data=body,
                            headers=headers(auth_header(who), ctype, Accept=accept))
    check(r, xacml=True, what=f"POST /pdp {ctype!r}")
