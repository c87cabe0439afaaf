"""The plan table's layout: one row holding every attached plan as a struct (kind, conjuncts of
predicate structs, start position, pane width, attribute indices, bounds, masks), built from
Arrow (`plan_table.py`) and read by the expressions of `plan_expressions.py` and
`batch_frames.py`.

The struct fields keep one- or two-letter names: they are spelled out in every micro-batch's
plan, whose analysis grows with the expression's text. `PlanField` and `PredicateField` name
them for the code. Nothing stores them: the plan table is rebuilt from the attached plans
(never part of a checkpoint).
"""
from __future__ import annotations

from typing import Final

import pyarrow as pa
from pyspark.sql import types as T

from pep.runtime.masks import MASK_ARROW
from pep.runtime.spatial import PREDICATE_FIELDS


# plan kinds in the plan table: plain rows; tuple windows whose panes Spark aggregates; time
# windows; tuple windows whose tuples come back as rows (panes of one tuple, on the driver)
PLAIN, TUPLE, TIME, ROW_TUPLE = 0, 1, 2, 3
ROW_KINDS = (PLAIN, ROW_TUPLE)


class PlanField:
    """A plan struct's fields."""

    ID: Final = "id"
    KIND: Final = "k"  # PLAIN, TUPLE, TIME or ROW_TUPLE
    CONJUNCTS: Final = "c"  # conjuncts of predicate structs; [[]] passes everything
    START_AFTER: Final = "sa"  # positions <= it never reach the plan
    PANE_WIDTH: Final = "g"  # tuples or seconds
    PANE_OFFSET: Final = "off"  # tuple windows: tuples already in the open pane
    TIME_INDEX: Final = "t"  # time windows: the time attribute's index
    TIME_KIND: Final = "tk"  # 0: a timestamp (exact microseconds), 1: a number
    KEYS: Final = "ky"  # group-by attribute indices
    DOUBLES: Final = "d"  # aggregated attributes' indices per family, padded
    LONGS: Final = "l"
    STRINGS: Final = "s"
    LOW: Final = "lo"  # private windows: clamping bounds per attribute (privacy.py)
    HIGH: Final = "hi"
    MASKS: Final = "mk"  # masks per attribute index (null: none masked)


# the index fields of a family's aggregated attributes ("d", "l", "s": compile.FAMILIES)
FAMILY_FIELDS = {"d": PlanField.DOUBLES, "l": PlanField.LONGS, "s": PlanField.STRINGS}


class PredicateField:
    """A predicate struct's fields (the spatial ones: `spatial.PREDICATE_FIELDS`)."""

    ATTRIBUTE: Final = "a"  # attribute index, 1-based
    OUTCOMES: Final = "m"  # accepted outcomes: 1 less, 2 equal, 4 greater
    KIND: Final = "k"  # 0 double, 1 string, 5 64-bit integer (compile.py's kinds)
    NUMBER: Final = "n"  # the constant of a double comparison
    TEXT: Final = "s"  # ... of a string comparison
    INTEGER: Final = "i"  # ... of a long, timestamp, boolean comparison


PREDICATE_TYPE = T.StructType([
    T.StructField("a", T.IntegerType(), False),   # attribute index, 1-based
    T.StructField("m", T.IntegerType(), False),   # accepted outcomes: 1 less, 2 equal, 4 greater
    T.StructField("k", T.IntegerType(), False),   # 0 double, 1 string, 5 64-bit integer
    T.StructField("n", T.DoubleType(), True),     # the constant of a double comparison
    T.StructField("s", T.StringType(), True),     # ... of a string comparison
    T.StructField("i", T.LongType(), True),       # ... of a long, timestamp, boolean comparison
])
_PRED_ARROW = pa.struct([pa.field("a", pa.int32(), False), pa.field("m", pa.int32(), False),
                         pa.field("k", pa.int32(), False), ("n", pa.float64()),
                         ("s", pa.string()), ("i", pa.int64()),
                         *PREDICATE_FIELDS])  # spatial fields: spatial.py
PLAN_TABLE_ARROW = pa.schema([("plans", pa.list_(pa.struct([
    pa.field("id", pa.int32(), False),
    pa.field("k", pa.int32(), False),       # PLAIN, TUPLE, TIME or ROW_TUPLE
    ("c", pa.list_(pa.list_(_PRED_ARROW))),  # conjuncts; [[]] passes everything
    ("sa", pa.int64()),                      # start_after: positions <= sa never reach the plan
    ("g", pa.int64()),                       # pane width (tuples or seconds)
    ("off", pa.int64()),                     # tuple windows: tuples already in the open pane
    ("t", pa.int32()),                       # time windows: time attribute index
    ("tk", pa.int32()),                      # 0: timestamp (exact microseconds), 1: number
    ("ky", pa.list_(pa.int32())),            # group-by attribute indices
    ("d", pa.list_(pa.int32())),             # aggregated attributes per family, padded
    ("l", pa.list_(pa.int32())),
    ("s", pa.list_(pa.int32())),
    ("lo", pa.list_(pa.float64())),          # private windows: clamping bounds per attribute
    ("hi", pa.list_(pa.float64())),          # (pep/runtime/privacy.py); null otherwise
    ("mk", pa.list_(MASK_ARROW)),            # masks per attribute index (null: none masked)
])))])


__all__ = ["PLAIN", "TUPLE", "TIME", "ROW_TUPLE", "ROW_KINDS", "PlanField", "PredicateField",
           "FAMILY_FIELDS", "PREDICATE_TYPE", "PLAN_TABLE_ARROW"]
