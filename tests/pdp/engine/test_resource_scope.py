"""PolicyEngine.resource_scope: which resource-ids a top-level document can apply to, or None.

Exact answers for the shapes that prove something, None for every shape that does not, and a
soundness check: a document is NotApplicable to every request whose resource-id is outside its
scope (whatever the other attributes), for random documents of every shape.
"""
from __future__ import annotations

import random

import pytest

from pdp import PolicyLoadError
from pdp.engine import PolicyEngine, PolicySource
from pdp.evaluation import NOT_APPLICABLE, EvalContext
from pdp.policy_scope import confined_resource_ids
from pdp.request import parse_request

from ._gen import ACT, AID, NS, RES, RID, SUBJ, S, match, request_xml
from .test_incremental import REQUESTS, document

RULE = "urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:"
POL = "urn:oasis:names:tc:xacml:3.0:policy-combining-algorithm:"
F = "urn:oasis:names:tc:xacml:1.0:function:"
XML = "application/xacml+xml"


def any_of(*all_ofs: str) -> str:
    return "<AnyOf>" + "".join(f"<AllOf>{a}</AllOf>" for a in all_ofs) + "</AnyOf>"


def res(value: str, mbp: bool = False) -> str:
    return match(value, RES, RID, mbp)


def act(value: str) -> str:
    return match(value, ACT, AID)


def rule(rid: str, target: str = "", effect: str = "Permit") -> str:
    return f'<Rule RuleId="{rid}" Effect="{effect}"><Target>{target}</Target></Rule>'


def policy(pid: str, target: str, rules: str = "", alg: str = "deny-overrides",
           version: str = "1.0", ns: bool = True) -> str:
    xmlns = f' xmlns="{NS}"' if ns else ""
    return (f'<Policy{xmlns} PolicyId="{pid}" Version="{version}" RuleCombiningAlgId="{RULE}{alg}">'
            f'<Target>{target}</Target>{rules or rule(pid + "-r")}</Policy>')


def policy_set(psid: str, target: str, children: str, alg: str = "deny-overrides") -> str:
    return (f'<PolicySet xmlns="{NS}" PolicySetId="{psid}" Version="1.0" '
            f'PolicyCombiningAlgId="{POL}{alg}"><Target>{target}</Target>{children}</PolicySet>')


def scope_of(*docs: str, pid: str = "x"):
    engine = PolicyEngine.compile([PolicySource(f"s{i}", d.encode()) for i, d in enumerate(docs)])
    return engine.resource_scope(pid)


def inner(pid: str, target: str, rules: str = "", alg: str = "deny-overrides") -> str:
    return policy(pid, target, rules, alg, ns=False)


OTHER_MATCH = (
    '<Match MatchId="urn:oasis:names:tc:xacml:3.0:function:string-equal-ignore-case">'
    f'<AttributeValue DataType="{S}">a'
    f'</AttributeValue><AttributeDesignator Category="{RES}" AttributeId="{RID}" '
    f'DataType="{S}" MustBePresent="false"/></Match>'
)
URI = "http://www.w3.org/2001/XMLSchema#anyURI"
URI_MATCH = (f'<Match MatchId="{F}anyURI-equal"><AttributeValue DataType="{URI}">a'
             f'</AttributeValue><AttributeDesignator Category="{RES}" AttributeId="{RID}" '
             f'DataType="{URI}" MustBePresent="false"/></Match>')
ISSUED = (f'<Match MatchId="{F}string-equal"><AttributeValue DataType="{S}">a</AttributeValue>'
          f'<AttributeDesignator Category="{RES}" AttributeId="{RID}" DataType="{S}" '
          f'MustBePresent="false" Issuer="someone"/></Match>')
SUBJECT_RID = match("a", SUBJ, RID)  # the resource-id attribute id in another category


@pytest.mark.parametrize("target, expected", [
    (any_of(res("a")), {"a"}),
    (any_of(res("a"), res("b")), {"a", "b"}),
    (any_of(res("a") + act("read"), res("b")), {"a", "b"}),  # other matches beside it
    (any_of(res("a") + res("b")), {"a", "b"}),  # both literals of one AllOf
    (any_of(res("a"), res("b")) + any_of(res("a")), {"a"}),  # the smallest proof
    (any_of(act("read")) + any_of(res("a")), {"a"}),
])
def test_targets_that_confine(target, expected):
    assert scope_of(policy("x", target)) == frozenset(expected)


@pytest.mark.parametrize("target", [
    "",  # no constraint
    any_of(act("read")),
    any_of(res("a", mbp=True)),  # absent resource-id: Indeterminate, not NotApplicable
    any_of(res("a"), act("read")),  # one AllOf without a resource-id match
    any_of(OTHER_MATCH),
    any_of(URI_MATCH),
    any_of(ISSUED),
    any_of(SUBJECT_RID),
])
def test_targets_that_do_not_confine(target):
    assert scope_of(policy("x", target, rule("r"))) is None


def test_rules_and_children():
    # A Policy without target whose every rule is confined: the union.
    rules = rule("r1", any_of(res("a"))) + rule("r2", any_of(res("b")))
    assert scope_of(policy("x", "", rules)) == {"a", "b"}
    assert scope_of(policy("x", "", rules + rule("r3"))) is None
    assert scope_of(policy("x", "", rules, alg="deny-unless-permit")) is None
    assert scope_of(policy("x", "", rules, alg="permit-unless-deny")) is None
    # Its own target wins when smaller; the children when they are.
    assert scope_of(policy("x", any_of(res("a")), rules)) == {"a"}
    assert scope_of(policy("x", any_of(res("a"), res("b"), res("c")), rules)) == {"a", "b"}
    # PolicySets: children inline and by reference.
    kids = inner("k1", any_of(res("a"))) + inner("k2", any_of(res("b")))
    assert scope_of(policy_set("x", "", kids)) == {"a", "b"}
    assert scope_of(policy_set("x", "", kids, alg="deny-unless-permit")) is None
    assert scope_of(policy_set("x", "", kids + inner("k3", ""))) is None
    assert scope_of(policy_set("x", "", "")) == frozenset()  # no children: never applicable
    ref = "<PolicyIdReference>leaf</PolicyIdReference>"
    assert scope_of(policy_set("x", "", ref), policy("leaf", any_of(res("c")))) == {"c"}
    assert scope_of(policy_set("x", "", ref), policy("leaf", "")) is None
    assert scope_of(policy_set("x", any_of(res("d")), ref), policy("leaf", "")) == {"d"}
    # Through two levels of references.
    mid = policy_set("mid", "", ref)
    top = policy_set("x", "", "<PolicySetIdReference>mid</PolicySetIdReference>")
    assert scope_of(top, mid, policy("leaf", any_of(res("e")))) == {"e"}


def test_unknown_ids_and_versions():
    a1 = policy("x", any_of(res("a")), version="1.0")
    a2 = policy("x", any_of(res("b")), version="2.0")
    assert scope_of(a1, a2) == {"a", "b"}  # every version is a root child
    assert scope_of(a1, policy("x", "", version="2.0")) is None
    assert scope_of(a1, pid="absent") is None
    engine = PolicyEngine.compile([PolicySource("a", a1.encode())])
    assert engine.with_changes(remove_ids=["x"]).resource_scope("x") is None
    assert engine.resource_scope("x") == {"a"}  # the old generation still answers


def test_scope_is_sound_on_random_documents():
    """Outside its scope a document is NotApplicable, whatever else the request says."""
    rng = random.Random(7)
    checked = 0
    for _ in range(300):
        docs = [PolicySource(f"d{k}", document(k, rng.randrange(192))) for k in range(14)]
        try:
            engine = PolicyEngine.compile(docs)
        except PolicyLoadError:  # a generated document may not compile: the next one
            continue
        for pid in engine.policies:
            scope = engine.resource_scope(pid)
            if scope is None:
                continue
            (slot,) = engine._versions[pid]
            ev = engine._by_slot[slot].compiled.evaluator
            for r in REQUESTS + _outside_requests(scope):
                (ind,) = r.individuals()
                values = ind.bags.get((RES, RID, S), ())
                if any(v in scope for v in values):
                    continue
                assert ev.evaluate(EvalContext(ind.bags, engine._links)).decision == NOT_APPLICABLE
                checked += 1
    assert checked > 1000


def _outside_requests(scope) -> list:
    return [parse_request(request_xml("alice", r, a, lv), XML)
            for r in ("r0", "r1", "r2", "r3", "zz", None) if r not in scope
            for a in ("read", "delete", None) for lv in (0, 5)]


def test_agrees_with_the_ownership_rule_on_documents_without_references():
    """Where pdp.policy_scope proves confinement from the XML, the compiled scope is proven
    too and is no larger (it keeps the smallest proof, the XML rule unites them)."""
    rng = random.Random(3)
    compared = 0
    for _ in range(400):
        data = document(rng.randrange(14), rng.randrange(192))
        if b"IdReference" in data:
            continue
        confined = confined_resource_ids(data)
        engine = PolicyEngine.compile([PolicySource("d", data)])
        ours = engine.resource_scope(engine._entries[0].info.id)
        if confined is not None:
            assert ours is not None and ours <= confined
            compared += 1
    assert compared > 50


def test_example_policies():
    from pdp.service import load_sources, policy_files
    from tests.pdp.api.conftest import POLICIES

    engine = PolicyEngine.compile(load_sources(policy_files(POLICIES)))
    for pid in engine.policies:
        scope = engine.resource_scope(pid)
        (slot,) = engine._versions[pid]
        confined = confined_resource_ids(engine._by_slot[slot].source.data)
        assert scope is not None, pid  # every shipped example names its streams
        if confined is not None:
            assert scope <= confined


ROOT_10 = "urn:oasis:names:tc:xacml:1.0:policy-combining-algorithm:"


def test_never_permits_a_resource_no_document_can_apply_to():
    a = PolicySource("a", policy("pa", any_of(res("a"))).encode())
    bc = PolicySource("bc", policy("pb", any_of(res("b"), res("c"))).encode())
    engine = PolicyEngine.compile([a, bc])
    assert not engine.never_permits("a") and not engine.never_permits("c")
    assert engine.never_permits("z")
    after = engine.with_changes(remove_ids=["pa"])
    assert after.never_permits("a") and not engine.never_permits("a")  # per generation
    anywhere = PolicyEngine.compile([a, PolicySource("w", policy("pw", "").encode())])
    assert not anywhere.never_permits("z")  # a document without a scope proves nothing
    assert PolicyEngine.compile([]).never_permits("z")


@pytest.mark.parametrize("alg, expected", [
    (POL + "permit-unless-deny", False),  # permits what no document applies to
    (POL + "deny-unless-permit", True),   # denies it
    (POL + "deny-overrides", True),
    (ROOT_10 + "first-applicable", True),
])
def test_never_permits_follows_the_root_algorithm(alg, expected):
    a = PolicySource("a", policy("pa", any_of(res("a"))).encode())
    assert PolicyEngine.compile([a], root_combining_alg=alg).never_permits("z") is expected


def test_never_permits_nothing_under_a_named_root():
    a = PolicySource("a", policy("pa", any_of(res("a"))).encode())
    assert not PolicyEngine.compile([a], root_policy_id="pa").never_permits("z")


def test_never_permits_is_sound_on_random_documents():
    """A resource the engine says is never permitted gets no Permit, whatever else the request
    says, under every root algorithm."""
    rng = random.Random(11)
    checked = 0
    for trial in range(120):
        docs = [PolicySource(f"d{k}", document(k, rng.randrange(192)))
                for k in range(rng.randrange(1, 6))]
        alg = rng.choice([POL + "deny-overrides", POL + "permit-overrides",
                          POL + "deny-unless-permit", POL + "permit-unless-deny"])
        try:
            engine = PolicyEngine.compile(docs, root_combining_alg=alg)
        except PolicyLoadError:  # a generated document may not compile: the next one
            continue
        for r in ("r0", "r1", "r2", "r3", "zz"):
            if not engine.never_permits(r):
                continue
            for a in ("read", "delete", None):
                for lv in (0, 5):
                    ctx = parse_request(request_xml("alice", r, a, lv), XML)
                    (result,) = engine.decide(ctx).results
                    assert result.decision.value != "Permit", (trial, r, a, lv)
                    checked += 1
    assert checked > 200
