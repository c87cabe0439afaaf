"""Grants for a join only (ASSIST Definition 3; Table 2, row 3): a stream shown only joined.

ASSIST's join privilege is a policy over two streams: the port authority may see route reports
joined with the ships in its port waters, never the routes stream alone, under a condition across
the streams (`AIS.SID = Route.SID AND Location(AIS.SID) in PortBound(self)`) and with windows no
finer than the policy's. In xsg a policy stays confined to its owner's stream, and says "only in a
join with that stream" in two places:

- its Rule's Target matches the resource attribute `urn:xsg:resource:join-with` (the other
  stream's name), which only the gateway sets, and only on each side's decision of a join (a
  request's own `urn:xsg:` resource attributes are dropped: `pdp.request.bind_join`). A request
  for the stream alone never carries it, so such a rule is NotApplicable to it;
- its obligation `exacml:obligation:stream-join` (this module) says how: attribute ids under
  `exacml:obligation:` (or `pCloud:obligation:`)
    - `stream-join-stream-id` (exactly one): the other stream; a decision about a join with any
      other stream cannot fulfil it (deny);
    - `stream-join-condition-id` (any number, all apply): a condition over both streams'
      attributes, each written `stream.attribute`: top-level conjuncts that are equalities of
      the two streams' attributes (`ais.mmsi = routes.mmsi`) become equalities of the join;
      any other conjunct reads one stream only (`WITHIN_POLYGON(ais.lat, ais.lon,
      {subject:port-bounds})`) and filters that side before the join;
    - `stream-join-within-id` (at most one): the fewest seconds the join's time bound may span
      (ASSIST's minimum join window): a consumer's `within` below it is raised to it, with a PR
      warning (the paper's |W|' = max(|W|, P.W.size)).
  A decision about a stream alone that carries a `stream-join` obligation cannot fulfil it: deny
  (under the union combining mode that grant is left out, the others stand).

What the grant's condition may read: on its own stream (the one whose policy carries it), any
attribute, as a filter obligation may; on the other stream, only what that stream's own policy
shows this consumer (its map), and only when that policy shows its tuples raw (no window): a
filter there runs on the other side's authorised rows, so it selects among them and reveals
nothing the other owner did not grant. Equalities go through the join's own rule (both sides
must show the attribute). Everything the grant adds only narrows the join.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from common.numbers import NumberError, parse_float
from pdp import Obligation
from pep.core.conditions import (
    ConditionError,
    Expr,
    PlaceholderResolver,
    attributes_of,
    conjoin,
    parse_condition,
    qualified_conjuncts,
)
from pep.core.graph import QueryGraph, pipeline_graph
from pep.core.obligations import ObligationError, obligation_assignments
from pep.core.plan import StreamSchema

JOIN_IDS = frozenset({"exacml:obligation:stream-join"})
JOIN_STREAM = "stream-join-stream-id"
JOIN_CONDITION = "stream-join-condition-id"
JOIN_WITHIN = "stream-join-within-id"
MAX_WITHIN = 100_000_000.0  # seconds: a guard against typos, as for windows


@dataclass(frozen=True)
class JoinGrant:
    """One `stream-join` obligation, read: granted by `stream`'s policy for a join with
    `other`. `equalities` are ((stream, attribute), (stream, attribute)) in schema spelling;
    `filters` are (stream, bound condition, text as written)."""

    stream: str
    other: str
    equalities: tuple[tuple[tuple[str, str], tuple[str, str]], ...] = ()
    filters: tuple[tuple[str, Expr, str], ...] = ()
    min_within: float | None = None


def is_join_obligation(ob: Obligation) -> bool:
    return ob.id in JOIN_IDS


def split_obligations(obligations: Iterable[Obligation]
                      ) -> tuple[tuple[Obligation, ...], tuple[Obligation, ...]]:
    """(the stream obligations, the `stream-join` ones)."""
    rest: list[Obligation] = []
    joins: list[Obligation] = []
    for ob in obligations:
        (joins if is_join_obligation(ob) else rest).append(ob)
    return tuple(rest), tuple(joins)


def read_join_grant(ob: Obligation, stream: str, other: str | None,
                    schemas: Mapping[str, StreamSchema],
                    resolver: PlaceholderResolver | None = None) -> JoinGrant:
    """The grant of one `stream-join` obligation in `stream`'s decision, for a join with
    `other` (None: the request is for `stream` alone). ObligationError (deny) when it cannot be
    fulfilled: not a join, a join with another stream, a malformed or unknown part."""
    found = {name: [value.strip() for value in values] for name, values in
             obligation_assignments(ob, (JOIN_STREAM, JOIN_CONDITION, JOIN_WITHIN)).items()}
    if len(found[JOIN_STREAM]) != 1:
        raise ObligationError(f"obligation {ob.id} needs exactly one {JOIN_STREAM} (the stream "
                              f"it may be joined with), found {len(found[JOIN_STREAM])}", ob.id)
    partner = found[JOIN_STREAM][0]
    if other is None:
        raise ObligationError(f"obligation {ob.id}: stream {stream!r} is granted only in a join "
                              f"with {partner!r}, not on its own", ob.id)
    if partner != other:
        raise ObligationError(f"obligation {ob.id}: stream {stream!r} is granted only in a join "
                              f"with {partner!r}, not with {other!r}", ob.id)
    if len(found[JOIN_WITHIN]) > 1:
        raise ObligationError(f"obligation {ob.id} has more than one {JOIN_WITHIN}", ob.id)
    min_within = None
    if found[JOIN_WITHIN]:
        min_within = _seconds(found[JOIN_WITHIN][0], ob.id)
    equalities: list[tuple[tuple[str, str], tuple[str, str]]] = []
    filters: list[tuple[str, Expr, str]] = []
    for text in found[JOIN_CONDITION]:
        try:
            parts = qualified_conjuncts(text)
        except ConditionError as exc:
            raise ObligationError(f"obligation {ob.id}: join condition {text!r}: {exc}",
                                  ob.id) from None
        for part in parts:
            if part.equality is not None:
                (s1, a1), (s2, a2) = part.equality
                equalities.append((_attribute(s1, a1, schemas, stream, other, ob.id, text),
                                   _attribute(s2, a2, schemas, stream, other, ob.id, text)))
                continue
            assert part.stream is not None
            side = _stream(part.stream, stream, other, ob.id, text)
            try:
                condition = parse_condition(part.text, schemas[side], resolver=resolver)
            except ConditionError as exc:
                raise ObligationError(f"obligation {ob.id}: join condition {text!r}, on "
                                      f"{side!r}: {exc}", ob.id) from None
            filters.append((side, condition, part.text))
    return JoinGrant(stream, other, tuple(dict.fromkeys(equalities)), tuple(filters),
                     min_within)


def _seconds(value: str, obligation_id: str) -> float:
    try:
        seconds = parse_float(value.removeprefix("+"), JOIN_WITHIN, low=0.0, high=MAX_WITHIN)
    except NumberError as exc:
        raise ObligationError(f"obligation {obligation_id}: {JOIN_WITHIN} {value!r}: {exc}",
                              obligation_id) from None
    return float(seconds)


def _stream(name: str, stream: str, other: str, obligation_id: str, text: str) -> str:
    if name not in (stream, other):
        raise ObligationError(f"obligation {obligation_id}: join condition {text!r} names "
                              f"stream {name!r}; the join is of {stream!r} and {other!r}",
                              obligation_id)
    return name


def _attribute(name: str, attribute: str, schemas: Mapping[str, StreamSchema], stream: str,
               other: str, obligation_id: str, text: str) -> tuple[str, str]:
    side = _stream(name, stream, other, obligation_id, text)
    field = schemas[side].lookup(attribute)
    if field is None:
        raise ObligationError(f"obligation {obligation_id}: join condition {text!r}: stream "
                              f"{side!r} has no attribute {attribute!r}", obligation_id)
    return side, field.name


# -- applying grants to a join's two sides ----------------------------------------------------

@dataclass(frozen=True)
class JoinTerms:
    """What a join's grants add: the sides' policy graphs with the grants' filters, the
    equalities (left attribute, right attribute) and the fewest seconds `within` may span."""

    left: QueryGraph
    right: QueryGraph
    on: tuple[tuple[str, str], ...]
    min_within: float | None


def apply_join_grants(grants: Iterable[JoinGrant], left: tuple[str, QueryGraph, StreamSchema],
                      right: tuple[str, QueryGraph, StreamSchema]) -> JoinTerms:
    """Every grant's filters added to the policy graph of the side they read, its equalities
    oriented left to right; ObligationError (deny) for a filter on the other stream that reads
    what that stream's policy does not show, or reads a side shown only through a window."""
    graphs = {left[0]: left[1], right[0]: right[1]}
    schemas = {left[0]: left[2], right[0]: right[2]}
    extra: dict[str, list[tuple[Expr, str]]] = {left[0]: [], right[0]: []}
    on: list[tuple[str, str]] = []
    min_within: float | None = None
    for g in grants:
        for side, condition, text in g.filters:
            if side != g.stream:
                _check_other_side(g, side, condition, text, graphs[side], schemas[side])
            extra[side].append((condition, text))
        for a, b in g.equalities:
            pair = (a[1], b[1]) if a[0] == left[0] else (b[1], a[1])
            if a[0] == b[0]:
                raise ObligationError(f"a join grant of {g.stream!r} equates two attributes of "
                                      f"{a[0]!r}; an equality must be between the two streams")
            if pair not in on:
                on.append(pair)
        if g.min_within is not None:
            min_within = g.min_within if min_within is None else max(min_within, g.min_within)
    out = {name: _with_filters(graphs[name], name, extra[name]) for name in graphs}
    return JoinTerms(out[left[0]], out[right[0]], tuple(on), min_within)


def _check_other_side(g: JoinGrant, side: str, condition: Expr, text: str, graph: QueryGraph,
                      schema: StreamSchema) -> None:
    shown = set(graph.map.attributes if graph.map is not None else schema.names)
    for attribute in attributes_of(condition):
        if attribute not in shown:
            raise ObligationError(
                f"the join grant of stream {g.stream!r} filters {side!r} on attribute "
                f"{attribute!r}, which {side!r}'s own policy does not show this consumer")
    if graph.window is not None:
        raise ObligationError(
            f"the join grant of stream {g.stream!r} filters {side!r} ({text}), whose own policy "
            "shows it only through a window; such a filter cannot be applied")


def _with_filters(graph: QueryGraph, stream: str, extra: list[tuple[Expr, str]]) -> QueryGraph:
    """The side's policy graph with the grants' filters conjoined to its own; its masks, map and
    window stay as they are (a filter reads raw values, as the policy's own does)."""
    if not extra:
        return graph
    parts = ([(graph.filter.condition, graph.filter.describe())] if graph.filter else []) + extra
    condition = conjoin([c for c, _ in parts])
    text = " AND ".join(f"({t})" if len(parts) > 1 else t for _, t in parts)
    w = graph.window
    return pipeline_graph(stream, filter=(condition, text),
                          map=graph.map.attributes if graph.map is not None else None,
                          window=w.spec if w is not None else None,
                          policy_window=w.policy if w is not None else None,
                          mask=graph.mask.masks if graph.mask is not None else None)



__all__ = ["JoinGrant", "JoinTerms", "JOIN_IDS", "split_obligations", "read_join_grant",
           "apply_join_grants", "is_join_obligation"]
