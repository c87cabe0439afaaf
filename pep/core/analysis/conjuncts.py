"""Satisfiability of one conjunct of atoms, exactly per attribute type (intervals over the
reals, the 64-bit integers, the microseconds of years 1 to 9999, strings in code-point order,
booleans, labels on their lattice; spatial variables soundly, see the package docstring), the
DNF expanded with pruning (`Checker`), and a satisfiable conjunct as the plan's predicates."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from pep.core import geo, labels
from pep.core.analysis.atoms import (
    CONTAINMENT_LIMIT,
    DISTANCE_MARGIN_M,
    NNF,
    SPATIAL,
    WORK_LIMIT,
    Atom,
    Constant,
    TooLarge,
    spatial_with,
)
from pep.core.exact import (
    INT64_MAX,
    INT64_MIN,
    MAX_MICROS,
    MIN_MICROS,
    ExactNumber,
    ceil_exact,
    floor_exact,
    is_integral,
    is_number,
    iso_from_micros,
    micros_from_iso,
    micros_from_seconds,
)
from pep.core.labels import Label
from pep.core.plan import (
    AnyPredicate,
    Conjunct,
    Predicate,
    PredicateOperator,
    SpatialPredicate,
    StreamSchema,
)

_UNSET = object()

Constraint = tuple[str, Constant]
"""(op, constant): one comparison of an attribute (or derived variable), as a conjunct's atoms
give it."""
Atoms = tuple[Atom, ...]
"""A conjunct of atoms (all hold)."""
Groups = dict[str, tuple[Constraint, ...]]
"""A conjunct's comparisons by attribute (what conjoining re-checks)."""
Term = tuple[Atoms, Groups]
"""A conjunct of the DNF being built, with its comparisons grouped."""


@dataclass
class _Range:
    eq: Constant
    lo: Constant | None
    lo_incl: bool
    hi: Constant | None
    hi_incl: bool
    nes: set[Constant]


def _collect(preds: Iterable[Constraint]) -> _Range | None:
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


def _in_bounds(r: _Range, v: Constant) -> bool:
    if r.lo is not None and (v < r.lo or (v == r.lo and not r.lo_incl)):
        return False
    if r.hi is not None and (v > r.hi or (v == r.hi and not r.hi_incl)):
        return False
    return True


# The integer domains: long attributes hold 64-bit integers, timestamps microseconds of years
# 1 to 9999 (their constants, the gateway's texts, are read as such; see `_integers`).
INTEGER_DOMAINS: dict[str, tuple[int, int]] = {"long": (INT64_MIN, INT64_MAX),
                                               "timestamp": (MIN_MICROS, MAX_MICROS)}


def _micros(value: Constant) -> ExactNumber:
    """A timestamp constant as epoch microseconds (a number, as plans stored before the texts
    held, is epoch seconds)."""
    if isinstance(value, str):
        return micros_from_iso(value)
    return micros_from_seconds(value)


def _integers(kind: str, preds: Iterable[Constraint]) -> list[Constraint]:
    """The (operator, constant) pairs of an integer-domain attribute with numeric constants."""
    if kind == "timestamp":
        return [(op, _micros(v)) for op, v in preds]
    return list(preds)


def _int_bounds(r: _Range, kind: str) -> tuple[int, int]:
    """The least and greatest integers of the domain within the range's bounds (exact)."""
    low, high = INTEGER_DOMAINS[kind]
    lo, hi = low, high
    if r.lo is not None:
        lo = max(low, ceil_exact(r.lo) if r.lo_incl else floor_exact(r.lo) + 1)
    if r.hi is not None:
        hi = min(high, floor_exact(r.hi) if r.hi_incl else ceil_exact(r.hi) - 1)
    return lo, hi


def _range_satisfiable(kind: str, r: _Range) -> bool:
    if kind == "null":  # a masked value that is always null (or NEVER): no comparison holds
        return False
    if kind in INTEGER_DOMAINS:
        low, high = INTEGER_DOMAINS[kind]
        if r.eq is not _UNSET:
            v = r.eq
            return (is_integral(v) and low <= v <= high
                    and _in_bounds(r, v) and v not in r.nes)
        lo, hi = _int_bounds(r, kind)
        if lo > hi:
            return False
        excluded = {n for n in r.nes if is_number(n) and is_integral(n) and lo <= n <= hi}
        return hi - lo + 1 > len(excluded)
    if r.eq is not _UNSET:
        v = r.eq
        return _in_bounds(r, v) and v not in r.nes
    if kind == "boolean":
        return any(v not in r.nes for v in (False, True))
    if kind == "string":
        return _string_range_satisfiable(r)
    # double: the reals
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
        candidate = r.lo if r.lo_incl else r.lo + "\0"
    for _ in range(len(r.nes) + 1):
        if r.hi is not None and (candidate > r.hi or (candidate == r.hi and not r.hi_incl)):
            return False
        if candidate not in r.nes:
            return True
        candidate += "\0"
    return True


def _group(atoms: Iterable[Atom]) -> dict[str, list[Constraint]]:
    by_attr: dict[str, list[Constraint]] = {}
    for a in atoms:
        by_attr.setdefault(a.attribute, []).append((a.op, a.value))
    return by_attr


def _distance(atom: Atom) -> float:
    """The constant of an atom on a distance variable: a number of metres."""
    if isinstance(atom.value, (str, Label)):
        raise TypeError(f"a distance compared with {atom.value!r}")
    return float(atom.value)


class Checker:
    """Satisfiability of conjuncts for one schema, with a small memo."""

    def __init__(self, schema: StreamSchema, inexact: set[str] | frozenset[str] = frozenset(),
                 variables: Mapping[str, str] | None = None) -> None:
        # an attribute's type, or a derived variable's kind (`variables`: a masked value's)
        self.kinds: dict[str, str] = {f.name: f.type for f in schema.fields}
        if variables:
            self.kinds.update(variables)
        self.lattices = {f.name: f.lattice for f in schema.fields if f.lattice is not None}
        # (attribute, its comparisons) or ("convex", a polygon's points) -> the verdict
        self.memo: dict[tuple[str, tuple[Constraint, ...]] | tuple[str, tuple[float, ...]],
                        bool] = {}
        self.inexact_variables = inexact  # masked values decided only approximately

    def kind(self, attribute: str) -> str:
        if attribute.startswith(SPATIAL):
            return "boolean" if attribute.startswith(SPATIAL + "polygon:") else "double"
        return self.kinds.get(attribute, "double")

    def attr_sat(self, attribute: str, preds: Sequence[Constraint]) -> bool:
        key = (attribute, tuple(preds))
        hit = self.memo.get(key)
        if hit is None:
            checked = list(preds)
            if attribute.startswith(SPATIAL) and not attribute.startswith(SPATIAL + "polygon:"):
                # a distance is never negative nor beyond half the circumference (plus rounding)
                checked += [(">=", 0.0), ("<=", geo.MAX_DISTANCE_M + DISTANCE_MARGIN_M)]
            kind = self.kind(attribute)
            if attribute in self.lattices:  # a partial order: `pep.core.labels`
                hit = labels.satisfiable(self.lattices[attribute], checked)
            else:
                r = _collect(_integers(kind, checked))
                hit = r is not None and _range_satisfiable(kind, r)
            if len(self.memo) < 10_000:
                self.memo[key] = hit
        return hit

    def satisfiable(self, atoms: Atoms) -> bool:
        return all(self.attr_sat(attr, preds) for attr, preds in _group(atoms).items()) \
            and not self.spatial_conflict(atoms)

    def spatial_conflict(self, atoms: Atoms) -> Atoms:
        """Atoms of different spatial variables that cannot hold together (see the module
        docstring for what is decided); () when none is found."""
        spatial = [a for a in atoms if a.spatial is not None]
        if not spatial:
            return ()
        first = spatial[0].spatial
        if len(spatial) == 1 and first is not None and first.function != "polygon":
            return ()
        groups: dict[str, list[Atom]] = {}
        for a in spatial:
            groups.setdefault(a.attribute, []).append(a)
        # (the group's geometry, its lower bound atom, its upper bound atom)
        circles: list[tuple[SpatialPredicate, Atom | None, Atom | None]] = []
        inside: list[tuple[Atom, SpatialPredicate]] = []
        outside: list[tuple[Atom, SpatialPredicate]] = []
        for group in groups.values():
            g = group[0].spatial
            assert g is not None
            if g.function == "polygon":
                for a in group:
                    (inside if (a.op == "=") == bool(a.value) else outside).append((a, g))
            elif g.function == "distance":
                lo: Atom | None = None
                hi: Atom | None = None
                for a in group:
                    if a.op in (">", ">=") and (lo is None or _distance(a) > _distance(lo)):
                        lo = a
                    if a.op in ("<", "<=") and (hi is None or _distance(a) < _distance(hi)):
                        hi = a
                circles.append((g, lo, hi))
        for i, (g1, _lo1, hi1) in enumerate(circles):
            for j, (g2, lo2, hi2) in enumerate(circles):
                if i == j or (g1.latitude, g1.longitude) != (g2.latitude, g2.longitude):
                    continue
                d = geo.haversine(g1.points[0], g1.points[1], g2.points[0], g2.points[1])
                if hi1 is not None and lo2 is not None:
                    reach = d + _distance(hi1)
                    if reach + DISTANCE_MARGIN_M + 1e-9 * reach < _distance(lo2):
                        return (hi1, lo2)
                if i < j and hi1 is not None and hi2 is not None:
                    apart = _distance(hi1) + _distance(hi2)
                    if d > apart + DISTANCE_MARGIN_M + 1e-9 * d:
                        return (hi1, hi2)
        for out_atom, p2 in outside:
            if not self.convex(p2.points):
                continue
            for in_atom, p1 in inside:
                if (p1.latitude, p1.longitude) != (p2.latitude, p2.longitude) or p1 == p2:
                    continue
                if len(p1.points) * len(p2.points) // 4 > CONTAINMENT_LIMIT:
                    continue
                if geo.polygon_contains_points(p2.points, p1.points):
                    return (in_atom, out_atom)
            box = self._box(atoms, p2.latitude, p2.longitude)
            if box is not None and len(p2.points) * 2 <= CONTAINMENT_LIMIT:
                (south, west, north, east), bounds = box
                corners = (south, west, south, east, north, east, north, west)
                if geo.polygon_contains_points(p2.points, corners):
                    return (*bounds, out_atom)
        return ()

    def convex(self, points: tuple[float, ...]) -> bool:
        key = ("convex", points)
        hit = self.memo.get(key)
        if hit is None:
            hit = geo.convex(points)
            if len(self.memo) < 10_000:
                self.memo[key] = hit
        return hit

    @staticmethod
    def _box(atoms: Atoms, lat: str, lon: str
             ) -> tuple[tuple[float, float, float, float], Atoms] | None:
        """The lat/lon box the conjunct's bounds (implied ones included) confine a tuple to,
        with the atoms that give its four sides; None when a side is open."""
        sides = []
        used: list[Atom] = []
        for attr in (lat, lon):
            lo: Atom | None = None
            hi: Atom | None = None
            low = high = 0.0  # their values
            for a in atoms:
                value = a.value
                if a.attribute != attr or a.spatial is not None or isinstance(value, bool) \
                        or not isinstance(value, (int, float)):
                    continue
                if a.op in (">", ">=", "=") and (lo is None or value > low):
                    lo, low = a, value
                if a.op in ("<", "<=", "=") and (hi is None or value < high):
                    hi, high = a, value
            if lo is None or hi is None:
                return None
            sides.append((float(low), float(high)))
            used += [lo, hi]
        (south, north), (west, east) = sides
        return (south, west, north, east), tuple(dict.fromkeys(used))

    def inexact(self, atoms: Atoms) -> tuple[str, ...]:
        """The spatial predicates whose interplay in this conjunct the analysis cannot decide
        exactly (a verdict of 'satisfiable' may then be an over-approximation)."""
        by_position: dict[tuple[str, str], list[Atom]] = {}
        for a in atoms:
            if a.spatial is not None:
                by_position.setdefault((a.spatial.latitude, a.spatial.longitude), []).append(a)
        out: dict[str, None] = {}
        for (lat, lon), group in by_position.items():
            variables = {a.attribute for a in group}
            ranged = any(a.spatial is None and not a.implied and a.attribute in (lat, lon)
                         for a in atoms)
            if len(variables) > 1 or ranged:
                for a in group:
                    out.setdefault(a.text(), None)
        for a in atoms:
            if not a.implied and a.attribute in self.inexact_variables:
                out.setdefault(a.text(), None)
        return tuple(out)

    def conflict(self, atoms: Atoms) -> Atoms:
        """A small set of atoms that cannot hold together (a pair when one exists)."""
        return self._attribute_conflict(atoms) or self.spatial_conflict(atoms)

    def _attribute_conflict(self, atoms: Atoms) -> Atoms:
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

    def dnf(self, node: NNF, limit: int, prune: bool = True) -> list[Atoms]:
        """Conjuncts of the DNF, contradictory ones dropped as they appear (when `prune`; the
        spatial checks across variables run on the finished conjuncts)."""
        return [atoms for atoms, _ in self._dnf(node, limit, prune)
                if not prune or not self.spatial_conflict(atoms)]

    def _dnf(self, node: NNF, limit: int, prune: bool) -> list[Term]:
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
            out: list[Term] = []
            seen: set[frozenset[int]] = set()
            for item in items:
                for conj in self._dnf(item, limit, prune):
                    key = frozenset(map(id, conj[0]))
                    if key not in seen:
                        seen.add(key)
                        out.append(conj)
                if len(out) > limit:
                    raise TooLarge
            return out
        acc: list[Term] = [((), {})]
        for item in items:
            part = self._dnf(item, limit, prune)
            if len(acc) * len(part) > WORK_LIMIT:
                raise TooLarge
            nxt: list[Term] = []
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

    def _conjoin(self, left: Term, right: Term, prune: bool) -> Term | None:
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

    def simplify(self, atoms: Atoms) -> Conjunct:
        preds: list[AnyPredicate] = []
        geometry = {a.attribute: a.spatial for a in atoms if a.spatial is not None}
        for attr, group in _group([a for a in atoms if not a.implied]).items():
            kind = self.kind(attr)
            if attr in self.lattices:
                preds.extend(_label_predicates(attr, group))
                continue
            r = _collect(group if attr in geometry else _integers(kind, group))
            assert r is not None
            if attr in geometry:
                preds.extend(_spatial_predicates(geometry[attr], r))
                continue
            simplified = _range_predicates(attr, kind, r)
            if not simplified:
                # Every present value passes (e.g. `n != 1.5` on a long), but a tuple missing the
                # attribute must still fail: keep the original comparisons to say so.
                simplified = [Predicate(attr, _plan_op(op), v)
                              for op, v in sorted(set(group), key=repr)]
            preds.extend(simplified)
        return tuple(sorted(preds, key=predicate_key))


_OP_ORDER = {"=": 0, ">": 1, ">=": 2, "<": 3, "<=": 4, "!=": 5,
             "!<=": 6, "!>=": 7, "!<": 8, "!>": 9}  # the last: negated label comparisons


def _plan_op(op: str) -> PredicateOperator:
    """An atom's op as the plan's: it is one (binding gives comparisons only the plan's
    operators, and the NNF negates them into the plan's or, on labels, their negations)."""
    return cast(PredicateOperator, op)  # an atom's op is one of the plan's (above)


PredicateKey = tuple[str, int, str, object]
"""How a conjunct's predicates are ordered: attribute, operator, kind of constant, constant."""


def predicate_key(p: AnyPredicate) -> PredicateKey:
    if isinstance(p, SpatialPredicate):
        return (p.latitude, 10 + _OP_ORDER[p.op], "~spatial",
                repr((p.function, p.points, p.key, repr(p.key_value), p.value)))
    if isinstance(p.value, Label):
        return (p.attribute, _OP_ORDER[p.op], "~label", str(p.value))
    return (p.attribute, _OP_ORDER[p.op], type(p.value).__name__, p.value)


def _label_predicates(attr: str, group: Sequence[Constraint]) -> list[Predicate]:
    """A label attribute's comparisons for the plan: every DOMINATED_BY as one (their greatest
    lower bound), every DOMINATES as one (their least upper bound), the others as they are."""
    out = []
    below = labels.glb(v for op, v in group if op == "<=")  # None: there is none
    if below is not None:
        out.append(Predicate(attr, "<=", below))
    above = labels.lub(v for op, v in group if op == ">=")
    if above is not None:
        out.append(Predicate(attr, ">=", above))
    out.extend(Predicate(attr, _plan_op(op), v) for op, v in
               dict.fromkeys((op, v) for op, v in group if op not in ("<=", ">=")))
    return out


def _spatial_predicates(g: SpatialPredicate, r: _Range) -> list[SpatialPredicate]:
    """A spatial variable's range back as plan predicates (a distance's bounds stay bounds:
    no `=` on a distance, no `!=` arises; a polygon is inside or outside)."""
    if g.function == "polygon":
        inside = r.eq is True or (r.eq is _UNSET and False in r.nes)
        return [spatial_with(g, "=" if inside else "!=", True)]
    out: list[SpatialPredicate] = []
    if r.lo is not None:
        out.append(spatial_with(g, ">=" if r.lo_incl else ">", r.lo))
    if r.hi is not None:
        out.append(spatial_with(g, "<=" if r.hi_incl else "<", r.hi))
    return out


def _range_predicates(attr: str, kind: str, r: _Range) -> list[Predicate]:
    if r.eq is not _UNSET:
        if kind == "timestamp":
            return [Predicate(attr, "=", iso_from_micros(int(r.eq)))]
        return [Predicate(attr, "=", r.eq)]
    if kind == "boolean":
        remaining = [v for v in (False, True) if v not in r.nes]
        return [Predicate(attr, "=", remaining[0])] if len(remaining) == 1 else []
    if kind in INTEGER_DOMAINS:
        low, high = INTEGER_DOMAINS[kind]
        shown = iso_from_micros if kind == "timestamp" else int
        lo, hi = _int_bounds(r, kind)
        nes = sorted(n for n in r.nes if is_integral(n) and lo <= n <= hi)
        while nes and nes[0] == lo:
            lo += 1
            nes.pop(0)
        while nes and nes[-1] == hi:
            hi -= 1
            nes.pop()
        if lo == hi:
            return [Predicate(attr, "=", shown(lo))]
        out: list[Predicate] = []
        if lo > low:
            out.append(Predicate(attr, ">=", shown(lo)))
        if hi < high:
            out.append(Predicate(attr, "<=", shown(hi)))
        out.extend(Predicate(attr, "!=", shown(int(n))) for n in nes)
        return out
    return _ordered_predicates(attr, r)


def _ordered_predicates(attr: str, r: _Range) -> list[Predicate]:
    """The range of a double or string attribute as plan predicates."""
    lo, lo_incl, hi, hi_incl = r.lo, r.lo_incl, r.hi, r.hi_incl
    nes = set(r.nes)
    if lo is not None and lo_incl and lo in nes:
        lo_incl = False
    if hi is not None and hi_incl and hi in nes:
        hi_incl = False
    if lo is not None and hi is not None and lo == hi:
        return [Predicate(attr, "=", lo)]
    out: list[Predicate] = []
    if lo is not None:
        out.append(Predicate(attr, ">=" if lo_incl else ">", lo))
    if hi is not None:
        out.append(Predicate(attr, "<=" if hi_incl else "<", hi))
    probe = _Range(_UNSET, lo, lo_incl, hi, hi_incl, set())
    out.extend(Predicate(attr, "!=", n) for n in sorted(nes, key=repr) if _in_bounds(probe, n)
               and not (n == lo or n == hi))
    return out


def values_satisfiable(kind: str, preds: Sequence[Constraint]) -> bool:
    """Whether some value of a type (double, long, string, boolean, timestamp) meets every
    (operator, constant) of `preds`: the per-attribute check, for other modules (joins).
    Labels (a partial order, whose lattice is not known here) are assumed satisfiable: never a
    false NR."""
    if kind == "label":
        return True
    r = _collect(_integers(kind, preds))
    return r is not None and _range_satisfiable(kind, r)
