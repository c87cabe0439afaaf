"""Filter conditions: the small boolean language of stream-filter obligations and user queries.

A condition such as `(rainrate > 5 AND windspeed <= 20) OR NOT station = 'S1'` is parsed into an
immutable AST, then *bound* to a stream schema: attribute names are matched case-insensitively and
replaced by the schema's spelling, literals are checked against the attribute's type, and request
placeholders (`{subject:clearance}`) are replaced by typed literals. The AST never becomes SQL text
for execution: the runtime receives predicates as data, so no input can inject an expression.

Numbers are exact (`pep.core.exact`): an integer literal is a Python int and a decimal one a
`Decimal`, as written, never a float on the way. Bound to a double attribute a literal becomes a
double (double semantics); bound to a long it stays a 64-bit int, and to a timestamp it becomes
the gateway's text of a whole microsecond; a constant that is no value of those domains (2.5 for
a long, 1e30, a fraction of a microsecond) turns the comparison into its exact integer
equivalent (`account < 2.5` is `account <= 2`, `account = 2.5` holds for no value).

Set membership and boxes are written for people and bound into plain comparisons, so the
analysis, the runtime and the SQL text need nothing new: `a IN (1, 2)` is `a = 1 OR a = 2`,
`a NOT IN (...)` the AND of `!=`, and a placeholder in a set stands for a bag (every value the
gateway vouches for; an empty bag makes `IN` false and `NOT IN` true).
`WITHIN_BOX(lat, lon, south, west, north, east)` is `lat >= south AND lat <= north` with
`lon >= west AND lon <= east`, or, for a box across the 180th meridian (west > east),
`(lon >= west OR lon <= east)`.

Spatial predicates (the geometry and its conventions are in `pep.core.geo`) stay predicates of
their own, since no combination of comparisons expresses them:
- `DISTANCE(lat, lon, plat, plon) op r`: the haversine distance in metres (mean Earth radius
  6,371,008.8 m) from the tuple's position to the point (plat, plon), compared with r >= 0;
- `DISTANCE_TO(lat, lon, key, keyvalue) op r`: the distance to a *moving anchor*: the latest
  position reported on the same stream, strictly before this tuple in stream order, by the tuple
  whose `key` equals `keyvalue` (a captain's own ship). No known anchor position: false;
- `WITHIN_POLYGON(lat, lon, [lat1, lon1, lat2, lon2, ...])`: at least 3 and at most
  `MAX_POLYGON_VERTICES` vertices, or the vertex list from a bag placeholder
  (`{subject:port-bounds}`, a bag of doubles in the order the gateway holds them).
The point, the radius, the key value and the vertices may be literals or placeholders; the
coordinates must be numeric attributes. A tuple without a valid position fails a spatial
predicate and its negation alike (like any comparison over a missing value).

The steps, one module each: `syntax` (the AST, placeholders, limits, `ConditionError`, the AST as
text), `lexing` (text to tokens), `parsing` (tokens to the AST; the grammar is there), `binding`
(the AST bound to a schema), `evaluation` (a bound condition on one tuple). Callers import the
names below from `pep.core.conditions`, never from the step modules.
"""
from __future__ import annotations

from pdp import (
                 ACCESS_SUBJECT as SUBJECT_CATEGORY,
                 ACTION as ACTION_CATEGORY,
                 ENVIRONMENT as ENVIRONMENT_CATEGORY,
                 RESOURCE as RESOURCE_CATEGORY,
)
from pep.core.conditions.binding import PlaceholderResolver, bind, bind_literal, parse_condition
from pep.core.conditions.evaluation import COMPARATORS, AnchorLookup, evaluate, spatial_holds
from pep.core.conditions.parsing import QualifiedConjunct, parse, qualified_conjuncts
from pep.core.conditions.syntax import (
                 FALSE,
                 FLIPPED_OP,
                 LABEL_WORDS,
                 MAX_CONDITION_LENGTH,
                 MAX_NESTING_DEPTH,
                 MAX_SET_SIZE,
                 NEGATED_OP,
                 NUMERIC_TYPES,
                 PLACEHOLDER_CATEGORIES,
                 TRUE,
                 And,
                 Box,
                 Comparison,
                 ConditionError,
                 Const,
                 Expr,
                 Literal_,
                 Membership,
                 Not,
                 Or,
                 Placeholder,
                 Spatial,
                 Value,
                 attributes_of,
                 conjoin,
                 format_literal,
                 has_placeholders,
                 placeholders_in,
                 spatial_from_predicate,
                 spatial_parts,
                 spatial_text,
                 to_text,
)

__all__ = [
    "ACTION_CATEGORY", "ENVIRONMENT_CATEGORY", "FALSE", "FLIPPED_OP", "LABEL_WORDS",
    "MAX_CONDITION_LENGTH", "MAX_NESTING_DEPTH", "MAX_SET_SIZE", "NEGATED_OP", "NUMERIC_TYPES",
    "PLACEHOLDER_CATEGORIES", "RESOURCE_CATEGORY", "SUBJECT_CATEGORY", "TRUE", "And", "Box",
    "Comparison", "ConditionError", "Const", "Expr", "Literal_", "Membership", "Not", "Or",
    "Placeholder", "Spatial", "Value", "attributes_of", "conjoin", "format_literal",
    "has_placeholders", "placeholders_in", "spatial_from_predicate", "spatial_parts",
    "spatial_text", "to_text", "QualifiedConjunct", "parse", "qualified_conjuncts",
    "PlaceholderResolver", "bind", "bind_literal", "parse_condition", "COMPARATORS", "AnchorLookup",
    "evaluate", "spatial_holds",
]
