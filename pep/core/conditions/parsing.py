"""Tokens to the unbound AST (attribute names as written), with the limits enforced as clear
errors (never a RecursionError), and a join grant's condition over two streams split into
its top-level conjuncts (`qualified_conjuncts`).

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
"""
from __future__ import annotations

from dataclasses import dataclass

from pep.core import geo
from pep.core.conditions.lexing import SPATIAL_FUNCTIONS, Token, tokenize
from pep.core.conditions.syntax import (
    FLIPPED_OP,
    MAX_CONDITION_LENGTH,
    MAX_NESTING_DEPTH,
    MAX_SET_SIZE,
    And,
    Box,
    Comparison,
    ConditionError,
    Const,
    Expr,
    Membership,
    Not,
    Or,
    Placeholder,
    Spatial,
    Value,
    format_literal,
)


class _Parser:
    def __init__(self, text: str, tokens: list[Token]) -> None:
        self.text = text
        self.tokens = tokens
        self.i = 0

    def peek(self) -> Token:
        return self.tokens[self.i]

    def next(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind != "EOF":  # the end stays the end, however far a rule reads
            self.i += 1
        return tok

    def error(self, message: str, tok: Token) -> ConditionError:
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

    def _check_depth(self, depth: int, tok: Token) -> None:
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
        if tok.kind == "IDENT" and tok.value.lower() in SPATIAL_FUNCTIONS \
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
            raise self.error(
                f"expected a value after {op.value!r}, found {_describe(right)}", right
            )
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
        args: list[Token] = []
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
        return Box(args[0].value, args[1].value, tuple(a.value for a in args[2:]),
                   name.pos)


    def parse_spatial(self) -> Spatial:
        name = self.next()
        function = SPATIAL_FUNCTIONS[name.value.lower()]
        self.next()  # LPAREN
        usage = {"DISTANCE": "DISTANCE(lat, lon, point_lat, point_lon) <op> metres",
                 "DISTANCE_TO": "DISTANCE_TO(lat, lon, key_attribute, key_value) <op> metres",
                 "WITHIN_POLYGON": "WITHIN_POLYGON(lat, lon, [lat1, lon1, lat2, lon2, ...]) or "
                                   "WITHIN_POLYGON(lat, lon, {category:attribute})"}[function]
        args: list[Token] = []
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
            raise self.error(
                f"{function} takes {'three' if function == 'WITHIN_POLYGON' else 'four'}"
                f" arguments, not {len(args)}: {usage}",
                name,
            )
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

    def parse_vertices(self, name: Token, usage: str) -> tuple[Value, ...] | Placeholder:
        tok = self.next()
        if tok.kind == "PLACEHOLDER":
            placeholder: Placeholder = tok.value
            return placeholder
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


def _describe(tok: Token) -> str:
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
    return _Parser(text, tokenize(text)).parse()


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
    tokens = tokenize(text, qualified=True)
    if tokens[0].kind == "EOF":
        raise ConditionError("empty condition")
    parts: list[list[Token]] = [[]]
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
    for part, end in zip(parts, ends, strict=True):
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
