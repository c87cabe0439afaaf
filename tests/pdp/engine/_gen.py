"""Generators of synthetic policies and requests for the engine tests (not a test module)."""
from __future__ import annotations

import random

NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
S = "http://www.w3.org/2001/XMLSchema#string"
INT = "http://www.w3.org/2001/XMLSchema#integer"
SUBJ = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
RES = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
ACT = "urn:oasis:names:tc:xacml:3.0:attribute-category:action"
RID = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"
AID = "urn:oasis:names:tc:xacml:1.0:action:action-id"
SID = "urn:oasis:names:tc:xacml:1.0:subject:subject-id"
LEVEL = "urn:example:level"
F = "urn:oasis:names:tc:xacml:1.0:function:"


def match(value: str, category: str, attr: str, mbp: bool = False) -> str:
    return (f'<Match MatchId="{F}string-equal"><AttributeValue DataType="{S}">{value}'
            f'</AttributeValue><AttributeDesignator Category="{category}" AttributeId="{attr}" '
            f'DataType="{S}" MustBePresent="{"true" if mbp else "false"}"/></Match>')


def simple_policy(i: int, resource: str, action: str, effect: str = "Permit",
                  min_level: int = 3, mbp: bool = False, alg: str = "deny-overrides") -> bytes:
    """A policy with a target on resource-id and action-id, a condition and an obligation."""
    return f"""<Policy xmlns="{NS}" PolicyId="p{i}" Version="1.0"
 RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:{alg}">
 <Target><AnyOf><AllOf>{match(resource, RES, RID, mbp)}</AllOf></AnyOf>
  <AnyOf><AllOf>{match(action, ACT, AID, mbp)}</AllOf></AnyOf></Target>
 <Rule RuleId="r{i}" Effect="{effect}">
  <Condition><Apply FunctionId="{F}integer-greater-than-or-equal">
   <Apply FunctionId="{F}integer-one-and-only"><AttributeDesignator Category="{SUBJ}"
    AttributeId="{LEVEL}" DataType="{INT}" MustBePresent="true"/></Apply>
   <AttributeValue DataType="{INT}">{min_level}</AttributeValue></Apply></Condition>
  <ObligationExpressions><ObligationExpression ObligationId="ob{i}" FulfillOn="{effect}">
   <AttributeAssignmentExpression AttributeId="urn:example:who">
    <AttributeDesignator Category="{SUBJ}" AttributeId="{SID}" DataType="{S}"
      MustBePresent="false"/>
   </AttributeAssignmentExpression></ObligationExpression></ObligationExpressions>
 </Rule></Policy>""".encode()


def request_xml(subject: str, resource: str | None, action: str | None, level: int | None) -> bytes:
    def attribute(attribute_id: str, datatype: str, value: object) -> str:
        return (f'<Attribute AttributeId="{attribute_id}" IncludeInResult="false">'
                f'<AttributeValue DataType="{datatype}">{value}</AttributeValue></Attribute>')

    subj = attribute(SID, S, subject)
    if level is not None:
        subj += attribute(LEVEL, INT, level)
    res = "" if resource is None else attribute(RID, S, resource)
    act = "" if action is None else attribute(AID, S, action)
    return (f'<Request xmlns="{NS}" ReturnPolicyIdList="false" CombinedDecision="false">'
            f'<Attributes Category="{SUBJ}">{subj}</Attributes>'
            f'<Attributes Category="{RES}">{res}</Attributes>'
            f'<Attributes Category="{ACT}">{act}</Attributes></Request>').encode()


def random_policies(
    rng: random.Random, n: int, resources: list[str], actions: list[str]
) -> list[bytes]:
    out = []
    for i in range(n):
        out.append(simple_policy(i, rng.choice(resources), rng.choice(actions),
                                 rng.choice(["Permit", "Deny"]), rng.randint(0, 6),
                                 mbp=rng.random() < 0.2,
                                 alg=rng.choice(["deny-overrides", "permit-overrides"])))
    return out
