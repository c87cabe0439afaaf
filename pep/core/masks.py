"""Masks: an attribute shown in a coarser or keyed-hash form instead of raw or hidden.

An owner's `exacml:obligation:stream-mask` (also `pCloud:obligation:stream-mask`) lists masks,
one per `stream-mask-attribute-id` value, written `attribute:mask`:

    speed:round:5           a number rounded down to a multiple of 5
    lat,lon:grid:0.1        a position: both coordinates rounded down to the 0.1 degree grid
    ts:truncate:minute      a timestamp truncated to the minute (second, minute, hour, day; UTC)
    speed:bands:0,10,20     a number replaced by the lower edge of its band ([0, 10) -> 0,
                            [10, 20) -> 10, [20, inf) -> 20; below the first edge: null)
    shipname:prefix:3       the first 3 characters of a string (suffix:3: the last 3)
    mmsi:hash               a keyed hash (HMAC-SHA-256, hex) with the stream owner's secret
    shipname:null           the attribute is kept, its value is always null

Every rounding is downwards (floor), so a coarser mask is a function of a finer one: `round:10`
is coarser than `round:5` (10 is a multiple of 5), `grid:1` than `round:0.1`, `bands:0,10,20`
than `round:5` (every edge a multiple of 5) and than `bands:0,5,10,15,20` (a subset of the
edges), `truncate:hour` than `truncate:minute`, `prefix:2` than `prefix:3`, `null` than
anything. Masks that are not so ordered (`round:4` and `round:6`, `hash` and `prefix:3`,
`prefix` and `suffix`) cannot be composed: a request to which both apply is denied.

Which mask fits which type (anything else: deny): double: round, grid (a pair), bands, null;
long: round (integer step), bands (integer edges), hash, null; string: hash, prefix, suffix,
null; timestamp: truncate, null; boolean: null. A hash of a long hashes its decimal text.

This module is pure: the vocabulary, its order, the view a consumer gets (`view_schema`), the
merge of the policy's masks with the consumer's own (`plan_masks`, called from
`pep.core.merge`), what the NR/PR analysis may infer about a raw value from a comparison on its
masked value, and the SQL-like text. The runtime computes masks as Spark column expressions
(`pep.runtime.masks`).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from functools import lru_cache
from typing import Any

from pep.core.analysis import MASKED, NEVER, MergeWarning
from pep.core.conditions import And, Comparison, Expr, Not, Or, spatial_parts
from pep.core.errors import NotPermitted
from pep.core.exact import (INT64_MAX, INT64_MIN, MAX_MICROS, MIN_MICROS, ceil_exact, floor_exact,
                            iso_from_micros, is_integral, is_number, micros_from_iso)
from pep.core.plan import Field, Predicate, StreamSchema

KINDS = ("hash", "round", "grid", "truncate", "bands", "prefix", "suffix", "null")
STEP_KINDS = ("round", "grid")  # a number rounded down to a multiple of the step
UNIT_MICROS = {"second": 1_000_000, "minute": 60_000_000, "hour": 3_600_000_000,
               "day": 86_400_000_000}
KINDS_FOR_TYPE: dict[str, frozenset[str]] = {
    "double": frozenset({"round", "grid", "bands", "null"}),
    "long": frozenset({"round", "bands", "hash", "null"}),
    "string": frozenset({"hash", "prefix", "suffix", "null"}),
    "timestamp": frozenset({"truncate", "null"}),
    "boolean": frozenset({"null"}),
}
MAX_BANDS = 64
MAX_LENGTH = 1000  # prefix and suffix lengths
MAX_DIGITS = 18  # digits of a step or an edge (before and after the point, each)
_NUMBER = re.compile(r"-?[0-9]{1,18}(?:\.[0-9]{1,18})?")


class MaskError(ValueError):
    """A mask that cannot be read, does not fit its attribute, or cannot be composed."""


class MaskRefused(NotPermitted):
    """The consumer asks for a finer mask than the policy's, or for what the mask removes."""

    def __init__(self, message: str, attribute: str | None = None) -> None:
        super().__init__(message, attribute=attribute)
        self.attribute = attribute


# -- the vocabulary -------------------------------------------------------------------------------

def decimal_text(value: Decimal) -> str:
    """A decimal as the canonical spec writes it: no exponent, no trailing zeros."""
    if value == 0:
        return "0"
    return format(value.normalize(), "f")


def _decimal(text: str, what: str) -> Decimal:
    text = text.strip()
    if not _NUMBER.fullmatch(text):
        raise MaskError(f"{what} {text!r} is not a decimal number (digits, an optional point "
                        f"and fraction, at most {MAX_DIGITS} digits each side)")
    try:
        return Decimal(text)
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        raise MaskError(f"{what} {text!r} is not a number") from None


@dataclass(frozen=True)
class Mask:
    """One attribute's mask. `step`: round and grid; `unit`: truncate; `edges`: bands,
    ascending; `length`: prefix and suffix."""

    kind: str
    step: Decimal | None = None
    unit: str | None = None
    edges: tuple[Decimal, ...] = ()
    length: int | None = None

    @property
    def spec(self) -> str:
        """The canonical text (`round:10`, `grid:0.1`, `bands:0,10,20`, `hash`)."""
        if self.kind in STEP_KINDS:
            return f"{self.kind}:{decimal_text(self.step)}"  # type: ignore[arg-type]
        if self.kind == "truncate":
            return f"truncate:{self.unit}"
        if self.kind == "bands":
            return "bands:" + ",".join(decimal_text(e) for e in self.edges)
        if self.kind in ("prefix", "suffix"):
            return f"{self.kind}:{self.length}"
        return self.kind

    def output_type(self, field_type: str) -> str:
        """The type of the masked value: a hash is text, every other mask keeps the type."""
        return "string" if self.kind == "hash" else field_type

    @property
    def fraction(self) -> Fraction:
        """A step mask's step as an exact fraction num/den (what the runtime computes with)."""
        assert self.step is not None
        return Fraction(self.step)


@lru_cache(maxsize=4096)
def parse_mask(text: str) -> Mask:
    """`round:10`, `grid:0.1`, `truncate:minute`, `bands:0,10,20`, `prefix:3`, `suffix:3`,
    `hash`, `null` (kind case-insensitive); MaskError says what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise MaskError("a mask is empty; known masks: " + ", ".join(KINDS))
    kind, sep, param = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise MaskError(f"unknown mask {kind!r}; known masks: {', '.join(KINDS)}")
    param = param.strip()
    if kind in ("hash", "null"):
        if sep:
            raise MaskError(f"mask {kind!r} takes no parameter (found {param!r})")
        return Mask(kind)
    if not param:
        raise MaskError(f"mask {kind!r} needs a parameter: {_usage(kind)}")
    if kind in STEP_KINDS:
        step = _decimal(param, f"the {kind} step")
        if step <= 0:
            raise MaskError(f"the {kind} step must be above 0, not {param}")
        if kind == "grid" and step > 180:
            raise MaskError(f"a grid of {param} degrees is over 180 degrees")
        return Mask(kind, step=step.normalize())
    if kind == "truncate":
        unit = param.lower()
        if unit not in UNIT_MICROS:
            raise MaskError(f"truncate to {param!r}: the unit is one of "
                            f"{', '.join(UNIT_MICROS)}")
        return Mask(kind, unit=unit)
    if kind == "bands":
        parts = param.split(",")
        if len(parts) > MAX_BANDS:
            raise MaskError(f"bands: {len(parts)} edges, over the limit of {MAX_BANDS}")
        edges = tuple(_decimal(p, "a band edge").normalize() for p in parts)
        if any(b <= a for a, b in zip(edges, edges[1:])):
            raise MaskError(f"bands: the edges {param!r} must be strictly increasing")
        floats = [float(e) for e in edges]
        if any(b <= a for a, b in zip(floats, floats[1:])):
            raise MaskError(f"bands: the edges {param!r} are too close to be told apart as "
                            "doubles")
        return Mask(kind, edges=edges)
    # prefix, suffix
    if not param.isascii() or not param.isdigit() or len(param) > 4:
        raise MaskError(f"{kind}: the length {param!r} must be a whole number of characters")
    length = int(param)
    if not 1 <= length <= MAX_LENGTH:
        raise MaskError(f"{kind}: the length must be 1 to {MAX_LENGTH}, not {length}")
    return Mask(kind, length=length)


def _usage(kind: str) -> str:
    return {"round": "round:<step> (round:10)", "grid": "lat,lon:grid:<degrees> (grid:0.1)",
            "truncate": "truncate:<second|minute|hour|day>",
            "bands": "bands:<edge>,<edge>,... (bands:0,10,20)",
            "prefix": "prefix:<characters>", "suffix": "suffix:<characters>"}[kind]


def check_fits(mask: Mask, attribute: str, field_type: str) -> None:
    """Refuse a mask on an attribute of a type it does not apply to (MaskError)."""
    allowed = KINDS_FOR_TYPE.get(field_type, frozenset({"null"}))
    if mask.kind not in allowed:
        raise MaskError(f"mask {mask.spec!r} does not apply to {field_type} attribute "
                        f"{attribute!r} (a {field_type} may be masked with: "
                        f"{', '.join(sorted(allowed))})")
    if field_type == "long" and mask.kind == "round" and not is_integral(mask.step):
        raise MaskError(f"mask {mask.spec!r} on long attribute {attribute!r}: the step must be "
                        "a whole number")
    if field_type == "long" and mask.kind == "round" and mask.step > 2 ** 62:  # type: ignore
        raise MaskError(f"mask {mask.spec!r} on long attribute {attribute!r}: the step is over "
                        "2^62")
    if field_type == "long" and mask.kind == "bands" and not all(
            is_integral(e) and INT64_MIN <= e <= INT64_MAX for e in mask.edges):
        raise MaskError(f"mask {mask.spec!r} on long attribute {attribute!r}: the edges must be "
                        "64-bit integers")


def parse_assignment(text: str, schema: StreamSchema) -> list[tuple[str, Mask]]:
    """`attribute:mask` (or `lat,lon:grid:<degrees>`) to (canonical attribute, mask) pairs,
    checked against the schema; MaskError says what is wrong."""
    if not isinstance(text, str) or ":" not in text:
        raise MaskError(f"mask {text!r} must be written attribute:mask (speed:round:10, "
                        "lat,lon:grid:0.1, mmsi:hash)")
    names_text, _, spec = text.strip().partition(":")
    mask = parse_mask(spec)
    names = [n.strip() for n in names_text.split(",")]
    fields = []
    for name in names:
        f = schema.lookup(name)
        if f is None:
            raise MaskError(f"mask {text.strip()!r} names unknown attribute {name!r}")
        fields.append(f)
    if len({f.name for f in fields}) != len(fields):
        raise MaskError(f"mask {text.strip()!r} names an attribute twice")
    if mask.kind == "grid":
        if len(fields) != 2:
            raise MaskError(f"mask {text.strip()!r}: a grid masks a position, two attributes "
                            "(lat,lon:grid:0.1)")
    elif len(fields) != 1:
        raise MaskError(f"mask {text.strip()!r}: {mask.kind} masks one attribute (only a grid "
                        "masks a pair)")
    for f in fields:
        check_fits(mask, f.name, f.type)
    return [(f.name, mask) for f in fields]


# -- the order ------------------------------------------------------------------------------------

def at_least_as_coarse(a: Mask | None, b: Mask | None) -> bool:
    """Whether `a` (None: the raw value) reveals nothing that `b` hides: a's value is a
    function of b's, for every raw value."""
    if a is None:
        return b is None
    if b is None or a.kind == "null":
        return True
    if b.kind == "null":
        return False
    if a == b:
        return True
    if a.kind in STEP_KINDS and b.kind in STEP_KINDS:
        return a.step % b.step == 0  # type: ignore[operator]
    if a.kind == "truncate" and b.kind == "truncate":
        return UNIT_MICROS[a.unit] % UNIT_MICROS[b.unit] == 0  # type: ignore[index]
    if a.kind == "bands" and b.kind in STEP_KINDS:
        return all(e % b.step == 0 for e in a.edges)  # type: ignore[operator]
    if a.kind == "bands" and b.kind == "bands":
        return set(a.edges) <= set(b.edges)
    if a.kind == b.kind and a.kind in ("prefix", "suffix"):
        return a.length <= b.length  # type: ignore[operator]
    return False


def compose(a: Mask, b: Mask, attribute: str) -> Mask:
    """The coarser of two masks on one attribute; MaskError when neither is coarser."""
    if at_least_as_coarse(a, b):
        return a
    if at_least_as_coarse(b, a):
        return b
    raise MaskError(f"the masks {a.spec!r} and {b.spec!r} on attribute {attribute!r} cannot be "
                    "composed: neither is coarser than the other (a step must be a multiple of "
                    "the other, bands a subset of the other's edges or multiples of the step, a "
                    "hash or a prefix is only coarser than itself)")


def compose_all(pairs: Iterable[tuple[str, Mask]], into: dict[str, Mask] | None = None
                ) -> dict[str, Mask]:
    """Every (attribute, mask) composed per attribute; MaskError when two cannot be."""
    out = dict(into or {})
    for name, mask in pairs:
        out[name] = compose(out[name], mask, name) if name in out else mask
    return out


def ordered(masks: Mapping[str, Mask], schema: StreamSchema) -> tuple[tuple[str, str], ...]:
    """(attribute, spec) pairs in schema order: how graphs and plans hold masks."""
    return tuple((n, masks[n].spec) for n in schema.names if n in masks)


def masks_of(pairs: Iterable[tuple[str, str]]) -> dict[str, Mask]:
    return {name: parse_mask(spec) for name, spec in pairs}


def view_schema(schema: StreamSchema, masks: Mapping[str, Mask]) -> StreamSchema:
    """The schema a consumer sees: a hashed attribute is text."""
    if not any(m.kind == "hash" for m in masks.values()):
        return schema
    return StreamSchema(tuple(Field(f.name, masks[f.name].output_type(f.type))  # type: ignore
                              if f.name in masks else f for f in schema.fields))


# -- the merge ------------------------------------------------------------------------------------

def variable(attribute: str, mask: Mask) -> str:
    """The analysis' name of an attribute's masked value (a derived variable)."""
    return f"{MASKED}{attribute}{MASKED}{mask.spec}"


def split_variable(name: str) -> tuple[str, Mask] | None:
    if not name.startswith(MASKED) or name == NEVER:
        return None
    attribute, _, spec = name[1:].partition(MASKED)
    return attribute, parse_mask(spec)


@dataclass
class MaskPlan:
    """The masks a merged request applies (the policy's, or coarser ones the consumer asked
    for) and how the merge uses them: the consumer's filter reads masked values."""

    schema: StreamSchema
    masks: dict[str, Mask]
    inexact: set[str] = field(default_factory=set)

    @property
    def analysis_schema(self) -> StreamSchema:
        """The schema plus one attribute per masked value (its masked type; `null` for a
        null mask, which no comparison satisfies) and the never-satisfied NEVER."""
        extra = [Field(variable(n, m), "null" if m.kind == "null"  # type: ignore[arg-type]
                       else m.output_type(self._type(n))) for n, m in self.masks.items()]
        return StreamSchema(self.schema.fields + tuple(extra)
                            + (Field(NEVER, "null"),))  # type: ignore[arg-type]

    def _type(self, name: str) -> str:
        return self.schema.lookup(name).type  # type: ignore[union-attr]

    def user_condition(self, expr: Expr) -> Expr:
        """The consumer's condition on masked values: each comparison on a masked attribute
        becomes one on its masked value (a derived variable)."""
        if isinstance(expr, Comparison):
            mask = self.masks.get(expr.attribute)
            if mask is None:
                return expr
            return Comparison(variable(expr.attribute, mask), expr.op, expr.value,
                              expr.position)
        if isinstance(expr, (And, Or)):
            return type(expr)(tuple(self.user_condition(i) for i in expr.items))
        if isinstance(expr, Not):
            return Not(self.user_condition(expr.item))
        return expr

    def implied(self, name: str, op: str, value: Any) -> list[list[tuple[str, str, Any]]] | None:
        """What a comparison on a masked value says of the raw value, as alternatives (an OR
        of ANDs) of comparisons on the raw attribute; exact for masks on integers and
        timestamps and for bands, a superset for rounded doubles, nothing for text masks
        (then the variable is noted as inexact). [[NEVER]]: the comparison never holds."""
        split = split_variable(name)
        if split is None:
            return None
        attribute, mask = split
        if mask.kind == "null":
            return None  # its variable is of kind null: no comparison holds
        ftype = self._type(attribute)
        if mask.kind == "bands":
            return _bands_implied(attribute, mask, ftype, op, value)
        if mask.kind in STEP_KINDS and ftype == "long":
            return _integer_step_implied(attribute, int(mask.step), op, value,  # type: ignore
                                         INT64_MIN, INT64_MAX, int)
        if mask.kind == "truncate":
            return _integer_step_implied(attribute, UNIT_MICROS[mask.unit], op,  # type: ignore
                                         micros_from_iso(value), MIN_MICROS, MAX_MICROS,
                                         iso_from_micros)
        self.inexact.add(name)
        present = _present(attribute, ftype)
        if mask.kind in STEP_KINDS:
            # doubles: the runtime never rounds up (m <= x, exactly), and x < m + step up to
            # rounding: the upper bounds are loose
            step = float(mask.step)  # type: ignore[arg-type]
            v = float(value)
            if op in (">", ">="):
                return [[(attribute, op, v)]]
            if op in ("<", "<="):
                return [[(attribute, "<", v + 2 * step)]]
            if op == "=":
                if not _on_grid(v, mask):
                    return _NEVER
                return [[(attribute, ">=", v), (attribute, "<", v + 2 * step)]]
        return [[present]]


def _on_grid(value: float, mask: Mask) -> bool:
    """Whether a double is a value the runtime gives for some multiple k of the step: k * num
    / den in doubles (num / den the step's exact fraction; the product exact below 2^53)."""
    num, den = mask.fraction.numerator, mask.fraction.denominator
    if value != value or value in (float("inf"), float("-inf")):
        return False
    guess = round(value * den / num)
    # beyond 2^53 the product rounds: not decided, so taken as on the grid (never a false NR)
    return any(abs(k * num) >= 2 ** 53 or (k * num) / den == value
               for k in (guess - 1, guess, guess + 1))


def _present(attribute: str, ftype: str) -> tuple[str, str, Any]:
    """A comparison every present value of the type meets (a masked value is present only
    when the raw value is)."""
    return {"double": (attribute, ">", float("-inf")), "long": (attribute, ">=", INT64_MIN),
            "string": (attribute, ">=", ""),
            "timestamp": (attribute, ">=", iso_from_micros(MIN_MICROS)),
            }.get(ftype, (attribute, "!=", None))  # type: ignore[return-value]


_NEVER: list[list[tuple[str, str, Any]]] = [[(NEVER, "=", 0)]]


def _integer_step_implied(attribute: str, step: int, op: str, value: Any, low: int, high: int,
                          shown) -> list[list[tuple[str, str, Any]]]:
    """m = x - (x mod step) compared with an integer constant, as bounds on x (exact)."""
    if not is_number(value) or not is_integral(value):
        c = value
        # a constant between two values of the masked domain: exact integer form
        if op in (">", ">="):
            c_int, op = floor_exact(c), ">"
        elif op in ("<", "<="):
            c_int, op = ceil_exact(c), "<"
        elif op == "=":
            return _NEVER
        else:
            return [[(attribute, ">=", shown(low))]]
    else:
        c_int = int(value)

    def floor_to(n: int) -> int:
        return n - n % step

    def ceil_to(n: int) -> int:
        return -((-n) // step) * step

    def bound(o: str, n: int) -> tuple[str, str, Any]:
        return (attribute, o, shown(max(low, min(high, n))))

    if op == ">=":
        start = ceil_to(c_int)
        return _NEVER if start > high else [[bound(">=", start)]]
    if op == ">":
        start = ceil_to(c_int + 1)
        return _NEVER if start > high else [[bound(">=", start)]]
    if op == "<=":
        end = floor_to(c_int) + step - 1
        return _NEVER if end < low else [[bound("<=", end)]]
    if op == "<":
        end = floor_to(c_int - 1) + step - 1
        return _NEVER if end < low else [[bound("<=", end)]]
    if op == "=":
        if c_int % step:
            return _NEVER
        return [[bound(">=", c_int), bound("<=", c_int + step - 1)]]
    # !=
    if c_int % step:
        return [[bound(">=", low)]]
    out = []
    if c_int - 1 >= low:
        out.append([bound("<=", c_int - 1)])
    if c_int + step <= high:
        out.append([bound(">=", c_int + step)])
    return out or _NEVER


def _bands_implied(attribute: str, mask: Mask, ftype: str, op: str, value: Any
                   ) -> list[list[tuple[str, str, Any]]]:
    """The band's lower edge compared with a constant, as bounds on x (exact: x is compared
    with the edges, no arithmetic)."""
    edges = [int(e) for e in mask.edges] if ftype == "long" else [float(e) for e in mask.edges]
    c = value

    def edge(e) -> Any:
        return e

    first = [(attribute, ">=", edge(edges[0]))]

    def below(e) -> list[tuple[str, str, Any]]:
        return [(attribute, "<", edge(e))]

    if op in (">=", ">"):
        above = [e for e in edges if (e >= c if op == ">=" else e > c)]
        return _NEVER if not above else [[(attribute, ">=", edge(above[0]))]]
    if op in ("<=", "<"):
        held = [e for e in edges if (e <= c if op == "<=" else e < c)]
        if not held:
            return _NEVER
        rest = [e for e in edges if e > held[-1]]
        return [first + (below(rest[0]) if rest else [])]
    if op == "=":
        if c not in edges:
            return _NEVER
        i = edges.index(c)
        return [[(attribute, ">=", edge(c))] + (below(edges[i + 1]) if i + 1 < len(edges)
                                                 else [])]
    # != : present (at or above the first edge), and outside c's band
    if c not in edges:
        return [first]
    i = edges.index(c)
    out = []
    if i > 0:
        out.append(first + below(c))
    if i + 1 < len(edges):
        out.append([(attribute, ">=", edge(edges[i + 1]))])
    return out or _NEVER


def policy_masks(policy) -> dict[str, Mask]:
    """The masks of a policy graph (`pep.core.graph.Mask`), attribute -> mask."""
    node = policy.mask
    return masks_of(node.masks) if node is not None else {}


def plan_masks(policy, user, schema: StreamSchema) -> MaskPlan | None:
    """The masks a request gets: the policy's, each replaced by the consumer's own where that
    is at least as coarse; a finer (or incomparable) one is refused naming the attribute, and
    so is a spatial predicate of the consumer's over masked coordinates. None: no mask."""
    masks = policy_masks(policy)
    asked = user.mask if user is not None else None
    if asked is not None:
        shown = set(policy.map.attributes) if policy.map is not None else set(schema.names)
        for name, mask in masks_of(asked.masks).items():
            if name not in shown:
                raise MaskRefused(f"your query masks attribute {name!r}, which the policy does "
                                  "not expose", name)
            have = masks.get(name)
            if not at_least_as_coarse(mask, have):
                policy_spec = have.spec if have is not None else "none"
                raise MaskRefused(
                    f"your query asks for attribute {name!r} as {mask.spec!r}, which is not "
                    f"coarser than the policy's mask {policy_spec!r}; ask for the policy's mask "
                    "or a coarser one (a multiple of its step, a subset of its band edges, a "
                    "larger unit, a shorter prefix or suffix, null)", name)
            masks[name] = mask
    if not masks:
        return None
    uf = user.filter if user is not None else None
    if uf is not None:
        for s in spatial_parts(uf.condition):
            hit = [a for a in (s.latitude, s.longitude) if a in masks]
            if hit:
                raise MaskRefused(
                    f"your query's {s} reads {', '.join(hit)}, which the policy shows only "
                    f"masked ({', '.join(masks[a].spec for a in hit)}); a spatial predicate "
                    "over masked coordinates is not supported (it would read the raw position)",
                    hit[0])
    return MaskPlan(schema, {n: masks[n] for n in schema.names if n in masks})


def plan_dnf(dnf, plan: MaskPlan):
    """The merged filter with masked variables back as predicates on masked values."""
    if not dnf:
        return dnf
    out = []
    for conj in dnf:
        preds = []
        for p in conj:
            split = split_variable(getattr(p, "attribute", "") or "")
            if split is not None:
                preds.append(Predicate(split[0], p.op, p.value, split[1].spec))
            else:
                preds.append(p)
        out.append(tuple(preds))
    return tuple(out)


def filter_notes(dnf, plan: MaskPlan) -> list[MergeWarning]:
    """An INFO warning when the consumer's filter on masked values could not be analysed
    exactly (the analysis then never reports NR falsely, but may miss one)."""
    undecided = sorted({split_variable(p.attribute)[0]  # type: ignore[index]
                        for conj in dnf or () for p in conj
                        if getattr(p, "attribute", "").startswith(MASKED)
                        and p.attribute in plan.inexact})
    if not undecided:
        return []
    shown = ", ".join(f"{a} ({plan.masks[a].spec})" for a in undecided)
    return [MergeWarning("INFO", "filter",
                         f"your filter compares masked values of {shown}; the analysis cannot "
                         "decide exactly which masked values the policy's filter lets through, so it "
                         "may not warn of a result that stays empty (it never reports one falsely)",
                         tuple(undecided))]


def window_masks(plan: MaskPlan, kind: str, size: int, step: int, aggregates,
                 time_attribute: str | None, functions_for_type: Mapping[str, Iterable[str]]
                 ) -> tuple:
    """The aggregates a window may compute over masked values (those whose function fits the
    masked type), with INFO warnings for the ones withheld; refuses a time window over a time
    attribute whose mask it cannot honour."""
    warnings: list[MergeWarning] = []
    if kind == "time" and time_attribute in plan.masks:
        mask = plan.masks[time_attribute]
        unit = None
        if mask.kind == "truncate":
            unit = Fraction(UNIT_MICROS[mask.unit], 1_000_000)  # type: ignore[index]
        elif mask.kind in STEP_KINDS:
            unit = Fraction(mask.step)  # type: ignore[arg-type]
        if unit is None:
            raise MaskRefused(
                f"the policy shows the time attribute {time_attribute!r} only as "
                f"{mask.spec!r}: a time window over it would reveal its time", time_attribute)
        if Fraction(size) % unit or Fraction(step) % unit:
            raise MaskRefused(
                f"the policy shows the time attribute {time_attribute!r} only as {mask.spec!r}: "
                f"a time window over it needs a size and a step that are whole multiples of "
                f"{_seconds(unit)} s (asked: size {size}, step {step})", time_attribute)
    kept = []
    for agg in aggregates:
        mask = plan.masks.get(agg.attribute)
        if mask is not None:
            ftype = mask.output_type(plan._type(agg.attribute))
            if agg.function not in functions_for_type.get(ftype, ()):
                warnings.append(MergeWarning(
                    "INFO", "window", f"{agg.function}({agg.attribute}) is withheld: the policy "
                    f"shows {agg.attribute!r} as {mask.spec!r}, a {ftype} value",
                    (f"{agg.function}({agg.attribute})",)))
                continue
        kept.append(agg)
    return tuple(kept), warnings


def _seconds(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(float(value))


def output_masks(plan: MaskPlan, names: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """The masks of the attributes a plan outputs (projected, aggregated, grouped by), in
    schema order."""
    wanted = set(names)
    return tuple((n, m.spec) for n, m in plan.masks.items() if n in wanted)


# -- renderings -----------------------------------------------------------------------------------

def mask_sql(column: str, mask: Mask, field_type: str) -> str:
    """A masked attribute in the SQL-like text (never executed; a hash names the owner's key,
    never shows it)."""
    if mask.kind == "hash":
        text = column if field_type == "string" else f"CAST({column} AS STRING)"
        return f"lower(hex(hmac(<owner's key>, CAST({text} AS BINARY))))"
    if mask.kind in STEP_KINDS:
        step = decimal_text(mask.step)  # type: ignore[arg-type]
        return f"floor({column} / {step}) * {step}"
    if mask.kind == "truncate":
        return f"date_trunc('{mask.unit.upper()}', {column})"  # type: ignore[union-attr]
    if mask.kind == "bands":
        cases = " ".join(f"WHEN {column} >= {decimal_text(e)} THEN {decimal_text(e)}"
                         for e in reversed(mask.edges))
        return f"CASE {cases} END"
    if mask.kind == "prefix":
        return f"left({column}, {mask.length})"
    if mask.kind == "suffix":
        return f"right({column}, {mask.length})"
    return f"CAST(NULL AS {field_type.upper()})"


def masks_json(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {name: spec for name, spec in pairs}


def describe(pairs: Iterable[tuple[str, str]]) -> str:
    """`speed as round:10, lat and lon as grid:0.1`: masks in a sentence."""
    by_spec: dict[str, list[str]] = {}
    for name, spec in pairs:
        by_spec.setdefault(spec, []).append(name)
    return ", ".join(f"{' and '.join(names)} as {spec}" for spec, names in by_spec.items())


__all__ = ["Mask", "MaskError", "MaskRefused", "MaskPlan", "KINDS", "UNIT_MICROS",
           "parse_mask", "parse_assignment", "check_fits", "at_least_as_coarse", "compose",
           "compose_all", "ordered", "masks_of", "view_schema", "variable", "split_variable",
           "plan_masks", "plan_dnf", "filter_notes", "window_masks", "output_masks",
           "mask_sql", "masks_json", "describe", "decimal_text"]
