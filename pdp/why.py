"""Why a decision came out as it did: which policy and rule decided, which attributes matched or
were missing, where each obligation came from, what each combining algorithm did.

An explanation is asked for (`PolicyEngine.explain`); a decision that is not asked about pays
nothing for it. It is built by walking the same compiled evaluators a decision walks, in the
same evaluation context (one clock reading), with nothing re-implemented:

* a Target is evaluated Match by Match, each with its own compiled closure (`pdp.notes`), and
  as a whole with the target's closure;
* a rule's and a policy's outcome is its own `evaluate`;
* a combining algorithm is the algorithm itself, run over probes that stand for the children:
  a probe evaluates (and explains) its child only when the algorithm asks for it, so the
  explanation shows exactly which children the algorithm consulted, in which order, and where
  it stopped.

The explanation's decision is then compared with the decision itself (`consistent`).

Who sees what (`explanation_json`): an administrator everything; a caller who manages some of
the policies that took part (an owner) those policies in full, and of the others only how many
gave which decision (never their ids, rules, attributes or obligations' origins); anyone else
(a consumer) the decision and which of its own (subject) attributes the policies read and it
does not have.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pdp.datatypes import get_datatype
from pdp.errors import Indeterminate
from pdp.evaluation import (
    DECISION_NAMES,
    DENY,
    IND_D,
    IND_DP,
    IND_P,
    NOT_APPLICABLE,
    PERMIT,
    AnyPolicy,
    EvalContext,
    Evaluable,
    Expr,
    Matcher,
    Outcome,
    PolicyCombiner,
    PolicyEvaluator,
    ReferenceEvaluator,
    RuleEvaluator,
)
from pdp.notes import ALWAYS_FALSE, MatchNote, Notes
from pdp.results import Obligation
from pdp.urns import ACCESS_SUBJECT, CURRENT_DATE, CURRENT_DATETIME, CURRENT_TIME, ENVIRONMENT

SUBJECT_PREFIX = "urn:oasis:names:tc:xacml:1.0:subject-category:"
_CLOCK = frozenset({CURRENT_TIME, CURRENT_DATE, CURRENT_DATETIME})
_SHORT_CATEGORY = {
    ACCESS_SUBJECT: "subject",
    "urn:oasis:names:tc:xacml:3.0:attribute-category:resource": "resource",
    "urn:oasis:names:tc:xacml:3.0:attribute-category:action": "action",
    ENVIRONMENT: "environment",
}


@dataclass
class MatchTrace:
    """One Match of a Target and what it gave on this request."""

    note: MatchNote
    any_of: int
    all_of: int
    result: str  # "match", "no match", "indeterminate: ..."
    request: tuple[str, ...] | None  # the request's values (None: not shown, an environment's)


@dataclass
class TargetTrace:
    result: str  # "empty" (matches every request), "match", "no match", "indeterminate: ..."
    matches: list[MatchTrace] = field(default_factory=list)


@dataclass
class ReadTrace:
    """An attribute a Condition reads, and whether the request has it."""

    category: str
    attribute_id: str
    datatype: str
    present: bool
    request: tuple[str, ...] | None


@dataclass
class Node:
    """A rule, a policy, a policy set or the implicit root, as evaluated for one request."""

    kind: str  # "Rule", "Policy", "PolicySet", "Root"
    id: str | None
    version: str | None
    doc: str | None  # the top-level document it belongs to (None: the implicit root)
    line: int | None
    decision: int  # a code of pdp.evaluation (Permit, ..., Indeterminate{DP})
    status: str | None = None
    effect: str | None = None  # rules
    target: TargetTrace | None = None
    condition: str | None = None  # rules: "true", "false", "always false", "indeterminate: ..."
    reads: list[ReadTrace] = field(default_factory=list)
    algorithm: str | None = None
    family: str | None = None  # the combining function's name (deny_overrides, ...)
    combined: int | None = None  # what the algorithm gave, before a target error weakened it
    children: list[Node] = field(default_factory=list)  # those the algorithm consulted
    not_reached: int = 0  # children the algorithm did not consult (it had decided)
    skipped: int = 0  # children the target index proved NotApplicable, never evaluated
    obligations: tuple[Obligation, ...] = ()  # its own, when its decision reached the result
    advice: tuple[Obligation, ...] = ()
    contributed: bool = False
    reference: str | None = None  # reached through this Policy(Set)IdReference

    @property
    def decision_name(self) -> str:
        return DECISION_NAMES[self.decision]


@dataclass
class Explanation:
    """One individual decision, explained. `consistent` is False only if the explanation's
    decision differs from the decision's (it never should)."""

    decision: str
    status: str | None
    root: Node
    missing: list[ReadTrace]
    consistent: bool = True

    def nodes(self) -> Iterator[Node]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))


class ImplicitRoot(Protocol):
    """The root when no root policy is named (`pdp.engine`): the top-level documents, combined
    by the root's policy-combining algorithm."""

    @property
    def combine(self) -> PolicyCombiner: ...

    def evaluate(self, ctx: EvalContext, /) -> Outcome: ...


class _Probe:
    """A child as a combining algorithm sees it: evaluated (and explained) when asked."""

    __slots__ = ("explainer", "child", "doc", "node", "checked")

    def __init__(self, explainer: Explainer, child: Evaluable, doc: str | None) -> None:
        self.explainer = explainer
        self.child = child
        self.doc = doc
        self.node: Node | None = None
        self.checked = False

    def evaluate(self, ctx: EvalContext) -> Outcome:
        node, outcome = self.explainer.explain(self.child, self.doc)
        self.node = node
        return outcome

    def is_applicable(self, ctx: EvalContext) -> bool:  # only-one-applicable asks first
        self.checked = True
        child = self.child
        # only-one-applicable is a policy-combining algorithm: its children are never rules
        assert isinstance(child, (PolicyEvaluator, ReferenceEvaluator)), child
        return child.is_applicable(ctx)


class Explainer:
    """Explains evaluators in one evaluation context (`ctx`: the request's bags, the links)."""

    def __init__(self, ctx: EvalContext) -> None:
        self.ctx = ctx
        self.missing: dict[tuple[str, str, str], ReadTrace] = {}

    # -- the parts --------------------------------------------------------------------------------

    def _values(self, key: tuple[str, ...], datatype: str) -> tuple[str, ...]:
        bag = self.ctx.bags.get(key) or ()
        try:
            fmt = get_datatype(datatype).format
            return tuple(fmt(v) for v in bag)
        except Exception:  # noqa: BLE001 - an explanation must not fail on a value's form
            return tuple(str(v) for v in bag)

    def _key(
        self, category: str, attribute_id: str, datatype: str, issuer: str | None
    ) -> tuple[str, ...]:
        return (category, attribute_id, datatype) if issuer is None else \
            (category, attribute_id, datatype, issuer)

    def _read(self, category: str, attribute_id: str, datatype: str,
              issuer: str | None) -> ReadTrace:
        key = self._key(category, attribute_id, datatype, issuer)
        present = bool(self.ctx.bags.get(key))
        clock = category == ENVIRONMENT and attribute_id in _CLOCK
        shown = None if category == ENVIRONMENT else self._values(key, datatype)
        trace = ReadTrace(category, attribute_id, datatype, present or clock, shown)
        if not present and not clock:
            self.missing.setdefault((category, attribute_id, datatype), trace)
        return trace

    def target(self, matcher: Matcher | None, notes: Notes | None) -> TargetTrace:
        if matcher is None:
            return TargetTrace("empty")
        try:
            result = "match" if matcher(self.ctx) else "no match"
        except Indeterminate as exc:
            result = f"indeterminate: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - as the decision does: an error, not a crash
            result = f"indeterminate: {type(exc).__name__}: {exc}"
        trace = TargetTrace(result)
        for i, any_of in enumerate(notes.target if notes is not None else ()):
            for j, all_of in enumerate(any_of):
                for note in all_of:
                    read = self._read(note.category, note.attribute_id, note.datatype, note.issuer)
                    try:
                        got = "match" if note.test(self.ctx) else "no match"
                    except Indeterminate as exc:
                        got = f"indeterminate: {exc.message}"
                    except Exception as exc:  # noqa: BLE001 - as the decision: Indeterminate
                        got = f"indeterminate: {type(exc).__name__}: {exc}"
                    trace.matches.append(MatchTrace(note, i, j, got, read.request))
        return trace

    # -- the evaluators ------------------------------------------------------------------------

    def explain(self, ev: Evaluable, doc: str | None) -> tuple[Node, Outcome]:
        """The node of a rule, policy, policy set or reference, and its outcome."""
        if isinstance(ev, ReferenceEvaluator):
            target = self.ctx.links[ev.key]
            node, outcome = self.explain(target, target.doc_id or doc)
            node.reference = ev.description
            return node, outcome
        if isinstance(ev, RuleEvaluator):
            return self.rule(ev, doc)
        # what a document is made of: rules, policies, policy sets, references
        assert isinstance(ev, PolicyEvaluator), ev
        return self.policy(ev, ev.doc_id or doc)

    def rule(self, rule: RuleEvaluator, doc: str | None) -> tuple[Node, Outcome]:
        notes: Notes | None = rule.notes
        outcome = rule.evaluate(self.ctx)
        node = Node("Rule", rule.id, None, doc, notes.line if notes else None, outcome.decision,
                    _status(outcome), effect=DECISION_NAMES[rule.effect])
        node.target = self.target(rule.target, notes)
        kind = notes.condition if notes is not None else None
        if node.target.result == "no match" or node.target.result.startswith("indeterminate"):
            # the rule stopped at its target: its condition was not evaluated
            node.condition = None if rule.condition is None else "not evaluated"
        elif kind == ALWAYS_FALSE:
            node.condition = "always false"
        elif rule.condition is not None:
            node.condition = self._condition(rule.condition)
            if notes is not None:
                node.reads = [self._read(d.category, d.attribute_id, d.datatype, d.issuer)
                              for d in notes.reads]
        if outcome.decision in (PERMIT, DENY):
            node.obligations = tuple(outcome.obligations)
            node.advice = tuple(outcome.advice)
        return node, outcome

    def _condition(self, condition: Expr) -> str:
        try:
            return "true" if condition(self.ctx) else "false"
        except Indeterminate as exc:
            return f"indeterminate: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - as the decision: Indeterminate
            return f"indeterminate: {type(exc).__name__}: {exc}"

    def policy(self, policy: AnyPolicy, doc: str | None) -> tuple[Node, Outcome]:
        notes: Notes | None = policy.notes
        outcome = policy.evaluate(self.ctx)
        node = Node("PolicySet" if policy.is_policy_set else "Policy", policy.identifier.id,
                    policy.identifier.version, doc, notes.line if notes else None,
                    outcome.decision, _status(outcome),
                    algorithm=notes.algorithm if notes else None,
                    family=getattr(policy.combine, "__name__", None))
        node.target = self.target(policy.target, notes)
        if node.target.result == "no match":
            return node, outcome
        children = policy.children
        candidates = children if policy.index is None else \
            policy.index.candidates(children, self.ctx)
        node.skipped = len(children) - len(candidates)
        self.combine(node, policy.combine, candidates, doc)
        d = outcome.decision
        if d in (PERMIT, DENY):
            try:
                node.obligations = tuple(o.evaluate(self.ctx) for o in policy.obligations
                                         if o.effect == d)
                node.advice = tuple(a.evaluate(self.ctx) for a in policy.advice if a.effect == d)
            except Exception:  # noqa: BLE001 - the decision would have been Indeterminate
                node.obligations = node.advice = ()
        return node, outcome

    def combine(self, node: Node, combine: PolicyCombiner, children: Sequence[Evaluable],
                doc: str | None) -> None:
        """Run the algorithm over probes: which children it consulted, what it gave."""
        probes = [_Probe(self, child, doc) for child in children]
        combined = combine(probes, self.ctx)
        node.combined = combined.decision
        node.children = [p.node for p in probes if p.node is not None]
        node.not_reached = sum(1 for p in probes if p.node is None)


def _status(outcome: Outcome) -> str | None:
    if outcome.decision in (PERMIT, DENY, NOT_APPLICABLE) or outcome.status is None:
        return None
    return outcome.status.message or outcome.status.code


def explain_root(ctx: EvalContext, root: ImplicitRoot | AnyPolicy, algorithm: str,
                 family: str | None, candidates: list[AnyPolicy] | None, total: int
                 ) -> tuple[Node, Outcome, list[ReadTrace]]:
    """The implicit root (`candidates` of `total` top-level documents, the rest proved
    NotApplicable by the target index) or a named root policy (`candidates` None): its node,
    its outcome, and the attributes the explained parts read that the request lacks."""
    explainer = Explainer(ctx)
    if candidates is None:
        node, outcome = explainer.explain(root, getattr(root, "doc_id", None))
    else:
        outcome = root.evaluate(ctx)
        node = Node("Root", None, None, None, None, outcome.decision, _status(outcome),
                    algorithm=algorithm, family=family)
        node.skipped = total - len(candidates)
        explainer.combine(node, root.combine, candidates, None)
    _mark_contributions(node, outcome.decision)
    return node, outcome, list(explainer.missing.values())


def _mark_contributions(node: Node, decision: int) -> None:
    """Which nodes' obligations and advice reach the result: those on a path of children whose
    decision is the result's (a combining algorithm returns the obligations of every child it
    consulted that decided as it did)."""
    if decision not in (PERMIT, DENY) or node.decision != decision:
        return
    node.contributed = True
    for child in node.children:
        _mark_contributions(child, decision)


# -- rendering ------------------------------------------------------------------------------------

Mine = Callable[[str], bool]


def _short_category(category: str) -> str:
    return _SHORT_CATEGORY.get(category, category)


def _short(urn: str | None) -> str:
    return (urn or "").rsplit(":", 1)[-1]


def _read_json(r: ReadTrace) -> dict[str, Any]:
    out: dict[str, Any] = {"category": _short_category(r.category), "attribute": r.attribute_id,
                           "present": r.present}
    if r.request is not None and r.present:
        out["request"] = list(r.request)
    return out


def _match_json(m: MatchTrace) -> dict[str, Any]:
    out: dict[str, Any] = {"any_of": m.any_of, "all_of": m.all_of,
                           "category": _short_category(m.note.category),
                           "attribute": m.note.attribute_id, "function": _short(m.note.function),
                           "value": m.note.text, "result": m.result}
    if m.request is not None:
        out["request"] = list(m.request)
    if m.note.line is not None:
        out["line"] = m.note.line
    return out


def _obligation_json(o: Obligation) -> dict[str, Any]:
    return {"id": o.id, "assignments": [{"attribute": a.attribute_id, "value": a.value}
                                        for a in o.assignments]}


def _name(node: Node) -> str:
    if node.kind == "Root":
        return "the root"
    kind = {"Rule": "rule", "Policy": "policy", "PolicySet": "policy set"}[node.kind]
    return f"{kind} {node.id}"


def combining_sentence(node: Node, name: Callable[[Node], str] = _name) -> str:
    """What the node's combining algorithm did, in a sentence (children named by `name`)."""
    family = node.family or ""
    alg = _short(node.algorithm) or family.replace("_", "-")
    result = node.combined if node.combined is not None else node.decision
    res = DECISION_NAMES[result]
    consulted = node.children
    later = (f"; the {node.not_reached} later one{'s were' if node.not_reached != 1 else ' was'} "
             "not evaluated") if node.not_reached else ""
    if not consulted:
        if result == NOT_APPLICABLE:
            return f"{alg}: no child to evaluate, so NotApplicable"
        return f"{alg}: no child applied, so {res} ({alg} never answers NotApplicable)"
    deciders = [c for c in consulted if c.decision == result]
    errors = [c for c in consulted if c.decision in (IND_P, IND_D, IND_DP)]
    if family == "first_applicable":
        if result == NOT_APPLICABLE:
            return f"{alg}: none of the {len(consulted)} children applied, so NotApplicable"
        return f"{alg}: {name(consulted[-1])} was the first child that applied ({res}){later}"
    if family == "only_one_applicable":
        if result == NOT_APPLICABLE:
            return f"{alg}: no child applied, so NotApplicable"
        if deciders:
            return f"{alg}: only {name(deciders[0])} applied ({res})"
        return f"{alg}: more than one child applied, or one could not be checked, so {res}"
    winner = "Deny" if "deny_overrides" in family or family == "permit_unless_deny" else "Permit"
    names = ", ".join(name(c) for c in deciders)
    if res == winner:
        return f"{alg}: {names} said {winner}, which overrides the others{later}"
    if result in (PERMIT, DENY):
        tail = ", errors aside" if errors and "unless" in family else ""
        if not deciders:
            return f"{alg}: no child said {winner}, so {res}{tail} ({alg} never answers " \
                   "NotApplicable)"
        return f"{alg}: no child said {winner}; {names} said {res}, so {res}{tail}"
    if result == NOT_APPLICABLE:
        return f"{alg}: none of the {len(consulted)} children applied, so NotApplicable"
    failed = ", ".join(f"{name(c)} ({c.decision_name})" for c in errors)
    return f"{alg}: {failed} could not be decided, so {res}"


def _node_json(node: Node, mine: Mine | None, name: Callable[[Node], str]) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": node.kind}
    if node.id is not None:
        out["id"] = node.id
    if node.version is not None:
        out["version"] = node.version
    if node.reference:
        out["reference"] = node.reference
    if node.line is not None:
        out["line"] = node.line
    out["decision"] = node.decision_name
    if node.status:
        out["status"] = node.status
    if node.effect:
        out["effect"] = node.effect
    if node.target is not None:
        out["target"] = {"result": node.target.result,
                         "matches": [_match_json(m) for m in node.target.matches]}
    if node.condition is not None:
        out["condition"] = node.condition
    if node.reads:
        out["reads"] = [_read_json(r) for r in node.reads]
    if node.algorithm is not None or node.family is not None:
        out["algorithm"] = node.algorithm or node.family
        if node.target is None or node.target.result != "no match":
            out["combining"] = combining_sentence(node, name)
            if node.combined is not None and node.combined != node.decision:
                out["combining"] += (f"; its target could not be decided, which turns "
                                     f"{DECISION_NAMES[node.combined]} into "
                                     f"{node.decision_name}")
    if node.obligations and node.contributed:
        out["obligations"] = [o.id for o in node.obligations]
    if node.advice and node.contributed:
        out["advice"] = [a.id for a in node.advice]
    children = []
    hidden: dict[str, int] = {}
    for child in node.children:
        if mine is None or (child.doc is not None and mine(child.doc)):
            children.append(_node_json(child, mine, name))
        elif child.decision != NOT_APPLICABLE:
            hidden[child.decision_name] = hidden.get(child.decision_name, 0) + 1
    if node.children:
        out["children"] = children
    if hidden:
        out["other_policies"] = hidden
    if mine is None:
        if node.not_reached:
            out["not_evaluated"] = node.not_reached
        if node.skipped:
            out["skipped_by_index"] = node.skipped
    return out


def _origins(expl: Explanation, attr: str) -> list[tuple[Obligation, Node | None]]:
    """Each obligation (or advice) of the result with the node it came from (in order)."""
    out: list[tuple[Obligation, Node | None]] = []

    def walk(node: Node) -> None:
        if not node.contributed:
            return
        for child in node.children:
            walk(child)
        for o in getattr(node, attr):
            out.append((o, node))
    walk(expl.root)
    return out


def explanation_json(expl: Explanation, mine: Mine | None = None,
                     consumer: bool = False) -> dict[str, Any]:
    """The explanation as JSON for who asks: everything (`mine` None, not `consumer`), an
    owner's view (`mine(document id)`: the documents the caller manages), or a consumer's."""
    out: dict[str, Any] = {"decision": expl.decision}
    if expl.status:
        out["status"] = expl.status
    subject_missing = [r for r in expl.missing if r.category.startswith(SUBJECT_PREFIX)]
    if consumer:
        out["view"] = "consumer"
        out["missing_attributes"] = [_read_json(r) for r in subject_missing]
        out["reason"] = consumer_reason(expl.decision, subject_missing)
        return out
    mine_docs = {n.doc for n in expl.nodes() if n.doc is not None and
                 (mine is None or mine(n.doc))}

    def name(node: Node) -> str:
        if mine is not None and node.kind != "Root" and (node.doc is None
                                                         or node.doc not in mine_docs):
            return "a policy you do not manage"
        return _name(node)

    out["view"] = "administrator" if mine is None else "owner"
    out["root"] = _node_json(expl.root, mine, name)
    for attr in ("obligations", "advice"):
        items = []
        for o, node in _origins(expl, attr):
            item = _obligation_json(o)
            if node is not None and (mine is None or (node.doc in mine_docs)):
                item["from"] = {"kind": node.kind, "id": node.id, "document": node.doc}
            else:
                item["from"] = "a policy you do not manage"
            items.append(item)
        out[attr] = items
    if mine is None:
        out["missing_attributes"] = [_read_json(r) for r in expl.missing]
    else:
        out["missing_attributes"] = [_read_json(r) for r in subject_missing]
    if not expl.consistent:
        out["consistent"] = False
    return out


def consumer_reason(decision: str, missing: list[ReadTrace]) -> str:
    """The one reason a consumer gets: the decision and the attributes of its own it lacks."""
    if decision == "Permit":
        return "permitted"
    names = ", ".join(r.attribute_id for r in missing)
    head = {"Deny": "denied", "NotApplicable": "no policy applies to this request",
            }.get(decision, "the decision could not be made")
    if missing:
        return f"{head}; attributes of yours that the policies read and you do not have: {names}"
    return f"{head}; none of your attributes that the policies read is missing"


def explanation_text(data: dict[str, Any]) -> str:
    """An explanation's JSON (`explanation_json`) as indented text, for a terminal."""
    lines = [f"decision: {data['decision']}" + (f" ({data['status']})" if data.get("status")
                                               else "")]
    if data.get("view") == "consumer":
        lines.append(f"reason: {data['reason']}")
        return "\n".join(lines) + "\n"

    def node(n: dict[str, Any], depth: int) -> None:
        pad = "  " * depth
        title = n["kind"] if "id" not in n else f"{n['kind']} {n['id']}"
        where = f" (line {n['line']})" if "line" in n else ""
        via = f" via {n['reference']}" if "reference" in n else ""
        extra = f": {n['status']}" if n.get("status") else ""
        lines.append(f"{pad}{title}{where}{via} -> {n['decision']}{extra}")
        target = n.get("target")
        if target is not None:
            lines.append(f"{pad}  target: {target['result']}")
            for m in target["matches"]:
                got = f" (request: {', '.join(m['request']) or 'none'})" if "request" in m else ""
                lines.append(f"{pad}    {m['category']} {m['attribute']} {m['function']} "
                             f"{m['value']!r}: {m['result']}{got}")
        if "condition" in n:
            lines.append(f"{pad}  condition: {n['condition']}")
        for r in n.get("reads", []):
            state = "present" if r["present"] else "missing"
            lines.append(f"{pad}    reads {r['category']} {r['attribute']}: {state}")
        if "combining" in n:
            lines.append(f"{pad}  {n['combining']}")
        if n.get("obligations"):
            lines.append(f"{pad}  obligations: {', '.join(n['obligations'])}")
        for child in n.get("children", []):
            node(child, depth + 1)
        if n.get("other_policies"):
            counts = ", ".join(f"{k}: {v}" for k, v in n["other_policies"].items())
            lines.append(f"{pad}  policies you do not manage: {counts}")
        if n.get("skipped_by_index"):
            lines.append(f"{pad}  ({n['skipped_by_index']} more whose targets cannot match, "
                         "skipped by the target index)")

    node(data["root"], 0)
    for attr in ("obligations", "advice"):
        for o in data.get(attr, []):
            src = o["from"] if isinstance(o["from"], str) else \
                f"{o['from']['kind'].lower()} {o['from']['id']}"
            lines.append(f"{attr[:-1] if attr == 'obligations' else 'advice'} {o['id']} from "
                         f"{src}")
    missing = data.get("missing_attributes", [])
    lines.append("missing attributes: " + (", ".join(f"{m['category']} {m['attribute']}"
                                                     for m in missing) or "none"))
    return "\n".join(lines) + "\n"


__all__ = ["Explanation", "Explainer", "Node", "explain_root",
           "explanation_json", "explanation_text", "combining_sentence", "consumer_reason"]
