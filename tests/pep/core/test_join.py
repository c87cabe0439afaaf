"""Joins of two streams under policy (pep/core/join.py), with the real PDP and inline policies.

Two streams: `stations(t, station, rainrate, humidity)` and `ships(ts, area, mmsi, speed, owner)`.
lta may read both (stations: station A or B, humidity hidden; ships: speed < 30, owner hidden);
`half` may read only stations; `boats` only ships; `win` sees stations only through 60 s windows
keyed by station.
"""
from __future__ import annotations

import itertools
import json

import pytest
from flask import Flask
from hypothesis import assume, given, settings, strategies as st

from common.auth import Identity
from pdp.engine import PolicyEngine
from pep.core.access import decide_and_plan
from pep.core.analysis import MergeWarning
from pep.core.errors import (
    AccessDenied,
    InvalidInput,
    NoResult,
    NotPermitted,
    Refusal,
    Unprocessable,
)
from pep.core.explain import plan_to_json
from pep.core.join import JoinSide, analyse_join
from pep.core.outputs import join_output, side_outputs
from pep.core.plan import (
    ExecutionPlan,
    Field,
    JoinPlan,
    Predicate,
    StreamSchema,
    any_plan_from_json,
    is_join_json,
    plan_streams,
    side_plans,
)
from pep.core.userquery import JoinQuery, parse_user_query
from pep.http import errors

from .test_access import inline_policy, obligation

XML, JSON = "application/xacml+xml", "application/xacml+json"
STATIONS = StreamSchema((Field("t", "timestamp"), Field("station", "string"),
                         Field("rainrate", "double"), Field("humidity", "double")))
SHIPS = StreamSchema((Field("ts", "timestamp"), Field("area", "string"), Field("mmsi", "long"),
                      Field("speed", "double"), Field("owner", "string")))
SCHEMAS = {"stations": STATIONS, "ships": SHIPS, "other_stations": STATIONS}
TIMES = {"stations": "t", "ships": "ts", "other_stations": "t"}


def maps(*names):
    return obligation("exacml:obligation:stream-map",
                      *(("stream-map-attribute-id", n) for n in names))


def filters(text):
    return obligation("exacml:obligation:stream-filter", ("stream-filter-condition-id", text))


@pytest.fixture(scope="module")
def engine():
    stations = filters("station IN ('A', 'B')") + maps("t", "station", "rainrate")
    ships = filters("speed &lt; 30") + maps("ts", "area", "mmsi", "speed")
    window = obligation("exacml:obligation:stream-window", ("stream-window-type-id", "time"),
                        ("stream-window-size-id", "60"), ("stream-window-step-id", "60"),
                        ("stream-window-attr-id", "rainrate:avg"),
                        ("stream-window-attr-id", "rainrate:max"),
                        ("stream-window-key-id", "station"),
                        ("stream-window-min-count-id", "2"))
    tuples = obligation("exacml:obligation:stream-window", ("stream-window-type-id", "tuple"),
                        ("stream-window-size-id", "5"), ("stream-window-step-id", "5"),
                        ("stream-window-attr-id", "rainrate:avg"))
    return PolicyEngine.compile([
        inline_policy("urn:t:stations-lta", "stations", "lta", stations),
        inline_policy("urn:t:ships-lta", "ships", "lta", ships),
        inline_policy("urn:t:stations-half", "stations", "half", stations),
        inline_policy("urn:t:ships-boats", "ships", "boats", ships),
        inline_policy("urn:t:stations-win", "stations", "win", stations + window),
        inline_policy("urn:t:ships-win", "ships", "win", ships),
        inline_policy("urn:t:stations-tup", "stations", "tup", stations + tuples),
        inline_policy("urn:t:ships-tup", "ships", "tup", ships),
        inline_policy("urn:t:other-lta", "other_stations", "lta", stations),
    ])


def request(stream: str, query: dict | None = None) -> bytes:
    resource = {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
                               "Value": stream}]}
    if query is not None:
        resource["Content"] = query
    return json.dumps({"Request": {
        "Resource": resource,
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                  "Value": "read"}]}}}).encode()


def join_query(on=(("station", "area"),), within=60, left=None, right=None, stream="ships"):
    query = dict(left or {})
    query["join"] = {"stream": stream, "on": [list(p) for p in on], **(right or {})}
    if within is not None:
        query["join"]["within"] = within
    return query


def run(engine, query, who="lta", stream="stations", **kw):
    return decide_and_plan(engine, request(stream, query), JSON, Identity(who), SCHEMAS.get,
                           time_attribute_lookup=TIMES.get, **kw)


ANSWERS = Flask("join-answers")


def refusal(engine, query, who="lta", **kw) -> tuple[Refusal, int, bytes]:
    with pytest.raises(Refusal) as info:
        run(engine, query, who, **kw)
    with ANSWERS.app_context():
        response = errors.response_for(info.value)
    return info.value, response.status_code, response.get_data()


# -- the plan -------------------------------------------------------------------------------------

def test_a_join_gets_two_side_plans_each_merged_like_a_single_stream_request(engine):
    grant = run(engine, join_query(left={"filter": "rainrate > 2"},
                                   right={"map": ["ts", "area", "mmsi"]}))
    plan = grant.plan
    assert isinstance(plan, JoinPlan)
    single_left = run(engine, {"filter": "rainrate > 2"}).plan
    single_right = run(engine, {"map": ["ts", "area", "mmsi"]}, stream="ships").plan
    assert plan.left == single_left and plan.right == single_right
    assert plan.on == (("station", "area"),) and plan.within == 60.0
    assert (plan.left_time, plan.right_time) == ("t", "ts")
    assert join_output(plan) == ("stations.t", "stations.station", "stations.rainrate",
                                 "ships.ts", "ships.area", "ships.mmsi")
    assert grant.policy_ids == {"urn:t:stations-lta", "urn:t:ships-lta"}
    assert grant.stream == "stations" and plan_streams(plan) == ("stations", "ships")
    assert set(side_plans(plan)) == {"stations", "ships"}


def test_the_plan_round_trips_and_its_key_is_stable(engine):
    plan = run(engine, join_query()).plan
    text = plan.canonical_json()
    assert is_join_json(text) and not is_join_json(plan.left.canonical_json())
    assert any_plan_from_json(text) == plan and any_plan_from_json(text).key() == plan.key()
    assert any_plan_from_json(plan.left.canonical_json()) == plan.left
    assert run(engine, join_query()).plan.key() == plan.key()
    assert run(engine, join_query(within=61)).plan.key() != plan.key()


def test_xml_and_json_forms_give_the_same_join(engine):
    xml_query = b"""<UserQuery><Filter><FilterCondition>rainrate &gt; 2</FilterCondition></Filter>
      <Join><Stream name="ships"/><On left="station" right="area"/><Within>60</Within>
        <Map><Attribute>ts</Attribute><Attribute>area</Attribute></Map></Join></UserQuery>"""
    body = request("stations")
    by_xml = decide_and_plan(engine, body, JSON, Identity("lta"), SCHEMAS.get,
                             user_query=xml_query, user_query_type="application/xml",
                             time_attribute_lookup=TIMES.get)
    by_json = run(engine, join_query(left={"filter": "rainrate > 2"},
                                     right={"map": ["ts", "area"]}))
    assert by_xml.plan == by_json.plan


def test_explain_renders_the_join_as_sql_like_text_and_json(engine):
    grant = run(engine, join_query())
    assert "FROM `stations` JOIN `ships`" in grant.sql
    assert "`stations`.`station` = `ships`.`area`" in grant.sql
    assert "`stations`.`t` BETWEEN `ships`.`ts` - INTERVAL '60' SECOND" in grant.sql
    assert "WHERE (`station` = 'A') OR (`station` = 'B')" in grant.sql or \
        "`station` = 'A'" in grant.sql
    assert "`stations`.`rainrate` AS `stations.rainrate`" in grant.sql
    doc = grant.plan_json
    assert doc["join"]["on"] == [{"left": "station", "right": "area"}]
    assert doc["join"]["left"]["stream"] == "stations" and doc["streams"] == ["stations", "ships"]
    assert doc["key"] == grant.plan.key() and "ships.mmsi" in doc["output"]
    assert plan_to_json(grant.plan) == doc  # what /handles shows for a join handle
    assert grant.graph_json["sink"]["op"] == "join"
    assert grant.graph_json["sink"]["right"]["operators"][0] == {"op": "source",
                                                                  "stream": "ships"}


def test_side_warnings_name_their_stream(engine):
    warnings = run(engine, join_query()).warnings
    texts = [w.message for w in warnings]
    assert any(t.startswith("stations: partial result: the policy hides attribute(s) humidity")
               for t in texts), texts
    assert any(t.startswith("ships: ") and "owner" in t for t in texts), texts


# -- decisions ------------------------------------------------------------------------------------

def test_a_consumer_permitted_on_the_first_side_only_gets_403_naming_the_second(engine):
    exc, status, body = refusal(engine, join_query(), who="half")
    assert isinstance(exc, AccessDenied) and status == 403
    assert "'ships'" in exc.message and "second stream" in exc.message
    assert exc.details["stream"] == "ships"
    answer = json.loads(body)["Response"][0]  # the XACML answer, its status naming the side
    assert answer["Decision"] == "NotApplicable" and "'ships'" in answer["Status"]["StatusMessage"]


def test_a_consumer_permitted_on_the_second_side_only_gets_403_naming_the_first(engine):
    exc, status, body = refusal(engine, join_query(), who="boats")
    assert isinstance(exc, AccessDenied) and status == 403
    assert "'stations'" in exc.message and "first stream" in exc.message
    assert "'stations'" in json.loads(body)["Response"][0]["Status"]["StatusMessage"]


def test_the_second_side_is_decided_with_the_first_sides_request_resource_id_replaced(engine):
    # the `lta` policies of `ships` apply, not those of `stations`: the side plan is the ships'
    plan = run(engine, join_query()).plan
    assert plan.right.filter_dnf == ((Predicate("speed", "<", 30.0),),)
    assert "owner" not in plan.right.projection


# -- the join condition ---------------------------------------------------------------------------

@pytest.mark.parametrize("on, attribute", [((("humidity", "area"),), "humidity"),
                                           ((("station", "owner"),), "owner")])
def test_a_condition_on_a_hidden_attribute_is_refused_naming_it(engine, on, attribute):
    exc, status, _ = refusal(engine, join_query(on=on))
    assert isinstance(exc, NotPermitted) and status == 403
    assert exc.details["attribute"] == attribute and attribute in exc.message
    assert "hides" in exc.message


def test_an_attribute_the_consumers_own_map_left_out_is_invalid(engine):
    exc, status, _ = refusal(engine, join_query(right={"map": ["ts", "mmsi"]}))
    assert isinstance(exc, InvalidInput) and status == 400
    assert exc.details["attribute"] == "area" and "your own map" in exc.message


def test_unknown_attributes_and_mismatched_types_are_invalid(engine):
    exc, status, _ = refusal(engine, join_query(on=(("station", "nothing"),)))
    assert status == 400 and "nothing" in exc.message
    exc, status, _ = refusal(engine, join_query(on=(("station", "mmsi"),)))
    assert status == 400 and "same kind of value" in exc.message


def test_the_time_bound_uses_the_time_attribute_which_must_be_shown(engine):
    exc, status, _ = refusal(engine, join_query(right={"map": ["area", "mmsi"]}))
    assert status == 400 and exc.details["attribute"] == "ts" and "time bound" in exc.message


def test_within_is_required_unless_both_sides_are_windowed(engine):
    exc, status, _ = refusal(engine, join_query(within=None))
    assert status == 400 and "within" in exc.message


def test_a_stream_joined_with_itself_is_refused(engine):
    exc, status, _ = refusal(engine, join_query(stream="stations", on=(("station", "station"),)))
    assert status == 400 and "itself" in exc.message


def test_an_unknown_second_stream_is_404(engine):
    exc, status, _ = refusal(engine, join_query(stream="nowhere"))
    assert status == 404 and "nowhere" in exc.message


# -- windowed sides -------------------------------------------------------------------------------

def test_a_windowed_side_joins_on_its_window_outputs(engine):
    plan = run(engine, join_query(on=(("station", "area"),)), who="win").plan
    assert plan.left.window is not None and plan.left_time == "window_end"
    assert side_outputs(plan.left, STATIONS) == {
        "window_start": "timestamp", "window_end": "timestamp", "station": "string",
        "avg_rainrate": "double", "max_rainrate": "double"}
    assert join_output(plan)[:5] == ("stations.window_start", "stations.window_end",
                                     "stations.station", "stations.avg_rainrate",
                                     "stations.max_rainrate")
    grant = run(engine, join_query(on=(("max_rainrate", "speed"),)), who="win")
    assert grant.plan.on == (("max_rainrate", "speed"),)


def test_a_windowed_side_never_joins_on_raw_tuples(engine):
    exc, status, _ = refusal(engine, join_query(on=(("rainrate", "speed"),)), who="win")
    assert status == 403 and exc.details["attribute"] == "rainrate"
    assert "window outputs" in exc.message


def test_two_windowed_sides_meet_when_their_windows_end_together_by_default(engine):
    window = {"type": "time", "size": 60, "step": 60, "aggregates": ["speed:max"],
              "keys": ["area"]}
    grant = run(engine, join_query(within=None, right={"window": window}), who="win")
    assert grant.plan.within == 0.0 and grant.plan.right_time == "window_end"
    assert "`stations`.`window_end` = `ships`.`window_end`" in grant.sql


def test_a_tuple_windowed_side_cannot_be_joined(engine):
    exc, status, _ = refusal(engine, join_query(), who="tup")
    assert isinstance(exc, Unprocessable) and status == 422 and "tuple-windowed" in exc.message


# -- NR analysis of the join condition ------------------------------------------------------------

def test_an_equality_the_sides_filters_never_agree_on_is_nr_with_the_reason(engine):
    query = join_query(left={"filter": "station = 'A'"}, right={"filter": "area = 'B'"})
    exc, status, _ = refusal(engine, query)
    assert isinstance(exc, NoResult) and status == 422
    assert "stations.station = ships.area never holds" in exc.message
    assert "station = 'A'" in exc.message and "area = 'B'" in exc.message
    grant = run(engine, query, refuse_nr=False)  # explain shows it
    nr = [w for w in grant.warnings if w.kind == "NR"]
    assert nr and nr[0].operator == "join"
    assert set(nr[0].predicates) == {"station = 'A'", "area = 'B'"}


def test_the_policy_filter_alone_can_make_a_join_nr(engine):
    # stations keeps station IN ('A', 'B'); a right side asking for area 'C' never meets it
    exc, status, _ = refusal(engine, join_query(right={"filter": "area = 'C'"}))
    assert status == 422 and "area = 'C'" in exc.message


def test_compatible_filters_are_not_nr(engine):
    grant = run(engine, join_query(right={"filter": "area = 'B' OR area = 'C'"}))
    assert not [w for w in grant.warnings if w.kind == "NR"]


def test_a_time_bound_the_time_filters_never_meet_is_nr(engine):
    query = join_query(left={"filter": "t < '2020-01-01T00:00:00Z'"}, within=60,
                       right={"filter": "ts > '2020-01-01T00:01:00Z'"})
    exc, status, _ = refusal(engine, query)
    assert status == 422 and "never within 60 s" in exc.message
    near = join_query(left={"filter": "t < '2020-01-01T00:00:00Z'"}, within=61,
                      right={"filter": "ts > '2020-01-01T00:01:00Z'"})
    assert not [w for w in run(engine, near).warnings if w.kind == "NR"]


def test_a_windowed_sides_key_is_constrained_by_its_filter(engine):
    exc, status, _ = refusal(engine, join_query(right={"filter": "area = 'Z'"}), who="win")
    assert status == 422 and "stations.station = ships.area never holds" in exc.message


# -- the analysis against brute force -------------------------------------------------------------

LEFT = StreamSchema((Field("t", "timestamp"), Field("a", "long"), Field("b", "long")))
RIGHT = StreamSchema((Field("ts", "timestamp"), Field("x", "long"), Field("y", "long")))
OPS = ("<", "<=", ">", ">=", "=", "!=")
predicate = st.builds(lambda op, v: (op, v), st.sampled_from(OPS), st.integers(0, 6))


def _conjunct(attrs):
    return st.lists(st.tuples(st.sampled_from(attrs), predicate), min_size=0, max_size=3)


def _dnf(attrs):
    return st.lists(_conjunct(attrs), min_size=1, max_size=3)


def _plan_dnf(stream, dnf):
    conjuncts = tuple(tuple(Predicate(a, op, v) for a, (op, v) in conj) for conj in dnf)
    return conjuncts


def _holds(conj, row):
    ops = {"<": lambda x, v: x < v, "<=": lambda x, v: x <= v, ">": lambda x, v: x > v,
           ">=": lambda x, v: x >= v, "=": lambda x, v: x == v, "!=": lambda x, v: x != v}
    return all(ops[p.op](row[p.attribute], p.value) for p in conj)


@settings(max_examples=150, deadline=None)
@given(left=_dnf(["a", "b"]), right=_dnf(["x", "y"]),
       on=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["x", "y"])),
                   min_size=1, max_size=2, unique=True))
def test_join_nr_agrees_with_brute_force_on_plain_sides(left, right, on):
    domain = range(-1, 8)  # constants are 0..6: every satisfiable constraint has a witness here
    pairs = list(itertools.product(domain, repeat=2))

    def satisfiable(dnf, names):  # a merged plan holds only satisfiable conjuncts
        return tuple(
            c for c in dnf if any(_holds(c, dict(zip(names, v, strict=True))) for v in pairs)
        )

    lconj = satisfiable(_plan_dnf("l", left), ("a", "b"))
    rconj = satisfiable(_plan_dnf("r", right), ("x", "y"))
    assume(lconj and rconj)
    lplan = ExecutionPlan("l", lconj, ("t", "a", "b"))
    rplan = ExecutionPlan("r", rconj, ("ts", "x", "y"))
    plan = JoinPlan(lplan, rplan, tuple(on), 60.0, "t", "ts")
    matches = any(
        any(_holds(lc, {"a": a, "b": b}) for lc in lplan.filter_dnf)
        and any(_holds(rc, {"x": x, "y": y}) for rc in rplan.filter_dnf)
        and all({"a": a, "b": b}[p] == {"x": x, "y": y}[q] for p, q in on)
        for a, b, x, y in itertools.product(domain, repeat=4))
    sides = [JoinSide("l", LEFT, None, None), JoinSide("r", RIGHT, None, None)]
    verdict = analyse_join(plan, *sides)
    assert (verdict is not None and verdict.kind == "NR") == (not matches)


def test_too_many_alternatives_are_not_analysed_but_said():
    conj = tuple((Predicate("a", "=", i),) for i in range(70))
    lplan = ExecutionPlan("l", conj, ("t", "a"))
    rplan = ExecutionPlan("r", tuple((Predicate("x", "=", i),) for i in range(70)), ("ts", "x"))
    verdict = analyse_join(JoinPlan(lplan, rplan, (("a", "x"),), 1.0, "t", "ts"),
                           JoinSide("l", LEFT, None, None),  # type: ignore[arg-type]
                           JoinSide("r", RIGHT, None, None))  # type: ignore[arg-type]
    assert isinstance(verdict, MergeWarning) and verdict.kind == "INFO"


# -- the user query -------------------------------------------------------------------------------

def test_the_join_part_of_a_user_query_parses_in_both_forms():
    q = parse_user_query(json.dumps(join_query(left={"filter": "rainrate > 1"})).encode())
    assert q.join == JoinQuery("ships", (("station", "area"),), 60.0, q.join.side)
    assert q.join.side.stream == "ships" and q.filter == "rainrate > 1"
    x = parse_user_query(b'<UserQuery><Join><Stream name="ships"/><On left="station" '
                         b'right="area"/><Within>60</Within></Join></UserQuery>')
    assert x.join.on == q.join.on and x.join.within == 60.0 and x.join.stream == "ships"


# -- the example in policies/ ---------------------------------------------------------------------

def test_the_port_authority_example_joins_ais_with_routes():
    from pathlib import Path

    from pdp.engine import PolicySource
    from pep.core.schemas import AIS_SCHEMA

    policies = Path(__file__).resolve().parents[3] / "policies"
    streams = json.loads((policies / "streams.json").read_text())
    routes = next(s for s in streams if s["name"] == "routes")
    schemas = {"ais": AIS_SCHEMA, "routes": StreamSchema(tuple(
        Field(f["name"], f["type"]) for f in routes["schema"]))}
    times = {"ais": "ts", "routes": routes["time_attribute"]}
    engine = PolicyEngine.compile([
        PolicySource(str(p), p.read_bytes()) for p in
        (policies / "ais" / "port-authority-policy.xml", policies / "joins" / "routes-policy.xml")])
    body = (policies / "joins" / "port-authority-join-request.xml").read_bytes()
    from pep.config import DEMO_PORT
    from pep.core.plan import SpatialPredicate

    port = tuple((k, tuple(v) if isinstance(v, list) else (v,)) for k, v in DEMO_PORT.items())
    grant = decide_and_plan(engine, body, XML, Identity("mpa", ("port-authority",),
                                                        attributes=port), schemas.get,
                            time_attribute_lookup=times.get)
    plan = grant.plan
    assert isinstance(plan, JoinPlan) and plan.streams == ("ais", "routes")
    assert plan.on == (("mmsi", "mmsi"),) and plan.within == 60.0
    assert (plan.left_time, plan.right_time) == ("ts", "ts")
    # the AIS policy: the caller's own port waters (Table 2, row 1)
    assert SpatialPredicate("polygon", "lat", "lon", "=", 0.0,
                            tuple(DEMO_PORT["port-bounds"])) in plan.left.filter_dnf[0]
    assert Predicate("next_leg", "!=", "naval-base") not in plan.right.filter_dnf[0]  # implied
    assert plan.right.filter_dnf == ((Predicate("free_load", ">=", 10),
                                      Predicate("next_leg", "=", "Los Angeles")),)
    assert "consignee" not in plan.right.projection
    assert "routes.free_load" in join_output(plan) and "ais.shipname" in join_output(plan)
    with pytest.raises(AccessDenied) as denied:  # a consumer without the role: the first side
        decide_and_plan(engine, body, XML, Identity("lta", ("consumer",)), schemas.get,
                        time_attribute_lookup=times.get)
    assert "'ais'" in denied.value.message
    with pytest.raises(AccessDenied) as denied:  # a port authority without a port: no AIS side
        decide_and_plan(engine, body, XML, Identity("mpa", ("port-authority",)), schemas.get,
                        time_attribute_lookup=times.get)
    assert "port-bounds" in denied.value.message


def test_spatial_sides_join_and_a_moving_anchor_is_refused():
    """A side's DISTANCE or WITHIN_POLYGON stays in its side plan; a side filtered by
    DISTANCE_TO (whose anchor only the stream's own query tracks) is refused, never run
    without its filter."""
    from pep.core.plan import SpatialPredicate

    positions = StreamSchema((Field("ts", "timestamp"), Field("area", "string"),
                              Field("mmsi", "long"), Field("lat", "double"),
                              Field("lon", "double")))
    schemas = {**SCHEMAS, "positions": positions}
    times = {**TIMES, "positions": "ts"}
    stations = filters("station IN ('A', 'B')") + maps("t", "station", "rainrate")
    shown = maps("ts", "area", "mmsi", "lat", "lon")
    engine = PolicyEngine.compile([
        inline_policy("urn:t:st-poly", "stations", "poly", stations),
        inline_policy("urn:t:pos-poly", "positions", "poly", filters(
            "WITHIN_POLYGON(lat, lon, [1, 103, 1, 104, 2, 104]) AND "
            "DISTANCE(lat, lon, 1.5, 103.5) &lt;= 90000") + shown),
        inline_policy("urn:t:st-cap", "stations", "cap", stations),
        inline_policy("urn:t:pos-cap", "positions", "cap", filters(
            "DISTANCE_TO(lat, lon, mmsi, 7) &lt;= 1000") + shown),
    ])

    def go(who):
        return decide_and_plan(engine, request("stations", join_query(stream="positions")), JSON,
                               Identity(who), schemas.get, time_attribute_lookup=times.get)

    plan = go("poly").plan
    assert {p.function for p in plan.right.filter_dnf[0]
            if isinstance(p, SpatialPredicate)} == {"polygon", "distance"}
    with pytest.raises(Unprocessable, match="DISTANCE_TO"):
        go("cap")
