"""Request parsing (XML and JSON Profile), the Multiple Decision Profile, PEP helpers."""
from __future__ import annotations

import json

import pytest

from pdp.engine import PolicyEngine, PolicySource
from pdp.errors import RequestSyntaxError
from pdp.request import ACCESS_SUBJECT, ACTION, RESOURCE, UnsupportedRequestError, parse_request
from pdp.response import render_response
from pdp.results import STATUS_PROCESSING_ERROR, Decision

from ._gen import AID, LEVEL, NS, RID, SID, request_xml, simple_policy

XML = "application/xacml+xml"
JSON = "application/xacml+json"


def _engine():
    return PolicyEngine.compile([PolicySource("a", simple_policy(1, "doc1", "read")),
                                 PolicySource("b", simple_policy(2, "doc2", "read", "Deny"))])


def test_json_shorthand_categories_and_inferred_types():
    body = json.dumps({"Request": {
        "AccessSubject": {"Attribute": [{"AttributeId": SID, "Value": "alice"},
                                        {"AttributeId": LEVEL, "Value": 5}]},
        "Resource": {"Attribute": [{"AttributeId": RID, "Value": ["doc1"], "DataType": "string"}]},
        "Category": [{"CategoryId": "Action",
                      "Attribute": [{"AttributeId": AID, "Value": "read"}]}],
    }}).encode()
    req = parse_request(body, JSON)
    assert req.values("AccessSubject", SID) == ["alice"]
    assert req.values(ACTION, AID) == ["read"]
    response = _engine().decide(req)
    (result,) = response.results
    assert result.decision is Decision.PERMIT
    assert result.obligations[0].assignments[0].value == "alice"


def test_json_and_xml_give_the_same_decision():
    engine = _engine()
    xml_resp = engine.decide_bytes(request_xml("bob", "doc2", "read", 4), XML)
    body = json.dumps({"Request": {
        "AccessSubject": [{"Attribute": [{"AttributeId": SID, "Value": "bob"},
                                         {"AttributeId": LEVEL, "Value": 4}]}],
        "Resource": [{"Attribute": [{"AttributeId": RID, "Value": "doc2"}]}],
        "Action": [{"Attribute": [{"AttributeId": AID, "Value": "read"}]}]}}).encode()
    json_resp = engine.decide_bytes(body, JSON)
    assert xml_resp == json_resp
    assert xml_resp.results[0].decision is Decision.DENY


def test_multiple_decision_profile_repeated_categories():
    body = request_xml("alice", "doc1", "read", 5).replace(
        b"</Request>",
        f'<Attributes Category="{RESOURCE}"><Attribute AttributeId="{RID}" IncludeInResult="true">'
        f'<AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">doc2</AttributeValue>'
        f'</Attribute></Attributes></Request>'.encode())
    req = parse_request(body, XML)
    assert len(req.individuals()) == 2
    response, traces = _engine().decide_with_trace(req)
    decisions = [r.decision for r in response.results]
    assert decisions == [Decision.PERMIT, Decision.DENY]
    # Only the second resource had IncludeInResult: it tells the PEP which result is which.
    assert response.results[0].attributes == ()
    assert response.results[1].attributes[0].attributes[0].values == ("doc2",)
    assert traces == [{"p1"}, {"p2"}]
    rendered = json.loads(render_response(response, JSON))
    assert [r["Decision"] for r in rendered["Response"]] == ["Permit", "Deny"]


def test_with_attribute_replaces_the_claimed_subject():
    req = parse_request(request_xml("mallory", "doc1", "read", 5), XML)
    bound = req.with_attribute("AccessSubject", SID, "string", ["alice"])
    assert bound.values(ACCESS_SUBJECT, SID) == ["alice"]
    assert req.values(ACCESS_SUBJECT, SID) == ["mallory"]
    result = _engine().decide(bound).results[0]
    assert result.obligations[0].assignments[0].value == "alice"
    # Added when the category is missing altogether.
    added = req.with_attribute("urn:example:cat", "x", "string", ["1"])
    assert added.values("urn:example:cat", "x") == ["1"]


def test_content_is_kept_for_the_pep():
    body = (f'<Request xmlns="{NS}" ReturnPolicyIdList="false" CombinedDecision="false">'
            f'<Attributes Category="{RESOURCE}"><Content><q xmlns="urn:q">select</q></Content>'
            f'</Attributes></Request>').encode()
    req = parse_request(body, XML)
    assert req.content("Resource").tag == "{urn:q}q"
    jreq = parse_request(json.dumps({"Request": {"Resource": {"Content": {"window": 5}}}}).encode(),
                         JSON)
    assert jreq.content(RESOURCE) == {"window": 5}
    assert jreq.content(ACTION) is None


def test_unsupported_features_are_refused_clearly():
    for body in (b'{"Request": {"CombinedDecision": true}}',
                 b'{"Request": {"MultiRequests": {}}}'):
        with pytest.raises(UnsupportedRequestError):
            parse_request(body, JSON)
    result = _engine().decide_bytes(b'{"Request": {"CombinedDecision": true}}', JSON).results[0]
    assert result.decision is Decision.INDETERMINATE
    assert result.status.code == STATUS_PROCESSING_ERROR
    assert "CombinedDecision" in result.status.message


@pytest.mark.parametrize(
    "body",
    [
        b'<Request xmlns="urn:wrong"/>',
        f'<Request xmlns="{NS}"><Attributes/></Request>'.encode(),
        f'<Request xmlns="{NS}"><Attributes Category="c"><Attribute AttributeId="a"/></Attributes>'
        '</Request>'.encode(),
        f'<Request xmlns="{NS}" ReturnPolicyIdList="maybe"/>'.encode(),
        f'<Request xmlns="{NS}"><Bogus/></Request>'.encode(),
    ],
)
def test_invalid_xml_requests(body):
    with pytest.raises(RequestSyntaxError):
        parse_request(body, XML)


@pytest.mark.parametrize("doc", [
    [], {"Request": []}, {"Request": {"Bogus": 1}},
    {"Request": {"Resource": {"Attribute": [{"AttributeId": "a", "Value": {"x": 1}}]}}},
    {"Request": {"Resource": {"Attribute": [{"AttributeId": "a", "Value": [1, "x"]}]}}},
    {"Request": {"Resource": {"Attribute": [{"AttributeId": "a", "Value": "x",
                                             "DataType": "integer"}]}}},
    {"Request": {"ReturnPolicyIdList": "yes"}},
])
def test_invalid_json_requests(doc):
    with pytest.raises(RequestSyntaxError):
        parse_request(json.dumps(doc).encode(), JSON)


def test_multiple_decision_explosion_is_refused():
    cats = [{"CategoryId": f"urn:c{k}", "Attribute": [{"AttributeId": "a", "Value": i}]}
            for k in range(4) for i in range(8)]  # 8**4 = 4096 combinations
    with pytest.raises(UnsupportedRequestError, match="4096 individual decisions"):
        parse_request(json.dumps({"Request": {"Category": cats}}).encode(), JSON)


def test_json_values_must_be_representable_in_xml():
    body = json.dumps({"Request": {"Resource": {"Attribute": [
        {"AttributeId": RID, "Value": "a\u0001b"}]}}}).encode()
    with pytest.raises(RequestSyntaxError, match="U\\+0001"):
        parse_request(body, JSON)


def test_xml_rendering_survives_odd_characters():
    from pdp.results import AttributeAssignment, Obligation, Response, Result
    result = Result(Decision.PERMIT, obligations=(Obligation("o", (
        AttributeAssignment("a", "http://www.w3.org/2001/XMLSchema#string", "x\x00y"),)),))
    assert "x\ufffdy".encode() in render_response(Response((result,)), XML)


def test_json_rendering_survives_lone_surrogates():
    # issue 9, item 4: a status message quoting the client's text may hold a lone surrogate
    # (from a JSON escape); json.dumps(ensure_ascii=False).encode() raised UnicodeEncodeError
    from pdp.results import Response, Result, Status
    result = Result(Decision.INDETERMINATE, Status(message="unknown member Request.\ud800x"))
    body = render_response(Response((result,)), JSON)
    assert json.loads(body)["Response"][0]["Status"]["StatusMessage"] == \
        "unknown member Request.\ud800x"
    assert "é".encode() in render_response(Response((Result(
        Decision.DENY, Status(message="é")),)), JSON)  # other text stays as it is


def test_unknown_member_names_are_quoted_in_the_message():
    body = b'{"Request": {"\\ud800": 1}}'
    with pytest.raises(RequestSyntaxError) as info:
        parse_request(body, JSON)
    assert str(info.value) == "unknown member Request.'\\ud800'"
    str(info.value).encode("utf-8")


def _attrs(ctx, category):
    return sorted((a.attribute_id, a.values) for i in ctx.instances if i.category == category
                  for a in i.attributes)


def test_binding_the_environment_and_join_drops_claims_and_never_changes_its_input():
    """bind_environment and bind_join skip rebuilding when the request claims nothing they
    drop (a revocation pass binds a thousand requests); they still drop what is claimed, add
    what the gateway says, and leave the context they are given as it was."""
    from pdp.request import bind_environment, bind_join
    from pdp.urns import CURRENT_TIME, ENVIRONMENT
    claims = json.dumps({"Request": {
        "Resource": {"Attribute": [{"AttributeId": RID, "Value": "doc1"},
                                   {"AttributeId": "urn:xsg:resource:join-with", "Value": "x"}]},
        "Environment": {"Attribute": [{"AttributeId": CURRENT_TIME, "Value": "10:00:00",
                                       "DataType": "time"},
                                      {"AttributeId": "urn:xsg:event:open", "Value": "true"},
                                      {"AttributeId": "urn:e:kept", "Value": "k"}]}}}).encode()
    plain = json.dumps({"Request": {"Resource": {"Attribute": [
        {"AttributeId": RID, "Value": "doc1"}]}}}).encode()
    event = [("urn:xsg:event:e", "http://www.w3.org/2001/XMLSchema#boolean", ["true"])]
    for body, kept_env in ((claims, [("urn:e:kept", ("k",))]), (plain, [])):
        ctx = parse_request(body, JSON)
        before = (_attrs(ctx, RESOURCE), _attrs(ctx, ENVIRONMENT), ctx.instances)
        bound = bind_join(bind_environment(ctx, event), "doc2")
        assert _attrs(bound, ENVIRONMENT) == sorted(kept_env + [("urn:xsg:event:e", ("true",))])
        assert _attrs(bound, RESOURCE) == [(RID, ("doc1",)),
                                           ("urn:xsg:resource:join-with", ("doc2",))]
        alone = bind_join(bind_environment(ctx))
        assert _attrs(alone, ENVIRONMENT) == kept_env and _attrs(alone, RESOURCE) == [
            (RID, ("doc1",))]
        assert (_attrs(ctx, RESOURCE), _attrs(ctx, ENVIRONMENT), ctx.instances) == before
        engine = _engine()
        assert engine.decide(alone).results[0].decision == engine.decide(
            parse_request(plain, JSON)).results[0].decision
