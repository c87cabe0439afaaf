"""Plan compilation to data rows (pure Python, no Spark)."""
import pytest

from pep.core.plan import Aggregate, ExecutionPlan, Field, Predicate, StreamSchema, WindowSpec
from pep.runtime.plans.compile import (
    EQUAL,
    GREATER,
    INTEGER_KIND,
    LESS,
    NUMERIC_KIND,
    STRING_KIND,
    PlanError,
    compile_plan,
)

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("temp", "double"), Field("n", "long"),
                       Field("station", "string"), Field("ok", "boolean")))


def plan(dnf, projection=("temp",), window=None):
    return ExecutionPlan("s", dnf, projection, window)


def test_none_filter_is_one_empty_conjunct_and_empty_dnf_passes_nothing():
    assert compile_plan(plan(None), SCHEMA).conjuncts == ((),)
    compiled = compile_plan(plan(()), SCHEMA)
    assert compiled.conjuncts == () and compiled.passes_nothing


def test_predicates_become_index_mask_kind_constant_rows():
    compiled = compile_plan(plan(((Predicate("TEMP", ">=", 20), Predicate("station", "!=", "a")),
                                  (Predicate("ok", "=", True),))), SCHEMA)
    assert compiled.conjuncts == (
        (
            (2, GREATER | EQUAL, NUMERIC_KIND, 20.0, None),
            (4, LESS | GREATER, STRING_KIND, None, "a"),
        ),
        ((5, EQUAL, INTEGER_KIND, 1, None),),
    )


def test_timestamp_constants_become_exact_epoch_microseconds():
    compiled = compile_plan(plan(((Predicate("ts", "<", "1970-01-01T00:01:00Z"),),)), SCHEMA)
    assert compiled.conjuncts[0][0][2:4] == (INTEGER_KIND, 60_000_000)
    # a far date keeps its last microsecond (a double of epoch seconds would not)
    far = compile_plan(plan(((Predicate("ts", "=", "9999-12-31T23:59:59.999999Z"),),)), SCHEMA)
    assert far.conjuncts[0][0][3] == 253_402_300_799_999_999
    # plans stored before timestamps were texts held epoch seconds: read as such
    old = compile_plan(plan(((Predicate("ts", ">=", 1704067200.000001),),)), SCHEMA)
    assert old.conjuncts[0][0][1:4] == (GREATER | EQUAL, INTEGER_KIND, 1_704_067_200_000_001)
    # a fraction of a microsecond is decided exactly: < .0000005 is <= .000000
    frac = compile_plan(plan(((Predicate("ts", "<", "1970-01-01T00:00:00.0000005Z"),),)), SCHEMA)
    assert frac.conjuncts[0][0][1:4] == (LESS | EQUAL, INTEGER_KIND, 0)


def test_long_constants_are_exact_64_bit_integers():
    def row(op, value):
        return compile_plan(plan(((Predicate("n", op, value),),)), SCHEMA).conjuncts[0][0]
    assert row("=", 2**53 + 1) == (3, EQUAL, INTEGER_KIND, 2**53 + 1, None)
    assert row("<", 2.5)[1:4] == (LESS | EQUAL, INTEGER_KIND, 2)
    assert row(">", "9007199254740992.5")[1:4] == (GREATER, INTEGER_KIND, 2**53)
    assert row("=", 2.5)[1:4] == (GREATER, INTEGER_KIND, 2**63 - 1)  # holds for no value
    assert row("!=", 2.5)[1:4] == (LESS | EQUAL, INTEGER_KIND, 2**63 - 1)  # for every value
    assert row("<", 2**64)[1:4] == (LESS | EQUAL, INTEGER_KIND, 2**63 - 1)
    assert row(">", -(2**64))[1:4] == (GREATER | EQUAL, INTEGER_KIND, -(2**63))
    assert row("<", -1e30)[1:4] == (LESS, INTEGER_KIND, -(2**63))


def test_hostile_string_is_kept_verbatim_as_data():
    hostile = "' OR 1=1 --"
    compiled = compile_plan(plan(((Predicate("station", "=", hostile),),)), SCHEMA)
    assert compiled.conjuncts[0][0][4] == hostile


@pytest.mark.parametrize("pred, fragment", [
    (Predicate("nope", "=", 1), "'nope' is not in the stream's schema"),
    (Predicate("temp", "=", "warm"), "is not a number"),
    (Predicate("ts", "<", "yesterday"), "not an ISO-8601 timestamp"),
    (Predicate("temp", "~", 1), "unknown operator"),
])
def test_bad_predicates_are_clear_errors(pred, fragment):
    with pytest.raises(PlanError, match=fragment):
        compile_plan(plan(((pred,),)), SCHEMA)


def test_window_checks():
    tw = WindowSpec("time", 10, 5, (Aggregate("temp", "avg"),))
    with pytest.raises(PlanError, match="needs a time attribute"):
        compile_plan(plan(None, (), tw), SCHEMA)
    assert compile_plan(plan(None, (), tw), SCHEMA, "ts").window.time_attribute == "ts"
    with pytest.raises(PlanError, match="needs a numeric attribute"):
        compile_plan(plan(None, (), WindowSpec("tuple", 3, 1, (Aggregate("station", "sum"),))),
                     SCHEMA)
    with pytest.raises(PlanError, match="positive integers"):
        compile_plan(plan(None, (), WindowSpec("tuple", 0, 1, (Aggregate("temp", "sum"),))),
                     SCHEMA)
    with pytest.raises(PlanError, match="project at least one"):
        compile_plan(plan(None, ()), SCHEMA)
