"""POST /explain: any stream request (user query in the resource Content) -> below 500; a plan
that is explained renders its SQL text, whatever literals its conditions hold."""
from __future__ import annotations

from hypothesis import given, strategies as st

from tests.fuzz.support import (
    FUZZ,
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

requests = mostly(
    one_of(st.tuples(xacml_xml_request(), content_type("xml")),
           st.tuples(xacml_json_request(), content_type("json"))),
    one_of(st.tuples(mutated(LTA_REQUEST_XML), content_type("xml")),
           st.tuples(mutated(LTA_REQUEST_JSON), content_type("json")),
           st.tuples(st.sampled_from(ODD_BODIES), content_type())))


@FUZZ
@given(request=requests, who=st.sampled_from(["lta", "nea", "nea", "other"]))
def test_explain_answers_below_500(gateway, request, who):
    body, ctype = request
    r = gateway.client.post("/explain", data=body, headers=headers(auth_header(who), ctype))
    check(r, xacml=True, what=f"POST /explain {ctype!r}")
    if r.status_code == 200:
        doc = r.get_json()
        assert doc["decision"] == "Permit" and isinstance(doc["sql"], str) and doc["sql"], doc
