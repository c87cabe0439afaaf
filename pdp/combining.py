"""The standard combining algorithms of XACML 3.0 (Appendix C), current and legacy.

Each algorithm is a function `(children, ctx) -> Outcome` (a `pdp.evaluation.Combiner`).
Children are anything with `evaluate(ctx) -> Outcome` (`Evaluable`: rules, policies, references);
only-one-applicable also calls `is_applicable(ctx)` (`Applicable`), so it combines policies only.

Obligations and advice: the combined result carries those of EVERY evaluated child whose decision
equals the combined decision. With deny-unless-permit returning Deny because two rules said Deny,
both rules' obligations are returned (the `Rule_Obligations` conformance cases); with
deny-overrides the first Deny stops evaluation, so later rules are not evaluated at all.

The ids of evaluated non-NotApplicable children (policies only) are concatenated for
ReturnPolicyIdList, and the top-level documents that took part are unioned for the decision
trace.

Every algorithm but first- and only-one-applicable is a mirror pair (deny vs permit wins), so
each family is written once, in `_overrides`, parameterised by the winning effect and by what
errors lead to; the closures are built once at import, so a decision pays no dispatch on the mode.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from pdp.errors import Indeterminate
from pdp.evaluation import (
    DENY,
    IND_D,
    IND_DP,
    IND_P,
    NA_OUTCOME,
    NOT_APPLICABLE,
    PERMIT,
    Applicable,
    Combiner,
    EvalContext,
    Evaluable,
    Grant,
    Obligations,
    Outcome,
    PolicyCombiner,
    RuleCombiner,
    status_of,
    status_of_bug,
)
from pdp.results import STATUS_PROCESSING_ERROR, PolicyIdentifier, Status

_EMPTY: frozenset[str] = frozenset()


def _finish(decision: int, status: Status | None, contributing: Sequence[Outcome],
            evaluated: Sequence[Outcome]) -> Outcome:
    if len(contributing) == 1 and len(evaluated) == 1 and status is None:
        return contributing[0]
    obligations: Obligations = ()
    advice: Obligations = ()
    grants: tuple[Grant, ...] = ()
    for o in contributing:
        if o.obligations:
            obligations += o.obligations
        if o.advice:
            advice += o.advice
        if o.grants:
            grants += o.grants
    policy_ids: tuple[PolicyIdentifier, ...] = ()
    docs = _EMPTY
    for o in evaluated:
        if o.policy_ids:
            policy_ids += o.policy_ids
        if o.docs:
            docs = docs | o.docs
    return Outcome(decision, status, obligations, advice, policy_ids, docs, grants)


def _first_status(outcomes: Sequence[Outcome], codes: tuple[int, ...]) -> Status | None:
    for o in outcomes:
        if o.decision in codes:
            return o.status
    return None


_OTHER = {DENY: PERMIT, PERMIT: DENY}
_IND_OF = {DENY: IND_D, PERMIT: IND_P}
_ANY_IND = (IND_D, IND_P, IND_DP)

# How an overrides algorithm ends when no child decided the winning effect but some child was
# Indeterminate: (evaluated, losers, err_w, err_l, err_dp) -> Outcome, the flags saying whether a
# child was Indeterminate{winner}, {loser} or {DP}. Without errors every variant agrees (the
# losers' effect, else NotApplicable), so that common path never pays for this call.
OnErrors = Callable[[list[Outcome], list[Outcome], bool, bool, bool], Outcome]


def _errors_3_0(winner: int) -> OnErrors:
    """Annex C.2/C.3: an error that could have been the winner taints the losing effect."""
    loser, ind_w, ind_l = _OTHER[winner], _IND_OF[winner], _IND_OF[_OTHER[winner]]
    only_w, only_l = (ind_w,), (ind_l,)

    def on_errors(evaluated: list[Outcome], losers: list[Outcome], err_w: bool, err_l: bool,
                  err_dp: bool) -> Outcome:
        if err_dp or (err_w and (err_l or losers)):
            return _finish(IND_DP, _first_status(evaluated, _ANY_IND), (), evaluated)
        if err_w:
            return _finish(ind_w, _first_status(evaluated, only_w), (), evaluated)
        if losers:
            return _finish(loser, None, losers, evaluated)
        return _finish(ind_l, _first_status(evaluated, only_l), (), evaluated)
    return on_errors


def _errors_legacy_rules(winner: int) -> OnErrors:
    """Legacy rule algorithms: an error that might have been the winner makes it {DP}."""
    loser, ind_l = _OTHER[winner], _IND_OF[_OTHER[winner]]
    potential = (_IND_OF[winner], IND_DP)

    def on_errors(evaluated: list[Outcome], losers: list[Outcome], err_w: bool, err_l: bool,
                  err_dp: bool) -> Outcome:
        if err_w or err_dp:
            return _finish(IND_DP, _first_status(evaluated, potential), (), evaluated)
        if losers:
            return _finish(loser, None, losers, evaluated)
        return _finish(ind_l, _first_status(evaluated, _ANY_IND), (), evaluated)
    return on_errors


def _errors_legacy_policies(winner: int) -> OnErrors:
    """Legacy policy algorithms: the losing effect beats errors; errors alone are {DP}.

    Legacy deny-overrides stops at the first error instead (`error_is_winner` of `_overrides`),
    so only legacy permit-overrides ever gets here.
    """
    loser = _OTHER[winner]

    def on_errors(evaluated: list[Outcome], losers: list[Outcome], err_w: bool, err_l: bool,
                  err_dp: bool) -> Outcome:
        if losers:
            return _finish(loser, None, losers, evaluated)
        return _finish(IND_DP, _first_status(evaluated, _ANY_IND), (), evaluated)
    return on_errors


def _errors_unless(winner: int) -> OnErrors:
    """deny-unless-permit / permit-unless-deny ignore errors: never Indeterminate."""
    loser = _OTHER[winner]

    def on_errors(evaluated: list[Outcome], losers: list[Outcome], err_w: bool, err_l: bool,
                  err_dp: bool) -> Outcome:
        return _finish(loser, None, losers, evaluated)
    return on_errors


def _overrides(winner: int, on_errors: OnErrors, error_is_winner: bool = False,
               when_none: Outcome = NA_OUTCOME) -> Combiner[Evaluable]:
    """The overrides family: the first child deciding `winner` decides alone, at once.

    `error_is_winner` is legacy policy deny-overrides, where an Indeterminate policy counts as
    the winning effect (without its obligations) and also stops evaluation. `when_none` is the
    result when no child decided anything: NotApplicable, except for the unless algorithms.
    """
    loser, ind_w, ind_l = _OTHER[winner], _IND_OF[winner], _IND_OF[_OTHER[winner]]

    def combine(children: Sequence[Evaluable], ctx: EvalContext) -> Outcome:
        evaluated: list[Outcome] = []
        losers: list[Outcome] = []
        err_w = err_l = err_dp = False
        for child in children:
            o = child.evaluate(ctx)
            d = o.decision
            if d == NOT_APPLICABLE:
                continue
            evaluated.append(o)
            if d == winner:
                return _finish(winner, None, (o,), evaluated)
            if d == loser:
                losers.append(o)
            elif error_is_winner:
                return _finish(winner, None, (), evaluated)
            elif d == ind_w:
                err_w = True
            elif d == ind_l:
                err_l = True
            else:
                err_dp = True
        if err_w or err_l or err_dp:
            return on_errors(evaluated, losers, err_w, err_l, err_dp)
        if losers:
            return _finish(loser, None, losers, evaluated)
        return when_none
    return combine


def _named(name: str, fn: Combiner[Evaluable]) -> Combiner[Evaluable]:
    fn.__name__ = fn.__qualname__ = name
    return fn


deny_overrides = _named("deny_overrides", _overrides(DENY, _errors_3_0(DENY)))
permit_overrides = _named("permit_overrides", _overrides(PERMIT, _errors_3_0(PERMIT)))
deny_unless_permit = _named(
    "deny_unless_permit", _overrides(PERMIT, _errors_unless(PERMIT), when_none=Outcome(DENY)))
permit_unless_deny = _named(
    "permit_unless_deny", _overrides(DENY, _errors_unless(DENY), when_none=Outcome(PERMIT)))


def first_applicable(children: Sequence[Evaluable], ctx: EvalContext) -> Outcome:
    for child in children:
        o = child.evaluate(ctx)
        if o.decision != NOT_APPLICABLE:
            return o
    return NA_OUTCOME


def only_one_applicable(children: Sequence[Applicable], ctx: EvalContext) -> Outcome:
    selected: Applicable | None = None
    for child in children:
        try:
            applicable = child.is_applicable(ctx)
        except Indeterminate as exc:
            return Outcome(IND_DP, status_of(exc))
        except Exception as exc:  # noqa: BLE001 - a bug in a target must not crash the PDP: Indeterminate
            return Outcome(IND_DP, status_of_bug(exc))
        if applicable:
            if selected is not None:
                return Outcome(IND_DP, Status(
                    STATUS_PROCESSING_ERROR,
                    "only-one-applicable: more than one policy is applicable"))
            selected = child
    if selected is None:
        return NA_OUTCOME
    return selected.evaluate(ctx)


# Legacy (XACML 1.0/1.1) algorithms, with the extended Indeterminate annotations of 3.0 Annex C.

legacy_deny_overrides_rules = _named(
    "legacy_deny_overrides_rules", _overrides(DENY, _errors_legacy_rules(DENY)))
legacy_permit_overrides_rules = _named(
    "legacy_permit_overrides_rules", _overrides(PERMIT, _errors_legacy_rules(PERMIT)))
legacy_deny_overrides_policies = _named(
    "legacy_deny_overrides_policies",
    _overrides(DENY, _errors_legacy_policies(DENY), error_is_winner=True))
legacy_permit_overrides_policies = _named(
    "legacy_permit_overrides_policies", _overrides(PERMIT, _errors_legacy_policies(PERMIT)))


_R1 = "urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:"
_R11 = "urn:oasis:names:tc:xacml:1.1:rule-combining-algorithm:"
_R3 = "urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:"
_P1 = "urn:oasis:names:tc:xacml:1.0:policy-combining-algorithm:"
_P11 = "urn:oasis:names:tc:xacml:1.1:policy-combining-algorithm:"
_P3 = "urn:oasis:names:tc:xacml:3.0:policy-combining-algorithm:"

DENY_OVERRIDES_3_0 = _P3 + "deny-overrides"

RULE_COMBINING: dict[str, RuleCombiner] = {
    _R3 + "deny-overrides": deny_overrides,
    _R3 + "ordered-deny-overrides": deny_overrides,
    _R3 + "permit-overrides": permit_overrides,
    _R3 + "ordered-permit-overrides": permit_overrides,
    _R3 + "deny-unless-permit": deny_unless_permit,
    _R3 + "permit-unless-deny": permit_unless_deny,
    _R1 + "first-applicable": first_applicable,
    _R1 + "deny-overrides": legacy_deny_overrides_rules,
    _R11 + "ordered-deny-overrides": legacy_deny_overrides_rules,
    _R1 + "permit-overrides": legacy_permit_overrides_rules,
    _R11 + "ordered-permit-overrides": legacy_permit_overrides_rules,
}

POLICY_COMBINING: dict[str, PolicyCombiner] = {
    _P3 + "deny-overrides": deny_overrides,
    _P3 + "ordered-deny-overrides": deny_overrides,
    _P3 + "permit-overrides": permit_overrides,
    _P3 + "ordered-permit-overrides": permit_overrides,
    _P3 + "deny-unless-permit": deny_unless_permit,
    _P3 + "permit-unless-deny": permit_unless_deny,
    _P1 + "first-applicable": first_applicable,
    _P1 + "only-one-applicable": only_one_applicable,
    _P1 + "deny-overrides": legacy_deny_overrides_policies,
    _P11 + "ordered-deny-overrides": legacy_deny_overrides_policies,
    _P1 + "permit-overrides": legacy_permit_overrides_policies,
    _P11 + "ordered-permit-overrides": legacy_permit_overrides_policies,
}

SHORT_POLICY_ALGS = {
    "deny-overrides": _P3 + "deny-overrides",
    "permit-overrides": _P3 + "permit-overrides",
    "ordered-deny-overrides": _P3 + "ordered-deny-overrides",
    "ordered-permit-overrides": _P3 + "ordered-permit-overrides",
    "first-applicable": _P1 + "first-applicable",
    "only-one-applicable": _P1 + "only-one-applicable",
    "deny-unless-permit": _P3 + "deny-unless-permit",
    "permit-unless-deny": _P3 + "permit-unless-deny",
}


def policy_combiner(alg_id: str) -> PolicyCombiner:
    """The policy-combining algorithm for a full id or a short name; KeyError if unknown."""
    return POLICY_COMBINING[SHORT_POLICY_ALGS.get(alg_id, alg_id)]


def rule_combiner(alg_id: str) -> RuleCombiner:
    return RULE_COMBINING[alg_id]
