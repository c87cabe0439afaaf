"""SQL-like and JSON renderings of plans and graphs."""
import json

from pep.core.conditions import Comparison
from pep.core.explain import graph_to_json, plan_to_json, quote_identifier, render_sql, sql_literal
from pep.core.graph import WEATHER_SCHEMA, Join, QueryGraph, Source
from pep.core.merge import merge
from pep.core.obligations import policy_graph
from pep.core.plan import ExecutionPlan, Field, Predicate, StreamSchema
from pep.core.userquery import parse_xml_query, user_graph

from .helpers import FIGURE_4A, figure2


def merged():
    return merge(policy_graph(figure2(), "weather", WEATHER_SCHEMA),
                 user_graph(parse_xml_query(FIGURE_4A), "weather", WEATHER_SCHEMA), WEATHER_SCHEMA)


def test_figure_4b_like_sql():
    sql = render_sql(merged().plan, WEATHER_SCHEMA)
    assert "SELECT avg(`rainrate`) AS `avg_rainrate`" in sql
    assert "WHERE `rainrate` > 50" in sql
    assert "WINDOW TUPLES (SIZE 10 ADVANCE 2)" in sql
    assert sql.index("WHERE") > sql.index("FROM (")  # the filter sits under the window
    assert sql.rstrip().endswith(";")


def test_identifiers_and_literals_are_quoted():
    schema = StreamSchema((Field("we`ird", "string"), Field("t", "timestamp")))
    plan = ExecutionPlan("s", ((Predicate("we`ird", "=", "x'; DROP TABLE s; --\n"),
                                Predicate("t", ">=", 1704067200.0)),), ("we`ird",))
    sql = render_sql(plan, schema)
    assert "`we``ird` = 'x\\'; DROP TABLE s; --\\n'" in sql
    assert "`t` >= TIMESTAMP '2024-01-01 00:00:00Z'" in sql
    assert quote_identifier("a`b") == "`a``b`" and sql_literal(True) == "true"
    assert render_sql(ExecutionPlan("s", (), ("a",))).splitlines()[-1] == "WHERE false;"


def test_plan_and_graph_json():
    r = merged()
    doc = plan_to_json(r.plan)
    assert doc["filter"] == [[{"attribute": "rainrate", "op": ">", "value": 50.0}]]
    assert doc["window"]["aggregates"] == [{"attribute": "rainrate", "function": "avg",
                                           "output": "avg_rainrate"}]
    assert doc["output"] == ["avg_rainrate"] and doc["key"] == r.plan.key()
    json.dumps(doc)
    ops = graph_to_json(r.graph, WEATHER_SCHEMA)["operators"]
    assert [o["op"] for o in ops] == ["source", "filter", "map", "window"]
    join = QueryGraph(Join(Source("a"), Source("b"), Comparison("x", "=", 1)))
    assert graph_to_json(join)["sink"]["op"] == "join"


# -- issue 9, item 4: strange literals render (or were refused before), never crash ------------

def test_strange_string_literals_render_as_escapes():
    shown = sql_literal("a\\b'c\n\r\t\x00\x1b\x7f\x85\u2028\u202e\u2066\ufeff\ufffe"
                        "\ud800\udfffé😀")
    assert shown == ("'a\\\\b\\'c\\n\\r\\t\\u0000\\u001b\\u007f\\u0085\\u2028\\u202e\\u2066"
                     "\\ufeff\\ufffe\\ud800\\udfffé😀'")
    shown.encode("utf-8")  # every character of the text can be sent


def test_timestamp_constants_beyond_year_9999_render_as_numbers():
    # conditions refuse them (test_conditions); a plan from elsewhere may still carry one, and
    # rendering it used to raise OverflowError / ValueError (a 500 from /explain and /requests)
    for value in (1e300, -1e300, 253402300800.0, -62135596801.0):
        assert sql_literal(value, "timestamp") == repr(value)
    assert sql_literal(-62135596800.0, "timestamp") == "TIMESTAMP '0001-01-01 00:00:00Z'"
    assert sql_literal(253402300799.5, "timestamp") == "TIMESTAMP '9999-12-31 23:59:59.5Z'"
    plan = ExecutionPlan("s", ((Predicate("t", ">", 1e300),),), ("t",))
    assert "`t` > 1e+300" in render_sql(plan, StreamSchema((Field("t", "timestamp"),)))
