"""A compiled policy set as the linter reads it: every rule with the path of policies and policy
sets around it (their targets and combining algorithms), its effect, its condition, and the
obligations a decision by that rule carries (its own and those of every policy around it).

Read from the compiled form (`pdp.notes`: targets Match by Match), so that the linter and the
PDP see the same documents; obligation values are taken as written when they are constants (a
value computed at decision time cannot be judged in advance: such an obligation is `computed`).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pdp import (
    NO_CONDITION,
    PERMIT,
    AnyPolicy,
    AnyValue,
    AttributeAssignment,
    Notes,
    Obligation,
    ObligationExpr,
    PolicyCombiner,
    PolicyEvaluator,
    ReferenceEvaluator,
    RuleCombiner,
    RuleEvaluator,
    TargetNote,
)

_MISSING = object()


@dataclass(frozen=True)
class Step:
    """A Policy or PolicySet on a rule's way from its document's root: its target and how it
    combines its children (the function, as the PDP runs it)."""

    kind: str  # "Policy" or "PolicySet"
    id: str
    target: TargetNote
    combine: RuleCombiner | PolicyCombiner
    line: int | None


@dataclass(frozen=True)
class RulePath:
    """One rule, with what surrounds it."""

    document: str  # the top-level document's id
    source: str  # where the document came from (a file, "request body", a store id)
    steps: tuple[Step, ...]  # outermost first; the last is the rule's own policy
    positions: tuple[int, ...]  # the child index taken at each step (the rule's last)
    rule: RuleEvaluator
    obligations: tuple[Obligation, ...]  # those whose values are constants, rule's first
    computed: tuple[str, ...]  # ids of the obligations computed at decision time

    @property
    def rule_id(self) -> str:
        return self.rule.id

    @property
    def policy_id(self) -> str:
        return self.steps[-1].id

    @property
    def notes(self) -> Notes:
        notes = self.rule.notes
        return notes if isinstance(notes, Notes) else Notes(None)

    @property
    def line(self) -> int | None:
        return self.notes.line

    @property
    def targets(self) -> tuple[TargetNote, ...]:
        """Every target a request must match for the rule to apply: its policies', its own."""
        return tuple(s.target for s in self.steps) + (self.notes.target,)

    @property
    def unconditional(self) -> bool:
        return self.notes.condition == NO_CONDITION and self.rule.condition is None

    @property
    def permits(self) -> bool:
        return self.rule.effect == PERMIT


def static_obligation(expr: ObligationExpr) -> Obligation | None:
    """An ObligationExpression whose values are all constants, evaluated; None otherwise."""
    assignments = []
    for a in expr.assignments:
        # a constant's value (`pdp.evaluation.constant`), kept on its closure
        value: AnyValue = getattr(a.expr, "constant_value", _MISSING)
        if value is _MISSING:
            return None
        for v in (value if a.is_bag else (value,)):
            assignments.append(AttributeAssignment(a.attribute_id, a.datatype, a.fmt(v),
                                                   a.category, a.issuer))
    return Obligation(expr.id, tuple(assignments))


def _notes(ev: AnyPolicy) -> Notes:
    notes = ev.notes
    return notes if isinstance(notes, Notes) else Notes(None)


def rule_paths(root: AnyPolicy, document: str, source: str) -> Iterator[RulePath]:
    """Every rule of a compiled document, depth first in document order (references are not
    followed: what they reach is linted as its own document)."""
    def walk(ev: AnyPolicy, steps: tuple[Step, ...], positions: tuple[int, ...],
             around: tuple[AnyPolicy, ...]) -> Iterator[RulePath]:
        notes = _notes(ev)
        step = Step("PolicySet" if ev.is_policy_set else "Policy", ev.identifier.id,
                    notes.target, ev.combine, notes.line)
        steps = steps + (step,)
        around = around + (ev,)
        for i, child in enumerate(ev.children):
            if isinstance(child, RuleEvaluator):
                yield _path(document, source, steps, positions + (i,), child, around)
            elif isinstance(child, PolicyEvaluator):
                yield from walk(child, steps, positions + (i,), around)
            elif isinstance(child, ReferenceEvaluator):
                continue
    yield from walk(root, (), (), ())


def _path(document: str, source: str, steps: tuple[Step, ...], positions: tuple[int, ...],
          rule: RuleEvaluator, around: Sequence[AnyPolicy]) -> RulePath:
    obligations: list[Obligation] = []
    computed: list[str] = []
    exprs = list(rule.obligations) + [o for ev in reversed(around) for o in ev.obligations
                                      if o.effect == rule.effect]
    for expr in exprs:
        ob = static_obligation(expr)
        if ob is None:
            computed.append(expr.id)
        else:
            obligations.append(ob)
    return RulePath(document, source, steps, positions, rule, tuple(obligations),
                    tuple(computed))


__all__ = ["Step", "RulePath", "rule_paths", "static_obligation"]
