"""User queries in XML (Figure 4(a)) and JSON, hardened parsing, and errors with positions."""
import json

import pytest
from hypothesis import given, settings, strategies as st
from lxml import etree

from pep.core.graph import AIS_SCHEMA, WEATHER_SCHEMA
from pep.core.plan import Aggregate
from pep.core.userquery import (
    UserQueryError,
    parse_json_query,
    parse_user_query,
    parse_xml_query,
    query_from_content,
    user_graph,
)

from .helpers import FIGURE_4A, FIGURE_4A_AS_PRINTED


def test_figure_4a_parses_and_binds():
    q = parse_xml_query(FIGURE_4A)
    assert (q.stream, q.filter, q.map) == ("weather", "RainRate > 50", ("RainRate",))
    assert (q.window_kind, q.window_size, q.window_step) == ("tuple", 10, 2)
    g = user_graph(q, "weather", WEATHER_SCHEMA)
    assert g.map.attributes == ("rainrate",)
    assert g.window.spec.aggregates == (Aggregate("rainrate", "avg"),)
    assert str(g.filter.condition) == "rainrate > 50"


def test_the_printed_figure_typo_is_refused_with_position_and_hint():
    with pytest.raises(UserQueryError) as info:
        parse_xml_query(FIGURE_4A_AS_PRINTED)
    err = info.value
    assert err.position and err.position.startswith("line ") and "column" in err.position
    assert "<WindowSize> is not closed" in err.message and "Figure 4(a)" in err.message


def test_json_form_is_equivalent():
    doc = {"stream": "weather", "filter": "RainRate > 50", "map": ["RainRate"],
           "window": {"type": "tuple", "size": 10, "step": 2,
                      "aggregates": ["avg(RainRate)"]}}
    from_json = user_graph(parse_json_query(json.dumps(doc).encode()), "weather", WEATHER_SCHEMA)
    from_xml = user_graph(parse_xml_query(FIGURE_4A), "weather", WEATHER_SCHEMA)
    assert from_json.map == from_xml.map and from_json.window == from_xml.window
    assert from_json.filter.condition == from_xml.filter.condition
    wrapped = parse_json_query(json.dumps({"UserQuery": {"window": {
        "type": "time", "size": 60, "step": 60,
        "aggregates": [{"attribute": "windspeed", "function": "Max"}, "rainrate:sum"]}}}))
    g = user_graph(wrapped, "weather", WEATHER_SCHEMA)
    assert g.window.spec.aggregates == (Aggregate("windspeed", "max"), Aggregate("rainrate", "sum"))
    assert parse_user_query(b'{"filter": "rainrate > 1"}').filter == "rainrate > 1"
    assert parse_user_query(FIGURE_4A, "application/xml").window_size == 10


@pytest.mark.parametrize("doc,position,fragment", [
    ({"filter": "rainrate >"}, "$.filter", "expected a value"),
    ({"window": {"type": "tuple", "size": 0, "step": 1}}, "$.window.size", "at least 1"),
    ({"window": {"type": "tuple", "size": True, "step": 1}}, "$.window.size", "positive integer"),
    ({"window": {"type": "tuple", "size": 3}}, "$.window", "needs 'step'"),
    ({"window": {"type": "hopping", "size": 3, "step": 1}}, "$.window.type", "'tuple' or 'time'"),
    ({"window": {"type": "tuple", "size": 3, "step": 1, "aggregates": [5]}},
     "$.window.aggregates[0]", "attribute:function"),
    ({"select": ["x"]}, "$", "unknown key"),
    ({"map": []}, "$.map", "non-empty list"),
    ([1, 2], "$", "JSON object"),
])
def test_json_errors_name_the_path(doc, position, fragment):
    with pytest.raises(UserQueryError) as info:
        user_graph(parse_json_query(json.dumps(doc)), "weather", WEATHER_SCHEMA)
    assert info.value.position == position and fragment in info.value.message


def test_malformed_json_gives_line_and_column():
    with pytest.raises(UserQueryError) as info:
        parse_json_query(b'{"filter": \n "x" "y"}')
    assert info.value.position == "line 2, column 6"


@pytest.mark.parametrize("xml,fragment", [
    (b"<UserQuery><Select/></UserQuery>", "unknown element <Select>"),
    (b"<Query/>", "expected a <UserQuery>"),
    (b"<UserQuery><Map/></UserQuery>", "lists no <Attribute>"),
    (b"<UserQuery><Filter><FilterCondition> </FilterCondition></Filter></UserQuery>", "is empty"),
    (b"<UserQuery><Aggregation><WindowType>tuple</WindowType><WindowSize>3</WindowSize>"
     b"</Aggregation></UserQuery>", "needs <WindowStep>"),
    (b"<UserQuery><Map><Attribute>snow</Attribute></Map></UserQuery>", "unknown attribute 'snow'"),
    (b"<UserQuery><Filter><FilterCondition>{subject:subject-id} = rainrate</FilterCondition>"
     b"</Filter></UserQuery>", "not allowed here"),
    (b"<UserQuery><Aggregation><WindowType>tuple</WindowType><WindowSize>3</WindowSize>"
     b"<WindowStep>1</WindowStep><Attribute>median(rainrate)</Attribute></Aggregation></UserQuery>",
     "unknown function 'median'"),
    (b"<UserQuery><Stream name='ais'/></UserQuery>", "for stream 'ais'"),
])
def test_xml_errors(xml, fragment):
    with pytest.raises(UserQueryError, match=fragment.replace("(", r"\(")):
        user_graph(parse_xml_query(xml), "weather", WEATHER_SCHEMA)


def test_filter_errors_point_into_the_document():
    xml = (b"<UserQuery>\n<Filter>\n<FilterCondition>rainrate >> 5</FilterCondition></Filter>"
           b"</UserQuery>")
    with pytest.raises(UserQueryError) as info:
        user_graph(parse_xml_query(xml), "weather", WEATHER_SCHEMA)
    assert info.value.position == "line 3" and "column 11" in info.value.message


def test_hostile_xml_is_refused():
    bomb = (
        b'<?xml version="1.0"?><!DOCTYPE q [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
        b"<UserQuery><Filter><FilterCondition>&b;</FilterCondition></Filter></UserQuery>"
    )
    with pytest.raises(UserQueryError, match="DOCTYPE"):
        parse_xml_query(bomb)
    external = (b'<!DOCTYPE q [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
                b"<UserQuery><Stream name='&x;'/></UserQuery>")
    with pytest.raises(UserQueryError, match="DOCTYPE"):
        parse_xml_query(external)
    with pytest.raises(UserQueryError, match="over the limit"):
        parse_xml_query(b"<UserQuery>" + b" " * 70_000 + b"</UserQuery>")
    deep = b"<UserQuery>" + b"<Map>" * 20 + b"</Map>" * 20 + b"</UserQuery>"
    with pytest.raises(UserQueryError, match="nests deeper"):
        parse_xml_query(deep)
    with pytest.raises(UserQueryError, match="too many nested"):
        parse_json_query("[" * 10_000 + "]" * 10_000)


def test_content_from_a_request_element_in_any_namespace():
    root = etree.fromstring(b'<Content xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17">'
                            + FIGURE_4A.replace(b"<UserQuery>", b"<UserQuery>", 1) + b"</Content>")
    q = query_from_content(root[0])  # inherits the XACML namespace: names are matched locally
    assert q.window_size == 10
    assert query_from_content({"filter": "rainrate > 2"}).filter == "rainrate > 2"
    assert query_from_content('{"map": ["rainrate"]}').map == ("rainrate",)



@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=200),
                 st.text(max_size=200).map(lambda t: ("<UserQuery>" + t + "</UserQuery>").encode()),
                 st.recursive(st.one_of(st.none(), st.booleans(), st.integers(),
                                        st.text(max_size=8)),
                              lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                     st.dictionaries(st.sampled_from(
                                                         ["filter", "map", "window", "type", "size",
                                                          "step", "aggregates", "stream"]), kids,
                                                         max_size=4)),
                              max_leaves=10).map(lambda d: json.dumps(d).encode())))
def test_any_input_gives_a_query_or_a_user_query_error(data):
    try:
        user_graph(parse_user_query(data), "weather", WEATHER_SCHEMA)
    except UserQueryError as exc:
        assert exc.message


# -- issue 9, item 4: lone surrogates are refused with a position, never an internal error ----

def test_lone_surrogate_in_a_json_filter_is_refused_with_its_place():
    query = parse_json_query(b'{"filter": "shipname = \'\\ud800\'"}')  # the JSON escape
    with pytest.raises(UserQueryError) as info:
        user_graph(query, "ais", AIS_SCHEMA)
    assert info.value.position == "$.filter"
    assert "lone UTF-16 surrogate U+D800" in info.value.message
    assert "column 13" in info.value.message


def test_lone_surrogate_in_an_xml_filter_is_refused():
    # as a character reference, which lxml itself refuses, with line and column
    with pytest.raises(UserQueryError, match="malformed user query XML") as info:
        parse_xml_query(b"<UserQuery><Filter><FilterCondition>shipname = '&#xD800;'"
                        b"</FilterCondition></Filter></UserQuery>")
    assert info.value.position.startswith("line 1, column")
    # as the condition language's \u escape inside well-formed XML
    query = parse_xml_query(b"<UserQuery><Filter><FilterCondition>shipname = '\\ud800'"
                            b"</FilterCondition></Filter></UserQuery>")
    with pytest.raises(UserQueryError, match="lone UTF-16 surrogate"):
        user_graph(query, "ais", AIS_SCHEMA)


def test_xml_query_in_a_json_string_with_a_lone_surrogate_is_refused():
    # a JSON request's resource Content may carry the XML form as a string; "\udc00" in it
    # decodes to a character UTF-8 cannot encode (this was a UnicodeEncodeError, a 500)
    content = json.loads('"<UserQuery>\\n<Filter>\\udc00</Filter></UserQuery>"')
    with pytest.raises(UserQueryError, match="lone UTF-16 surrogate U\\+DC00") as info:
        query_from_content(content)
    assert info.value.position == "line 2, column 9"


def test_json_query_with_an_integer_past_pythons_digit_limit_is_refused():
    # json.loads raises a plain ValueError (not a JSONDecodeError) for it: it was a 500
    with pytest.raises(UserQueryError, match="malformed user query JSON: Exceeds the limit"):
        parse_json_query(b'{"window": {"type": "tuple", "size": ' + b"9" * 5000 + b', "step": 1}}')
