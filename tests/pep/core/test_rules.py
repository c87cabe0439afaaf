"""Sharing rules, by example: the JSON form's defaults, what reads as a rule and what is custom
XACML, the one-line summaries of the example policies, and the paper's Figure 2 written as a
rule deciding as the hand-written policy does (properties over generated rules:
test_rules_properties.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pdp import PolicyEngine, PolicySource, parse_request
from pep.core.obligations import policy_graph
from pep.core.rules import (
    RuleError,
    describe_policy,
    read_policy,
    rule_from_json,
    rule_from_xacml,
    rule_to_json,
    rule_to_xacml,
)
from pep.core.schemas import WEATHER_SCHEMA

POLICIES = Path(__file__).resolve().parents[3] / "policies"
FIGURE2 = (POLICIES / "weather" / "nea-weather-policy.xml").read_bytes()
LTA_RULE = yaml.safe_load((POLICIES / "weather" / "lta-rule.yaml").read_text())


def test_the_json_form_fills_in_its_defaults_and_writes_them_out():
    rule = rule_from_json({"stream": "weather", "who": {"roles": ["transport"]}})
    assert rule.id == "urn:xsg:rule:weather:transport" and rule.version == "1.0"
    assert rule.actions == ("read", "subscribe") and rule.attributes == () and rule.window is None
    out = rule_to_json(rule)
    assert out["who"] == {"subjects": [], "roles": ["transport"], "attributes": {}}
    assert rule_from_json(out) == rule
    window = rule_from_json({"stream": "s", "who": "anyone", "actions": "any",
                             "window": {"type": "TIME", "size": "60", "aggregates": "v:avg"}})
    assert window.window.step == 60 and window.window.type == "time" and window.actions == ()
    assert window.id == "urn:xsg:rule:s:anyone"


@pytest.mark.parametrize("value, path", [
    ({"stream": "s", "who": {"subjects": ["a"]}, "window": {"size": 2, "aggregates": ["v:avg"]}},
     "/window/type"),
    ({"stream": "s", "who": {"subjects": ["a"]}, "valid": {"from": "2026-01-01T00:00:00.5Z"}},
     "/valid/from"),
    ({"stream": "s", "who": {"attributes": {"level": float("inf")}}}, "/who/attributes/level"),
    ({"stream": "s", "who": {"subjects": ["a\ufffe"]}}, "/who/subjects/0"),
    ({"stream": "s" * 65, "who": "anyone"}, "/stream"),
    ({"stream": "s", "who": "anyone", "events": ["storm", "storm"]}, "/events/1"),
])
def test_errors_name_the_field(value, path):
    with pytest.raises(RuleError) as caught:
        rule_from_json(value)
    assert caught.value.path == path and caught.value.message.startswith(path)


def test_the_example_policies_are_summarised_or_said_to_be_custom():
    assert describe_policy(FIGURE2) == {"form": "xacml", "summary": (
        "weather: nea (any action) gets every attribute | lta (read, subscribe) gets "
        "lastval(samplingtime), avg(rainrate), max(windspeed) per tuple window of 5 every 2, "
        "of tuples where rainrate > 5 (own filter before the window on rainrate) | anyone "
        "else: denied")}
    ais = describe_policy((POLICIES / "ais" / "port-authority-policy.xml").read_bytes())
    assert ais["form"] == "xacml"
    assert ("role port-authority (aggregate) gets count(mmsi) per time window of 600 s every "
            "600 s, by shiptype, of tuples where DISTANCE(") in ais["summary"]
    assert "role ship-captain (read, subscribe) gets every attribute where mmsi IN " \
        "{environment:urn:xsg:event:ais:emergency:keys}, while emergency is open" in ais["summary"]
    # a Condition on roles it does not read: custom, with its stream
    assert describe_policy((POLICIES / "mls" / "vitals-policy.xml").read_bytes()) == \
        {"form": "custom", "summary": "vitals: custom XACML"}


NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"


def _policy(body: str, alg: str = "urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:"
            "first-applicable", root: str = "Policy") -> bytes:
    target = ('<Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:'
              'string-equal"><AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">'
              's</AttributeValue><AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:'
              'attribute-category:resource" AttributeId="urn:oasis:names:tc:xacml:1.0:resource:'
              'resource-id" DataType="http://www.w3.org/2001/XMLSchema#string" '
              'MustBePresent="false"/></Match></AllOf></AnyOf></Target>')
    algorithm = "RuleCombiningAlgId" if root == "Policy" else "PolicyCombiningAlgId"
    return (f'<{root} xmlns="{NS}" {root}Id="p" Version="1" {algorithm}="{alg}">{target}'
            f'{body}</{root}>').encode()


@pytest.mark.parametrize("document, summary", [
    (_policy('<Rule RuleId="r" Effect="Permit"/>'), "s: anyone (any action) gets every attribute"),
    (_policy('<Rule RuleId="r" Effect="Permit"/>', "urn:oasis:names:tc:xacml:3.0:"
             "rule-combining-algorithm:deny-unless-permit"),
     "s: anyone (any action) gets every attribute | anyone else: denied"),
    # a Deny under deny-overrides wins over every Permit: not read rule by rule
    (_policy('<Rule RuleId="r" Effect="Permit"/><Rule RuleId="d" Effect="Deny"/>',
             "urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides"), None),
    # permit-unless-deny permits what no rule names: custom
    (_policy('<Rule RuleId="r" Effect="Permit"/>', "urn:oasis:names:tc:xacml:3.0:"
             "rule-combining-algorithm:permit-unless-deny"), None),
    (_policy('<Rule RuleId="r" Effect="Permit"><AdviceExpressions/></Rule>'), None),
    (_policy('<VariableDefinition VariableId="v"><AttributeValue DataType="http://www.w3.org/'
             '2001/XMLSchema#string">x</AttributeValue></VariableDefinition>'
             '<Rule RuleId="r" Effect="Permit"/>'), None),
    (_policy('<Rule RuleId="r" Effect="Permit"><ObligationExpressions><ObligationExpression '
             'ObligationId="urn:other" FulfillOn="Permit"/></ObligationExpressions></Rule>'),
     None),
    (_policy('<Policy PolicyId="c" Version="1" RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:'
             'rule-combining-algorithm:first-applicable"><Rule RuleId="r" Effect="Permit"/>'
             '</Policy>', "urn:oasis:names:tc:xacml:1.0:policy-combining-algorithm:"
             "first-applicable", root="PolicySet"), None),
    (b"<not-xml", None),
])
def test_what_reads_by_its_grants_and_what_is_custom(document, summary):
    described = describe_policy(document)
    if summary is None:
        assert described["form"] == "custom" and described["summary"].endswith("custom XACML")
    else:
        assert described["summary"] == summary
    assert (read_policy(document) is None) == (summary is None)


def test_figure2_as_a_rule_decides_for_lta_as_the_hand_written_policy():
    rule = rule_from_json(LTA_RULE)
    compiled = rule_to_xacml(rule)
    assert rule_from_xacml(compiled) == rule
    assert rule_from_xacml(FIGURE2) is None  # three rules: not one sharing rule
    request = (POLICIES / "weather" / "lta-request.xml").read_bytes()

    def plan(document: bytes):
        engine = PolicyEngine.compile([PolicySource("p", document)])
        result = engine.decide(parse_request(request, "application/xacml+xml")).results[0]
        assert result.decision.value == "Permit"
        return policy_graph(result.obligations, "weather", WEATHER_SCHEMA)

    assert plan(compiled) == plan(FIGURE2)
