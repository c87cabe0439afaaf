"""The eXACML+ obligation vocabulary to the policy's query graph; anything not understood denies."""
import pytest

from pep.core.conditions import And, Comparison
from pep.core.graph import WEATHER_SCHEMA
from pep.core.obligations import ObligationError, parse_aggregate, policy_graph
from pep.core.plan import Aggregate

from .helpers import figure2, ob


def test_figure_2_becomes_filter_map_window_in_that_order():
    g = policy_graph(figure2(), "weather", WEATHER_SCHEMA)
    source, ops = g.pipeline()
    assert source.stream == "weather"
    assert [type(o).__name__ for o in ops] == ["Filter", "Map", "WindowAggregate"]
    assert g.filter.condition == Comparison("rainrate", ">", 5.0, 1)
    assert g.map.attributes == ("samplingtime", "rainrate", "windspeed")
    w = g.window.spec
    assert (w.kind, w.size, w.step) == ("tuple", 5, 2)
    assert w.aggregates == (Aggregate("samplingtime", "lastval"), Aggregate("rainrate", "avg"),
                            Aggregate("windspeed", "max"))


def test_table_1_ids_and_the_exacml_prefix_are_accepted():
    obligations = (
        ob("exacml:obligation:stream-filtering", ("stream-filter-condition-id", "RainRate > 5"),
           prefix="exacml:obligation:"),
        ob("exacml:obligation:stream-mapping", ("stream-map-attribute-id", "RAINRATE"),
           prefix="exacml:obligation:"),
        ob("exacml:obligation:stream-window-aggregation", ("stream-window-type-id", "Time"),
           ("stream-window-size-id", "60"), ("stream-window-step-id", "30"),
           ("stream-window-attr-id", "rainrate:Avg"),
           ("stream-window-attr-id", "samplingtime:LastValue"),
           ("stream-window-attr-id", "windspeed:FirstValue"), prefix="exacml:obligation:"),
    )
    g = policy_graph(obligations, "weather", WEATHER_SCHEMA)
    assert g.map.attributes == ("rainrate",)
    assert g.window.spec.kind == "time"
    # canonical order: schema order of the attributes (samplingtime, rainrate, windspeed)
    assert [a.function for a in g.window.spec.aggregates] == ["lastval", "avg", "firstval"]


def test_every_applicable_policy_applies():
    obligations = figure2() + (
        ob("exacml:obligation:stream-filter", ("stream-filter-condition-id", "windspeed < 30")),
        ob("exacml:obligation:stream-map", ("stream-map-attribute-id", "rainrate"),
           ("stream-map-attribute-id", "windspeed"), ("stream-map-attribute-id", "humidity")),
        ob("exacml:obligation:stream-window", ("stream-window-type-id", "tuple"),
           ("stream-window-size-id", "3"), ("stream-window-step-id", "4"),
           ("stream-window-attr-id", "rainrate:avg"), ("stream-window-attr-id", "windspeed:min")),
    )
    g = policy_graph(obligations, "weather", WEATHER_SCHEMA)
    assert g.filter.condition == And((Comparison("rainrate", ">", 5.0, 1),
                                      Comparison("windspeed", "<", 30.0, 1)))
    assert g.map.attributes == ("rainrate", "windspeed")  # intersection
    w = g.window.spec
    assert (w.size, w.step) == (5, 4)  # the coarsest of both
    assert w.aggregates == (Aggregate("rainrate", "avg"),)  # allowed by both


def test_windows_of_different_types_deny():
    obligations = figure2() + (ob("exacml:obligation:stream-window",
                                  ("stream-window-type-id", "time"),
                                  ("stream-window-size-id", "5"), ("stream-window-step-id", "2"),
                                  ("stream-window-attr-id", "rainrate:avg")),)
    with pytest.raises(ObligationError, match="different types"):
        policy_graph(obligations, "weather", WEATHER_SCHEMA)


@pytest.mark.parametrize("obligations,fragment", [
    ((ob("urn:example:obligation:email-owner", ("x", "y")),), "not understood"),
    ((ob("exacml:obligation:stream-filter", ("stream-filter-condition-id", "rainrate >")),),
     "expected a value"),
    ((ob("exacml:obligation:stream-filter", ("stream-filter-condition-id", "snow > 1")),),
     "unknown attribute 'snow'"),
    ((ob("exacml:obligation:stream-filter"),), "no stream-filter-condition-id"),
    ((ob("exacml:obligation:stream-filter", ("stream-filter-condition-idx", "rainrate > 1")),),
     "does not understand"),
    ((ob("exacml:obligation:stream-map", ("stream-map-attribute-id", "snow")),),
     "no attribute 'snow'"),
    ((ob("exacml:obligation:stream-map"),), "lists no visible attribute"),
    ((ob("exacml:obligation:stream-window", ("stream-window-type-id", "tuple"),
         ("stream-window-size-id", "-5"), ("stream-window-step-id", "2"),
         ("stream-window-attr-id", "rainrate:avg")),), "not a positive integer"),
    ((ob("exacml:obligation:stream-window", ("stream-window-type-id", "tuple"),
         ("stream-window-size-id", "0"), ("stream-window-step-id", "2"),
         ("stream-window-attr-id", "rainrate:avg")),), "at least 1"),
    ((ob("exacml:obligation:stream-window", ("stream-window-type-id", "session"),
         ("stream-window-size-id", "5"), ("stream-window-step-id", "2"),
         ("stream-window-attr-id", "rainrate:avg")),), "'tuple' or 'time'"),
    ((ob("exacml:obligation:stream-window", ("stream-window-type-id", "tuple"),
         ("stream-window-size-id", "5"), ("stream-window-step-id", "2"),
         ("stream-window-attr-id", "rainrate:median")),), "unknown function 'median'"),
    ((ob("exacml:obligation:stream-window", ("stream-window-type-id", "tuple"),
         ("stream-window-size-id", "5"), ("stream-window-attr-id", "rainrate:avg")),),
     "exactly one stream-window-step-id"),
    ((ob("exacml:obligation:stream-window", ("stream-window-type-id", "tuple"),
         ("stream-window-size-id", "5"), ("stream-window-step-id", "2")),), "lists no"),
    ((ob("exacml:obligation:stream-window", ("stream-window-type-id", "tuple"),
         ("stream-window-size-id", "5"), ("stream-window-step-id", "2"),
         ("stream-window-attr-id", "samplingtime:avg")),), "does not apply to timestamp"),
])
def test_obligations_the_pep_cannot_fulfil_deny_with_a_reason(obligations, fragment):
    with pytest.raises(ObligationError, match=fragment):
        policy_graph(obligations, "weather", WEATHER_SCHEMA)


def test_placeholders_are_resolved_from_the_request():
    obligation = ob("exacml:obligation:stream-filter",
                    ("stream-filter-condition-id", "rainrate <= {subject:limit}"))
    g = policy_graph((obligation,), "weather", WEATHER_SCHEMA,
                     resolver=lambda cat, attr: ["12.5"] if attr == "limit" else [])
    assert g.filter.condition == Comparison("rainrate", "<=", 12.5, 1)
    with pytest.raises(ObligationError, match="no such attribute"):
        policy_graph((obligation,), "weather", WEATHER_SCHEMA, resolver=lambda c, a: [])


def test_aggregate_spellings():
    assert parse_aggregate("RainRate:AVG", WEATHER_SCHEMA) == Aggregate("rainrate", "avg")
    assert parse_aggregate("max(windspeed)", WEATHER_SCHEMA) == Aggregate("windspeed", "max")
    assert parse_aggregate("samplingtime:firstval", WEATHER_SCHEMA).function == "firstval"
    with pytest.raises(ValueError, match="attribute:function"):
        parse_aggregate("rainrate", WEATHER_SCHEMA)


def test_policy_order_does_not_change_the_graph():
    extra = ob("exacml:obligation:stream-window", ("stream-window-type-id", "tuple"),
               ("stream-window-size-id", "3"), ("stream-window-step-id", "2"),
               ("stream-window-attr-id", "windspeed:max"),
               ("stream-window-attr-id", "rainrate:avg"),
               ("stream-window-attr-id", "samplingtime:lastval"))
    a = policy_graph(figure2() + (extra,), "weather", WEATHER_SCHEMA)
    b = policy_graph((extra,) + tuple(reversed(figure2())), "weather", WEATHER_SCHEMA)
    assert a.window == b.window and a.map == b.map
