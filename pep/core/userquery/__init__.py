"""A consumer's own query on a stream, in XML (eXACML+ Figure 4(a)) or JSON, as a query graph.

XML form (element names as in the paper; the query may sit in the XACML request's resource
`<Content>` or travel beside the request):

    <UserQuery>
      <Stream name="weather"/>                         optional; must match the request's stream
      <Filter><FilterCondition>RainRate > 50</FilterCondition></Filter>
      <Map><Attribute>RainRate</Attribute></Map>        one <Attribute> per visible attribute
      <Mask><Attribute>RainRate:round:10</Attribute></Mask>   optional: coarser masks (below)
      <Aggregation>
        <WindowType>tuple</WindowType>                  tuple | time (seconds)
        <WindowSize>10</WindowSize>
        <WindowStep>2</WindowStep>
        <Attribute>avg(RainRate)</Attribute>            or RainRate:avg; repeated
        <Key>station</Key>                              optional, repeated: group by
        <MinCount>5</MinCount>                          optional: fewest tuples per window
        <Coarsen>true</Coarsen>                         optional: raise a finer window to the
                                                          policy's instead of refusing it
        <Epsilon>0.1</Epsilon>                          optional, under a differentially private
        <Delta>0</Delta>                                  window: less privacy loss per window
      </Aggregation>                                      than the policy's (never more)
    </UserQuery>

The paper's figure writes `<WindowSize>10<WindowSize>` (unclosed). That is not well-formed XML
and is refused, with lxml's line and column and a hint naming the element; a lenient parser in
front of an access-control decision is not worth the ambiguity.

JSON form (same meaning; every key optional except that a window needs type, size and step):

    {"stream": "weather", "filter": "rainrate > 50", "map": ["rainrate"],
     "mask": {"rainrate": "round:10"},
     "window": {"type": "tuple", "size": 10, "step": 2, "aggregates": ["rainrate:avg"],
                "keys": ["station"], "min_count": 5, "coarsen": true,
                "epsilon": 0.1, "delta": 0}}

`mask` asks for attributes in a coarser form than the policy's masks (`pep.core.masks`): an
object attribute -> mask (`{"speed": "round:20", "lat,lon": "grid:1"}`) or a list of
`attribute:mask` texts; in XML one `<Attribute>attribute:mask</Attribute>` per mask. A mask finer
than the policy's is refused (403). The query's filter, group-by keys, aggregates and a join's
condition read the masked values, never the raw ones.

Joins (a second stream, each side enforced by its own policy before the join; see
pep/core/join.py for the semantics): the top-level filter, map and window are the request's
stream's side, and a `join` names the second stream, the equalities that must hold between the
two sides' outputs, optionally a time bound, and the second side's own filter, map and window:

    {"filter": "rainrate > 5", "map": ["samplingtime", "station", "rainrate"],
     "join": {"stream": "ais", "on": [["station", "area"]], "within": 60,
              "filter": "speed > 1", "map": ["ts", "area", "mmsi"],
              "window": {...}}}

`on` is a non-empty list of [left attribute, right attribute] pairs (an attribute of a windowed
side is one of its window outputs: window_start, window_end, a group-by key or an aggregate's
output name such as avg_rainrate); `within` is in seconds (a number >= 0): a left and a right row
meet when their times are at most that far apart (a plain side's time is its stream's event-time
attribute, a windowed side's its window_end). `within` is required unless both sides are
time-windowed (then it defaults to 0: windows that end together meet). In XML, a `<Join>` element
inside `<UserQuery>` holds the same parts:

    <Join>
      <Stream name="ais"/>                             required
      <On left="station" right="area"/>                repeated, at least one
      <Within>60</Within>                              seconds
      <Filter>...</Filter> <Map>...</Map> <Aggregation>...</Aggregation>   the second side's
    </Join>

A join joins exactly two streams (no `join` inside a `join`), and two different ones.

An object `{"UserQuery": {...}}` is accepted too. Aggregates are "attr:function",
"function(attr)" or {"attribute": ..., "function": ...}. A window without aggregates asks for
whatever the policy's window allows, one without keys for the policy's group-by keys (`"keys": []`
for none); a minimum count below the policy's has no effect (the larger wins). Errors are
`UserQueryError(message, position)` (HTTP 400); the position is "line L, column C" for XML, a JSON
path such as "$.window.size" for JSON, or "filter, column C" for a condition.

The parts, one module each: `model` (the parsed query, its errors and limits), `xml_form`,
`json_form`, `reading` (which form, where it sits) and `to_graph` (against a schema, to a query
graph). Callers import the names below from `pep.core.userquery`.
"""
from __future__ import annotations

from pep.core.userquery.json_form import parse_json_query, query_from_json
from pep.core.userquery.model import (
                                      MAX_QUERY_BYTES,
                                      MAX_QUERY_DEPTH,
                                      JoinQuery,
                                      UserQuery,
                                      UserQueryError,
)
from pep.core.userquery.reading import parse_user_query, query_from_content
from pep.core.userquery.to_graph import user_graph
from pep.core.userquery.xml_form import parse_xml_query, query_from_element

__all__ = ["MAX_QUERY_BYTES", "MAX_QUERY_DEPTH", "JoinQuery", "UserQuery", "UserQueryError",
           "parse_xml_query", "query_from_element", "parse_json_query", "query_from_json",
           "parse_user_query", "query_from_content", "user_graph"]
