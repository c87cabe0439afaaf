"""The plan table's layout: one row holding every attached plan as a struct (kind, conjuncts of
predicate structs, start position, pane width, attribute indices, bounds, masks), built from
Arrow (`query/plan_table.py`) and read by the expressions of `plans/plan_expressions.py` and
`query/rows_job.py` and `query/panes_job.py`.

The struct fields keep one- or two-letter names: they are spelled out in every micro-batch's
plan, whose analysis grows with the expression's text. `PlanField` and `PredicateField` name
them for the code. Nothing stores them: the plan table is rebuilt from the attached plans
(never part of a checkpoint).
"""
from __future__ import annotations

from typing import Final

import pyarrow as pa

from pep.runtime.plans.spatial import PREDICATE_FIELDS
from pep.runtime.privacy.masks import MASK_ARROW

# plan kinds in the plan table: plain rows; tuple windows whose panes Spark aggregates; time
# windows; tuple windows whose tuples come back as rows (panes of one tuple, on the driver)
PLAIN, TUPLE, TIME, ROW_TUPLE = 0, 1, 2, 3
ROW_KINDS = (PLAIN, ROW_TUPLE)
# a time window's time attribute (`PlanField.TIME_KIND`): which of the value arrays holds its
# exact value (a timestamp's microseconds and a long in the 64-bit one, a double in the other),
# which a mask of it reads
TIME_TIMESTAMP, TIME_DOUBLE, TIME_LONG = 0, 1, 2
TIME_KINDS = {"timestamp": TIME_TIMESTAMP, "double": TIME_DOUBLE, "long": TIME_LONG}


class PlanField:
    """A plan struct's fields."""

    ID: Final = "id"
    KIND: Final = "k"  # PLAIN, TUPLE, TIME or ROW_TUPLE
    CONJUNCTS: Final = "c"  # conjuncts of predicate structs; [[]] passes everything
    START_AFTER: Final = "sa"  # positions <= it never reach the plan
    START_OFFSETS: Final = "so"  # Kafka: per partition, the first offset reaching the plan
    PANE_WIDTH: Final = "g"  # tuples or seconds
    PANE_OFFSET: Final = "off"  # tuple windows: tuples already in the open pane
    TIME_INDEX: Final = "t"  # time windows: the time attribute's index
    TIME_KIND: Final = "tk"  # TIME_TIMESTAMP (exact microseconds), TIME_DOUBLE, TIME_LONG
    KEYS: Final = "ky"  # group-by attribute indices
    DOUBLES: Final = "d"  # aggregated attributes' indices per family, padded
    LONGS: Final = "l"
    STRINGS: Final = "s"
    LOW: Final = "lo"  # private windows: clamping bounds per attribute (plans/clamp.py)
    HIGH: Final = "hi"
    MASKS: Final = "mk"  # masks per attribute index (null: none masked)


# the index fields of a family's aggregated attributes ("d", "l", "s": compile.FAMILIES)
FAMILY_FIELDS = {"d": PlanField.DOUBLES, "l": PlanField.LONGS, "s": PlanField.STRINGS}


class PredicateField:
    """A predicate struct's fields (the spatial ones: `spatial.PREDICATE_FIELDS`)."""

    ATTRIBUTE: Final = "a"  # attribute index, 1-based
    OUTCOMES: Final = "m"  # accepted outcomes: 1 less, 2 equal, 4 greater
    KIND: Final = "k"  # 0 double, 1 string, 5 64-bit integer (plans/compile.py's kinds)
    NUMBER: Final = "n"  # the constant of a double comparison
    TEXT: Final = "s"  # ... of a string comparison
    INTEGER: Final = "i"  # ... of a long, timestamp, boolean comparison


_PRED_ARROW = pa.struct([
    pa.field(PredicateField.ATTRIBUTE, pa.int32(), False),
    pa.field(PredicateField.OUTCOMES, pa.int32(), False),
    pa.field(PredicateField.KIND, pa.int32(), False),
    (PredicateField.NUMBER, pa.float64()), (PredicateField.TEXT, pa.string()),
    (PredicateField.INTEGER, pa.int64()),
    *PREDICATE_FIELDS])  # spatial fields: plans/spatial.py
PLAN_TABLE_ARROW = pa.schema([("plans", pa.list_(pa.struct([
    pa.field(PlanField.ID, pa.int32(), False),
    pa.field(PlanField.KIND, pa.int32(), False),
    (PlanField.CONJUNCTS, pa.list_(pa.list_(_PRED_ARROW))),
    (PlanField.START_AFTER, pa.int64()),
    (PlanField.START_OFFSETS, pa.list_(pa.int64())),
    (PlanField.PANE_WIDTH, pa.int64()),
    (PlanField.PANE_OFFSET, pa.int64()),
    (PlanField.TIME_INDEX, pa.int32()),
    (PlanField.TIME_KIND, pa.int32()),
    (PlanField.KEYS, pa.list_(pa.int32())),
    (PlanField.DOUBLES, pa.list_(pa.int32())),
    (PlanField.LONGS, pa.list_(pa.int32())),
    (PlanField.STRINGS, pa.list_(pa.int32())),
    (PlanField.LOW, pa.list_(pa.float64())),
    (PlanField.HIGH, pa.list_(pa.float64())),
    (PlanField.MASKS, pa.list_(MASK_ARROW)),
])))])

__all__ = ["PLAIN", "TUPLE", "TIME", "ROW_TUPLE", "ROW_KINDS", "TIME_TIMESTAMP", "TIME_DOUBLE",
           "TIME_LONG", "TIME_KINDS", "PlanField", "PredicateField",
           "FAMILY_FIELDS", "PLAN_TABLE_ARROW"]
