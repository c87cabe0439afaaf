"""The analysis of a policy's and a consumer's filters together: the plan's final filter in
DNF, NR when they can never hold together, PR when the policy withholds a tuple the consumer's
filter accepts, each finding worded with an example (`analyse_filter`)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pep.core.analysis.atoms import (
    ANALYSIS_LIMIT,
    MASKED,
    NEVER,
    NNF,
    PLAN_LIMIT,
    SPATIAL,
    WORK_LIMIT,
    Atom,
    ConditionTooComplex,
    Constant,
    MergeWarning,
    RawBound,
    TooLarge,
    combine,
    to_nnf,
)
from pep.core.analysis.conjuncts import Atoms, Checker, predicate_key
from pep.core.conditions import Expr
from pep.core.plan import Conjunct, StreamSchema


class MaskedValues(Protocol):
    """What the analysis asks of the masks a consumer's filter reads through
    (`pep.core.masks.MaskPlan`, which builds on the analysis): what a comparison on a masked
    value implies of the raw one, what each masked value is compared as, and which masked
    values it decides only approximately (filled while the consumer's filter is read)."""

    inexact: set[str]

    @property
    def variable_kinds(self) -> Mapping[str, str]: ...

    def implied(self, name: str, op: str, value: Constant) -> list[list[RawBound]] | None: ...


@dataclass(frozen=True)
class FilterAnalysis:
    filter_dnf: tuple[Conjunct, ...] | None  # None: every tuple passes; (): none does
    warnings: tuple[MergeWarning, ...]
    nr: bool
    pr: bool | None  # None: too large to analyse


def _show(atom: Atom) -> str:
    """An atom in a warning: its author's predicate as written (NOTs included), whose it is,
    and, when the NOTs pushed into it changed it, the comparison it became ("i.e.")."""
    if atom.attribute.startswith(MASKED) and atom.attribute != NEVER:
        name, _, spec = atom.attribute[1:].partition(MASKED)
        whose = f"your query, on {name} masked as {spec}"
    elif atom.attribute == NEVER:
        whose = "your query, on a masked value"
    else:
        whose = "policy" if atom.origin == "policy" else "your query"
    if not atom.implied and atom.attribute != NEVER and atom.text() != atom.written:
        whose += f", i.e. {atom.text()}"
    return f"{atom.shown()} ({whose})"


def analyse_filter(policy: Expr | None, user: Expr | None, schema: StreamSchema, *,
                   analysis_limit: int = ANALYSIS_LIMIT, plan_limit: int = PLAN_LIMIT,
                   masks: MaskedValues | None = None) -> FilterAnalysis:
    """Merged filter for the plan, with NR/PR warnings.

    Raises ConditionTooComplex when the merged filter exceeds `plan_limit` conjuncts even after
    pruning: the request is refused rather than enforced approximately.
    `masks` (a `pep.core.masks.MaskPlan`): the user's comparisons on masked values are derived
    variables (its `variable_kinds`), with the raw bounds they imply.
    """
    implied = masks.implied if masks is not None else None
    u_nnf = to_nnf(user, "user", implied=implied) if user is not None else True
    checker = (Checker(schema, masks.inexact, masks.variable_kinds) if masks is not None
               else Checker(schema))
    p_nnf = to_nnf(policy, "policy") if policy is not None else True
    both = combine("and", [p_nnf, u_nnf])
    try:
        merged = checker.dnf(both, plan_limit)
    except TooLarge:
        raise ConditionTooComplex(
            f"condition too complex: the merged filter has more than {plan_limit} alternatives "
            "in disjunctive normal form; simplify the query's filter") from None

    warnings: list[MergeWarning] = []
    if not merged:
        warnings.append(_nr_warning(checker, p_nnf, u_nnf, analysis_limit))
        return FilterAnalysis((), tuple(warnings), nr=True, pr=True)

    dnf = _plan_dnf(checker, merged)
    pr: bool | None
    if p_nnf is True or policy is None:  # (no policy: p_nnf is True)
        pr = False
    else:
        try:
            pr_warning = _pr_warning(checker, policy, u_nnf, analysis_limit)
        except TooLarge:
            pr = None
            warnings.append(MergeWarning(
                "INFO", "filter",
                f"the filters are too large to analyse for partial results (more than "
                f"{analysis_limit} alternatives); the policy's filter is still enforced"))
        else:
            pr = pr_warning is not None
            if pr_warning is not None:
                warnings.append(pr_warning)
    return FilterAnalysis(dnf, tuple(warnings), nr=False, pr=pr)


def _plan_dnf(checker: Checker, conjuncts: list[Atoms]) -> tuple[Conjunct, ...] | None:
    simplified = {checker.simplify(c) for c in conjuncts}
    if () in simplified:
        return None
    ordered = sorted(simplified, key=lambda c: [predicate_key(p) for p in c])
    if len(ordered) <= 64:  # drop conjuncts implied by a weaker one (a subset of its predicates)
        sets = [frozenset(c) for c in ordered]
        ordered = [c for i, c in enumerate(ordered)
                   if not any(j != i and sets[j] < sets[i] for j in range(len(sets)))]
    return tuple(ordered)


def _nr_warning(checker: Checker, p_nnf: NNF, u_nnf: NNF, limit: int) -> MergeWarning:
    try:
        raw = checker.dnf(combine("and", [p_nnf, u_nnf]), limit, prune=False)
    except TooLarge:
        raw = []
    conflicts: list[Atoms] = []
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
    details = "; ".join(_conflict_text(c) for c in conflicts[:8])
    predicates: dict[str, None] = {}
    for c in conflicts:
        for a in c:
            predicates.setdefault(a.shown(), None)
    message = f"{lead} ({details})" if details else lead
    return MergeWarning("NR", "filter", message, tuple(predicates))


def _conflict_text(conflict: Atoms) -> str:
    """Atoms that cannot hold together, each named by its author's predicate (`Atom.written`):
    atoms of one NOT(...) are that one predicate, which then holds for no value alone."""
    shown = list(dict.fromkeys(_show(a) for a in conflict))
    if len(shown) == 1:
        return f"{shown[0]} holds for no value"
    if len(shown) == 2:
        return " contradicts ".join(shown)
    return f"{', '.join(shown[:-1])} and {shown[-1]} cannot hold together"


def _pr_warning(checker: Checker, policy: Expr, u_nnf: NNF, limit: int) -> MergeWarning | None:
    negated = to_nnf(policy, "policy", negate=True)
    users = checker.dnf(u_nnf, limit)
    classical = checker.dnf(negated, limit)
    if len(users) * len(classical) > WORK_LIMIT:
        raise TooLarge
    for u in users:  # a witness with every attribute present, the clearest to report
        for n in classical:
            if checker.satisfiable(u + n):
                return _describe_pr(u, n, (), undecided=checker.inexact(u + n))
    by_presence: dict[frozenset[str], list[Atoms]] = {}
    work = 0
    for u in users:
        present = _present(u)
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
                absent = [a for a in _atoms(negated) if not _needs(a) <= present]
                missing = sorted({_name(x, a) for a in absent for x in _needs(a) - present})
                return _describe_pr(u, n, missing, [a.written for a in absent],
                                    undecided=checker.inexact(u + n))
    return None


def _needs(atom: Atom) -> frozenset[str]:
    """What a tuple must have for the atom to be able to hold: its attribute; for DISTANCE and
    WITHIN_POLYGON a position; for DISTANCE_TO a known anchor (which only the same anchor in the
    user's conjunct guarantees)."""
    g = atom.spatial
    if g is None or g.function == "distance_to":
        return frozenset({atom.attribute})
    return frozenset({g.latitude, g.longitude})


def _present(conjunct: Atoms) -> frozenset[str]:
    """What every tuple passing the conjunct has (a predicate over a missing value is false)."""
    out: set[str] = set()
    for a in conjunct:
        out.add(a.attribute)
        if a.spatial is not None:
            out.update((a.spatial.latitude, a.spatial.longitude))
    return frozenset(out)


def _name(needed: str, atom: Atom) -> str:
    if needed.startswith(SPATIAL):
        return f"the anchor's position of {atom.term or atom.written}"
    return needed


def _restrict(node: NNF, present: frozenset[str]) -> NNF:
    if isinstance(node, Atom):
        return node if _needs(node) <= present else True
    if isinstance(node, bool):
        return node
    kind, items = node
    return combine(kind, [_restrict(i, present) for i in items])


def _atoms(node: NNF) -> list[Atom]:
    if isinstance(node, Atom):
        return [node]
    if isinstance(node, bool):
        return []
    return [a for i in node[1] for a in _atoms(i)]


def _undecided_kind(texts: Sequence[str]) -> str:
    spatial = any(t.startswith(("DISTANCE", "WITHIN_POLYGON", "NOT WITHIN_POLYGON"))
                  for t in texts)
    masked = not all(t.startswith(("DISTANCE", "WITHIN_POLYGON", "NOT WITHIN_POLYGON"))
                     for t in texts)
    if spatial and masked:
        return "spatial predicates and comparisons of masked values"
    return "comparisons of masked values" if masked else "spatial predicates"


def _describe_pr(user: Atoms, witness: Atoms, missing: Sequence[str],
                 also_violated: Iterable[str] = (), undecided: tuple[str, ...] = ()
                 ) -> MergeWarning:
    violated: dict[str, None] = {}
    for text in [a.written for a in witness] + list(also_violated):
        violated.setdefault(text, None)
    where = " AND ".join(a.text() for a in witness if not a.implied)
    gone = f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing" if missing else ""
    if where and gone:
        where = f"{where} (or where {gone})"
    shown = [a.text() for a in user if not a.implied]
    wants = " AND ".join(shown) if shown else "every tuple"
    if undecided:
        message = (f"possibly partial result: the analysis cannot decide exactly whether the "
                   f"tuples your query asks for ({wants}) all pass the policy's filter, because "
                   f"it does not decide how these {_undecided_kind(undecided)} combine: "
                   f"{', '.join(undecided)}; it reports a partial result to be safe (perhaps "
                   f"none is withheld), for example where {where or gone}")
    else:
        message = (f"partial result: some tuples your query asks for ({wants}) are withheld by "
                   f"the policy's filter, for example those where {where or gone}")
    message += f"; policy predicates that such tuples fail: {', '.join(violated)}"
    return MergeWarning("PR", "filter", message, tuple(violated))
