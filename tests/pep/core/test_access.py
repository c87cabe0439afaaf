"""The request processor and POST /explain, with the real PDP engine and real policies."""
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from flask import Flask

from common.auth import Identity, TokenAuthenticator
from common.http.auth import install_authenticator
from pdp.engine import PolicyEngine, PolicySource
from pep.core.access import decide_and_plan
from pep.core.errors import Refusal
from pep.core.graph import BUILTIN_SCHEMAS
from pep.core.plan import Aggregate, Field, Predicate, StreamSchema, WindowSpec
from pep.http import errors
from pep.http.explain import install_explain

from .helpers import FIGURE_4A

REPO = Path(__file__).resolve().parents[3]
WEATHER = REPO / "policies" / "weather"
MLS = REPO / "policies" / "mls"
XML, JSON = "application/xacml+xml", "application/xacml+json"
VITALS = StreamSchema((Field("sid", "long"), Field("wt", "double"), Field("bp", "double"),
                       Field("pr", "double"), Field("level", "long")))
SCHEMAS = {**BUILTIN_SCHEMAS, "vitals": VITALS}
NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
STR = "http://www.w3.org/2001/XMLSchema#string"


def inline_policy(policy_id: str, resource: str, subject: str, obligations: str) -> PolicySource:
    """A one-rule Permit policy for `subject` on `resource` with the given ObligationExpressions."""
    def match(value, category, attribute):
        return (
            f'<AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">'
            f'<AttributeValue DataType="{STR}">{value}</AttributeValue>'
            f'<AttributeDesignator Category="{category}" AttributeId="{attribute}" '
            f'DataType="{STR}" MustBePresent="false"/></Match></AllOf></AnyOf>'
        )
    xml = (f'<Policy xmlns="{NS}" PolicyId="{policy_id}" Version="1.0" RuleCombiningAlgId='
           f'"urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides"><Target>'
           + match(resource, "urn:oasis:names:tc:xacml:3.0:attribute-category:resource",
                   "urn:oasis:names:tc:xacml:1.0:resource:resource-id")
           + f'</Target><Rule RuleId="{policy_id}:r" Effect="Permit"><Target>'
           + match(subject, "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject",
                   "urn:oasis:names:tc:xacml:1.0:subject:subject-id")
           + f"</Target><ObligationExpressions>{obligations}</ObligationExpressions>"
           + "</Rule></Policy>")
    return PolicySource(policy_id, xml.encode())


def obligation(obligation_id: str, *pairs: tuple[str, str]) -> str:
    return (f'<ObligationExpression ObligationId="{obligation_id}" FulfillOn="Permit">' + "".join(
        f'<AttributeAssignmentExpression AttributeId="exacml:obligation:{k}">'
        f'<AttributeValue DataType="{STR}">{v}</AttributeValue></AttributeAssignmentExpression>'
        for k, v in pairs) + "</ObligationExpression>")


def request_json(stream: str, content=None, subject="whoever") -> bytes:
    resource = {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
                               "Value": stream}]}
    if content is not None:
        resource["Content"] = content
    return json.dumps({"Request": {
        "AccessSubject": {"Attribute": [{"AttributeId":
                                             "urn:oasis:names:tc:xacml:1.0:subject:subject-id",
                                         "Value": subject}]},
        "Resource": resource,
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                  "Value": "read"}]}}}).encode()


@pytest.fixture(scope="module")
def engine():
    sources = [PolicySource(p.name, p.read_bytes()) for p in
               (WEATHER / "nea-weather-policy.xml", MLS / "vitals-policy.xml")]
    sources += [
        inline_policy("urn:test:ais-a", "ais", "port", obligation(
            "exacml:obligation:stream-filter", ("stream-filter-condition-id", "speed &lt; 30")) +
            obligation("exacml:obligation:stream-map", ("stream-map-attribute-id", "mmsi"),
                       ("stream-map-attribute-id", "speed"), ("stream-map-attribute-id", "lat"))),
        inline_policy("urn:test:ais-b", "ais", "port", obligation(
            "exacml:obligation:stream-filter",
            ("stream-filter-condition-id", "shiptype = 'cargo'")) +
            obligation("exacml:obligation:stream-map", ("stream-map-attribute-id", "mmsi"),
                       ("stream-map-attribute-id", "speed"),
                       ("stream-map-attribute-id", "shiptype"))),
        inline_policy("urn:test:ais-odd", "ais", "odd", obligation(
            "urn:example:obligation:notify-owner", ("stream-filter-condition-id", "x"))),
    ]
    return PolicyEngine.compile(sources)


def run(engine, body, media_type=XML, who=Identity("lta"), **kw):
    return decide_and_plan(engine, body, media_type, who, SCHEMAS.get, **kw)


@dataclass
class Answer:
    """A refusal and the HTTP answer the gateway's error table gives it."""

    status: int
    content_type: str
    body: bytes
    message: str


ANSWERS = Flask("answers")


def refused(engine, body, media_type=XML, who=Identity("lta"), **kw) -> Answer:
    with pytest.raises(Refusal) as info:
        run(engine, body, media_type, who, **kw)
    with ANSWERS.app_context():
        response = errors.response_for(info.value)
    return Answer(response.status_code, response.content_type, response.get_data(),
                  info.value.message)


def test_lta_with_its_figure_4a_query(engine):
    p = run(engine, (WEATHER / "lta-request-with-query.xml").read_bytes())
    assert p.plan.filter_dnf == ((Predicate("rainrate", ">", 50.0),),)
    assert p.plan.window == WindowSpec("tuple", 10, 2, (Aggregate("rainrate", "avg"),))
    assert p.warnings == [] and p.subject == "lta" and p.stream == "weather"
    assert p.policy_ids == {"urn:xsg:example:weather:nea-policy"}
    assert "avg(`rainrate`)" in p.sql and p.plan_json["key"] == p.plan.key()


def test_lta_without_query_gets_figure_2_and_warnings(engine):
    p = run(engine, (WEATHER / "lta-request.json").read_bytes(), JSON)
    assert p.plan.window.size == 5
    assert p.plan.projection == ("samplingtime", "rainrate", "windspeed")
    assert {w.operator for w in p.warnings} == {"filter", "map"}


def test_the_subject_is_the_authenticated_caller(engine):
    body = (WEATHER / "lta-request.xml").read_bytes()  # claims to be lta
    err = refused(engine, body, who=Identity("mallory"))
    assert err.status == 403 and err.content_type == XML and b"Deny" in err.body
    owner = run(engine, body, who=Identity("nea"))  # the owner reads the raw stream
    assert owner.plan.filter_dnf is None and owner.plan.window is None
    assert owner.plan.projection == BUILTIN_SCHEMAS["weather"].names


def test_user_query_beside_the_request_and_not_twice(engine):
    body = (WEATHER / "lta-request.xml").read_bytes()
    p = run(engine, body, user_query=FIGURE_4A, user_query_type="xml")
    assert p.plan.window.size == 10
    err = refused(engine, (WEATHER / "lta-request-with-query.xml").read_bytes(),
                  user_query=FIGURE_4A)
    assert err.status == 400 and "two user queries" in err.message


@pytest.mark.parametrize("content,status,fragment", [
    ({"filter": "rainrate < 4"}, 422, "no result"),
    ({"map": ["temperature"]}, 403, "'temperature'"),
    ({"window": {"type": "tuple", "size": 2, "step": 2}}, 403, "finer"),
    ({"filter": "rainrate >"}, 400, "expected a value"),
    ({"filter": " AND ".join(f"(rainrate != {i} OR rainrate != {100 + i})" for i in range(11))},
     422, "too complex"),
])
def test_refusals_carry_status_and_reason(engine, content, status, fragment):
    err = refused(engine, request_json("weather", content), JSON)
    assert err.status == status and fragment in err.message
    body = json.loads(err.body)
    assert fragment in body["error"]
    if status == 422 and "no result" in fragment:
        assert body["warnings"][0]["kind"] == "NR"


def test_nr_can_be_shown_instead_of_refused(engine):
    p = run(engine, request_json("weather", {"filter": "rainrate < 4"}), JSON, refuse_nr=False)
    assert p.plan.filter_dnf == () and p.warnings[0].kind == "NR"


def test_request_errors(engine):
    err = refused(engine, b"<Request", XML)
    assert err.status == 400 and b"syntax-error" in err.body
    assert refused(engine, b"{}", "text/plain").status == 415
    err = refused(engine, request_json("snow"), JSON)
    assert err.status == 404 and "unknown stream 'snow'" in err.message
    no_stream = json.dumps({"Request": {"Action": {"Attribute": [
        {"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id", "Value": "read"}]}}})
    assert refused(engine, no_stream.encode(), JSON).status == 400


def test_all_applicable_policies_apply(engine):
    p = run(engine, request_json("ais"), JSON, who=Identity("port"))
    assert p.plan.filter_dnf == (
        (Predicate("shiptype", "=", "cargo"), Predicate("speed", "<", 30.0)),
    )
    assert p.plan.projection == ("mmsi", "speed")
    assert p.policy_ids == {"urn:test:ais-a", "urn:test:ais-b"}


def test_unknown_obligation_denies_with_reason(engine):
    err = refused(engine, request_json("ais"), JSON, who=Identity("odd"))
    assert err.status == 403 and "not understood" in err.message
    doc = json.loads(err.body)
    assert doc["Response"][0]["Decision"] == "Deny"


def test_mls_placeholder_from_the_callers_identity(engine):
    medic = Identity("medic-1", roles=("medic", "clearance:1"), attributes=(("clearance", (1,)),))
    p = run(engine, (MLS / "medic-request.xml").read_bytes(), who=medic)
    assert p.plan.filter_dnf == ((Predicate("level", "<=", 1),),)
    # the request claims clearance 3: the claim is dropped, the medic still reads at 1
    up = run(engine, (MLS / "medic-read-up-request.xml").read_bytes(), who=medic)
    assert up.plan == p.plan
    # without a clearance of its own the caller cannot be decided (MustBePresent): denied
    bare = Identity("medic-2", roles=("medic", "clearance:1"))
    assert refused(engine, (MLS / "medic-request.xml").read_bytes(), who=bare).status == 403


# -- POST /explain --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(engine):
    app = Flask(__name__)
    install_authenticator(app, TokenAuthenticator([("tok-lta-123", Identity("lta")),
                                                   ("tok-eve-123", Identity("eve"))]))
    errors.install(app)
    install_explain(app, lambda: engine, SCHEMAS.get)
    return app.test_client()


def test_explain_returns_decision_plan_sql(client):
    r = client.post("/explain", data=(WEATHER / "lta-request-with-query.xml").read_bytes(),
                    headers={"Authorization": "Bearer tok-lta-123", "Content-Type": XML})
    assert r.status_code == 200
    doc = r.get_json()
    assert doc["decision"] == "Permit" and doc["warnings"] == []
    assert doc["plan"]["window"]["size"] == 10 and "avg(`rainrate`)" in doc["sql"]
    assert [o["op"] for o in doc["graph"]["operators"]] == ["source", "filter", "map", "window"]


def test_explain_denied_is_403_with_the_xacml_response(client):
    r = client.post("/explain", data=(WEATHER / "lta-request.xml").read_bytes(),
                    headers={"Authorization": "Bearer tok-eve-123", "Content-Type": XML})
    assert r.status_code == 403 and r.content_type.startswith(XML) and b"Deny" in r.data


def test_explain_shows_nr_and_needs_a_token(client):
    r = client.post("/explain", data=request_json("weather", {"filter": "rainrate < 1"}),
                    headers={"Authorization": "Bearer tok-lta-123", "Content-Type": JSON})
    assert r.status_code == 200 and r.get_json()["warnings"][0]["kind"] == "NR"
    assert client.post("/explain", data=b"x", headers={"Content-Type": XML}).status_code == 401
