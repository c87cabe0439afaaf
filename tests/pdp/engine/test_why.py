"""Why a decision came out so (`pdp.why`, `PolicyEngine.explain`): a permit, a deny by a rule, a
not-applicable and an indeterminate, explained from the same evaluators that decided them; what
an owner and a consumer may see of an explanation."""
from __future__ import annotations

import json
from pathlib import Path

from pdp import PolicyEngine, PolicySource, parse_request
from pdp.why import explanation_json, explanation_text

REPO = Path(__file__).resolve().parents[3]
WEATHER = REPO / "policies" / "weather" / "nea-weather-policy.xml"
XML = "application/xacml+xml"
NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
STRING = "http://www.w3.org/2001/XMLSchema#string"
SUBJECT = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
RESOURCE = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
ACTION = "urn:oasis:names:tc:xacml:3.0:attribute-category:action"
CLEARANCE = "urn:xsg:test:clearance"


def request(subject: str, resource: str, action: str = "read") -> bytes:
    def attrs(category: str, attribute: str, value: str) -> str:
        return (f'<Attributes Category="{category}"><Attribute AttributeId="{attribute}" '
                f'IncludeInResult="false"><AttributeValue DataType="{STRING}">{value}'
                "</AttributeValue></Attribute></Attributes>")
    return (f'<Request xmlns="{NS}" ReturnPolicyIdList="false" CombinedDecision="false">'
            + attrs(SUBJECT, "urn:oasis:names:tc:xacml:1.0:subject:subject-id", subject)
            + attrs(RESOURCE, "urn:oasis:names:tc:xacml:1.0:resource:resource-id", resource)
            + attrs(ACTION, "urn:oasis:names:tc:xacml:1.0:action:action-id", action)
            + "</Request>").encode()


# A second owner's policy about `vitals`: a rule that needs the subject's clearance
# (MustBePresent: without it the rule is Indeterminate), with an obligation of its own policy.
CLEARED = f"""<Policy xmlns="{NS}" PolicyId="urn:xsg:test:vitals" Version="1.0"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
  <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
    <AttributeValue DataType="{STRING}">vitals</AttributeValue>
    <AttributeDesignator Category="{RESOURCE}"
      AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
      DataType="{STRING}" MustBePresent="false"/></Match></AllOf></AnyOf></Target>
  <Rule RuleId="urn:xsg:test:vitals:cleared-reads" Effect="Permit">
    <Condition>
      <Apply FunctionId="urn:oasis:names:tc:xacml:1.0:function:string-is-in">
        <AttributeValue DataType="{STRING}">medical</AttributeValue>
        <AttributeDesignator Category="{SUBJECT}" AttributeId="{CLEARANCE}" DataType="{STRING}"
          MustBePresent="true"/>
      </Apply>
    </Condition>
  </Rule>
  <ObligationExpressions>
    <ObligationExpression ObligationId="urn:xsg:test:log" FulfillOn="Permit"/>
  </ObligationExpressions>
</Policy>""".encode()


def engine(*extra: bytes) -> PolicyEngine:
    sources = [PolicySource(str(WEATHER), WEATHER.read_bytes())]
    sources += [PolicySource(f"extra-{i}", data) for i, data in enumerate(extra)]
    return PolicyEngine.compile(sources)


def explain(eng: PolicyEngine, body: bytes):
    response, explanations = eng.explain(parse_request(body, XML))
    assert len(explanations) == 1 and explanations[0].consistent
    # the explained decision is the decision itself
    assert response.results[0].decision.value == explanations[0].decision
    assert eng.decide(parse_request(body, XML)).results[0].decision.value == \
        explanations[0].decision
    return explanations[0]


def by_id(node: dict, wanted: str) -> dict:
    if node.get("id") == wanted:
        return node
    for child in node.get("children", []):
        found = by_id(child, wanted)
        if found:
            return found
    return {}


def test_a_permit_names_the_rule_that_decided_and_where_each_obligation_came_from():
    e = explain(engine(), request("lta", "weather"))
    data = explanation_json(e)
    assert data["decision"] == "Permit" and data["view"] == "administrator"
    policy = by_id(data["root"], "urn:xsg:example:weather:nea-policy")
    assert policy["decision"] == "Permit" and policy["target"]["result"] == "match"
    assert policy["combining"].startswith("first-applicable: rule "
                                          "urn:xsg:example:weather:lta-reads-windows was the "
                                          "first child that applied (Permit)")
    assert policy["not_evaluated"] == 1  # the catch-all Deny after it was never reached
    owner = by_id(policy, "urn:xsg:example:weather:nea-owner-reads-raw")
    assert owner["decision"] == "NotApplicable" and owner["target"]["result"] == "no match"
    assert owner["target"]["matches"][0] == {
        "any_of": 0, "all_of": 0, "category": "subject",
        "attribute": "urn:oasis:names:tc:xacml:1.0:subject:subject-id",
        "function": "string-equal", "value": "nea", "result": "no match",
        "request": ["lta"], "line": owner["target"]["matches"][0]["line"]}
    rule = by_id(policy, "urn:xsg:example:weather:lta-reads-windows")
    assert rule["decision"] == "Permit" and rule["line"] > policy["line"]
    assert [o["id"] for o in data["obligations"]] == [
        "exacml:obligation:stream-filter", "exacml:obligation:stream-map",
        "exacml:obligation:stream-window"]
    assert all(o["from"] == {"kind": "Rule", "id": "urn:xsg:example:weather:lta-reads-windows",
                             "document": "urn:xsg:example:weather:nea-policy"}
               for o in data["obligations"])
    assert {"attribute": "pCloud:obligation:stream-filter-condition-id",
            "value": "rainrate > 5"} in data["obligations"][0]["assignments"]
    text = explanation_text(data)
    assert "lta-reads-windows (line" in text and "-> Permit" in text


def test_a_deny_by_a_rule_says_which_rule_and_why_the_others_did_not_apply():
    e = explain(engine(), request("other", "weather"))
    data = explanation_json(e)
    assert data["decision"] == "Deny"
    policy = by_id(data["root"], "urn:xsg:example:weather:nea-policy")
    assert "rule urn:xsg:example:weather:deny-everyone-else was the first child that applied " \
           "(Deny)" in policy["combining"]
    deny = by_id(policy, "urn:xsg:example:weather:deny-everyone-else")
    assert deny["decision"] == "Deny" and deny["target"]["result"] == "empty"
    assert by_id(policy, "urn:xsg:example:weather:lta-reads-windows")["target"]["result"] == \
        "no match"
    assert data["root"]["combining"] == ("deny-overrides: policy "
                                         "urn:xsg:example:weather:nea-policy said Deny, which "
                                         "overrides the others")
    assert data["obligations"] == []


def test_a_not_applicable_shows_every_target_that_did_not_match():
    e = explain(engine(CLEARED), request("lta", "no-such-stream"))
    data = explanation_json(e)
    assert data["decision"] == "NotApplicable"
    assert data["root"]["combining"] == "deny-overrides: none of the 2 children applied, so " \
                                        "NotApplicable"
    for child in data["root"]["children"]:
        assert child["target"]["result"] == "no match" and "children" not in child
        assert child["target"]["matches"][0]["request"] == ["no-such-stream"]


def test_an_indeterminate_gives_the_missing_attribute_and_the_algorithm_that_ignored_it():
    e = explain(engine(CLEARED), request("lta", "vitals"))
    data = explanation_json(e)
    # deny-unless-permit turns the Indeterminate rule into Deny
    policy = by_id(data["root"], "urn:xsg:test:vitals")
    rule = by_id(policy, "urn:xsg:test:vitals:cleared-reads")
    assert rule["decision"] == "Indeterminate{P}"
    assert "missing attribute urn:xsg:test:clearance" in rule["status"]
    assert rule["condition"].startswith("indeterminate: missing attribute")
    assert rule["reads"] == [{"category": "subject", "attribute": CLEARANCE, "present": False}]
    assert policy["decision"] == "Deny"
    assert policy["combining"] == ("deny-unless-permit: no child said Permit, so Deny, errors "
                                   "aside (deny-unless-permit never answers NotApplicable)")
    assert {"category": "subject", "attribute": CLEARANCE, "present": False} in \
        data["missing_attributes"]
    # the same rule under a root that lets the error through: Indeterminate
    root_policy = CLEARED.replace(b"deny-unless-permit", b"deny-overrides")
    e = explain(engine(root_policy), request("lta", "vitals"))
    data = explanation_json(e)
    assert data["decision"] == "Indeterminate" and "missing attribute" in data["status"]
    assert data["root"]["combining"].startswith(
        "deny-overrides: policy urn:xsg:test:vitals (Indeterminate{P}) could not be decided")


def test_a_consumer_sees_only_its_own_missing_attributes_never_a_policy():
    e = explain(engine(CLEARED), request("lta", "vitals"))
    data = explanation_json(e, consumer=True)
    assert data == {"decision": "Deny", "view": "consumer",
                    "missing_attributes": [{"category": "subject", "attribute": CLEARANCE,
                                            "present": False}],
                    "reason": "denied; attributes of yours that the policies read and you do "
                              f"not have: {CLEARANCE}"}
    e = explain(engine(CLEARED), request("other", "weather"))
    text = json.dumps(explanation_json(e, consumer=True))
    assert "nea" not in text and "rule" not in text and "deny-everyone" not in text


def test_an_owner_sees_its_own_policies_and_only_counts_of_the_others():
    # the weather policy is the caller's; a second owner's policy also applies to weather
    other = CLEARED.replace(b">vitals<", b">weather<")
    e = explain(engine(other), request("lta", "weather"))
    full = explanation_json(e)
    assert full["decision"] == "Deny"  # the other policy's deny-unless-permit says Deny
    data = explanation_json(e, mine=lambda doc: doc == "urn:xsg:example:weather:nea-policy")
    assert data["view"] == "owner"
    text = json.dumps(data)
    assert "urn:xsg:test:vitals" not in text and CLEARANCE in text  # its own missing attribute
    assert "urn:xsg:test:log" not in text
    assert by_id(data["root"], "urn:xsg:example:weather:lta-reads-windows")["decision"] == \
        "Permit"
    assert data["root"]["other_policies"] == {"Deny": 1}
    assert data["root"]["combining"] == ("deny-overrides: a policy you do not manage said "
                                         "Deny, which overrides the others")
    assert [c["id"] for c in data["root"]["children"]] == ["urn:xsg:example:weather:nea-policy"]
    # a Permit: the other's obligation is listed (the response holds it) without its origin
    permit = CLEARED.replace(b">vitals<", b">weather<").replace(b"deny-unless-permit",
                                                               b"permit-unless-deny")
    e = explain(engine(permit), request("lta", "weather"))
    data = explanation_json(e, mine=lambda doc: doc == "urn:xsg:example:weather:nea-policy")
    origins = {o["id"]: o["from"] for o in data["obligations"]}
    assert origins["urn:xsg:test:log"] == "a policy you do not manage"
    assert origins["exacml:obligation:stream-filter"]["id"] == \
        "urn:xsg:example:weather:lta-reads-windows"


def test_the_index_and_a_named_root_are_explained_too():
    import pdp.index as index_module
    many = [CLEARED.replace(b"urn:xsg:test:vitals", f"urn:xsg:test:p{i}".encode())
            .replace(b">vitals<", f">s{i}<".encode()) for i in range(index_module.MIN_CHILDREN + 2)]
    e = explain(engine(*many), request("lta", "weather"))
    data = explanation_json(e)
    assert data["root"]["skipped_by_index"] == len(many)  # none of them can apply to weather
    assert [c["id"] for c in data["root"]["children"]] == ["urn:xsg:example:weather:nea-policy"]
    named = PolicyEngine.compile([PolicySource("w", WEATHER.read_bytes())],
                                 root_policy_id="urn:xsg:example:weather:nea-policy")
    e = explain(named, request("lta", "weather"))
    assert explanation_json(e)["root"]["id"] == "urn:xsg:example:weather:nea-policy"


def test_explanations_agree_with_decisions_on_random_sets_under_every_root_algorithm():
    """The explained decision is the decision, and the obligations the explanation traces to
    their rules and policies are exactly the result's (same multiset), for random policy sets
    (targets, conditions needing an attribute that may be missing, obligations) and requests."""
    import random
    from collections import Counter

    from pdp.combining import SHORT_POLICY_ALGS
    from tests.pdp.engine._gen import random_policies, request_xml

    rng = random.Random(4711)
    resources, actions = ["a", "b", "c"], ["read", "write"]
    for alg in SHORT_POLICY_ALGS:
        docs = random_policies(rng, 12, resources, actions)
        eng = PolicyEngine.compile([PolicySource(f"p{i}", d) for i, d in enumerate(docs)],
                                   root_combining_alg=alg)
        for _ in range(40):
            body = request_xml(rng.choice(["u1", "u2"]), rng.choice(resources + [None]),
                               rng.choice(actions + [None]),
                               rng.choice([None, 0, 3, 6]))
            response, explanations = eng.explain(parse_request(body, XML))
            result, e = response.results[0], explanations[0]
            assert e.consistent and e.decision == result.decision.value, (alg, body)
            data = explanation_json(e)
            traced = Counter(o["id"] for o in data["obligations"])
            assert traced == Counter(o.id for o in result.obligations), (alg, body)
