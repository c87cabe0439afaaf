"""The condition language's syntax tree and its text: the AST (comparisons, AND/OR/NOT,
constants, set membership, boxes, spatial predicates), placeholders, the operators' tables, the
language's limits, `ConditionError`, and the AST written back as text (`to_text`, which parses back
to an equivalent tree). Everything the other steps (lexing, parsing, binding, evaluation) share."""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from pdp import (
    ACCESS_SUBJECT as SUBJECT_CATEGORY,
    ACTION as ACTION_CATEGORY,
    ENVIRONMENT as ENVIRONMENT_CATEGORY,
    RESOURCE as RESOURCE_CATEGORY,
)
from pep.core.labels import Label
from pep.core.plan import Scalar, SpatialPredicate

MAX_CONDITION_LENGTH = 10_000
MAX_NESTING_DEPTH = 64
MAX_SET_SIZE = 1_000  # values in one IN set, literal or from a bag
# Integer literals longer than this cannot be finite doubles (1.8e308 has 309 digits)
MAX_INTEGER_DIGITS = 309

PLACEHOLDER_CATEGORIES = {
    "subject": SUBJECT_CATEGORY,
    "resource": RESOURCE_CATEGORY,
    "action": ACTION_CATEGORY,
    "environment": ENVIRONMENT_CATEGORY,
}

NEGATED_OP = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "=": "!=", "!=": "="}
FLIPPED_OP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "!=": "!=",
              "dominated_by": "dominates", "dominates": "dominated_by"}
# Label comparisons (`pep.core.labels`): DOMINATED_BY / DOMINATES, bound to "<=" / ">=" on a
# label attribute (and refused on any other).
LABEL_WORDS = {"dominated_by": "<=", "dominates": ">="}
PLACEHOLDER_RE = re.compile(r"\{\s*([A-Za-z]+)\s*:\s*([^\s{}]+)\s*\}")
NUMERIC_TYPES = frozenset({"double", "long", "timestamp"})


class ConditionError(ValueError):
    """A condition is malformed or does not fit the schema; `position` is a 1-based column."""

    def __init__(self, message: str, position: int | None = None, text: str | None = None) -> None:
        self.reason = message
        self.position = position
        where = ""
        if position is not None:
            where = f" at column {position}"
            if text and "\n" in text[: max(position - 1, 0)]:
                before = text[: position - 1]
                line = before.count("\n") + 1
                col = position - 1 - before.rfind("\n")
                where = f" at line {line}, column {col}"
        super().__init__(message + where)
        self.message = str(self)


# -- AST ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Placeholder:
    """`{category:attribute}`: a request attribute, substituted as a literal before use."""

    category: str  # the short category word as written: subject | resource | action | environment
    attribute: str
    position: int = 0

    def __str__(self) -> str:
        return f"{{{self.category}:{self.attribute}}}"


Literal_ = Scalar | Decimal
"""A literal as parsed: integers are ints and decimals `Decimal`s, exact as written (binding
turns them into the attribute's representation: floats for doubles, see `pep.core.exact` for
longs and timestamps)."""
Value = Literal_ | Placeholder


@dataclass(frozen=True)
class Comparison:
    attribute: str
    op: str  # one of pep.core.plan.OPERATORS
    value: Value | Label  # bound to a label attribute: the `Label` its text names
    position: int = 0  # column of the attribute, for error messages

    def __str__(self) -> str:
        return f"{self.attribute} {self.op} {format_literal(self.value)}"


@dataclass(frozen=True)
class And:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Or:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Not:
    item: Expr


@dataclass(frozen=True)
class Const:
    value: bool


@dataclass(frozen=True)
class Membership:
    """`attribute [NOT] IN <set>` before binding: the set is literals or one bag placeholder."""

    attribute: str
    values: tuple[Value, ...] | Placeholder
    negated: bool = False
    position: int = 0


@dataclass(frozen=True)
class Box:
    """`WITHIN_BOX(lat, lon, south, west, north, east)` before binding."""

    latitude: str
    longitude: str
    bounds: tuple[Value, Value, Value, Value]
    position: int = 0


@dataclass(frozen=True)
class Spatial:
    """A spatial predicate (see the module docstring); placeholders before binding, typed
    literals after.

    function "distance": `points` is (plat, plon); "distance_to": `points` is () and `key`,
    `key_value` name the anchor; for both, the distance in metres is compared with `radius` by
    `op`. function "polygon": `points` is the flat vertex list (or one bag placeholder before
    binding), `op` is "=" (inside) and `radius` 0; NOT WITHIN_POLYGON is a Not around it."""

    function: str
    latitude: str
    longitude: str
    op: str
    radius: Value
    points: tuple[Value, ...] | Placeholder
    key: str | None = None
    key_value: Value | Label | None = None
    position: int = 0

    def __str__(self) -> str:
        return spatial_text(self)

    def to_predicate(self) -> SpatialPredicate:
        """The plan's form of a bound spatial predicate: binding has made its function and op
        the plan's, its radius and points numbers, its key value a typed constant (one AST
        serves both forms, which the types cannot tell apart: hence the ignores)."""
        return SpatialPredicate(
            self.function,  # type: ignore[arg-type]  # bound: one of the plan's
            self.latitude, self.longitude,
            self.op,  # type: ignore[arg-type]  # bound: one of the plan's
            float(self.radius),  # type: ignore[arg-type]  # bound: a number
            tuple(float(p) for p in self.points),  # type: ignore[union-attr, arg-type]  # numbers
            self.key,
            self.key_value)  # type: ignore[arg-type]  # bound: a typed constant


def spatial_from_predicate(p: SpatialPredicate) -> Spatial:
    return Spatial(p.function, p.latitude, p.longitude, p.op, p.value, tuple(p.points), p.key,
                   p.key_value)


def spatial_text(s: Spatial | SpatialPredicate) -> str:
    """The condition language's text of a spatial predicate (parses back to it)."""
    if isinstance(s, SpatialPredicate):
        s = spatial_from_predicate(s)
    if s.function == "polygon":
        pts = (str(s.points) if isinstance(s.points, Placeholder)
               else "[" + ", ".join(format_literal(p) for p in s.points) + "]")
        negated = "NOT " if s.op == "!=" else ""
        return f"{negated}WITHIN_POLYGON({s.latitude}, {s.longitude}, {pts})"
    if s.function == "distance_to":
        head = f"DISTANCE_TO({s.latitude}, {s.longitude}, {s.key}, {format_literal(s.key_value)})"
    else:
        plat, plon = s.points  # type: ignore[misc]  # a distance's point: (lat, lon), the parser's
        head = (f"DISTANCE({s.latitude}, {s.longitude}, {format_literal(plat)}, "
                f"{format_literal(plon)})")
    return f"{head} {s.op} {format_literal(s.radius)}"


Expr = Comparison | And | Or | Not | Const | Membership | Box | Spatial
TRUE = Const(True)
FALSE = Const(False)


def format_literal(value: object) -> str:
    """A literal as the condition language writes it (strings quoted and escaped)."""
    if isinstance(value, Placeholder):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Label):
        return "'" + str(value) + "'"
    return repr(value)


def to_text(expr: Expr) -> str:
    """Readable condition text that parses back to an equivalent AST."""
    if isinstance(expr, (Comparison, Spatial)):
        return str(expr)
    if isinstance(expr, Const):
        return "true" if expr.value else "false"
    if isinstance(expr, Not):
        return f"NOT ({to_text(expr.item)})"
    if not isinstance(expr, (And, Or)):  # set membership and boxes are bound away before
        raise TypeError(f"to_text takes a bound condition, not {type(expr).__name__}")
    joiner = " AND " if isinstance(expr, And) else " OR "
    return joiner.join(
        f"({to_text(i)})" if isinstance(i, (And, Or)) else to_text(i) for i in expr.items)


def conjoin(items: Sequence[Expr]) -> Expr:
    flat: list[Expr] = []
    for item in items:
        if isinstance(item, And):
            flat.extend(item.items)
        elif item == TRUE:
            continue
        else:
            flat.append(item)
    if not flat:
        return TRUE
    return flat[0] if len(flat) == 1 else And(tuple(flat))


def attributes_of(expr: Expr) -> list[str]:
    """Attribute names in order of first appearance."""
    seen: dict[str, None] = {}
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Comparison):
            seen.setdefault(e.attribute, None)
        elif isinstance(e, Spatial):
            for name in (e.latitude, e.longitude, e.key):
                if name is not None:
                    seen.setdefault(name, None)
        elif isinstance(e, (And, Or)):
            stack.extend(reversed(e.items))
        elif isinstance(e, Not):
            stack.append(e.item)
    return list(seen)


def spatial_parts(expr: Expr) -> list[Spatial]:
    """The spatial predicates of a (bound) condition, in order."""
    out: list[Spatial] = []
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Spatial):
            out.append(e)
        elif isinstance(e, (And, Or)):
            stack.extend(reversed(e.items))
        elif isinstance(e, Not):
            stack.append(e.item)
    return out


def has_placeholders(expr: Expr) -> bool:
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Comparison) and isinstance(e.value, Placeholder):
            return True
        if isinstance(e, Spatial) and any(isinstance(v, Placeholder) for v in (
                e.radius, e.key_value, e.points,
                *(e.points if isinstance(e.points, tuple) else ()))):
            return True
        if isinstance(e, (And, Or)):
            stack.extend(e.items)
        elif isinstance(e, Not):
            stack.append(e.item)
    return False


def placeholders_in(text: str) -> list[tuple[str, str]]:
    """Every `{category:attribute}` in a text, as (category in lower case, attribute), found as
    the lexer finds them but anywhere (inside a quoted string too): for checks that must not
    miss one, such as which gateway attributes a policy's obligations could read."""
    return [(m.group(1).lower(), m.group(2)) for m in PLACEHOLDER_RE.finditer(text)]
