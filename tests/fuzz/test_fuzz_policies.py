"""POST /policies and PUT /policies/<id>: any policy document -> below 500; a policy that loads
is then used (an /explain for its stream exercises its obligations) and removed again."""
from __future__ import annotations

from urllib.parse import quote

from hypothesis import given, strategies as st

from tests.fuzz.support import (
    DATATYPES,
    FUZZ,
    FUZZ_MORE,
    LTA_REQUEST_XML,
    NEA_POLICY,
    NEA_POLICY_ID,
    ODD_BODIES,
    STREAMS,
    XS,
    check,
    conditions,
    content_type,
    headers,
    hostile_slot,
    mostly,
    mutated,
    nasty_text,
    number_token,
    one_of,
    to_bytes,
    xml_escape,
)
from tests.pep.conftest import auth_header

FILTER = b"rainrate &gt; 5"
WINDOW_SIZE = b'#integer">5<'
WINDOW_STEP = b'#integer">2<'
AGGREGATE = b">rainrate:avg<"
MAP_ATTRIBUTE = b">windspeed<"


@st.composite
def policy_documents(draw, policy_id: str | None = None) -> bytes:
    """NEA's weather policy for one of the fuzz streams, its stream-filter obligation a
    condition at the edges of its types, and at most one other hostile value."""
    bad = hostile_slot(draw, ("id", "stream", "filter", "size", "step", "aggregate", "map",
                              "version", "match", "charrefs", "bytes"))
    charrefs = bad == "charrefs"

    def esc(text: str) -> bytes:
        return to_bytes(xml_escape(text, charrefs))

    doc = NEA_POLICY
    if policy_id is None:
        policy_id = (draw(nasty_text(8)) if bad == "id" else
                     f"urn:xsg:fuzz:p{draw(st.integers(0, 10 ** 9))}")
    doc = doc.replace(NEA_POLICY_ID.encode(), esc(policy_id))
    stream = draw(nasty_text(5) if bad == "stream" else st.sampled_from(STREAMS))
    doc = doc.replace(b">weather<", b">" + esc(stream) + b"<")
    # the filter is where conditions, and their literals, meet the stream: always replaced
    doc = doc.replace(FILTER, esc(draw(conditions if bad != "filter"
                                       else one_of(conditions, nasty_text(20)))))
    if bad == "size":
        doc = doc.replace(WINDOW_SIZE, b'#integer">' + esc(draw(number_token)) + b"<")
    if bad == "step":
        dt = draw(st.sampled_from(DATATYPES))
        doc = doc.replace(WINDOW_STEP, b'#' + esc(dt).split(b"#")[-1] + b'">'
                          + esc(draw(one_of(number_token, nasty_text(5)))) + b"<")
    if bad == "aggregate":
        doc = doc.replace(AGGREGATE, b">" + esc(draw(one_of(
            st.sampled_from(["shipname:avg", "moored:max", "samplingtime:sum", "x:y",
                             "shipname:max", "winddirection:avg"]), nasty_text(6)))) + b"<")
    if bad == "map":
        doc = doc.replace(MAP_ATTRIBUTE, b">" + esc(draw(one_of(st.sampled_from(
            ["shipname", "moored", "winddirection", "WINDSPEED"]), nasty_text(6)))) + b"<")
    if bad == "version":
        doc = doc.replace(b'Version="1.0"', b'Version="' + esc(draw(one_of(
            number_token, nasty_text(5), st.sampled_from(["1." + "9" * 30, "0", "1.0.0.0.0"]))))
            + b'"')
    if bad == "match":
        value = esc(draw(one_of(number_token, nasty_text(6))))
        dt = esc(draw(st.sampled_from(DATATYPES)))
        dt = dt if b":" in dt else XS.encode() + dt
        doc = doc.replace(
            b'<AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">nea<',
            b'<AttributeValue DataType="' + dt + b'">' + value + b"<")
    if bad == "bytes":
        doc = draw(mutated(doc))
    return doc


bodies = mostly(st.tuples(policy_documents(), content_type("xml")), one_of(
    st.tuples(mutated(NEA_POLICY), content_type("xml")),
    st.tuples(st.sampled_from(ODD_BODIES), content_type()),
))


def _explain(client, stream_value: bytes, who: str):
    request = LTA_REQUEST_XML.replace(b">lta<", b">" + who.encode() + b"<")
    return client.post("/explain", data=request.replace(b">weather<", stream_value),
                       headers=auth_header(who, **{"Content-Type": "application/xacml+xml"}))


@FUZZ
@given(body=bodies, who=st.sampled_from(["nea", "nea", "nea", "lta"]))
def test_post_policies_answers_below_500(gateway, body, who):
    client = gateway.client
    data, ctype = body
    r = client.post("/policies", data=data, headers=headers(auth_header(who), ctype))
    check(r, what=f"POST /policies {ctype!r}")
    if r.status_code == 201:
        policy_id = r.get_json()["id"]
        try:
            for stream in (b">weather<", b">ships<"):
                check(_explain(client, stream, "lta"), xacml=True, what="POST /explain after POST")
        finally:  # the next example starts from the same policies, even after a failure
            gone = client.delete(f"/policies/{quote(policy_id, safe='')}",
                                 headers=auth_header("nea"))
            if gone.status_code != 204:  # e.g. an id with "//", which routing merges (a 308)
                gateway.services.policies.delete(policy_id, owner="nea")
            check(gone, what="DELETE /policies")


path_ids = mostly(st.just(NEA_POLICY_ID), one_of(nasty_text(8).map(
    lambda t: quote(to_bytes(t), safe="")), st.sampled_from(["%ED%A0%80", "%00", "%FF", "..",
                                                             "a/../b", "%2F", "x" * 5000])))


@FUZZ
@given(policy_id=path_ids,
       body=mostly(st.tuples(policy_documents(NEA_POLICY_ID), content_type("xml")), bodies),
       who=st.sampled_from(["nea", "lta"]))
def test_put_policies_answers_below_500(gateway, policy_id, body, who):
    client = gateway.client
    data, ctype = body
    target = policy_id if "%" in policy_id or policy_id == NEA_POLICY_ID else quote(policy_id)
    r = client.put(f"/policies/{target}", data=data, headers=headers(auth_header(who), ctype))
    check(r, what=f"PUT /policies/{target[:60]} {ctype!r}")
    if r.status_code == 200:
        try:
            for stream in (b">weather<", b">ships<"):
                check(_explain(client, stream, "lta"), xacml=True, what="POST /explain after PUT")
        finally:  # the next example starts from NEA's own policy, even after a failure
            back = client.put(f"/policies/{quote(NEA_POLICY_ID, safe='')}", data=NEA_POLICY,
                              headers=auth_header("nea", **{"Content-Type":
                                                            "application/xacml+xml"}))
            assert back.status_code == 200, back.get_data()


query_values = one_of(number_token, nasty_text(6), st.sampled_from(
    ["1", "2", "0", "²", "٣", "1.0", "true", "yes", ""]))


@FUZZ_MORE
@given(policy_id=path_ids, store_version=one_of(st.none(), query_values),
       version=one_of(st.none(), query_values), history=one_of(st.none(), query_values),
       who=st.sampled_from(["nea", "lta"]))
def test_get_policy_answers_below_500(gateway, policy_id, store_version, version, history, who):
    target = policy_id if "%" in policy_id or policy_id == NEA_POLICY_ID else quote(policy_id)
    params = {k: to_bytes(v) for k, v in (("store_version", store_version), ("version", version),
                                          ("history", history)) if v is not None}
    r = gateway.client.get(f"/policies/{target}", query_string=params, headers=auth_header(who))
    check(r, what=f"GET /policies/{target[:40]} {sorted(params)}")
