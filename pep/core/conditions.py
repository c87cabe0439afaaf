"""Filter conditions: the small boolean language of stream-filter obligations and user queries.

A condition such as `(rainrate > 5 AND windspeed <= 20) OR NOT station = 'S1'` is parsed into an
immutable AST, then *bound* to a stream schema: attribute names are matched case-insensitively and
replaced by the schema's spelling, literals are checked against the attribute's type, and request
placeholders (`{subject:clearance}`) are replaced by typed literals. The AST never becomes SQL text
for execution: the runtime receives predicates as data, so no input can inject an expression.

Grammar (keywords case-insensitive):

    condition  := or
    or         := and ( OR and )*
    and        := unary ( AND unary )*
    unary      := NOT unary | primary
    primary    := '(' condition ')' | TRUE | FALSE | operand op operand
                | attribute [NOT] IN ( '(' value ( ',' value )* ')' | placeholder )
                | WITHIN_BOX '(' attribute ',' attribute ',' value ',' value ',' value ',' value ')'
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
"""
from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Union

from pep.core.plan import Field, Scalar, StreamSchema

MAX_CONDITION_LENGTH = 10_000
MAX_NESTING_DEPTH = 64
MAX_SET_SIZE = 1_000  # values in one IN set, literal or from a bag
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Timestamps are instants of years 1 to 9999 (UTC), as Python's datetime and Spark's TIMESTAMP
# both hold them; a constant outside can be neither compared nor shown. In epoch seconds: from
# 0001-01-01T00:00:00Z up to, not including, 10000-01-01T00:00:00Z.
MIN_EPOCH_SECONDS = -62_135_596_800.0
END_EPOCH_SECONDS = 253_402_300_800.0

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
FLIPPED_OP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "!=": "!="}
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


Value = Union[Scalar, Placeholder]


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


Expr = Union[Comparison, And, Or, Not, Const, Membership, Box]
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
    return repr(value)


def to_text(expr: Expr) -> str:
    """Readable condition text that parses back to an equivalent AST."""
    if isinstance(expr, Comparison):
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
        elif isinstance(e, (And, Or)):
            stack.extend(reversed(e.items))
        elif isinstance(e, Not):
            stack.append(e.item)
    return list(seen)


def has_placeholders(expr: Expr) -> bool:
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Comparison) and isinstance(e.value, Placeholder):
            return True
        if isinstance(e, (And, Or)):
            stack.extend(e.items)
        elif isinstance(e, Not):
            stack.append(e.item)
    return False


# -- lexer ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Token:
    kind: str  # IDENT NUMBER STRING BOOL AND OR NOT OP LPAREN RPAREN PLACEHOLDER EOF
    value: Any
    pos: int  # 1-based column


_NUMBER_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLACEHOLDER_RE = re.compile(r"\{\s*([A-Za-z]+)\s*:\s*([^\s{}]+)\s*\}")
_KEYWORDS = {"and": "AND", "or": "OR", "not": "NOT", "in": "IN"}
_FUNCTIONS = {"within_box": "WITHIN_BOX"}
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "0": "\0"}
_NON_FINITE = {"nan", "inf", "infinity"}


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
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
        if ch.isdigit() or (ch in "+-." and i + 1 < n and (text[i + 1].isdigit() or text[i + 1] == ".")):
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
        m = _IDENT_RE.match(text, i)
        if m:
            word = m.group(0)
            low = word.lower()
            if low in _NON_FINITE:
                raise ConditionError(f"{word!r} is not allowed: NaN and infinity are not valid "
                                     "literals", pos, text)
            if low in _KEYWORDS:
                tokens.append(_Token(_KEYWORDS[low], word, pos))
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


def _number(lexeme: str, pos: int, text: str) -> int | float:
    if re.fullmatch(r"[+-]?\d+", lexeme):
        # no int() of a long lexeme: past 4300 digits Python refuses with a ValueError of its own
        digits = lexeme.lstrip("+-").lstrip("0")
        value: int | float = int(lexeme) if len(digits) <= 19 else _INT64_MAX + 1
        if not _INT64_MIN <= value <= _INT64_MAX:
            shown = lexeme if len(lexeme) <= 40 else f"{lexeme[:20]}... ({len(digits)} digits)"
            raise ConditionError(f"integer {shown} is out of the 64-bit range", pos, text)
        return value
    value = float(lexeme)
    if not math.isfinite(value):
        shown = lexeme if len(lexeme) <= 40 else f"{lexeme[:20]}..."
        raise ConditionError(f"number {shown} is not finite (beyond the range of a double)",
                             pos, text)
    return value


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
    if isinstance(expr, Not):
        return Not(bind(expr.item, schema, resolver=resolver, text=text,
                        allow_placeholders=allow_placeholders))
    items = tuple(bind(i, schema, resolver=resolver, text=text,
                       allow_placeholders=allow_placeholders) for i in expr.items)
    return And(items) if isinstance(expr, And) else Or(items)


def _bind_membership(m: Membership, schema: StreamSchema, resolver: PlaceholderResolver | None,
                     text: str | None, allow_placeholders: bool) -> Expr:
    field = schema.lookup(m.attribute)
    if field is None:
        raise ConditionError(
            f"unknown attribute {m.attribute!r}; the stream has: {', '.join(schema.names)}",
            m.position, text)
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
        literals = []
        for lexical in bag:
            try:
                literals.append(coerce_literal(_lexical_for(lexical, field), field, m.position,
                                               text))
            except ValueError:
                raise ConditionError(f"placeholder {m.values}: value {lexical!r} is not a valid "
                                     f"{field.type} for attribute {field.name!r}",
                                     m.values.position, text) from None
    else:
        literals = [_bind_comparison(Comparison(field.name, "=", v, m.position), schema,
                                     resolver, text, allow_placeholders).value for v in m.values]
    literals = list(dict.fromkeys(literals))
    if not literals:
        return TRUE if m.negated else FALSE
    op = "!=" if m.negated else "="
    items = tuple(Comparison(field.name, op, v, m.position) for v in literals)
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
    if not -90 <= lat_low.value <= lat_high.value <= 90:  # type: ignore[operator]
        raise ConditionError("WITHIN_BOX: latitudes must satisfy -90 <= south <= north <= 90",
                             box.position, text)
    if not (-180 <= lon_low.value <= 180 and -180 <= lon_high.value <= 180):  # type: ignore
        raise ConditionError("WITHIN_BOX: longitudes must be within -180 and 180", box.position,
                             text)
    if lon_low.value <= lon_high.value:  # type: ignore[operator]
        return And((lat_low, lat_high, lon_low, lon_high))
    return And((lat_low, lat_high, Or((lon_low, lon_high))))  # across the 180th meridian


def parse_condition(text: str, schema: StreamSchema, *, resolver: PlaceholderResolver | None = None,
                    allow_placeholders: bool = True) -> Expr:
    """Parse and bind in one step."""
    return bind(parse(text), schema, resolver=resolver, text=text,
                allow_placeholders=allow_placeholders)


def _bind_comparison(cmp: Comparison, schema: StreamSchema, resolver: PlaceholderResolver | None,
                     text: str | None, allow_placeholders: bool) -> Comparison:
    field = schema.lookup(cmp.attribute)
    if field is None:
        raise ConditionError(
            f"unknown attribute {cmp.attribute!r}; the stream has: {', '.join(schema.names)}",
            cmp.position, text)
    value = cmp.value
    if isinstance(value, Placeholder):
        if not allow_placeholders:
            raise ConditionError(f"placeholder {value} is not allowed here (placeholders belong "
                                 "in policy obligations)", value.position, text)
        value = _resolve_placeholder(value, field, resolver, text)
    else:
        value = coerce_literal(value, field, cmp.position, text)
    if field.type == "boolean" and cmp.op not in ("=", "!="):
        raise ConditionError(f"boolean attribute {field.name!r} can only be compared with = or !=",
                             cmp.position, text)
    return Comparison(field.name, cmp.op, value, cmp.position)


def coerce_literal(value: Scalar, field: Field, position: int | None = None,
                   text: str | None = None) -> Scalar:
    """A literal in the representation predicates on this field use (see module docstring)."""
    kind = field.type
    if kind in ("double", "long"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConditionError(f"type mismatch: {kind} attribute {field.name!r} compared with "
                                 f"{format_literal(value)}", position, text)
        if kind == "double":
            return float(value)
        return int(value) if float(value).is_integer() and abs(value) < 2**63 else float(value)
    if kind == "timestamp":
        if isinstance(value, bool):
            raise ConditionError(f"type mismatch: timestamp attribute {field.name!r} compared with "
                                 f"{format_literal(value)}", position, text)
        if isinstance(value, (int, float)):
            seconds = float(value)
            if not MIN_EPOCH_SECONDS <= seconds < END_EPOCH_SECONDS:
                raise ConditionError(
                    f"timestamp attribute {field.name!r} compared with {format_literal(value)} "
                    "epoch seconds, out of the range of timestamps (years 1 to 9999)",
                    position, text)
            return seconds
        return _parse_timestamp(value, field, position, text)
    if kind == "string":
        if not isinstance(value, str):
            raise ConditionError(f"type mismatch: string attribute {field.name!r} compared with "
                                 f"{format_literal(value)} (quote strings)", position, text)
        return value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise ConditionError(f"type mismatch: boolean attribute {field.name!r} compared with "
                                 f"{format_literal(value)}", position, text)
        return value
    raise ConditionError(f"attribute {field.name!r} has unsupported type {kind!r}", position, text)


def _parse_timestamp(value: str, field: Field, position: int | None, text: str | None) -> float:
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConditionError(f"timestamp attribute {field.name!r} compared with "
                             f"{format_literal(value)}, which is not an ISO-8601 date-time",
                             position, text) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    try:
        seconds = moment.timestamp()
    except (OverflowError, ValueError):  # e.g. 0001-01-01T00:00:00+01:00 is in year 0 in UTC
        seconds = math.inf
    if not MIN_EPOCH_SECONDS <= seconds < END_EPOCH_SECONDS:
        raise ConditionError(f"timestamp attribute {field.name!r} compared with "
                             f"{format_literal(value)}, which is outside years 1 to 9999 in UTC",
                             position, text)
    return seconds


def _resolve_placeholder(ph: Placeholder, field: Field, resolver: PlaceholderResolver | None,
                         text: str | None) -> Scalar:
    if resolver is None:
        raise ConditionError(f"placeholder {ph} cannot be resolved: no request attributes",
                             ph.position, text)
    values = list(resolver(PLACEHOLDER_CATEGORIES[ph.category], ph.attribute))
    if not values:
        raise ConditionError(f"placeholder {ph}: the request has no such attribute", ph.position, text)
    if len(set(values)) > 1:
        raise ConditionError(f"placeholder {ph}: the request has {len(values)} values for it; "
                             "exactly one is needed", ph.position, text)
    lexical = values[0]
    try:
        literal: Scalar = _lexical_for(lexical, field)
    except ValueError:
        raise ConditionError(f"placeholder {ph}: value {lexical!r} is not a valid {field.type} "
                             f"for attribute {field.name!r}", ph.position, text) from None
    return coerce_literal(literal, field, ph.position, text)


def _lexical_for(lexical: str, field: Field) -> Scalar:
    if field.type in ("double", "long"):
        number = float(lexical.strip())
        if not math.isfinite(number):
            raise ValueError(lexical)
        stripped = lexical.strip()
        return int(stripped) if re.fullmatch(r"[+-]?\d+", stripped) else number
    if field.type == "boolean":
        low = lexical.strip().lower()
        if low in ("true", "1"):
            return True
        if low in ("false", "0"):
            return False
        raise ValueError(lexical)
    if field.type == "timestamp":
        stripped = lexical.strip()
        try:
            number = float(stripped)
        except ValueError:
            return stripped
        if not math.isfinite(number):
            raise ValueError(lexical)
        return number
    return lexical


# -- evaluation -----------------------------------------------------------------------------------

# The comparison operators by their symbol; they work on Python values and on Spark Columns alike.
COMPARATORS: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
    ">=": operator.ge}


def _compare(left: Any, op: str, right: Any) -> bool:
    return COMPARATORS[op](left, right)


def evaluate(expr: Expr, row: Mapping[str, Any]) -> bool:
    """Truth of a bound condition on one tuple, with SQL semantics for missing values.

    A comparison with a missing (None) attribute is unknown; unknown propagates through
    AND/OR/NOT by Kleene's rules and an unknown condition lets the tuple through no more than
    false does. This equals pushing NOT down to the comparisons and treating any comparison
    over a missing attribute as false, which is what the execution plan states.
    """
    result = _eval3(expr, row)
    return result is True


def _eval3(expr: Expr, row: Mapping[str, Any]) -> bool | None:
    if isinstance(expr, Comparison):
        value = row.get(expr.attribute)
        if value is None:
            return None
        return _compare(value, expr.op, expr.value)
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Not):
        inner = _eval3(expr.item, row)
        return None if inner is None else not inner
    if isinstance(expr, And):
        result: bool | None = True
        for item in expr.items:
            v = _eval3(item, row)
            if v is False:
                return False
            if v is None:
                result = None
        return result
    result = False
    for item in expr.items:
        v = _eval3(item, row)
        if v is True:
            return True
        if v is None:
            result = None
    return result
