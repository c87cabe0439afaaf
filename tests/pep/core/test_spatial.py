"""Spatial predicates in the condition language (issue 14): DISTANCE, DISTANCE_TO and
WITHIN_POLYGON parsed, bound, type-checked, written back, evaluated; placeholders from the
gateway's identity only; hostile input refused with what and where; the NR/PR analysis sound
(never a false NR, never a missed PR) against brute force over sampled positions."""
from __future__ import annotations

import json
import math
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from common.auth import Identity
from pep.core import geo
from pep.core.access import caller_resolver
from pep.core.analysis import analyse_filter
from pep.core.conditions import (
    ConditionError,
    Not,
    Spatial,
    evaluate,
    parse_condition,
    spatial_parts,
    to_text,
)
from pep.core.explain import filter_sql, plan_to_json, render_sql
from pep.core.graph import AIS_SCHEMA, pipeline_graph
from pep.core.merge import QueryRefused, merge
from pep.core.plan import ExecutionPlan, plan_from_json
from pep.core.userquery import UserQueryError, parse_json_query, parse_xml_query, user_graph

PORT = (1.264, 103.84)
SQUARE = "[1.15, 103.6, 1.15, 104.05, 1.30, 104.05, 1.30, 103.6]"
NOTCH = "[0, 0, 0, 4, 4, 4, 4, 0, 2, 2]"  # (lat, lon) pairs; concave: a notch cut in from lon 0


def ship(lat, lon, mmsi=1, **kw):
    return {"mmsi": mmsi, "shipname": "x", "shiptype": "cargo", "lat": lat, "lon": lon,
            "speed": 3.0, "course": 0.0, "ts": 0.0, **kw}


# -- geometry --------------------------------------------------------------------------------------

def test_haversine_on_the_mean_radius_sphere():
    one_degree = 2 * math.pi * geo.EARTH_RADIUS_M / 360
    assert geo.haversine(0, 0, 1, 0) == pytest.approx(one_degree, rel=1e-12)
    assert geo.haversine(10, 20, 10, 20) == 0.0
    assert geo.haversine(0, 0, 0, 180) == pytest.approx(geo.MAX_DISTANCE_M, rel=1e-12)
    assert geo.haversine(89, 0, -89, 180) <= geo.MAX_DISTANCE_M
    # Singapore to Jakarta, about 880 km on the sphere
    assert 870_000 < geo.haversine(1.264, 103.84, -6.2, 106.8) < 900_000


@pytest.mark.parametrize("lat, lon, inside", [
    (3, 3, True), (2.5, 2, True), (0.5, 3, True),  # inside
    (1, 1, True), (3, 1, True),                    # on the notch's edges
    (2, 1, False), (2.5, 1, False), (3.9, 0.05, False),  # in the notch
    (0, 2, True), (2, 2, True), (4, 4, True),      # on an edge, on the notch's vertex, a corner
    (5, 1, False), (-0.0001, 1, False), (2, -1, False), (2, 4.000001, False),
])
def test_polygon_even_odd_with_the_boundary_inside(lat, lon, inside):
    points = json.loads(NOTCH)
    assert geo.in_polygon(lat, lon, points) is inside
    expr = parse_condition(f"WITHIN_POLYGON(lat, lon, {NOTCH})", AIS_SCHEMA)
    assert evaluate(expr, ship(lat, lon)) is inside
    assert evaluate(Not(expr), ship(lat, lon)) is (not inside)


def test_convexity_and_bounding_boxes():
    assert geo.convex(json.loads(SQUARE.replace("[", "[").replace("]", "]")))
    assert not geo.convex(json.loads(NOTCH))
    assert not geo.convex([0, 0, 0, 1, 1, 0, 1, 1])  # a bow tie winds twice
    south, north, west, east = geo.circle_bbox(*PORT, 92_600)
    for bearing in range(0, 360, 5):  # points on the circle lie in the box
        d = 92_600 / geo.EARTH_RADIUS_M
        b = math.radians(bearing)
        la1 = math.radians(PORT[0])
        la2 = math.asin(math.sin(la1) * math.cos(d) + math.cos(la1) * math.sin(d) * math.cos(b))
        lo2 = math.radians(PORT[1]) + math.atan2(math.sin(b) * math.sin(d) * math.cos(la1),
                                                 math.cos(d) - math.sin(la1) * math.sin(la2))
        assert south <= math.degrees(la2) <= north and west <= math.degrees(lo2) <= east
    assert geo.circle_bbox(89.5, 0, 100_000)[2:] == (None, None)  # a pole within reach


# -- parse, bind, text ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "DISTANCE(lat, lon, 1.264, 103.84) <= 92600",
    "distance(LAT, Lon, -1.5, 103) > 0.5",
    "DISTANCE_TO(lat, lon, mmsi, 244000001) <= 370400",
    "DISTANCE_TO(lat, lon, shipname, 'O\\'Neil') < 1000",
    f"WITHIN_POLYGON(lat, lon, {SQUARE})",
    f"NOT WITHIN_POLYGON(lat, lon, {NOTCH}) AND speed > 2",
    f"(DISTANCE(lat, lon, 1, 103) >= 10 OR WITHIN_POLYGON(lat, lon, {SQUARE})) AND mmsi != 3",
])
def test_canonical_text_parses_back(text):
    expr = parse_condition(text, AIS_SCHEMA)
    again = parse_condition(to_text(expr), AIS_SCHEMA)
    assert to_text(again) == to_text(expr)
    assert [s.to_predicate() for s in spatial_parts(again)] == \
        [s.to_predicate() for s in spatial_parts(expr)]


def test_binding_types_the_arguments():
    (d,) = spatial_parts(parse_condition("DISTANCE(LAT, LON, 1, 103) <= 5", AIS_SCHEMA))
    assert (d.latitude, d.longitude, d.points, d.radius) == ("lat", "lon", (1.0, 103.0), 5.0)
    (a,) = spatial_parts(parse_condition("DISTANCE_TO(lat, lon, MMSI, 7) < 9", AIS_SCHEMA))
    assert (a.key, a.key_value, a.points) == ("mmsi", 7, ())
    (p,) = spatial_parts(parse_condition(f"WITHIN_POLYGON(lat, lon, {SQUARE})", AIS_SCHEMA))
    assert p.points == tuple(float(v) for v in json.loads(SQUARE)) and p.op == "="
    # an attribute may still be called `distance`
    from pep.core.plan import Field, StreamSchema
    schema = StreamSchema((Field("distance", "double"), Field("lat", "double"),
                           Field("lon", "double")))
    assert to_text(parse_condition("distance > 3 AND DISTANCE(lat, lon, 0, 0) < 9", schema)) == \
        "distance > 3 AND DISTANCE(lat, lon, 0, 0) < 9"


def test_placeholders_stand_only_for_what_the_gateway_vouches_for():
    bounds = (1.15, 103.6, 1.15, 104.05, 1.30, 104.05, 1.30, 103.6, 1.15, 103.6)  # closed ring
    authority = Identity("mpa", ("port-authority",), attributes=(
        ("urn:xsg:port-bounds", bounds), ("urn:xsg:port-lat", (1.264,)),
        ("urn:xsg:port-lon", (103.84,)), ("urn:xsg:ship-mmsi", (244000001,))))
    resolve = caller_resolver(authority, "ais")
    (p,) = spatial_parts(parse_condition("WITHIN_POLYGON(lat, lon, {subject:port-bounds})",
                                         AIS_SCHEMA, resolver=resolve))
    assert p.points == bounds  # in the bag's order, repeated values kept
    (d,) = spatial_parts(parse_condition(
        "DISTANCE(lat, lon, {subject:port-lat}, {subject:port-lon}) <= 92600", AIS_SCHEMA,
        resolver=resolve))
    assert d.points == (1.264, 103.84)
    (a,) = spatial_parts(parse_condition("DISTANCE_TO(lat, lon, mmsi, {subject:ship-mmsi}) <= 1",
                                         AIS_SCHEMA, resolver=resolve))
    assert a.key_value == 244000001
    for text, fragment in [
        ("WITHIN_POLYGON(lat, lon, {subject:port-lat})", "count must be even"),
        ("DISTANCE(lat, lon, {subject:port-bounds}, 1) <= 5", "exactly one is needed"),
        ("DISTANCE(lat, lon, {subject:nothing}, 1) <= 5", "no such attribute"),
        ("DISTANCE(lat, lon, {subject:subject-id}, 1) <= 5", "not a valid double"),
        ("DISTANCE_TO(lat, lon, mmsi, {subject:role}) <= 5", "not a valid long"),
    ]:
        with pytest.raises(ConditionError, match=re.escape(fragment)):
            parse_condition(text, AIS_SCHEMA, resolver=resolve)
    odd = Identity("x", attributes=(("urn:xsg:port-bounds", (1.0, 2.0, 3.0, 4.0, 5.0)),))
    with pytest.raises(ConditionError, match="count must be even"):
        parse_condition("WITHIN_POLYGON(lat, lon, {subject:port-bounds})", AIS_SCHEMA,
                        resolver=caller_resolver(odd, "ais"))
    huge = Identity("x", attributes=(("urn:xsg:port-bounds", tuple([1.0] * 2002)),))
    with pytest.raises(ConditionError, match="at most 1000 vertices"):
        parse_condition("WITHIN_POLYGON(lat, lon, {subject:port-bounds})", AIS_SCHEMA,
                        resolver=caller_resolver(huge, "ais"))
    with pytest.raises(ConditionError, match="not allowed here"):
        parse_condition("DISTANCE(lat, lon, {subject:port-lat}, 1) <= 5", AIS_SCHEMA,
                        allow_placeholders=False)


HOSTILE = [
    ("DISTANCE(", "four arguments"),
    ("DISTANCE(lat, lon", "found the end"),
    ("DISTANCE(lat, lon, 1, 2)", "must be compared with a distance"),
    ("DISTANCE(lat, lon, 1, 2) <= 'x'", "needs a distance in metres"),
    ("DISTANCE(lat, lon, 1e308, 2) <= 5", "is not a latitude"),
    ("DISTANCE(lat, lon, 1, -1e308) <= 5", "is not a longitude"),
    ("DISTANCE(lat, lon, NaN, 2) <= 5", "NaN and infinity"),
    ("DISTANCE(lat, lon, 1, Infinity) <= 5", "NaN and infinity"),
    ("DISTANCE(lat, lon, 1, 2) <= 1e999", "not finite"),
    ("DISTANCE(lat, lon, 1, 2) <= -5", "negative"),
    ("DISTANCE(lat, lon, 1, 2, 3) <= 5", "four arguments"),
    ("DISTANCE(lat, lon, 'a', 2) <= 5", "a number or a placeholder"),
    ("DISTANCE(shipname, lon, 1, 2) <= 5", "numeric attributes"),
    ("DISTANCE(lat, lat, 1, 2) <= 5", "the same attribute"),
    ("DISTANCE(lat, nope, 1, 2) <= 5", "unknown attribute 'nope'"),
    ("DISTANCE(lat, lon, 1, 2) = 5", "compared with <, <=, > or >="),
    ("WITHIN_POLYGON(lat, lon, [1, 2, 3, 4])", "at least 3"),
    ("WITHIN_POLYGON(lat, lon, [1, 2, 3, 4, 5])", "must be even"),
    ("WITHIN_POLYGON(lat, lon, [1, 2, 3, 4, 5, 1e308])", "is not a longitude"),
    ("WITHIN_POLYGON(lat, lon, [91, 2, 3, 4, 5, 6])", "is not a latitude"),
    ("WITHIN_POLYGON(lat, lon, ['a', 2, 3, 4, 5, 6])", "expected a number"),
    ("WITHIN_POLYGON(lat, lon, [1, 2, 3, 4, 5, 6,])", "expected a number"),
    ("WITHIN_POLYGON(lat, lon, [1, 2, 3, 4, 5, 6]", "three arguments"),
    ("WITHIN_POLYGON(lat, lon)", "three arguments"),
    ("WITHIN_POLYGON(lat, lon, [" + ", ".join(["1"] * 2002) + "])", "at most 1000 vertices"),
    ("DISTANCE_TO(lat, lon, mmsi) <= 5", "four arguments"),
    ("DISTANCE_TO(lat, lon, mmsi, 'x') <= 5", "type mismatch"),
    ("DISTANCE_TO(lat, lon, lat, 1) <= 5", "cannot be a coordinate"),
    ("DISTANCE_TO(lat, lon, nope, 1) <= 5", "unknown key attribute"),
]


@pytest.mark.parametrize("text, fragment", HOSTILE)
def test_hostile_spatial_conditions_say_what_and_where(text, fragment):
    with pytest.raises(ConditionError, match=re.escape(fragment)) as info:
        parse_condition(text, AIS_SCHEMA)
    assert info.value.position is not None


_TOKENS = ["DISTANCE", "DISTANCE_TO", "WITHIN_POLYGON", "(", ")", "[", "]", ",", "lat", "lon",
           "mmsi", "1", "-2.5", "1e308", "<=", ">", "{subject:x}", "'s'", "NOT", "AND", "{"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_TOKENS), max_size=20).map(" ".join))
def test_any_token_soup_is_parsed_or_refused_cleanly(text):
    try:
        parse_condition(text, AIS_SCHEMA, resolver=lambda c, a: ["1.5", "2"])
    except ConditionError:
        pass


# -- evaluation ----------------------------------------------------------------------------------

def test_a_tuple_without_a_position_fails_both_ways():
    for text in ("DISTANCE(lat, lon, 1, 103) <= 1e7", f"WITHIN_POLYGON(lat, lon, {SQUARE})",
                 "DISTANCE_TO(lat, lon, mmsi, 5) <= 1e7"):
        expr = parse_condition(text, AIS_SCHEMA)
        for bad in (ship(None, 103.8), ship(1.2, None), ship(float("nan"), 103.8),
                    ship(95.0, 103.8), ship(1.2, 181.0)):
            assert evaluate(expr, bad, anchor=lambda *a: (1.2, 103.8)) is False
            assert evaluate(Not(expr), bad, anchor=lambda *a: (1.2, 103.8)) is False


def test_distance_to_needs_a_known_anchor():
    expr = parse_condition("DISTANCE_TO(lat, lon, mmsi, 7) <= 1000", AIS_SCHEMA)
    near = ship(1.2, 103.8)
    assert evaluate(expr, near) is False and evaluate(Not(expr), near) is False
    seen = []
    assert evaluate(expr, near, anchor=lambda *a: seen.append(a) or (1.2, 103.805)) is True
    assert seen == [("mmsi", 7, "lat", "lon")]
    assert evaluate(expr, near, anchor=lambda *a: (1.3, 103.8)) is False
    assert evaluate(expr, near, anchor=lambda *a: (float("nan"), 103.8)) is False


# -- the plan and its renderings -------------------------------------------------------------------

def test_plans_keep_spatial_predicates_through_json_and_show_them():
    expr = parse_condition(f"DISTANCE(lat, lon, 1.264, 103.84) <= 92600 AND NOT WITHIN_POLYGON("
                           f"lat, lon, {SQUARE}) AND DISTANCE_TO(lat, lon, shipname, 'a') > 5",
                           AIS_SCHEMA)
    analysis = analyse_filter(expr, None, AIS_SCHEMA)
    plan = ExecutionPlan("ais", analysis.filter_dnf, ("mmsi",))
    again = plan_from_json(plan.canonical_json())
    assert again == plan and again.key() == plan.key()
    sql = filter_sql(plan.filter_dnf, AIS_SCHEMA)
    assert "DISTANCE(`lat`, `lon`, 1.264, 103.84) <= 92600" in sql
    assert "NOT WITHIN_POLYGON(`lat`, `lon`, ARRAY(1.15, 103.6," in sql
    assert "DISTANCE_TO(`lat`, `lon`, `shipname`, 'a') > 5" in sql
    shown = plan_to_json(plan)["filter"][0]
    assert {"function": "distance", "attributes": ["lat", "lon"], "op": "<=", "metres": 92600.0,
            "point": [1.264, 103.84]} in shown
    assert any(p.get("anchor") == {"attribute": "shipname", "value": "a"} for p in shown)
    assert "WITHIN_POLYGON" in render_sql(plan, AIS_SCHEMA)


# -- analysis --------------------------------------------------------------------------------------

def analyse(policy, user):
    return analyse_filter(parse_condition(policy, AIS_SCHEMA) if policy else None,
                          parse_condition(user, AIS_SCHEMA) if user else None, AIS_SCHEMA)


def kinds(result):
    return {w.kind for w in result.warnings}


def test_circles_imply_circles_and_disjoint_ones_give_nr():
    policy = "DISTANCE(lat, lon, 1.264, 103.84) <= 92600"
    assert kinds(analyse(policy, "DISTANCE(lat, lon, 1.264, 103.84) <= 20000")) == set()
    assert kinds(analyse(policy, "DISTANCE(lat, lon, 1.8, 103.9) <= 20000")) == set()  # inside
    r = analyse(policy, "DISTANCE(lat, lon, 1.8, 103.9) <= 40000")  # pokes out
    assert kinds(r) == {"PR"} and "cannot decide exactly" in r.warnings[0].message
    r = analyse(policy, "DISTANCE(lat, lon, 4.9, 103.84) <= 20000")  # ~400 km away
    assert r.nr and "DISTANCE(lat, lon, 4.9, 103.84) <= 20000 (your query)" in r.warnings[0].message
    r = analyse(policy, "lat > 3")  # beyond the circle's bounding box
    assert r.nr and r.filter_dnf == ()
    r = analyse(policy, "DISTANCE(lat, lon, 1.264, 103.84) > 100000")  # same centre: exact
    assert r.nr
    r = analyse(policy, "speed > 3")
    assert kinds(r) == {"PR"} and "cannot decide" not in r.warnings[0].message


def test_polygons_boxes_and_circles_inside_a_convex_polygon_are_decided():
    policy = f"WITHIN_POLYGON(lat, lon, {SQUARE})"
    assert kinds(analyse(policy, "WITHIN_BOX(lat, lon, 1.2, 103.7, 1.25, 103.9)")) == set()
    assert kinds(analyse(policy, "WITHIN_POLYGON(lat, lon, [1.2, 103.7, 1.25, 103.9, 1.2, "
                                 "103.95])")) == set()
    assert kinds(analyse(policy, "DISTANCE(lat, lon, 1.22, 103.8) <= 2000")) == set()
    assert kinds(analyse(policy, policy)) == set()
    r = analyse(policy, "DISTANCE(lat, lon, 1.29, 103.8) <= 5000")  # crosses the north edge
    assert kinds(r) == {"PR"} and "cannot decide exactly" in r.warnings[0].message
    assert analyse(policy, "lat > 1.5").nr
    assert analyse(policy, "WITHIN_POLYGON(lat, lon, [5, 5, 5, 6, 6, 6])").nr
    assert analyse(f"NOT {policy}", "WITHIN_BOX(lat, lon, 1.2, 103.7, 1.25, 103.9)").nr
    assert analyse(policy, f"NOT {policy}").nr


def test_a_concave_policy_polygon_is_never_assumed_to_contain_anything():
    r = analyse(f"WITHIN_POLYGON(lat, lon, {NOTCH})", "WITHIN_BOX(lat, lon, 0.5, 0.5, 3.5, 3.5)")
    assert kinds(r) == {"PR"}  # the box covers part of the notch: really partial


def test_distance_to_is_decided_only_against_the_same_anchor():
    policy = "DISTANCE_TO(lat, lon, mmsi, 5) <= 370400"
    assert kinds(analyse(policy, "DISTANCE_TO(lat, lon, mmsi, 5) <= 1000")) == set()
    assert analyse(policy, "DISTANCE_TO(lat, lon, mmsi, 5) > 400000").nr
    r = analyse(policy, "DISTANCE_TO(lat, lon, mmsi, 6) <= 1000")
    assert kinds(r) == {"PR"} and not r.nr
    r = analyse(policy, "DISTANCE(lat, lon, 1, 103) <= 10")  # the anchor may be anywhere
    assert kinds(r) == {"PR"} and "cannot decide exactly" in r.warnings[0].message


_POLICIES = [
    "DISTANCE(lat, lon, 1.0, 103.0) <= 60000",
    "DISTANCE(lat, lon, 1.2, 103.3) > 30000",
    "WITHIN_POLYGON(lat, lon, [0.6, 102.6, 0.6, 103.4, 1.4, 103.4, 1.4, 102.6])",
    "WITHIN_POLYGON(lat, lon, [0.5, 102.5, 1.5, 103.5, 0.7, 103.2, 1.2, 102.9])",
    "NOT WITHIN_POLYGON(lat, lon, [0.8, 102.8, 0.8, 103.2, 1.2, 103.0])",
    "lat >= 0.9 AND lon <= 103.1",
    "DISTANCE(lat, lon, 1.0, 103.0) <= 30000 OR lon > 103.3",
]
_USERS = _POLICIES + [
    "DISTANCE(lat, lon, 1.05, 103.02) <= 10000",
    "DISTANCE(lat, lon, 1.3, 103.4) <= 5000",
    "WITHIN_BOX(lat, lon, 0.9, 102.9, 1.1, 103.1)",
    "WITHIN_BOX(lat, lon, 1.45, 103.45, 1.5, 103.5)",
    "WITHIN_POLYGON(lat, lon, [0.95, 102.95, 0.95, 103.05, 1.05, 103.0])",
    "lat < 0.7",
    None,
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_POLICIES), st.sampled_from(_POLICIES + [None]), st.sampled_from(_USERS),
       st.integers(0, 2**16))
def test_the_analysis_is_sound_against_sampled_positions(p1, p2, user, seed):
    """NR only when no sampled position passes both; no PR only when no sampled position passes
    the query and fails the policy (positions on a fine grid plus random ones)."""
    policy = p1 if p2 is None else f"({p1}) AND ({p2})"
    result = analyse(policy, user)
    pol = parse_condition(policy, AIS_SCHEMA)
    usr = parse_condition(user, AIS_SCHEMA) if user else None
    rnd = random.Random(seed)
    points = [(0.4 + 0.03 * i, 102.4 + 0.03 * j) for i in range(41) for j in range(41)]
    points += [(rnd.uniform(0.4, 1.6), rnd.uniform(102.4, 103.6)) for _ in range(400)]
    both = withheld = 0
    for lat, lon in points:
        row = ship(lat, lon)
        wanted = usr is None or evaluate(usr, row)
        allowed = evaluate(pol, row)
        both += wanted and allowed
        withheld += wanted and not allowed
    if result.nr:
        assert both == 0, (policy, user)
    if result.pr is False:
        assert withheld == 0, (policy, user)


# -- consumers' queries ----------------------------------------------------------------------------

def test_user_queries_carry_spatial_filters_in_json_and_xml():
    text = ("DISTANCE(lat, lon, 1.26, 103.84) <= 5000 AND "
            "NOT WITHIN_POLYGON(lat, lon, [1, 103, 1, 104, 2, 104])")
    from_json = user_graph(parse_json_query(json.dumps({"filter": text})), "ais", AIS_SCHEMA)
    escaped = text.replace("<", "&lt;").replace(">", "&gt;")
    xml = f"<UserQuery><Filter><FilterCondition>{escaped}</FilterCondition></Filter></UserQuery>"
    from_xml = user_graph(parse_xml_query(xml), "ais", AIS_SCHEMA)
    assert from_json.filter.condition == from_xml.filter.condition
    assert len(spatial_parts(from_json.filter.condition)) == 2


@pytest.mark.parametrize("text, fragment", HOSTILE[:12] + [
    ("DISTANCE(lat, lon, {subject:port-lat}, 1) <= 5", "not allowed here")])
def test_hostile_user_query_filters_are_400_with_a_position(text, fragment):
    with pytest.raises(UserQueryError) as info:
        user_graph(parse_json_query(json.dumps({"filter": text})), "ais", AIS_SCHEMA)
    assert fragment in info.value.message and info.value.position.startswith("$.filter")


def test_the_merge_keeps_the_leak_rules_and_the_anchor_rule():
    policy_expr = parse_condition("DISTANCE_TO(lat, lon, mmsi, 7) <= 370400", AIS_SCHEMA)
    policy = pipeline_graph("ais", filter=(policy_expr, "..."), map=("mmsi", "lat", "lon"))

    def query(text):
        return user_graph(parse_json_query(json.dumps({"filter": text})), "ais", AIS_SCHEMA)

    merged = merge(policy, query("DISTANCE_TO(lat, lon, mmsi, 7) <= 1000"), AIS_SCHEMA)
    assert [p.value for p in merged.plan.filter_dnf[0]] == [1000.0]
    with pytest.raises(QueryRefused, match="anchor the policy's filter does not use"):
        merge(policy, query("DISTANCE_TO(lat, lon, mmsi, 8) <= 1000"), AIS_SCHEMA)
    with pytest.raises(QueryRefused, match="speed"):
        merge(policy, query("DISTANCE_TO(lat, lon, speed, 8) <= 1000"), AIS_SCHEMA)
    hidden = pipeline_graph("ais", map=("mmsi", "lat"))
    with pytest.raises(QueryRefused, match="'lon'"):
        merge(hidden, query("DISTANCE(lat, lon, 1, 103) <= 5"), AIS_SCHEMA)
    narrow = merge(policy, query("DISTANCE(lat, lon, 1.26, 103.84) <= 5000"), AIS_SCHEMA)
    assert isinstance(narrow.graph.filter.condition, (Spatial, type(narrow.graph.filter.condition)))
    assert "DISTANCE" in to_text(narrow.graph.filter.condition)
