"""POST /requests, as a plain body and as multipart/form-data with `request` and `query` parts:
anything -> below 500. A request that opens a handle releases it again, so that the next
example is not refused as a second window."""
from __future__ import annotations

from hypothesis import given, strategies as st

from tests.fuzz.support import (
    FUZZ,
    FUZZ_MORE,
    LTA_REQUEST_JSON,
    LTA_REQUEST_XML,
    ODD_BODIES,
    check,
    content_type,
    dump,
    headers,
    hostile_slot,
    json_user_query,
    mostly,
    mutated,
    one_of,
    to_bytes,
    xacml_json_request,
    xacml_xml_request,
    xml_user_query,
)
from tests.pep.conftest import auth_header

plain = mostly(
    one_of(st.tuples(xacml_xml_request(), content_type("xml")),
           st.tuples(xacml_json_request(), content_type("json"))),
    one_of(st.tuples(mutated(LTA_REQUEST_XML), content_type("xml")),
           st.tuples(mutated(LTA_REQUEST_JSON), content_type("json")),
           st.tuples(st.sampled_from(ODD_BODIES), content_type())))

PART_TYPES = (None, "", "application/xacml+xml", "application/xacml+json", "application/json",
              "application/xml", "text/plain", "application/octet-stream", "image/png",
              "multipart/mixed", "application/json; charset=utf-16", "text/xml; charset=latin-1",
              "application/x-ndjson")

good_request_part = one_of(xacml_xml_request(with_query=False),
                           xacml_json_request(with_query=False),
                           st.just(LTA_REQUEST_XML), st.just(LTA_REQUEST_JSON))
request_part = one_of(good_request_part, st.sampled_from(ODD_BODIES))
query_part = mostly(one_of(json_user_query().map(lambda q: to_bytes(dump(q))),
                              xml_user_query().map(to_bytes)),
                    one_of(st.sampled_from(ODD_BODIES),
                              json_user_query().map(lambda q: to_bytes(dump(q))).flatmap(mutated)))


BOUNDARY = "fuzz-boundary-7d1c"


def _part(name: str, data: bytes, filename: str | None, part_type: str | None) -> bytes:
    disposition = f'form-data; name="{name}"'
    if filename is not None:
        disposition += f'; filename="{filename}"'
    head = f"Content-Disposition: {disposition}\r\n"
    if part_type is not None:
        head += f"Content-Type: {part_type}\r\n"
    return (f"--{BOUNDARY}\r\n".encode() + to_bytes(head) + b"\r\n" + data + b"\r\n")


@st.composite
def multipart(draw) -> bytes:
    """A multipart/form-data body, encoded by hand so that a part may be anything: a file with
    its own (maybe wrong) type, a plain field, absent, repeated, or with a hostile name. The
    request part is well formed; the query part is a user query; at most one thing is odd."""
    bad = hostile_slot(draw, ("request", "how", "filename", "type", "extra", "ending"))
    body = b""
    for name in ("request", "query"):
        how = draw(st.sampled_from(["field", "absent", "twice"])) if bad == "how" else "file"
        if how == "absent":
            continue
        for _ in range(2 if how == "twice" else 1):
            if name == "request":
                data = draw(request_part if bad == "request" else good_request_part)
            else:
                data = draw(query_part)
            filename = None if how == "field" else "part"
            if bad == "filename" and how != "field":
                filename = draw(st.sampled_from(["", "\ud800.x", 'a"b', "../../etc/passwd"]))
            part_type = None
            if bad == "type":
                part_type = draw(st.sampled_from(PART_TYPES))
            body += _part(name, data, filename, part_type)
    if bad == "extra":
        body += _part(draw(st.sampled_from(["extra", "\ud800", "request\x00"])), b"x", "x",
                      "text/plain")
    ending = f"--{BOUNDARY}--\r\n"
    if bad == "ending":
        ending = draw(st.sampled_from([f"--{BOUNDARY}--", "", "--x--"]))
    return body + ending.encode()


def _release(client, r, who):
    """Release a handle the request opened: the next example must not meet it (one window)."""
    if r.status_code in (200, 201):
        gone = client.delete(f"/handles/{r.get_json()['id']}", headers=auth_header(who))
        assert gone.status_code == 200, gone.get_data()


@FUZZ
@given(request=plain, who=st.sampled_from(["lta", "nea", "nea", "other"]))
def test_requests_plain_body_answers_below_500(gateway, request, who):
    body, ctype = request
    r = gateway.client.post("/requests", data=body, headers=headers(auth_header(who), ctype))
    _release(gateway.client, r, who)
    check(r, xacml=True, what=f"POST /requests {ctype!r}")


@FUZZ_MORE
@given(body=multipart(), who=st.sampled_from(["lta", "nea"]),
       ctype=st.sampled_from([f"multipart/form-data; boundary={BOUNDARY}"] * 12 + [
           f'multipart/form-data; charset=utf-8; boundary="{BOUNDARY}"',
           "multipart/form-data", "multipart/form-data; boundary=other"]))
def test_requests_multipart_answers_below_500(gateway, body, who, ctype):
    r = gateway.client.post("/requests", data=body, headers=auth_header(who, **{
        "Content-Type": ctype}))
    _release(gateway.client, r, who)
    check(r, xacml=True, what="POST /requests multipart")
