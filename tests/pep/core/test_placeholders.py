"""Placeholders stand only for what the gateway vouches for (issue 9, class 1).

A policy filter `owner = {subject:subject-id}` must give each consumer its own rows, whatever the
request file adds, repeats or respells: the value comes from the authenticated identity, never
from the request document.
"""
from __future__ import annotations

import json
from xml.sax.saxutils import escape

import pytest

from common.auth import AuthFileError, Identity, parse_auth_entries
from pdp import PolicyEngine, PolicySource
from pep.core.access import decide_and_plan
from pep.core.errors import AccessDenied
from pep.core.plan import Field, Predicate, StreamSchema

S = "http://www.w3.org/2001/XMLSchema#string"
NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
SUBJECT = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
RESOURCE = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
ENVIRONMENT = "urn:oasis:names:tc:xacml:3.0:attribute-category:environment"
SUBJECT_ID = "urn:oasis:names:tc:xacml:1.0:subject:subject-id"
SCHEMA = StreamSchema((Field("owner", "string"), Field("level", "long"), Field("v", "double")))
JSON = "application/xacml+json"


def policy(condition: str, policy_id: str = "urn:t:own-rows") -> PolicySource:
    return PolicySource(policy_id, f"""<Policy xmlns="{NS}" PolicyId="{policy_id}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target/><Rule RuleId="r" Effect="Permit"><ObligationExpressions>
        <ObligationExpression ObligationId="exacml:obligation:stream-filter" FulfillOn="Permit">
          <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-filter-condition-id">
            <AttributeValue DataType="{S}">{escape(condition)}</AttributeValue>
          </AttributeAssignmentExpression></ObligationExpression>
      </ObligationExpressions></Rule></Policy>""".encode())


def request(*categories: dict, repeat: bool = False) -> bytes:
    """A JSON Profile request for stream `s`, plus the attributes a test adds: merged into one
    element per category, or (repeat=True) as elements of their own."""
    merged: dict[str, dict] = {RESOURCE: {"CategoryId": RESOURCE, "Attribute": [
        {"AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id", "Value": "s"}]}}
    extra = []
    for c in categories:
        if repeat and c["CategoryId"] != RESOURCE:
            extra.append(c)
        else:
            merged.setdefault(c["CategoryId"], {"CategoryId": c["CategoryId"], "Attribute": []})
            merged[c["CategoryId"]]["Attribute"].extend(c["Attribute"])
    return json.dumps({"Request": {"Category": [*merged.values(), *extra]}}).encode()


def attribute(category: str, attribute_id: str, value, datatype: str = S) -> dict:
    return {"CategoryId": category,
            "Attribute": [{"AttributeId": attribute_id, "Value": value, "DataType": datatype}]}


def plan_for(condition: str, who: Identity, body: bytes):
    engine = PolicyEngine.compile([policy(condition)])
    return decide_and_plan(engine, body, JSON, who, {"s": SCHEMA}.get).plan


ALICE = Identity("alice", roles=("consumer",), attributes=(("urn:t:level", (2,)),))


@pytest.mark.parametrize("spelling", ["subject-id", SUBJECT_ID])
@pytest.mark.parametrize("forged", [
    [attribute(SUBJECT, "subject-id", "bob")],
    [attribute(SUBJECT, SUBJECT_ID, "bob")],
    [attribute(SUBJECT, "urn:other:subject-id", "bob")],
    [attribute(SUBJECT, "subject-id", "bob"), attribute(SUBJECT, "subject-id", "carol")],
    [attribute(RESOURCE, "subject-id", "bob")],
    [attribute(ENVIRONMENT, SUBJECT_ID, "bob")],
    [attribute("urn:oasis:names:tc:xacml:1.0:subject-category:intermediary-subject",
               SUBJECT_ID, "bob")],
])
def test_subject_placeholders_are_the_callers_whatever_the_request_says(spelling, forged):
    plan = plan_for(f"owner = {{subject:{spelling}}}", ALICE, request(*forged))
    assert plan.filter_dnf == ((Predicate("owner", "=", "alice"),),)
    # repeated access-subject elements collapse into the caller's one
    plan = plan_for(f"owner = {{subject:{spelling}}}", ALICE, request(*forged, repeat=True))
    assert plan.filter_dnf == ((Predicate("owner", "=", "alice"),),)


def test_identity_attributes_by_full_id_and_by_last_segment():
    body = request(attribute(SUBJECT, "urn:t:level", 9,
                             "http://www.w3.org/2001/XMLSchema#integer"))
    for spelling in ("urn:t:level", "level"):
        plan = plan_for(f"level <= {{subject:{spelling}}}", ALICE, body)
        assert plan.filter_dnf == ((Predicate("level", "<=", 2),),)


@pytest.mark.parametrize("condition, who", [
    ("owner = {environment:subject-id}", ALICE),       # only the gateway's values resolve
    ("owner = {action:action-id}", ALICE),
    ("level <= {subject:level}", Identity("bob")),     # bob has no level of his own
    ("owner = {subject:role}", Identity("bob", roles=("a", "b"))),  # a bag, not one value
    ("level <= {subject:level}",                       # two attributes end in ':level'
     Identity("eve", attributes=(("urn:a:level", (1,)), ("urn:b:level", (2,))))),
])
def test_what_the_gateway_does_not_vouch_for_denies(condition, who):
    body = request(attribute(ENVIRONMENT, "subject-id", "bob"),
                   attribute(SUBJECT, "level", "7"))
    engine = PolicyEngine.compile([policy(condition)])
    with pytest.raises(AccessDenied) as info:
        decide_and_plan(engine, body, JSON, who, {"s": SCHEMA}.get)
    assert "obligation cannot be fulfilled" in info.value.message


def test_the_stream_is_the_resource_placeholder():
    plan = plan_for("owner = {resource:resource-id}", ALICE, request())
    assert plan.filter_dnf == ((Predicate("owner", "=", "s"),),)


def test_policies_see_the_callers_attributes_not_the_requests():
    """The decision itself, too: a Condition on a subject attribute sees the identity's value."""
    engine = PolicyEngine.compile([PolicySource("p", f"""<Policy xmlns="{NS}" PolicyId="p"
      Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target/><Rule RuleId="r" Effect="Permit"><Condition>
        <Apply FunctionId="urn:oasis:names:tc:xacml:1.0:function:string-is-in">
          <AttributeValue DataType="{S}">auditor</AttributeValue>
          <AttributeDesignator Category="{SUBJECT}" AttributeId="urn:t:team" DataType="{S}"
            MustBePresent="false"/></Apply></Condition></Rule></Policy>""".encode())])
    claims = request(attribute(SUBJECT, "urn:t:team", "auditor"))
    with pytest.raises(AccessDenied):
        decide_and_plan(engine, claims, JSON, Identity("mallory"), {"s": SCHEMA}.get)
    auditor = Identity("ann", attributes=(("urn:t:team", ("auditor",)),))
    assert decide_and_plan(engine, request(), JSON, auditor, {"s": SCHEMA}.get).stream == "s"


def test_auth_file_attributes_are_checked():
    entry = {"token": "t", "subject": "a", "attributes": {"clearance": 1, "ships": [1, 2]}}
    ((_, identity),) = parse_auth_entries([entry])
    assert identity.attribute("clearance") == (1,) and identity.attribute("ships") == (1, 2)
    for bad in ({"x": {"nested": 1}}, {"x": [1, "a"]}, {"x": float("nan")}, {"role": "admin"},
                {"urn:a:subject-id": "bob"}, {"": 1}, "not an object"):
        with pytest.raises(AuthFileError, match="entry 0"):
            parse_auth_entries([{**entry, "attributes": bad}])
