"""Exact NR/PR analysis of filters, and the final filter as DNF for the execution plan.

NR (no result): the policy's and the user's conditions can never hold together.
PR (partial result): some tuple that the user's condition accepts is withheld by the policy, i.e.
`user AND NOT policy` is satisfiable.

Method (eXACML+ section 3.5, made exact):
1. NOT is pushed down to the comparisons (De Morgan and Table 2: NOT(x > v) is x <= v).
2. The result is expanded to DNF by distribution, pruning each conjunct the moment it becomes
   unsatisfiable, with a bound on its size (an AND of ten two-way ORs has 1024 conjuncts).
3. A conjunct is satisfiable when, for every attribute, its interval (open or closed bounds),
   equalities and inequalities leave a value: over the reals for double attributes (double
   semantics: their constants are doubles already, rounded as the attribute's values are), over
   the 64-bit integers for long ones and over the microseconds of years 1 to 9999 for timestamps
   (exactly, with Python's integers: `n > 2^53 AND n < 2^53 + 2` leaves one value, and with
   `n != 2^53 + 1` none; `n > 2^63 - 1` none), over strings in code-point order (where
   `s > 'a' AND s < 'a\\0'` is empty), over {true, false} for booleans.

Missing attributes are taken into account: a comparison over a missing value is false, so a tuple
that lacks an attribute the policy's filter needs is withheld (PR) even if the policy's filter is
a tautology over present values.

Spatial predicates (DISTANCE, DISTANCE_TO, WITHIN_POLYGON) are sound and conservative rather than
exact. Each becomes an atom over a *derived variable* (the distance to one point, the distance to
one anchor, inside one polygon), so predicates on the same variable are decided exactly (a policy's
`DISTANCE(...) <= 50000` and a query's `DISTANCE(...) <= 20000` with the same point; the same
polygon inside and outside). A positive DISTANCE (< or <=) or WITHIN_POLYGON also implies a
lat/lon bounding box, added as *implied* atoms, so a contradiction with other latitude and
longitude ranges is found by the interval check. Across variables on the same coordinates:
two circles (triangle inequality on the sphere: inside C1 and outside C2 is empty when
d(p1, p2) + r1 < r2, two insides are disjoint when d(p1, p2) > r1 + r2, each with a 1 m margin for
rounding), and a convex polygon containing another polygon or a lat/lon box (all its vertices or
corners inside; polygons are planar in lat/lon, so this is exact up to rounding at the edge).
Everything else is assumed satisfiable: NR is never reported falsely, and PR is reported where
the analysis cannot tell, with the warning saying that it could not decide. DISTANCE_TO is
decided only against the same anchor.

The DNF is our own rather than sympy's `to_dnf`: on these small formulas sympy takes about 1 ms
per call (over the whole budget of a request), cannot prune while it expands, and does not
know the theory anyway. The tests use sympy as an independent oracle for the boolean part.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from typing import Literal, Union

from pep.core import geo
from pep.core.exact import (INT64_MAX, INT64_MIN, MAX_MICROS, MIN_MICROS, ceil_exact, floor_exact,
                            is_integral, iso_from_micros, is_number, micros_from_iso,
                            micros_from_seconds)
from pep.core import labels
from pep.core.labels import LABEL_NEGATED, Label
from pep.core.conditions import (NEGATED_OP, And, Comparison, Const, Expr, Not, Spatial,
                                 format_literal, spatial_text)
from pep.core.plan import AnyPredicate, Conjunct, Predicate, Scalar, SpatialPredicate, StreamSchema

ANALYSIS_LIMIT = 256  # conjuncts in the DNF of NOT(policy) and of the user's filter, for PR
PLAN_LIMIT = 1024  # conjuncts in the final filter handed to the runtime
WORK_LIMIT = 50_000  # conjunct pairs examined while distributing one AND (CPU bound)
CONTAINMENT_LIMIT = 20_000  # vertex x edge tests for one polygon-in-polygon check (CPU bound)
DISTANCE_MARGIN_M = 1.0  # slack for rounding when two circles are compared
SPATIAL = "\x00"  # derived variables' names start so; no attribute of a schema does
# A masked value (pep.core.masks) is a derived variable too: `MASKED attribute MASKED spec`;
# NEVER is a variable no value satisfies (a comparison on a masked value that cannot hold).
MASKED = "\x01"
NEVER = MASKED + "never"


@dataclass(frozen=True)
class MergeWarning:
    """A finding of the merge reported to the consumer (NR, PR or INFO, the API's "warnings");
    it never weakens enforcement."""

    kind: Literal["NR", "PR", "INFO"]
    operator: Literal["filter", "map", "window", "join"]
    message: str
    predicates: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"kind": self.kind, "operator": self.operator, "message": self.message,
                "predicates": list(self.predicates)}


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
    # Spatial atoms: `attribute` names a derived variable (see the module docstring), `op` and
    # `value` constrain it, `spatial` holds the geometry (its own op/value are not used).
    spatial: SpatialPredicate | None = None
    # A lat/lon bound implied by the spatial predicate `written`: used to find contradictions,
    # never shown as the user's own words and never put in the plan.
    implied: bool = False

    def text(self) -> str:
        if self.spatial is not None:
            return spatial_text(_spatial_with(self.spatial, self.op, self.value))
        if isinstance(self.value, Label):
            return labels.comparison_text(self.attribute, self.op, self.value)
        return f"{_shown_name(self.attribute)} {self.op} {format_literal(self.value)}"

    def shown(self) -> str:
        """What to call this atom in a warning."""
        return self.written if self.implied else self.text()


def _shown_name(attribute: str) -> str:
    """An attribute's name as its author wrote it (a masked value: its attribute's name)."""
    if attribute.startswith(MASKED):
        return attribute[1:].partition(MASKED)[0]
    return attribute


def _spatial_with(s: SpatialPredicate, op: str, value: Scalar) -> SpatialPredicate:
    """The geometry with an atom's op and value (a polygon's as "=" inside / "!=" outside)."""
    if s.function == "polygon":
        inside = (op == "=") == bool(value)
        return SpatialPredicate("polygon", s.latitude, s.longitude, "=" if inside else "!=",
                                0.0, s.points)
    return SpatialPredicate(s.function, s.latitude, s.longitude, op, float(value),  # type: ignore[arg-type]
                            s.points, s.key, s.key_value)


def _variable(s: Spatial) -> str:
    if s.function == "polygon":
        return f"{SPATIAL}polygon:{s.latitude}:{s.longitude}:{s.points!r}"
    if s.function == "distance_to":
        return (f"{SPATIAL}distance_to:{s.latitude}:{s.longitude}:{s.key}:"
                f"{type(s.key_value).__name__}:{s.key_value!r}")
    return f"{SPATIAL}distance:{s.latitude}:{s.longitude}:{s.points!r}"


def _spatial_atoms(expr: Spatial, origin: Literal["policy", "user"], negate: bool) -> "NNF":
    geometry = expr.to_predicate()
    if expr.function == "polygon":  # as written: WITHIN_POLYGON, never its negation
        written = spatial_text(_spatial_with(geometry, "=", True))
    else:
        written = spatial_text(expr)
    var = _variable(expr)
    if expr.function == "polygon":
        inside = (expr.op == "=") != negate
        geometry = _spatial_with(geometry, "=", True)
        atom = Atom(var, "=" if inside else "!=", True, origin, written, geometry)
        if not inside:
            return atom
        south, west, north, east = geo.polygon_bbox(geometry.points)
        bounds = [(expr.latitude, ">=", south), (expr.latitude, "<=", north),
                  (expr.longitude, ">=", west), (expr.longitude, "<=", east)]
    else:
        op = NEGATED_OP[expr.op] if negate else expr.op
        atom = Atom(var, op, float(expr.radius), origin, written, geometry)  # type: ignore[arg-type]
        if expr.function == "distance_to" or op not in ("<", "<="):
            return atom
        plat, plon = geometry.points
        south, north, west, east = geo.circle_bbox(plat, plon, geometry.value)
        bounds = [(expr.latitude, ">=", south), (expr.latitude, "<=", north)]
        if west is not None:
            bounds += [(expr.longitude, ">=", west), (expr.longitude, "<=", east)]
    implied = [Atom(a, o, v, origin, written, implied=True) for a, o, v in bounds]
    return ("and", (atom, *implied))


NNF = Union[Atom, bool, tuple]  # ("and", items) | ("or", items) | Atom | True | False


# What a comparison on a masked value implies of the raw attribute: alternatives (an OR of
# ANDs) of (attribute, op, value), or None (pep.core.masks.MaskPlan.implied).
Implied = Callable[[str, str, Scalar], "list[list[tuple[str, str, Scalar]]] | None"]


def to_nnf(expr: Expr, origin: Literal["policy", "user"], negate: bool = False,
           implied: Implied | None = None) -> NNF:
    if isinstance(expr, Spatial):
        return _spatial_atoms(expr, origin, negate)
    if isinstance(expr, Comparison):
        written = (labels.comparison_text(expr.attribute, expr.op, expr.value)
                   if isinstance(expr.value, Label)
                   else f"{_shown_name(expr.attribute)} {expr.op} {format_literal(expr.value)}")
        negated = LABEL_NEGATED if isinstance(expr.value, Label) else NEGATED_OP
        op = negated[expr.op] if negate else expr.op
        atom = Atom(expr.attribute, op, expr.value, origin, written)  # type: ignore[arg-type]
        if implied is not None and expr.attribute.startswith(MASKED):
            alternatives = implied(expr.attribute, op, expr.value)
            if alternatives is not None:
                # raw bounds the masked comparison implies: they find contradictions with the
                # policy's filter, and are never put in the plan (as a circle's box)
                return _combine("and", [atom, _combine("or", [
                    _combine("and", [Atom(a, o, v, origin, written, implied=True)
                                     for a, o, v in alternative])
                    for alternative in alternatives])])
        return atom
    if isinstance(expr, Const):
        return expr.value != negate
    if isinstance(expr, Not):
        return to_nnf(expr.item, origin, not negate, implied)
    is_and = isinstance(expr, And) != negate
    items = [to_nnf(i, origin, negate, implied) for i in expr.items]
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


# The integer domains: long attributes hold 64-bit integers, timestamps microseconds of years
# 1 to 9999 (their constants, the gateway's texts, are read as such; see `_integers`).
INTEGER_DOMAINS: dict[str, tuple[int, int]] = {"long": (INT64_MIN, INT64_MAX),
                                               "timestamp": (MIN_MICROS, MAX_MICROS)}


def _micros(value: Scalar):
    """A timestamp constant as epoch microseconds (a number, as plans stored before the texts
    held, is epoch seconds)."""
    if isinstance(value, str):
        return micros_from_iso(value)
    return micros_from_seconds(value)  # type: ignore[arg-type]


def _integers(kind: str, preds) -> list:
    """The (operator, constant) pairs of an integer-domain attribute with numeric constants."""
    if kind == "timestamp":
        return [(op, _micros(v)) for op, v in preds]
    return list(preds)


def _int_bounds(r: _Range, kind: str) -> tuple[int, int]:
    """The least and greatest integers of the domain within the range's bounds (exact)."""
    low, high = INTEGER_DOMAINS[kind]
    lo, hi = low, high
    if r.lo is not None:
        lo = max(low, ceil_exact(r.lo) if r.lo_incl else floor_exact(r.lo) + 1)  # type: ignore[arg-type]
    if r.hi is not None:
        hi = min(high, floor_exact(r.hi) if r.hi_incl else ceil_exact(r.hi) - 1)  # type: ignore[arg-type]
    return lo, hi


def _range_satisfiable(kind: str, r: _Range) -> bool:
    if kind == "null":  # a masked value that is always null (or NEVER): no comparison holds
        return False
    if kind in INTEGER_DOMAINS:
        low, high = INTEGER_DOMAINS[kind]
        if r.eq is not _UNSET:
            v = r.eq
            return (is_integral(v) and low <= v <= high  # type: ignore[arg-type, operator]
                    and _in_bounds(r, v) and v not in r.nes)  # type: ignore[arg-type]
        lo, hi = _int_bounds(r, kind)
        if lo > hi:
            return False
        excluded = {n for n in r.nes if is_number(n) and is_integral(n) and lo <= n <= hi}
        return hi - lo + 1 > len(excluded)
    if r.eq is not _UNSET:
        v = r.eq
        return _in_bounds(r, v) and v not in r.nes  # type: ignore[arg-type]
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

    def __init__(self, schema: StreamSchema, inexact: "set[str] | frozenset[str]" = frozenset()
                 ) -> None:
        self.kinds = {f.name: f.type for f in schema.fields}
        self.lattices = {f.name: f.lattice for f in schema.fields if f.lattice is not None}
        self.memo: dict[tuple, bool] = {}
        self.inexact_variables = inexact  # masked values decided only approximately

    def kind(self, attribute: str) -> str:
        if attribute.startswith(SPATIAL):
            return "boolean" if attribute.startswith(SPATIAL + "polygon:") else "double"
        return self.kinds.get(attribute, "double")

    def attr_sat(self, attribute: str, preds) -> bool:
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

    def satisfiable(self, atoms) -> bool:
        return all(self.attr_sat(attr, preds) for attr, preds in _group(atoms).items()) \
            and not self.spatial_conflict(atoms)

    def spatial_conflict(self, atoms) -> tuple[Atom, ...]:
        """Atoms of different spatial variables that cannot hold together (see the module
        docstring for what is decided); () when none is found."""
        spatial = [a for a in atoms if a.spatial is not None]
        if not spatial or (len(spatial) == 1 and spatial[0].spatial.function != "polygon"):
            return ()
        groups: dict[str, list[Atom]] = {}
        for a in spatial:
            groups.setdefault(a.attribute, []).append(a)
        circles = []  # (atom group geometry, lower bound atom, upper bound atom, lo, hi)
        inside: list[tuple[Atom, SpatialPredicate]] = []
        outside: list[tuple[Atom, SpatialPredicate]] = []
        for var, group in groups.items():
            g = group[0].spatial
            assert g is not None
            if g.function == "polygon":
                for a in group:
                    (inside if (a.op == "=") == bool(a.value) else outside).append((a, g))
            elif g.function == "distance":
                lo = hi = None
                for a in group:
                    if a.op in (">", ">=") and (lo is None or a.value > lo.value):
                        lo = a
                    if a.op in ("<", "<=") and (hi is None or a.value < hi.value):
                        hi = a
                circles.append((g, lo, hi))
        for i, (g1, lo1, hi1) in enumerate(circles):
            for j, (g2, lo2, hi2) in enumerate(circles):
                if i == j or (g1.latitude, g1.longitude) != (g2.latitude, g2.longitude):
                    continue
                d = geo.haversine(g1.points[0], g1.points[1], g2.points[0], g2.points[1])
                if hi1 is not None and lo2 is not None:
                    reach = d + float(hi1.value)
                    if reach + DISTANCE_MARGIN_M + 1e-9 * reach < float(lo2.value):
                        return (hi1, lo2)
                if i < j and hi1 is not None and hi2 is not None:
                    apart = float(hi1.value) + float(hi2.value)
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
        hit = self.memo.get(key)  # type: ignore[arg-type]
        if hit is None:
            hit = geo.convex(points)
            if len(self.memo) < 10_000:
                self.memo[key] = hit  # type: ignore[index]
        return hit

    @staticmethod
    def _box(atoms, lat: str, lon: str):
        """The lat/lon box the conjunct's bounds (implied ones included) confine a tuple to,
        with the atoms that give its four sides; None when a side is open."""
        sides = []
        used: list[Atom] = []
        for attr in (lat, lon):
            lo = hi = None
            for a in atoms:
                if a.attribute != attr or a.spatial is not None or isinstance(a.value, bool) \
                        or not isinstance(a.value, (int, float)):
                    continue
                if a.op in (">", ">=", "=") and (lo is None or a.value > lo.value):
                    lo = a
                if a.op in ("<", "<=", "=") and (hi is None or a.value < hi.value):
                    hi = a
            if lo is None or hi is None:
                return None
            sides.append((float(lo.value), float(hi.value)))
            used += [lo, hi]
        (south, north), (west, east) = sides
        return (south, west, north, east), tuple(dict.fromkeys(used))

    def inexact(self, atoms) -> tuple[str, ...]:
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

    def conflict(self, atoms) -> tuple[Atom, ...]:
        """A small set of atoms that cannot hold together (a pair when one exists)."""
        return self._attribute_conflict(atoms) or self.spatial_conflict(atoms)

    def _attribute_conflict(self, atoms) -> tuple[Atom, ...]:
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
        """Conjuncts of the DNF, contradictory ones dropped as they appear (when `prune`; the
        spatial checks across variables run on the finished conjuncts)."""
        return [atoms for atoms, _ in self._dnf(node, limit, prune)
                if not prune or not self.spatial_conflict(atoms)]

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
                preds.extend(_spatial_predicates(geometry[attr], r))  # type: ignore[arg-type]
                continue
            simplified = _range_predicates(attr, kind, r)
            if not simplified:
                # Every present value passes (e.g. `n != 1.5` on a long), but a tuple missing the
                # attribute must still fail: keep the original comparisons to say so.
                simplified = [Predicate(attr, op, v) for op, v in sorted(set(group), key=repr)]
            preds.extend(simplified)
        return tuple(sorted(preds, key=_predicate_key))


_OP_ORDER = {"=": 0, ">": 1, ">=": 2, "<": 3, "<=": 4, "!=": 5,
             "!<=": 6, "!>=": 7, "!<": 8, "!>": 9}  # the last: negated label comparisons


def _predicate_key(p: AnyPredicate) -> tuple:
    if isinstance(p, SpatialPredicate):
        return (p.latitude, 10 + _OP_ORDER[p.op], "~spatial",
                repr((p.function, p.points, p.key, repr(p.key_value), p.value)))
    if isinstance(p.value, Label):
        return (p.attribute, _OP_ORDER[p.op], "~label", str(p.value))
    return (p.attribute, _OP_ORDER[p.op], type(p.value).__name__, p.value)


def _label_predicates(attr: str, group) -> list[Predicate]:
    """A label attribute's comparisons for the plan: every DOMINATED_BY as one (their greatest
    lower bound), every DOMINATES as one (their least upper bound), the others as they are."""
    below = [v for op, v in group if op == "<="]
    above = [v for op, v in group if op == ">="]
    out = []
    if below:
        out.append(Predicate(attr, "<=", labels.glb(below)))  # type: ignore[arg-type]
    if above:
        out.append(Predicate(attr, ">=", labels.lub(above)))  # type: ignore[arg-type]
    out.extend(Predicate(attr, op, v) for op, v in  # type: ignore[arg-type]
               dict.fromkeys((op, v) for op, v in group if op not in ("<=", ">=")))
    return out


def _spatial_predicates(g: SpatialPredicate, r: _Range) -> list[SpatialPredicate]:
    """A spatial variable's range back as plan predicates (a distance's bounds stay bounds:
    no `=` on a distance, no `!=` arises; a polygon is inside or outside)."""
    if g.function == "polygon":
        inside = r.eq is True or (r.eq is _UNSET and False in r.nes)
        return [_spatial_with(g, "=" if inside else "!=", True)]
    out = []
    if r.lo is not None:
        out.append(_spatial_with(g, ">=" if r.lo_incl else ">", r.lo))
    if r.hi is not None:
        out.append(_spatial_with(g, "<=" if r.hi_incl else "<", r.hi))
    return out


def _range_predicates(attr: str, kind: str, r: _Range) -> list[Predicate]:
    if r.eq is not _UNSET:
        if kind == "timestamp":
            return [Predicate(attr, "=", iso_from_micros(int(r.eq)))]  # type: ignore[arg-type]
        return [Predicate(attr, "=", r.eq)]  # type: ignore[arg-type]
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
        out = []
        if lo > low:
            out.append(Predicate(attr, ">=", shown(lo)))
        if hi < high:
            out.append(Predicate(attr, "<=", shown(hi)))
        out.extend(Predicate(attr, "!=", shown(int(n))) for n in nes)
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
    (operator, constant) of `preds`: the per-attribute check, for other modules (joins).
    Labels (a partial order, whose lattice is not known here) are assumed satisfiable: never a
    false NR."""
    if kind == "label":
        return True
    r = _collect(_integers(kind, preds))
    return r is not None and _range_satisfiable(kind, r)


# -- the analysis ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class FilterAnalysis:
    filter_dnf: tuple[Conjunct, ...] | None  # None: every tuple passes; (): none does
    warnings: tuple[MergeWarning, ...]
    nr: bool
    pr: bool | None  # None: too large to analyse


def _show(atom: Atom) -> str:
    if atom.attribute.startswith(MASKED) and atom.attribute != NEVER:
        name, _, spec = atom.attribute[1:].partition(MASKED)
        return f"{atom.shown()} (your query, on {name} masked as {spec})"
    if atom.attribute == NEVER:
        return f"{atom.shown()} (your query, on a masked value)"
    return f"{atom.shown()} ({'policy' if atom.origin == 'policy' else 'your query'})"


def analyse_filter(policy: Expr | None, user: Expr | None, schema: StreamSchema, *,
                   analysis_limit: int = ANALYSIS_LIMIT, plan_limit: int = PLAN_LIMIT,
                   masks=None) -> FilterAnalysis:
    """Merged filter for the plan, with NR/PR warnings.

    Raises ConditionTooComplex when the merged filter exceeds `plan_limit` conjuncts even after
    pruning: the request is refused rather than enforced approximately.
    `masks` (a `pep.core.masks.MaskPlan`): the user's comparisons on masked values are derived
    variables of its analysis schema, with the raw bounds they imply.
    """
    implied = masks.implied if masks is not None else None
    u_nnf = to_nnf(user, "user", implied=implied) if user is not None else True
    checker = _Checker(schema, masks.inexact if masks is not None else frozenset())
    p_nnf = to_nnf(policy, "policy") if policy is not None else True
    both = _combine("and", [p_nnf, u_nnf])
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
    if p_nnf is True:
        pr = False
    else:
        try:
            pr_warning = _pr_warning(checker, policy, u_nnf, analysis_limit)  # type: ignore[arg-type]
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


def _nr_warning(checker: _Checker, p_nnf: NNF, u_nnf: NNF, limit: int) -> MergeWarning:
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
    details = "; ".join(" contradicts ".join(_show(a) for a in c) if len(c) == 2
                        else f"{', '.join(_show(a) for a in c[:-1])} and {_show(c[-1])} cannot "
                             "hold together" if len(c) > 2
                        else f"{_show(c[0])} holds for no value" for c in conflicts[:8])
    predicates: dict[str, None] = {}
    for c in conflicts:
        for a in c:
            predicates.setdefault(a.shown(), None)
    message = f"{lead} ({details})" if details else lead
    return MergeWarning("NR", "filter", message, tuple(predicates))


def _pr_warning(checker: _Checker, policy: Expr, u_nnf: NNF, limit: int) -> MergeWarning | None:
    negated = to_nnf(policy, "policy", negate=True)
    users = checker.dnf(u_nnf, limit)
    classical = checker.dnf(negated, limit)
    if len(users) * len(classical) > WORK_LIMIT:
        raise TooLarge
    for u in users:  # a witness with every attribute present, the clearest to report
        for n in classical:
            if checker.satisfiable(u + n):
                return _describe_pr(u, n, (), undecided=checker.inexact(u + n))
    by_presence: dict[frozenset, list[tuple[Atom, ...]]] = {}
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


def _present(conjunct: tuple[Atom, ...]) -> frozenset[str]:
    """What every tuple passing the conjunct has (a predicate over a missing value is false)."""
    out: set[str] = set()
    for a in conjunct:
        out.add(a.attribute)
        if a.spatial is not None:
            out.update((a.spatial.latitude, a.spatial.longitude))
    return frozenset(out)


def _name(needed: str, atom: Atom) -> str:
    if needed.startswith(SPATIAL):
        return f"the anchor's position of {atom.written}"
    return needed


def _restrict(node: NNF, present: frozenset) -> NNF:
    if isinstance(node, Atom):
        return node if _needs(node) <= present else True
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


def _undecided_kind(texts) -> str:
    spatial = any(t.startswith(("DISTANCE", "WITHIN_POLYGON", "NOT WITHIN_POLYGON"))
                  for t in texts)
    masked = not all(t.startswith(("DISTANCE", "WITHIN_POLYGON", "NOT WITHIN_POLYGON"))
                     for t in texts)
    if spatial and masked:
        return "spatial predicates and comparisons of masked values"
    return "comparisons of masked values" if masked else "spatial predicates"


def _describe_pr(user: tuple[Atom, ...], witness: tuple[Atom, ...], missing,
                 also_violated=(), undecided: tuple[str, ...] = ()) -> MergeWarning:
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
