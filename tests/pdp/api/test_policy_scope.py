"""confined_resource_ids: which policies are provably confined to a set of resource ids.

Each confined case is also checked against the real engine: the policy must be NotApplicable to
a request for a resource outside the set (and applicable to one inside), so the proof and the
PDP's own Target semantics cannot drift apart silently.
"""
from __future__ import annotations

import pytest

from pdp.engine import PolicyEngine, PolicySource
from pdp.policy_scope import confined_resource_ids
from pdp.request import parse_request
from pdp.results import Decision

NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
STR = "http://www.w3.org/2001/XMLSchema#string"
RES = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
SUBJ = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
RID = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"
SID = "urn:oasis:names:tc:xacml:1.0:subject:subject-id"
EQ = "urn:oasis:names:tc:xacml:1.0:function:string-equal"
REGEXP = "urn:oasis:names:tc:xacml:1.0:function:string-regexp-match"
PERMIT_ALL = "urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:permit-overrides"


def match(value: str, *, func: str = EQ, category: str = RES, attr: str = RID,
          datatype: str = STR, must: str = "false", issuer: str | None = None) -> str:
    issuer_attr = f' Issuer="{issuer}"' if issuer else ""
    return (f'<Match MatchId="{func}"><AttributeValue DataType="{datatype}">{value}'
            f'</AttributeValue><AttributeDesignator Category="{category}" AttributeId="{attr}" '
            f'DataType="{datatype}" MustBePresent="{must}"{issuer_attr}/></Match>')


def res(value: str, **kw) -> str:
    return match(value, **kw)


def subj(value: str) -> str:
    return match(value, category=SUBJ, attr=SID)


def all_of(*matches: str) -> str:
    return "<AllOf>" + "".join(matches) + "</AllOf>"


def any_of(*all_ofs: str) -> str:
    return "<AnyOf>" + "".join(all_ofs) + "</AnyOf>"


def policy(*any_ofs: str, pid: str = "urn:t:p", target: bool = True) -> bytes:
    tgt = ("<Target>" + "".join(any_ofs) + "</Target>") if target else ""
    return (f'<Policy xmlns="{NS}" PolicyId="{pid}" Version="1.0" '
            f'RuleCombiningAlgId="{PERMIT_ALL}">'
            f'{tgt}<Rule RuleId="{pid}:r" Effect="Permit"/></Policy>').encode()


def policy_set(outer: str, *children: str, pid: str = "urn:t:ps") -> bytes:
    alg = "urn:oasis:names:tc:xacml:3.0:policy-combining-algorithm:permit-overrides"
    return (f'<PolicySet xmlns="{NS}" PolicySetId="{pid}" Version="1.0" '
            f'PolicyCombiningAlgId="{alg}"><Target>{outer}</Target>{"".join(children)}'
            f'</PolicySet>').encode()


def inner_policy(pid: str, *any_ofs: str) -> str:
    return policy(*any_ofs, pid=pid).decode()


def request(resources: list[str], subject: str = "alice") -> bytes:
    values = "".join(f'<AttributeValue DataType="{STR}">{r}</AttributeValue>' for r in resources)
    res_attr = (f'<Attribute AttributeId="{RID}" IncludeInResult="false">{values}</Attribute>'
                if resources else "")
    return (f'<Request xmlns="{NS}" ReturnPolicyIdList="false" CombinedDecision="false">'
            f'<Attributes Category="{SUBJ}"><Attribute AttributeId="{SID}" IncludeInResult="false">'
            f'<AttributeValue DataType="{STR}">{subject}</AttributeValue></Attribute></Attributes>'
            f'<Attributes Category="{RES}">{res_attr}</Attributes></Request>').encode()


def decide(doc: bytes, resources: list[str], subject: str = "alice") -> Decision:
    engine = PolicyEngine.compile([PolicySource("t", doc)])
    ctx = parse_request(request(resources, subject), "application/xacml+xml")
    return engine.decide(ctx).results[0].decision


CONFINED = {
    "one stream": (policy(any_of(all_of(res("a")))), {"a"}),
    "alternatives in one AnyOf": (policy(any_of(all_of(res("a")), all_of(res("b")))), {"a", "b"}),
    "extra matches in the AllOf": (policy(any_of(all_of(subj("alice"), res("a")))), {"a"}),
    "another AnyOf beside it": (policy(any_of(all_of(subj("alice"))), any_of(all_of(res("a")))),
                                {"a"}),
    "two confining AnyOfs: union": (policy(any_of(all_of(res("a")), all_of(res("b"))),
                                           any_of(all_of(res("a")))), {"a", "b"}),
    "two resource matches in one AllOf: both": (policy(any_of(all_of(res("a"), res("b")))),
                                                {"a", "b"}),
    "with an Issuer": (policy(any_of(all_of(res("a", issuer="x")))), {"a"}),
    "MustBePresent 0": (policy(any_of(all_of(res("a", must="0")))), {"a"}),
    "PolicySet with nested policies": (
        policy_set(any_of(all_of(res("a"))),
                   inner_policy("urn:t:in", any_of(all_of(subj("alice"))))),
        {"a"}),
    "value kept verbatim": (policy(any_of(all_of(res(" a ")))), {" a "}),
}


@pytest.mark.parametrize("name", sorted(CONFINED))
def test_confined(name):
    doc, expected = CONFINED[name]
    assert confined_resource_ids(doc) == frozenset(expected)


@pytest.mark.parametrize("name", [n for n in sorted(CONFINED) if n not in (
    "with an Issuer", "two resource matches in one AllOf: both", "value kept verbatim")])
def test_confined_policies_are_not_applicable_elsewhere(name):
    doc, expected = CONFINED[name]
    for outside in (["zz"], [], ["A"], ["a-"]):
        assert decide(doc, outside) is Decision.NOT_APPLICABLE, outside
    assert decide(doc, [sorted(expected)[0]]) is not Decision.NOT_APPLICABLE


def test_every_value_of_a_bag_counts():
    # A request with several resource-ids gets past one AnyOf on a and another on b: that is
    # why S is the union of the confining AnyOfs and not their intersection.
    doc = policy(any_of(all_of(res("a"))), any_of(all_of(res("b"))))
    assert decide(doc, ["a", "b"]) is Decision.PERMIT
    assert confined_resource_ids(doc) == frozenset({"a", "b"})


NOT_CONFINED = {
    "no target": policy(target=False),
    "empty target": policy(),
    "only a subject match": policy(any_of(all_of(subj("alice")))),
    "an AllOf lacking the resource match": policy(any_of(all_of(res("a")), all_of(subj("x")))),
    "string-regexp-match": policy(any_of(all_of(res("a.*", func=REGEXP)))),
    "ignore-case": policy(any_of(all_of(res(
        "a", func="urn:oasis:names:tc:xacml:3.0:function:string-equal-ignore-case")))),
    "resource-id in the subject category": policy(any_of(all_of(res("a", category=SUBJ)))),
    "resource-id under a 1.0-style resource category": policy(any_of(all_of(res(
        "a", category="urn:oasis:names:tc:xacml:1.0:resource-category:resource")))),
    "category shorthand": policy(any_of(all_of(res("a", category="Resource")))),
    "another resource attribute": policy(any_of(all_of(res(
        "a", attr="urn:oasis:names:tc:xacml:1.0:resource:resource-location")))),
    "anyURI resource-id": policy(any_of(all_of(res(
        "a", func="urn:oasis:names:tc:xacml:1.0:function:anyURI-equal",
        datatype="http://www.w3.org/2001/XMLSchema#anyURI")))),
    "MustBePresent true": policy(any_of(all_of(res("a", must="true")))),
    "PolicySet with a PolicyIdReference": policy_set(
        any_of(all_of(res("a"))), '<PolicyIdReference>urn:t:other</PolicyIdReference>'),
    "PolicySet with a PolicySetIdReference": policy_set(
        any_of(all_of(res("a"))), '<PolicySetIdReference>urn:t:other</PolicySetIdReference>'),
    "PolicySet confined only in a child": policy_set(
        "", inner_policy("urn:t:in", any_of(all_of(res("a"))))),
    "wrong namespace": policy(any_of(all_of(res("a")))).replace(NS.encode(), b"urn:other"),
    "not a policy": f'<Request xmlns="{NS}"/>'.encode(),
    "malformed": b"<Policy",
    "empty": b"",
    "a DOCTYPE": b'<!DOCTYPE Policy [<!ENTITY e "a">]>' + policy(any_of(all_of(res("&e;")))),
    "two Targets": policy(any_of(all_of(res("a")))).replace(
        b"<Rule", b"<Target>" + any_of(all_of(subj("x"))).encode() + b"</Target><Rule"),
}


@pytest.mark.parametrize("name", sorted(NOT_CONFINED))
def test_not_confined(name):
    assert confined_resource_ids(NOT_CONFINED[name]) is None


@pytest.mark.parametrize("name", ["no target", "empty target", "only a subject match",
                                  "an AllOf lacking the resource match"])
def test_refused_policies_really_reach_other_resources(name):
    # The refusals that matter: these documents do decide requests for other resources.
    assert decide(NOT_CONFINED[name], ["zz"], subject="x" if "AllOf" in name else "alice") \
        is Decision.PERMIT


def test_must_be_present_true_would_reach_requests_without_a_resource():
    doc = policy(any_of(all_of(res("a", must="true"))))
    assert decide(doc, []) is Decision.INDETERMINATE
    assert confined_resource_ids(doc) is None
