"""Masks in the pure core (issue 24): the vocabulary, its order checked against what the masks
compute (a reference written here with exact decimals), the obligation, the merge with a
consumer's own masks and filter, the NR/PR analysis (exact for integer, timestamp and band masks,
checked exhaustively over a small domain; sound and flagged otherwise), the renderings, plans
and sharing rules."""
from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from decimal import ROUND_FLOOR, Decimal

import pytest

from pep.core.errors import NotPermitted
from pep.core.explain import graph_to_json, plan_to_json, render_sql
from pep.core.join import JoinSide, build_join
from pep.core.masks import (
    MaskError,
    at_least_as_coarse,
    compose,
    parse_assignment,
    parse_mask,
    policy_masks,
)
from pep.core.merge import merge
from pep.core.obligations import ObligationError, policy_graph
from pep.core.plan import ExecutionPlan, Field, Predicate, StreamSchema, plan_from_json
from pep.core.rules import (
    check_rule,
    describe_policy,
    rule_from_json,
    rule_from_xacml,
    rule_to_json,
    rule_to_xacml,
)
from pep.core.schemas import AIS_SCHEMA
from pep.core.userquery import UserQueryError, parse_json_query, parse_xml_query, user_graph
from tests.pep.core.helpers import ob

SCHEMA = StreamSchema((Field("n", "long"), Field("x", "double"), Field("s", "string"),
                       Field("t", "timestamp"), Field("b", "boolean")))


def masks_ob(*texts: str, prefix: str = "exacml:obligation:"):
    return ob("exacml:obligation:stream-mask", *[("stream-mask-attribute-id", t) for t in texts],
              prefix=prefix)


def filter_ob(text: str):
    return ob("exacml:obligation:stream-filter", ("stream-filter-condition-id", text))


def merged(obligations, query: dict | None = None, schema: StreamSchema = SCHEMA,
           stream: str = "s"):
    policy = policy_graph(obligations, stream, schema)
    user = None
    if query is not None:
        user = user_graph(parse_json_query(json.dumps(query)), stream, schema,
                          policy_masks(policy))
    return merge(policy, user, schema, time_attribute="t")


# -- the vocabulary ------------------------------------------------------------------------------

@pytest.mark.parametrize("text,spec", [
    ("round:10", "round:10"), ("ROUND: 10.50", "round:10.5"), ("grid:0.10", "grid:0.1"),
    ("truncate:Minute", "truncate:minute"), ("bands:0,10.0,20", "bands:0,10,20"),
    ("bands:-5,0", "bands:-5,0"), ("prefix:3", "prefix:3"), ("suffix:12", "suffix:12"),
    ("hash", "hash"), ("NULL", "null")])
def test_masks_read_to_a_canonical_spec(text, spec):
    assert parse_mask(text).spec == spec


@pytest.mark.parametrize("text,fragment", [
    ("", "empty"), ("blur", "unknown mask"), ("hash:1", "no parameter"), ("round", "parameter"),
    ("round:0", "above 0"), ("round:-1", "above 0"), ("round:1e3", "decimal"),
    ("round:nan", "decimal"), ("grid:200", "180"), ("truncate:week", "unit"),
    ("bands:10,5", "increasing"), ("bands:1,1", "increasing"), ("bands:" + ",".join(
        map(str, range(65))), "limit"), ("prefix:0", "1 to"), ("prefix:x", "whole number"),
    ("suffix:99999", "whole number"), ("round:" + "1" * 19, "decimal")])
def test_bad_masks_are_refused_saying_why(text, fragment):
    with pytest.raises(MaskError, match=fragment):
        parse_mask(text)


@pytest.mark.parametrize("text,fragment", [
    ("s:round:1", "does not apply to string"), ("x:hash", "does not apply to double"),
    ("b:round:1", "does not apply to boolean"), ("t:round:1", "does not apply to timestamp"),
    ("n:round:0.5", "whole number"), ("n:bands:0,0.5", "64-bit integers"),
    ("x:grid:0.1", "two attributes"), ("n,x:round:1", "one attribute"),
    ("x,s:grid:0.1", "does not apply to string"), ("q:null", "unknown attribute"),
    ("x,x:grid:1", "twice"), ("speed", "attribute:mask")])
def test_masks_on_the_wrong_attributes_are_refused(text, fragment):
    with pytest.raises(MaskError, match=fragment):
        parse_assignment(text, SCHEMA)


def test_a_grid_masks_a_pair_and_names_are_canonical():
    assert parse_assignment(" LAT , Lon :grid:0.5", AIS_SCHEMA) == [
        ("lat", parse_mask("grid:0.5")), ("lon", parse_mask("grid:0.5"))]


# -- the order, against the masks' values -----------------------------------------------------

def reference(mask, value):
    """What a mask gives, computed here exactly (decimals; the floor of every rounding)."""
    m = parse_mask(mask) if isinstance(mask, str) else mask
    if m is None:
        return value
    if m.kind == "null":
        return None
    if m.kind in ("round", "grid"):
        return (value / m.step).to_integral_value(rounding=ROUND_FLOOR) * m.step
    if m.kind == "bands":
        below = [e for e in m.edges if e <= value]
        return below[-1] if below else None
    if m.kind == "prefix":
        return value[:m.length]
    if m.kind == "suffix":
        return value[-m.length:]
    if m.kind == "truncate":
        unit = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}[m.unit]
        return value - value % unit
    return ("hash", value)


NUMBERS = [Decimal(i) / 4 for i in range(-120, 121)]
WORDS = ["", "a", "ab", "abc", "abd", "abcd", "bbcd", "xbcd", "abcde"]
NUMBER_MASKS = [None, "round:5", "round:10", "round:4", "round:6", "round:2.5", "grid:0.5",
                "grid:1", "bands:0,10,20", "bands:0,5,10,15,20", "bands:0,7", "bands:-10,0,10",
                "null"]
WORD_MASKS = [None, "prefix:2", "prefix:3", "suffix:2", "suffix:3", "hash", "null"]


def is_function_of(a, b, values) -> bool:
    """Whether a's value is determined by b's, over `values` (brute force)."""
    seen = {}
    for v in values:
        key, value = reference(b, v), reference(a, v)
        if key in seen and seen[key] != value:
            return False
        seen[key] = value
    return True


@pytest.mark.parametrize("masks,values", [(NUMBER_MASKS, NUMBERS), (WORD_MASKS, WORDS)])
def test_coarser_means_a_function_of_the_finer_value(masks, values):
    for a, b in itertools.product(masks, repeat=2):
        ma, mb = (parse_mask(x) if x else None for x in (a, b))
        if at_least_as_coarse(ma, mb):
            assert is_function_of(a, b, values), (a, b)


def test_the_order_per_kind():
    coarser = [("round:10", "round:5"), ("grid:1", "round:0.1"), ("bands:0,10,20", "round:5"),
               ("bands:0,10,20", "bands:0,5,10,15,20"), ("truncate:hour", "truncate:minute"),
               ("truncate:day", "truncate:second"), ("prefix:2", "prefix:3"),
               ("suffix:1", "suffix:4"), ("hash", "hash"), ("null", "hash"), ("null", "round:1")]
    for a, b in coarser:
        assert at_least_as_coarse(parse_mask(a), parse_mask(b)), (a, b)
        if a != b:
            assert not at_least_as_coarse(parse_mask(b), parse_mask(a)), (b, a)
    for a, b in [("round:4", "round:6"), ("prefix:2", "suffix:2"), ("hash", "prefix:3"),
                 ("bands:0,7", "round:5"), ("round:3", "bands:0,10")]:
        with pytest.raises(MaskError, match="cannot be composed"):
            compose(parse_mask(a), parse_mask(b), "x")
    assert compose(parse_mask("round:5"), parse_mask("round:10"), "x").spec == "round:10"
    assert at_least_as_coarse(parse_mask("round:1"), None)
    assert not at_least_as_coarse(None, parse_mask("round:1"))


# -- the obligation ------------------------------------------------------------------------------

def test_several_policies_masks_compose_to_the_coarsest_or_deny():
    graph = policy_graph([masks_ob("x:round:5", "s:prefix:3"), masks_ob("x:round:10"),
                          masks_ob("n:hash", prefix="pCloud:obligation:")], "s", SCHEMA)
    assert graph.mask.masks == (("n", "hash"), ("x", "round:10"), ("s", "prefix:3"))
    for obligations, fragment in [
            ([masks_ob("x:round:4"), masks_ob("x:round:6")], "cannot be composed"),
            ([masks_ob("x:blur:1")], "unknown mask"), ([masks_ob("s:round:1")], "does not apply"),
            ([masks_ob()], "lists no"), ([masks_ob("q:hash")], "unknown attribute")]:
        with pytest.raises(ObligationError, match=fragment):
            policy_graph(obligations, "s", SCHEMA)


# -- the merge -----------------------------------------------------------------------------------

def test_a_consumer_may_ask_coarser_never_finer():
    obligations = [masks_ob("x:round:5", "s:prefix:3")]
    result = merged(obligations, {"mask": {"x": "round:10", "n": "hash"}})
    assert dict(result.plan.masks) == {"n": "hash", "x": "round:10", "s": "prefix:3"}
    for query, name in [({"mask": {"x": "round:2"}}, "x"), ({"mask": {"s": "prefix:4"}}, "s"),
                        ({"mask": {"x": "round:7"}}, "x"), ({"mask": {"s": "hash"}}, "s")]:
        with pytest.raises(NotPermitted) as caught:
            merged(obligations, query)
        assert caught.value.details.get("attribute") == name, query
    hidden = [masks_ob("x:round:5"), ob("exacml:obligation:stream-map",
                                        ("stream-map-attribute-id", "x"))]
    with pytest.raises(NotPermitted, match="does not expose"):
        merged(hidden, {"mask": {"n": "hash"}})


def test_the_consumers_filter_reads_masked_values_and_the_policys_raw_ones():
    result = merged([filter_ob("x < 30"), masks_ob("x:round:5", "n:hash")],
                    {"filter": "x > 20 AND n = 'ab12'"})
    (conjunct,) = result.plan.filter_dnf
    assert set(conjunct) == {Predicate("x", ">", 20.0, "round:5"), Predicate("x", "<", 30.0),
                             Predicate("n", "=", "ab12", "hash")}
    sql = render_sql(result.plan, SCHEMA)
    assert "floor(`x` / 5) * 5 > 20" in sql and "`x` < 30" in sql
    assert "lower(hex(hmac(<owner's key>, CAST(CAST(`n` AS STRING) AS BINARY)))) = 'ab12'" in sql
    # the raw value of a hashed long cannot even be written
    with pytest.raises(UserQueryError, match="type mismatch"):
        merged([masks_ob("n:hash")], {"filter": "n = 5"})


def test_a_spatial_predicate_over_masked_coordinates_is_refused():
    with pytest.raises(NotPermitted, match="spatial predicate over masked"):
        merged([masks_ob("lat,lon:grid:0.1")], {"filter": "DISTANCE(lat, lon, 1, 100) < 9"},
               AIS_SCHEMA, "ais")


def nr(result) -> bool:
    return result.nr


@pytest.mark.parametrize("policy,query,is_nr", [
    ("n < 100", "n >= 100", True), ("n < 100", "n >= 90", False), ("n < 100", "n = 95", True),
    ("n < 100", "n = 90", False), ("n >= 5", "n <= -10", True), ("n >= 5", "n <= 0", False),
    ("n > 100", "n != 100", False), ("n >= 100 AND n < 110", "n != 100", True),
    ("t < '2025-01-01T10:00:30Z'", "t >= '2025-01-01T10:01:00Z'", True),
    ("t < '2025-01-01T10:00:30Z'", "t = '2025-01-01T10:00:00Z'", False),
    ("t < '2025-01-01T10:00:30Z'", "t = '2025-01-01T10:00:30Z'", True),
    ("x < 30", "x >= 30", True), ("x < 30", "x = 7", True), ("x < 30", "x = 25", False),
    ("x < 30", "x <= 25", False), ("x >= 0", "s = 'zz'", False), ("x >= 0", "b = true", True)])
def test_nr_on_masked_values(policy, query, is_nr):
    obligations = [filter_ob(policy), masks_ob("n:round:10", "t:truncate:minute", "x:round:5",
                                               "s:prefix:2", "b:null")]
    assert nr(merged(obligations, {"filter": query})) is is_nr


def test_a_filter_on_a_masked_value_that_cannot_be_decided_says_so():
    result = merged([filter_ob("x < 30"), masks_ob("x:round:5", "s:hash")],
                    {"filter": "x <= 25 AND s = 'ab'"})
    notes = [w for w in result.warnings if w.kind == "INFO" and w.operator == "filter"]
    assert len(notes) == 1 and "x (round:5)" in notes[0].message and "s (hash)" in notes[0].message
    exact = merged([filter_ob("n < 30"), masks_ob("n:round:10")], {"filter": "n <= 20"})
    assert not [w for w in exact.warnings if w.kind == "INFO"]


def brute_force(policy, user, mask, domain):
    values = [v for v in domain if policy(v) and user(reference(mask, v))]
    return not values, any(user(reference(mask, v)) and not policy(v) for v in domain)


OPS = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
       ">=": lambda a, b: a >= b, "=": lambda a, b: a == b, "!=": lambda a, b: a != b}


@pytest.mark.parametrize("mask", ["round:10", "round:3", "bands:-10,0,5,20", "bands:7"])
def test_nr_and_pr_are_exact_for_integer_and_band_masks(mask):
    """Every policy `n op1 c1` and query `masked n op2 c2` over small constants: NR and PR as a
    brute force over -100..100 finds them (the constraints are intervals near the constants,
    so a solution, if any, lies in that range)."""
    domain = [Decimal(v) for v in range(-100, 101)]
    constants = [-12, -10, -3, 0, 3, 5, 7, 9, 10, 20]
    m = parse_mask(mask)
    for (op1, c1), (op2, c2) in itertools.product(
            itertools.product(OPS, [-5, 0, 6, 10]), itertools.product(OPS, constants)):
        result = merged([filter_ob(f"n {op1} {c1}"), masks_ob(f"n:{mask}")],
                        {"filter": f"n {op2} {c2}"})

        def policy(v, op1=op1, c1=c1):
            return OPS[op1](v, c1)

        def user(w, op2=op2, c2=c2):
            return w is not None and OPS[op2](w, c2)
        want_nr, want_pr = brute_force(policy, user, m, domain)
        assert result.nr is want_nr, (op1, c1, op2, c2)
        if not want_nr:
            assert (result.filter_analysis.pr is True) is want_pr, (op1, c1, op2, c2)


def test_double_masks_never_claim_nr_falsely():
    domain = [Decimal(v) / 4 for v in range(-200, 201)]
    m = parse_mask("round:2.5")
    for (op1, c1), (op2, c2) in itertools.product(
            itertools.product(OPS, [-5, 0, 6]), itertools.product(OPS, [-5, 0, 2.5, 3, 7.5])):
        result = merged([filter_ob(f"x {op1} {c1}"), masks_ob("x:round:2.5")],
                        {"filter": f"x {op2} {c2}"})
        want_nr, _ = brute_force(lambda v, op1=op1, c1=c1: OPS[op1](v, Decimal(str(c1))),
                                 lambda w, op2=op2, c2=c2:
                                     w is not None and OPS[op2](w, Decimal(str(c2))),
                                 m, domain)
        if result.nr:
            assert want_nr, (op1, c1, op2, c2)


# -- windows -------------------------------------------------------------------------------------

def test_windows_aggregate_masked_values_and_a_time_mask_bounds_time_windows():
    obligations = [masks_ob("n:hash", "t:truncate:minute", "x:round:5")]
    result = merged(obligations, {"window": {"type": "time", "size": 120, "step": 60,
                                             "aggregates": ["x:avg", "n:count"],
                                             "keys": ["n"]}})
    # t is the window's time: its mask is the plan's, which the runtime windows by (issue 41)
    assert dict(result.plan.masks) == {"n": "hash", "t": "truncate:minute", "x": "round:5"}
    with pytest.raises(NotPermitted, match="whole multiples of 60"):
        merged(obligations, {"window": {"type": "time", "size": 90, "step": 60,
                                        "aggregates": ["x:avg"]}})
    with pytest.raises(UserQueryError, match="avg does not apply to string"):
        merged(obligations, {"window": {"type": "tuple", "size": 3, "step": 3,
                                        "aggregates": ["n:avg"]}})
    # the policy's own window over a now hashed attribute: that aggregate is withheld, said so
    windowed = obligations + [ob("exacml:obligation:stream-window",
                                 ("stream-window-type-id", "tuple"),
                                 ("stream-window-size-id", "4"), ("stream-window-step-id", "4"),
                                 ("stream-window-attr-id", "n:sum"),
                                 ("stream-window-attr-id", "x:max"))]
    result = merged(windowed)
    assert [a.output_name for a in result.plan.window.aggregates] == ["max_x"]
    assert any("sum(n) is withheld" in w.message for w in result.warnings)
    with pytest.raises(NotPermitted, match="only as .null.: a time window"):
        merged([masks_ob("t:null")], {"window": {"type": "time", "size": 60, "step": 60,
                                                 "aggregates": ["x:sum"]}})


# -- a masked time (issue 41): what orders and places tuples in time reads it masked ------------

@pytest.mark.parametrize("query", [
    None, {"map": ["x"]}, {"map": ["t", "x"]},
    {"window": {"type": "tuple", "size": 3, "step": 1, "aggregates": ["x:firstval"]}},
    {"window": {"type": "time", "size": 60, "step": 60, "aggregates": ["x:lastval"]}},
    {"window": {"type": "time", "size": 120, "step": 60, "aggregates": ["t:lastval"]}}])
def test_a_masked_time_is_among_the_plans_masks_whatever_it_outputs(query):
    """The time attribute orders a plan's rows (on sources without a stream position) and its
    tuple windows, and places time windows' tuples and moves their clock: the runtime reads it
    under the plan's masks, so its mask is one of them even when the plan shows no time."""
    result = merged([masks_ob("t:truncate:minute", "x:round:5")], query)
    assert dict(result.plan.masks)["t"] == "truncate:minute"
    graph = [op["op"] for op in graph_to_json(result.graph, SCHEMA)["operators"]]
    assert "mask" in graph  # the masks come right after the filter, before map and window
    sql = render_sql(result.plan, SCHEMA)
    assert "t as truncate:minute" in sql
    if result.plan.window is not None and result.plan.window.kind == "time":
        assert "date_trunc('MINUTE', `t`) AS `t`" in sql  # what the windows read
    unmasked = merged([masks_ob("x:round:5")], query)
    assert "t" not in dict(unmasked.plan.masks)


def map_ob(*names: str):
    return ob("exacml:obligation:stream-map", *[("stream-map-attribute-id", n) for n in names])


@pytest.mark.parametrize("query", [
    None, {"map": ["x"]},
    {"window": {"type": "tuple", "size": 3, "step": 1, "aggregates": ["x:firstval"]}}])
def test_a_time_the_policy_hides_orders_nothing(query):
    """A policy that hides the time attribute (its map leaves it out, no mask): on sources
    without a stream position the runtime orders rows and tuple windows by the time, so the
    order of the delivered rows would tell the order of the hidden times. The plan masks it
    as null: its rows keep stream order alone (file, position)."""
    result = merged([map_ob("n", "x")], query)
    assert dict(result.plan.masks) == {"t": "null"} and result.hidden_time == "t"
    assert "t" not in result.plan.projection
    # shown: the time, a masked time, or the consumer's own map leaving it out: unchanged
    for obligations, q in (([], query), ([], {"map": ["x"]}),
                           ([map_ob("n", "x", "t")], query)):
        other = merged(obligations, q)
        assert "t" not in dict(other.plan.masks) and other.hidden_time is None
    masked = merged([map_ob("n", "x"), masks_ob("t:truncate:minute")], query)
    assert dict(masked.plan.masks)["t"] == "truncate:minute"
    # the stream's time attribute named in another case is the same attribute
    policy = policy_graph([map_ob("n", "x", "t")], "s", SCHEMA)
    assert merge(policy, None, SCHEMA, time_attribute="T").hidden_time is None
    hidden = merge(policy_graph([map_ob("n", "x")], "s", SCHEMA), None, SCHEMA,
                   time_attribute="T")
    assert dict(hidden.plan.masks) == {"t": "null"}


def test_a_time_window_over_a_hidden_time_keeps_it():
    """The owner's policy may window by a time it hides: the windows need it, and their bounds
    are what the owner chose to show."""
    window = ob("exacml:obligation:stream-window", ("stream-window-type-id", "time"),
                ("stream-window-size-id", "60"), ("stream-window-step-id", "60"),
                ("stream-window-attr-id", "x:sum"))
    result = merged([map_ob("n", "x"), window])
    assert result.plan.window is not None and result.plan.window.kind == "time"
    assert "t" not in dict(result.plan.masks) and result.hidden_time is None


def test_a_union_member_that_hides_the_time_still_unites():
    """In union mode a tuple is delivered once for several grants: its order cannot be each
    grant's own, so the hidden time's null mask is left out there (not refused as masks are)."""
    from pep.core.union import Alternative, merge_union
    hides = Alternative(("hides-t",), policy_graph([map_ob("n", "x"), filter_ob("x > 3")], "s",
                                                   SCHEMA))
    shows = Alternative(("shows-t",), policy_graph([filter_ob("n > 3")], "s", SCHEMA))
    united = merge_union([hides, shows], None, SCHEMA, time_attribute="t")
    assert len(united.plan.plans) == 2 and all(not plan.masks for plan in united.plan.plans)


def test_time_windows_over_a_masked_time_need_a_time_that_orders():
    for mask in ("t:null", ):
        with pytest.raises(NotPermitted, match="a time window over it would reveal its time"):
            merged([masks_ob(mask)], {"window": {"type": "time", "size": 60, "step": 60,
                                                 "aggregates": ["x:sum"]}})
    schema = StreamSchema((Field("n", "long"), Field("x", "double")))
    policy = policy_graph([masks_ob("n:hash")], "s", schema)
    user = user_graph(parse_json_query(json.dumps({"window": {
        "type": "time", "size": 60, "step": 60, "aggregates": ["x:sum"]}})), "s", schema,
        policy_masks(policy))
    with pytest.raises(NotPermitted, match="'n' only as 'hash'"):
        merge(policy, user, schema, time_attribute="n")


def test_a_union_with_a_grant_that_masks_the_time_is_refused():
    """Union members share the runtime's machinery, but a tuple delivered once for several
    grants has no one masked form of its time (order, windows): refused, as any union of a
    masked grant is; a grant that masks the time alone works as under intersection."""
    from pep.core.union import Alternative, merge_union
    window = {"window": {"type": "time", "size": 60, "step": 60, "aggregates": ["x:firstval"]}}
    user = user_graph(parse_json_query(json.dumps(window)), "s", SCHEMA)
    masked_time = Alternative(("masks-t",), policy_graph([masks_ob("t:truncate:minute")], "s",
                                                         SCHEMA))
    other = Alternative(("raw",), policy_graph([filter_ob("x > 3")], "s", SCHEMA))
    with pytest.raises(NotPermitted, match="masks-t.*masks, which union mode cannot combine"):
        merge_union([masked_time, other], user, SCHEMA, time_attribute="t")
    alone = merge_union([masked_time], user, SCHEMA, time_attribute="t")
    assert dict(alone.plan.masks) == {"t": "truncate:minute"}


# -- joins ---------------------------------------------------------------------------------------

def test_a_join_bounds_and_windows_a_masked_time_by_the_masked_value():
    """A windowed side's time is the masked time (its mask is among the side's masks, which the
    runtime applies before the window and the watermark); a plain side's time bound reads the
    masked time it outputs, and a mask that leaves no time (null, hash) is refused naming it."""
    left_schema = StreamSchema((Field("t", "timestamp"), Field("v", "double"),
                                Field("id", "long")))
    right_schema = StreamSchema((Field("ts", "long"), Field("w", "double"), Field("id", "long")))

    def side(stream, schema, obligations, query, time):
        policy = policy_graph(obligations, stream, schema)
        user = user_graph(parse_json_query(json.dumps(query)), stream, schema,
                          policy_masks(policy))
        return JoinSide(stream, schema, merge(policy, user, schema, time_attribute=time),
                        policy, user, time)

    left = side("a", left_schema, [masks_ob("t:truncate:minute")], {"window": {
        "type": "time", "size": 60, "step": 60, "keys": ["id"],
        "aggregates": ["v:firstval", "v:lastval"]}}, "t")
    right = side("b", right_schema, [masks_ob("ts:round:60")], {}, "ts")
    query = parse_json_query(json.dumps({"join": {"stream": "b", "on": [["id", "id"]],
                                                  "within": 5}})).join
    plan = build_join(left, right, query).plan
    assert dict(plan.left.masks) == {"t": "truncate:minute"}
    assert dict(plan.right.masks) == {"ts": "round:60"} and plan.right_time == "ts"
    for mask in ("ts:hash", "ts:null"):
        hidden = side("b", right_schema, [masks_ob(mask)], {}, "ts")
        with pytest.raises(NotPermitted, match="time attribute 'ts' only as"):
            build_join(left, hidden, query)
    # a policy that hides the time (its map leaves it out): no time to bound a join with either
    hidden = side("b", right_schema, [map_ob("w", "id")], {}, "ts")
    with pytest.raises(NotPermitted, match="bound uses attribute 'ts'.*policy hides"):
        build_join(left, hidden, query)


def test_joins_compare_masked_values_and_claim_no_nr_from_raw_filters():
    left_schema = StreamSchema((Field("t", "timestamp"), Field("v", "double"),
                                Field("id", "long")))
    right_schema = StreamSchema((Field("ts", "timestamp"), Field("w", "double"),
                                 Field("id", "long"), Field("raw", "long")))

    def side(stream, schema, obligations, query):
        policy = policy_graph(obligations, stream, schema)
        user = user_graph(parse_json_query(json.dumps(query)), stream, schema,
                          policy_masks(policy))
        return JoinSide(stream, schema, merge(policy, user, schema), policy, user,
                        "t" if stream == "a" else "ts")

    left = side("a", left_schema, [filter_ob("v >= 15"), masks_ob("v:round:10", "id:hash")], {})
    right = side("b", right_schema, [filter_ob("w < 12"), masks_ob("id:hash")], {})
    query = parse_json_query(json.dumps({"join": {"stream": "b", "on": [["v", "w"]],
                                                  "within": 5}})).join
    result = build_join(left, right, query)
    assert not result.nr  # raw v >= 15 and w < 12, but a masked v may be 10
    query = parse_json_query(json.dumps({"join": {"stream": "b", "on": [["id", "id"]],
                                                  "within": 5}})).join
    result = build_join(left, right, query)
    assert any(w.kind == "INFO" and "same owner" in w.message for w in result.warnings)
    query = parse_json_query(json.dumps({"join": {"stream": "b", "on": [["id", "raw"]],
                                                  "within": 5}})).join
    with pytest.raises(Exception, match="same kind"):
        build_join(left, right, query)


# -- renderings, plans, user queries, rules -------------------------------------------------------

def test_explain_shows_every_mask_and_never_a_key():
    obligations = [masks_ob("mmsi:hash", "shipname:prefix:3", "shiptype:suffix:2",
                            "lat,lon:grid:0.1", "speed:bands:0,10,20", "course:null",
                            "ts:truncate:hour")]
    result = merged(obligations, None, AIS_SCHEMA, "ais")
    sql = render_sql(result.plan, AIS_SCHEMA)
    for text in ("left(`shipname`, 3) AS `shipname`", "right(`shiptype`, 2) AS `shiptype`",
                 "floor(`lat` / 0.1) * 0.1 AS `lat`",
                 "CASE WHEN `speed` >= 20 THEN 20 WHEN `speed` >= 10 THEN 10 WHEN `speed` >= 0 "
                 "THEN 0 END AS `speed`", "CAST(NULL AS DOUBLE) AS `course`",
                 "date_trunc('HOUR', `ts`) AS `ts`", "hmac(<owner's key>"):
        assert text in sql, text
    doc = plan_to_json(result.plan)
    assert doc["masks"]["lat"] == "grid:0.1" and doc["masks"]["mmsi"] == "hash"
    ops = graph_to_json(result.graph, AIS_SCHEMA)["operators"]
    assert [o["op"] for o in ops] == ["source", "mask", "map"]


def test_plans_without_masks_keep_their_keys_and_masked_ones_travel():
    plain = ExecutionPlan("s", ((Predicate("x", ">", 1.0),),), ("x",))
    assert "mask" not in plain.canonical_json()
    masked = ExecutionPlan("s", ((Predicate("x", ">", 1.0, "round:5"),),), ("x",),
                           masks=(("x", "round:5"),))
    assert masked.key() != plain.key()
    assert plan_from_json(masked.canonical_json()) == masked
    assert plan_from_json(plain.canonical_json()).key() == plain.key()


def test_user_queries_carry_masks_in_json_and_xml():
    assert parse_json_query('{"mask": {"x": "round:10", "lat,lon": "grid:1"}}').masks == (
        "x:round:10", "lat,lon:grid:1")
    assert parse_json_query('{"mask": ["x:round:10"]}').masks == ("x:round:10",)
    xml = b"<UserQuery><Mask><Attribute>x:round:10</Attribute></Mask></UserQuery>"
    assert parse_xml_query(xml).masks == ("x:round:10",)
    for bad in ('{"mask": "x"}', '{"mask": {"x": 5}}', '{"mask": [1]}'):
        with pytest.raises(UserQueryError):
            parse_json_query(bad)
    with pytest.raises(UserQueryError, match="masked twice"):
        user_graph(parse_json_query('{"mask": ["x:round:10", "x:round:20"]}'), "s", SCHEMA)
    with pytest.raises(UserQueryError, match="unknown mask"):
        user_graph(parse_json_query('{"mask": {"x": "blur"}}'), "s", SCHEMA)


def test_a_rules_mask_compiles_decompiles_and_is_summarised():
    rule = rule_from_json({"stream": "ais", "who": {"roles": ["port-authority"]},
                           "mask": {"lat,lon": "grid:0.10", "mmsi": "hash",
                                    "speed": "bands:0,5,10"}})
    assert rule.masks == (("lat,lon", "grid:0.1"), ("mmsi", "hash"), ("speed", "bands:0,5,10"))
    xacml = rule_to_xacml(rule)
    assert b"exacml:obligation:stream-mask" in xacml and b"lat,lon:grid:0.1" in xacml
    assert rule_from_xacml(xacml) == rule
    assert rule_from_json(rule_to_json(rule)) == rule
    summary = describe_policy(xacml)["summary"]
    assert "lat and lon as grid:0.1, mmsi as hash, speed as bands:0,5,10" in summary
    from pep.core.plan import SourceSpec, StreamDefinition
    ais = StreamDefinition("ais", "nea", AIS_SCHEMA, SourceSpec("ingest"), "ts")
    with pytest.raises(Exception, match="/mask/shipname"):
        check_rule(rule_from_json({"stream": "ais", "who": "anyone",
                                   "mask": {"shipname": "round:1"}}), ais)
    with pytest.raises(Exception, match="/mask/speed"):
        rule_from_json({"stream": "ais", "who": "anyone", "mask": {"speed": "blur"}})


def test_truncated_timestamps_step_by_whole_units():
    base = datetime(2025, 1, 1, 10, 0, tzinfo=UTC)
    for minutes in (0, 1, 59):
        t = base + timedelta(minutes=minutes, seconds=59, microseconds=999_999)
        seconds = Decimal(int(t.timestamp()))
        assert reference("truncate:minute", seconds) == Decimal(
            int((base + timedelta(minutes=minutes)).timestamp()))
