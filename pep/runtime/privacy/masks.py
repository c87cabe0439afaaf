"""Masks as Spark column expressions (`pep.core.masks` says what each mask means).

A mask travels as data: a struct of its code and parameters (`MASK_TYPE`), one per attribute,
in the plan table of the shared per-stream query (its `mk` field, indexed like the schema) and
as typed literals in a join's own query. The expressions here read that struct, so the same
expression serves every plan, whatever its steps, edges, lengths or key: attaching a handle with
other masks changes no physical plan. Nothing runs per row in Python; no UDF.

- a step (round, grid: doubles): k = floor(x * den / num), m = k * num / den, the step being
  the exact fraction num/den of its decimal text; if m came out above x (the division rounded
  up), the multiple below. So m is never above x, and decimal steps give decimal-looking
  values (0.1 * 513 is 51.300000000000004, 513 / 10 is 51.3).
- a step on a long, and truncate on a timestamp (epoch microseconds): x - pmod(x, step),
  exactly; null if that would leave the 64-bit range.
- bands: the largest edge at or below x (an `aggregate` over the edges); null below the first
  edge, and for NaN.
- hash: HMAC-SHA-256 (RFC 2104) of the text's UTF-8 bytes, as 64 lowercase hex digits, with the
  stream owner's key: `sha2(opad_key || unhex(sha2(ipad_key || text, 256)), 256)`, built from
  Spark's `sha2` (Spark 4.2, which xsg runs on for its Kafka connector, has no `hmac`; the
  result is the same as Python's `hmac`). The two padded keys (`hmac_material`: the key zero-
  padded to SHA-256's 64-byte block, XORed with 0x36 and with 0x5c) are data (a binary field of
  the plan table, or a column of a one-row table a join's side is crossed with), never a literal
  of the expression (Spark prints literals in plans and in errors); a long is hashed as its
  decimal text.
- prefix, suffix: Spark's `left`, `right` (characters, as Python's slices count them).
- null: null.
An attribute without a mask (a null struct) is itself. A code an expression does not know for
its type gives null, never the raw value.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, functions as F, types as T

from pep.core.masks import STEP_KINDS, UNIT_MICROS, Mask

NONE, STEP_D, STEP_L, BANDS_D, BANDS_L, HASH, PREFIX, SUFFIX, NULL = range(9)

MASK_ARROW = pa.struct([("c", pa.int32()), ("n", pa.float64()), ("d", pa.float64()),
                        ("l", pa.int64()), ("e", pa.list_(pa.float64())),
                        ("le", pa.list_(pa.int64())), ("w", pa.int32()), ("h", pa.binary())])
MASK_TYPE = T.StructType([
    T.StructField("c", T.IntegerType()),   # the code (above)
    T.StructField("n", T.DoubleType()),    # a double step's numerator ...
    T.StructField("d", T.DoubleType()),    # ... and denominator
    T.StructField("l", T.LongType()),      # a long step (truncate: the unit in microseconds)
    T.StructField("e", T.ArrayType(T.DoubleType())),  # band edges of a double
    T.StructField("le", T.ArrayType(T.LongType())),   # band edges of a long
    T.StructField("w", T.IntegerType()),   # prefix / suffix length
    T.StructField("h", T.BinaryType()),    # the hash key
])
MASKS_TYPE = T.ArrayType(MASK_TYPE)


def mask_code(mask: Mask, field_type: str) -> int:
    if mask.kind in STEP_KINDS:
        return STEP_L if field_type == "long" else STEP_D
    if mask.kind == "truncate":
        return STEP_L
    if mask.kind == "bands":
        return BANDS_L if field_type == "long" else BANDS_D
    return {"hash": HASH, "prefix": PREFIX, "suffix": SUFFIX}.get(mask.kind, NULL)


def mask_struct(mask: Mask, field_type: str, key: bytes | None) -> dict[str, Any]:
    """A mask as the plan table's struct (a row of MASK_ARROW). `key`: the stream owner's hash
    key, put only into hash masks."""
    code = mask_code(mask, field_type)
    out: dict[str, Any] = {"c": code, "n": None, "d": None, "l": None, "e": None, "le": None,
                           "w": None, "h": None}
    if code == STEP_D:
        step = Fraction(mask.step_value)
        out.update(n=float(step.numerator), d=float(step.denominator))
    elif code == STEP_L:
        if mask.kind == "truncate":
            assert mask.unit is not None, "a truncate mask without its unit"  # see `parse_mask`
            out["l"] = UNIT_MICROS[mask.unit]
        else:
            out["l"] = int(mask.step_value)
    elif code == BANDS_D:
        out["e"] = [float(e) for e in mask.edges]
    elif code == BANDS_L:
        out["le"] = [int(e) for e in mask.edges]
    elif code in (PREFIX, SUFFIX):
        out["w"] = mask.length
    elif code == HASH:
        if key is None:
            raise ValueError("a hash mask needs the stream owner's key")
        out["h"] = hmac_material(key)
    return out


SHA256_BLOCK = 64


def hmac_material(key: bytes) -> bytes:
    """What HMAC-SHA-256 needs of `key` (RFC 2104): the key zero-padded to the hash's block
    (hashed first if longer), XORed with ipad (0x36) and with opad (0x5c), one after the other
    (128 bytes). Secret as the key is: data, never SQL text."""
    if len(key) > SHA256_BLOCK:
        key = hashlib.sha256(key).digest()
    padded = key.ljust(SHA256_BLOCK, b"\0")
    return bytes(b ^ 0x36 for b in padded) + bytes(b ^ 0x5C for b in padded)


def hmac_sha256_hex(material: Column, message: Column) -> Column:
    """HMAC-SHA-256 of the binary `message` under `hmac_material(key)`, as lowercase hex."""
    inner = F.unhex(F.sha2(F.concat(F.substring(material, 1, SHA256_BLOCK), message), 256))
    return F.sha2(F.concat(F.substring(material, SHA256_BLOCK + 1, SHA256_BLOCK), inner), 256)


def mask_literal(mask: Mask, field_type: str, key: Column | None = None) -> Column:
    """A mask as a struct of typed literals (a join's own query); a hash mask's key is the
    column `key` (never a literal)."""
    s = mask_struct(mask, field_type, b"" if mask.kind == "hash" else None)
    fields = []
    for f in MASK_TYPE.fields:
        if f.name == "h":
            value = key if (s["c"] == HASH and key is not None) else F.lit(None)
        else:
            value = F.lit(s[f.name])
        fields.append(value.cast(f.dataType).alias(f.name))
    return F.struct(*fields)


# -- the expressions ------------------------------------------------------------------------------

def let(value: Column, body: Callable[[Column], Column]) -> Column:
    """`body(x)` with x bound once to `value`. Spark has no let: a one-element array's
    `transform` binds a lambda variable. A value used several times is then one subtree, not
    a copy per use: the analyser's and optimiser's work on every micro-batch's plan grows with
    the tree (measured: without it, a batch with one masked plan took 5 times as long)."""
    return F.element_at(F.transform(F.array(value), body), 1)


def masked_double(v: Column, m: Column) -> Column:
    """A double attribute's value under the mask struct `m` (null struct: the value)."""
    def body(v: Column, m: Column) -> Column:
        c = m["c"]
        stepped = let(v * m["d"] / m["n"], lambda a: let(
            a - F.pmod(a, F.lit(1.0)),  # floor, in doubles (no overflow into a long)
            lambda k: let(k * m["n"] / m["d"], lambda s: F.when(
                s > v, (k - F.lit(1.0)) * m["n"] / m["d"]).otherwise(s))))
        banded = F.aggregate(m["e"], F.lit(None).cast("double"),
                             lambda acc, e: F.when(v >= e, e).otherwise(acc))
        return (F.when(c.isNull() | (c == NONE), v)
                .when(c == STEP_D, stepped)
                .when(c == BANDS_D, banded)
                .otherwise(F.lit(None).cast("double")))
    return let(F.nanvl(v, F.lit(None).cast("double")), lambda v: let(m, lambda m: body(v, m)))


def masked_long(v: Column, m: Column) -> Column:
    """A long (or a timestamp's epoch microseconds) under the mask struct `m`."""
    def body(v: Column, m: Column) -> Column:
        c = m["c"]
        stepped = F.try_subtract(v, F.pmod(v, m["l"]))
        banded = F.aggregate(m["le"], F.lit(None).cast("long"),
                             lambda acc, e: F.when(v >= e, e).otherwise(acc))
        return (F.when(c.isNull() | (c == NONE), v)
                .when(c == STEP_L, stepped)
                .when(c == BANDS_L, banded)
                .otherwise(F.lit(None).cast("long")))
    return let(v, lambda v: let(m, lambda m: body(v, m)))


def masked_text(t: Column, m: Column) -> Column:
    """A string (or a long's decimal text, for a hash) under the mask struct `m`."""
    def body(t: Column, m: Column) -> Column:
        c = m["c"]
        return (F.when(c.isNull() | (c == NONE), t)
                .when(c == HASH, hmac_sha256_hex(m["h"], F.encode(t, "UTF-8")))
                .when(c == PREFIX, F.left(t, m["w"]))
                .when(c == SUFFIX, F.right(t, m["w"]))
                .otherwise(F.lit(None).cast("string")))
    return let(t, lambda t: let(m, lambda m: body(t, m)))


def is_hash(m: Column) -> Column:
    return F.coalesce(m["c"] == HASH, F.lit(False))


def masked_column(column: Column, field_type: str, m: Column) -> Column:
    """An attribute's column (its own type) under the mask struct `m`, in the attribute's type;
    a hashed long is null here (its text is `hashed_text`)."""
    if field_type == "double":
        return masked_double(column.cast("double"), m)
    if field_type == "long":
        return masked_long(column.cast("long"), m)
    if field_type == "timestamp":
        return F.timestamp_micros(masked_long(F.unix_micros(column), m))
    if field_type == "string":
        return masked_text(column, m)
    # boolean: only null applies
    return F.when(m["c"].isNull() | (m["c"] == NONE), column).otherwise(
        F.lit(None).cast("boolean"))


def masked_seconds(number: Column, exact: Column, field_type: str, m: Column) -> Column:
    """A time attribute's value as epoch seconds (a double) under the mask struct `m` (null
    struct: the raw value), what orders a plan's tuples and places them in time windows when
    its policy masks the time: a timestamp from its exact microseconds (`exact`), a long from
    itself (`exact`), a double from itself (`number`), as the value arrays hold them. A mask
    that gives no number (hash, null) gives null: such a time orders nothing, and the tuples
    fall back on stream order."""
    if field_type == "timestamp":
        return masked_long(exact, m) / F.lit(1_000_000.0)
    if field_type == "long":
        return masked_long(exact, m).cast("double")
    return masked_double(number, m)


def hashed_text(column: Column, field_type: str, m: Column) -> Column:
    """A long's hash (its decimal text's), when `m` hashes it; else null."""
    text = column if field_type == "string" else column.cast("long").cast("string")
    return F.when(is_hash(m), masked_text(text, m)).otherwise(F.lit(None).cast("string"))


__all__ = ["MASK_ARROW", "MASK_TYPE", "MASKS_TYPE", "mask_code", "mask_struct", "let",
           "hmac_material", "hmac_sha256_hex",
           "mask_literal", "masked_double", "masked_long", "masked_text", "masked_column",
           "masked_seconds",
           "hashed_text", "is_hash", "NONE", "STEP_D", "STEP_L", "BANDS_D", "BANDS_L", "HASH",
           "PREFIX", "SUFFIX", "NULL"]
