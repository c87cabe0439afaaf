"""The linter's checks over a policy set: what can never apply, what is never reached, what the
PEP would not understand, which grants cannot be honoured together, which can never show a
tuple. Each finding says where (document, policy, rule, line) and why, quoting the policy.

Kinds:

* `never-applies`: a policy or rule no request can match (its targets and those around it pin
  the subject, stream, action or join partner to two values at once), or a rule whose Condition
  is always false;
* `shadowed`: a rule never reached under first-applicable (an earlier rule without a Condition
  applies whenever it would), or one that can never decide under an overrides algorithm (a rule
  of the winning effect without a Condition applies whenever it would);
* `unknown-obligation`: an obligation (or one of its attributes) the PEP does not understand:
  every Permit that carries it is a Deny at the gateway (XACML 3.0 section 7.18);
* `conflict`: two Permit rules that can both apply to one request about a stream, whose
  obligations the PEP cannot honour together (windows of different types or without an aggregate
  in common, masks of which neither is coarser: `pep.core.obligations`), so that request is
  denied; on a stream that combines grants by union, a grant with masks or a private window
  that would have to be united with another (`pep.core.union`: refused);
* `no-result`: a Permit rule whose filter can never hold on a stream (NR for every consumer),
  or two rules that apply together and whose filters together never hold; decided by the same
  DNF analysis the PEP runs on every request (`pep.core.merge`, `pep.core.analysis`).

Obligations computed at decision time, filters with placeholders (`{subject:...}`) in an NR
check, and references between documents are not judged: nothing is reported about them rather
than a guess.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from pdp import (
    ALWAYS_FALSE,
    DENY,
    PERMIT,
    RESOURCE,
    RESOURCE_ID,
    AnyPolicy,
    AttributeAssignment,
    Obligation,
    ObligationExpr,
    PolicyEvaluator,
    RuleEvaluator,
    attribute_key,
)
from pep.core.analysis import ConditionTooComplex
from pep.core.errors import Refusal
from pep.core.graph import QueryGraph, UnsupportedGraph
from pep.core.joingrant import JOIN_CONDITION, JOIN_IDS, JOIN_STREAM, JOIN_WITHIN, split_obligations
from pep.core.lint.paths import RulePath, rule_paths
from pep.core.lint.targets import contradiction, implies, pinned_values
from pep.core.merge import MergeResult, merge, without_hidden_time
from pep.core.obligations import (
    FILTER_CONDITION,
    FILTER_IDS,
    GRANT_OPTION_IDS,
    MAP_ATTRIBUTE,
    MAP_IDS,
    MASK_ATTRIBUTE,
    MASK_IDS,
    PUNCTUATION_DEFER_IDS,
    WINDOW_ATTR,
    WINDOW_IDS,
    WINDOW_KEY,
    WINDOW_LABEL_BOUND,
    WINDOW_LABEL_SCOPE,
    WINDOW_MIN_COUNT,
    WINDOW_PREFILTER,
    WINDOW_SIZE,
    WINDOW_STEP,
    WINDOW_TYPE,
    ObligationError,
    obligation_assignments,
    policy_graph,
)
from pep.core.plan import ExecutionPlan, StreamDefinition
from pep.core.privacy import DP_ATTRIBUTES
from pep.core.union import INTERSECTION, UNION

# What the PEP understands: each obligation id with the attributes it may carry.
UNDERSTOOD: dict[frozenset[str], tuple[str, ...]] = {
    FILTER_IDS: (FILTER_CONDITION,),
    MAP_IDS: (MAP_ATTRIBUTE,),
    WINDOW_IDS: (WINDOW_TYPE, WINDOW_SIZE, WINDOW_STEP, WINDOW_ATTR, WINDOW_MIN_COUNT,
                 WINDOW_PREFILTER, WINDOW_KEY, WINDOW_LABEL_BOUND, WINDOW_LABEL_SCOPE,
                 *DP_ATTRIBUTES),
    MASK_IDS: (MASK_ATTRIBUTE,),
    JOIN_IDS: (JOIN_STREAM, JOIN_CONDITION, JOIN_WITHIN),
    GRANT_OPTION_IDS: (),  # it takes no attribute
    PUNCTUATION_DEFER_IDS: (),  # nor does this
}
# Combining algorithms (by the PDP's function names) that return the obligations of every
# Permit child when they answer Permit; the others return one child's (first-applicable,
# only-one-applicable, and the algorithms under which Permit wins at the first Permit).
COLLECTS_PERMITS = frozenset({"deny_overrides", "legacy_deny_overrides_rules",
                              "legacy_deny_overrides_policies", "permit_unless_deny"})
# The effect that wins at once under an overrides algorithm.
WINNER = {"deny_overrides": DENY, "legacy_deny_overrides_rules": DENY,
          "permit_unless_deny": DENY, "permit_overrides": PERMIT,
          "legacy_permit_overrides_rules": PERMIT, "deny_unless_permit": PERMIT}
EFFECT = {PERMIT: "Permit", DENY: "Deny"}
RESOURCE_KEY = attribute_key(RESOURCE, RESOURCE_ID)


@dataclass(frozen=True)
class LintDocument:
    """A compiled document (its evaluator) and where it came from."""

    evaluator: AnyPolicy
    source: str

    @property
    def id(self) -> str:
        return self.evaluator.identifier.id


@dataclass(frozen=True)
class LintStream:
    """A registered stream and how its owner combines the grants that apply (`pep.core.union`)."""

    definition: StreamDefinition
    combining: str = INTERSECTION


class FindingJson(TypedDict):
    """A finding as `xsg policy lint --json` and the write answers give it."""

    kind: str
    message: str
    document: str
    source: str
    line: NotRequired[int]
    policy: NotRequired[str]
    rule: NotRequired[str]
    others: NotRequired[list[str]]


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str
    document: str
    source: str
    line: int | None = None
    policy: str | None = None
    rule: str | None = None
    others: tuple[str, ...] = ()  # the other documents a finding about two rules involves

    def where(self) -> str:
        at = f"line {self.line}: " if self.line is not None else ""
        if self.rule is not None:
            return f"{at}rule {self.rule} (policy {self.policy})"
        return f"{at}policy {self.policy or self.document}"

    def text(self) -> str:
        """The finding as a write answer's warning says it."""
        return f"{self.kind}: {self.where()}: {self.message}"

    def to_json(self) -> FindingJson:
        out: FindingJson = {"kind": self.kind, "message": self.message,
                            "document": self.document, "source": self.source}
        if self.line is not None:
            out["line"] = self.line
        if self.policy is not None:
            out["policy"] = self.policy
        if self.rule is not None:
            out["rule"] = self.rule
        if self.others:
            out["others"] = list(self.others)
        return out


@dataclass
class _Run:
    documents: Sequence[LintDocument]
    streams: Sequence[LintStream]
    root_combining: str  # the root's combining function's name (deny_overrides, ...)
    focus: frozenset[str] | None
    findings: list[Finding] = field(default_factory=list)
    dead: set[tuple[str, str | None, str]] = field(default_factory=set)

    def wanted(self, *documents: str) -> bool:
        return self.focus is None or any(d in self.focus for d in documents)


def lint(documents: Sequence[LintDocument], streams: Sequence[LintStream] = (),
         root_combining: str = "deny_overrides",
         focus: Iterable[str] | None = None) -> list[Finding]:
    """Every finding over `documents` (top-level, in root order, combined at the root by the
    function named `root_combining`) and the registered `streams`. With `focus` (document ids),
    only the findings about those documents: a rule of theirs, or a pair one of whose rules is
    theirs (what a write adds to the set)."""
    run = _Run(documents, streams, root_combining,
               frozenset(focus) if focus is not None else None)
    paths = [p for d in documents for p in rule_paths(d.evaluator, d.id, d.source)]
    _never_applies(run, paths)
    _shadowed(run, paths)
    _unknown_obligations(run)
    live = [p for p in paths if (p.document, p.policy_id, p.rule_id) not in run.dead]
    by_name = {s.definition.name: s for s in streams}
    for p in live:
        if p.permits and run.wanted(p.document):
            for stream in _streams_of(p, by_name, streams):
                _no_result(run, p, stream)
    _pairs(run, [p for p in live if p.permits], by_name)
    return run.findings


# -- one document --------------------------------------------------------------------------------

def _never_applies(run: _Run, paths: list[RulePath]) -> None:
    told: set[tuple[str, int]] = set()
    for p in paths:
        culprit = None
        for k in range(len(p.steps)):
            why = contradiction(s.target for s in p.steps[:k + 1])
            if why is not None:
                culprit = (k, why)
                break
        if culprit is not None:
            k, why = culprit
            step = p.steps[k]
            run.dead.add((p.document, p.policy_id, p.rule_id))
            key = (p.document, id(step))
            if key not in told and run.wanted(p.document):
                told.add(key)
                kind = "policy set" if step.kind == "PolicySet" else "policy"
                run.findings.append(Finding(
                    "never-applies", f"the {kind} can never apply: {why}; none of its rules "
                    "is ever evaluated", p.document, p.source, step.line, step.id))
            continue
        why = contradiction(p.targets)
        if why is None and p.notes.condition == ALWAYS_FALSE:
            why = "its Condition is always false"
        elif why is not None:
            why = f"with the targets of the policies around it, {why}"
        if why is not None:
            run.dead.add((p.document, p.policy_id, p.rule_id))
            if run.wanted(p.document):
                run.findings.append(Finding("never-applies", f"the rule can never apply: {why}",
                                            p.document, p.source, p.line, p.policy_id,
                                            p.rule_id))


def _shadowed(run: _Run, paths: list[RulePath]) -> None:
    groups: dict[tuple[str, tuple[int, ...]], list[RulePath]] = {}
    for p in paths:
        if (p.document, p.policy_id, p.rule_id) not in run.dead:
            groups.setdefault((p.document, p.positions[:-1]), []).append(p)
    for (document, _), rules in groups.items():
        if not run.wanted(document):
            continue
        family = getattr(rules[0].steps[-1].combine, "__name__", "")
        for j, later in enumerate(rules):
            mine = (later.notes.target,)
            if family == "first_applicable":
                earlier = next((r for r in rules[:j] if r.unconditional
                                and implies(mine, (r.notes.target,))), None)
                if earlier is not None:
                    run.dead.add((later.document, later.policy_id, later.rule_id))
                    run.findings.append(Finding(
                        "shadowed", f"the rule is never reached: under first-applicable, rule "
                        f"{earlier.rule_id} comes first and applies whenever this one would "
                        f"(its target holds whenever this one's does, and it has no Condition)",
                        document, later.source, later.line, later.policy_id, later.rule_id))
            elif family in WINNER and later.rule.effect != WINNER[family]:
                winner = next((r for r in rules if r is not later and r.unconditional
                               and r.rule.effect == WINNER[family]
                               and implies(mine, (r.notes.target,))), None)
                if winner is not None:
                    effect = EFFECT[later.rule.effect]
                    alg = family.replace("_", "-").replace("legacy-", "").replace("-rules", "")
                    run.dead.add((later.document, later.policy_id, later.rule_id))
                    run.findings.append(Finding(
                        "shadowed", f"the rule can never decide ({effect}): rule "
                        f"{winner.rule_id} ({EFFECT[WINNER[family]]}, without a Condition) "
                        f"applies whenever this one would, and {alg} lets "
                        f"{EFFECT[WINNER[family]]} win", document, later.source, later.line,
                        later.policy_id, later.rule_id))


def _elements(ev: AnyPolicy) -> Iterator[tuple[str, str | None, AnyPolicy | RuleEvaluator]]:
    """(policy id, rule id or None, evaluator) of a document's policies and rules."""
    yield ev.identifier.id, None, ev
    for child in ev.children:
        if isinstance(child, PolicyEvaluator):
            yield from _elements(child)
        elif isinstance(child, RuleEvaluator):
            yield ev.identifier.id, child.id, child


def _unknown_obligations(run: _Run) -> None:
    for doc in run.documents:
        if not run.wanted(doc.id):
            continue
        for policy, rule, ev in _elements(doc.evaluator):
            line = getattr(getattr(ev, "notes", None), "line", None)
            for expr in ev.obligations:
                if expr.effect != PERMIT:
                    continue
                why = _not_understood(expr)
                if why is not None:
                    run.findings.append(Finding(
                        "unknown-obligation", f"{why}: every Permit that carries it is a Deny "
                        "at the gateway (XACML 3.0 section 7.18)", doc.id, doc.source, line,
                        policy, rule))


def _not_understood(expr: ObligationExpr) -> str | None:
    allowed = next((names for ids, names in UNDERSTOOD.items() if expr.id in ids), None)
    if allowed is None:
        return f"obligation {expr.id!r} is not one the PEP understands"
    if not allowed and expr.assignments:
        return f"obligation {expr.id!r} takes no attribute, and this one carries some"
    # only the ids are judged here: values computed at decision time are not at hand
    probe = Obligation(expr.id, tuple(AttributeAssignment(a.attribute_id, "", "")
                                      for a in expr.assignments))
    try:
        obligation_assignments(probe, list(allowed))
    except ObligationError as exc:
        return exc.message
    return None


# -- streams -------------------------------------------------------------------------------------

def _streams_of(p: RulePath, by_name: dict[str, LintStream],
                streams: Sequence[LintStream]) -> list[LintStream]:
    pinned = pinned_values(p.targets, RESOURCE_KEY)
    if pinned is None:
        return list(streams)
    return [by_name[str(n)] for n in sorted(map(str, pinned)) if str(n) in by_name]


def _samples(stream: StreamDefinition) -> list[Callable[[str, str], list[str]]]:
    """Stand-ins for placeholders, as the write check uses them (`pep.streams.policy_check`):
    "0" (a number, a string, a boolean), then the lowest label of each lattice."""
    def sample(text: str) -> Callable[[str, str], list[str]]:
        return lambda category, attribute: [text] * 6
    lattices = dict.fromkeys(f.lattice for f in stream.schema.fields if f.lattice is not None)
    return [sample("0")] + [sample(lattice.levels[0]) for lattice in lattices]


def _graph(obligations: Sequence[Obligation], stream: StreamDefinition) -> QueryGraph:
    """The policy graph of these obligations on the stream (as a decision plans it), with
    placeholders stood in for; the first ObligationError when none fits."""
    rest, _ = split_obligations(obligations)
    first: ObligationError | None = None
    for resolver in _samples(stream):
        try:
            return policy_graph(rest, stream.name, stream.schema, resolver=resolver)
        except ObligationError as exc:
            first = first or exc
    assert first is not None
    raise first


class _Placeholder(Exception):
    pass


def _refuse(category: str, attribute: str) -> list[str]:
    raise _Placeholder()


def _static_filters(obligations: Sequence[Obligation],
                    stream: StreamDefinition) -> list[Obligation]:
    """The filter obligations that read no placeholder and fit the stream."""
    out = []
    for ob in obligations:
        if ob.id not in FILTER_IDS:
            continue
        try:
            policy_graph([ob], stream.name, stream.schema, resolver=_refuse)
        except (_Placeholder, ObligationError):
            continue
        out.append(ob)
    return out


def _merged(graph: QueryGraph, stream: StreamDefinition) -> MergeResult | None:
    try:
        return merge(graph, None, stream.schema, time_attribute=stream.time_attribute)
    except (Refusal, ConditionTooComplex, UnsupportedGraph):
        return None


def _filters_text(filters: Sequence[Obligation]) -> str:
    return " AND ".join(f"`{v}`" for ob in filters for v in ob.values(FILTER_CONDITION))


def _no_result(run: _Run, p: RulePath, stream: LintStream) -> None:
    definition = stream.definition
    filters = _static_filters(p.obligations, definition)
    if not filters:
        return
    try:
        graph = policy_graph(filters, definition.name, definition.schema)
    except ObligationError:
        return
    merged = _merged(graph, definition)
    if merged is not None and merged.nr:
        run.findings.append(Finding(
            "no-result", f"no consumer ever gets a tuple of stream {definition.name!r} through "
            f"this rule: its filter {_filters_text(filters)} can never hold (NR)", p.document,
            p.source, p.line, p.policy_id, p.rule_id))


def _combined(run: _Run, p: RulePath, q: RulePath) -> bool:
    """Whether a decision can carry the obligations of both rules at once: the policy (or the
    root) where their paths part collects every Permit below it."""
    if p.document != q.document:
        return run.root_combining in COLLECTS_PERMITS
    common = 0
    for a, b in zip(p.positions, q.positions, strict=False):
        if a != b:
            break
        common += 1
    step = p.steps[common]
    return getattr(step.combine, "__name__", "") in COLLECTS_PERMITS


def _pairs(run: _Run, permits: list[RulePath], by_name: dict[str, LintStream]) -> None:
    """Every pair of Permit rules one of which is in focus (in root order)."""
    focused = [i for i, p in enumerate(permits) if run.wanted(p.document)]
    pairs = ((min(i, j), max(i, j)) for i in focused for j in range(len(permits))
             if j != i and (j > i or not run.wanted(permits[j].document)))
    for i, j in pairs:
        p, q = permits[i], permits[j]
        if not _combined(run, p, q) or contradiction(p.targets + q.targets) is not None:
            continue
        if p.computed or q.computed:
            continue  # values known only at decision time: not judged
        names = set(by_name)
        for r in (p, q):
            pinned = pinned_values(r.targets, RESOURCE_KEY)
            if pinned is not None:
                names &= {str(v) for v in pinned}
        for name in sorted(names):
            _pair_on(run, p, q, by_name[name])


def _pair_on(run: _Run, p: RulePath, q: RulePath, stream: LintStream) -> None:
    definition = stream.definition
    try:
        alone = [_graph(p.obligations, definition), _graph(q.obligations, definition)]
    except ObligationError:
        return  # one grant alone does not fit the stream: the write check says why
    first, second = (p, q) if run.wanted(p.document) else (q, p)
    where = (f"rules {first.rule_id} (policy {first.policy_id}) and {second.rule_id} (policy "
             f"{second.policy_id}) can both apply to a request about stream "
             f"{definition.name!r}")
    others = tuple(sorted({second.document} - {first.document}))

    def report(kind: str, message: str) -> None:
        run.findings.append(Finding(kind, f"{where}, and {message}", first.document,
                                    first.source, first.line, first.policy_id, first.rule_id,
                                    others))

    if stream.combining == UNION:
        plans = [_merged(g, definition) for g in alone]
        special = [_special(without_hidden_time(m).plan) for m in plans if m is not None]
        if any(special):
            what = next(s for s in special if s)
            report("conflict", f"stream {definition.name!r} combines grants by union, which "
                   f"cannot unite a grant with {what} with another: such a request is refused "
                   "unless its query leaves one of them out")
        return
    try:
        _graph(p.obligations + q.obligations, definition)
    except ObligationError as exc:
        report("conflict", f"their obligations cannot be honoured together, so such a request "
               f"is denied: {exc.message}")
        return
    filters = _static_filters(p.obligations + q.obligations, definition)
    if len(_static_filters(p.obligations, definition)) and \
            len(_static_filters(q.obligations, definition)):
        try:
            both = policy_graph(filters, definition.name, definition.schema)
        except ObligationError:
            return
        merged = _merged(both, definition)
        singles = [_merged(policy_graph(_static_filters(r.obligations, definition),
                                        definition.name, definition.schema), definition)
                   for r in (p, q)]
        if merged is not None and merged.nr and all(s is not None and not s.nr
                                                     for s in singles):
            report("no-result", f"their filters together, {_filters_text(filters)}, can never "
                   "hold: a consumer both apply to gets no tuple (NR)")


def _special(plan: ExecutionPlan) -> str | None:
    if plan.masks:
        return "masks"
    if plan.window is not None and plan.window.privacy is not None:
        return "a differentially private window"
    return None


__all__ = ["Finding", "FindingJson", "LintDocument", "LintStream", "lint", "UNDERSTOOD",
           "COLLECTS_PERMITS"]
