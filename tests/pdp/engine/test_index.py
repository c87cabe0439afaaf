"""The target index is an optimisation only: indexed and full-scan decisions must be identical."""
from __future__ import annotations

import random

import pytest

import pdp.index
from pdp.combining import SHORT_POLICY_ALGS
from pdp.engine import PolicyEngine, PolicySource
from pdp.request import parse_request

from ._gen import ACT, AID, NS, RES, RID, match, random_policies, request_xml, simple_policy

RESOURCES = [f"r{i}" for i in range(12)]
ACTIONS = ["read", "write", "delete"]


def _policy_set(i: int, children: list[bytes], alg: str) -> bytes:
    inner = b"".join(c.replace(f' xmlns="{NS}"'.encode(), b"") for c in children)
    return (f'<PolicySet xmlns="{NS}" PolicySetId="ps{i}" Version="1.0" PolicyCombiningAlgId='
            f'"{SHORT_POLICY_ALGS[alg]}"><Target><AnyOf><AllOf>{match("delete", ACT, AID)}'
            f'</AllOf></AnyOf></Target>').encode() + inner + b"</PolicySet>"


def _many_rules_policy(rng: random.Random) -> bytes:
    rules = []
    for j in range(20):
        effect = rng.choice(["Permit", "Deny"])
        rules.append(f'<Rule RuleId="mr{j}" Effect="{effect}"><Target><AnyOf><AllOf>'
                     f'{match(rng.choice(RESOURCES), RES, RID, rng.random() < 0.3)}'
                     f'</AllOf><AllOf>{match(rng.choice(ACTIONS), ACT, AID)}</AllOf></AnyOf>'
                     f'</Target></Rule>')
    return (f'<Policy xmlns="{NS}" PolicyId="many-rules" Version="1.0" RuleCombiningAlgId='
            f'"urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable"><Target>'
            f'<AnyOf><AllOf>{match("r1", RES, RID)}</AllOf></AnyOf></Target>'
            + "".join(rules) + "</Policy>").encode()


def _documents(rng: random.Random) -> list[PolicySource]:
    docs = [PolicySource(f"d{i}", p) for i, p in
            enumerate(random_policies(rng, 40, RESOURCES, ACTIONS))]
    # Offset the ids so that the nested policies do not clash with the top-level ones.
    nested = [p.replace(b'PolicyId="p', b'PolicyId="n').replace(b'RuleId="r', b'RuleId="n')
              for p in random_policies(rng, 12, RESOURCES, ACTIONS)]
    docs.append(PolicySource("set", _policy_set(0, nested, rng.choice(list(SHORT_POLICY_ALGS)))))
    docs.append(PolicySource("rules", _many_rules_policy(rng)))
    return docs


def _random_request(rng: random.Random) -> bytes:
    resource = None if rng.random() < 0.1 else rng.choice(RESOURCES + ["unknown"])
    action = None if rng.random() < 0.1 else rng.choice(ACTIONS)
    level = None if rng.random() < 0.1 else rng.randint(0, 6)
    return request_xml("alice", resource, action, level)


@pytest.mark.parametrize("alg", sorted(SHORT_POLICY_ALGS))
def test_index_never_changes_a_decision(alg, monkeypatch):
    rng = random.Random(sum(alg.encode()))
    docs = _documents(rng)
    indexed = PolicyEngine.compile(docs, alg)
    monkeypatch.setattr(pdp.index, "MIN_CHILDREN", 10**9)
    full = PolicyEngine.compile(docs, alg)
    assert indexed._root.index is not None and full._root.index is None
    for _ in range(150):
        req = parse_request(_random_request(rng), "application/xml")
        assert indexed.decide_with_trace(req) == full.decide_with_trace(req)


def test_index_skips_policies_that_cannot_match():
    docs = [PolicySource(f"p{i}", simple_policy(i, f"res{i}", "read")) for i in range(100)]
    engine = PolicyEngine.compile(docs)
    req = parse_request(request_xml("a", "res7", "read", 5), "application/xml")
    (ind,) = req.individuals()
    positions = engine._root.index.candidate_positions(ind.bags)
    assert positions == [7]
    # Missing resource-id: policies with MustBePresent would be Indeterminate, so they stay.
    docs2 = [PolicySource(f"p{i}", simple_policy(i, f"res{i}", "read", mbp=(i % 10 == 0)))
             for i in range(100)]
    engine2 = PolicyEngine.compile(docs2)
    (ind2,) = parse_request(request_xml("a", None, "read", 5), "application/xml").individuals()
    assert engine2._root.index.candidate_positions(ind2.bags) == list(range(0, 100, 10))
