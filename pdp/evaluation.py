"""Runtime evaluators: what a compiled policy is made of, and what a decision walks.

The policy compiler (pdp.policy_parser) turns XML into the objects below once; a decision only
calls closures and small methods on them. Expressions are plain closures `ev(ctx) -> value`
(a bag is a tuple) that raise `Indeterminate` on error; targets return True/False or raise; rules
and policies return an `Outcome`.

Decisions are small ints so that combining algorithms compare integers; the extended
Indeterminate values of XACML 3.0 ({P}, {D}, {DP}) are distinct codes.

What a combining algorithm asks of a child is a Protocol (`Evaluable`: its outcome;
`Applicable`: also whether its target applies, for only-one-applicable), so that rules, policies,
references and the explanation's probes (`pdp.why`) all stand as children. A PolicyEvaluator is
generic in that protocol: a Policy combines Evaluables (its rules) with a rule-combining
algorithm, a PolicySet Applicables (policies, policy sets, references) with a policy-combining
one, and the types keep a policy-combining algorithm away from rules.
"""
from __future__ import annotations

import datetime as _dt
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Protocol,
    TypeVar,
)

from pdp.datatypes import DATE, DATETIME, TIME, get_datatype
from pdp.errors import Indeterminate
from pdp.results import (
    STATUS_MISSING_ATTRIBUTE,
    STATUS_PROCESSING_ERROR,
    AttributeAssignment,
    Decision,
    MissingAttributeDetail,
    Obligation,
    PolicyIdentifier,
    Status,
)
from pdp.urns import CURRENT_DATE, CURRENT_DATETIME, CURRENT_TIME

if TYPE_CHECKING:  # for annotations only
    from pdp.functions.base import Function
    from pdp.index import ChildIndex
    from pdp.notes import Notes
    from pdp.policy_parser.model import RefSpec
    from pdp.policy_parser.targets import TargetSpec

PERMIT, DENY, NOT_APPLICABLE, IND_P, IND_D, IND_DP = range(6)
DECISION_NAMES = ("Permit", "Deny", "NotApplicable", "Indeterminate{P}", "Indeterminate{D}",
                  "Indeterminate{DP}")
TO_DECISION = (Decision.PERMIT, Decision.DENY, Decision.NOT_APPLICABLE, Decision.INDETERMINATE,
               Decision.INDETERMINATE, Decision.INDETERMINATE)

# An attribute value as its data type parses it (`pdp.datatypes`: str, int, float, bool, the
# temporal and duration classes, X500Name, ...). Of any XACML data type, so dynamic by nature:
# a function's signature, checked when the policy is compiled, says which one it is.
AnyValue = Any
Bag = tuple[AnyValue, ...]  # the values of one attribute, as a request gives them
BagKey = tuple[str, ...]  # (category, attribute id, data type[, issuer])
Bags = Mapping[BagKey, Bag]
# An expression: a value, or a bag for an expression of bag type (a designator, a bag function).
Expr = Callable[["EvalContext"], AnyValue]
Matcher = Callable[["EvalContext"], bool]  # a Target, an AnyOf, an AllOf or a Match
Obligations = tuple[Obligation, ...]
# (rule id, obligations of that rule and of every enclosing policy): see `Outcome.grants`
Grant = tuple[str, Obligations]
T = TypeVar("T")


class EvalContext:
    """Everything one individual decision needs: the attribute bags and the reference links."""

    __slots__ = ("bags", "links", "_now")

    def __init__(self, bags: Bags, links: Links) -> None:
        self.bags = bags
        self.links = links
        self._now: _dt.datetime | None = None

    def now(self) -> _dt.datetime:
        # One clock reading per decision, so current-time, -date and -dateTime agree.
        if self._now is None:
            self._now = _dt.datetime.now(_dt.UTC).astimezone()
        return self._now


class Outcome:
    """Result of evaluating a rule, policy or policy set."""

    __slots__ = ("decision", "status", "obligations", "advice", "policy_ids", "docs", "grants")

    def __init__(self, decision: int, status: Status | None = None,
                 obligations: Obligations = (), advice: Obligations = (),
                 policy_ids: tuple[PolicyIdentifier, ...] = (),
                 docs: frozenset[str] = frozenset(), grants: tuple[Grant, ...] = ()) -> None:
        self.decision = decision
        self.status = status
        self.obligations = obligations
        self.advice = advice
        self.policy_ids = policy_ids
        self.docs = docs
        # The same obligations by the rule that contributed them: ((rule id, obligations of
        # that rule and of every enclosing policy), ...), for a PEP that unites what each rule
        # grants instead of conjoining everything (`pdp.results.RuleGrant`).
        self.grants = grants

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Outcome({DECISION_NAMES[self.decision]}, {self.status}, {self.obligations})"


NA_OUTCOME = Outcome(NOT_APPLICABLE)


class Evaluable(Protocol):
    """What every combining algorithm asks of a child: its outcome (a rule, a policy, a policy
    set, a reference, or an explanation's probe standing for one of them)."""

    def evaluate(self, ctx: EvalContext, /) -> Outcome: ...


class Applicable(Evaluable, Protocol):
    """A child of a policy set (or of the implicit root): only-one-applicable also asks whether
    its target applies, before evaluating any."""

    def is_applicable(self, ctx: EvalContext, /) -> bool: ...


ChildT = TypeVar("ChildT", bound=Evaluable)
# A combining algorithm over children that are at least ChildT (`pdp.combining`).
Combiner = Callable[[Sequence[ChildT], EvalContext], Outcome]
RuleCombiner = Combiner[Evaluable]  # the children are a Policy's rules
PolicyCombiner = Combiner[Applicable]  # the children are policies, policy sets, references


def status_of(exc: Indeterminate) -> Status:
    return Status(exc.status_code, exc.message, (), tuple(exc.missing))


def status_of_bug(exc: Exception) -> Status:
    return Status(STATUS_PROCESSING_ERROR, f"internal error during evaluation: "
                                           f"{type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------------- expressions


def make_designator(category: str, attribute_id: str, datatype: str, issuer: str | None,
                    must_be_present: bool, now_value: Expr | None) -> Expr:
    """Closure returning the bag of an attribute; MustBePresent turns an empty bag into an error."""
    key: BagKey = (category, attribute_id, datatype) if issuer is None else \
        (category, attribute_id, datatype, issuer)
    detail = MissingAttributeDetail(category, attribute_id, datatype, issuer)
    message = f"missing attribute {attribute_id} ({datatype}) in category {category}"
    empty: Bag = ()

    if now_value is not None:
        # current-time/date/dateTime: the PDP supplies them when the request does not.
        def ev_now(ctx: EvalContext) -> Bag:
            bag = ctx.bags.get(key)
            if bag:
                return bag
            return (now_value(ctx),)
        return ev_now
    if must_be_present:
        def ev_required(ctx: EvalContext) -> Bag:
            bag = ctx.bags.get(key)
            if bag:
                return bag
            raise Indeterminate(message, STATUS_MISSING_ATTRIBUTE, (detail,))
        return ev_required

    def ev_optional(ctx: EvalContext) -> Bag:
        return ctx.bags.get(key, empty)
    return ev_optional


def constant(value: AnyValue) -> Expr:
    """An expression that always gives `value`. The value is also kept as the closure's
    attribute `constant_value`, for the linter (`pep.core.lint.paths`); a decision only calls."""
    def ev(ctx: EvalContext) -> AnyValue:
        return value
    # a closure, not a callable object, for the fastest call; mypy allows no attribute on one:
    ev.constant_value = value  # type: ignore[attr-defined]  # a function attribute, on purpose
    return ev


def make_apply(impl: Callable[..., AnyValue], args: Sequence[Expr]) -> Expr:
    """First-order, strict function application."""
    n = len(args)
    if n == 0:
        return lambda ctx: impl()
    if n == 1:
        a0 = args[0]
        return lambda ctx: impl(a0(ctx))
    if n == 2:
        a0, a1 = args
        return lambda ctx: impl(a0(ctx), a1(ctx))
    if n == 3:
        a0, a1, a2 = args
        return lambda ctx: impl(a0(ctx), a1(ctx), a2(ctx))
    args = tuple(args)
    return lambda ctx: impl(*[a(ctx) for a in args])


def make_lazy_apply(impl: Callable[..., AnyValue], args: Sequence[Expr]) -> Expr:
    """and / or / n-of: arguments are handed over as thunks so that evaluation can stop early."""
    args = tuple(args)

    def ev(ctx: EvalContext) -> AnyValue:
        return impl(*[(lambda a=a: a(ctx)) for a in args])
    return ev


def make_higher_order(impl: Callable[..., AnyValue], func: Function, args: Sequence[Expr]
                      ) -> Expr:
    """A higher-order call: `func` is the function its <Function> argument names."""
    args = tuple(args)

    def ev(ctx: EvalContext) -> AnyValue:
        return impl(func, *[a(ctx) for a in args])
    return ev


def make_member_test(literal: AnyValue, bag_expr: Expr) -> Matcher:
    """any-of(T-equal, literal, bag) for types whose Python == is XACML equality."""
    def ev(ctx: EvalContext) -> bool:
        return literal in bag_expr(ctx)
    return ev


# ----------------------------------------------------------------------------- targets


def make_match(impl: Callable[..., AnyValue], literal: AnyValue, bag_expr: Expr,
               fast_equal: bool) -> Matcher:
    """A Match: true if the function holds between the literal and some value of the bag."""
    if fast_equal:
        # For the equality functions whose Python == is XACML equality, membership is the match.
        return make_member_test(literal, bag_expr)
    test = functools.partial(impl, literal)  # made once, not at every evaluation

    def match(ctx: EvalContext) -> bool:
        return _decided_by_any(bag_expr(ctx), test, True)
    return match


def _decided_by_any(items: Iterable[T], test: Callable[[T], object], decisive: bool) -> bool:
    """XACML's short-circuit over Indeterminate (a Match over a bag, AllOf, AnyOf): `decisive`
    as soon as one item's test gives it, even after an Indeterminate; else the first
    Indeterminate met is raised; else the other truth value."""
    error: Indeterminate | None = None
    for item in items:
        try:
            if bool(test(item)) is decisive:
                return decisive
        except Indeterminate as exc:
            error = error or exc
    if error is not None:
        raise error
    return not decisive


def make_all_of(matches: Sequence[Matcher]) -> Matcher:
    if len(matches) == 1:
        return matches[0]
    matches = tuple(matches)

    def all_of(ctx: EvalContext) -> bool:
        return _decided_by_any(matches, lambda m: m(ctx), False)
    return all_of


def make_any_of(all_ofs: Sequence[Matcher]) -> Matcher:
    if len(all_ofs) == 1:
        return all_ofs[0]
    all_ofs = tuple(all_ofs)

    def any_of(ctx: EvalContext) -> bool:
        return _decided_by_any(all_ofs, lambda a: a(ctx), True)
    return any_of


def make_target(any_ofs: Sequence[Matcher]) -> Matcher | None:
    """None for an empty target (matches everything), else a closure like an AllOf of AnyOfs."""
    if not any_ofs:
        return None
    return make_all_of(any_ofs)


# ----------------------------------------------------------------------------- obligations


class AssignmentExpr:
    __slots__ = ("attribute_id", "category", "issuer", "expr", "datatype", "is_bag", "fmt")

    def __init__(self, attribute_id: str, category: str | None, issuer: str | None, expr: Expr,
                 datatype: str, is_bag: bool, fmt: Callable[[AnyValue], str]) -> None:
        self.attribute_id = attribute_id
        self.category = category
        self.issuer = issuer
        self.expr = expr
        self.datatype = datatype
        self.is_bag = is_bag
        self.fmt = fmt


class ObligationExpr:
    """An ObligationExpression or AdviceExpression; evaluated only for its FulfillOn/AppliesTo."""

    __slots__ = ("id", "effect", "assignments", "static")

    def __init__(self, id: str, effect: int, assignments: Sequence[AssignmentExpr]) -> None:
        self.id = id
        self.effect = effect
        self.assignments = tuple(assignments)
        self.static = Obligation(id) if not assignments else None

    def evaluate(self, ctx: EvalContext) -> Obligation:
        if self.static is not None:
            return self.static
        out: list[AttributeAssignment] = []
        for a in self.assignments:
            value = a.expr(ctx)
            values = value if a.is_bag else (value,)
            for v in values:
                out.append(AttributeAssignment(a.attribute_id, a.datatype, a.fmt(v), a.category,
                                               a.issuer))
        return Obligation(self.id, tuple(out))


def evaluate_obligations(exprs: Sequence[ObligationExpr], ctx: EvalContext) -> Obligations:
    return tuple(e.evaluate(ctx) for e in exprs)


# ----------------------------------------------------------------------------- rules


class RuleEvaluator:
    """A compiled Rule. `target_spec` feeds the index; `evaluate` returns an Outcome; `notes`
    (`pdp.notes`) are for explanations and the linter, never read by a decision."""

    __slots__ = ("id", "effect", "target", "condition", "obligations", "advice", "target_spec",
                 "notes", "_plain", "_ind")

    def __init__(self, id: str, effect: int, target: Matcher | None, condition: Expr | None,
                 obligations: Sequence[ObligationExpr], advice: Sequence[ObligationExpr],
                 target_spec: TargetSpec | None, notes: Notes | None = None) -> None:
        self.id = id
        self.effect = effect
        self.target = target
        self.condition = condition
        self.obligations = tuple(o for o in obligations if o.effect == effect)
        self.advice = tuple(a for a in advice if a.effect == effect)
        self.target_spec = target_spec
        self.notes = notes
        self._plain = (Outcome(effect, grants=((id, ()),))
                       if not self.obligations and not self.advice else None)
        self._ind = IND_P if effect == PERMIT else IND_D

    def evaluate(self, ctx: EvalContext) -> Outcome:
        try:
            if self.target is not None and not self.target(ctx):
                return NA_OUTCOME
            if self.condition is not None and not self.condition(ctx):
                return NA_OUTCOME
            if self._plain is not None:
                return self._plain
            obligations = evaluate_obligations(self.obligations, ctx)
            return Outcome(self.effect, None, obligations,
                           evaluate_obligations(self.advice, ctx), grants=((self.id, obligations),))
        except Indeterminate as exc:
            return Outcome(self._ind, status_of(exc))
        except Exception as exc:  # noqa: BLE001 - a bug in a function must not crash the PDP: deny-biased
            return Outcome(self._ind, status_of_bug(exc))


# ----------------------------------------------------------------------------- policies


class PolicyEvaluator(Generic[ChildT]):
    """A compiled Policy or PolicySet: target, combining algorithm over children, obligations.

    `children` are RuleEvaluators (a Policy: `PolicyEvaluator[Evaluable]`) or policy-level
    evaluators (a PolicySet: `PolicyEvaluator[Applicable]`); the type parameter is what the
    combining algorithm asks of them. When the children are many, `index` narrows them to the
    candidates whose target could match. `notes` (`pdp.notes`) are for explanations and the
    linter, never read by a decision.
    """

    __slots__ = ("identifier", "is_policy_set", "target", "combine", "children", "index",
                 "obligations", "advice", "target_spec", "doc_id", "notes", "_ident_tuple")

    def __init__(self, identifier: PolicyIdentifier, target: Matcher | None,
                 combine: Combiner[ChildT], children: Sequence[ChildT],
                 obligations: Sequence[ObligationExpr], advice: Sequence[ObligationExpr],
                 target_spec: TargetSpec | None, index: ChildIndex | None = None,
                 notes: Notes | None = None) -> None:
        self.identifier = identifier
        self.is_policy_set = identifier.is_policy_set
        self.target = target
        self.combine = combine
        self.children = tuple(children)
        self.index = index
        self.obligations = tuple(obligations)
        self.advice = tuple(advice)
        self.target_spec = target_spec
        self.doc_id: str | None = None  # set for top-level documents
        self.notes = notes
        self._ident_tuple = (identifier,)

    @property
    def id(self) -> str:
        return self.identifier.id

    def is_applicable(self, ctx: EvalContext) -> bool:
        """Target only (only-one-applicable); raises Indeterminate."""
        return self.target is None or self.target(ctx)

    def evaluate(self, ctx: EvalContext) -> Outcome:
        target_error: Status | None = None
        if self.target is not None:
            try:
                if not self.target(ctx):
                    return NA_OUTCOME
            except Indeterminate as exc:
                target_error = status_of(exc)
            except Exception as exc:  # noqa: BLE001 - a bug in a target must not crash the PDP: Indeterminate
                target_error = status_of_bug(exc)
        children = (
            self.children if self.index is None else self.index.candidates(self.children, ctx)
        )
        result = self.combine(children, ctx)
        d = result.decision
        if d == NOT_APPLICABLE:
            return NA_OUTCOME
        docs = result.docs if self.doc_id is None else result.docs | {self.doc_id}
        policy_ids = self._ident_tuple + result.policy_ids
        if target_error is not None:
            # XACML 3.0 section 7.13: an Indeterminate target weakens the combined decision.
            if d == PERMIT or d == IND_P:
                d = IND_P
            elif d == DENY or d == IND_D:
                d = IND_D
            return Outcome(d, target_error, (), (), policy_ids, docs)
        obligations = result.obligations
        advice = result.advice
        if d == PERMIT or d == DENY:
            if self.obligations or self.advice:
                try:
                    own_o = tuple(o.evaluate(ctx) for o in self.obligations if o.effect == d)
                    own_a = tuple(a.evaluate(ctx) for a in self.advice if a.effect == d)
                except Indeterminate as exc:
                    return Outcome(IND_P if d == PERMIT else IND_D, status_of(exc), (), (),
                                   policy_ids, docs)
                except Exception as exc:  # noqa: BLE001 - a bug must not crash the PDP: deny-biased Indeterminate
                    return Outcome(IND_P if d == PERMIT else IND_D, status_of_bug(exc), (), (),
                                   policy_ids, docs)
                obligations = obligations + own_o
                advice = advice + own_a
                if own_o:
                    grants = tuple((rule, obls + own_o) for rule, obls in result.grants) \
                        or ((self.identifier.id, own_o),)
                    return Outcome(d, result.status, obligations, advice, policy_ids, docs,
                                   grants)
        return Outcome(d, result.status, obligations, advice, policy_ids, docs, result.grants)


Policy = PolicyEvaluator[Evaluable]  # a compiled <Policy>: its children are rules
PolicySet = PolicyEvaluator[Applicable]  # a compiled <PolicySet>
AnyPolicy = Policy | PolicySet  # a top-level document, what a reference resolves to
# The engine's link table: each reference of its documents, resolved (`pdp.references`).
Links = Mapping["RefSpec", AnyPolicy]


class ReferenceEvaluator:
    """A Policy(Set)IdReference, resolved per engine through `ctx.links` (so that compiled
    documents can be shared between engine generations)."""

    __slots__ = ("key", "description", "target_spec")

    def __init__(self, key: RefSpec, description: str) -> None:
        self.key = key
        self.description = description
        self.target_spec: TargetSpec | None = None  # never indexed: the target is elsewhere

    def evaluate(self, ctx: EvalContext) -> Outcome:
        return ctx.links[self.key].evaluate(ctx)

    def is_applicable(self, ctx: EvalContext) -> bool:
        return ctx.links[self.key].is_applicable(ctx)


def now_supplier(attribute_id: str) -> Expr | None:
    """For current-time/-date/-dateTime: a function of the context giving the PDP's clock."""
    if attribute_id == CURRENT_TIME:
        dt = get_datatype(TIME)
        return lambda ctx: dt.parse(ctx.now().time().isoformat() + _tz(ctx.now()))
    if attribute_id == CURRENT_DATE:
        dt = get_datatype(DATE)
        return lambda ctx: dt.parse(ctx.now().date().isoformat() + _tz(ctx.now()))
    if attribute_id == CURRENT_DATETIME:
        dt = get_datatype(DATETIME)
        return lambda ctx: dt.parse(ctx.now().replace(tzinfo=None).isoformat() + _tz(ctx.now()))
    return None


def _tz(now: _dt.datetime) -> str:
    off = now.utcoffset() or _dt.timedelta(0)
    minutes = int(off.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    minutes = abs(minutes)
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"
