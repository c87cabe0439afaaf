"""Re-sharing (issue 48): a consumer's handle output as a derived stream, and the check that a
policy written for it is no wider than the grant it derives from.

The security punctuations paper (Nehme, Rundensteiner, Bertino, section 4.3, Fig. 8) lets a
query specifier whose role holds `WITH GRANT OPTION` attach its own punctuations to its query's
result (`ON RESULT ...`), and Borealis (Lindner, Meier, section 4.1) makes a query's output
stream an object its owner grants to others. Here a consumer whose decision carries the grant
option (`pep.core.obligations`) registers its handle's rows as a stream it owns: a **derived
stream**, whose tuples are exactly the rows its deriving plan delivers (already filtered,
masked, projected or windowed by the gateway), and whose policies are its own.

What a derived stream is (`derive`):
- its schema is the deriving plan's output: a plain plan's projection (a masked attribute with
  its masked type: a hash is text), a windowed plan's `window_start`, `window_end`, group-by keys
  and aggregates (`count` a long, `avg` a double, `sum` of longs a long, `min`, `max`,
  `firstval`, `lastval` the attribute's type, `lub` a label of its lattice; a differentially
  private window's counts and sums are doubles: they carry noise);
- its time attribute is the source's when the plan shows it in an order-keeping form (raw, or
  truncated), a time window's `window_start`, and none for a tuple window (its bounds are tuple
  numbers, not times);
- a join or a union of grants cannot be derived: a join's rows carry two owners' grants, and a
  union's rows differ in their attributes from one to the next (`CannotDerive`).

What a policy for it may say (`check_obligation`, run on every policy write that targets a
derived stream, and on the policies that already name a stream's name when it is derived). The
derived stream's data cannot carry more than its deriving grant anyway: it IS that grant's
output. The write-time check makes the policy say so: a policy that claims more than the data
holds would promise what nobody can deliver, and its author would believe it grants what it
does not. So it is refused (`WiderThanGrant`, naming what is wider) when it
- names an attribute of the source stream that the deriving grant hides (or, for a windowed
  grant, any source attribute: only the windows' outputs are there): it would refer to nothing;
- masks an attribute the deriving grant masks with a mask that is not at least as coarse as
  the grant's (`pep.core.masks.at_least_as_coarse`): the raw detail it promises is gone;
- has a window finer than the deriving grant's time window (a smaller size or step), or of the
  other type: each row of a windowed derived stream is one deriving window, so a finer one
  cannot be computed (and a tuple-windowed grant's rows carry tuple numbers, not times);
- is refused when read as a consumer's query of the deriving grant restated over the derived
  stream (`pep.core.merge.merge`: its leak, mask and window rules, the same that refuse a
  consumer's query; `deriving_graph`).
Its filter selects among the derived stream's rows, which all passed the deriving filter, so it
can only narrow; the merge's NR analysis of the two together (the deriving filter restated on
the attributes the derived stream shows raw) gives a warning when it can never hold.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from pdp import Obligation
from pep.core.analysis import ConditionTooComplex
from pep.core.conditions import And, Comparison, Expr, Or, attributes_of, to_text
from pep.core.errors import NotPermitted, Refusal, Unprocessable
from pep.core.graph import QueryGraph, UnsupportedGraph, pipeline_graph
from pep.core.masks import Mask, at_least_as_coarse, masks_of
from pep.core.merge import merge
from pep.core.obligations import FUNCTIONS_FOR_TYPE, ObligationError, policy_graph
from pep.core.plan import (
    AGGREGATE_FUNCTIONS,
    Aggregate,
    AnyPlan,
    ExecutionPlan,
    Field,
    FieldType,
    PolicyWindowTerms,
    Predicate,
    StreamSchema,
    WindowAsk,
    WindowSpec,
)

Resolver = Callable[[str, str], list[str]]
NUMBER_TYPES = ("double", "long")
ORDERLESS_MASKS = frozenset({"hash", "null", "prefix", "suffix"})


class CannotDerive(Unprocessable):
    """This plan's output cannot be a stream (a join, a union of grants, names no stream
    attribute may have)."""


class WiderThanGrant(NotPermitted):
    """A derived stream's policy asks for more than the grant it derives from gives: `what`
    (attribute, mask, window, query) and the attribute, when one is at fault."""

    def __init__(self, message: str, what: str, attribute: str | None = None,
                 line: int | None = None) -> None:
        super().__init__(message, wider=what, attribute=attribute, line=line)
        self.what = what
        self.attribute = attribute


@dataclass(frozen=True)
class Derivation:
    """A derived stream: the deriving handle's plan over its source, and what the derived
    stream holds (`schema`, `time_attribute`)."""

    stream: str  # the derived stream's name
    source: str  # the stream the deriving plan reads
    plan: ExecutionPlan
    source_schema: StreamSchema
    schema: StreamSchema
    time_attribute: str | None

    @property
    def masks(self) -> dict[str, Mask]:
        """The deriving plan's masks on the attributes the derived stream carries under their
        own names (a plain plan's projection, a windowed plan's keys)."""
        carried = {n.lower() for n in self.schema.names}
        return {name: mask for name, mask in masks_of(self.plan.masks).items()
                if name.lower() in carried}

    @property
    def hidden(self) -> tuple[str, ...]:
        """The source's attributes the derived stream does not carry."""
        carried = {n.lower() for n in self.schema.names}
        return tuple(n for n in self.source_schema.names if n.lower() not in carried)

    def describe(self) -> dict[str, object]:
        """What the derived stream holds, for its owner (JSON)."""
        w = self.plan.window
        return {"source": self.source,
                "masks": {n: m.spec for n, m in self.masks.items()},
                "window": None if w is None else {"type": w.kind, "size": w.size,
                                                  "step": w.step},
                "time_attribute": self.time_attribute}


# -- what a derived stream holds ---------------------------------------------------------------

def derive(stream: str, plan: AnyPlan, source_schema: StreamSchema,
           source_time_attribute: str | None) -> Derivation:
    """The derived stream `stream` of a handle with this plan (see the module docstring);
    CannotDerive for a plan whose output is no stream."""
    if not isinstance(plan, ExecutionPlan):
        kind = "a join of two streams" if hasattr(plan, "left") else "a union of grants"
        raise CannotDerive(f"the handle's plan is {kind}: only a single grant's plan on one "
                           "stream can be derived (a join's rows carry two owners' grants, a "
                           "union's rows differ in their attributes)")
    masks = masks_of(plan.masks)

    def shown(name: str) -> Field:
        f = source_schema.lookup(name)
        if f is None:
            raise CannotDerive(f"the handle's plan names {name!r}, which stream "
                               f"{plan.stream!r} does not have")
        mask = masks.get(f.name)
        kind = mask.output_type(f.type) if mask is not None else f.type
        return Field(f.name, kind, f.lattice if kind == "label" else None)

    w = plan.window
    time_attribute: str | None = None
    if w is None:
        fields = [shown(n) for n in plan.projection]
        if source_time_attribute is not None:
            t = source_schema.lookup(source_time_attribute)
            mask = masks.get(t.name) if t is not None else None
            if t is not None and t.name in plan.projection and \
                    (mask is None or mask.kind not in ORDERLESS_MASKS):
                time_attribute = t.name
    else:
        bounds: FieldType = "long"
        if w.kind == "time":
            t = source_schema.lookup(w.time_attribute or "")
            bound = shown(t.name) if t is not None else None
            bounds = "timestamp" if bound is not None and bound.type == "timestamp" else "double"
            time_attribute = "window_start"
        fields = [Field("window_start", bounds), Field("window_end", bounds)]
        fields += [shown(k) for k in w.keys]
        fields += [_aggregate_field(a, shown(a.attribute), w.privacy is not None)
                   for a in w.aggregates]
    names = [f.name.lower() for f in fields]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CannotDerive(f"the handle's output names {', '.join(twice)} twice: a stream's "
                           "attributes have distinct names")
    if not fields:
        raise CannotDerive("the handle's plan shows no attribute")
    return Derivation(stream, plan.stream, plan, source_schema, StreamSchema(tuple(fields)),
                      time_attribute)


def _aggregate_field(aggregate: Aggregate, of: Field, private: bool) -> Field:
    function = aggregate.function
    kind: FieldType
    if function == "count":
        kind = "double" if private else "long"
    elif function == "avg":
        kind = "double"
    elif function == "sum":
        kind = "long" if of.type == "long" and not private else "double"
    else:  # min, max, firstval, lastval, lub: a value of the attribute
        kind = of.type
    return Field(aggregate.output_name, kind, of.lattice if kind == "label" else None)


# -- the deriving grant, restated over the derived stream --------------------------------------

def _restatable(d: Derivation) -> set[str]:
    """The derived stream's attributes that carry a source attribute under its name and type:
    raw, or masked into the same type (a hash, which is text, is left out). The deriving
    filter's comparisons on them are comparisons of the raw values, as a policy's filter is,
    and the merge relates them to a derived filter's comparisons of the masked values."""
    w = d.plan.window
    carried = w.keys if w is not None else d.plan.projection
    out = set()
    for name in carried:
        source, shown = d.source_schema.lookup(name), d.schema.lookup(name)
        if source is not None and shown is not None and source.type == shown.type:
            out.add(name)
    return out


def restated_filter(d: Derivation) -> Expr | None:
    """The deriving plan's filter as far as it speaks of attributes the derived stream carries
    (`_restatable`): every other comparison is left out of its conjunct, so it is implied by the
    real one (a tuple that passed the deriving filter passes this one): what the NR analysis of
    a derived filter may assume. None: it assumes nothing."""
    dnf = d.plan.filter_dnf
    if dnf is None:
        return None
    raw = _restatable(d)
    alternatives: list[Expr] = []
    for conjunct in dnf:
        kept = tuple(Comparison(p.attribute, p.op, p.value) for p in conjunct
                     if isinstance(p, Predicate) and p.mask is None and p.attribute in raw)
        if not kept:
            return None  # an alternative that assumes nothing: the whole says nothing
        alternatives.append(kept[0] if len(kept) == 1 else And(kept))
    if not alternatives:
        return None  # no tuple passes the deriving plan: nothing is assumed of none
    return alternatives[0] if len(alternatives) == 1 else Or(tuple(alternatives))


def deriving_graph(d: Derivation) -> QueryGraph:
    """The deriving grant as a policy graph over the derived stream: its filter restated
    (`restated_filter`), its masks on the attributes carried under their names, and for a time
    window a window of its size and step over the derived stream's time attribute that allows
    every aggregate, key and filter the derived stream's attributes can have."""
    condition = restated_filter(d)
    w = d.plan.window
    window = terms = None
    if w is not None and w.kind == "time":
        aggregates = tuple(Aggregate(f.name, fn)
                           for f in d.schema.fields for fn in AGGREGATE_FUNCTIONS
                           if fn in FUNCTIONS_FOR_TYPE.get(f.type, frozenset()))
        window = WindowSpec("time", w.size, w.step, aggregates, keys=d.schema.names)
        terms = PolicyWindowTerms(d.schema.names)
    masks = d.masks
    return pipeline_graph(
        d.stream, filter=(condition, to_text(condition)) if condition is not None else None,
        window=window, policy_window=terms,
        mask=tuple((n, masks[n].spec) for n in d.schema.names if n in masks) or None)


def _as_query(graph: QueryGraph) -> QueryGraph:
    """A derived policy's graph read as a consumer's query (its window's keys asked for; what
    only narrows, privacy and label bounds, left aside)."""
    f, m, k, w = graph.filter, graph.map, graph.mask, graph.window
    spec = None if w is None else replace(w.spec, privacy=None, label_bounds=())
    return pipeline_graph(graph.source.stream,
                          filter=(f.condition, f.text) if f is not None else None,
                          map=m.attributes if m is not None else None,
                          mask=k.masks if k is not None else None, window=spec,
                          window_ask=WindowAsk(keys=spec.keys or None) if spec is not None
                          else None)


# -- the check --------------------------------------------------------------------------------

def _names(graph: QueryGraph) -> list[str]:
    """Every attribute a policy graph names: filter, map, masks, window."""
    names: list[str] = []
    if graph.filter is not None:
        names += attributes_of(graph.filter.condition)
    if graph.map is not None:
        names += graph.map.attributes
    if graph.mask is not None:
        names += [n for n, _ in graph.mask.masks]
    w = graph.window
    if w is not None:
        names += [a.attribute for a in w.spec.aggregates] + list(w.spec.keys)
        names += [a for a, _ in w.spec.label_bounds]
        if w.policy is not None:
            names += w.policy.prefilter
    return list(dict.fromkeys(names))


def _where(d: Derivation) -> str:
    return f"derived stream {d.stream!r} (derived from {d.source!r})"


def check_obligation(ob: Obligation, d: Derivation, resolver: Resolver,
                     line: int | None = None, label: str | None = None) -> list[str]:
    """Warnings for one stream obligation of a policy about derived stream `d`; WiderThanGrant
    when it asks for more than the deriving grant gives (the module docstring). An obligation
    that does not fit the derived stream for another reason is left to the schema check
    (`pep.streams.policy_check`), which says why. `label`: how messages name the obligation (a
    sharing rule's field); default its id and line."""
    at = f" (line {line})" if line is not None else ""
    what = label if label is not None else f"obligation {ob.id}{at}"
    carried = {n.lower() for n in d.schema.names}
    widened = StreamSchema(d.schema.fields + tuple(
        f for f in d.source_schema.fields if f.name.lower() not in carried))
    try:
        graph = policy_graph([ob], d.stream, widened, resolver=resolver)
    except ObligationError:
        return []
    for name in _names(graph):
        if name.lower() not in carried:
            shown = ", ".join(d.schema.names)
            raise WiderThanGrant(
                f"{what} names attribute {name!r} of stream {d.source!r}, which "
                f"the deriving grant does not show: {_where(d)} holds only {shown}, so a "
                "policy naming it would refer to nothing", "attribute", name, line)
    deriving = d.masks
    for name, spec in (graph.mask.masks if graph.mask is not None else ()):
        asked, have = masks_of([(name, spec)])[name], deriving.get(name)
        if have is not None and not at_least_as_coarse(asked, have):
            raise WiderThanGrant(
                f"{what} shows {name!r} as {spec!r}, which is not at least as "
                f"coarse as the deriving grant's mask {have.spec!r}: {_where(d)} holds {name!r} "
                f"only as {have.spec}", "mask", name, line)
    _check_window(graph, d, what, line)
    try:
        merged = merge(deriving_graph(d), _as_query(graph), d.schema,
                       time_attribute=d.time_attribute)
    except NotPermitted as exc:
        attribute = exc.details.get("attribute")
        raise WiderThanGrant(
            f"{what}, read as a consumer's query of the deriving grant of "
            f"{_where(d)}, is refused: {exc.message}", "query",
            attribute if isinstance(attribute, str) else None, line) from None
    except (Refusal, ConditionTooComplex, UnsupportedGraph) as exc:
        raise WiderThanGrant(
            f"{what} cannot be checked against the deriving grant of "
            f"{_where(d)}: {exc}", "query", None, line) from None
    return [f"{what} can never show a row of {_where(d)} (read as a query of "
            f"the deriving grant, its filter restated on the derived stream): {w.message}"
            for w in merged.warnings if w.kind == "NR"]


def _check_window(graph: QueryGraph, d: Derivation, what: str, line: int | None) -> None:
    asked, have = graph.window, d.plan.window
    if asked is None or have is None:
        return
    spec = asked.spec
    if have.kind == "tuple" and spec.kind != "tuple":
        raise WiderThanGrant(
            f"{what} asks for a {spec.kind} window, but the deriving "
            f"grant's windows are tuple windows: the rows of {_where(d)} are numbered windows "
            "with no time to place them by", "window", None, line)
    if have.kind == "time" and spec.kind != "time":
        raise WiderThanGrant(
            f"{what} asks for a {spec.kind} window, but the deriving "
            f"grant's windows are time windows of {have.size} s every {have.step} s: each row "
            f"of {_where(d)} is one of them, and a derived window is a time window at least as "
            "coarse", "window", None, line)
    if have.kind == "time" and (spec.size < have.size or spec.step < have.step):
        raise WiderThanGrant(
            f"{what} asks for a time window of {spec.size} s every "
            f"{spec.step} s, finer than the deriving grant's time window of {have.size} s "
            f"every {have.step} s: each row of {_where(d)} is one deriving window, so a finer "
            "window cannot be computed from them", "window", None, line)


def check_obligations(obligations: Iterable[tuple[Obligation, int | None]], d: Derivation,
                      resolver: Resolver) -> list[str]:
    """`check_obligation` of each (obligation, line); the first refusal is raised."""
    warnings: list[str] = []
    for ob, line in obligations:
        warnings += check_obligation(ob, d, resolver, line)
    return warnings


__all__ = ["Derivation", "CannotDerive", "WiderThanGrant", "derive", "deriving_graph",
           "restated_filter", "check_obligation", "check_obligations"]
