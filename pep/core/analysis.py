"""Exact NR/PR analysis of filters, and the final filter as DNF for the execution plan.

NR (no result): the policy's and the user's conditions can never hold together.
PR (partial result): some tuple that the user's condition accepts is withheld by the policy, i.e.
`user AND NOT policy` is satisfiable.

Method (eXACML+ section 3.5, made exact):
1. NOT is pushed down to the comparisons (De Morgan and Table 2: NOT(x > v) is x <= v).
2. The result is expanded to DNF by distribution, pruning each conjunct the moment it becomes
   unsatisfiable, with a bound on its size (an AND of ten two-way ORs has 1024 conjuncts).
3. A conjunct is satisfiable when, for every attribute, its interval (open or closed bounds),
   equalities and inequalities leave a value: over the reals for double and timestamp attributes,
   over the integers for long ones, over strings in code-point order (where `s > 'a' AND
   s < 'a\\0'` is empty), over {true, false} for booleans.

Missing attributes are taken into account: a comparison over a missing value is false, so a tuple
that lacks an attribute the policy's filter needs is withheld (PR) even if the policy's filter is
a tautology over present values.

The DNF is our own rather than sympy's `to_dnf`: on these small formulas sympy takes about 1 ms
per call (over the whole budget of a request), cannot prune while it expands, and does not
know the theory anyway. The tests use sympy as an independent oracle for the boolean part.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Union

from pep.core.conditions import NEGATED_OP, And, Comparison, Const, Expr, Not, format_literal
from pep.core.plan import Conjunct, Predicate, Scalar, StreamSchema

ANALYSIS_LIMIT = 256  # conjuncts in the DNF of NOT(policy) and of the user's filter, for PR
PLAN_LIMIT = 1024  # conjuncts in the final filter handed to the runtime
WORK_LIMIT = 50_000  # conjunct pairs examined while distributing one AND (CPU bound)


@dataclass(frozen=True)
class Warning:  # noqa: A001 - the name the gateway's API uses
    """A finding reported to the consumer; it never weakens enforcement."""

    kind: Literal["NR", "PR", "INFO"]
    operator: Literal["filter", "map", "window", "join"]
    message: str
    predicates: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"kind": self.kind, "operator": self.operator, "message": self.message,
                "predicates": list(self.predicates)}


AnalysisWarning = Warning


class TooLarge(Exception):
    """The DNF would exceed its bound."""


class ConditionTooComplex(ValueError):
    """The merged filter cannot be expressed within the plan's bound."""


@dataclass(frozen=True)
class Atom:
    """One comparison of the NNF, with where it came from."""

    attribute: str
    op: str
    value: Scalar
    origin: Literal["policy", "user"]
    written: str  # the comparison as its author wrote it (before any NOT was pushed into it)

    def text(self) -> str:
        return f"{self.attribute} {self.op} {format_literal(self.value)}"


NNF = Union[Atom, bool, tuple]  # ("and", items) | ("or", items) | Atom | True | False


def to_nnf(expr: Expr, origin: Literal["policy", "user"], negate: bool = False) -> NNF:
    if isinstance(expr, Comparison):
        written = f"{expr.attribute} {expr.op} {format_literal(expr.value)}"
        op = NEGATED_OP[expr.op] if negate else expr.op
        return Atom(expr.attribute, op, expr.value, origin, written)  # type: ignore[arg-type]
    if isinstance(expr, Const):
        return expr.value != negate
    if isinstance(expr, Not):
        return to_nnf(expr.item, origin, not negate)
    is_and = isinstance(expr, And) != negate
    items = [to_nnf(i, origin, negate) for i in expr.items]
    return _combine("and" if is_and else "or", items)


def _combine(kind: str, items: list[NNF]) -> NNF:
    absorbing, neutral = (False, True) if kind == "and" else (True, False)
    flat: list[NNF] = []
    for item in items:
        if item is absorbing:
            return absorbing
        if item is neutral:
            continue
        if isinstance(item, tuple) and item[0] == kind:
            flat.extend(item[1])
        else:
            flat.append(item)
    if not flat:
        return neutral
    return flat[0] if len(flat) == 1 else (kind, tuple(flat))


# -- satisfiability of one conjunct ---------------------------------------------------------------

_UNSET = object()


@dataclass
class _Range:
    eq: object
    lo: Scalar | None
    lo_incl: bool
    hi: Scalar | None
    hi_incl: bool
    nes: set


def _collect(preds: list[tuple[str, Scalar]]) -> _Range | None:
    r = _Range(_UNSET, None, True, None, True, set())
    for op, v in preds:
        if op == "=":
            if r.eq is _UNSET:
                r.eq = v
            elif r.eq != v:
                return None
        elif op == "!=":
            r.nes.add(v)
        elif op in (">", ">="):
            incl = op == ">="
            if r.lo is None or v > r.lo or (v == r.lo and not incl):
                r.lo, r.lo_incl = v, incl
        else:
            incl = op == "<="
            if r.hi is None or v < r.hi or (v == r.hi and not incl):
                r.hi, r.hi_incl = v, incl
    return r


def _in_bounds(r: _Range, v: Scalar) -> bool:
    if r.lo is not None and (v < r.lo or (v == r.lo and not r.lo_incl)):
        return False
    if r.hi is not None and (v > r.hi or (v == r.hi and not r.hi_incl)):
        return False
    return True


def _int_bounds(r: _Range) -> tuple[float, float]:
    lo = -math.inf if r.lo is None else (math.ceil(r.lo) if r.lo_incl else math.floor(r.lo) + 1)
    hi = math.inf if r.hi is None else (math.floor(r.hi) if r.hi_incl else math.ceil(r.hi) - 1)
    return lo, hi


def _range_satisfiable(kind: str, r: _Range) -> bool:
    if r.eq is not _UNSET:
        v = r.eq
        if kind == "long" and not float(v).is_integer():  # type: ignore[arg-type]
            return False
        return _in_bounds(r, v) and v not in r.nes  # type: ignore[arg-type]
    if kind == "boolean":
        return any(v not in r.nes for v in (False, True))
    if kind == "long":
        lo, hi = _int_bounds(r)
        if lo > hi:
            return False
        if math.isinf(lo) or math.isinf(hi):
            return True
        excluded = {n for n in r.nes if float(n).is_integer() and lo <= n <= hi}
        return hi - lo + 1 > len(excluded)
    if kind == "string":
        return _string_range_satisfiable(r)
    # double and timestamp: the reals
    if r.lo is None or r.hi is None:
        return True
    if r.lo < r.hi:
        return True
    return r.lo == r.hi and r.lo_incl and r.hi_incl and r.lo not in r.nes


def _string_range_satisfiable(r: _Range) -> bool:
    # Above any string s, the smallest strings are s, s+"\0", s+"\0\0", ... in that order, so
    # walking that chain from the lower bound visits the interval's first elements; a value
    # outside the (finite) exclusion set turns up within len(nes) + 1 steps, or the interval ends.
    if r.lo is None:
        candidate = ""
    else:
        candidate = r.lo if r.lo_incl else r.lo + "\0"  # type: ignore[operator]
    for _ in range(len(r.nes) + 1):
        if r.hi is not None and (candidate > r.hi or (candidate == r.hi and not r.hi_incl)):
            return False
        if candidate not in r.nes:
            return True
        candidate += "\0"
    return True


def _group(atoms) -> dict[str, list[tuple[str, Scalar]]]:
    by_attr: dict[str, list[tuple[str, Scalar]]] = {}
    for a in atoms:
        by_attr.setdefault(a.attribute, []).append((a.op, a.value))
    return by_attr


class _Checker:
    """Satisfiability of conjuncts for one schema, with a small memo."""

    def __init__(self, schema: StreamSchema) -> None:
        self.kinds = {f.name: f.type for f in schema.fields}
        self.memo: dict[tuple, bool] = {}

    def attr_sat(self, attribute: str, preds) -> bool:
        key = (attribute, tuple(preds))
        hit = self.memo.get(key)
        if hit is None:
            r = _collect(preds)
            hit = r is not None and _range_satisfiable(self.kinds.get(attribute, "double"), r)
            if len(self.memo) < 10_000:
                self.memo[key] = hit
        return hit

    def satisfiable(self, atoms) -> bool:
        return all(self.attr_sat(attr, preds) for attr, preds in _group(atoms).items())

    def conflict(self, atoms) -> tuple[Atom, ...]:
        """A small set of atoms that cannot hold together (a pair when one exists)."""
        by_attr: dict[str, list[Atom]] = {}
        for a in atoms:
            by_attr.setdefault(a.attribute, []).append(a)
        for attr, group in by_attr.items():
            preds = [(a.op, a.value) for a in group]
            if self.attr_sat(attr, preds):
                continue
            for a in group:
                if not self.attr_sat(attr, [(a.op, a.value)]):
                    return (a,)
            for i in range(len(group)):
                for j in range(i + 1, len(group)):
                    if not self.attr_sat(attr, [(group[i].op, group[i].value),
                                                (group[j].op, group[j].value)]):
                        return (group[i], group[j])
            return tuple(group)
        return ()

    # -- DNF with pruning -------------------------------------------------------------------------

    def dnf(self, node: NNF, limit: int, prune: bool = True) -> list[tuple[Atom, ...]]:
        """Conjuncts of the DNF, contradictory ones dropped as they appear (when `prune`)."""
        return [atoms for atoms, _ in self._dnf(node, limit, prune)]

    def _dnf(self, node: NNF, limit: int, prune: bool) -> list[tuple[tuple[Atom, ...], dict]]:
        # A conjunct travels with its predicates grouped per attribute, so that conjoining two
        # satisfiable conjuncts only re-checks the attributes they share.
        if node is True:
            return [((), {})]
        if node is False:
            return []
        if isinstance(node, Atom):
            if prune and not self.attr_sat(node.attribute, [(node.op, node.value)]):
                return []
            return [((node,), {node.attribute: ((node.op, node.value),)})]
        kind, items = node
        if kind == "or":
            out: list[tuple[tuple[Atom, ...], dict]] = []
            seen: set[frozenset] = set()
            for item in items:
                for conj in self._dnf(item, limit, prune):
                    key = frozenset(map(id, conj[0]))
                    if key not in seen:
                        seen.add(key)
                        out.append(conj)
                if len(out) > limit:
                    raise TooLarge
            return out
        acc: list[tuple[tuple[Atom, ...], dict]] = [((), {})]
        for item in items:
            part = self._dnf(item, limit, prune)
            if len(acc) * len(part) > WORK_LIMIT:
                raise TooLarge
            nxt = []
            seen = set()
            for left in acc:
                for right in part:
                    merged = self._conjoin(left, right, prune)
                    if merged is None:
                        continue
                    key = frozenset(map(id, merged[0]))
                    if key in seen:
                        continue
                    seen.add(key)
                    nxt.append(merged)
                    if len(nxt) > limit:
                        raise TooLarge
            acc = nxt
            if not acc:
                return []
        return acc

    def _conjoin(self, left, right, prune: bool):
        left_atoms, left_groups = left
        right_atoms, right_groups = right
        groups = dict(left_groups)
        for attr, preds in right_groups.items():
            have = groups.get(attr)
            if have is None:
                groups[attr] = preds
                continue
            combined = have + tuple(p for p in preds if p not in have)
            if len(combined) > len(have):
                if prune and not self.attr_sat(attr, combined):
                    return None
                groups[attr] = combined
        present = set(map(id, left_atoms))
        return left_atoms + tuple(a for a in right_atoms if id(a) not in present), groups

    # -- simplification to plan predicates ---------------------------------------------------------

    def simplify(self, atoms) -> Conjunct:
        preds: list[Predicate] = []
        for attr, group in _group(atoms).items():
            kind = self.kinds.get(attr, "double")
            r = _collect(group)
            assert r is not None
            simplified = _range_predicates(attr, kind, r)
            if not simplified:
                # Every present value passes (e.g. `n != 1.5` on a long), but a tuple missing the
                # attribute must still fail: keep the original comparisons to say so.
                simplified = [Predicate(attr, op, v) for op, v in sorted(set(group), key=repr)]
            preds.extend(simplified)
        return tuple(sorted(preds, key=_predicate_key))


_OP_ORDER = {"=": 0, ">": 1, ">=": 2, "<": 3, "<=": 4, "!=": 5}


def _predicate_key(p: Predicate) -> tuple:
    return (p.attribute, _OP_ORDER[p.op], type(p.value).__name__, p.value)


def _range_predicates(attr: str, kind: str, r: _Range) -> list[Predicate]:
    if r.eq is not _UNSET:
        return [Predicate(attr, "=", r.eq)]  # type: ignore[arg-type]
    if kind == "boolean":
        remaining = [v for v in (False, True) if v not in r.nes]
        return [Predicate(attr, "=", remaining[0])] if len(remaining) == 1 else []
    if kind == "long":
        lo, hi = _int_bounds(r)
        nes = sorted(n for n in r.nes if float(n).is_integer() and lo <= n <= hi)
        while nes and nes[0] == lo:
            lo += 1
            nes.pop(0)
        while nes and nes[-1] == hi:
            hi -= 1
            nes.pop()
        if lo == hi:
            return [Predicate(attr, "=", int(lo))]
        out = []
        if not math.isinf(lo):
            out.append(Predicate(attr, ">=", int(lo)))
        if not math.isinf(hi):
            out.append(Predicate(attr, "<=", int(hi)))
        out.extend(Predicate(attr, "!=", int(n)) for n in nes)
        return out
    lo, lo_incl, hi, hi_incl = r.lo, r.lo_incl, r.hi, r.hi_incl
    nes = set(r.nes)
    if lo is not None and lo_incl and lo in nes:
        lo_incl = False
    if hi is not None and hi_incl and hi in nes:
        hi_incl = False
    if lo is not None and hi is not None and lo == hi:
        return [Predicate(attr, "=", lo)]
    out = []
    if lo is not None:
        out.append(Predicate(attr, ">=" if lo_incl else ">", lo))
    if hi is not None:
        out.append(Predicate(attr, "<=" if hi_incl else "<", hi))
    probe = _Range(_UNSET, lo, lo_incl, hi, hi_incl, set())
    out.extend(Predicate(attr, "!=", n) for n in sorted(nes, key=repr) if _in_bounds(probe, n)
               and not (n == lo or n == hi))
    return out


def values_satisfiable(kind: str, preds: list[tuple[str, Scalar]]) -> bool:
    """Whether some value of a type (double, long, string, boolean, timestamp) meets every
    (operator, constant) of `preds`: the per-attribute check, for other modules (joins)."""
    r = _collect(list(preds))
    return r is not None and _range_satisfiable(kind, r)


# -- the analysis ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class FilterAnalysis:
    filter_dnf: tuple[Conjunct, ...] | None  # None: every tuple passes; (): none does
    warnings: tuple[Warning, ...]
    nr: bool
    pr: bool | None  # None: too large to analyse


def _show(atom: Atom) -> str:
    return f"{atom.text()} ({'policy' if atom.origin == 'policy' else 'your query'})"


def analyse_filter(policy: Expr | None, user: Expr | None, schema: StreamSchema, *,
                   analysis_limit: int = ANALYSIS_LIMIT, plan_limit: int = PLAN_LIMIT
                   ) -> FilterAnalysis:
    """Merged filter for the plan, with NR/PR warnings.

    Raises ConditionTooComplex when the merged filter exceeds `plan_limit` conjuncts even after
    pruning: the request is refused rather than enforced approximately.
    """
    checker = _Checker(schema)
    p_nnf = to_nnf(policy, "policy") if policy is not None else True
    u_nnf = to_nnf(user, "user") if user is not None else True
    both = _combine("and", [p_nnf, u_nnf])
    try:
        merged = checker.dnf(both, plan_limit)
    except TooLarge:
        raise ConditionTooComplex(
            f"condition too complex: the merged filter has more than {plan_limit} alternatives "
            "in disjunctive normal form; simplify the query's filter") from None

    warnings: list[Warning] = []
    if not merged:
        warnings.append(_nr_warning(checker, p_nnf, u_nnf, analysis_limit))
        return FilterAnalysis((), tuple(warnings), nr=True, pr=True)

    dnf = _plan_dnf(checker, merged)
    pr: bool | None
    if p_nnf is True:
        pr = False
    else:
        try:
            pr_warning = _pr_warning(checker, policy, u_nnf, analysis_limit)  # type: ignore[arg-type]
        except TooLarge:
            pr = None
            warnings.append(Warning(
                "INFO", "filter",
                f"the filters are too large to analyse for partial results (more than "
                f"{analysis_limit} alternatives); the policy's filter is still enforced"))
        else:
            pr = pr_warning is not None
            if pr_warning is not None:
                warnings.append(pr_warning)
    return FilterAnalysis(dnf, tuple(warnings), nr=False, pr=pr)


def _plan_dnf(checker: _Checker, conjuncts: list[tuple[Atom, ...]]) -> tuple[Conjunct, ...] | None:
    simplified = {checker.simplify(c) for c in conjuncts}
    if () in simplified:
        return None
    ordered = sorted(simplified, key=lambda c: [_predicate_key(p) for p in c])
    if len(ordered) <= 64:  # drop conjuncts implied by a weaker one (a subset of its predicates)
        sets = [frozenset(c) for c in ordered]
        ordered = [c for i, c in enumerate(ordered)
                   if not any(j != i and sets[j] < sets[i] for j in range(len(sets)))]
    return tuple(ordered)


def _nr_warning(checker: _Checker, p_nnf: NNF, u_nnf: NNF, limit: int) -> Warning:
    try:
        raw = checker.dnf(_combine("and", [p_nnf, u_nnf]), limit, prune=False)
    except TooLarge:
        raw = []
    conflicts: list[tuple[Atom, ...]] = []
    for conj in raw:
        c = checker.conflict(conj)
        if c and c not in conflicts:
            conflicts.append(c)
    origins = {a.origin for c in conflicts for a in c}
    if origins == {"policy"}:
        lead = "the policy's filter can never hold, so no tuple will ever be delivered"
    elif origins == {"user"}:
        lead = "your query's filter can never hold, so no tuple will ever be delivered"
    else:
        lead = ("your query's filter contradicts the policy's filter: no tuple can satisfy both, "
                "so none will ever be delivered")
    details = "; ".join(" contradicts ".join(_show(a) for a in c) if len(c) > 1
                        else f"{_show(c[0])} holds for no value" for c in conflicts[:8])
    predicates: dict[str, None] = {}
    for c in conflicts:
        for a in c:
            predicates.setdefault(a.text(), None)
    message = f"{lead} ({details})" if details else lead
    return Warning("NR", "filter", message, tuple(predicates))


def _pr_warning(checker: _Checker, policy: Expr, u_nnf: NNF, limit: int) -> Warning | None:
    negated = to_nnf(policy, "policy", negate=True)
    users = checker.dnf(u_nnf, limit)
    classical = checker.dnf(negated, limit)
    if len(users) * len(classical) > WORK_LIMIT:
        raise TooLarge
    for u in users:  # a witness with every attribute present, the clearest to report
        for n in classical:
            if checker.satisfiable(u + n):
                return _describe_pr(u, n, ())
    by_presence: dict[frozenset, list[tuple[Atom, ...]]] = {}
    work = 0
    for u in users:
        present = frozenset(a.attribute for a in u)
        not_policy = by_presence.get(present)
        if not_policy is None:
            # Attributes the user's conjunct does not constrain may be missing from a tuple, and
            # then every policy comparison on them is false (their negations true): such atoms
            # of NOT(policy) are satisfied by a missing value and drop out.
            not_policy = by_presence[present] = checker.dnf(_restrict(negated, present), limit)
        work += len(not_policy)
        if work > WORK_LIMIT:
            raise TooLarge
        for n in not_policy:
            if checker.satisfiable(u + n):
                missing = sorted({a.attribute for a in _atoms(negated)} - present)
                return _describe_pr(u, n, missing, [a.written for a in _atoms(negated)
                                                    if a.attribute not in present])
    return None


def _restrict(node: NNF, present: frozenset) -> NNF:
    if isinstance(node, Atom):
        return node if node.attribute in present else True
    if isinstance(node, bool):
        return node
    kind, items = node
    return _combine(kind, [_restrict(i, present) for i in items])


def _atoms(node: NNF) -> list[Atom]:
    if isinstance(node, Atom):
        return [node]
    if isinstance(node, bool):
        return []
    return [a for i in node[1] for a in _atoms(i)]


def _describe_pr(user: tuple[Atom, ...], witness: tuple[Atom, ...], missing,
                 also_violated=()) -> Warning:
    violated: dict[str, None] = {}
    for text in [a.written for a in witness] + list(also_violated):
        violated.setdefault(text, None)
    where = " AND ".join(a.text() for a in witness)
    gone = f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing" if missing else ""
    if where and gone:
        where = f"{where} (or where {gone})"
    wants = " AND ".join(a.text() for a in user) if user else "every tuple"
    message = (f"partial result: some tuples your query asks for ({wants}) are withheld by the "
               f"policy's filter, for example those where {where or gone}")
    message += f"; policy predicates that such tuples fail: {', '.join(violated)}"
    return Warning("PR", "filter", message, tuple(violated))
