"""Merging the policy's graph with the user's: leak rules, windows, map intersection, plans."""
import json

import pytest

from pep.core.errors import InvalidInput, NotPermitted
from pep.core.graph import AIS_SCHEMA, WEATHER_SCHEMA, Filter, Map, WindowAggregate
from pep.core.merge import QueryInvalid, QueryRefused, merge
from pep.core.obligations import policy_graph
from pep.core.plan import Aggregate, ExecutionPlan, Predicate, WindowSpec
from pep.core.userquery import parse_json_query, parse_xml_query, user_graph

from .helpers import FIGURE_4A, figure2, ob


def policy(filter_text="rainrate > 5"):
    return policy_graph(figure2(filter_text), "weather", WEATHER_SCHEMA)


def user(doc):
    return user_graph(parse_json_query(json.dumps(doc)), "weather", WEATHER_SCHEMA)


def test_figure_4_merge_gives_the_expected_plan():
    r = merge(policy(), user_graph(parse_xml_query(FIGURE_4A), "weather", WEATHER_SCHEMA),
              WEATHER_SCHEMA)
    assert r.plan == ExecutionPlan(
        "weather", ((Predicate("rainrate", ">", 50.0),),), ("rainrate",),
        WindowSpec("tuple", 10, 2, (Aggregate("rainrate", "avg"),)))
    assert r.warnings == ()  # rainrate > 50 implies rainrate > 5: nothing is withheld
    _, ops = r.graph.pipeline()
    assert [type(o) for o in ops] == [Filter, Map, WindowAggregate]  # security filter first


def test_no_user_query_gets_the_policy_view_with_pr_warnings():
    r = merge(policy(), None, WEATHER_SCHEMA)
    assert r.plan.window == WindowSpec("tuple", 5, 2, (
        Aggregate("samplingtime", "lastval"), Aggregate("rainrate", "avg"),
        Aggregate("windspeed", "max")))
    assert r.plan.projection == ("samplingtime", "rainrate", "windspeed")
    kinds = {(w.kind, w.operator) for w in r.warnings}
    assert kinds == {("PR", "filter"), ("PR", "map")}
    hidden = next(w for w in r.warnings if w.operator == "map")
    assert set(hidden.predicates) == {"temperature", "humidity", "solarradiation", "winddirection",
                                      "barometer"}


@pytest.mark.parametrize("doc,attribute", [
    ({"map": ["rainrate", "temperature"]}, "temperature"),
    ({"filter": "humidity > 3"}, "humidity"),
    ({"filter": "rainrate > 3 OR NOT barometer < 1000"}, "barometer"),
    ({"window": {"type": "tuple", "size": 5, "step": 2, "aggregates": ["temperature:avg"]}},
     "temperature"),
])
def test_touching_a_hidden_attribute_is_refused_by_name(doc, attribute):
    with pytest.raises(QueryRefused) as info:
        merge(policy(), user(doc), WEATHER_SCHEMA)
    assert isinstance(info.value, NotPermitted) and info.value.attribute == attribute
    assert repr(attribute) in info.value.message


@pytest.mark.parametrize("window,fragment", [
    ({"type": "tuple", "size": 4, "step": 2}, "size 4 is finer"),
    ({"type": "tuple", "size": 10, "step": 1}, "step 1 is finer"),
    ({"type": "time", "size": 10, "step": 2}, "only tuple windows"),
    ({"type": "tuple", "size": 10, "step": 2, "aggregates": ["rainrate:max"]},
     "max(rainrate), which the policy's window does not allow (allowed on 'rainrate': avg)"),
])
def test_finer_or_different_windows_are_refused_never_granted(window, fragment):
    with pytest.raises(QueryRefused) as info:
        merge(policy(), user({"window": window}), WEATHER_SCHEMA)
    assert isinstance(info.value, NotPermitted) and fragment in info.value.message


def test_user_window_without_aggregates_gets_what_the_policy_allows_on_its_map():
    r = merge(policy(), user({"map": ["rainrate", "windspeed"],
                              "window": {"type": "tuple", "size": 6, "step": 3}}), WEATHER_SCHEMA)
    assert r.plan.window == WindowSpec("tuple", 6, 3, (Aggregate("rainrate", "avg"),
                                                       Aggregate("windspeed", "max")))
    assert r.plan.projection == ("rainrate", "windspeed")


def test_map_is_an_intersection():
    p = policy_graph((ob("exacml:obligation:stream-map", ("stream-map-attribute-id", "rainrate"),
                         ("stream-map-attribute-id", "windspeed")),), "weather", WEATHER_SCHEMA)
    r = merge(p, user({"map": ["WindSpeed"]}), WEATHER_SCHEMA)
    assert r.plan.projection == ("windspeed",) and r.warnings == ()
    assert r.plan.window is None and r.plan.filter_dnf is None


def test_user_window_when_the_policy_has_none():
    p = policy_graph((), "ais", AIS_SCHEMA)
    g = user_graph(parse_json_query(json.dumps({"window": {
        "type": "time", "size": 3600, "step": 600, "aggregates": ["mmsi:count"]}})), "ais",
        AIS_SCHEMA)
    r = merge(p, g, AIS_SCHEMA)
    assert r.plan.window == WindowSpec("time", 3600, 600, (Aggregate("mmsi", "count"),), "ts")
    bare = user_graph(parse_json_query('{"window": {"type": "tuple", "size": 3, "step": 1}}'),
                      "ais", AIS_SCHEMA)
    with pytest.raises(QueryInvalid, match="lists no aggregate") as info:
        merge(p, bare, AIS_SCHEMA)
    assert isinstance(info.value, InvalidInput)


def test_nr_from_filters_is_a_warning_and_the_plan_passes_nothing():
    r = merge(policy(), user({"filter": "rainrate < 4"}), WEATHER_SCHEMA)
    assert r.nr and r.plan.filter_dnf == ()
    assert any(w.kind == "NR" and w.operator == "filter" for w in r.warnings)


def test_policy_window_over_a_hidden_attribute_is_withheld_with_info():
    obligations = (
        ob("exacml:obligation:stream-map", ("stream-map-attribute-id", "rainrate")),
        ob("exacml:obligation:stream-window", ("stream-window-type-id", "tuple"),
           ("stream-window-size-id", "5"), ("stream-window-step-id", "5"),
           ("stream-window-attr-id", "rainrate:avg"), ("stream-window-attr-id", "temperature:avg")),
    )
    r = merge(policy_graph(obligations, "weather", WEATHER_SCHEMA), None, WEATHER_SCHEMA)
    assert r.plan.window.aggregates == (Aggregate("rainrate", "avg"),)
    assert any(w.kind == "INFO" and "avg(temperature)" in w.predicates for w in r.warnings)


def test_identical_requests_have_identical_plan_keys():
    a = merge(policy(), user({"filter": "rainrate > 8 AND rainrate > 9"}), WEATHER_SCHEMA).plan
    b = merge(policy(), user({"filter": "RAINRATE > 9"}), WEATHER_SCHEMA).plan
    assert a.key() == b.key()
