"""Security punctuations, the pure part (`pep.core.punctuations`): the record form and its
refusals, the Security Shield's state, the verdict per attribute, and the plan a consumer's
handle runs on a punctuated stream."""
from __future__ import annotations

from dataclasses import replace

import pytest

from pep.core.plan import (
    Aggregate,
    ExecutionPlan,
    Field,
    JoinPlan,
    Predicate,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
    UnionPlan,
    WindowSpec,
)
from pep.core.punctuations import (
    DEFER,
    REFINE,
    PunctuationError,
    SegmentPolicy,
    ShieldState,
    filter_attributes,
    lane_segments,
    oracle,
    parse_punctuation,
    punctuation_from_json,
    segments,
    shielded_plan,
    visible_attributes,
)

SCHEMA = StreamSchema((Field("patient", "long"), Field("hr", "double"),
                       Field("temp", "double"), Field("ward", "string")))
ALL = ("patient", "hr", "temp", "ward")


def sp(**kw):
    doc = {"srp": kw.pop("srp", ["doctor"]), "ts": kw.pop("ts", 1)}
    doc.update(kw)
    return parse_punctuation(doc, SCHEMA)


def seen(sps, roles, mode=REFINE, attrs=ALL, record=None):
    state = ShieldState()
    for p in sps:
        state.add(p)
    policy = state.policy()
    record = record or {}
    matched = frozenset(c for c in policy.conditions
                        if all(x.holds(record.get(x.attribute)) for x in c))
    return visible_attributes(policy, frozenset(roles), mode, attrs, matched)


@pytest.mark.parametrize("doc,message", [
    ([], "must be a JSON object"),
    ({"ts": 1}, "srp must be a list"),
    ({"srp": [], "ts": 1}, "srp must be a list"),
    ({"srp": ["a"]}, "ts must be an integer"),
    ({"srp": ["a"], "ts": True}, "ts must be an integer"),
    ({"srp": ["a"], "ts": 1, "sn": 0}, "sn must be an integer from 1"),
    ({"srp": ["a"], "ts": 1, "sign": "*"}, "sign must be"),
    ({"srp": ["a"], "ts": 1, "immutable": "yes"}, "immutable must be true or false"),
    ({"srp": ["a"], "ts": 1, "who": 1}, "unknown field(s) who"),
    ({"srp": ["a"], "ts": 1, "ddp": {"attributes": ["pulse"]}}, "'pulse' is not an attribute"),
    ({"srp": ["a"], "ts": 1, "ddp": {"tuples": [{"attribute": "ward", "op": "<",
                                                 "value": "x"}]}}, "only = and != compare"),
    ({"srp": ["a"], "ts": 1, "ddp": {"tuples": [{"attribute": "hr", "op": ">",
                                                 "value": "x"}]}}, "is not a double"),
    ({"srp": ["a"], "ts": 1, "ddp": {"rows": "all"}}, "ddp must be an object"),
])
def test_a_bad_punctuation_is_refused_saying_what_and_where(doc, message):
    with pytest.raises(PunctuationError) as err:
        parse_punctuation(doc, SCHEMA, "line 3")
    assert message in str(err.value) and str(err.value).startswith("line 3: $punctuation")


def test_the_record_form_round_trips():
    p = sp(srp=["nurse", "doctor"], sign="-", immutable=True, ts=7, sn=2,
           ddp={"tuples": [{"attribute": "patient", "op": ">=", "value": 120}],
                "attributes": ["HR"]})
    assert p.attributes == ("hr",) and p.roles == {"doctor", "nurse"}
    assert parse_punctuation(p.to_json(), SCHEMA) == p
    assert punctuation_from_json(p.to_json(), {f.name: f.type for f in SCHEMA.fields}) == p


def test_positive_punctuations_narrow_to_their_roles_and_negative_ones_deny():
    assert seen([sp(srp=["doctor"])], {"doctor"}) == set(ALL)
    assert seen([sp(srp=["doctor"])], {"nurse"}) == set()
    # two of one policy: union of their roles
    assert seen([sp(srp=["doctor"]), sp(srp=["nurse"], sn=2)], {"nurse"}) == set(ALL)
    assert seen([sp(srp=["guest"], sign="-")], {"guest", "doctor"}) == set()
    assert seen([sp(srp=["guest"], sign="-")], {"doctor"}) == set(ALL)


def test_attribute_and_tuple_level_punctuations():
    only_hr = sp(srp=["doctor"], ddp={"attributes": ["hr"]})
    assert seen([only_hr], {"nurse"}) == {"patient", "temp", "ward"}
    assert seen([only_hr], {"doctor"}) == set(ALL)
    ward = sp(srp=["icu"], ddp={"tuples": [{"attribute": "ward", "op": "=", "value": "icu"}]})
    assert seen([ward], {"nurse"}, record={"ward": "icu"}) == set()
    assert seen([ward], {"nurse"}, record={"ward": "er"}) == set(ALL)
    assert seen([ward], {"nurse"}, record={"ward": None}) == set(ALL)  # null: no match
    assert seen([ward], {"icu"}, record={"ward": "icu"}) == set(ALL)


def test_newer_policy_replaces_older_is_discarded_and_gaps_deny():
    state = ShieldState()
    state.add(sp(srp=["doctor"], ts=5))
    state.add(sp(srp=["nurse"], ts=9))  # a newer policy replaces
    assert visible_attributes(state.policy(), frozenset({"doctor"}), REFINE, ALL,
                              frozenset()) == set()
    state.add(sp(srp=["doctor"], ts=3))  # older: discarded, counted
    assert state.discarded == 1
    assert visible_attributes(state.policy(), frozenset({"nurse"}), REFINE, ALL,
                              frozenset()) == set(ALL)
    gap = [sp(srp=["nurse"], ts=11, sn=1), sp(srp=["nurse"], ts=11, sn=3)]
    assert seen(gap, {"nurse"}) == set()  # sn 2 missing: incomplete, denial by default


def test_immutable_punctuations_cannot_be_refined_away():
    fixed = sp(srp=["doctor", "nurse"], immutable=True, ts=1)
    later = sp(srp=["guest", "nurse"], ts=2)  # tries to give the stream to guest
    assert seen([fixed, later], {"guest"}) == set()
    assert seen([fixed, later], {"nurse"}) == set(ALL)
    assert seen([fixed, later], {"doctor"}) == set()  # narrowed by the later one: allowed
    hide = sp(srp=["guest"], sign="-", immutable=True, ts=1, ddp={"attributes": ["hr"]})
    assert seen([hide, sp(srp=["guest"], ts=2)], {"guest"}) == {"patient", "temp", "ward"}


def test_refine_never_widens_and_defer_lets_punctuations_decide():
    # refine: objects no positive punctuation covers are the policy's; a punctuation that
    # names the consumer's role adds nothing the plan does not already allow (the runtime
    # filters the plan's own rows: it never adds one)
    assert seen([], {"guest"}) == set(ALL)
    assert seen([sp(srp=["doctor"], ddp={"attributes": ["hr"]})], {"guest"}, DEFER) == set()
    assert seen([sp(srp=["guest"], ddp={"attributes": ["hr"]})], {"guest"}, DEFER) == {"hr"}
    assert seen([], {"doctor"}, DEFER) == set()  # no policy yet: denial by default


def test_a_row_whose_filtered_attribute_is_hidden_reaches_nobody():
    """A filter on an attribute a punctuation hides would tell how the hidden value compares:
    the row is dropped whatever the comparison gives."""
    hide_hr = sp(srp=["doctor"], ddp={"attributes": ["hr"]})
    state = ShieldState()
    state.add(hide_hr)
    policy = state.policy()
    assert visible_attributes(policy, frozenset({"nurse"}), REFINE, ("patient", "temp"),
                              frozenset()) == {"patient", "temp"}
    assert visible_attributes(policy, frozenset({"nurse"}), REFINE, ("patient", "temp"),
                              frozenset(), reads=("hr",)) == set()
    assert visible_attributes(policy, frozenset({"doctor"}), REFINE, ("patient",),
                              frozenset(), reads=("hr",)) == {"patient"}
    plan = ExecutionPlan("v", ((Predicate("hr", ">", 70.0), Predicate("ward", "=", "icu")),),
                         ("patient",))
    assert filter_attributes(plan) == ("hr", "ward")


def test_segments_start_where_their_punctuations_precede_a_tuple():
    starts, policies = segments([(1, sp(srp=["a"], ts=1)), (4, sp(srp=["b"], ts=2)),
                                 (4, sp(srp=["c"], ts=2, sn=2)), (9, sp(srp=["d"], ts=3))])
    assert starts == [1, 4, 9]
    assert [sorted(r for p in pol.current for r in p.roles) for pol in policies] == \
        [["a"], ["b", "c"], ["d"]]
    assert SegmentPolicy().empty


def test_the_oracle_reads_records_in_stream_order():
    records = [{"patient": 1, "hr": 80.0, "temp": 37.0, "ward": "er"},
               {"$punctuation": {"srp": ["doctor"], "ts": 1}},
               {"patient": 2, "hr": 90.0, "temp": 38.0, "ward": "er"},
               {"$punctuation": {"srp": ["nurse"], "ts": 2, "ddp": {"attributes": ["hr"]}}},
               {"patient": 3, "hr": 70.0, "temp": 36.0, "ward": "er"}]
    assert oracle(records, frozenset({"nurse"}), REFINE, ("patient", "hr"), SCHEMA) == [
        {"patient": 1, "hr": 80.0}, {"patient": 3, "hr": 70.0}]
    assert oracle(records, frozenset({"doctor"}), REFINE, ("patient", "hr"), SCHEMA) == [
        {"patient": 1, "hr": 80.0}, {"patient": 2, "hr": 90.0}, {"patient": 3, "hr": None}]


def test_an_unreadable_punctuation_denies_its_lane_until_a_newer_policy():
    """A files or kafka stream cannot refuse a `$punctuation` record that does not read
    (None): from it on nobody sees its lane's tuples, until a punctuation starts a policy newer
    than the current one; the oracle reads it alike."""
    starts, policies = lane_segments([(0, sp(srp=["a"], ts=2)), (3, None),
                                      (5, sp(srp=["a"], ts=2, sn=2)), (7, sp(srp=["a"], ts=3))])
    assert starts == [0, 3, 5, 7]
    assert [p.complete for p in policies] == [True, False, False, True]
    records = [{"$punctuation": {"srp": ["nurse"], "ts": 2}}, {"patient": 1},
               {"$punctuation": {"srp": "nurse", "ts": 9}}, {"patient": 2},
               {"$punctuation": {"srp": ["nurse"], "ts": 2, "sn": 2}}, {"patient": 3},
               {"$punctuation": {"srp": ["nurse"], "ts": 3}, "patient": 0}, {"patient": 4},
               {"$punctuation": {"srp": ["nurse"], "ts": 4}}, {"patient": 5}]
    assert oracle(records, frozenset({"nurse"}), REFINE, ("patient",), SCHEMA) == [
        {"patient": 1}, {"patient": 5}]


def test_a_join_of_a_files_or_kafka_stream_with_punctuations_is_refused():
    from pep.core.errors import Unprocessable
    kafka = StreamDefinition("v", "o", SCHEMA, SourceSpec("kafka", (("punctuations", "on"),)))
    off = StreamDefinition("w", "o", SCHEMA, SourceSpec("ingest", ()))
    join = JoinPlan(ExecutionPlan("v", None, ("hr",)), ExecutionPlan("w", None, ("hr",)),
                    (("patient", "patient"),), 5.0, "hr", "hr")
    with pytest.raises(Unprocessable, match="which a join does not read yet"):
        shielded_plan(join, [kafka, off], ["doctor"])
    plain = shielded_plan(ExecutionPlan("v", None, ("hr",)), [kafka], ["doctor"])
    assert isinstance(plain, ExecutionPlan) and plain.punctuation_roles == ("doctor",)


def test_every_kind_of_plan_runs_on_a_punctuated_stream_with_the_consumers_roles():
    on = StreamDefinition("v", "o", SCHEMA, SourceSpec("ingest", (("punctuations", "on"),)))
    off = StreamDefinition("w", "o", SCHEMA, SourceSpec("ingest", ()))
    plan = ExecutionPlan("v", None, ("hr",))
    assert shielded_plan(plan, [off], ["doctor"]) is plan
    shielded = shielded_plan(plan, [on], ["nurse", "doctor", "nurse"])
    assert isinstance(shielded, ExecutionPlan)
    assert shielded.punctuation_roles == ("doctor", "nurse") and shielded.key() != plan.key()
    windowed = ExecutionPlan("v", None, (), WindowSpec("tuple", 5, 5, (Aggregate("hr", "avg"),)))
    shielded = shielded_plan(windowed, [on], ["doctor"])
    assert isinstance(shielded, ExecutionPlan) and shielded.punctuation_roles == ("doctor",)
    assert shielded.window == windowed.window
    join = JoinPlan(plan, ExecutionPlan("w", None, ("hr",)), (("patient", "patient"),), 5.0,
                    "hr", "hr")
    joined = shielded_plan(join, [on, off], ["nurse", "doctor"])
    assert isinstance(joined, JoinPlan)  # the punctuated side carries the roles, the other not
    assert joined.left.punctuation_roles == ("doctor", "nurse")
    assert joined.right.punctuation_roles is None and joined.key() != join.key()
    union = shielded_plan(UnionPlan("v", (plan, replace(plan, projection=("temp",)))), [on],
                          ["doctor"])
    assert isinstance(union, UnionPlan)  # each member carries the roles
    assert [p.punctuation_roles for p in union.plans] == [("doctor",), ("doctor",)]


def test_a_tuple_counts_in_a_window_only_when_every_attribute_it_reads_is_visible():
    from pep.core.punctuations import counts_in_window

    def counts(sps, roles, reads, mode=REFINE):
        state = ShieldState()
        for p in sps:
            state.add(p)
        return counts_in_window(state.policy(), frozenset(roles), mode, reads, frozenset())

    hide_temp = [sp(srp=["nurse"], sign="-", ddp={"attributes": ["temp"]})]
    assert counts(hide_temp, ["nurse"], ("hr",))
    assert not counts(hide_temp, ["nurse"], ("hr", "temp"))  # the aggregate reads temp
    assert not counts([sp(srp=["doctor"])], ["nurse"], ("hr",))  # the whole tuple hidden
    assert counts([], ["nurse"], ("hr",)) and not counts([], ["nurse"], ("hr",), DEFER)
    assert not counts([], ["nurse"], ())  # a window that reads nothing counts nothing
    assert not counts([sp(srp=["nurse"], sn=2)], ["nurse"], ("hr",))  # incomplete
