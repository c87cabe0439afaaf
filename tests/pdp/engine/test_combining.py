"""Combining algorithms on synthetic children: decisions, extended Indeterminate, obligations."""
from __future__ import annotations

import pytest

from pdp import combining as c
from pdp.errors import Indeterminate
from pdp.evaluation import DENY, IND_D, IND_DP, IND_P, NOT_APPLICABLE, PERMIT, EvalContext, Outcome
from pdp.results import Obligation, Status

P, D, NA = PERMIT, DENY, NOT_APPLICABLE


class Child:
    def __init__(self, decision, name="", applicable=True):
        self.decision = decision
        self.name = name
        self.applicable = applicable
        self.calls = 0

    def evaluate(self, ctx):
        self.calls += 1
        status = Status("urn:err") if self.decision in (IND_P, IND_D, IND_DP) else None
        obs = (Obligation(self.name),) if self.name and self.decision in (P, D) else ()
        return Outcome(self.decision, status, obs)

    def is_applicable(self, ctx):
        if self.applicable is None:
            raise Indeterminate("target error")
        return self.applicable


CTX = EvalContext({}, {})


def run(alg, decisions):
    return alg([Child(d, f"c{i}") for i, d in enumerate(decisions)], CTX)


@pytest.mark.parametrize("decisions,expected", [
    ([], NA), ([NA, NA], NA), ([P, NA], P), ([P, D], D), ([IND_D, P], IND_DP),
    ([IND_P, P], P), ([IND_P], IND_P), ([IND_D], IND_D), ([IND_DP, P], IND_DP),
    ([IND_P, IND_D], IND_DP), ([IND_DP, D], D),
])
def test_deny_overrides(decisions, expected):
    assert run(c.deny_overrides, decisions).decision == expected


@pytest.mark.parametrize("decisions,expected", [
    ([], NA), ([D, NA], D), ([P, D], P), ([IND_P, D], IND_DP), ([IND_D, D], D),
    ([IND_D], IND_D), ([IND_P], IND_P), ([IND_DP, P], P), ([IND_P, IND_D], IND_DP),
])
def test_permit_overrides(decisions, expected):
    assert run(c.permit_overrides, decisions).decision == expected


@pytest.mark.parametrize("alg,decisions,expected", [
    (c.deny_unless_permit, [], D), (c.deny_unless_permit, [IND_DP, NA], D),
    (c.deny_unless_permit, [D, P], P), (c.permit_unless_deny, [], P),
    (c.permit_unless_deny, [IND_DP], P), (c.permit_unless_deny, [P, D], D),
    (c.first_applicable, [NA, IND_D, P], IND_D), (c.first_applicable, [NA, D, P], D),
    (c.first_applicable, [NA], NA),
])
def test_simple_algorithms(alg, decisions, expected):
    assert run(alg, decisions).decision == expected


def test_first_applicable_stops_at_first_applicable():
    kids = [Child(NA), Child(P), Child(D)]
    assert c.first_applicable(kids, CTX).decision == P
    assert kids[2].calls == 0


def test_only_one_applicable():
    one = [Child(P, applicable=False), Child(D, "x"), Child(P, applicable=False)]
    out = c.only_one_applicable(one, CTX)
    assert out.decision == D and out.obligations == (Obligation("x"),)
    two = [Child(P), Child(D)]
    assert c.only_one_applicable(two, CTX).decision == IND_DP
    err = [Child(P, applicable=False), Child(P, applicable=None)]
    assert c.only_one_applicable(err, CTX).decision == IND_DP
    assert c.only_one_applicable([Child(P, applicable=False)], CTX).decision == NA


def test_legacy_rule_algorithms():
    assert run(c.legacy_deny_overrides_rules, [IND_D, P]).decision == IND_DP
    assert run(c.legacy_deny_overrides_rules, [IND_P, P]).decision == P
    assert run(c.legacy_deny_overrides_rules, [IND_P]).decision == IND_P
    assert run(c.legacy_permit_overrides_rules, [IND_P, D]).decision == IND_DP
    assert run(c.legacy_permit_overrides_rules, [IND_D, D]).decision == D
    assert run(c.legacy_permit_overrides_rules, [IND_D]).decision == IND_D


def test_legacy_policy_algorithms():
    # XACML 1.0 policy deny-overrides: an Indeterminate policy counts as Deny.
    assert run(c.legacy_deny_overrides_policies, [P, IND_P]).decision == D
    assert run(c.legacy_deny_overrides_policies, [P, NA]).decision == P
    assert run(c.legacy_permit_overrides_policies, [IND_D, D]).decision == D
    assert run(c.legacy_permit_overrides_policies, [IND_D]).decision == IND_DP
    assert run(c.legacy_permit_overrides_policies, [IND_D, P]).decision == P


def test_obligations_of_all_children_with_the_final_decision():
    out = run(c.deny_overrides, [P, NA, P])
    assert out.decision == P and {o.id for o in out.obligations} == {"c0", "c2"}
    out = run(c.permit_overrides, [D, D])
    assert {o.id for o in out.obligations} == {"c0", "c1"}
    out = run(c.deny_unless_permit, [D, NA, D])
    assert out.decision == D and {o.id for o in out.obligations} == {"c0", "c2"}
    out = run(c.permit_unless_deny, [P, P])
    assert {o.id for o in out.obligations} == {"c0", "c1"}
    # The overriding decision carries only its own child's obligations.
    out = run(c.deny_overrides, [P, D])
    assert out.decision == D and [o.id for o in out.obligations] == ["c1"]


def test_indeterminate_keeps_the_status():
    out = run(c.deny_overrides, [IND_D])
    assert out.status == Status("urn:err")


def test_every_standard_id_is_known():
    for alg in ("deny-overrides", "permit-overrides", "ordered-deny-overrides",
                "ordered-permit-overrides", "deny-unless-permit", "permit-unless-deny"):
        assert f"urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:{alg}" in c.RULE_COMBINING
        assert (
            f"urn:oasis:names:tc:xacml:3.0:policy-combining-algorithm:{alg}" in c.POLICY_COMBINING
        )
    for legacy in ("1.0:rule-combining-algorithm:deny-overrides",
                   "1.0:rule-combining-algorithm:permit-overrides",
                   "1.0:rule-combining-algorithm:first-applicable",
                   "1.1:rule-combining-algorithm:ordered-deny-overrides",
                   "1.1:rule-combining-algorithm:ordered-permit-overrides"):
        assert "urn:oasis:names:tc:xacml:" + legacy in c.RULE_COMBINING
    for legacy in ("1.0:policy-combining-algorithm:deny-overrides",
                   "1.0:policy-combining-algorithm:permit-overrides",
                   "1.0:policy-combining-algorithm:first-applicable",
                   "1.0:policy-combining-algorithm:only-one-applicable",
                   "1.1:policy-combining-algorithm:ordered-deny-overrides",
                   "1.1:policy-combining-algorithm:ordered-permit-overrides"):
        assert "urn:oasis:names:tc:xacml:" + legacy in c.POLICY_COMBINING
    assert c.policy_combiner("first-applicable") is c.first_applicable
    with pytest.raises(KeyError):
        c.policy_combiner("no-such-algorithm")


# The deny/permit variants are built from one factory; these check they stay true mirrors and
# that the asymmetric legacy policy pair keeps its own behaviour.

_MIRROR = {P: D, D: P, NA: NA, IND_P: IND_D, IND_D: IND_P, IND_DP: IND_DP}


class NamedStatusChild(Child):
    """A child whose Indeterminate status names it, to see which status the result keeps."""

    def evaluate(self, ctx):
        out = super().evaluate(ctx)
        if out.status is not None:
            out.status = Status(f"urn:err:{self.name}")
        return out


def _all_sequences(max_len=4):
    import itertools
    for n in range(max_len + 1):
        yield from itertools.product((P, D, NA, IND_P, IND_D, IND_DP), repeat=n)


@pytest.mark.parametrize("deny_alg,permit_alg", [
    (c.deny_overrides, c.permit_overrides),
    (c.permit_unless_deny, c.deny_unless_permit),
    (c.legacy_deny_overrides_rules, c.legacy_permit_overrides_rules),
])
def test_mirror_pairs_are_exact_mirrors(deny_alg, permit_alg):
    for seq in _all_sequences():
        kids = [NamedStatusChild(d, f"c{i}") for i, d in enumerate(seq)]
        mirrored = [NamedStatusChild(_MIRROR[d], f"c{i}") for i, d in enumerate(seq)]
        a, b = deny_alg(kids, CTX), permit_alg(mirrored, CTX)
        assert _MIRROR[a.decision] == b.decision, seq
        assert a.status == b.status and a.obligations == b.obligations, seq
        assert [k.calls for k in kids] == [k.calls for k in mirrored], seq


def test_indeterminate_dp_keeps_the_first_relevant_status():
    kids = [NamedStatusChild(d, f"c{i}") for i, d in enumerate([IND_P, P, IND_D])]
    out = c.deny_overrides(kids, CTX)
    assert out.decision == IND_DP and out.status == Status("urn:err:c0")
    kids = [NamedStatusChild(d, f"c{i}") for i, d in enumerate([IND_P, P, IND_D])]
    out = c.legacy_deny_overrides_rules(kids, CTX)
    # Legacy: only an error that could have been a Deny explains the {DP}.
    assert out.decision == IND_DP and out.status == Status("urn:err:c2")


def test_legacy_policy_deny_overrides_stops_at_the_first_error():
    kids = [Child(P, "a"), Child(IND_P), Child(D, "late")]
    out = c.legacy_deny_overrides_policies(kids, CTX)
    assert out.decision == D and out.obligations == () and out.status is None
    assert kids[2].calls == 0
    # Its permit mirror is not symmetric: the error waits, and a Deny beats it.
    kids = [Child(D, "a"), Child(IND_D), Child(D, "b")]
    out = c.legacy_permit_overrides_policies(kids, CTX)
    assert out.decision == D and [o.id for o in out.obligations] == ["a", "b"]
    assert kids[2].calls == 1


def test_unless_algorithms_with_nothing_applicable_give_the_default_effect():
    out = run(c.deny_unless_permit, [NA, IND_P])
    assert out.decision == D and out.status is None and out.obligations == ()
    assert run(c.permit_unless_deny, []).decision == P
