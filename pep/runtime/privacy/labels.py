"""Security labels in Spark (`pep.core.labels`): a label attribute's code, dominance as data.

A label travels through Spark as its canonical text (`S:{crypto,nuclear}`, what rows deliver);
comparisons read its 64-bit code, derived per row from the text and the stream's lattice with
column expressions (the lattice's names are literal arrays built once per schema): the level's
index in bits 56-62, the categories' bitmask below. A text that is no label of the lattice has
no code (null), and a comparison over it is false, as over a missing value.

The outcome of comparing a value with a constant (both codes) is BELOW 1, EQUAL 2, ABOVE 4 or
INCOMPARABLE 8, tested against the op's mask exactly like the comparisons of the other kinds.
"""
from __future__ import annotations

from pyspark.sql import Column, functions as F

from pep.core.labels import CATEGORY_MASK, LEVEL_SHIFT, Lattice


def label_code(column: Column, lattice: Lattice) -> Column:
    """The code of a label's text; null when it is none of the lattice's labels."""
    levels = F.array(*[F.lit(name) for name in lattice.levels])
    categories = F.array(*[F.lit(name) for name in lattice.categories]) \
        if lattice.categories else F.array().cast("array<string>")
    level = F.array_position(levels, F.regexp_extract(column, r"^([^:{}]+)", 1))
    inner = F.regexp_extract(column, r"^[^:{}]+:\{(.*)\}$", 1)
    names = F.filter(F.split(inner, ","), lambda c: c != F.lit(""))
    positions = F.transform(names, lambda c: F.array_position(categories, c))
    # category i's bit, looked up (an element_at of literal longs: exact, and no shift by a
    # column, which Spark's shiftleft does not take)
    powers = F.array(*[F.lit(1 << i).cast("long") for i in range(len(lattice.categories))]) \
        if lattice.categories else F.array().cast("array<long>")
    bits = F.aggregate(positions, F.lit(0).cast("long"),
                       lambda acc, p: acc.bitwiseOR(F.coalesce(
                           F.element_at(powers, F.greatest(p, F.lit(1)).cast("int")),
                           F.lit(0).cast("long"))))
    valid = column.isNotNull() & (level > 0) & F.forall(positions, lambda p: p > 0)
    return F.when(valid, F.shiftleft((level - 1).cast("long"), LEVEL_SHIFT).bitwiseOR(bits))


def label_text(code: Column, lattice: Lattice) -> Column:
    """A code's canonical text (`S:{crypto,nuclear}`, or `S` without categories): exactly what
    `str(Label)` prints, which is what the shared runtime delivers for a window's `lub_<attr>`
    (pep/runtime/windows/pane_windows.py), so that a join side prints the same; null for a null
    code."""
    levels = F.array(*[F.lit(name) for name in lattice.levels])
    level = F.element_at(levels, (F.shiftright(code, LEVEL_SHIFT) + F.lit(1)).cast("int"))
    if not lattice.categories:
        return F.when(code.isNotNull(), level)
    named = F.array(*[F.struct(F.lit(1 << i).cast("long").alias("bit"), F.lit(c).alias("name"))
                      for i, c in enumerate(lattice.categories)])
    names = F.transform(F.filter(named, lambda c: code.bitwiseAND(c["bit"]) != 0),
                        lambda c: c["name"])
    return F.when(code.isNull(), F.lit(None).cast("string")) \
        .when(F.size(names) == 0, level) \
        .otherwise(F.concat(level, F.lit(":{"), F.concat_ws(",", names), F.lit("}")))


def lub_code(top: Column, ored: Column) -> Column:
    """The least upper bound of a group's codes from their max (whose level is the highest)
    and their bitwise OR (whose categories are the union); null when both are."""
    mask = F.lit(CATEGORY_MASK).cast("long")
    return F.shiftleft(F.shiftright(top, LEVEL_SHIFT), LEVEL_SHIFT) \
        .bitwiseOR(ored.bitwiseAND(mask))


def lub_of(first: Column, second: Column) -> Column:
    """The least upper bound of two codes; one null: the other (a row without a label adds
    nothing above it); both null: null."""
    zero = F.lit(0).cast("long")
    return F.when(first.isNull() & second.isNull(), F.lit(None).cast("long")).otherwise(
        lub_code(F.greatest(first, second), F.coalesce(first, zero).bitwiseOR(
            F.coalesce(second, zero))))


def dominated_by(code: Column, bound: int) -> Column:
    """Whether a code is dominated by the constant `bound` (level at most its level, categories
    among its categories); null for a null code."""
    mask = F.lit(CATEGORY_MASK).cast("long")
    return (F.shiftright(code, LEVEL_SHIFT) <= F.lit(int(bound) >> LEVEL_SHIFT)) & \
        (code.bitwiseAND(mask).bitwiseAND(F.lit(~int(bound)).cast("long")) == 0)


def label_outcome(value: Column, constant: Column) -> Column:
    """BELOW, EQUAL, ABOVE or INCOMPARABLE (1, 2, 4, 8) of two codes; null for a null value."""
    mask = F.lit(CATEGORY_MASK).cast("long")
    vl, cl = F.shiftright(value, LEVEL_SHIFT), F.shiftright(constant, LEVEL_SHIFT)
    vc, cc = value.bitwiseAND(mask), constant.bitwiseAND(mask)
    below = (vl <= cl) & (vc.bitwiseAND(F.bitwise_not(cc)) == 0)
    above = (vl >= cl) & (cc.bitwiseAND(F.bitwise_not(vc)) == 0)
    return (F.when(value.isNull(), F.lit(None)).when(below & above, F.lit(2))
            .when(below, F.lit(1)).when(above, F.lit(4)).otherwise(F.lit(8)))


def label_holds(value: Column, mask: int, constant: int) -> Column:
    """A compiled label comparison as one Column (joins' sides, the few-plans matcher)."""
    outcome = label_outcome(value, F.lit(int(constant)).cast("long"))
    return F.coalesce(outcome.bitwiseAND(F.lit(int(mask))) != 0, F.lit(False))


__all__ = ["label_code", "label_text", "lub_code", "lub_of", "dominated_by", "label_outcome",
           "label_holds"]
