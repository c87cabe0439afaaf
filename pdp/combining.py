"""The standard combining algorithms of XACML 3.0 (Appendix C), current and legacy.

Each algorithm is a function `(children, ctx) -> Outcome`. Children are anything with
`evaluate(ctx) -> Outcome` (rules, policies, references); only-one-applicable also calls
`is_applicable(ctx)`.

Obligations and advice: the combined result carries those of EVERY evaluated child whose decision
equals the combined decision. With deny-unless-permit returning Deny because two rules said Deny,
both rules' obligations are returned (the `Rule_Obligations` conformance cases); with
deny-overrides the first Deny stops evaluation, so later rules are not evaluated at all.

The ids of evaluated non-NotApplicable children (policies only) are concatenated for
ReturnPolicyIdList, and the top-level documents that took part are unioned for the decision
trace.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from pdp.errors import Indeterminate
from pdp.evaluation import (DENY, IND_D, IND_DP, IND_P, NA_OUTCOME, NOT_APPLICABLE, PERMIT,
                            EvalContext, Outcome, status_of, status_of_bug)
from pdp.results import STATUS_PROCESSING_ERROR, Status

Combiner = Callable[[Sequence[Any], EvalContext], Outcome]

_EMPTY = frozenset()


def _finish(decision: int, status: Status | None, contributing: Sequence[Outcome],
            evaluated: Sequence[Outcome]) -> Outcome:
    if len(contributing) == 1 and len(evaluated) == 1 and status is None:
        return contributing[0]
    obligations: tuple = ()
    advice: tuple = ()
    for o in contributing:
        if o.obligations:
            obligations += o.obligations
        if o.advice:
            advice += o.advice
    policy_ids: tuple = ()
    docs = _EMPTY
    for o in evaluated:
        if o.policy_ids:
            policy_ids += o.policy_ids
        if o.docs:
            docs = docs | o.docs
    return Outcome(decision, status, obligations, advice, policy_ids, docs)


def _first_status(outcomes: Sequence[Outcome], codes: tuple) -> Status | None:
    for o in outcomes:
        if o.decision in codes:
            return o.status
    return None


def deny_overrides(children: Sequence[Any], ctx: EvalContext) -> Outcome:
    evaluated = []
    permits = []
    err_d = err_p = err_dp = False
    for child in children:
        o = child.evaluate(ctx)
        d = o.decision
        if d == NOT_APPLICABLE:
            continue
        evaluated.append(o)
        if d == DENY:
            return _finish(DENY, None, (o,), evaluated)
        if d == PERMIT:
            permits.append(o)
        elif d == IND_D:
            err_d = True
        elif d == IND_P:
            err_p = True
        else:
            err_dp = True
    if err_dp or (err_d and (err_p or permits)):
        return _finish(IND_DP, _first_status(evaluated, (IND_D, IND_P, IND_DP)), (), evaluated)
    if err_d:
        return _finish(IND_D, _first_status(evaluated, (IND_D,)), (), evaluated)
    if permits:
        return _finish(PERMIT, None, permits, evaluated)
    if err_p:
        return _finish(IND_P, _first_status(evaluated, (IND_P,)), (), evaluated)
    return NA_OUTCOME


def permit_overrides(children: Sequence[Any], ctx: EvalContext) -> Outcome:
    evaluated = []
    denies = []
    err_d = err_p = err_dp = False
    for child in children:
        o = child.evaluate(ctx)
        d = o.decision
        if d == NOT_APPLICABLE:
            continue
        evaluated.append(o)
        if d == PERMIT:
            return _finish(PERMIT, None, (o,), evaluated)
        if d == DENY:
            denies.append(o)
        elif d == IND_D:
            err_d = True
        elif d == IND_P:
            err_p = True
        else:
            err_dp = True
    if err_dp or (err_p and (err_d or denies)):
        return _finish(IND_DP, _first_status(evaluated, (IND_D, IND_P, IND_DP)), (), evaluated)
    if err_p:
        return _finish(IND_P, _first_status(evaluated, (IND_P,)), (), evaluated)
    if denies:
        return _finish(DENY, None, denies, evaluated)
    if err_d:
        return _finish(IND_D, _first_status(evaluated, (IND_D,)), (), evaluated)
    return NA_OUTCOME


def first_applicable(children: Sequence[Any], ctx: EvalContext) -> Outcome:
    for child in children:
        o = child.evaluate(ctx)
        if o.decision != NOT_APPLICABLE:
            return o
    return NA_OUTCOME


def deny_unless_permit(children: Sequence[Any], ctx: EvalContext) -> Outcome:
    evaluated = []
    denies = []
    for child in children:
        o = child.evaluate(ctx)
        d = o.decision
        if d == NOT_APPLICABLE:
            continue
        evaluated.append(o)
        if d == PERMIT:
            return _finish(PERMIT, None, (o,), evaluated)
        if d == DENY:
            denies.append(o)
    return _finish(DENY, None, denies, evaluated)


def permit_unless_deny(children: Sequence[Any], ctx: EvalContext) -> Outcome:
    evaluated = []
    permits = []
    for child in children:
        o = child.evaluate(ctx)
        d = o.decision
        if d == NOT_APPLICABLE:
            continue
        evaluated.append(o)
        if d == DENY:
            return _finish(DENY, None, (o,), evaluated)
        if d == PERMIT:
            permits.append(o)
    return _finish(PERMIT, None, permits, evaluated)


def only_one_applicable(children: Sequence[Any], ctx: EvalContext) -> Outcome:
    selected = None
    for child in children:
        try:
            applicable = child.is_applicable(ctx)
        except Indeterminate as exc:
            return Outcome(IND_DP, status_of(exc))
        except Exception as exc:
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

def legacy_deny_overrides_rules(children: Sequence[Any], ctx: EvalContext) -> Outcome:
    evaluated = []
    permits = []
    error = potential_deny = False
    for child in children:
        o = child.evaluate(ctx)
        d = o.decision
        if d == NOT_APPLICABLE:
            continue
        evaluated.append(o)
        if d == DENY:
            return _finish(DENY, None, (o,), evaluated)
        if d == PERMIT:
            permits.append(o)
            continue
        error = True
        if d in (IND_D, IND_DP):
            potential_deny = True
    if potential_deny:
        return _finish(IND_DP, _first_status(evaluated, (IND_D, IND_DP)), (), evaluated)
    if permits:
        return _finish(PERMIT, None, permits, evaluated)
    if error:
        return _finish(IND_P, _first_status(evaluated, (IND_P, IND_D, IND_DP)), (), evaluated)
    return NA_OUTCOME


def legacy_permit_overrides_rules(children: Sequence[Any], ctx: EvalContext) -> Outcome:
    evaluated = []
    denies = []
    error = potential_permit = False
    for child in children:
        o = child.evaluate(ctx)
        d = o.decision
        if d == NOT_APPLICABLE:
            continue
        evaluated.append(o)
        if d == PERMIT:
            return _finish(PERMIT, None, (o,), evaluated)
        if d == DENY:
            denies.append(o)
            continue
        error = True
        if d in (IND_P, IND_DP):
            potential_permit = True
    if potential_permit:
        return _finish(IND_DP, _first_status(evaluated, (IND_P, IND_DP)), (), evaluated)
    if denies:
        return _finish(DENY, None, denies, evaluated)
    if error:
        return _finish(IND_D, _first_status(evaluated, (IND_P, IND_D, IND_DP)), (), evaluated)
    return NA_OUTCOME


def legacy_deny_overrides_policies(children: Sequence[Any], ctx: EvalContext) -> Outcome:
    evaluated = []
    permits = []
    for child in children:
        o = child.evaluate(ctx)
        d = o.decision
        if d == NOT_APPLICABLE:
            continue
        evaluated.append(o)
        if d == DENY:
            return _finish(DENY, None, (o,), evaluated)
        if d == PERMIT:
            permits.append(o)
            continue
        # Legacy semantics: an Indeterminate policy counts as Deny (without its obligations).
        return _finish(DENY, None, (), evaluated)
    if permits:
        return _finish(PERMIT, None, permits, evaluated)
    return NA_OUTCOME


def legacy_permit_overrides_policies(children: Sequence[Any], ctx: EvalContext) -> Outcome:
    evaluated = []
    denies = []
    error = False
    for child in children:
        o = child.evaluate(ctx)
        d = o.decision
        if d == NOT_APPLICABLE:
            continue
        evaluated.append(o)
        if d == PERMIT:
            return _finish(PERMIT, None, (o,), evaluated)
        if d == DENY:
            denies.append(o)
        else:
            error = True
    if denies:
        return _finish(DENY, None, denies, evaluated)
    if error:
        return _finish(IND_DP, _first_status(evaluated, (IND_P, IND_D, IND_DP)), (), evaluated)
    return NA_OUTCOME


_R1 = "urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:"
_R11 = "urn:oasis:names:tc:xacml:1.1:rule-combining-algorithm:"
_R3 = "urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:"
_P1 = "urn:oasis:names:tc:xacml:1.0:policy-combining-algorithm:"
_P11 = "urn:oasis:names:tc:xacml:1.1:policy-combining-algorithm:"
_P3 = "urn:oasis:names:tc:xacml:3.0:policy-combining-algorithm:"

DENY_OVERRIDES_3_0 = _P3 + "deny-overrides"

RULE_COMBINING: dict[str, Combiner] = {
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

POLICY_COMBINING: dict[str, Combiner] = {
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


def policy_combiner(alg_id: str) -> Combiner:
    """The policy-combining algorithm for a full id or a short name; KeyError if unknown."""
    return POLICY_COMBINING[SHORT_POLICY_ALGS.get(alg_id, alg_id)]


def rule_combiner(alg_id: str) -> Combiner:
    return RULE_COMBINING[alg_id]
