"""A parsed query against a stream's schema (through the masks the consumer is granted: its
filter reads masked values) to a consumer's query graph (`user_graph`)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from pep.core.conditions import ConditionError, parse_condition
from pep.core.graph import QueryGraph, pipeline_graph
from pep.core.masks import Mask, MaskError, ordered, parse_assignment, view_schema
from pep.core.obligations import parse_aggregate
from pep.core.plan import Aggregate, StreamSchema, WindowAsk, WindowSpec
from pep.core.userquery.model import UserQuery, UserQueryError


def _schema_names(schema: StreamSchema, names: Sequence[str], unknown: str) -> tuple[str, ...]:
    """The attributes named (case-insensitive, trimmed) by their schema names, in schema order;
    an unknown one is refused with `unknown` and the stream's attributes."""
    found = set()
    for name in names:
        field = schema.lookup(name.strip())
        if field is None:
            raise UserQueryError(f"{unknown} {name!r}; the stream has: {', '.join(schema.names)}")
        found.add(field.name)
    return tuple(n for n in schema.names if n in found)


def user_graph(query: UserQuery, stream: str, schema: StreamSchema,
               masks: Mapping[str, Mask] | None = None) -> QueryGraph:
    """The user's graph with names checked against the schema (placeholders are not allowed).
    `masks`: the policy's masks; the filter is read against the values the consumer sees
    (a hashed attribute is text), the consumer's own masks replacing the policy's."""
    if query.stream is not None and query.stream != stream:
        raise UserQueryError(f"the user query is for stream {query.stream!r} but the request is "
                             f"for {stream!r}")
    asked: dict[str, Mask] = {}
    for text in query.masks:
        try:
            for name, mask in parse_assignment(text, schema):
                if name in asked:
                    raise UserQueryError(f"mask: attribute {name!r} is masked twice")
                asked[name] = mask
        except MaskError as exc:
            raise UserQueryError(f"mask: {exc}") from None
    view = view_schema(schema, {**(masks or {}), **asked})
    filter_part = None
    if query.filter is not None:
        try:
            expr = parse_condition(query.filter, view, allow_placeholders=False)
        except ConditionError as exc:
            where = query.filter_position
            raise UserQueryError(f"filter condition: {exc}", where) from None
        filter_part = (expr, query.filter)
    map_part = None
    if query.map is not None:
        map_part = _schema_names(schema, query.map, "map: unknown attribute")
    window_part = ask = None
    if query.has_window:
        aggregates: list[Aggregate] = []
        for text in query.aggregates:
            try:
                aggregates.append(parse_aggregate(text, view))
            except ValueError as exc:
                raise UserQueryError(f"window: {exc}") from None
        keys = None
        if query.window_keys is not None:
            keys = _schema_names(schema, query.window_keys, "window: unknown group-by key")
        kind, size, step = query.window_kind, query.window_size, query.window_step
        if kind is None or size is None or step is None:  # the parsers never leave one out
            raise UserQueryError("a window needs its type, size and step")
        window_part = WindowSpec(kind, size, step, tuple(dict.fromkeys(aggregates)),
                                 min_count=query.window_min_count)
        ask = WindowAsk(keys, query.window_coarsen, query.window_privacy)
    return pipeline_graph(stream, filter=filter_part, map=map_part, window=window_part,
                          window_ask=ask, mask=ordered(asked, schema) if asked else None)
