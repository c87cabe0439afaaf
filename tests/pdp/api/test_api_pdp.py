"""GET /health and POST /pdp through Flask's test client: formats, subject binding, errors."""
from __future__ import annotations

import json

from lxml import etree

from tests.pdp.api.conftest import JSON, LTA_REQUEST_JSON, LTA_REQUEST_XML, XML, bearer, xml_request

NS = {"x": "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"}
SYNTAX_ERROR = "urn:oasis:names:tc:xacml:1.0:status:syntax-error"


def test_health_needs_no_token(gateway):
    r = gateway.client.get("/health")
    assert r.status_code == 200
    body = r.get_json()
    assert body["status"] == "ready" and body["policies"] == 5 and body["store_version"] == 5


def test_health_503_when_engine_not_loaded(gateway):
    gateway.services.policies._engine = None
    r = gateway.client.get("/health")
    assert r.status_code == 503 and r.get_json()["status"] == "starting"
    r = gateway.decide("lta", LTA_REQUEST_XML.read_bytes())
    assert r.status_code == 503
    r = gateway.client.post("/policies", data=b"<Policy/>",
                            headers={**bearer("nea"), "Content-Type": XML})
    assert r.status_code == 503 and "not loaded" in r.get_json()["error"]


def test_decide_xml_gives_permit_with_the_three_obligations(gateway):
    r = gateway.decide("lta", LTA_REQUEST_XML.read_bytes())
    assert r.status_code == 200 and r.mimetype == XML
    root = etree.fromstring(r.data)
    assert root.findtext("x:Result/x:Decision", namespaces=NS) == "Permit"
    ids = [o.get("ObligationId") for o in root.iterfind("x:Result/x:Obligations/x:Obligation", NS)]
    assert ids == ["exacml:obligation:stream-filter", "exacml:obligation:stream-map",
                   "exacml:obligation:stream-window"]


def test_decide_json_and_accept_negotiation(gateway):
    body = LTA_REQUEST_JSON.read_bytes()
    r = gateway.decide("lta", body, content_type=JSON)
    assert r.status_code == 200 and r.mimetype == JSON  # default: the request's format
    result = r.get_json()["Response"][0]
    assert result["Decision"] == "Permit" and len(result["Obligations"]) == 3
    r = gateway.decide("lta", body, content_type=JSON, accept=XML)
    assert r.mimetype == XML and etree.fromstring(r.data).findtext(
        "x:Result/x:Decision", namespaces=NS) == "Permit"
    r = gateway.decide("lta", LTA_REQUEST_XML.read_bytes(), accept="application/json")
    assert r.mimetype == "application/json"
    assert r.get_json()["Response"][0]["Decision"] == "Permit"
    r = gateway.decide("lta", body, content_type=JSON,
                       accept="application/xacml+json;q=0.2, application/xacml+xml")
    assert r.mimetype == XML
    r = gateway.decide("lta", body, content_type="application/json; charset=utf-8", accept="*/*")
    assert r.mimetype == JSON
    r = gateway.decide("lta", body, content_type=JSON, accept="text/html")
    assert r.status_code == 406


def test_missing_or_bad_token_is_401(gateway):
    body = LTA_REQUEST_XML.read_bytes()
    r = gateway.client.post("/pdp", data=body, headers={"Content-Type": XML})
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert r.get_json()["error"] == "missing bearer token"
    for header in ("Bearer wrong-token", "Basic bmVhOm5lYQ==", "Bearer"):
        r = gateway.client.post("/pdp", data=body,
                                headers={"Content-Type": XML, "Authorization": header})
        assert r.status_code == 401 and "WWW-Authenticate" in r.headers


def test_subject_is_the_authenticated_caller(gateway):
    # lta's token, a request claiming to be nea: decided as lta (Permit WITH obligations,
    # where nea would get the raw stream without any).
    r = gateway.decide("lta", xml_request("nea", "weather"), accept=JSON)
    result = r.get_json()["Response"][0]
    assert result["Decision"] == "Permit"
    assert [o["Id"] for o in result["Obligations"]] == [
        "exacml:obligation:stream-filter", "exacml:obligation:stream-map",
        "exacml:obligation:stream-window"]
    # nea's own token: the raw stream, no obligations
    result = gateway.decide("nea", xml_request("lta", "weather"), accept=JSON).get_json()[
        "Response"
    ][0]
    assert result["Decision"] == "Permit" and "Obligations" not in result
    # other claiming lta: denied
    assert gateway.decision("other", "lta") == "Deny"


def test_roles_come_from_the_token_not_the_request(gateway):
    # The MLS policy wants role medic plus a role "clearance:N" backing the claimed clearance.
    def medic_request(clearance: int, roles: list[str]) -> bytes:
        return json.dumps({"Request": {
            "AccessSubject": {"Attribute": [
                {"AttributeId": "clearance", "Value": clearance,
                 "DataType": "http://www.w3.org/2001/XMLSchema#integer"}] + ([
                {"AttributeId": "urn:oasis:names:tc:xacml:2.0:subject:role", "Value": roles}]
                if roles else [])},
            "Resource": {"Attribute": [{"AttributeId":
                                            "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
                                        "Value": "vitals"}]},
            "Action": {"Attribute": [{"AttributeId":
                                          "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                      "Value": "read"}]}}}).encode()

    def decision(who, body):
        r = gateway.decide(who, body, content_type=JSON)
        assert r.status_code == 200, r.data
        return r.get_json()["Response"][0]

    # 'other' holds roles medic and clearance:1, and the attribute clearance 1, in the auth file
    ok = decision("other", medic_request(1, []))
    assert ok["Decision"] == "Permit"
    assert ok["Obligations"][0]["AttributeAssignment"][0]["Value"] == "level <= {subject:clearance}"
    # claiming a higher clearance, even with forged roles, changes nothing: the claims are
    # dropped and the caller's own clearance (1) is what the policy sees
    assert decision("other", medic_request(3, ["medic", "clearance:3"])) == ok
    # lta is no medic whatever its request says
    assert decision("lta", medic_request(1, ["medic", "clearance:1"]))["Decision"] == "Deny"


def test_malformed_requests_get_400_with_syntax_error_status(gateway):
    cases = [
        (b"<Request xmlns='urn:oasis:names:tc:xacml:3.0:core:schema:wd-17'><Attributes",
         XML, "malformed XML"),
        (b"<Request xmlns='urn:oasis:names:tc:xacml:3.0:core:schema:wd-17'><Attributes Category='"
         b"urn:oasis:names:tc:xacml:3.0:attribute-category:resource'><Attribute AttributeId='a' "
         b"IncludeInResult='false'><AttributeValue DataType='http://www.w3.org/2001/XMLSchema#integer'>"
         b"abc</AttributeValue></Attribute></Attributes></Request>", XML, "abc"),
        (b'{"Request": {"AccessSubject": ', JSON, "malformed JSON"),
        (b'{"Request": 5}', JSON, "Request"),
        (b"", XML, "empty"),
    ]
    for body, media, needle in cases:
        r = gateway.decide("lta", body, content_type=media, accept=JSON)
        assert r.status_code == 400, (body, r.data)
        result = r.get_json()["Response"][0]
        assert result["Decision"] == "Indeterminate"
        assert result["Status"]["StatusCode"]["Value"] == SYNTAX_ERROR
        assert needle in result["Status"]["StatusMessage"], result["Status"]["StatusMessage"]
    # the XML flavour of the same answer
    r = gateway.decide("lta", b"<Request", content_type=XML)
    assert r.status_code == 400 and r.mimetype == XML
    root = etree.fromstring(r.data)
    assert root.find("x:Result/x:Status/x:StatusCode", NS).get("Value") == SYNTAX_ERROR
    assert "line" in root.findtext("x:Result/x:Status/x:StatusMessage", namespaces=NS)


def test_wrong_content_type_is_415(gateway):
    r = gateway.decide("lta", LTA_REQUEST_XML.read_bytes(), content_type="text/plain")
    assert r.status_code == 415 and "Content-Type" in r.get_json()["error"]
    r = gateway.client.post("/pdp", data=b"x", headers=bearer("lta"))
    assert r.status_code == 415


def test_unknown_routes_and_methods_answer_json(gateway):
    r = gateway.client.get("/nope")
    assert r.status_code == 404 and r.is_json
    r = gateway.client.get("/pdp", headers=bearer("lta"))
    assert r.status_code == 405 and r.is_json and "POST" in r.headers["Allow"]


def test_each_wrong_credential_gets_a_401_saying_what_is_wrong(gateway):
    """(issue 42) Basic credentials are not "an invalid bearer token": a scheme other than
    Bearer is named as not supported; every 401 carries the Bearer challenge (RFC 9110 11.6.1),
    with RFC 6750's error code where one applies."""
    body = LTA_REQUEST_XML.read_bytes()
    cases = [
        ("Basic bmVhOm5lYQ==", "the Basic authentication scheme is not supported",
         'Bearer realm="xsg"', "Basic"),
        ("Digest username=\"nea\"", "the Digest authentication scheme is not supported",
         'Bearer realm="xsg"', "Digest"),
        ("bmVhOm5lYQ==", "malformed Authorization header", 'Bearer realm="xsg"', None),
        ("tok-lta-0123456789", "malformed Authorization header", 'Bearer realm="xsg"', None),
        ("Bas\u00e9c x", "malformed Authorization header", 'Bearer realm="xsg"', None),
        ("Bearer", "missing bearer token: the Authorization header names the Bearer scheme",
         'Bearer realm="xsg", error="invalid_request"', None),
        ("Bearer wrong-token", "invalid bearer token",
         'Bearer realm="xsg", error="invalid_token"', None),
    ]
    for route, method in (("/pdp", "post"), ("/policies", "get"), ("/streams", "get")):
        for header, message, challenge, scheme in cases:
            r = getattr(gateway.client, method)(route, data=body, headers={
                "Content-Type": XML, "Authorization": header.encode("utf-8").decode("latin-1")})
            doc = r.get_json()
            assert r.status_code == 401, (route, header, doc)
            assert doc["error"].startswith(message), (route, header, doc)
            assert r.headers["WWW-Authenticate"] == challenge, (route, header)
            assert doc.get("scheme") == scheme
            if message.startswith("malformed"):  # a token sent without a scheme: not echoed
                assert header.split()[0] not in r.get_data(as_text=True)
            if scheme is not None:
                assert doc["supported"] == ["Bearer"] and "Bearer <token>" in doc["error"]
