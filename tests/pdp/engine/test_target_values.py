"""PolicyEngine.target_values: the literals a document's targets compare an attribute with (the
stream side asks the PDP about each action id a stream's policies name)."""
from __future__ import annotations

from pdp.engine import PolicyEngine, PolicySource

from ._gen import ACT, AID
from .test_resource_scope import act, any_of, policy, policy_set, res, rule

ACTION = ("urn:oasis:names:tc:xacml:3.0:attribute-category:action",
          "urn:oasis:names:tc:xacml:1.0:action:action-id")


def values(*docs: str, pid: str = "x") -> frozenset:
    engine = PolicyEngine.compile([PolicySource(f"s{i}", d.encode()) for i, d in enumerate(docs)])
    return engine.target_values(pid, *ACTION)


def test_actions_in_every_target_are_found():
    rules = (rule("r1", any_of(act("read"), act("subscribe")))
             + rule("r2", any_of(act("aggregate")) + any_of(act("read")), "Deny")
             + rule("r3"))
    assert values(policy("x", any_of(res("weather")), rules)) == {"read", "subscribe",
                                                                   "aggregate"}
    assert values(policy("x", any_of(act("peek")))) == {"peek"}
    assert values(policy("x", any_of(res("weather")))) == frozenset()  # no action named


def test_nested_policies_and_references_are_followed_and_other_ids_are_empty():
    inner = policy("inner", any_of(act("inner-action")), ns=False)
    referenced = policy("ref", any_of(act("by-reference")))
    outer = policy_set("x", any_of(res("ais")),
                       inner + '<PolicyIdReference>ref</PolicyIdReference>')
    assert values(outer, referenced) == {"inner-action", "by-reference"}
    assert values(outer, referenced, pid="nope") == frozenset()


def test_a_condition_on_the_action_is_not_a_target_value():
    condition = (f'<Rule RuleId="c" Effect="Permit"><Condition><Apply FunctionId='
                 f'"urn:oasis:names:tc:xacml:1.0:function:string-is-in"><AttributeValue '
                 f'DataType="http://www.w3.org/2001/XMLSchema#string">hidden</AttributeValue>'
                 f'<AttributeDesignator Category="{ACT}" AttributeId="{AID}" MustBePresent="false" '
                 f'DataType="http://www.w3.org/2001/XMLSchema#string"/></Apply></Condition></Rule>')
    assert values(policy("x", any_of(res("w")), condition)) == frozenset()
