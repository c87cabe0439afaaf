"""Per-row Spark expressions of the shared query: the value arrays a plan's comparisons read, and
which plans a row passes, from the plan table (`plans/plan_schema.py`) or, for a few plans, from one
compiled Column each. Built once per schema and JVM (unresolved, so shared by every query).
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any, TypeVar, cast

from pyspark.sql import Column, functions as F, types as T

from pep.core.plan import StreamDefinition, StreamSchema
from pep.runtime.base.columns import (
    FILE_COLUMN,
    KAFKA_OFFSET_AT,
    KAFKA_PARTITION_AT,
    KOFF_COLUMN,
    KPART_COLUMN,
    LNGS_COLUMN,
    NUMS_COLUMN,
    PLANS_COLUMN,
    SEQ_COLUMN,
    STRS_COLUMN,
)
from pep.runtime.base.memo import OwnedCache
from pep.runtime.plans.compile import (
    INTEGER_KIND,
    LABEL_KIND,
    MASKED_KIND,
    NUMERIC_KIND,
    STRING_KIND,
    CompiledPlan,
)
from pep.runtime.plans.plan_schema import PlanField, PredicateField
from pep.runtime.plans.spatial import spatial_outcome
from pep.runtime.privacy.labels import label_code, label_holds, label_outcome
from pep.runtime.privacy.masks import MASKS_TYPE, let, masked_double, masked_long, masked_text

JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'", "ignoreNullFields": "false"}


def value_elements(schema: StreamSchema, only: frozenset[str] | None = None
                   ) -> tuple[list[Column], list[Column], list[Column]]:
    """Every attribute as a number, as text and as a 64-bit integer, in schema order (null
    where the attribute has no such form; with `only`: the other attributes are null, so the
    scan need not read them): the elements of the per-row value arrays."""
    nums, strs, lngs = [], [], []
    for f in schema.fields:
        c = F.col(f"`{f.name}`")
        if only is not None and f.name not in only:
            nums.append(F.lit(None).cast("double"))
            strs.append(F.lit(None).cast("string"))
            lngs.append(F.lit(None).cast("long"))
            continue
        if f.type in ("string", "label"):  # a label's text (its code: the long form)
            nums.append(F.lit(None).cast("double"))
            strs.append(c)
        else:
            if f.type == "timestamp":
                num = F.unix_micros(c) / F.lit(1_000_000.0)
            elif f.type == "boolean":
                num = F.when(c, F.lit(1.0)).when(~c, F.lit(0.0))
            else:
                num = c.cast("double")
            nums.append(num)
            strs.append(F.lit(None).cast("string"))
        # exact values: long as is, timestamps in epoch microseconds, booleans 0/1, a label's
        # code in its lattice; null for doubles and strings
        if f.type == "long":
            lngs.append(c)
        elif f.type == "timestamp":
            lngs.append(F.unix_micros(c))
        elif f.type == "boolean":
            lngs.append(F.when(c, F.lit(1)).when(~c, F.lit(0)).cast("long"))
        elif f.type == "label" and f.lattice is not None:
            lngs.append(label_code(c, f.lattice))
        else:
            lngs.append(F.lit(None).cast("long"))
    return nums, strs, lngs


def value_arrays(definition: StreamDefinition | StreamSchema,
                 only: frozenset[str] | None = None) -> tuple[Column, Column, Column]:
    """Per-row arrays of every attribute as a number, as text and as a 64-bit integer (long as
    is, timestamps in epoch microseconds, booleans 0/1: exact values for comparisons and
    windows), indexed like the schema (with `only`: the other attributes are null, so the scan
    need not read them)."""
    schema = definition.schema if isinstance(definition, StreamDefinition) else definition
    nums, strs, lngs = value_elements(schema, only)
    return F.array(*nums), F.array(*strs), F.array(*lngs)


def json_value(c: Column, ftype: str) -> Column:
    """The JSON text of a value (Spark's to_json; NaN and infinities as null)."""
    if ftype == "double":
        c = F.when(F.isnan(c) | (F.abs(c) == F.lit(float("inf"))), F.lit(None)).otherwise(c)
    return F.regexp_replace(F.to_json(F.array(c), JSON_OPTIONS), r"^\[|\]$", "")


def key_array(schema: StreamSchema, keys: tuple[str, ...]) -> Column:
    """Per-row array holding the JSON text of each group-by attribute (null elsewhere)."""
    return F.array(*[json_value(F.col(f"`{f.name}`"), f.type) if f.name in keys
                     else F.lit(None).cast("string") for f in schema.fields])


def _outcome(value: Column, constant: Column) -> Column:
    return (F.when(value < constant, F.lit(1)).when(value == constant, F.lit(2))
            .when(value > constant, F.lit(4)))


def _predicate_holds(p: Column, spatial: bool, plan: Column | None = None) -> Column:
    """Each comparison in its attribute's family: doubles, 64-bit integers (exact), strings.
    With `plan` (some attached plan masks): a comparison marked MASKED_KIND reads the value
    under the plan's mask for its attribute (pep/runtime/privacy/masks.py)."""
    a, kind = p[PredicateField.ATTRIBUTE], p[PredicateField.KIND]
    number, integer, text = (p[PredicateField.NUMBER], p[PredicateField.INTEGER],
                             p[PredicateField.TEXT])
    num = F.element_at(F.col(NUMS_COLUMN), a)
    txt = F.element_at(F.col(STRS_COLUMN), a)
    lng = F.element_at(F.col(LNGS_COLUMN), a)
    if plan is not None:
        m = F.element_at(plan[PlanField.MASKS], a)
        outcome = (F.when(kind == NUMERIC_KIND, _outcome(num, number))
                   .when(kind == INTEGER_KIND, _outcome(lng, integer))
                   .when(kind == STRING_KIND, _outcome(txt, text))
                   .when(kind == NUMERIC_KIND | MASKED_KIND,
                         _outcome(masked_double(num, m), number))
                   .when(kind == INTEGER_KIND | MASKED_KIND,
                         _outcome(masked_long(lng, m), integer))
                   .when(kind == STRING_KIND | MASKED_KIND,
                         _outcome(masked_text(F.coalesce(txt, lng.cast("string")), m), text)))
        if spatial:
            outcome = outcome.otherwise(spatial_outcome(p, F.col(NUMS_COLUMN), _outcome))
    elif not spatial:
        outcome = (F.when(kind == NUMERIC_KIND, _outcome(num, number))
                   .when(kind == INTEGER_KIND, _outcome(lng, integer))
                   .when(kind == LABEL_KIND, label_outcome(lng, integer))
                   .otherwise(_outcome(txt, text)))
    else:
        outcome = (F.when(kind == NUMERIC_KIND, _outcome(num, number))
                   .when(kind == INTEGER_KIND, _outcome(lng, integer))
                   .when(kind == LABEL_KIND, label_outcome(lng, integer))
                   .when(kind == STRING_KIND, _outcome(txt, text))
                   .otherwise(spatial_outcome(p, F.col(NUMS_COLUMN), _outcome)))
    return F.coalesce(p[PredicateField.OUTCOMES].bitwiseAND(outcome) != 0, F.lit(False))


def kafka_position() -> tuple[Column, Column]:
    """A Kafka record's (partition, offset), read back from its `_xsg_file` (base/columns.py)."""
    f = F.col(FILE_COLUMN)
    return (F.substring(f, *KAFKA_PARTITION_AT).cast("int"),
            F.substring(f, *KAFKA_OFFSET_AT).cast("long"))


def kafka_admits(start_offsets: Column, read_back: bool = False) -> Column:
    """The row's Kafka record is at or after the cut (per partition, the first offset given;
    a partition beyond the array, one added after the cut, gives every record; a null array:
    no cut). Only on a Kafka stream's rows: their position from `_xsg_file`, or with
    `read_back` from the columns the jobs' base select read it into once per row
    (`KPART_COLUMN`, `KOFF_COLUMN`), not once per row and plan."""
    if read_back:
        partition, offset = F.col(KPART_COLUMN), F.col(KOFF_COLUMN)
    else:
        partition, offset = kafka_position()
    first = F.try_element_at(start_offsets, partition + F.lit(1))
    return start_offsets.isNull() | first.isNull() | (offset >= first)


def _matches(plan: Column, spatial: bool, masked: bool = False, kafka: bool = False) -> Column:
    """The plan's start position and DNF filter hold for the row. `spatial`: some attached
    plan has a spatial predicate. Without one the expression leaves the spatial branch out:
    Spark evaluates these lambdas per row and plan, uncompiled; with the branch (and whole-stage
    code generation still on), 1,000 plain plans ran about 20 times slower (bench_many_readers:
    3.8 s per micro-batch against 0.17 s). `kafka`: some plan starts at Kafka offsets (only
    then does the expression read the row's position)."""
    seq = F.col(SEQ_COLUMN)
    start_after = plan[PlanField.START_AFTER]
    started = start_after.isNull() | seq.isNull() | (seq > start_after)
    if kafka:  # over the base select's output (query/batch_columns.py), which read the position
        started = started & kafka_admits(plan[PlanField.START_OFFSETS], read_back=True)
    return started & F.exists(plan[PlanField.CONJUNCTS], lambda conj: F.forall(
        conj, lambda p: _predicate_holds(p, spatial, plan if masked else None)))


def matched_plans_column(kinds: tuple[int, ...] | None = None, spatial: bool = False,
                         masked: bool = False, kafka: bool = False) -> Column:
    """Ids of the plans (of `kinds`) whose filter holds for the row: one expression for any
    number of plans."""
    if kinds is None:
        chosen = F.filter(F.col(PLANS_COLUMN), lambda p: _matches(p, spatial, masked, kafka))
    else:
        chosen = F.filter(F.col(PLANS_COLUMN),
                          lambda p: p[PlanField.KIND].isin(*kinds)
                          & _matches(p, spatial, masked, kafka))
    return F.transform(chosen, lambda plan: plan[PlanField.ID])


def masked_emissions(kinds: tuple[int, ...], spatial: bool, masked_filters: bool,
                     kafka: bool = False) -> Column:
    """The rows job's emissions when some plan masks: one for the plans without masks that the
    row passes (their ids, no masks), then one per masked plan it passes (its id, its masks),
    since each masked plan sees its own values of the row."""
    matched = F.filter(F.col(PLANS_COLUMN),
                       lambda p: p[PlanField.KIND].isin(*kinds)
                       & _matches(p, spatial, masked_filters, kafka))

    def emissions(ms: Column) -> Column:
        plain = F.transform(F.filter(ms, lambda p: p[PlanField.MASKS].isNull()),
                            lambda p: p[PlanField.ID])
        masked = F.filter(ms, lambda p: p[PlanField.MASKS].isNotNull())
        none = F.lit(None).cast(MASKS_TYPE)
        shared = F.when(F.size(plain) > 0,
                        F.array(F.struct(plain.alias("i"), none.alias(PlanField.MASKS)))) \
            .otherwise(F.array().cast(T.ArrayType(T.StructType([
                T.StructField("i", T.ArrayType(T.IntegerType(), False)),
                T.StructField(PlanField.MASKS, MASKS_TYPE)]))))
        own = F.transform(masked, lambda p: F.struct(F.array(p[PlanField.ID]).alias("i"),
                                                     p[PlanField.MASKS].alias(PlanField.MASKS)))
        return F.concat(shared, own)
    return let(matched, emissions)


# Up to this many row plans (and none spatial, no window plan in Spark) are matched by one
# compiled Column per plan instead of the plan table: Spark generates code for it, where the
# plan table's higher-order functions run interpreted (measured on one plain plan: the
# gateway's throughput against a direct query 0.75-0.80 with the plan table).
FEW_PLANS = 8


NO_PLAN = -1  # no plan id: they count from 1 (query/registry.py)


def few_plans_column(plans: list[tuple[int, CompiledPlan]],
                     schema: StreamSchema | None = None) -> Column:
    """Ids of the plans whose filter holds for the row, one Column per plan: the same tests as
    the plan table's (`_predicate_holds`, on the same per-row values, a null operand false),
    every constant a typed literal (data in the expression tree, never SQL text). With
    `schema`, each test reads its attribute's own expression (`value_elements`), so the rows
    job needs no value arrays; else it reads them from the batch's value arrays."""
    seq = F.col(SEQ_COLUMN)
    if schema is not None:
        elements = value_elements(schema)

        def at(family: int, a: int) -> Column:
            return elements[family][a - 1]
    else:
        arrays = (F.col(NUMS_COLUMN), F.col(STRS_COLUMN), F.col(LNGS_COLUMN))

        def at(family: int, a: int) -> Column:
            return F.element_at(arrays[family], a)
    nums, strs, lngs = 0, 1, 2
    chosen = []
    for plan_id, compiled in plans:
        alternatives = []
        for conj in compiled.conjuncts:
            terms = []
            for a, m, k, n, s in conj:
                if k == LABEL_KIND:
                    terms.append(label_holds(at(lngs, a), m, int(n)))
                    continue
                if k == NUMERIC_KIND:
                    value, constant = at(nums, a), F.lit(n).cast("double")
                elif k == INTEGER_KIND:
                    value, constant = at(lngs, a), F.lit(int(n)).cast("long")
                else:
                    value, constant = at(strs, a), F.lit(s).cast("string")
                tests = [test for bit, test in ((1, value < constant), (2, value == constant),
                                                (4, value > constant)) if m & bit]
                term = functools.reduce(operator.or_, tests) if tests else F.lit(False)
                terms.append(F.coalesce(term, F.lit(False)))
            alternatives.append(functools.reduce(operator.and_, terms) if terms else F.lit(True))
        holds = functools.reduce(operator.or_, alternatives) if alternatives else F.lit(False)
        if compiled.start_after is not None:
            holds = holds & (seq.isNull() | (seq > F.lit(int(compiled.start_after))))
        if compiled.start_offsets is not None:
            holds = holds & kafka_admits(offsets_literal(compiled.start_offsets))
        chosen.append(F.when(holds, F.lit(plan_id)).otherwise(F.lit(NO_PLAN)))
    # array_remove, not array_compact: array_compact is a higher-order function (a lambda over
    # the array), which Spark runs without generated code and which takes the whole stage with
    # it; array_remove and the tests above all generate code
    return F.array_remove(F.array(*chosen), NO_PLAN)


def offsets_literal(offsets: tuple[int, ...]) -> Column:
    """A Kafka cut as a typed array literal (data in the expression tree, never SQL text)."""
    if not offsets:
        return F.array().cast(T.ArrayType(T.LongType()))
    return F.array(*[F.lit(int(o)).cast("long") for o in offsets])


def matched_plan_structs(kind: int, spatial: bool = False, masked: bool = False,
                         kafka: bool = False) -> Column:
    return F.filter(F.col(PLANS_COLUMN),
                    lambda p: (p[PlanField.KIND] == kind) & _matches(p, spatial, masked, kafka))


# Building expressions takes py4j round trips (~0.1-0.3 ms each); they are unresolved and hold
# no session state, so they are built once per JVM gateway and key and shared by every query.
_EXPRESSIONS = OwnedCache(maxsize=256)
Built = TypeVar("Built")


def shared_expressions(key: Any, build: Callable[[], Built]) -> Built:
    """`build()`'s expressions, built once per JVM gateway and `key` (their shape)."""
    from pyspark import SparkContext
    return cast(Built, _EXPRESSIONS.get_or_build(SparkContext._gateway, key, build))


def filter_expressions(schema: StreamSchema) -> tuple[Column, Column, Column]:
    """(numbers array, texts array, matched plan ids) for `schema`, built once and then reused."""
    nums, strs, _ = shared_expressions(("values", schema), lambda: value_arrays(schema))
    (matched,) = shared_expressions(("matched",), lambda: (matched_plans_column(),))
    return nums, strs, matched


__all__ = ["value_elements", "value_arrays", "json_value", "key_array",
           "matched_plans_column", "masked_emissions", "few_plans_column",
           "matched_plan_structs", "shared_expressions", "filter_expressions", "FEW_PLANS",
           "kafka_position", "kafka_admits", "offsets_literal",
           "JSON_OPTIONS"]
