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

Grammar (keywords case-insensitive):

    condition  := or
    or         := and ( OR and )*
    and        := unary ( AND unary )*
    unary      := NOT unary | primary
    primary    := '(' condition ')' | TRUE | FALSE | operand op operand
                | attribute [NOT] IN ( '(' value ( ',' value )* ')' | placeholder )
                | WITHIN_BOX '(' attribute ',' attribute ',' value ',' value ',' value ',' value ')'
                | DISTANCE '(' attribute ',' attribute ',' value ',' value ')' op value
                | DISTANCE_TO '(' attribute ',' attribute ',' attribute ',' value ')' op value
                | WITHIN_POLYGON '(' attribute ',' attribute ',' ( '[' value ( ',' value )* ']'
                                                            | placeholder ) ')'
    operand    := attribute | value
    value      := number | string | TRUE | FALSE | placeholder
    placeholder:= '{' category ':' attribute '}'
    op         := < | > | <= | >= | = | == | != | <> | ≤ | ≥ | ≠

Exactly one side of a comparison must be an attribute. Limits (length, nesting, set sizes) are
enforced with clear errors, never with a RecursionError.

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
"""
from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Union

from pep.core import geo
from pep.core.exact import (MAX_MICROS, MIN_MICROS, ExactNumber, exact_decimal, in_timestamp_range,
                            integer_comparison, iso_from_micros, is_number, micros_from_iso,
                            micros_from_seconds)
from pep.core.labels import Label, LabelError, holds as label_holds
from pep.core.plan import Field, Scalar, SpatialPredicate, StreamSchema

MAX_CONDITION_LENGTH = 10_000
MAX_NESTING_DEPTH = 64
MAX_SET_SIZE = 1_000  # values in one IN set, literal or from a bag
# Integer literals longer than this cannot be finite doubles (1.8e308 has 309 digits)
_MAX_INTEGER_DIGITS = 309

SUBJECT_CATEGORY = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
RESOURCE_CATEGORY = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
ACTION_CATEGORY = "urn:oasis:names:tc:xacml:3.0:attribute-category:action"
ENVIRONMENT_CATEGORY = "urn:oasis:names:tc:xacml:3.0:attribute-category:environment"
PLACEHOLDER_CATEGORIES = {
    "subject": SUBJECT_CATEGORY,
    "resource": RESOURCE_CATEGORY,
    "action": ACTION_CATEGORY,
    "environment": ENVIRONMENT_CATEGORY,
}

NEGATED_OP = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "=": "!=", "!=": "="}
FLIPPED_OP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "!=": "!=",
              "dominated_by": "dominates", "dominates": "dominated_by"}
# Label comparisons (`pep.core.labels`): DOMINATED_BY / DOMINATES, bound to "<=" / ">=" on a
# label attribute (and refused on any other).
LABEL_WORDS = {"dominated_by": "<=", "dominates": ">="}
_OP_SPELLINGS = {"<": "<", ">": ">", "<=": "<=", ">=": ">=", "=": "=", "==": "=", "!=": "!=",
                 "<>": "!=", "≤": "<=", "≥": ">=", "≠": "!="}
NUMERIC_TYPES = frozenset({"double", "long", "timestamp"})


class ConditionError(ValueError):
    """A condition is malformed or does not fit the schema; `position` is a 1-based column."""

    def __init__(self, message: str, position: int | None = None, text: str | None = None) -> None:
        self.reason = message
        self.position = position
        where = ""
        if position is not None:
            where = f" at column {position}"
            if text and "\n" in text[: max(position - 1, 0)]:
                before = text[: position - 1]
                line = before.count("\n") + 1
                col = position - 1 - before.rfind("\n")
                where = f" at line {line}, column {col}"
        super().__init__(message + where)
        self.message = str(self)


# -- AST ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Placeholder:
    """`{category:attribute}`: a request attribute, substituted as a literal before use."""

    category: str  # the short category word as written: subject | resource | action | environment
    attribute: str
    position: int = 0

    def __str__(self) -> str:
        return "{%s:%s}" % (self.category, self.attribute)


Literal_ = Union[Scalar, Decimal]
"""A literal as parsed: integers are ints and decimals `Decimal`s, exact as written (binding
turns them into the attribute's representation: floats for doubles, see `pep.core.exact` for
longs and timestamps)."""
Value = Union[Literal_, Placeholder]


@dataclass(frozen=True)
class Comparison:
    attribute: str
    op: str  # one of pep.core.plan.OPERATORS
    value: Value
    position: int = 0  # column of the attribute, for error messages

    def __str__(self) -> str:
        return f"{self.attribute} {self.op} {format_literal(self.value)}"


@dataclass(frozen=True)
class And:
    items: tuple["Expr", ...]


@dataclass(frozen=True)
class Or:
    items: tuple["Expr", ...]


@dataclass(frozen=True)
class Not:
    item: "Expr"


@dataclass(frozen=True)
class Const:
    value: bool


@dataclass(frozen=True)
class Membership:
    """`attribute [NOT] IN <set>` before binding: the set is literals or one bag placeholder."""

    attribute: str
    values: tuple["Value", ...] | Placeholder
    negated: bool = False
    position: int = 0


@dataclass(frozen=True)
class Box:
    """`WITHIN_BOX(lat, lon, south, west, north, east)` before binding."""

    latitude: str
    longitude: str
    bounds: tuple["Value", "Value", "Value", "Value"]
    position: int = 0


@dataclass(frozen=True)
class Spatial:
    """A spatial predicate (see the module docstring); placeholders before binding, typed
    literals after.

    function "distance": `points` is (plat, plon); "distance_to": `points` is () and `key`,
    `key_value` name the anchor; for both, the distance in metres is compared with `radius` by
    `op`. function "polygon": `points` is the flat vertex list (or one bag placeholder before
    binding), `op` is "=" (inside) and `radius` 0; NOT WITHIN_POLYGON is a Not around it."""

    function: str
    latitude: str
    longitude: str
    op: str
    radius: "Value"
    points: tuple["Value", ...] | Placeholder
    key: str | None = None
    key_value: "Value | None" = None
    position: int = 0

    def __str__(self) -> str:
        return spatial_text(self)

    def to_predicate(self) -> SpatialPredicate:
        """The plan's form of a bound spatial predicate."""
        return SpatialPredicate(self.function, self.latitude, self.longitude, self.op,  # type: ignore[arg-type]
                                float(self.radius), tuple(float(p) for p in self.points),  # type: ignore[union-attr, arg-type]
                                self.key, self.key_value)  # type: ignore[arg-type]


def spatial_from_predicate(p: SpatialPredicate) -> Spatial:
    return Spatial(p.function, p.latitude, p.longitude, p.op, p.value, tuple(p.points), p.key,
                   p.key_value)


def spatial_text(s: Spatial | SpatialPredicate) -> str:
    """The condition language's text of a spatial predicate (parses back to it)."""
    if isinstance(s, SpatialPredicate):
        s = spatial_from_predicate(s)
    if s.function == "polygon":
        pts = (str(s.points) if isinstance(s.points, Placeholder)
               else "[" + ", ".join(format_literal(p) for p in s.points) + "]")
        negated = "NOT " if s.op == "!=" else ""
        return f"{negated}WITHIN_POLYGON({s.latitude}, {s.longitude}, {pts})"
    if s.function == "distance_to":
        head = f"DISTANCE_TO({s.latitude}, {s.longitude}, {s.key}, {format_literal(s.key_value)})"  # type: ignore[arg-type]
    else:
        plat, plon = s.points  # type: ignore[misc]
        head = (f"DISTANCE({s.latitude}, {s.longitude}, {format_literal(plat)}, "
                f"{format_literal(plon)})")
    return f"{head} {s.op} {format_literal(s.radius)}"


Expr = Union[Comparison, And, Or, Not, Const, Membership, Box, Spatial]
TRUE = Const(True)
FALSE = Const(False)


def format_literal(value: Value) -> str:
    """A literal as the condition language writes it (strings quoted and escaped)."""
    if isinstance(value, Placeholder):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Label):
        return "'" + str(value) + "'"
    return repr(value)


def to_text(expr: Expr) -> str:
    """Readable condition text that parses back to an equivalent AST."""
    if isinstance(expr, (Comparison, Spatial)):
        return str(expr)
    if isinstance(expr, Const):
        return "true" if expr.value else "false"
    if isinstance(expr, Not):
        return f"NOT ({to_text(expr.item)})"
    joiner = " AND " if isinstance(expr, And) else " OR "
    return joiner.join(
        f"({to_text(i)})" if isinstance(i, (And, Or)) else to_text(i) for i in expr.items)


def conjoin(items: Sequence[Expr]) -> Expr:
    flat: list[Expr] = []
    for item in items:
        if isinstance(item, And):
            flat.extend(item.items)
        elif item == TRUE:
            continue
        else:
            flat.append(item)
    if not flat:
        return TRUE
    return flat[0] if len(flat) == 1 else And(tuple(flat))


def attributes_of(expr: Expr) -> list[str]:
    """Attribute names in order of first appearance."""
    seen: dict[str, None] = {}
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Comparison):
            seen.setdefault(e.attribute, None)
        elif isinstance(e, Spatial):
            for name in (e.latitude, e.longitude, e.key):
                if name is not None:
                    seen.setdefault(name, None)
        elif isinstance(e, (And, Or)):
            stack.extend(reversed(e.items))
        elif isinstance(e, Not):
            stack.append(e.item)
    return list(seen)


def spatial_parts(expr: Expr) -> list[Spatial]:
    """The spatial predicates of a (bound) condition, in order."""
    out: list[Spatial] = []
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Spatial):
            out.append(e)
        elif isinstance(e, (And, Or)):
            stack.extend(reversed(e.items))
        elif isinstance(e, Not):
            stack.append(e.item)
    return out


def has_placeholders(expr: Expr) -> bool:
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Comparison) and isinstance(e.value, Placeholder):
            return True
        if isinstance(e, Spatial) and any(isinstance(v, Placeholder) for v in (
                e.radius, e.key_value, e.points,
                *(e.points if isinstance(e.points, tuple) else ()))):
            return True
        if isinstance(e, (And, Or)):
            stack.extend(e.items)
        elif isinstance(e, Not):
            stack.append(e.item)
    return False


def placeholders_in(text: str) -> list[tuple[str, str]]:
    """Every `{category:attribute}` in a text, as (category in lower case, attribute), found as
    the lexer finds them but anywhere (inside a quoted string too): for checks that must not
    miss one, such as which gateway attributes a policy's obligations could read."""
    return [(m.group(1).lower(), m.group(2)) for m in _PLACEHOLDER_RE.finditer(text)]


# -- lexer ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Token:
    kind: str  # IDENT NUMBER STRING BOOL AND OR NOT OP LPAREN RPAREN PLACEHOLDER EOF
    value: Any
    pos: int  # 1-based column


# [0-9], never \d (every Unicode decimal digit: '٣' would read as 3)
_NUMBER_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DIGITS = frozenset("0123456789")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `stream.attribute`, in conditions over two streams (a join grant's, `qualified_conjuncts`)
_QUALIFIED_IDENT_RE = re.compile(
    r"[A-Za-z_][A-Za-z0-9_-]*\.[A-Za-z_][A-Za-z0-9_]*|[A-Za-z_][A-Za-z0-9_]*")
_PLACEHOLDER_RE = re.compile(r"\{\s*([A-Za-z]+)\s*:\s*([^\s{}]+)\s*\}")
_KEYWORDS = {"and": "AND", "or": "OR", "not": "NOT", "in": "IN"}
_OP_WORDS = {"dominated_by": "dominated_by", "dominates": "dominates"}
_FUNCTIONS = {"within_box": "WITHIN_BOX"}
# Spatial functions are recognised only when '(' follows, so that an attribute may still be
# called `distance`.
_SPATIAL_FUNCTIONS = {"distance": "DISTANCE", "distance_to": "DISTANCE_TO",
                      "within_polygon": "WITHIN_POLYGON"}
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "0": "\0"}
_NON_FINITE = {"nan", "inf", "infinity"}


def _tokenize(text: str, qualified: bool = False) -> list[_Token]:
    tokens: list[_Token] = []
    ident_re = _QUALIFIED_IDENT_RE if qualified else _IDENT_RE
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        pos = i + 1
        if ch == "(":
            tokens.append(_Token("LPAREN", ch, pos)); i += 1; continue
        if ch == ")":
            tokens.append(_Token("RPAREN", ch, pos)); i += 1; continue
        if ch == ",":
            tokens.append(_Token("COMMA", ch, pos)); i += 1; continue
        if ch == "[":
            tokens.append(_Token("LBRACKET", ch, pos)); i += 1; continue
        if ch == "]":
            tokens.append(_Token("RBRACKET", ch, pos)); i += 1; continue
        two = text[i:i + 2]
        if two in ("<=", ">=", "==", "!=", "<>"):
            tokens.append(_Token("OP", _OP_SPELLINGS[two], pos)); i += 2; continue
        if ch in "<>=≤≥≠":
            tokens.append(_Token("OP", _OP_SPELLINGS[ch], pos)); i += 1; continue
        if ch in "'\"":
            value, i = _lex_string(text, i)
            tokens.append(_Token("STRING", value, pos))
            continue
        if ch == "{":
            m = _PLACEHOLDER_RE.match(text, i)
            if not m:
                raise ConditionError("malformed placeholder; expected {category:attribute}", pos, text)
            category = m.group(1).lower()
            if category not in PLACEHOLDER_CATEGORIES:
                raise ConditionError(
                    f"unknown placeholder category {m.group(1)!r}; expected one of "
                    f"{', '.join(PLACEHOLDER_CATEGORIES)}", pos, text)
            tokens.append(_Token("PLACEHOLDER", Placeholder(category, m.group(2), pos), pos))
            i = m.end()
            continue
        if ch in _DIGITS or (ch in "+-." and i + 1 < n and (text[i + 1] in _DIGITS
                                                            or text[i + 1] == ".")):
            m = _NUMBER_RE.match(text, i)
            if not m:
                raise ConditionError("malformed number", pos, text)
            lexeme = m.group(0)
            end = m.end()
            if end < n and (text[end].isalnum() or text[end] in "_."):
                raise ConditionError(f"malformed number {text[i:end + 1]!r}", pos, text)
            tokens.append(_Token("NUMBER", _number(lexeme, pos, text), pos))
            i = end
            continue
        m = ident_re.match(text, i)
        if m:
            word = m.group(0)
            low = word.lower()
            if low in _NON_FINITE:
                raise ConditionError(f"{word!r} is not allowed: NaN and infinity are not valid "
                                     "literals", pos, text)
            if low in _KEYWORDS:
                tokens.append(_Token(_KEYWORDS[low], word, pos))
            elif low in _OP_WORDS:
                tokens.append(_Token("OP", _OP_WORDS[low], pos))
            elif low in _FUNCTIONS:
                tokens.append(_Token("FUNCTION", _FUNCTIONS[low], pos))
            elif low in ("true", "false"):
                tokens.append(_Token("BOOL", low == "true", pos))
            else:
                tokens.append(_Token("IDENT", word, pos))
            i = m.end()
            continue
        if two in ("&&", "||"):
            raise ConditionError(f"unexpected {two!r}; write AND / OR", pos, text)
        raise ConditionError(f"unexpected character {ch!r}", pos, text)
    tokens.append(_Token("EOF", None, n + 1))
    return tokens


def _number(lexeme: str, pos: int, text: str) -> int | Decimal:
    """The literal's exact value: an int, or a Decimal when it has a fraction or an exponent
    (never a float: `9007199254740993.0` must stay that number for a long attribute). Numbers
    beyond the range of a double are refused, as no attribute could be compared with them."""
    if re.fullmatch(r"[+-]?[0-9]+", lexeme):
        # no int() of a long lexeme: past 4300 digits Python refuses with a ValueError of its own
        digits = lexeme.lstrip("+-").lstrip("0")
        if len(digits) <= _MAX_INTEGER_DIGITS and math.isfinite(float(lexeme)):
            return int(lexeme)
    else:
        value = Decimal(lexeme)
        if math.isfinite(float(value)):
            return value
    shown = lexeme if len(lexeme) <= 40 else f"{lexeme[:20]}..."
    raise ConditionError(f"number {shown} is not finite (beyond the range of a double)",
                         pos, text)


def _is_surrogate(ch: str) -> bool:
    return "\ud800" <= ch <= "\udfff"


def _lone_surrogate(ch: str, pos: int, text: str) -> ConditionError:
    return ConditionError(f"string has a lone UTF-16 surrogate U+{ord(ch):04X}, which is not a "
                          "character (write the character itself, or a \\u escape pair for "
                          "one beyond U+FFFF)", pos, text)


def _lex_string(text: str, start: int) -> tuple[str, int]:
    quote = text[start]
    out: list[str] = []
    i = start + 1
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == quote:
            return "".join(out), i + 1
        if ch == "\\":
            if i + 1 >= n:
                break
            esc = text[i + 1]
            if esc in _ESCAPES:
                out.append(_ESCAPES[esc]); i += 2; continue
            if esc == "u":
                code = _hex4(text, i + 2)
                if code is None:
                    raise ConditionError("malformed \\u escape; expected four hex digits", i + 1,
                                         text)
                if 0xD800 <= code <= 0xDBFF and text[i + 6:i + 8] == "\\u":
                    low = _hex4(text, i + 8)
                    if low is not None and 0xDC00 <= low <= 0xDFFF:  # a pair: one character
                        out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                        i += 12
                        continue
                if 0xD800 <= code <= 0xDFFF:
                    raise _lone_surrogate(chr(code), i + 1, text)
                out.append(chr(code)); i += 6; continue
            raise ConditionError(f"unknown escape \\{esc} in string", i + 1, text)
        if _is_surrogate(ch):
            raise _lone_surrogate(ch, i + 1, text)
        out.append(ch)
        i += 1
    raise ConditionError("unterminated string", start + 1, text)


def _hex4(text: str, at: int) -> int | None:
    digits = text[at:at + 4]
    if len(digits) == 4 and all(c in "0123456789abcdefABCDEF" for c in digits):
        return int(digits, 16)
    return None


# -- parser ---------------------------------------------------------------------------------------

class _Parser:
    def __init__(self, text: str, tokens: list[_Token]) -> None:
        self.text = text
        self.tokens = tokens
        self.i = 0

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def next(self) -> _Token:
        tok = self.tokens[self.i]
        if tok.kind != "EOF":  # the end stays the end, however far a rule reads
            self.i += 1
        return tok

    def error(self, message: str, tok: _Token) -> ConditionError:
        return ConditionError(message, tok.pos, self.text)

    def parse(self) -> Expr:
        if self.peek().kind == "EOF":
            raise self.error("empty condition", self.peek())
        expr = self.parse_or(0)
        tok = self.peek()
        if tok.kind != "EOF":
            if tok.kind == "RPAREN":
                raise self.error("unbalanced ')'", tok)
            raise self.error(f"unexpected {_describe(tok)}; expected AND, OR or the end", tok)
        return expr

    def parse_or(self, depth: int) -> Expr:
        items = [self.parse_and(depth)]
        while self.peek().kind == "OR":
            self.next()
            items.append(self.parse_and(depth))
        return items[0] if len(items) == 1 else Or(tuple(items))

    def parse_and(self, depth: int) -> Expr:
        items = [self.parse_unary(depth)]
        while self.peek().kind == "AND":
            self.next()
            items.append(self.parse_unary(depth))
        return items[0] if len(items) == 1 else And(tuple(items))

    def parse_unary(self, depth: int) -> Expr:
        tok = self.peek()
        if tok.kind == "NOT":
            self._check_depth(depth + 1, tok)
            self.next()
            return Not(self.parse_unary(depth + 1))
        return self.parse_primary(depth)

    def _check_depth(self, depth: int, tok: _Token) -> None:
        if depth > MAX_NESTING_DEPTH:
            raise self.error(f"condition nests deeper than {MAX_NESTING_DEPTH} levels", tok)

    def parse_primary(self, depth: int) -> Expr:
        tok = self.peek()
        if tok.kind == "LPAREN":
            self._check_depth(depth + 1, tok)
            self.next()
            if self.peek().kind == "RPAREN":
                raise self.error("empty parentheses", self.peek())
            inner = self.parse_or(depth + 1)
            close = self.next()
            if close.kind != "RPAREN":
                raise self.error(f"expected ')' to close the '(' at column {tok.pos}, "
                                 f"found {_describe(close)}", close)
            return inner
        if tok.kind == "BOOL" and self.tokens[self.i + 1].kind != "OP":
            self.next()
            return Const(tok.value)
        if tok.kind == "FUNCTION":
            return self.parse_box()
        if tok.kind == "IDENT" and tok.value.lower() in _SPATIAL_FUNCTIONS \
                and self.tokens[self.i + 1].kind == "LPAREN":
            return self.parse_spatial()
        if tok.kind == "IDENT" and (self.tokens[self.i + 1].kind == "IN" or (
                self.tokens[self.i + 1].kind == "NOT" and self.tokens[self.i + 2].kind == "IN")):
            return self.parse_membership()
        if tok.kind in ("IDENT", "NUMBER", "STRING", "BOOL", "PLACEHOLDER"):
            return self.parse_comparison()
        if tok.kind == "EOF":
            raise self.error("condition ends too early; expected a comparison", tok)
        raise self.error(f"unexpected {_describe(tok)}; expected a comparison", tok)

    def parse_comparison(self) -> Comparison:
        left = self.next()
        op = self.next()
        if op.kind != "OP":
            raise self.error(f"expected a comparison operator after {_describe(left)}, "
                             f"found {_describe(op)}", op)
        right = self.next()
        if right.kind not in ("IDENT", "NUMBER", "STRING", "BOOL", "PLACEHOLDER"):
            raise self.error(f"expected a value after {op.value!r}, found {_describe(right)}", right)
        if left.kind == "IDENT" and right.kind == "IDENT":
            raise self.error("comparing two attributes is not supported; compare an attribute "
                             "with a value", left)
        if left.kind == "IDENT":
            return Comparison(left.value, op.value, right.value, left.pos)
        if right.kind == "IDENT":
            return Comparison(right.value, FLIPPED_OP[op.value], left.value, right.pos)
        raise self.error("a comparison needs an attribute on one side", left)


    def parse_membership(self) -> Membership:
        attribute = self.next()
        negated = self.peek().kind == "NOT"
        if negated:
            self.next()
        self.next()  # IN
        tok = self.next()
        if tok.kind == "PLACEHOLDER":
            return Membership(attribute.value, tok.value, negated, attribute.pos)
        if tok.kind != "LPAREN":
            raise self.error(f"expected '(' or a placeholder after IN, found {_describe(tok)}",
                             tok)
        values: list[Value] = []
        while True:
            value = self.next()
            if value.kind not in ("NUMBER", "STRING", "BOOL", "PLACEHOLDER"):
                raise self.error(f"expected a value in the IN set, found {_describe(value)}",
                                 value)
            values.append(value.value)
            if len(values) > MAX_SET_SIZE:
                raise self.error(f"an IN set holds at most {MAX_SET_SIZE} values", value)
            sep = self.next()
            if sep.kind == "RPAREN":
                break
            if sep.kind != "COMMA":
                raise self.error(f"expected ',' or ')' in the IN set, found {_describe(sep)}",
                                 sep)
        return Membership(attribute.value, tuple(values), negated, attribute.pos)

    def parse_box(self) -> Box:
        name = self.next()
        if self.next().kind != "LPAREN":
            raise self.error(f"expected '(' after {name.value}", name)
        args: list[_Token] = []
        while True:
            arg = self.next()
            args.append(arg)
            sep = self.next()
            if sep.kind == "RPAREN":
                break
            if sep.kind != "COMMA" or len(args) >= 6:
                raise self.error(f"{name.value} takes (lat, lon, south, west, north, east)", sep)
        if len(args) != 6 or any(a.kind != "IDENT" for a in args[:2]) or any(
                a.kind not in ("NUMBER", "PLACEHOLDER") for a in args[2:]):
            raise self.error(f"{name.value} takes two attributes (latitude, longitude) and four "
                             "numbers or placeholders (south, west, north, east)", name)
        return Box(args[0].value, args[1].value, tuple(a.value for a in args[2:]),  # type: ignore
                   name.pos)


    def parse_spatial(self) -> Spatial:
        name = self.next()
        function = _SPATIAL_FUNCTIONS[name.value.lower()]
        self.next()  # LPAREN
        usage = {"DISTANCE": "DISTANCE(lat, lon, point_lat, point_lon) <op> metres",
                 "DISTANCE_TO": "DISTANCE_TO(lat, lon, key_attribute, key_value) <op> metres",
                 "WITHIN_POLYGON": "WITHIN_POLYGON(lat, lon, [lat1, lon1, lat2, lon2, ...]) or "
                                   "WITHIN_POLYGON(lat, lon, {category:attribute})"}[function]
        args: list[_Token] = []
        while True:
            if function == "WITHIN_POLYGON" and len(args) == 2:
                for a in args:
                    if a.kind != "IDENT":
                        raise self.error(f"{function}: expected an attribute, found "
                                         f"{_describe(a)} ({usage})", a)
                points = self.parse_vertices(name, usage)
                close = self.next()
                if close.kind != "RPAREN":
                    raise self.error(f"{function} takes three arguments: {usage}; found "
                                     f"{_describe(close)}", close)
                return Spatial("polygon", args[0].value, args[1].value, "=", 0.0, points,
                               position=name.pos)
            arg = self.next()
            args.append(arg)
            sep = self.next()
            if sep.kind == "RPAREN":
                break
            if sep.kind != "COMMA" or len(args) >= 4:
                raise self.error(f"{function} takes four arguments: {usage}; found "
                                 f"{_describe(sep)}", sep)
        if function == "WITHIN_POLYGON" or len(args) != 4:
            raise self.error(f"{function} takes {'three' if function == 'WITHIN_POLYGON' else 'four'}"
                             f" arguments, not {len(args)}: {usage}", name)
        attrs = args[:3] if function == "DISTANCE_TO" else args[:2]
        for a in attrs:
            if a.kind != "IDENT":
                raise self.error(f"{function}: expected an attribute, found {_describe(a)} "
                                 f"({usage})", a)
        values = args[3:] if function == "DISTANCE_TO" else args[2:]
        allowed = ("NUMBER", "STRING", "BOOL", "PLACEHOLDER") if function == "DISTANCE_TO" \
            else ("NUMBER", "PLACEHOLDER")
        for v in values:
            if v.kind not in allowed:
                what = "a value" if function == "DISTANCE_TO" else "a number or a placeholder"
                raise self.error(f"{function}: expected {what}, found {_describe(v)} ({usage})",
                                 v)
        op = self.next()
        if op.kind != "OP":
            raise self.error(f"{function}(...) must be compared with a distance in metres "
                             f"({usage}); found {_describe(op)}", op)
        radius = self.next()
        if radius.kind not in ("NUMBER", "PLACEHOLDER"):
            raise self.error(f"{function}(...) {op.value} needs a distance in metres (a number "
                             f"or a placeholder), found {_describe(radius)}", radius)
        if function == "DISTANCE_TO":
            return Spatial("distance_to", args[0].value, args[1].value, op.value, radius.value,
                           (), args[2].value, args[3].value, name.pos)
        return Spatial("distance", args[0].value, args[1].value, op.value, radius.value,
                       (args[2].value, args[3].value), position=name.pos)

    def parse_vertices(self, name: _Token, usage: str) -> tuple[Value, ...] | Placeholder:
        tok = self.next()
        if tok.kind == "PLACEHOLDER":
            return tok.value
        if tok.kind != "LBRACKET":
            raise self.error(f"WITHIN_POLYGON: expected '[' and the vertices, or a "
                             f"placeholder, found {_describe(tok)} ({usage})", tok)
        values: list[Value] = []
        while True:
            value = self.next()
            if value.kind not in ("NUMBER", "PLACEHOLDER"):
                raise self.error(f"WITHIN_POLYGON: expected a number in the vertex list, found "
                                 f"{_describe(value)}", value)
            values.append(value.value)
            if len(values) > 2 * geo.MAX_POLYGON_VERTICES:
                raise self.error(f"WITHIN_POLYGON: a polygon has at most "
                                 f"{geo.MAX_POLYGON_VERTICES} vertices", value)
            sep = self.next()
            if sep.kind == "RBRACKET":
                return tuple(values)
            if sep.kind != "COMMA":
                raise self.error(f"WITHIN_POLYGON: expected ',' or ']' in the vertex list, "
                                 f"found {_describe(sep)}", sep)


def _describe(tok: _Token) -> str:
    if tok.kind == "EOF":
        return "the end of the condition"
    if tok.kind == "STRING":
        return f"string {format_literal(tok.value)}"
    if tok.kind == "PLACEHOLDER":
        return f"placeholder {tok.value}"
    return repr(str(tok.value))


def parse(text: str) -> Expr:
    """Parse condition text into an unbound AST (attribute names as written)."""
    if not isinstance(text, str):
        raise ConditionError("a condition must be text")
    if len(text) > MAX_CONDITION_LENGTH:
        raise ConditionError(
            f"condition is {len(text)} characters long, over the limit of {MAX_CONDITION_LENGTH}")
    return _Parser(text, _tokenize(text)).parse()


@dataclass(frozen=True)
class QualifiedConjunct:
    """One top-level conjunct of a condition over two streams (`stream.attribute` names).

    Either an equality of two streams' attributes (`equality`: ((stream, attribute), (stream,
    attribute)), as written), or a condition on one stream's attributes: `stream` and `text`,
    the conjunct with its qualifiers removed, to be parsed against that stream's schema."""

    equality: tuple[tuple[str, str], tuple[str, str]] | None
    stream: str | None
    text: str
    position: int


def qualified_conjuncts(text: str) -> list[QualifiedConjunct]:
    """A join grant's condition split into its top-level conjuncts (see QualifiedConjunct).

    Every attribute is qualified with its stream; a conjunct that reads two streams must be an
    equality of two attributes (the joins' runtime evaluates equalities and a time bound
    between the sides, nothing else); ConditionError otherwise, naming the column."""
    if not isinstance(text, str):
        raise ConditionError("a condition must be text")
    if len(text) > MAX_CONDITION_LENGTH:
        raise ConditionError(
            f"condition is {len(text)} characters long, over the limit of {MAX_CONDITION_LENGTH}")
    tokens = _tokenize(text, qualified=True)
    if tokens[0].kind == "EOF":
        raise ConditionError("empty condition")
    parts: list[list[_Token]] = [[]]
    ends: list[int] = []
    depth = 0
    for tok in tokens:
        if tok.kind in ("LPAREN", "LBRACKET"):
            depth += 1
        elif tok.kind in ("RPAREN", "RBRACKET"):
            depth -= 1
        if tok.kind == "EOF" or (tok.kind == "AND" and depth == 0):
            ends.append(tok.pos - 1)
            if tok.kind != "EOF":
                parts.append([])
            continue
        parts[-1].append(tok)
    out = []
    for part, end in zip(parts, ends):
        if not part:
            raise ConditionError("empty conjunct around AND", end + 1, text)
        attributes = [(i, t) for i, t in enumerate(part) if t.kind == "IDENT" and not (
            i + 1 < len(part) and part[i + 1].kind == "LPAREN")]
        for _, t in attributes:
            if "." not in t.value:
                raise ConditionError(f"attribute {t.value!r} must be qualified with its stream "
                                     "(stream.attribute) in a condition over two streams",
                                     t.pos, text)
        streams = list(dict.fromkeys(t.value.split(".", 1)[0] for _, t in attributes))
        start = part[0].pos - 1
        if len(part) == 3 and len(attributes) == 2 and part[1].kind == "OP" \
                and part[1].value == "=" and len(streams) == 2:
            a, b = (t.value.split(".", 1) for t in (part[0], part[2]))
            out.append(QualifiedConjunct(((a[0], a[1]), (b[0], b[1])), None,
                                         text[start:end].strip(), part[0].pos))
            continue
        if len(streams) != 1:
            what = "no attribute" if not streams else "attributes of two streams"
            raise ConditionError(f"a conjunct with {what} must be an equality of two streams' "
                                 "attributes (a.x = b.y) or a condition on one stream",
                                 part[0].pos, text)
        piece = text[start:end]
        for _, t in reversed(attributes):
            at = t.pos - 1 - start
            piece = piece[:at] + t.value.split(".", 1)[1] + piece[at + len(t.value):]
        out.append(QualifiedConjunct(None, streams[0], piece.strip(), part[0].pos))
    return out


# -- binding to a schema --------------------------------------------------------------------------

PlaceholderResolver = Callable[[str, str], Sequence[str]]
"""(category URI, attribute as written) -> the request's lexical values for it."""


def bind(expr: Expr, schema: StreamSchema, *, resolver: PlaceholderResolver | None = None,
         text: str | None = None, allow_placeholders: bool = True) -> Expr:
    """Canonical attribute names, typed literals, placeholders replaced; errors name the culprit."""
    if isinstance(expr, Comparison):
        return _bind_comparison(expr, schema, resolver, text, allow_placeholders)
    if isinstance(expr, Const):
        return expr
    if isinstance(expr, Membership):
        return _bind_membership(expr, schema, resolver, text, allow_placeholders)
    if isinstance(expr, Box):
        return _bind_box(expr, schema, resolver, text, allow_placeholders)
    if isinstance(expr, Spatial):
        return _bind_spatial(expr, schema, resolver, text, allow_placeholders)
    if isinstance(expr, Not):
        return Not(bind(expr.item, schema, resolver=resolver, text=text,
                        allow_placeholders=allow_placeholders))
    items = tuple(bind(i, schema, resolver=resolver, text=text,
                       allow_placeholders=allow_placeholders) for i in expr.items)
    return And(items) if isinstance(expr, And) else Or(items)


def _unknown_attribute(name: object, schema: StreamSchema, what: str = "attribute") -> str:
    return f"unknown {what} {name!r}; the stream has: {', '.join(schema.names)}"


def _bind_membership(m: Membership, schema: StreamSchema, resolver: PlaceholderResolver | None,
                     text: str | None, allow_placeholders: bool) -> Expr:
    field = schema.lookup(m.attribute)
    if field is None:
        raise ConditionError(
            _unknown_attribute(m.attribute, schema), m.position, text)
    if isinstance(m.values, Placeholder):
        if not allow_placeholders:
            raise ConditionError(f"placeholder {m.values} is not allowed here (placeholders "
                                 "belong in policy obligations)", m.values.position, text)
        if resolver is None:
            raise ConditionError(f"placeholder {m.values} cannot be resolved: no request "
                                 "attributes", m.values.position, text)
        bag = list(dict.fromkeys(resolver(PLACEHOLDER_CATEGORIES[m.values.category],
                                          m.values.attribute)))
        if len(bag) > MAX_SET_SIZE:
            raise ConditionError(f"placeholder {m.values} has {len(bag)} values; an IN set holds "
                                 f"at most {MAX_SET_SIZE}", m.values.position, text)
        op = "!=" if m.negated else "="
        pairs = []
        for lexical in bag:
            literal = _placeholder_literal(lexical, m.values, field, text)
            pairs.append(bind_literal(op, literal, field, m.values.position, text))
    else:
        pairs = []
        for v in m.values:
            cmp = _bind_comparison(Comparison(field.name, "!=" if m.negated else "=", v,
                                              m.position), schema, resolver, text,
                                   allow_placeholders)
            pairs.append((cmp.op, cmp.value))
    # `op` may differ from = / != where a long or timestamp constant is not a value of the
    # attribute (`n IN (2.5)`): the comparison holds for no present value (see bind_literal)
    pairs = list(dict.fromkeys(pairs))
    if not pairs:
        return TRUE if m.negated else FALSE
    items = tuple(Comparison(field.name, op_, v, m.position) for op_, v in pairs)
    if len(items) == 1:
        return items[0]
    return And(items) if m.negated else Or(items)


def _bind_box(box: Box, schema: StreamSchema, resolver: PlaceholderResolver | None,
              text: str | None, allow_placeholders: bool) -> Expr:
    def bound(attribute: str, op: str, value: Value) -> Comparison:
        return _bind_comparison(Comparison(attribute, op, value, box.position), schema,
                                resolver, text, allow_placeholders)

    for attribute in (box.latitude, box.longitude):
        f = schema.lookup(attribute)
        if f is not None and f.type not in ("double", "long"):
            raise ConditionError(f"WITHIN_BOX needs numeric coordinates; {f.name!r} is {f.type}",
                                 box.position, text)
    south, west, north, east = box.bounds
    lat_low, lat_high = bound(box.latitude, ">=", south), bound(box.latitude, "<=", north)
    lon_low, lon_high = bound(box.longitude, ">=", west), bound(box.longitude, "<=", east)
    # checked on the numbers as given: a long coordinate's comparison may hold a rewritten bound
    s_, w_, n_, e_ = (float(_resolve_value(v, Field("bound", "double"), resolver, text,  # type: ignore[arg-type]
                                           allow_placeholders)) for v in box.bounds)
    if not -90 <= s_ <= n_ <= 90:
        raise ConditionError("WITHIN_BOX: latitudes must satisfy -90 <= south <= north <= 90",
                             box.position, text)
    if not (-180 <= w_ <= 180 and -180 <= e_ <= 180):
        raise ConditionError("WITHIN_BOX: longitudes must be within -180 and 180", box.position,
                             text)
    if w_ <= e_:
        return And((lat_low, lat_high, lon_low, lon_high))
    return And((lat_low, lat_high, Or((lon_low, lon_high))))  # across the 180th meridian


_NAMES = {"distance": "DISTANCE", "distance_to": "DISTANCE_TO", "polygon": "WITHIN_POLYGON"}


def _bind_spatial(s: Spatial, schema: StreamSchema, resolver: PlaceholderResolver | None,
                  text: str | None, allow_placeholders: bool) -> Spatial:
    name = _NAMES[s.function]

    def fail(message: str, position: int | None = None) -> ConditionError:
        return ConditionError(f"{name}: {message}", s.position if position is None else position,
                              text)

    def coordinate_field(attribute: str) -> Field:
        f = schema.lookup(attribute)
        if f is None:
            raise fail(_unknown_attribute(attribute, schema))
        if f.type not in ("double", "long"):
            raise fail(f"coordinates must be numeric attributes; {f.name!r} is {f.type}")
        return f

    def placeholder_allowed(ph: Placeholder) -> None:
        if not allow_placeholders:
            raise fail(f"placeholder {ph} is not allowed here (placeholders belong in policy "
                       "obligations)", ph.position)
        if resolver is None:
            raise fail(f"placeholder {ph} cannot be resolved: no request attributes",
                       ph.position)

    def number(value: Value, what: str) -> float:
        if isinstance(value, Placeholder):
            placeholder_allowed(value)
            try:
                literal = _resolve_placeholder(value, Field(what, "double"), resolver, text)
            except ConditionError as exc:
                raise fail(f"{what}: {exc.reason}", value.position) from None
            return float(literal)  # type: ignore[arg-type]
        if not is_number(value):
            raise fail(f"{what} must be a number, not {format_literal(value)}")
        number_ = float(value)
        if not math.isfinite(number_):
            raise fail(f"{what} must be a finite number")
        return number_

    def latitude(value: float, what: str) -> float:
        if not -90.0 <= value <= 90.0:
            raise fail(f"{what} {format_literal(value)} is not a latitude (-90 to 90)")
        return value

    def longitude(value: float, what: str) -> float:
        if not -180.0 <= value <= 180.0:
            raise fail(f"{what} {format_literal(value)} is not a longitude (-180 to 180)")
        return value

    lat_field = coordinate_field(s.latitude)
    lon_field = coordinate_field(s.longitude)
    if lat_field.name == lon_field.name:
        raise fail(f"latitude and longitude are the same attribute {lat_field.name!r}")
    if s.function == "polygon":
        if isinstance(s.points, Placeholder):
            placeholder_allowed(s.points)
            lexicals = list(resolver(PLACEHOLDER_CATEGORIES[s.points.category],  # type: ignore[misc]
                                     s.points.attribute))
            if len(lexicals) > 2 * geo.MAX_POLYGON_VERTICES:
                raise fail(f"placeholder {s.points} has {len(lexicals)} values; a polygon has at "
                           f"most {geo.MAX_POLYGON_VERTICES} vertices", s.points.position)
            raw: list[float] = []
            for lexical in lexicals:
                try:
                    v = float(str(lexical).strip())
                except ValueError:
                    v = math.nan
                if not math.isfinite(v):
                    raise fail(f"placeholder {s.points}: value {lexical!r} is not a finite "
                               "number", s.points.position)
                raw.append(v)
            where = f"placeholder {s.points}"
        else:
            raw = [number(v, "a vertex coordinate") for v in s.points]
            where = "the vertex list"
        if len(raw) % 2:
            raise fail(f"{where} has {len(raw)} numbers; vertices are (lat, lon) pairs, so the "
                       "count must be even")
        if len(raw) < 6:
            raise fail(f"{where} has {len(raw) // 2} vertices; a polygon needs at least 3")
        if len(raw) > 2 * geo.MAX_POLYGON_VERTICES:
            raise fail(f"{where} has {len(raw) // 2} vertices; at most "
                       f"{geo.MAX_POLYGON_VERTICES} are allowed")
        for k in range(0, len(raw), 2):
            latitude(raw[k], f"vertex {k // 2 + 1}: latitude")
            longitude(raw[k + 1], f"vertex {k // 2 + 1}: longitude")
        return Spatial("polygon", lat_field.name, lon_field.name, "=", 0.0, tuple(raw),
                       position=s.position)
    if s.op not in ("<", "<=", ">", ">="):
        raise fail(f"the distance is compared with <, <=, > or >=, not {s.op!r}")
    radius = number(s.radius, "the distance")
    if radius < 0:
        raise fail(f"the distance {format_literal(radius)} is negative; metres are >= 0")
    if s.function == "distance":
        plat, plon = s.points  # type: ignore[misc]
        point = (latitude(number(plat, "the point's latitude"), "the point's latitude"),
                 longitude(number(plon, "the point's longitude"), "the point's longitude"))
        return Spatial("distance", lat_field.name, lon_field.name, s.op, radius, point,
                       position=s.position)
    key_field = schema.lookup(s.key or "")
    if key_field is None:
        raise fail(_unknown_attribute(s.key, schema, "key attribute"))
    if key_field.name in (lat_field.name, lon_field.name):
        raise fail(f"the key attribute {key_field.name!r} cannot be a coordinate")
    key = _bind_comparison(Comparison(key_field.name, "=", s.key_value, s.position),  # type: ignore[arg-type]
                           schema, resolver, text, allow_placeholders)
    if key.op != "=":  # 2.5 for a long key: no anchor could ever be that tuple
        raise fail(f"the key value {format_literal(s.key_value)} is not a value of "  # type: ignore[arg-type]
                   f"{key_field.type} attribute {key_field.name!r}")
    return Spatial("distance_to", lat_field.name, lon_field.name, s.op, radius, (),
                   key_field.name, key.value, s.position)


def parse_condition(text: str, schema: StreamSchema, *, resolver: PlaceholderResolver | None = None,
                    allow_placeholders: bool = True) -> Expr:
    """Parse and bind in one step."""
    return bind(parse(text), schema, resolver=resolver, text=text,
                allow_placeholders=allow_placeholders)


def _bind_comparison(cmp: Comparison, schema: StreamSchema, resolver: PlaceholderResolver | None,
                     text: str | None, allow_placeholders: bool) -> Comparison:
    """The comparison bound to its attribute: canonical name, the constant in the attribute's
    representation, and for longs and timestamps the exact integer form (`bind_literal`), which
    may change the operator."""
    field = schema.lookup(cmp.attribute)
    if field is None:
        raise ConditionError(
            _unknown_attribute(cmp.attribute, schema), cmp.position, text)
    value = _resolve_value(cmp.value, field, resolver, text, allow_placeholders)
    position = cmp.value.position if isinstance(cmp.value, Placeholder) else cmp.position
    if field.type == "boolean" and cmp.op not in ("=", "!="):
        raise ConditionError(f"boolean attribute {field.name!r} can only be compared with = or !=",
                             cmp.position, text)
    op = cmp.op
    if op in LABEL_WORDS:
        if field.type != "label":
            raise ConditionError(f"{op.upper()} compares security labels; {field.type} "
                                 f"attribute {field.name!r} is none", cmp.position, text)
        op = LABEL_WORDS[op]
    op, bound = bind_literal(op, value, field, position, text)
    return Comparison(field.name, op, bound, cmp.position)


def _resolve_value(value: Value, field: Field, resolver: PlaceholderResolver | None,
                   text: str | None, allow_placeholders: bool) -> Literal_:
    """A literal as written, or a placeholder's one value read for this field (not yet bound)."""
    if not isinstance(value, Placeholder):
        return value
    if not allow_placeholders:
        raise ConditionError(f"placeholder {value} is not allowed here (placeholders belong "
                             "in policy obligations)", value.position, text)
    return _resolve_placeholder(value, field, resolver, text)


def bind_literal(op: str, value: Literal_, field: Field, position: int | None = None,
                 text: str | None = None) -> tuple[str, Scalar]:
    """`field op value` as the plan states it: doubles as floats (double semantics: an integer
    beyond 2^53 is rounded, as the attribute's own values are); longs as 64-bit ints and
    timestamps as the gateway's text of a whole microsecond, both exact, a constant that is not
    a value of the domain (2.5 for a long, beyond its range, a fraction of a microsecond)
    turning the comparison into its exact integer equivalent (`pep.core.exact`)."""
    kind = field.type
    if kind == "label":
        if not isinstance(value, (str, Label)) or field.lattice is None:
            raise ConditionError(f"type mismatch: label attribute {field.name!r} compared with "
                                 f"{format_literal(value)} (write a label as text, 'S:{{a,b}}')",
                                 position, text)
        try:
            return op, field.lattice.parse(str(value))
        except LabelError as exc:
            raise ConditionError(f"label attribute {field.name!r}: {exc}", position, text) \
                from None
    if kind in ("double", "long"):
        if not is_number(value):
            raise ConditionError(f"type mismatch: {kind} attribute {field.name!r} compared with "
                                 f"{format_literal(value)}", position, text)
        if kind == "double":
            number = float(value)  # type: ignore[arg-type]
            if not math.isfinite(number):
                raise ConditionError(f"number {format_literal(value)} is beyond the range of a "
                                     "double", position, text)
            return op, number
        return integer_comparison(op, value)  # type: ignore[arg-type]
    if kind == "timestamp":
        if isinstance(value, bool):
            raise ConditionError(f"type mismatch: timestamp attribute {field.name!r} compared with "
                                 f"{format_literal(value)}", position, text)
        if is_number(value):
            micros = micros_from_seconds(value)  # type: ignore[arg-type]
            if not in_timestamp_range(micros):
                raise ConditionError(
                    f"timestamp attribute {field.name!r} compared with {format_literal(value)} "
                    "epoch seconds, out of the range of timestamps (years 1 to 9999)",
                    position, text)
        else:
            micros = _parse_timestamp(value, field, position, text)  # type: ignore[arg-type]
        op, whole = integer_comparison(op, micros, MIN_MICROS, MAX_MICROS)
        return op, iso_from_micros(whole)
    if kind == "string":
        if not isinstance(value, str):
            raise ConditionError(f"type mismatch: string attribute {field.name!r} compared with "
                                 f"{format_literal(value)} (quote strings)", position, text)
        return op, value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise ConditionError(f"type mismatch: boolean attribute {field.name!r} compared with "
                                 f"{format_literal(value)}", position, text)
        return op, value
    raise ConditionError(f"attribute {field.name!r} has unsupported type {kind!r}", position, text)


def _parse_timestamp(value: str, field: Field, position: int | None, text: str | None
                     ) -> ExactNumber:
    """Epoch microseconds of ISO-8601 text, exactly (a fraction of a microsecond is kept)."""
    try:
        micros = micros_from_iso(value)
    except (ValueError, OverflowError):
        raise ConditionError(f"timestamp attribute {field.name!r} compared with "
                             f"{format_literal(value)}, which is not an ISO-8601 date-time",
                             position, text) from None
    if not in_timestamp_range(micros):
        raise ConditionError(f"timestamp attribute {field.name!r} compared with "
                             f"{format_literal(value)}, which is outside years 1 to 9999 in UTC",
                             position, text)
    return micros


def _resolve_placeholder(ph: Placeholder, field: Field, resolver: PlaceholderResolver | None,
                         text: str | None) -> Literal_:
    if resolver is None:
        raise ConditionError(f"placeholder {ph} cannot be resolved: no request attributes",
                             ph.position, text)
    values = list(resolver(PLACEHOLDER_CATEGORIES[ph.category], ph.attribute))
    if not values:
        raise ConditionError(f"placeholder {ph}: the request has no such attribute", ph.position, text)
    if len(set(values)) > 1:
        raise ConditionError(f"placeholder {ph}: the request has {len(values)} values for it; "
                             "exactly one is needed", ph.position, text)
    return _placeholder_literal(values[0], ph, field, text)


def _placeholder_literal(lexical: str, ph: Placeholder, field: Field, text: str | None
                         ) -> Literal_:
    try:
        return _lexical_for(lexical, field)
    except (ValueError, ArithmeticError):
        raise ConditionError(f"placeholder {ph}: value {lexical!r} is not a valid {field.type} "
                             f"for attribute {field.name!r}", ph.position, text) from None


def _exact_number(lexical: str) -> int | Decimal:
    """A request attribute's lexical number, exactly (ValueError if it is none, or beyond the
    range of a double)."""
    stripped = lexical.strip()
    if re.fullmatch(r"[+-]?[0-9]{1,%d}" % _MAX_INTEGER_DIGITS, stripped):
        number: int | Decimal = int(stripped)
    else:
        number = exact_decimal(stripped)
    if not math.isfinite(float(number)):
        raise ValueError(lexical)
    return number


def _lexical_for(lexical: str, field: Field) -> Literal_:
    if field.type in ("double", "long"):
        return _exact_number(lexical)
    if field.type == "boolean":
        low = lexical.strip().lower()
        if low in ("true", "1"):
            return True
        if low in ("false", "0"):
            return False
        raise ValueError(lexical)
    if field.type == "timestamp":
        try:
            return _exact_number(lexical)  # epoch seconds
        except (ValueError, ArithmeticError):
            return lexical.strip()
    return lexical


# -- evaluation -----------------------------------------------------------------------------------

# The comparison operators by their symbol; they work on Python values and on Spark Columns alike.
COMPARATORS: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
    ">=": operator.ge}


def _compare(left: Any, op: str, right: Any) -> bool:
    if isinstance(right, Label):  # a label attribute's value: its text or a Label
        try:
            value = left if isinstance(left, Label) else right.lattice.parse(left)
        except LabelError:
            return False
        return label_holds(value, op, right)
    return COMPARATORS[op](left, right)


AnchorLookup = Callable[[str, Scalar, str, str], "tuple[float, float] | None"]
"""(key attribute, key value, latitude attribute, longitude attribute) -> the anchor's latest
position before the tuple being evaluated, or None when none is known."""


def evaluate(expr: Expr, row: Mapping[str, Any], *, anchor: AnchorLookup | None = None) -> bool:
    """Truth of a bound condition on one tuple, with SQL semantics for missing values.

    Row values are as the runtime delivers them: numbers (Python's ints for longs, compared
    exactly), strings, booleans, and timestamps as `YYYY-MM-DDTHH:MM:SS.ffffffZ` text (fixed
    width, so they compare in time order with bound timestamp constants).
    A comparison with a missing (None) attribute is unknown; unknown propagates through
    AND/OR/NOT by Kleene's rules and an unknown condition lets the tuple through no more than
    false does. This equals pushing NOT down to the comparisons and treating any comparison
    over a missing attribute as false, which is what the execution plan states. A spatial
    predicate is unknown on a tuple without a valid position, and DISTANCE_TO also when
    `anchor` knows no position for its anchor (no `anchor`: none is known).
    """
    result = _eval3(expr, row, anchor)
    return result is True


def spatial_holds(s: Spatial | SpatialPredicate, row: Mapping[str, Any],
                  anchor: AnchorLookup | None = None) -> bool | None:
    """A bound spatial predicate on one tuple: True, False or None (unknown)."""
    lat, lon = row.get(s.latitude), row.get(s.longitude)
    if not geo.valid_position(lat, lon):
        return None
    if s.function == "polygon":
        inside = geo.in_polygon(float(lat), float(lon), s.points)  # type: ignore[arg-type]
        return inside if s.op == "=" else not inside
    if s.function == "distance":
        plat, plon = s.points  # type: ignore[misc]
        d = geo.haversine(float(lat), float(lon), plat, plon)  # type: ignore[arg-type]
    else:
        where = anchor(s.key, s.key_value, s.latitude, s.longitude) if anchor else None  # type: ignore[arg-type]
        if where is None or not geo.valid_position(*where):
            return None
        d = geo.haversine(float(lat), float(lon), where[0], where[1])
    radius = s.radius if isinstance(s, Spatial) else s.value
    return _compare(d, s.op, radius)


def _eval3(expr: Expr, row: Mapping[str, Any], anchor: AnchorLookup | None = None
           ) -> bool | None:
    if isinstance(expr, Comparison):
        value = row.get(expr.attribute)
        if value is None:
            return None
        return _compare(value, expr.op, expr.value)
    if isinstance(expr, Spatial):
        return spatial_holds(expr, row, anchor)
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Not):
        inner = _eval3(expr.item, row, anchor)
        return None if inner is None else not inner
    if isinstance(expr, And):
        result: bool | None = True
        for item in expr.items:
            v = _eval3(item, row, anchor)
            if v is False:
                return False
            if v is None:
                result = None
        return result
    result = False
    for item in expr.items:
        v = _eval3(item, row, anchor)
        if v is True:
            return True
        if v is None:
            result = None
    return result
