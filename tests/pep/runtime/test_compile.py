"""Plan compilation to data rows (pure Python, no Spark)."""
import pytest

from pep.core.plan import (Aggregate, ExecutionPlan, Field, Predicate, StreamSchema, WindowSpec)
from pep.runtime.compile import (EQUAL, GREATER, LESS, NUMERIC_KIND, STRING_KIND, PlanError,
                                 compile_plan)

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
        ((2, GREATER | EQUAL, NUMERIC_KIND, 20.0, None), (4, LESS | GREATER, STRING_KIND, None, "a")),
        ((5, EQUAL, NUMERIC_KIND, 1.0, None),),
    )


def test_timestamp_constants_become_epoch_seconds():
    compiled = compile_plan(plan(((Predicate("ts", "<", "1970-01-01T00:01:00Z"),),)), SCHEMA)
    assert compiled.conjuncts[0][0][3] == 60.0


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
