"""The grant option (issue 48): an obligation of xsg's eXACML+ vocabulary, a sharing rule's
field, what a decision carries, and how it changes what a live handle was granted."""
from __future__ import annotations

import pytest

from common.auth import Identity
from pdp import AttributeAssignment, Obligation, compile_policy
from pdp.engine import PolicyEngine, PolicySource
from pep.core.access import decide_and_plan, decided_key
from pep.core.errors import AccessDenied
from pep.core.graph import BUILTIN_SCHEMAS
from pep.core.lint import LintDocument, lint
from pep.core.obligations import GRANT_OPTION_ID, ObligationError, grant_option, policy_graph
from pep.core.rules import (
    RuleError,
    describe_policy,
    rule_from_json,
    rule_from_xacml,
    rule_to_json,
    rule_to_xacml,
)

from .test_access import inline_policy, obligation, request_json

WEATHER = BUILTIN_SCHEMAS["weather"]
OPTION = obligation(GRANT_OPTION_ID)
MAP = obligation("exacml:obligation:stream-map", ("stream-map-attribute-id", "rainrate"))


def decide(*sources, subject="lta"):
    engine = PolicyEngine.compile(list(sources))
    return decide_and_plan(engine, request_json("weather", subject=subject),
                           "application/xacml+json", Identity(subject), BUILTIN_SCHEMAS.get)


def test_a_decision_carries_the_option_only_when_every_permitting_rule_gives_it():
    with_option = inline_policy("urn:t:a", "weather", "lta", MAP + OPTION)
    without = inline_policy("urn:t:b", "weather", "lta", MAP)
    granted = decide(with_option)
    assert granted.grant_option is True
    # the option does not change the view, only the decided key
    plain = decide(without)
    assert plain.grant_option is False and plain.plan == granted.plan
    assert plain.decided_key == plain.plan.key()
    assert granted.decided_key == decided_key(granted.plan.key(), True) != plain.decided_key
    # two rules apply, one without the option: withheld (all obligations apply)
    assert decide(with_option, without).grant_option is False


def test_an_option_with_attributes_is_a_deny():
    odd = obligation(GRANT_OPTION_ID, ("stream-grant-option-depth-id", "2"))
    with pytest.raises(AccessDenied, match="takes none"):
        decide(inline_policy("urn:t:c", "weather", "lta", MAP + odd))
    ob = Obligation(GRANT_OPTION_ID, (AttributeAssignment("exacml:obligation:x", "", "1"),))
    with pytest.raises(ObligationError):
        policy_graph([ob], "weather", WEATHER)
    assert grant_option([[Obligation(GRANT_OPTION_ID)], [Obligation(GRANT_OPTION_ID)]])
    assert not grant_option([])  # no grant at all gives nothing


def test_the_sharing_rule_field_compiles_reads_back_and_summarises():
    rule = rule_from_json({"stream": "weather", "who": {"subjects": ["lta"]},
                           "attributes": ["samplingtime", "rainrate"], "grant_option": True})
    document = rule_to_xacml(rule)
    assert GRANT_OPTION_ID.encode() in document
    assert rule_from_xacml(document) == rule
    assert rule_to_json(rule)["grant_option"] is True
    assert describe_policy(document)["summary"].endswith(", with grant option")
    assert rule_from_json(rule_to_json(rule)) == rule
    # the compiled rule decides with the option
    assert decide(PolicySource("rule", document)).grant_option is True
    # absent or false: no obligation, and the rule reads back the same
    plain = rule_from_json({"stream": "weather", "who": "anyone"})
    assert plain.grant_option is False and GRANT_OPTION_ID.encode() not in rule_to_xacml(plain)
    with pytest.raises(RuleError) as exc:
        rule_from_json({"stream": "weather", "who": "anyone", "grant_option": "yes"})
    assert exc.value.path == "/grant_option"


def test_the_linter_knows_the_option():
    def findings(obligations: str):
        doc = compile_policy(inline_policy("urn:t:l", "weather", "lta", obligations))
        return [f.text() for f in lint([LintDocument(doc.compiled.evaluator, "t")], [], "")]

    assert not [f for f in findings(MAP + OPTION) if "unknown-obligation" in f]
    bad = findings(obligation(GRANT_OPTION_ID, ("stream-grant-option-depth-id", "2")))
    assert any("unknown-obligation" in f and "takes no attribute" in f for f in bad)
