"""`POST /pdp?explain=1` on the gateway's own server (its fast path for POST /pdp must leave it
to the route): an administrator sees every policy, an owner its own policies and of the others
only counts, a consumer only the decision and its own missing attributes."""
from __future__ import annotations

import json

import pytest

from tests.console.conftest import POLICIES, start_gateway
from tests.pdp.api.conftest import simple_policy, xml_request

XML = {"Content-Type": "application/xacml+xml"}
WEATHER_ID = "urn:xsg:example:weather:nea-policy"
LTA_OBS = "urn:xsg:test:lta-obs"
EVERYWHERE = "urn:xsg:test:read-anything"

# an administrator's policy pinned to no stream: it applies to every stream, lta manages it not
UNCONFINED = b"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
  PolicyId="urn:xsg:test:read-anything" Version="1.0"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides">
  <Target/>
  <Rule RuleId="urn:xsg:test:read-anything:deny-lta" Effect="Deny">
    <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">lta</AttributeValue>
      <AttributeDesignator Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
        AttributeId="urn:oasis:names:tc:xacml:1.0:subject:subject-id"
        DataType="http://www.w3.org/2001/XMLSchema#string" MustBePresent="false"/>
    </Match></AllOf></AnyOf></Target>
  </Rule>
</Policy>"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateway = start_gateway(tmp_path_factory.mktemp("explain"))
    gateway.add_weather()
    gateway.add_weather_policy()
    gateway.services.catalog.register("lta-obs", "lta", [{"name": "v", "type": "double"}])
    gateway.add_policy(simple_policy(LTA_OBS, resource="lta-obs", subject="lta"))
    gateway.add_policy(UNCONFINED)
    yield gateway
    gateway.close()


def explain(gw, who: str, body: bytes) -> dict:
    # an Accept the fast path of POST /pdp would answer itself, were it not for the query
    r = gw.api("POST", "/pdp?explain=1", who=who, data=body,
               headers={**XML, "Accept": "application/xacml+json"})
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    data = r.json()
    assert len(data["explanations"]) == 1
    assert data["response"]["Response"][0]["Decision"] == data["explanations"][0]["decision"]
    return data


def test_without_explain_the_answer_is_the_xacml_one(gw):
    r = gw.api("POST", "/pdp", who="other", data=xml_request("other", "weather"),
               headers={**XML, "Accept": "application/xacml+json"})
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/xacml+json"
    assert r.json()["Response"][0]["Decision"] == "Deny"


def test_a_consumer_gets_the_decision_and_its_missing_attributes_only(gw):
    data = explain(gw, "other", (POLICIES / "weather" / "lta-request.xml").read_bytes())
    why = data["explanations"][0]
    assert why["decision"] == "Deny" and why["view"] == "consumer"
    assert set(why) == {"decision", "view", "missing_attributes", "reason"}
    text = json.dumps(data)
    assert WEATHER_ID not in text and "deny-everyone-else" not in text and "nea" not in text


def test_an_administrator_sees_every_policy_and_rule(gw):
    data = explain(gw, "nea", xml_request("nea", "weather"))
    why = data["explanations"][0]
    assert why["view"] == "administrator" and why["decision"] == "Permit"
    ids = [c["id"] for c in why["root"]["children"]]
    assert WEATHER_ID in ids and EVERYWHERE in ids
    weather = next(c for c in why["root"]["children"] if c["id"] == WEATHER_ID)
    assert weather["children"][0]["id"] == "urn:xsg:example:weather:nea-owner-reads-raw"
    assert weather["children"][0]["target"]["matches"][0]["request"] == ["nea"]


def test_an_owner_sees_its_own_policy_and_of_the_others_only_their_decisions(gw):
    # lta owns lta-obs and manages LTA_OBS; the unconfined policy (deny lta) is not its own
    data = explain(gw, "lta", xml_request("someone", "lta-obs"))
    why = data["explanations"][0]
    assert why["view"] == "owner" and why["decision"] == "Deny"
    assert [c["id"] for c in why["root"]["children"]] == [LTA_OBS]
    assert why["root"]["children"][0]["decision"] == "Permit"
    assert why["root"]["other_policies"] == {"Deny": 1}
    assert why["root"]["combining"] == ("deny-overrides: a policy you do not manage said Deny, "
                                        "which overrides the others")
    text = json.dumps(why)
    assert EVERYWHERE not in text and "deny-lta" not in text
    # on a stream it does not own: its own policy did not apply, the others are counts
    other = explain(gw, "lta", xml_request("lta", "weather"))["explanations"][0]
    assert [(c["id"], c["decision"]) for c in other["root"]["children"]] == [
        (LTA_OBS, "NotApplicable")]
    assert other["root"]["other_policies"] == {"Permit": 1, "Deny": 1}
    assert WEATHER_ID not in json.dumps(other) and "lta-reads-windows" not in json.dumps(other)
    # a caller none of whose policies took part is a consumer
    assert explain(gw, "other", xml_request("other", "lta-obs"))["explanations"][0]["view"] == \
        "consumer"


def test_a_request_that_does_not_parse_is_still_a_400(gw):
    r = gw.api("POST", "/pdp?explain=1", who="lta", data=b"<Request", headers=XML)
    assert r.status_code == 400


def test_the_wsgi_fast_path_leaves_explain_to_the_route(tmp_path):
    from pep.http.app import create_app
    from pep.http.fast_pdp import FastPdp
    from pep.services import build_services
    from tests.pdp.api.conftest import bearer, make_config

    services = build_services(make_config(tmp_path))
    try:
        app = create_app(services=services)
        assert isinstance(app.wsgi_app, FastPdp)
        client = app.test_client()
        headers = {**bearer("lta"), **XML, "Accept": "application/xacml+json"}
        body = (POLICIES / "weather" / "lta-request.xml").read_bytes()
        before = app.wsgi_app.answered
        r = client.post("/pdp?explain=1", data=body, headers=headers)
        assert r.status_code == 200 and r.mimetype == "application/json"
        assert r.get_json()["explanations"][0]["view"] == "consumer"
        assert app.wsgi_app.answered == before
        r = client.post("/pdp", data=body, headers=headers)
        assert r.mimetype == "application/xacml+json" and app.wsgi_app.answered == before + 1
    finally:
        services.close()
