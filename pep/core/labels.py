"""Security labels on a lattice (multilevel security, Adaikkalavan, Xie and Ray's MLS DSMS).

A stream attribute of type `label` carries each tuple's security label: a level from a totally
ordered list and a set of categories (compartments), written `S:{crypto,nuclear}` (or `S` with
no category). Its stream defines the lattice with the attribute:

    {"name": "level", "type": "label", "levels": ["U", "C", "S", "TS"],
     "categories": ["nuclear", "crypto", "army"]}

Label A is dominated by label B (A <= B) when A's level is at most B's and A's categories are a
subset of B's; two labels may be incomparable (S:{nuclear} and S:{crypto}). The least upper bound
of labels is the highest level and the union of the categories; the greatest lower bound the
lowest level and the intersection. Texts are canonical: categories in the lattice's order.

In Spark a label is its canonical text (what rows deliver) and, for comparisons, a 64-bit code:
the level's index in bits 56-62 and the categories as a bitmask in bits 0-55 (category i is bit
i), so that dominance is `(code >> 56) <= (c >> 56) AND (code & ~c & CATEGORY_MASK) = 0`, data
in the plan table like every constant (`pep.runtime.plans.compile`).

Comparisons on a label attribute (`pep.core.conditions`): `DOMINATED_BY` (also `<=`), `DOMINATES`
(`>=`), the strict `<` and `>`, `=` and `!=`; their negations (NOT pushed into an atom by the
analysis) are the ops `!<=`, `!>=`, `!<`, `!>`. Each op accepts a set of outcomes of comparing a
value with the constant: strictly below (1), equal (2), strictly above (4), incomparable (8).
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypedDict

MAX_LEVELS = 127
MAX_CATEGORIES = 56
LEVEL_SHIFT = 56
CATEGORY_MASK = (1 << MAX_CATEGORIES) - 1
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
_TEXT = re.compile(r"\s*([A-Za-z][A-Za-z0-9_-]*)\s*(?::\s*\{\s*([^{}]*?)\s*\}\s*)?")

BELOW, EQUAL, ABOVE, INCOMPARABLE = 1, 2, 4, 8
# op -> the outcomes it accepts
LABEL_MASKS = {"<=": BELOW | EQUAL, ">=": ABOVE | EQUAL, "<": BELOW, ">": ABOVE, "=": EQUAL,
               "!=": BELOW | ABOVE | INCOMPARABLE, "!<=": ABOVE | INCOMPARABLE,
               "!>=": BELOW | INCOMPARABLE, "!<": EQUAL | ABOVE | INCOMPARABLE,
               "!>": BELOW | EQUAL | INCOMPARABLE}
LABEL_NEGATED = {"<=": "!<=", ">=": "!>=", "<": "!<", ">": "!>", "=": "!=", "!=": "=",
                 "!<=": "<=", "!>=": ">=", "!<": "<", "!>": ">"}
LABEL_FLIPPED = {"<=": ">=", ">=": "<=", "<": ">", ">": "<", "=": "=", "!=": "!=",
                 "!<=": "!>=", "!>=": "!<=", "!<": "!>", "!>": "!<"}
OP_WORDS = {"<=": "DOMINATED_BY", ">=": "DOMINATES"}


class LabelError(ValueError):
    """A label text or a lattice that is not valid; the message says why."""


class LatticeJson(TypedDict):
    """A lattice as a stream's schema writes it beside its label attribute."""

    levels: list[str]
    categories: list[str]


@dataclass(frozen=True)
class Lattice:
    """The levels (lowest first) and the categories of a label attribute."""

    levels: tuple[str, ...]
    categories: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.levels:
            raise LabelError("a label lattice needs at least one level")
        if len(self.levels) > MAX_LEVELS:
            raise LabelError(f"a label lattice has at most {MAX_LEVELS} levels")
        if len(self.categories) > MAX_CATEGORIES:
            raise LabelError(f"a label lattice has at most {MAX_CATEGORIES} categories")
        for what, names in (("level", self.levels), ("category", self.categories)):
            for name in names:
                if not isinstance(name, str) or not NAME.fullmatch(name):
                    raise LabelError(f"{what} name {name!r} must be a letter followed by up to "
                                     "63 letters, digits, '_' or '-'")
            if len(set(names)) != len(names):
                raise LabelError(f"{what} names must be distinct")

    def to_json(self) -> LatticeJson:
        return {"levels": list(self.levels), "categories": list(self.categories)}

    @classmethod
    def from_json(cls, doc: object) -> Lattice:
        if not isinstance(doc, dict):
            raise LabelError("a label lattice is {levels: [...], categories: [...]}")
        levels, categories = doc.get("levels"), doc.get("categories", [])
        if not isinstance(levels, list) or not isinstance(categories, list):
            raise LabelError("a label lattice's levels and categories are lists of names")
        return cls(tuple(levels), tuple(categories))

    # -- labels --------------------------------------------------------------------------------

    def parse(self, value: object) -> Label:
        """A label from its text (`S:{crypto,nuclear}`, `S`, `S:{}`) or a JSON object
        {"level": "S", "categories": [...]}; LabelError names what is wrong."""
        if isinstance(value, dict):
            level, categories = value.get("level"), value.get("categories", [])
            if not isinstance(level, str) or not isinstance(categories, list) \
                    or not all(isinstance(c, str) for c in categories) \
                    or set(value) - {"level", "categories"}:
                raise LabelError("a label object is {\"level\": name, \"categories\": [names]}")
            names = [c.strip() for c in categories]
        elif isinstance(value, str):
            m = _TEXT.fullmatch(value)
            if m is None:
                raise LabelError(f"label {value[:60]!r} is not LEVEL or LEVEL:{{category,...}}")
            level = m.group(1)
            inner = m.group(2)
            names = [c.strip() for c in inner.split(",")] if inner else []
            if any(not n for n in names):
                raise LabelError(f"label {value[:60]!r} has an empty category")
        else:
            raise LabelError("a label is text (LEVEL or LEVEL:{category,...}) or an object")
        if level not in self.levels:
            raise LabelError(f"unknown level {level[:64]!r}; the levels are "
                             f"{', '.join(self.levels)}")
        bits = 0
        for name in names:
            if name not in self.categories:
                shown = ", ".join(self.categories) or "none"
                raise LabelError(f"unknown category {name[:64]!r}; the categories are {shown}")
            bits |= 1 << self.categories.index(name)
        return Label(self, self.levels.index(level), bits)

    def label(self, code: int) -> Label:
        level = code >> LEVEL_SHIFT
        if not 0 <= level < len(self.levels) or (code & CATEGORY_MASK) >> len(self.categories):
            raise LabelError(f"code {code} is no label of this lattice")
        return Label(self, level, code & CATEGORY_MASK)

    @property
    def top(self) -> Label:
        return Label(self, len(self.levels) - 1, (1 << len(self.categories)) - 1)

    @property
    def bottom(self) -> Label:
        return Label(self, 0, 0)


class Label:
    """A label of a lattice: `level` an index into its levels, `categories` a bitmask.

    Not a dataclass on purpose: a plan holding one (a predicate's constant) is turned into JSON
    by `dataclasses.asdict`, which must leave it whole (its text is what a plan stores)."""

    __slots__ = ("lattice", "level", "categories")

    def __init__(self, lattice: Lattice, level: int, categories: int) -> None:
        self.lattice = lattice
        self.level = level
        self.categories = categories

    @property
    def code(self) -> int:
        return (self.level << LEVEL_SHIFT) | self.categories

    def __str__(self) -> str:
        names = [c for i, c in enumerate(self.lattice.categories) if self.categories >> i & 1]
        head = self.lattice.levels[self.level]
        return f"{head}:{{{','.join(names)}}}" if names else head

    def __repr__(self) -> str:
        return f"Label({str(self)!r})"

    def _other(self, other: object) -> Label | None:
        if isinstance(other, Label):
            return other
        if isinstance(other, str):
            try:
                return self.lattice.parse(other)
            except LabelError:
                return None
        return None

    def dominated_by(self, other: Label) -> bool:
        return self.level <= other.level and not self.categories & ~other.categories

    def outcome(self, other: Label) -> int:
        """How this label compares with `other`: BELOW, EQUAL, ABOVE or INCOMPARABLE."""
        le, ge = self.dominated_by(other), other.dominated_by(self)
        if le and ge:
            return EQUAL
        return BELOW if le else ABOVE if ge else INCOMPARABLE

    def __eq__(self, other: object) -> bool:
        o = self._other(other)
        return o is not None and (self.level, self.categories) == (o.level, o.categories)

    def __hash__(self) -> int:
        return hash((self.level, self.categories))

    def __le__(self, other: object) -> bool:
        o = self._other(other)
        return o is not None and self.dominated_by(o)

    def __ge__(self, other: object) -> bool:
        o = self._other(other)
        return o is not None and o.dominated_by(self)

    def __lt__(self, other: object) -> bool:
        o = self._other(other)
        return o is not None and self.dominated_by(o) and not o.dominated_by(self)

    def __gt__(self, other: object) -> bool:
        o = self._other(other)
        return o is not None and o.dominated_by(self) and not self.dominated_by(o)


_WORDS = {"<=": "DOMINATED_BY", ">=": "DOMINATES", "<": "STRICTLY DOMINATED_BY",
          ">": "STRICTLY DOMINATES", "=": "=", "!=": "!="}


def comparison_text(attribute: str, op: str, label: object) -> str:
    """A label comparison in words (`level DOMINATED_BY 'S:{crypto}'`, negations with NOT)."""
    negated = op.startswith("!") and op != "!="
    word = _WORDS[op[1:] if negated else op]
    text = f"{attribute} {word} '{label}'"
    return f"NOT {text}" if negated else text


def lub(labels: Iterable[Label]) -> Label | None:
    """The least upper bound (None of nothing)."""
    items = list(labels)
    if not items:
        return None
    return Label(items[0].lattice, max(x.level for x in items),
                 _or(x.categories for x in items))


def glb(labels: Iterable[Label]) -> Label | None:
    items = list(labels)
    if not items:
        return None
    cats = items[0].categories
    for x in items[1:]:
        cats &= x.categories
    return Label(items[0].lattice, min(x.level for x in items), cats)


def _or(values: Iterable[int]) -> int:
    out = 0
    for v in values:
        out |= v
    return out


def holds(value: Label, op: str, constant: Label) -> bool:
    """`value op constant` for a label comparison op (LABEL_MASKS)."""
    return bool(LABEL_MASKS[op] & value.outcome(constant))


MAX_FREE_BITS = 12  # beyond, satisfiability is assumed (sound for NR; PR says it cannot decide)


def satisfiable(lattice: Lattice, preds: Sequence[tuple[str, Label]]) -> bool:
    """Whether some label of the lattice meets every (op, constant): exact, by the bounds the
    dominance constraints give and a search over the levels and categories the other
    constraints mention; assumed True (never a false NR) when too many categories are free."""
    lo, hi = lattice.bottom, lattice.top
    rest: list[tuple[str, Label]] = []
    for op, c in preds:
        if op in ("<=", "="):
            hi = Label(lattice, min(hi.level, c.level), hi.categories & c.categories)
        if op in (">=", "="):
            lo = Label(lattice, max(lo.level, c.level), lo.categories | c.categories)
        if op not in ("<=", ">="):
            rest.append((op, c))
    if not lo.dominated_by(hi):
        return False
    free = hi.categories & ~lo.categories
    mentioned = _or(c.categories for _, c in rest)
    relevant = [i for i in range(len(lattice.categories)) if (free & mentioned) >> i & 1]
    if len(relevant) > MAX_FREE_BITS:
        return True
    others = free & ~mentioned
    spare = [others & -others] if others else []  # one unmentioned free bit stands for all
    levels = {lo.level, hi.level}
    for _, c in rest:
        levels.update(x for x in (c.level - 1, c.level, c.level + 1) if lo.level <= x <= hi.level)
    for level in sorted(levels):
        for chosen in itertools.chain.from_iterable(
                itertools.combinations(relevant, k) for k in range(len(relevant) + 1)):
            base = lo.categories | _or(1 << i for i in chosen)
            for extra in [0] + spare:
                v = Label(lattice, level, base | extra)
                if all(holds(v, op, c) for op, c in rest):
                    return True
    return False


__all__ = ["Lattice", "LatticeJson", "Label", "LabelError", "lub", "glb", "holds", "satisfiable",
           "LABEL_MASKS", "LABEL_NEGATED", "LABEL_FLIPPED", "LEVEL_SHIFT", "CATEGORY_MASK"]
