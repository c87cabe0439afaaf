"""Joins of two streams under policy: each side enforced first, then the windowed join.

A join request names a first stream (the XACML request's resource-id) and, in its user query, a
second stream with the join condition (see `pep.core.userquery`). Each side is decided by the PDP
on its own (`pep.core.access` builds the second side's request from the first with the
resource-id replaced) and merged with its part of the user query exactly as a single-stream
request is (`pep.core.merge`), which gives two side plans. This module takes the two merged
sides and the join part of the query and gives the `JoinPlan`, or refuses:

- the join condition may use only attributes that each side's authorised output exposes: an
  attribute the side's policy hides (by its map, or because the policy lets the side be seen only
  through its window) is refused naming it (`QueryRefused`, 403); one the consumer's own map or
  window left out, or that does not exist, is invalid (`QueryInvalid`, 400);
- a time-windowed side joins on its window outputs (window_start, window_end, group-by keys,
  aggregates), never on raw tuples; a tuple-windowed side cannot be joined (Spark cannot join
  after a count-based window: `Unprocessable`, 422), nor can a differentially private one
  (its noise and its budget are per emitted window of one consumer's handle; a join's windows
  run in a Spark query of their own, without either: 422);
- a plain side's time is its stream's event-time attribute, which the time bound uses: it must be
  one of the side's outputs like any attribute of the condition; a windowed side's time is its
  window_end. `within` is required unless both sides are windowed (then it defaults to 0);
- the output holds both sides' outputs named `<stream>.<output>`; a stream joined with itself is
  refused (two windows over one stream in one query is what the one-window rule forbids);
- security labels (MLS): a windowed side's `lub` aggregate and its window's label bound run in
  the join's side as in a stream read alone (a side window whose lub the bound does not
  dominate never reaches the join); when both sides show one label over the same lattice, each
  row also carries `label`, the least upper bound of the two (`joined_label`).

Why this cannot leak what either policy hides: every row of a side is a row the consumer would
get from that stream alone (the same merged plan, policy filter before any window), the join
condition and the time bound read only those rows' outputs, and a result row is a pair of such
rows. The join only selects among authorised rows, so it shows nothing that two single-stream
handles would not show; it holds the caller's one window on both streams, so it never adds a
second window over a stream either. In Spark, each side's watermark is taken after its policy
filter, so a hidden tuple does not even move a side's time.

NR/PR analysis: each side's own warnings (prefixed with its stream), plus NR for the join
condition: an equality whose two sides' filters can never agree (the left keeps station = 'A',
the right area = 'B'), or a time bound their time filters can never meet, checked with the
interval machinery of `pep.core.analysis` over every pair of the sides' filter conjuncts. A
windowed side's key, min, max, firstval and lastval outputs are values of the attribute they come
from, so the side's filter constrains them; its other aggregates and window bounds are not
analysed. The check never claims NR wrongly; it may miss one that needs reasoning across
several outputs of a windowed side.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Literal

from pep.core.analysis import Constraint, MergeWarning, values_satisfiable
from pep.core.conditions import format_literal
from pep.core.errors import Unprocessable
from pep.core.exact import micros_from_iso
from pep.core.explain import (
    GraphJson,
    JoinPlanJson,
    join_graph_json,
    join_plan_to_json,
    render_join_sql,
    seconds_text,
)
from pep.core.graph import QueryGraph
from pep.core.labels import LabelError, Lattice
from pep.core.masks import UNORDERED, parse_mask
from pep.core.merge import MergeResult, QueryInvalid, QueryRefused
from pep.core.outputs import JOINED_LABEL, join_output, output_names, output_source, side_outputs
from pep.core.plan import Conjunct, ExecutionPlan, JoinPlan, Predicate, StreamSchema
from pep.core.userquery import JoinQuery

Side = Literal["left", "right"]
Output = tuple[Side, str]  # a side's output, by name
Choice = Mapping[Side, Conjunct]  # a conjunct of each side's filter
NUMERIC = frozenset({"double", "long"})
MAX_CONJUNCT_PAIRS = 4096  # beyond, the join condition is not analysed (said as INFO)
MAX_CHOICES = 256


@dataclass(frozen=True)
class JoinSide:
    """One merged side: its stream, schema, merge result and the graphs it was merged from."""

    stream: str
    schema: StreamSchema
    merged: MergeResult
    policy: QueryGraph
    user: QueryGraph | None = None
    time_attribute: str | None = None  # the stream's event-time attribute

    @property
    def plan(self) -> ExecutionPlan:
        return self.merged.plan


@dataclass(frozen=True)
class JoinResult:
    plan: JoinPlan
    warnings: tuple[MergeWarning, ...]
    sql: str
    plan_json: JoinPlanJson
    graph_json: GraphJson
    output: tuple[str, ...]

    @property
    def nr(self) -> bool:
        return any(w.kind == "NR" for w in self.warnings)


# -- security labels (MLS) ------------------------------------------------------------------------

def label_lattice(plan: ExecutionPlan, schema: StreamSchema, output: str) -> Lattice | None:
    """The lattice of a side's output when it is a security label: a plain side's label
    attribute, a windowed side's label key or `lub_<attr>`; None otherwise (a masked attribute's
    output is no label)."""
    w = plan.window
    source = None
    if w is None or output in w.keys:
        source = output if w is not None or output in plan.projection else None
    else:
        source = next((a.attribute for a in w.aggregates
                       if a.output_name == output and a.function == "lub"), None)
    field = schema.lookup(source) if source is not None else None
    if field is None or field.type != "label" or field.name in dict(plan.masks):
        return None
    return field.lattice


def joined_label(left: JoinSide, right: JoinSide) -> tuple[str, str] | None:
    """The two sides' outputs whose least upper bound labels each joined row, or None.

    A joined row is labelled when each side shows exactly one label (a plain side its label
    attribute, a windowed side its `lub_<attr>` or a label key) and both are over the same
    lattice (the same levels and categories, in the same order): the row's `label` is then the
    least upper bound of the two, what the paper gives the output of a binary operator. Over
    different lattices (or with several labels on a side) no joined label is produced: two
    lattices have no common order, so no least upper bound exists. A row's label needs no bound
    of its own: each side's policy already keeps only what the reader's session dominates (a
    plain side by its filter, a windowed side by its window's label bound), and a label that
    dominates both sides' dominates their least upper bound."""
    found = []
    for side in (left, right):
        labels = [(out, lattice) for out in output_names(side.plan)
                  if (lattice := label_lattice(side.plan, side.schema, out)) is not None]
        if len(labels) != 1:
            return None
        found.append(labels[0])
    (lout, llat), (rout, rlat) = found
    if (llat.levels, llat.categories) != (rlat.levels, rlat.categories):
        return None
    return (lout, rout)


def _check_label_bounds(side: JoinSide) -> None:
    """A windowed side's label bounds must name a label attribute and a label of its lattice
    (the merge writes them so; a plan that does not is refused here, never run without them)."""
    w = side.plan.window
    for attribute, text in (w.label_bounds if w is not None else ()):
        field = side.schema.lookup(attribute)
        if field is None or field.type != "label" or field.lattice is None:
            raise Unprocessable(f"stream {side.stream!r}: its window's label bound is on "
                                f"{attribute!r}, which is no label attribute of the stream",
                                stream=side.stream)
        try:
            field.lattice.parse(text)
        except LabelError as exc:
            raise Unprocessable(f"stream {side.stream!r}: its window's label bound on "
                                f"{attribute!r} is no label of its lattice: {exc}",
                                stream=side.stream) from None


def _family(kind: str) -> str:
    return "number" if kind in NUMERIC else kind


# -- naming the condition's attributes ------------------------------------------------------------

def _policy_exposes(side: JoinSide, attribute: str) -> bool:
    m = side.policy.map
    return attribute in (m.attributes if m is not None else side.schema.names)


def _resolve(side: JoinSide, name: str, role: str) -> str:
    """The side's output named `name` (case-insensitive); refuses naming it otherwise."""
    outputs = side_outputs(side.plan, side.schema)
    for out in outputs:
        if out.lower() == name.lower():
            return out
    shown = ", ".join(outputs) or "nothing"
    field = side.schema.lookup(name)
    if field is None:
        # maybe an aggregate of a hidden attribute (avg_humidity): refuse naming that attribute
        function, _, attribute = name.partition("_")
        hidden = side.schema.lookup(attribute) if function and attribute else None
        if hidden is not None and not _policy_exposes(side, hidden.name):
            raise QueryRefused(
                f"the join {role} uses {name!r} of stream {side.stream!r}: an aggregate of "
                f"attribute {hidden.name!r}, which that stream's policy hides", hidden.name)
        raise QueryInvalid(f"the join {role} uses {name!r}, which is not an output of stream "
                           f"{side.stream!r} (its side shows: {shown})", attribute=name)
    attribute = field.name
    if not _policy_exposes(side, attribute):
        raise QueryRefused(f"the join {role} uses attribute {attribute!r} of stream "
                           f"{side.stream!r}, which that stream's policy hides", attribute)
    if side.plan.window is not None:
        if side.policy.window is not None:
            raise QueryRefused(
                f"the join {role} uses attribute {attribute!r} of stream {side.stream!r}, whose "
                "policy lets it be seen only through its window: a windowed side joins on its "
                f"window outputs ({shown}), never on raw tuples", attribute)
        raise QueryInvalid(f"the join {role} uses attribute {attribute!r} of stream "
                           f"{side.stream!r}, but your query windows that side: join on its "
                           f"window outputs ({shown})", attribute=attribute)
    raise QueryInvalid(f"the join {role} uses attribute {attribute!r} of stream {side.stream!r}, "
                       f"which your own map for that side leaves out (it shows: {shown}); add it",
                       attribute=attribute)


def _time_of(side: JoinSide) -> str:
    w = side.plan.window
    if w is not None:
        if w.privacy is not None:
            raise Unprocessable(
                f"stream {side.stream!r}: its policy's windows are differentially private, and "
                "a private window cannot be joined (its noise and the consumer's privacy budget "
                "are applied per window of a handle of its own); ask for the stream alone",
                stream=side.stream)
        if w.kind != "time":
            raise Unprocessable(
                f"stream {side.stream!r}: a tuple-windowed side cannot be joined (Spark cannot "
                "join after a count-based window); only plain and time-windowed sides can",
                stream=side.stream)
        return "window_end"
    time_attr = side.time_attribute or next(
        (f.name for f in side.schema.fields if f.type == "timestamp"), None)
    if time_attr is None:
        raise Unprocessable(f"stream {side.stream!r} has no event-time attribute; a join needs "
                            "one on each side", stream=side.stream)
    name = _resolve(side, time_attr, "time bound")
    spec = dict(side.plan.masks).get(name)
    if spec is not None and parse_mask(spec).kind in UNORDERED:
        # the time bound and the side's watermark read the side's time as the consumer sees
        # it (masked, `pep.runtime.joins.frames`): a mask that leaves no time cannot bound it
        raise QueryRefused(f"stream {side.stream!r}: the policy shows its time attribute "
                           f"{name!r} only as {spec!r}, which gives no time to bound a join "
                           "with", name)
    return name


# -- the join -------------------------------------------------------------------------------------

def check_streams(first: str, second: str) -> None:
    """Refuse a join of a stream with itself (before its second side is decided)."""
    if first == second:
        raise QueryInvalid(f"a join of stream {first!r} with itself is not supported: it would "
                           "put two windows over one stream in one query, which the one-window "
                           "rule forbids", stream=second)


def _check_no_anchor(side: JoinSide) -> None:
    """A side whose filter measures DISTANCE_TO a moving anchor cannot be joined: the anchor's
    positions are tracked only by the stream's own shared query, not by a join's. Refused
    (never run without the filter)."""
    for conj in side.plan.filter_dnf or ():
        for p in conj:
            if getattr(p, "function", None) == "distance_to":
                raise Unprocessable(f"stream {side.stream!r}: its filter uses DISTANCE_TO (a "
                                    "moving anchor), which a join cannot evaluate; read the "
                                    "stream on its own instead")


def build_join(left: JoinSide, right: JoinSide, query: JoinQuery) -> JoinResult:
    """The JoinPlan of two merged sides and the join part of the query, with its warnings,
    SQL-like text and JSON; raises QueryRefused, QueryInvalid or Unprocessable."""
    check_streams(left.stream, right.stream)
    for side in (left, right):
        _check_no_anchor(side)
        _check_label_bounds(side)
    left_time, right_time = _time_of(left), _time_of(right)
    lout, rout = side_outputs(left.plan, left.schema), side_outputs(right.plan, right.schema)
    pairs: list[tuple[str, str]] = []
    for a, b in query.on:
        la, rb = _resolve(left, a, "condition"), _resolve(right, b, "condition")
        if _family(lout[la]) != _family(rout[rb]):
            raise QueryInvalid(f"the join condition compares {left.stream}.{la} ({lout[la]}) "
                               f"with {right.stream}.{rb} ({rout[rb]}); both sides of an "
                               "equality need the same kind of value", attribute=rb)
        if (la, rb) not in pairs:
            pairs.append((la, rb))
    within = query.within
    if within is None:
        if left.plan.window is None or right.plan.window is None:
            raise QueryInvalid("a join with a plain (unwindowed) side needs 'within': how many "
                               "seconds apart two tuples may be to meet")
        within = 0.0
    plan = JoinPlan(left.plan, right.plan, tuple(pairs), float(within), left_time, right_time,
                    joined_label(left, right))

    warnings: list[MergeWarning] = []
    for side in (left, right):
        for w in side.merged.warnings:
            warnings.append(MergeWarning(w.kind, w.operator, f"{side.stream}: {w.message}",
                                         w.predicates))
    nr = analyse_join(plan, left, right)
    if nr is not None:
        warnings.append(nr)
    hashed = [(a, b) for a, b in pairs if dict(plan.left.masks).get(a) == "hash"
              and dict(plan.right.masks).get(b) == "hash"]
    if hashed:
        warnings.append(MergeWarning(
            "INFO", "join", "the join compares hashed values ("
            + ", ".join(f"{left.stream}.{a} = {right.stream}.{b}" for a, b in hashed)
            + "): each is keyed with its stream owner's secret, so they are equal only when "
            "both streams have the same owner and the raw values are equal", ()))
    return JoinResult(plan, tuple(warnings), render_join_sql(plan, left.schema, right.schema),
                      join_plan_to_json(plan),
                      join_graph_json(plan, (left.merged.graph, left.schema),
                                      (right.merged.graph, right.schema)),
                      join_output(plan))


# -- NR analysis of the join condition ------------------------------------------------------------

@dataclass(frozen=True)
class _Member:
    side: Side
    output: str
    source: str | None  # attribute the side's filter constrains, if any


def _classes(plan: JoinPlan) -> list[list[Output]]:
    """Equivalence classes of outputs the equalities make equal (union-find)."""
    parent: dict[Output, Output] = {}

    def find(x: Output) -> Output:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in plan.on:
        ra, rb = find(("left", a)), find(("right", b))
        if ra != rb:
            parent[ra] = rb
    groups: dict[Output, list[Output]] = {}
    for node in list(parent):
        groups.setdefault(find(node), []).append(node)
    return [sorted(g) for g in groups.values()]


def _preds(conj: Conjunct, attribute: str | None) -> list[Constraint]:
    if attribute is None:
        return []
    # spatial predicates have no single attribute, comparisons on a masked value say nothing
    # of the raw one: left out, which can only hide an NR
    return [(p.op, p.value) for p in conj if isinstance(p, Predicate)
            and p.attribute == attribute and p.mask is None]


def _texts(conj: Conjunct, attribute: str | None) -> list[str]:
    if attribute is None:
        return []
    return [f"{p.attribute} {p.op} {format_literal(p.value)}" for p in conj
            if isinstance(p, Predicate) and p.attribute == attribute and p.mask is None]


def analyse_join(plan: JoinPlan, left: JoinSide, right: JoinSide) -> MergeWarning | None:
    """NR when the join condition can never hold given the sides' filters (see the module
    docstring); an INFO warning when there are too many alternatives to check; else None."""
    sides: dict[Side, tuple[JoinSide, ExecutionPlan]] = {"left": (left, plan.left),
                                                          "right": (right, plan.right)}
    dnfs = {name: plan_.filter_dnf for name, (_, plan_) in sides.items()}
    if () in dnfs.values():
        return None  # a side can never deliver: its own NR warning says why
    conjuncts: dict[Side, tuple[Conjunct, ...]] = {
        name: (dnf if dnf is not None else ((),)) for name, dnf in dnfs.items()}
    windowed = {name: plan_.window is not None for name, (_, plan_) in sides.items()}
    kinds: dict[Side, dict[str, str]] = {"left": side_outputs(plan.left, left.schema),
                                         "right": side_outputs(plan.right, right.schema)}
    classes: list[tuple[list[_Member], str]] = []
    for group in _classes(plan):
        members = [_Member(s, o, output_source(sides[s][1], o)) for s, o in group]
        types = {kinds[m.side][m.output] for m in members}
        kind = "long" if "long" in types else next(iter(types))
        classes.append((members, kind))
    # the time bound is analysed between plain sides (a window's end is not constrained by its
    # side's filter), unless an equality already makes the two times equal
    time_check = not any(windowed.values()) and not any(
        {("left", plan.left_time), ("right", plan.right_time)}
        <= {(m.side, m.output) for m in members} for members, _ in classes) \
        and plan.left_time not in dict(plan.left.masks) \
        and plan.right_time not in dict(plan.right.masks)  # a masked time: not bounded

    sides_in_order: tuple[Side, Side] = ("left", "right")
    raw_choices = [conjuncts[s] if not windowed[s] else ((),) for s in sides_in_order]
    if len(raw_choices[0]) * len(raw_choices[1]) > MAX_CONJUNCT_PAIRS:
        return MergeWarning("INFO", "join", "the join condition is too large to analyse for "
                            "results that can never come (too many alternatives in the sides' "
                            "filters); it is still enforced")
    first_failure: str | None = None
    failed_predicates: list[str] = []
    for lc, rc in itertools.product(*raw_choices):
        chosen: dict[Side, Conjunct] = {"left": lc, "right": rc}
        failure = None
        for members, kind in classes:
            if not _class_satisfiable(members, kind, chosen, windowed, conjuncts):
                failure = _describe_class(plan, members, chosen, windowed, conjuncts)
                break
        if failure is None and time_check and not _time_satisfiable(plan, lc, rc):
            failure = _describe_time(plan, lc, rc)
        if failure is None:
            return None
        if first_failure is None:
            first_failure, failed_predicates = failure
    assert first_failure is not None
    return MergeWarning("NR", "join", "no result: the join can never match: " + first_failure,
                        tuple(dict.fromkeys(failed_predicates)))


def _class_satisfiable(members: Sequence[_Member], kind: str, chosen: Choice,
                       windowed: Mapping[Side, bool],
                       conjuncts: Mapping[Side, tuple[Conjunct, ...]]) -> bool:
    fixed: list[Constraint] = []
    free: list[_Member] = []
    for m in members:
        if m.source is None:
            continue
        if windowed[m.side]:
            free.append(m)
        else:
            fixed.extend(_preds(chosen[m.side], m.source))
    options = [conjuncts[m.side] for m in free]
    total = 1
    for o in options:
        total *= len(o)
    if total > MAX_CHOICES:
        return True  # too many to check: never claim NR without proof
    for combo in itertools.product(*options):
        preds = list(fixed)
        for m, conj in zip(free, combo, strict=True):
            preds.extend(_preds(conj, m.source))
        if values_satisfiable(kind, preds):
            return True
    return False


def _describe_class(plan: JoinPlan, members: Sequence[_Member], chosen: Choice,
                    windowed: Mapping[Side, bool],
                    conjuncts: Mapping[Side, tuple[Conjunct, ...]]) -> tuple[str, list[str]]:
    names = " = ".join(f"{plan.left.stream if m.side == 'left' else plan.right.stream}."
                       f"{m.output}" for m in members)
    parts, predicates = [], []
    for m in members:
        stream = plan.left.stream if m.side == "left" else plan.right.stream
        if m.source is None:
            continue
        if windowed[m.side]:
            texts = sorted({t for conj in conjuncts[m.side] for t in _texts(conj, m.source)})
        else:
            texts = _texts(chosen[m.side], m.source)
        if texts:
            parts.append(f"{stream}'s filter keeps only {' AND '.join(texts)}")
            predicates.extend(texts)
    detail = "; ".join(parts) if parts else "no value satisfies both sides"
    return f"{names} never holds ({detail})", predicates


def _interval(preds: Sequence[tuple[str, Fraction]]
              ) -> tuple[Fraction | None, bool, Fraction | None, bool]:
    """(low, low inclusive, high, high inclusive) of a conjunct's comparisons on one attribute
    (None: unbounded); `!=` is ignored (it removes a point, which a positive bound covers)."""
    lo: Fraction | None = None
    hi: Fraction | None = None
    lo_incl = hi_incl = True
    for op, v in preds:
        if op in (">", ">=", "="):
            incl = op != ">"
            if lo is None or v > lo or (v == lo and not incl):
                lo, lo_incl = v, incl
        if op in ("<", "<=", "="):
            incl = op != "<"
            if hi is None or v < hi or (v == hi and not incl):
                hi, hi_incl = v, incl
    return lo, lo_incl, hi, hi_incl


def _seconds_exact(value: object) -> Fraction:
    """A time constant as exact epoch seconds: a timestamp's text (its microseconds) or a
    number (epoch seconds)."""
    if isinstance(value, str):
        return Fraction(micros_from_iso(value), 1_000_000)
    if isinstance(value, (int, float, Decimal, Fraction)):
        return Fraction(value)
    raise TypeError(f"{value!r} is not a time constant")


def _time_satisfiable(plan: JoinPlan, lc: Conjunct, rc: Conjunct) -> bool:
    """Whether the sides' time filters leave two times at most `within` apart: over exact
    rationals (never rounding two instants together), as reals (timestamps are whole
    microseconds, so this can only find a match where none is, never claim NR falsely)."""
    lpreds = [(op, _seconds_exact(v)) for op, v in _preds(lc, plan.left_time)]
    rpreds = [(op, _seconds_exact(v)) for op, v in _preds(rc, plan.right_time)]
    if not lpreds or not rpreds:
        return True
    within = Fraction(plan.within)
    if within == 0:
        return values_satisfiable("double", lpreds + rpreds)
    lo, lo_incl, hi, hi_incl = _interval(lpreds)
    grown: list[tuple[str, Fraction]] = []
    if lo is not None:
        grown.append((">=" if lo_incl else ">", lo - within))
    if hi is not None:
        grown.append(("<=" if hi_incl else "<", hi + within))
    return values_satisfiable("double", grown + rpreds)


def _describe_time(plan: JoinPlan, lc: Conjunct, rc: Conjunct) -> tuple[str, list[str]]:
    lt, rt = _texts(lc, plan.left_time), _texts(rc, plan.right_time)
    return (
        f"{plan.left.stream}.{plan.left_time} and {plan.right.stream}.{plan.right_time} are "
        f"never within {seconds_text(plan.within)} s of each other ({plan.left.stream}'s filter "
        f"keeps only {' AND '.join(lt)}; {plan.right.stream}'s only {' AND '.join(rt)})",
        lt + rt,
    )


__all__ = ["JoinSide", "JoinResult", "build_join", "check_streams", "analyse_join",
           "joined_label", "label_lattice", "JOINED_LABEL"]
