"""The NR/PR analysis's vocabulary: its limits, its findings (`MergeWarning`) and errors, atoms
(a comparison, or a spatial predicate over a derived variable, with its origin: policy or
user) and conditions in negation normal form (`to_nnf`, NOT pushed down to the atoms)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, TypedDict, cast

from pep.core import geo, labels
from pep.core.conditions import (
    NEGATED_OP,
    And,
    Comparison,
    Const,
    Expr,
    Not,
    Or,
    Placeholder,
    Spatial,
    format_literal,
    spatial_text,
)
from pep.core.labels import LABEL_NEGATED, Label
from pep.core.plan import Operator, Scalar, SpatialPredicate

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

Origin = Literal["policy", "user"]  # whose condition an atom comes from

Constant = Any
"""An atom's constant as the analysis compares it: a number, a text, a boolean or a `Label`,
and all the constants of one attribute (or derived variable) of one kind, so that they compare
with each other. Typed as the union of those kinds, every comparison between two of them would
be refused; the kind follows the attribute, which the types cannot say."""


@dataclass(frozen=True)
class MergeWarning:
    """A finding of the merge reported to the consumer (NR, PR or INFO, the API's "warnings");
    it never weakens enforcement."""

    kind: Literal["NR", "PR", "INFO"]
    operator: Literal["filter", "map", "window", "join", "union"]
    message: str
    predicates: tuple[str, ...] = ()

    def to_json(self) -> MergeWarningJson:
        return {"kind": self.kind, "operator": self.operator, "message": self.message,
                "predicates": list(self.predicates)}


class MergeWarningJson(TypedDict):
    """A finding as the API's "warnings" list it."""

    kind: Literal["NR", "PR", "INFO"]
    operator: Literal["filter", "map", "window", "join", "union"]
    message: str
    predicates: list[str]


class TooLarge(Exception):
    """The DNF would exceed its bound."""


class ConditionTooComplex(ValueError):
    """The merged filter cannot be expressed within the plan's bound."""


@dataclass(frozen=True)
class Atom:
    """One comparison of the NNF, with where it came from."""

    attribute: str
    op: str
    value: Scalar | Label  # a label attribute's constant: the Label
    origin: Origin
    # The predicate of its author's condition this atom comes from, as written, NOTs included
    # (`written_text`): the atom itself, or the outermost NOT(...) around it. A warning names
    # it so, never with a NOT dropped (the NNF pushes NOTs into the atoms: `NOT speed > 7` is
    # the atom `speed <= 7`, and `NOT WITHIN_POLYGON(...)` an "outside" atom).
    written: str
    # Spatial atoms: `attribute` names a derived variable (see the module docstring), `op` and
    # `value` constrain it, `spatial` holds the geometry (its own op/value are not used).
    spatial: SpatialPredicate | None = None
    # A lat/lon bound implied by the spatial predicate `written`: used to find contradictions,
    # never shown as the user's own words and never put in the plan.
    implied: bool = False
    # The atom's own predicate as written, without the NOTs around it (`written` is with them)
    term: str = ""

    def text(self) -> str:
        if isinstance(self.value, Label):  # (a spatial atom's constant is a number)
            return labels.comparison_text(self.attribute, self.op, self.value)
        if self.spatial is not None:
            return spatial_text(spatial_with(self.spatial, self.op, self.value))
        return f"{_shown_name(self.attribute)} {self.op} {format_literal(self.value)}"

    def shown(self) -> str:
        """What to call this atom in a warning: the predicate as its author wrote it."""
        return self.written


def _shown_name(attribute: str) -> str:
    """An attribute's name as its author wrote it (a masked value: its attribute's name)."""
    if attribute.startswith(MASKED):
        return attribute[1:].partition(MASKED)[0]
    return attribute


def spatial_with(s: SpatialPredicate, op: str, value: Constant) -> SpatialPredicate:
    """The geometry with an atom's op and value (a polygon's as "=" inside / "!=" outside)."""
    if s.function == "polygon":
        inside = (op == "=") == bool(value)
        return SpatialPredicate("polygon", s.latitude, s.longitude, "=" if inside else "!=",
                                0.0, s.points)
    return SpatialPredicate(s.function, s.latitude, s.longitude,
                            cast(Operator, op),  # a distance's op, or its negation: the plan's
                            float(value), s.points, s.key, s.key_value)


def _variable(s: Spatial) -> str:
    if s.function == "polygon":
        return f"{SPATIAL}polygon:{s.latitude}:{s.longitude}:{s.points!r}"
    if s.function == "distance_to":
        return (f"{SPATIAL}distance_to:{s.latitude}:{s.longitude}:{s.key}:"
                f"{type(s.key_value).__name__}:{s.key_value!r}")
    return f"{SPATIAL}distance:{s.latitude}:{s.longitude}:{s.points!r}"


def _spatial_atoms(expr: Spatial, origin: Origin, negate: bool,
                   around: str | None = None) -> NNF:
    geometry = expr.to_predicate()
    term = written_text(expr)
    written = around if around is not None else term
    var = _variable(expr)
    if expr.function == "polygon":
        inside = (expr.op == "=") != negate
        geometry = spatial_with(geometry, "=", True)
        atom = Atom(var, "=" if inside else "!=", True, origin, written, geometry, term=term)
        if not inside:
            return atom
        south, west, north, east = geo.polygon_bbox(geometry.points)
        bounds = [(expr.latitude, ">=", south), (expr.latitude, "<=", north),
                  (expr.longitude, ">=", west), (expr.longitude, "<=", east)]
    else:
        op = NEGATED_OP[expr.op] if negate else expr.op
        atom = Atom(var, op, geometry.value, origin, written, geometry, term=term)
        if expr.function == "distance_to" or op not in ("<", "<="):
            return atom
        plat, plon = geometry.points
        c_south, c_north, c_west, c_east = geo.circle_bbox(plat, plon, geometry.value)
        bounds = [(expr.latitude, ">=", c_south), (expr.latitude, "<=", c_north)]
        if c_west is not None and c_east is not None:  # both or neither
            bounds += [(expr.longitude, ">=", c_west), (expr.longitude, "<=", c_east)]
    implied = [Atom(a, o, v, origin, written, implied=True, term=term) for a, o, v in bounds]
    return ("and", (atom, *implied))


def _comparison_text(expr: Comparison) -> str:
    if isinstance(expr.value, Label):
        return labels.comparison_text(expr.attribute, expr.op, expr.value)
    return f"{_shown_name(expr.attribute)} {expr.op} {format_literal(expr.value)}"


def written_text(expr: Expr) -> str:
    """A bound condition as warnings print it: its author's predicates, NOTs where they were,
    parentheses only where they are needed. It parses (and binds) back to the same condition
    (tests/pep/core/test_condition_text.py: every operator of the language)."""
    if isinstance(expr, Comparison):
        return _comparison_text(expr)
    if isinstance(expr, Spatial):
        return spatial_text(expr)
    if isinstance(expr, Const):
        return "TRUE" if expr.value else "FALSE"
    if isinstance(expr, Not):
        inner = written_text(expr.item)
        return f"NOT ({inner})" if isinstance(expr.item, (And, Or)) else f"NOT {inner}"
    if not isinstance(expr, (And, Or)):  # set membership and boxes are bound away before
        raise TypeError(f"written_text takes a bound condition, not {type(expr).__name__}")
    joiner = " AND " if isinstance(expr, And) else " OR "
    return joiner.join(f"({written_text(i)})" if isinstance(i, (And, Or)) else written_text(i)
                       for i in expr.items)


Junction = Literal["and", "or"]
NNF = Atom | bool | tuple[Junction, tuple["NNF", ...]]
"""A condition in negation normal form: an atom, a constant, or ("and" | "or", items)."""

RawBound = tuple[str, str, Constant]
"""(raw attribute, op, constant): what a comparison on a masked value implies of the raw value."""
# What a comparison on a masked value implies of the raw attribute: alternatives (an OR of
# ANDs) of raw bounds, or None (pep.core.masks.MaskPlan.implied).
Implied = Callable[[str, str, Constant], "list[list[RawBound]] | None"]


def to_nnf(expr: Expr, origin: Origin, negate: bool = False,
           implied: Implied | None = None, around: str | None = None) -> NNF:
    """The condition in negation normal form (negated with `negate`). `around`: the written
    text of the outermost NOT(...) the condition sits in (set when one is met), which its
    atoms carry as `written`."""
    if isinstance(expr, Spatial):
        return _spatial_atoms(expr, origin, negate, around)
    if isinstance(expr, Comparison):
        term = _comparison_text(expr)
        written = around if around is not None else term
        negated = LABEL_NEGATED if isinstance(expr.value, Label) else NEGATED_OP
        op = negated[expr.op] if negate else expr.op
        value = expr.value
        if isinstance(value, (Decimal, Placeholder)):  # bound away (binding types the literals)
            raise TypeError(f"to_nnf takes a bound condition, not {expr}")
        atom = Atom(expr.attribute, op, value, origin, written, term=term)
        if implied is not None and expr.attribute.startswith(MASKED):
            alternatives = implied(expr.attribute, op, value)
            if alternatives is not None:
                # raw bounds the masked comparison implies: they find contradictions with the
                # policy's filter, and are never put in the plan (as a circle's box)
                return combine("and", [atom, combine("or", [
                    combine("and", [Atom(a, o, v, origin, written, implied=True, term=term)
                                     for a, o, v in alternative])
                    for alternative in alternatives])])
        return atom
    if isinstance(expr, Const):
        return expr.value != negate
    if isinstance(expr, Not):
        return to_nnf(expr.item, origin, not negate, implied,
                      around if around is not None else written_text(expr))
    if not isinstance(expr, (And, Or)):  # set membership and boxes are bound away before
        raise TypeError(f"to_nnf takes a bound condition, not {type(expr).__name__}")
    is_and = isinstance(expr, And) != negate
    items = [to_nnf(i, origin, negate, implied, around) for i in expr.items]
    return combine("and" if is_and else "or", items)


def combine(kind: Junction, items: list[NNF]) -> NNF:
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
