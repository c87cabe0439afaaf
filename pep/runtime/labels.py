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

from pyspark.sql import Column
from pyspark.sql import functions as F

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


__all__ = ["label_code", "label_outcome", "label_holds"]
