"""An unbound condition bound to a stream schema: attribute names matched case-insensitively
and replaced by the schema's spelling, literals checked against the attribute's type and made
exact (`pep.core.exact`: longs stay ints, timestamps become the gateway's microsecond text, a
constant outside the domain rewrites the comparison), placeholders replaced by the request's
values, and set membership, boxes and label words rewritten into plain comparisons."""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from decimal import Decimal

from pep.core import geo
from pep.core.conditions.parsing import parse
from pep.core.conditions.syntax import (
    FALSE,
    LABEL_WORDS,
    MAX_INTEGER_DIGITS,
    MAX_SET_SIZE,
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
    format_literal,
)
from pep.core.exact import (
    MAX_MICROS,
    MIN_MICROS,
    ExactNumber,
    exact_decimal,
    in_timestamp_range,
    integer_comparison,
    is_number,
    iso_from_micros,
    micros_from_iso,
    micros_from_seconds,
)
from pep.core.labels import Label, LabelError
from pep.core.plan import Field, Scalar, StreamSchema

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
    pairs: list[tuple[str, Value | Label]] = []
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
        for lexical in bag:
            literal = _placeholder_literal(lexical, m.values, field, text)
            pairs.append(bind_literal(op, literal, field, m.values.position, text))
    else:
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
    s_, w_, n_, e_ = (_box_bound(v, box, resolver, text, allow_placeholders)
                      for v in box.bounds)
    if not -90 <= s_ <= n_ <= 90:
        raise ConditionError("WITHIN_BOX: latitudes must satisfy -90 <= south <= north <= 90",
                             box.position, text)
    if not (-180 <= w_ <= 180 and -180 <= e_ <= 180):
        raise ConditionError("WITHIN_BOX: longitudes must be within -180 and 180", box.position,
                             text)
    if w_ <= e_:
        return And((lat_low, lat_high, lon_low, lon_high))
    return And((lat_low, lat_high, Or((lon_low, lon_high))))  # across the 180th meridian


def _box_bound(value: Value, box: Box, resolver: PlaceholderResolver | None, text: str | None,
               allow_placeholders: bool) -> float:
    """One of a box's bounds as the number given (its comparisons, bound before, refused any
    other)."""
    number = _resolve_value(value, Field("bound", "double"), resolver, text, allow_placeholders)
    if not is_number(number):
        raise ConditionError(f"WITHIN_BOX: bound {format_literal(number)} is not a number",
                             box.position, text)
    return float(number)


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

    def placeholder_allowed(ph: Placeholder) -> PlaceholderResolver:
        """The resolver that gives the placeholder's values (a fail when none may)."""
        if not allow_placeholders:
            raise fail(f"placeholder {ph} is not allowed here (placeholders belong in policy "
                       "obligations)", ph.position)
        if resolver is None:
            raise fail(f"placeholder {ph} cannot be resolved: no request attributes",
                       ph.position)
        return resolver

    def number(value: Value, what: str) -> float:
        if isinstance(value, Placeholder):
            placeholder_allowed(value)
            try:
                literal = _resolve_placeholder(value, Field(what, "double"), resolver, text)
            except ConditionError as exc:
                raise fail(f"{what}: {exc.reason}", value.position) from None
            return float(literal)
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
            resolve = placeholder_allowed(s.points)
            lexicals = list(resolve(PLACEHOLDER_CATEGORIES[s.points.category],
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
        plat, plon = s.points  # type: ignore[misc]  # a distance's point: (lat, lon), the parser's
        point = (latitude(number(plat, "the point's latitude"), "the point's latitude"),
                 longitude(number(plon, "the point's longitude"), "the point's longitude"))
        return Spatial("distance", lat_field.name, lon_field.name, s.op, radius, point,
                       position=s.position)
    key_field = schema.lookup(s.key or "")
    if key_field is None:
        raise fail(_unknown_attribute(s.key, schema, "key attribute"))
    if key_field.name in (lat_field.name, lon_field.name):
        raise fail(f"the key attribute {key_field.name!r} cannot be a coordinate")
    key = _bind_comparison(Comparison(key_field.name, "=",
                                      s.key_value,  # type: ignore[arg-type]  # DISTANCE_TO's: set
                                      s.position),
                           schema, resolver, text, allow_placeholders)
    if key.op != "=":  # 2.5 for a long key: no anchor could ever be that tuple
        raise fail(f"the key value {format_literal(s.key_value)} is not a value of "
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


def _resolve_value(value: Value | Label, field: Field, resolver: PlaceholderResolver | None,
                   text: str | None, allow_placeholders: bool) -> Literal_ | Label:
    """A literal as written, or a placeholder's one value read for this field (not yet bound)."""
    if not isinstance(value, Placeholder):
        return value
    if not allow_placeholders:
        raise ConditionError(f"placeholder {value} is not allowed here (placeholders belong "
                             "in policy obligations)", value.position, text)
    return _resolve_placeholder(value, field, resolver, text)


def bind_literal(op: str, value: Literal_ | Label, field: Field, position: int | None = None,
                 text: str | None = None) -> tuple[str, Scalar | Label]:
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
            number = float(value)
            if not math.isfinite(number):
                raise ConditionError(f"number {format_literal(value)} is beyond the range of a "
                                     "double", position, text)
            return op, number
        return integer_comparison(op, value)
    if kind == "timestamp":
        if isinstance(value, bool):
            raise ConditionError(f"type mismatch: timestamp attribute {field.name!r} compared with "
                                 f"{format_literal(value)}", position, text)
        if is_number(value):
            micros = micros_from_seconds(value)
            if not in_timestamp_range(micros):
                raise ConditionError(
                    f"timestamp attribute {field.name!r} compared with {format_literal(value)} "
                    "epoch seconds, out of the range of timestamps (years 1 to 9999)",
                    position, text)
        else:
            micros = _parse_timestamp(
                value, field, position, text)  # type: ignore[arg-type]  # not a number: text
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
        raise ConditionError(
            f"placeholder {ph}: the request has no such attribute", ph.position, text
        )
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
    if re.fullmatch(rf"[+-]?[0-9]{{1,{MAX_INTEGER_DIGITS:d}}}", stripped):
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
