"""Spatial predicates under hostile input (issue 14): consumers' queries (JSON and XML) and
owners' filter obligations carrying DISTANCE, DISTANCE_TO and WITHIN_POLYGON with wrong arity,
NaN, infinities, 1e308, strings, placeholders, huge vertex lists: every answer is below 500, a
refusal says what and where, and nothing takes long (no hang)."""
from __future__ import annotations

import io
import json
import time
from xml.sax.saxutils import escape

import pytest
from hypothesis import given, strategies as st

from tests.fuzz.support import FUZZ, check, mostly, one_in, one_of
from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

S = "http://www.w3.org/2001/XMLSchema#string"
AIS = {"name": "ais", "time_attribute": "ts", "source": {"kind": "ingest"},
       "schema": [{"name": n, "type": t} for n, t in (
           ("mmsi", "long"), ("shipname", "string"), ("shiptype", "string"), ("lat", "double"),
           ("lon", "double"), ("speed", "double"), ("course", "double"), ("ts", "timestamp"))]}
BOUNDS = "[1.15, 103.6, 1.15, 104.05, 1.30, 104.05, 1.30, 103.6]"
SLOW = 2.0  # seconds: any answer slower than this is a hang in the making


def policy(filter_text: str, policy_id: str = "urn:xsg:fuzz:ais") -> bytes:
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="{policy_id}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
        <AttributeValue DataType="{S}">ais</AttributeValue>
        <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
          AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" DataType="{S}"
          MustBePresent="false"/></Match></AllOf></AnyOf></Target>
      <Rule RuleId="lta" Effect="Permit"><ObligationExpressions>
        <ObligationExpression ObligationId="exacml:obligation:stream-filter" FulfillOn="Permit">
          <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-filter-condition-id">
            <AttributeValue DataType="{S}">{escape(filter_text)}</AttributeValue>
          </AttributeAssignmentExpression></ObligationExpression>
      </ObligationExpressions></Rule></Policy>""".encode()


def request(query: str | None = None) -> bytes:
    """A request for the ais stream; a user query's filter (XML form) in the resource Content."""
    content = "" if query is None else (
        f'<Content><UserQuery xmlns=""><Filter><FilterCondition>{escape(query)}'
        f'</FilterCondition></Filter></UserQuery></Content>')
    return f"""<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
  ReturnPolicyIdList="false" CombinedDecision="false">
  <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource">{content}
    <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
      IncludeInResult="false"><AttributeValue DataType="{S}">ais</AttributeValue>
    </Attribute></Attributes></Request>""".encode()


REQUEST = request()
XML = {"Content-Type": "application/xacml+xml"}


def ask(client, text: str, form: str, where: str):
    """POST the query: inside the request (/explain) or beside it, JSON or XML (/requests)."""
    if where == "/explain":
        return client.post(where, data=request(text), headers=auth_header("lta", **XML))
    body, ctype = user_query(text, form)
    return client.post(where, headers=auth_header("lta"), content_type="multipart/form-data",
                       data={"request": (io.BytesIO(REQUEST), "r.xml", "application/xacml+xml"),
                             "query": (io.BytesIO(body), "q", ctype)})


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path_factory.mktemp("fuzz-spatial") / "data", runtime)
    client = app.test_client()
    assert client.post("/streams", json=AIS, headers=auth_header("nea")).status_code == 201
    r = client.post("/policies", data=policy(f"WITHIN_POLYGON(lat, lon, {BOUNDS})"),
                    headers=auth_header("nea", **{"Content-Type": "application/xacml+xml"}))
    assert r.status_code == 201, r.get_data(as_text=True)
    yield client, runtime
    services.close()


NUMBERS = ("1.26", "103.84", "0", "-0.0", "90", "-90", "180", "-180", "90.0000001", "1e308",
           "-1e308", "1e-320", "NaN", "nan", "Infinity", "-inf", "1e999", "'1.2'", "true",
           "{subject:port-lat}", "{subject:subject-id}", "{environment:x}", "99999999999999999999",
           "0x10", "1_000", ".5", "5.", "--1", "+1", "1e", "")
COORDS = ("lat", "lon", "LAT", "speed", "shipname", "mmsi", "nosuch", "1", "'lat'", "(lat)", "")
OPS = ("<=", "<", ">", ">=", "=", "!=", "<>", "==", "", "IN", "AND")


@st.composite
def spatial(draw) -> str:
    """One spatial predicate, mostly well formed, with hostile pieces."""
    kind = draw(st.sampled_from(["DISTANCE", "DISTANCE_TO", "WITHIN_POLYGON", "distance",
                                 "WITHIN_POLYGON"]))
    coords = [draw(mostly(st.just(c), st.sampled_from(COORDS))) for c in ("lat", "lon")]
    number = mostly(st.sampled_from(NUMBERS[:2]), st.sampled_from(NUMBERS))
    if kind.upper() == "WITHIN_POLYGON":
        if one_in(draw, 6):
            vertices = draw(st.sampled_from(["{subject:port-bounds}", "{subject:role}", "[]",
                                             "[1, 2, 3, 4]", "1, 2, 3", "[[1, 2]]", "["]))
        else:
            count = draw(mostly(st.integers(6, 40),
                                st.sampled_from([0, 1, 5, 7, 1999, 2000, 2001, 2002, 5000])))
            vertices = "[" + ", ".join(draw(number) if i % 7 == 0 else f"{1 + (i % 5) * 0.01}"
                                       for i in range(count)) + "]"
        args = [*coords, vertices]
        text = f"{kind}({', '.join(args[:draw(mostly(st.just(3), st.integers(0, 4)))])})"
        return text if not one_in(draw, 8) else text + " " + draw(st.sampled_from(OPS)) + " 5"
    if kind == "DISTANCE_TO":
        args = [*coords, draw(mostly(st.just("mmsi"), st.sampled_from(COORDS))),
                draw(mostly(st.just("244000001"), st.sampled_from(NUMBERS)))]
    else:
        args = [*coords, draw(number), draw(number)]
    arity = draw(mostly(st.just(4), st.integers(0, 6)))
    args = (args + ["7", "8"])[:arity]
    op = draw(mostly(st.sampled_from(OPS[:4]), st.sampled_from(OPS)))
    radius = draw(mostly(st.sampled_from(["5000", "92600", "0"]), st.sampled_from(NUMBERS)))
    return f"{kind}({', '.join(args)}) {op} {radius}"


condition = one_of(
    spatial(),
    st.tuples(spatial(), st.sampled_from([" AND ", " OR ", " AND NOT "]), spatial()).map("".join),
    spatial().map(lambda s: f"NOT ({s}) AND speed > 1"),
)


def user_query(text: str, form: str) -> tuple[bytes, str]:
    if form == "json":
        return json.dumps({"filter": text}).encode(), "application/json"
    return (f"<UserQuery><Filter><FilterCondition>{escape(text)}</FilterCondition></Filter>"
            f"</UserQuery>").encode(), "application/xml"


def timed(call):
    started = time.perf_counter()
    response = call()
    elapsed = time.perf_counter() - started
    assert elapsed < SLOW, f"{elapsed:.2f} s"
    return response


@FUZZ
@given(text=condition, form=st.sampled_from(["json", "xml"]),
       where=st.sampled_from(["/explain", "/requests"]))
def test_spatial_user_queries_answer_below_500_and_fast(gateway, text, form, where):
    client, runtime = gateway
    r = timed(lambda: ask(client, text, form, where))
    check(r, xacml=where == "/explain", what=f"POST {where} filter {text[:80]!r}")
    if r.status_code == 400 and r.mimetype == "application/problem+json":
        assert "filter" in r.get_json()["error"], r.get_json()
    if r.status_code == 201:
        client.delete(f"/handles/{r.get_json()['handle'].rsplit('/', 1)[-1]}",
                      headers=auth_header("lta"))


@FUZZ
@given(text=condition)
def test_spatial_filter_obligations_never_fail_the_gateway(gateway, text):
    """An owner's policy with any spatial filter: stored (it is text), and a request under it is
    granted, denied or refused, never a 500; the owner's policy is removed again."""
    client, _ = gateway
    xml = {"Content-Type": "application/xacml+xml"}
    r = timed(lambda: client.put("/policies/urn:xsg:fuzz:ais", data=policy(text),
                                 headers=auth_header("nea", **xml)))
    check(r, what="PUT /policies")
    r = timed(lambda: client.post("/explain", data=REQUEST, headers=auth_header("lta", **xml)))
    check(r, xacml=True, what=f"POST /explain under {text[:80]!r}")
    client.put("/policies/urn:xsg:fuzz:ais", data=policy(f"WITHIN_POLYGON(lat, lon, {BOUNDS})"),
               headers=auth_header("nea", **xml))


def test_the_seeded_queries_reach_the_deep_paths(gateway):
    """Known inputs of each kind get the answers they should (the fuzz above is not vacuous)."""
    client, _ = gateway
    ok = ask(client, "DISTANCE(lat, lon, 1.22, 103.8) <= 2000", "xml", "/explain")
    assert ok.status_code == 200 and ok.get_json()["warnings"] == [], ok.get_json()
    assert "DISTANCE(`lat`, `lon`, 1.22, 103.8) <= 2000" in ok.get_json()["sql"]
    pr = ask(client, "DISTANCE(lat, lon, 1.29, 103.8) <= 5000", "xml", "/explain").get_json()
    assert [w["kind"] for w in pr["warnings"]] == ["PR"]
    assert "cannot decide exactly" in pr["warnings"][0]["message"]
    assert ask(client, "lat > 5", "json", "/requests").status_code == 422  # NR: nothing started
    for text, fragment in [("DISTANCE(lat, lon, 1e308, 2) <= 5", "not a latitude"),
                           ("DISTANCE(lat, lon, NaN, 2) <= 5", "NaN"),
                           ("WITHIN_POLYGON(lat, lon, [1, 2, 3, 4])", "at least 3"),
                           ("DISTANCE(lat, lon, {subject:port-lat}, 1) <= 5", "not allowed")]:
        r = ask(client, text, "json", "/requests")
        assert r.status_code == 400 and fragment in r.get_json()["error"], r.get_json()
    many = "WITHIN_POLYGON(lat, lon, [" + ",".join(["1,2"] * 1001) + "])"
    r = timed(lambda: ask(client, many, "xml", "/requests"))
    assert r.status_code == 400 and "1000 vertices" in r.get_json()["error"], r.get_json()
    long = "WITHIN_POLYGON(lat, lon, [" + ", ".join(["1.2345678, 103.7654321"] * 600) + "])"
    r = timed(lambda: ask(client, long, "json", "/requests"))
    assert r.status_code == 400 and "over the limit" in r.get_json()["error"], r.get_json()
