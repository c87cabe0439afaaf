"""Windows that consumers cannot steer (issue 9, class 3): minimum counts, pre-window filters,
group-by keys never finer than the policy's."""
from __future__ import annotations

import json

import pytest

from pep.core.errors import NotPermitted
from pep.core.graph import AIS_SCHEMA, WEATHER_SCHEMA
from pep.core.merge import QueryRefused, merge
from pep.core.obligations import ObligationError, policy_graph
from pep.core.userquery import parse_json_query, user_graph

from .helpers import ob


def window(kind="time", size="60", step="60", *extra, attrs=("rainrate:avg",)):
    pairs = [("stream-window-type-id", kind), ("stream-window-size-id", size),
             ("stream-window-step-id", step), *(("stream-window-attr-id", a) for a in attrs),
             *extra]
    return ob("exacml:obligation:stream-window", *pairs, prefix="exacml:obligation:")


def user(doc: dict, stream="weather", schema=WEATHER_SCHEMA):
    return user_graph(parse_json_query(json.dumps(doc)), stream, schema)


def test_min_count_defaults_protect_sparse_time_windows():
    r = merge(policy_graph((window(),), "weather", WEATHER_SCHEMA), None, WEATHER_SCHEMA,
              time_attribute="samplingtime")
    assert r.plan.window.min_count == 3
    r = merge(policy_graph((window("tuple", "5", "2"),), "weather", WEATHER_SCHEMA), None,
              WEATHER_SCHEMA)
    assert r.plan.window.min_count == 1  # a tuple window always holds `size` tuples


def test_min_count_from_the_policy_and_the_larger_wins():
    p = policy_graph((window("time", "60", "60", ("stream-window-min-count-id", "5")),),
                     "weather", WEATHER_SCHEMA)
    assert merge(p, None, WEATHER_SCHEMA).plan.window.min_count == 5
    two = policy_graph((window("time", "60", "60", ("stream-window-min-count-id", "5")),
                        window("time", "120", "60", ("stream-window-min-count-id", "9"))),
                       "weather", WEATHER_SCHEMA)
    w = merge(two, None, WEATHER_SCHEMA).plan.window
    assert (w.size, w.min_count) == (120, 9)


@pytest.mark.parametrize("extra, fragment", [
    (("stream-window-min-count-id", "0"), "at least 1"),
    (("stream-window-min-count-id", "x"), "not a positive integer"),
    (("stream-window-filter-attribute-id", "nope"), "unknown attribute 'nope'"),
    (("stream-window-key-id", "nope"), "unknown attribute 'nope'"),
])
def test_bad_window_attributes_deny(extra, fragment):
    with pytest.raises(ObligationError, match=fragment):
        policy_graph((window("time", "60", "60", extra),), "weather", WEATHER_SCHEMA)


def test_a_tuple_window_that_can_never_reach_its_minimum_denies():
    with pytest.raises(ObligationError, match="can never hold"):
        policy_graph((window("tuple", "5", "5", ("stream-window-min-count-id", "6")),),
                     "weather", WEATHER_SCHEMA)


@pytest.mark.parametrize("condition, attribute", [
    ("samplingtime > '2024-05-01T10:00:00Z' AND samplingtime < '2024-05-01T10:00:01Z'",
     "samplingtime"),          # a narrow time range: one tuple per window
    ("rainrate > 8.49 AND rainrate < 8.51", "rainrate"),  # a thin value band
])
def test_a_consumer_filter_before_a_policy_window_is_refused_by_default(condition, attribute):
    p = policy_graph((window(),), "weather", WEATHER_SCHEMA)
    with pytest.raises(QueryRefused) as info:
        merge(p, user({"filter": condition}), WEATHER_SCHEMA)
    assert isinstance(info.value, NotPermitted) and info.value.attribute == attribute
    assert "before the policy's window" in info.value.message


def test_pre_window_filters_on_the_attributes_the_policy_lists():
    p = policy_graph((window("time", "60", "60",
                             ("stream-window-filter-attribute-id", "windspeed")),),
                     "weather", WEATHER_SCHEMA)
    r = merge(p, user({"filter": "windspeed > 10"}), WEATHER_SCHEMA)
    assert r.plan.filter_dnf is not None
    with pytest.raises(QueryRefused, match="only on: windspeed"):
        merge(p, user({"filter": "windspeed > 10 AND rainrate > 1"}), WEATHER_SCHEMA)


def test_without_a_policy_window_consumer_filters_are_free():
    p = policy_graph((), "weather", WEATHER_SCHEMA)
    assert merge(p, user({"filter": "rainrate > 1"}), WEATHER_SCHEMA).plan.filter_dnf


def ais_window(*keys: str):
    return window("time", "600", "600", *(("stream-window-key-id", k) for k in keys),
                  attrs=("speed:avg", "mmsi:count"))


def test_group_by_keys_the_policy_allows_and_never_finer():
    p = policy_graph((ais_window("shiptype", "mmsi"),), "ais", AIS_SCHEMA)
    r = merge(p, None, AIS_SCHEMA)
    assert r.plan.window.keys == ("mmsi", "shiptype")  # schema order
    assert set(r.plan.projection) >= {"mmsi", "shiptype", "speed"}
    coarser = user({"window": {"type": "time", "size": 600, "step": 600,
                               "aggregates": ["speed:avg"], "keys": ["shiptype"]}}, "ais",
                   AIS_SCHEMA)
    assert merge(p, coarser, AIS_SCHEMA).plan.window.keys == ("shiptype",)
    none = user({"window": {"type": "time", "size": 600, "step": 600,
                            "aggregates": ["speed:avg"], "keys": []}}, "ais", AIS_SCHEMA)
    assert merge(p, none, AIS_SCHEMA).plan.window.keys == ()
    one_key = policy_graph((ais_window("shiptype"),), "ais", AIS_SCHEMA)
    finer = user({"window": {"type": "time", "size": 600, "step": 600,
                             "aggregates": ["speed:avg"], "keys": ["mmsi"]}}, "ais", AIS_SCHEMA)
    with pytest.raises(QueryRefused, match="finer than the policy's window") as info:
        merge(one_key, finer, AIS_SCHEMA)
    assert info.value.attribute == "mmsi"


def test_keys_of_several_policies_intersect():
    p = policy_graph((ais_window("shiptype", "mmsi"), ais_window("shiptype")), "ais", AIS_SCHEMA)
    assert merge(p, None, AIS_SCHEMA).plan.window.keys == ("shiptype",)


def test_the_xml_form_names_keys_and_a_minimum_count():
    from pep.core.userquery import parse_xml_query

    q = parse_xml_query(b"""<UserQuery><Aggregation><WindowType>time</WindowType>
      <WindowSize>600</WindowSize><WindowStep>600</WindowStep><Attribute>speed:avg</Attribute>
      <Key>ShipType</Key><MinCount>7</MinCount></Aggregation></UserQuery>""")
    p = policy_graph((ais_window("shiptype"),), "ais", AIS_SCHEMA)
    w = merge(p, user_graph(q, "ais", AIS_SCHEMA), AIS_SCHEMA).plan.window
    assert (w.keys, w.min_count) == (("shiptype",), 7)  # 7 > the policy's default 3


def test_coarsen_raises_a_finer_window_with_a_partial_result_warning():
    """ASSIST Definition 4: |W|' = max(|W|, P.W.size), S' = max(S, P.W.step)."""
    p = policy_graph((ais_window("shiptype"),), "ais", AIS_SCHEMA)
    fine = {"type": "time", "size": 1800, "step": 300, "aggregates": ["mmsi:count"],
            "keys": ["shiptype", "mmsi"]}
    with pytest.raises(QueryRefused, match="step 300 is finer"):
        merge(p, user({"window": fine}, "ais", AIS_SCHEMA), AIS_SCHEMA)
    r = merge(p, user({"window": {**fine, "coarsen": True}}, "ais", AIS_SCHEMA), AIS_SCHEMA)
    w = r.plan.window
    assert (w.size, w.step, w.keys) == (1800, 600, ("shiptype",))  # size kept: it was coarser
    (warning,) = [x for x in r.warnings if x.operator == "window"]
    assert warning.kind == "PR" and "step 300 -> 600 seconds" in warning.message
    assert "no grouping by mmsi" in warning.message
    # coarsening never widens what is allowed otherwise: another kind or aggregate is refused
    with pytest.raises(QueryRefused, match="only time windows"):
        merge(p, user({"window": {**fine, "type": "tuple", "coarsen": True}}, "ais",
                      AIS_SCHEMA), AIS_SCHEMA)
    with pytest.raises(QueryRefused, match="max"):
        merge(p, user({"window": {**fine, "aggregates": ["speed:max"], "coarsen": True}},
                      "ais", AIS_SCHEMA), AIS_SCHEMA)
