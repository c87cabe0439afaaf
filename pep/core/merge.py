"""Merging the policy's query graph with the user's into one safe graph and its execution plan.

Rules (eXACML+ section 3.1, with the corrections of the design):
- Filter: policy AND user, simplified and checked exactly (pep.core.analysis). The security filter
  is always evaluated before any projection or window.
- Map: the user sees the intersection of what the policy exposes and what the query asks for
  (never the paper's union, which would hand out hidden attributes). A query without a map that
  is cut down by the policy gets a PR warning naming the hidden attributes.
- Leak rules: a query that reads (map), filters on, or aggregates an attribute the policy does
  not expose is refused, naming the attribute (`QueryRefused`).
- Window: with a policy window, the query's window must have the same type and a size and step
  at least the policy's, and may only use the (attribute, function) pairs the policy allows;
  anything finer or different is refused, never silently granted. A query without a window gets
  the policy's. A query without aggregates gets every aggregate the policy allows on visible
  attributes. The minimum count per window is the larger of the two; the query may group by a
  subset of the keys the policy allows (none given: the policy's), never by others.
- Filters before a policy's window: the query's own filter runs before the window, so it may use
  only the attributes the policy lists as pre-window filterable (none by default); otherwise a
  narrow filter would choose which tuples a window aggregates.
- Differentially private windows (`pep.core.privacy`): the merged window carries the policy's
  privacy, with the query's smaller epsilon or delta if it asks for one (a larger one is
  refused). Aggregates without a private release (min, max, firstval, lastval) are withheld
  from the policy's defaults and refused, named, when the query asks for them.
- Masks (`pep.core.masks`): the policy's, each replaced by a coarser one the query asks for (a
  finer one is refused); the policy's filter reads raw values, the query's filter, keys and
  aggregates masked ones (its comparisons become derived variables of the analysis). A masked
  time attribute (the stream's, or a time window's) is among the plan's masks even when the
  plan does not output it: the runtime orders the plan's tuples, places them in time windows
  and moves its clock by the masked time, ties in stream order, so nothing the consumer gets
  depends on the raw time below the mask's unit (a time window whose size or step is no
  multiple of the unit, or over a mask that cannot order, is refused).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pep.core.analysis import FilterAnalysis, MergeWarning, analyse_filter
from pep.core.conditions import (
    FALSE,
    And,
    Comparison,
    Expr,
    Or,
    Spatial,
    attributes_of,
    spatial_from_predicate,
    spatial_parts,
)
from pep.core.errors import InvalidInput, NotPermitted, Unprocessable
from pep.core.graph import Filter, Map, Mask, Node, QueryGraph, Source, WindowAggregate
from pep.core.masks import MaskPlan, filter_notes, output_masks, plan_dnf, plan_masks, window_masks
from pep.core.obligations import FUNCTIONS_FOR_TYPE
from pep.core.plan import (
    Aggregate,
    Conjunct,
    ExecutionPlan,
    SpatialPredicate,
    StreamSchema,
    WindowAsk,
    WindowSpec,
)
from pep.core.privacy import DP_FUNCTIONS, NOT_PRIVATE, AskTooMuch, PrivacySpec, apply_ask


class QueryRefused(NotPermitted):
    """The user's query asks for more than the policy allows (a leak rule), naming the attribute."""

    def __init__(self, message: str, attribute: str | None = None) -> None:
        super().__init__(message, attribute=attribute)
        self.attribute = attribute


class QueryInvalid(InvalidInput):
    """The user's query contradicts itself or names another stream."""


@dataclass(frozen=True)
class MergeResult:
    graph: QueryGraph
    plan: ExecutionPlan
    warnings: tuple[MergeWarning, ...]
    filter_analysis: FilterAnalysis
    # the stream's time attribute when the policy hides it and the plan masks it as null for
    # that reason alone (`_hidden_time`); None otherwise
    hidden_time: str | None = None

    @property
    def nr(self) -> bool:
        return any(w.kind == "NR" for w in self.warnings)


def _exposed(policy: QueryGraph, schema: StreamSchema) -> tuple[str, ...]:
    m = policy.map
    return m.attributes if m is not None else schema.names


def check_leaks(policy: QueryGraph, user: QueryGraph, schema: StreamSchema) -> None:
    """Refuse a query that touches an attribute the policy does not expose."""
    exposed = set(_exposed(policy, schema))
    uf, um, uw = user.filter, user.map, user.window
    if uf is not None:
        for attr in attributes_of(uf.condition):
            if attr not in exposed:
                raise QueryRefused(f"your query filters on attribute {attr!r}, which the policy "
                                   "does not expose", attr)
    if um is not None:
        for attr in um.attributes:
            if attr not in exposed:
                raise QueryRefused(f"your query reads attribute {attr!r}, which the policy does "
                                   "not expose", attr)
    if uw is not None:
        for agg in uw.spec.aggregates:
            if agg.attribute not in exposed:
                raise QueryRefused(f"your query aggregates attribute {agg.attribute!r} "
                                   f"({agg.function}), which the policy does not expose",
                                   agg.attribute)
        for key in (uw.ask.keys if uw.ask is not None else None) or ():
            if key not in exposed:
                raise QueryRefused(f"your query groups by attribute {key!r}, which the policy "
                                   "does not expose", key)
    if uf is not None:
        _check_anchors(policy, uf.condition)
    pw = policy.window
    if pw is not None and uf is not None:
        prefilter = pw.policy.prefilter if pw.policy is not None else ()
        allowed = set(prefilter)
        for attr in attributes_of(uf.condition):
            if attr not in allowed:
                listed = ", ".join(prefilter) or "none"
                raise QueryRefused(
                    f"your query filters on attribute {attr!r} before the policy's window; the "
                    f"policy allows a consumer's filter before its window only on: {listed} "
                    "(a filter there would choose which tuples a window aggregates)", attr)


def _anchor(s: Spatial) -> tuple[str, str, str | None, str, object]:
    """What names a DISTANCE_TO's anchor: its coordinates, its key and the key's value (and
    the value's type: 1 and 1.0 are different anchors)."""
    return (s.latitude, s.longitude, s.key, type(s.key_value).__name__, s.key_value)


def _check_anchors(policy: QueryGraph, condition: Expr) -> None:
    """A consumer's DISTANCE_TO may only use an anchor the policy's own filter uses.

    The anchor's positions come from other tuples of the stream, which the policy may withhold
    from this consumer: a DISTANCE_TO of the consumer's choosing would let it locate any ship
    (by which visible tuples pass) without ever seeing that ship's tuples. The policy's own
    anchors are already part of what the policy reveals; narrowing them (a smaller radius) is
    allowed."""
    allowed = {_anchor(s) for s in spatial_parts(policy.filter.condition)
               if s.function == "distance_to"} if policy.filter is not None else set()
    for s in spatial_parts(condition):
        if s.function == "distance_to" and _anchor(s) not in allowed:
            raise QueryRefused(
                f"your query's {s} measures the distance to an anchor the policy's filter does "
                "not use; the anchor's positions come from tuples the policy may withhold from "
                "you, so a consumer may use DISTANCE_TO only with the policy's own anchor",
                s.key)


def _dnf_expr(dnf: tuple[Conjunct, ...] | None) -> Expr | None:
    if dnf is None:
        return None
    if not dnf:
        return FALSE
    alternatives: list[Expr] = []
    for conj in dnf:
        cmps = tuple(spatial_from_predicate(p) if isinstance(p, SpatialPredicate)
                     else Comparison(p.attribute, p.op, p.value) for p in conj)
        alternatives.append(cmps[0] if len(cmps) == 1 else And(cmps))
    return alternatives[0] if len(alternatives) == 1 else Or(tuple(alternatives))


def _describe(agg: Aggregate) -> str:
    return f"{agg.function}({agg.attribute})"


def _private(pw: WindowAggregate, uw: WindowAggregate | None, warnings: list[MergeWarning]
             ) -> tuple[PrivacySpec | None, tuple[Aggregate, ...]]:
    """The merged window's privacy and the policy's aggregates it can release (the others are
    withheld, with a warning when the query did not name any: `_merge_window` refuses them when
    it did)."""
    spec = pw.spec.privacy
    ask = uw.ask.privacy if uw is not None and uw.ask is not None else None
    if spec is None:
        if ask is not None:
            raise QueryInvalid("your query asks for epsilon/delta, but the policy's window is "
                               "not differentially private: its windows are exact")
        return None, pw.spec.aggregates
    if uw is not None:
        for agg in uw.spec.aggregates:
            if agg.function not in DP_FUNCTIONS:
                raise QueryRefused(
                    f"your query asks for {_describe(agg)}, which the policy's differentially "
                    f"private window cannot release: it {NOT_PRIVATE.get(agg.function, '')}; "
                    "private windows release count, sum and avg", agg.attribute)
        try:
            spec = apply_ask(spec, ask)
        except AskTooMuch as exc:
            raise QueryRefused(str(exc), exc.parameter) from None
    kept = tuple(a for a in pw.spec.aggregates if a.function in DP_FUNCTIONS)
    withheld = [a for a in pw.spec.aggregates if a.function not in DP_FUNCTIONS]
    if withheld and (uw is None or not uw.spec.aggregates):
        warnings.append(MergeWarning(
            "INFO", "window", "the policy's window is differentially private; aggregates "
            "that show single values have no private release and are withheld: "
            f"{', '.join(_describe(a) for a in withheld)}",
            tuple(_describe(a) for a in withheld)))
    return spec, kept


def _merge_window(policy: WindowAggregate | None, user: WindowAggregate | None,
                  visible: tuple[str, ...], user_map: Map | None,
                  warnings: list[MergeWarning]) -> WindowSpec | None:
    """The merged window, before the stream's time attribute, masks and label bounds."""
    if policy is None and user is None:
        return None
    uw = user.spec if user is not None else None
    ask = (user.ask if user is not None else None) or WindowAsk()
    if uw is not None and user_map is not None:
        for agg in uw.aggregates:
            if agg.attribute not in user_map.attributes:
                raise QueryInvalid(f"your query aggregates {agg.attribute!r}, which its own map "
                                   "leaves out", attribute=agg.attribute)
    if policy is None:
        assert uw is not None
        if not uw.aggregates:
            raise QueryInvalid("your query's window lists no aggregate (attribute:function)")
        if ask.privacy is not None:
            raise QueryInvalid("your query asks for epsilon/delta, but no policy makes this "
                               "stream's windows differentially private: they are exact")
        return WindowSpec(uw.kind, uw.size, uw.step, uw.aggregates, min_count=uw.min_count,
                          keys=ask.keys or ())
    pw = policy.spec
    privacy, releasable = _private(policy, user, warnings)
    policy_visible = tuple(a for a in releasable if a.attribute in visible)
    policy_keys = tuple(k for k in pw.keys if k in visible)
    if uw is None:
        return WindowSpec(pw.kind, pw.size, pw.step, policy_visible, min_count=pw.min_count,
                          keys=policy_keys, privacy=privacy)
    if uw.kind != pw.kind:
        raise QueryRefused(f"the policy allows only {pw.kind} windows; your query asks for a "
                           f"{uw.kind} window")
    unit = "tuples" if pw.kind == "tuple" else "seconds"
    size, step = uw.size, uw.step
    keys = policy_keys if ask.keys is None else ask.keys
    finer = [k for k in keys if k not in pw.keys]
    if ask.coarsen:  # ASSIST Definition 4: |W|' = max(|W|, P.W.size), S' = max(S, P.W.step)
        raised = []
        if size < pw.size:
            raised.append(f"size {size} -> {pw.size} {unit}")
            size = pw.size
        if step < pw.step:
            raised.append(f"step {step} -> {pw.step} {unit}")
            step = pw.step
        if finer:
            raised.append(f"no grouping by {', '.join(finer)}")
            keys = tuple(k for k in keys if k not in finer)
        if raised:
            warnings.append(MergeWarning(
                "PR", "window", "partial result: your window was coarsened to what the policy "
                f"allows: {'; '.join(raised)}", tuple(raised)))
    if size < pw.size:
        raise QueryRefused(f"your window size {size} is finer than the policy allows "
                           f"(at least {pw.size} {unit}); ask with coarsen to get the policy's")
    if step < pw.step:
        raise QueryRefused(f"your window step {step} is finer than the policy allows "
                           f"(at least {pw.step} {unit}); ask with coarsen to get the policy's")
    for key in keys:
        if key not in pw.keys:
            allowed_keys = ", ".join(pw.keys) or "none"
            raise QueryRefused(f"your query groups by {key!r}, finer than the policy's window "
                               f"allows (group-by keys allowed: {allowed_keys})", key)
    min_count = max(pw.min_count, uw.min_count)
    if not uw.aggregates:
        return WindowSpec(uw.kind, size, step, policy_visible, min_count=min_count, keys=keys,
                          privacy=privacy)
    allowed = set(pw.aggregates)
    for agg in uw.aggregates:
        if agg not in allowed:
            same_attr = [a.function for a in pw.aggregates if a.attribute == agg.attribute]
            hint = (f"allowed on {agg.attribute!r}: {', '.join(same_attr)}" if same_attr
                    else f"the policy's window does not aggregate {agg.attribute!r}")
            raise QueryRefused(f"your query asks for {_describe(agg)}, which the policy's window "
                               f"does not allow ({hint})", agg.attribute)
    return WindowSpec(uw.kind, size, step, uw.aggregates, min_count=min_count, keys=keys,
                      privacy=privacy)


def _masked_aggregates(masking: MaskPlan, window: WindowSpec, uw: WindowAggregate | None,
                       schema: StreamSchema, time_attribute: str | None,
                       warnings: list[MergeWarning]) -> tuple[Aggregate, ...]:
    """The window's aggregates over masked values: those whose function fits the masked type
    (a hash is text: no avg); one the consumer asked for by name is refused instead."""
    time_attr = None
    if window.kind == "time":
        time_attr = time_attribute or next(
            (f.name for f in schema.fields if f.type == "timestamp"), None)
    kept, notes = window_masks(masking, window.kind, window.size, window.step,
                               window.aggregates, time_attr, FUNCTIONS_FOR_TYPE)
    if notes and uw is not None and uw.spec.aggregates:
        dropped = [a for a in window.aggregates if a not in kept]
        raise QueryRefused(f"your query asks for {_describe(dropped[0])}, but the policy shows "
                           f"{dropped[0].attribute!r} only masked: {notes[0].message}",
                           dropped[0].attribute)
    warnings.extend(notes)
    return kept


def _timing(window: WindowSpec | None, time_attribute: str | None, schema: StreamSchema
            ) -> tuple[str, ...]:
    """The attributes that order a plan's tuples or place them in time: the stream's time
    attribute (it orders tuples of sources without a stream position: files, Kafka, sockets)
    and a time window's. Their masks are the plan's whether it outputs them or not, so that the
    runtime orders, windows and clocks the plan's tuples by the masked time (ties in stream
    order), never by the raw value the policy hides (issue 41)."""
    names = [time_attribute, window.time_attribute if window is not None else None]
    return tuple(f.name for n in dict.fromkeys(names) if n
                 for f in (schema.lookup(n),) if f is not None)


def _hidden_time(time_attribute: str | None, exposed: tuple[str, ...],
                 window: WindowSpec | None, schema: StreamSchema,
                 applied: tuple[tuple[str, str], ...]) -> str | None:
    """The stream's time attribute when the policy hides it (no mask of its own) and no time
    window of the plan places tuples by it: the runtime then orders the plan's rows and tuple
    windows as under a `null` mask, by stream order alone (file, position), never by the hidden
    times, whose order would otherwise show in the order of the rows delivered. A time window
    over a hidden time is the owner's own choice (its windows need the time) and keeps it."""
    field = schema.lookup(time_attribute) if time_attribute else None
    if field is None or field.name in exposed or field.name in dict(applied):
        return None
    if window is not None and window.kind == "time" and window.time_attribute in (
            field.name, time_attribute):
        return None
    return field.name


def without_hidden_time(m: MergeResult) -> MergeResult:
    """`m` without the null mask of a hidden time (`_hidden_time`): what union mode unites,
    since a tuple delivered once for several grants has no one order of its own."""
    if m.hidden_time is None:
        return m
    masks = tuple(mask for mask in m.plan.masks if mask != (m.hidden_time, "null"))
    return replace(m, plan=replace(m.plan, masks=masks), hidden_time=None)


def merge(policy: QueryGraph, user: QueryGraph | None, schema: StreamSchema, *,
          time_attribute: str | None = None) -> MergeResult:
    """One graph and one plan from the policy's and the user's graphs.

    Raises QueryRefused (leak rules), QueryInvalid, Unprocessable and
    pep.core.analysis.ConditionTooComplex.
    NR is reported as a warning; the caller decides to refuse (the request processor does).
    """
    source, _ = policy.pipeline()
    if user is None:
        user = QueryGraph(Source(source.stream))
    if user.source.stream != source.stream:
        raise QueryInvalid(f"the query is for stream {user.source.stream!r}, the policy for "
                           f"{source.stream!r}")
    check_leaks(policy, user, schema)
    warnings: list[MergeWarning] = []

    pf, uf = policy.filter, user.filter
    # Masks (pep.core.masks): the consumer's filter reads masked values, the policy's raw ones.
    masking = plan_masks(policy, user, schema)
    user_condition = uf.condition if uf else None
    if masking is not None and user_condition is not None:
        user_condition = masking.user_condition(user_condition)
    analysis = analyse_filter(pf.condition if pf else None, user_condition, schema,
                              masks=masking)
    warnings.extend(analysis.warnings)
    if masking is not None:
        warnings.extend(filter_notes(analysis.filter_dnf, masking))

    exposed = _exposed(policy, schema)
    um, uw, pw = user.map, user.window, policy.window
    if um is not None:
        visible = tuple(a for a in exposed if a in set(um.attributes))
    else:
        visible = exposed
        hidden = [n for n in schema.names if n not in set(exposed)]
        if hidden and not (uw is not None and uw.spec.aggregates):
            warnings.append(MergeWarning(
                "PR", "map", f"partial result: the policy hides attribute(s) "
                f"{', '.join(hidden)}; you receive only {', '.join(exposed) or 'nothing'}",
                tuple(hidden)))
    if pw is not None:
        dropped = [a for a in pw.spec.aggregates if a.attribute not in set(exposed)]
        if dropped:
            warnings.append(MergeWarning(
                "INFO", "window", "the policy's window aggregates attribute(s) its map hides; "
                f"those aggregates are withheld: {', '.join(_describe(a) for a in dropped)}",
                tuple(_describe(a) for a in dropped)))

    window = _merge_window(pw, uw, visible, um, warnings)
    window_spec = None
    if window is not None:
        kind, aggregates = window.kind, window.aggregates
        if masking is not None:
            aggregates = _masked_aggregates(masking, window, uw, schema, time_attribute,
                                            warnings)
        if not aggregates:
            warnings.append(MergeWarning(
                "NR", "window", "no result: none of the aggregates the policy's window allows is "
                "on an attribute you may see or asked for", ()))
        time_attr = None
        if kind == "time":
            time_attr = time_attribute or next(
                (f.name for f in schema.fields if f.type == "timestamp"), None)
            if time_attr is None:
                raise Unprocessable("a time window needs a timestamp attribute and this stream "
                                    "has none")
        needed = {a.attribute for a in aggregates} | set(window.keys)
        projection = tuple(n for n in schema.names if n in needed)
        keys = tuple(n for n in schema.names if n in set(window.keys))
        window_spec = replace(window, aggregates=tuple(aggregates), time_attribute=time_attr,
                              keys=keys, label_bounds=pw.spec.label_bounds if pw else ())
    else:
        projection = visible
        if not projection:
            warnings.append(MergeWarning("NR", "map", "no result: no attribute is visible", ()))

    filter_dnf = analysis.filter_dnf
    applied: tuple[tuple[str, str], ...] = ()
    if masking is not None:
        filter_dnf = plan_dnf(filter_dnf, masking)
        applied = output_masks(masking, (*projection, *(window_spec.keys if window_spec else ()),
                                         *_timing(window_spec, time_attribute, schema)))
    hidden_time = _hidden_time(time_attribute, exposed, window_spec, schema, applied)
    if hidden_time is not None:
        applied += ((hidden_time, "null"),)
    plan = ExecutionPlan(source.stream, filter_dnf, projection, window_spec, masks=applied)
    node: Node = Source(source.stream)
    merged_filter = _dnf_expr(analysis.filter_dnf)
    if merged_filter is not None:
        node = Filter(node, merged_filter)
    if applied:
        node = Mask(node, applied)
    node = Map(node, projection)
    if window_spec is not None:
        node = WindowAggregate(node, window_spec)
    return MergeResult(QueryGraph(node), plan, tuple(warnings), analysis, hidden_time)
