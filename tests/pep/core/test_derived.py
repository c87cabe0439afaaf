"""What a derived stream holds, and the write-time check that a policy for it is no wider than
the grant it derives from (`pep.core.derived`, issue 48)."""
from __future__ import annotations

import pytest

from pdp import AttributeAssignment, Obligation
from pep.core.derived import CannotDerive, WiderThanGrant, check_obligation, derive
from pep.core.labels import Lattice
from pep.core.plan import (
    Aggregate,
    ExecutionPlan,
    Field,
    JoinPlan,
    Predicate,
    StreamSchema,
    UnionPlan,
    WindowSpec,
)
from pep.core.privacy import Bound, PrivacySpec

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("station", "string"),
                       Field("rate", "double"), Field("n", "long"), Field("mmsi", "long"),
                       Field("level", "label", Lattice(("U", "S"), ("x",)))))
PLAIN = ExecutionPlan("rain", ((Predicate("rate", ">", 8.0), Predicate("n", "<", 100)),),
                      ("ts", "station", "rate", "mmsi"),
                      masks=(("rate", "round:5"), ("mmsi", "hash"), ("ts", "truncate:minute")))
TIMED = ExecutionPlan("rain", ((Predicate("n", ">", 10),),), ("ts", "station", "rate"),
                      WindowSpec("time", 60, 30, (Aggregate("rate", "avg"), Aggregate("n", "sum"),
                                                  Aggregate("n", "count"),
                                                  Aggregate("level", "lub")),
                                 time_attribute="ts", keys=("station",)))
TUPLES = ExecutionPlan("rain", None, ("rate",),
                       WindowSpec("tuple", 5, 2, (Aggregate("rate", "max"),)))


def never(category: str, attribute: str) -> list[str]:
    return ["0"] * 6


def ob(kind: str, *pairs: tuple[str, str]) -> Obligation:
    return Obligation(f"exacml:obligation:stream-{kind}", tuple(
        AttributeAssignment(f"exacml:obligation:stream-{kind}-{k}-id", "", v) for k, v in pairs))


def window(kind: str, size: int, step: int, *aggregates: str) -> Obligation:
    return Obligation("exacml:obligation:stream-window", tuple(
        AttributeAssignment(f"exacml:obligation:stream-window-{k}-id", "", v) for k, v in
        [("type", kind), ("size", str(size)), ("step", str(step))]
        + [("attr", a) for a in aggregates]))


def test_a_plain_grant_derives_its_projection_with_masked_types():
    d = derive("lta-rain", PLAIN, SCHEMA, "ts")
    assert [(f.name, f.type) for f in d.schema.fields] == [
        ("ts", "timestamp"), ("station", "string"), ("rate", "double"), ("mmsi", "string")]
    assert d.time_attribute == "ts"  # truncated: still ordered
    assert {n: m.spec for n, m in d.masks.items()} == {
        "ts": "truncate:minute", "rate": "round:5", "mmsi": "hash"}
    assert set(d.hidden) == {"n", "level"}
    hashed_time = ExecutionPlan("rain", None, ("ts", "rate"), masks=(("ts", "null"),))
    assert derive("x", hashed_time, SCHEMA, "ts").time_attribute is None


def test_a_windowed_grant_derives_its_windows():
    d = derive("w", TIMED, SCHEMA, "ts")
    assert [(f.name, f.type) for f in d.schema.fields] == [
        ("window_start", "timestamp"), ("window_end", "timestamp"), ("station", "string"),
        ("avg_rate", "double"), ("sum_n", "long"), ("count_n", "long"), ("lub_level", "label")]
    assert d.schema.lookup("lub_level").lattice == SCHEMA.lookup("level").lattice
    assert d.time_attribute == "window_start"
    private = WindowSpec("time", 60, 60, (Aggregate("n", "sum"), Aggregate("n", "count")),
                         time_attribute="ts", privacy=PrivacySpec(1.0, 0.0, (Bound("n", 0, 10),)))
    noisy = derive("p", ExecutionPlan("rain", None, ("n",), private), SCHEMA, "ts")
    assert [f.type for f in noisy.schema.fields[2:]] == ["double", "double"]  # noise
    tuples = derive("t", TUPLES, SCHEMA, "ts")
    assert [(f.name, f.type) for f in tuples.schema.fields] == [
        ("window_start", "long"), ("window_end", "long"), ("max_rate", "double")]
    assert tuples.time_attribute is None  # tuple numbers are no times


def test_joins_and_unions_cannot_be_derived():
    join = JoinPlan(PLAIN, TUPLES, (), 10.0, "ts", "window_end")
    with pytest.raises(CannotDerive, match="join"):
        derive("j", join, SCHEMA, "ts")
    with pytest.raises(CannotDerive, match="union"):
        derive("u", UnionPlan("rain", (PLAIN, TUPLES)), SCHEMA, "ts")


@pytest.mark.parametrize("obligation, what", [
    (ob("map", ("attribute", "n")), "attribute"),  # hidden by the grant
    (ob("filter", ("condition", "level DOMINATED_BY 'S'")), "attribute"),
    (ob("mask", ("attribute", "rate:round:1")), "mask"),  # finer than round:5
    (ob("mask", ("attribute", "rate:round:7")), "mask"),  # not a multiple: no coarser
    (ob("mask", ("attribute", "ts:truncate:second")), "mask"),
    (ob("mask", ("attribute", "mmsi:prefix:3")), "mask"),  # the hash holds no prefix
])
def test_a_plain_grants_derived_policy_that_asks_for_more_is_refused(obligation, what):
    d = derive("lta-rain", PLAIN, SCHEMA, "ts")
    with pytest.raises(WiderThanGrant) as exc:
        check_obligation(obligation, d, never, line=12)
    assert exc.value.what == what and "(line 12)" in exc.value.message
    assert "lta-rain" in exc.value.message and exc.value.details["wider"] == what


@pytest.mark.parametrize("obligation", [
    ob("map", ("attribute", "ts"), ("attribute", "rate")),
    ob("filter", ("condition", "station = 'S1' AND rate >= 10")),
    ob("mask", ("attribute", "rate:round:10")),  # coarser
    ob("mask", ("attribute", "rate:bands:0,10,20")),
    ob("mask", ("attribute", "station:prefix:1")),  # not masked by the grant: any mask
    ob("mask", ("attribute", "mmsi:hash")),
    window("tuple", 3, 3, "rate:avg"),
    window("time", 60, 60, "rate:max"),  # over the truncated time: minutes
])
def test_a_plain_grants_derived_policy_within_it_is_accepted(obligation):
    assert check_obligation(obligation, derive("lta-rain", PLAIN, SCHEMA, "ts"), never) == []


def test_windows_no_finer_than_the_deriving_window():
    d = derive("w", TIMED, SCHEMA, "ts")
    for refused in (window("time", 30, 30, "avg_rate:avg"), window("time", 60, 15, "avg_rate:avg"),
                    window("tuple", 4, 4, "avg_rate:avg")):
        with pytest.raises(WiderThanGrant) as exc:
            check_obligation(refused, d, never)
        assert exc.value.what == "window"
    assert check_obligation(window("time", 120, 60, "avg_rate:avg", "count_n:sum"), d, never) == []
    t = derive("t", TUPLES, SCHEMA, "ts")
    assert check_obligation(window("tuple", 2, 1, "max_rate:max"), t, never) == []
    # a time window over tuple numbers: refused here (the schema check would say the same)
    with pytest.raises(WiderThanGrant, match="tuple windows"):
        check_obligation(window("time", 60, 60, "max_rate:max"), t, never)


def test_a_derived_filter_that_can_never_hold_is_a_warning_not_a_refusal():
    d = derive("w", TIMED, SCHEMA, "ts")
    assert check_obligation(ob("filter", ("condition", "station = 'S1'")), d, never) == []
    plain = derive("p", ExecutionPlan("rain", ((Predicate("n", ">", 10),),), ("ts", "n")),
                   SCHEMA, "ts")
    warnings = check_obligation(ob("filter", ("condition", "n < 5")), plain, never)
    assert len(warnings) == 1 and "can never show a row of derived stream 'p'" in warnings[0]
    # a name that is no attribute of either stream is the schema check's to refuse
    assert check_obligation(ob("map", ("attribute", "nope")), plain, never) == []
