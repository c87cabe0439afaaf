"""The masks' vocabulary: each kind and its parameters (`parse_mask`, `Mask`), which mask fits
which attribute type (`check_fits`), an obligation's `attribute:mask` assignments, and a masked
attribute in the SQL-like text and the JSON of a plan."""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from functools import lru_cache

from pep.core.errors import NotPermitted
from pep.core.exact import INT64_MAX, INT64_MIN, is_integral
from pep.core.plan import FieldType, StreamSchema

KINDS = ("hash", "round", "grid", "truncate", "bands", "prefix", "suffix", "null")
STEP_KINDS = ("round", "grid")  # a number rounded down to a multiple of the step
# masks whose values leave no order of the raw values (a keyed hash, text cut short) or none at
# all (null): such a time attribute places no tuple in time (what orders, windows and bounds
# joins by time reads the masked time: `pep.core.merge`)
UNORDERED = frozenset({"hash", "prefix", "suffix", "null"})
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
            return f"{self.kind}:{decimal_text(self.step_value)}"
        if self.kind == "truncate":
            return f"truncate:{self.unit}"
        if self.kind == "bands":
            return "bands:" + ",".join(decimal_text(e) for e in self.edges)
        if self.kind in ("prefix", "suffix"):
            return f"{self.kind}:{self.length}"
        return self.kind

    def output_type(self, field_type: FieldType) -> FieldType:
        """The type of the masked value: a hash is text, every other mask keeps the type."""
        return "string" if self.kind == "hash" else field_type

    @property
    def step_value(self) -> Decimal:
        """A step mask's step (`parse_mask` gives every round and grid mask one)."""
        assert self.step is not None, f"a {self.kind} mask without a step"
        return self.step

    @property
    def unit_micros(self) -> int:
        """A truncate mask's unit in microseconds (`parse_mask` gives every one a unit)."""
        assert self.unit is not None, f"a {self.kind} mask without a unit"
        return UNIT_MICROS[self.unit]

    @property
    def length_value(self) -> int:
        """A prefix or suffix mask's length (`parse_mask` gives every one a length)."""
        assert self.length is not None, f"a {self.kind} mask without a length"
        return self.length

    @property
    def fraction(self) -> Fraction:
        """A step mask's step as an exact fraction num/den (what the runtime computes with)."""
        return Fraction(self.step_value)


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
        if any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
            raise MaskError(f"bands: the edges {param!r} must be strictly increasing")
        floats = [float(e) for e in edges]
        if any(b <= a for a, b in zip(floats, floats[1:], strict=False)):
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
    if field_type == "long" and mask.kind == "round" and not is_integral(mask.step_value):
        raise MaskError(f"mask {mask.spec!r} on long attribute {attribute!r}: the step must be "
                        "a whole number")
    if field_type == "long" and mask.kind == "round" and mask.step_value > 2 ** 62:
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


def mask_sql(column: str, mask: Mask, field_type: str) -> str:
    """A masked attribute in the SQL-like text (never executed; a hash names the owner's key,
    never shows it)."""
    if mask.kind == "hash":
        text = column if field_type == "string" else f"CAST({column} AS STRING)"
        return f"lower(hex(hmac(<owner's key>, CAST({text} AS BINARY))))"
    if mask.kind in STEP_KINDS:
        step = decimal_text(mask.step_value)
        return f"floor({column} / {step}) * {step}"
    if mask.kind == "truncate":
        return f"date_trunc('{str(mask.unit).upper()}', {column})"
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
