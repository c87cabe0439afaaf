"""The union of grants: ASSIST's way of combining the policies that apply (Definitions 2-4,
Algorithm 3), as an alternative to xsg's default intersection.

When several rules permit one request, xsg by default applies all their obligations at once
(`pep.core.obligations`: filters conjoined, maps intersected, the coarsest window): a captain who
may see his own ship's neighbourhood with three attributes, and separately every ship in an
emergency with all of them, gets only what both allow. ASSIST gives the union: a tuple passes if
any applicable rule admits it, and shows what that rule grants (Secure Read); an aggregate is
computed per rule, over that rule's view and with windows at least that rule's (Secure Aggregate).

Which mode applies is a setting of the stream, chosen by its owner (`PATCH /streams/<name>`
`{"combining": "union"}`), else the gateway's (`obligation_combining`, default `intersection`).
Under `union` each rule's grant (its obligations and those of the policies around it:
`pdp.RuleGrant`) becomes one policy graph, merged with the consumer's query on its own exactly as
a single grant is (`pep.core.merge`), and:

- a grant whose merge refuses the query (it asks for an attribute that grant hides, a window
  finer than that grant's, ...) is not applicable to this query (ASSIST's read-applicable: the
  query's attributes must be within the rule's) and is left out, with an INFO warning; if every
  grant refuses, the first refusal is the answer. A grant the query can never meet (NR) is left
  out too, unless all are NR;
- identical plans count once; one plan left is an ordinary plan; several make a `UnionPlan`;
- a tuple passing several plain grants is delivered once, with the attributes of every plain
  grant it passes (so with rows 5 and 6 of Table 2 a ship within 200 nm shows mmsi, lon, lat,
  and the same ship in an emergency every attribute). A consumer who names attributes (a map)
  gets rows of exactly those attributes from the grants that show them all;
- every windowed grant computes its own windows over its own view (never a window over the
  union, which could aggregate tuples one grant admits raw with tuples another admits only in
  aggregates); its rows carry `grant`, its index in the plan's `union` list;
- NR/PR: NR when no grant can deliver anything; PR for the filter when the consumer's condition
  does not imply the disjunction of the grants' filters (exact, as for one grant); PR for the map
  naming the attributes no grant shows.

What the union must not do is hand out what no single grant shows: each member plan is a plan one
grant alone would give this consumer (its filter before anything else), and a row shows an
attribute only when a grant that admits that very tuple shows it. A restriction meant for every
grant (a filter an administrator wants everywhere) must then be written into each rule, or as a
Deny rule: under `union` a Permit rule is an alternative, never a constraint on the others.

Grants with masks (`pep.core.masks`) or differentially private windows (`pep.core.privacy`) are
not united with others: a tuple delivered once with the attributes of every grant that admits it
has no one masked form of an attribute two grants mask differently, and a private window's
budget is paid per handle of its own. Such a union is refused (403) naming the reason; alone, a
masked or private grant works as under `intersection`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pep.core.analysis import ConditionTooComplex, MergeWarning, analyse_filter
from pep.core.conditions import Or
from pep.core.errors import NotPermitted, Refusal
from pep.core.explain import GraphJson, graph_to_json
from pep.core.graph import QueryGraph
from pep.core.merge import MergeResult, merge, without_hidden_time
from pep.core.plan import ExecutionPlan, StreamSchema, UnionPlan

INTERSECTION = "intersection"
UNION = "union"
COMBINING_MODES = (INTERSECTION, UNION)


@dataclass(frozen=True)
class Alternative:
    """One grant's policy graph, and the rules it stands for."""

    rules: tuple[str, ...]
    policy: QueryGraph


@dataclass(frozen=True)
class UnionMerge:
    plan: ExecutionPlan | UnionPlan
    warnings: tuple[MergeWarning, ...]
    graph_json: GraphJson
    merged: tuple[MergeResult, ...]  # the member plans' merges, in the plan's order

    @property
    def nr(self) -> bool:
        return any(w.kind == "NR" for w in self.warnings)


def merge_union(alternatives: Sequence[Alternative], user: QueryGraph | None,
                schema: StreamSchema, time_attribute: str | None = None) -> UnionMerge:
    """Each grant merged on its own, then united (see the module docstring). Raises the first
    grant's refusal when no grant applies to the query, ConditionTooComplex as merge does."""
    merged: list[tuple[Alternative, MergeResult]] = []
    refused: list[tuple[Alternative, Refusal]] = []
    for alt in alternatives:
        try:
            merged.append((alt, merge(alt.policy, user, schema, time_attribute=time_attribute)))
        except ConditionTooComplex:
            raise
        except Refusal as exc:
            refused.append((alt, exc))
    if not merged:
        raise refused[0][1]
    info = [MergeWarning("INFO", "union", f"the grant of rule {_rules(alt)} does not apply to your "
                         f"query and is left out: {exc.message}") for alt, exc in refused]
    live = [(alt, m) for alt, m in merged if not m.nr] or merged[:1]
    kept = {id(m) for _, m in live}
    for alt, m in merged:
        if id(m) not in kept:
            info.append(MergeWarning("INFO", "union", f"the grant of rule {_rules(alt)} can never "
                                     "match your query and is left out"))
    by_key: dict[str, tuple[Alternative, MergeResult]] = {}
    for alt, m in live:
        by_key.setdefault(m.plan.key(), (alt, m))
    members = sorted(by_key.values(), key=lambda am: am[1].plan.canonical_json())
    if len(members) == 1:
        alt, m = members[0]
        return UnionMerge(m.plan, tuple(m.warnings) + tuple(info),
                          graph_to_json(m.graph, schema), (m,))
    # a grant that hides the time attribute: its null mask only orders its own plan's rows
    # (`pep.core.merge._hidden_time`), which a union's rows, merged per tuple, cannot keep
    members = [(alt, without_hidden_time(m)) for alt, m in members]
    for alt, m in members:
        window = m.plan.window
        if m.plan.masks or (window is not None and window.privacy is not None):
            what = "masks" if m.plan.masks else "a differentially private window"
            raise NotPermitted(f"the grant of rule {_rules(alt)} has {what}, which union mode "
                               "cannot combine with the other grants that apply to your query; "
                               "ask for fewer attributes or another filter so that one grant "
                               "applies, or ask the stream's owner for intersection mode")
    plan = UnionPlan(members[0][1].plan.stream, tuple(m.plan for _, m in members))
    warnings = _union_warnings(members, user, schema) + info
    graph: GraphJson = {"union": [{**graph_to_json(m.graph, schema), "rules": list(alt.rules)}
                                  for alt, m in members]}
    return UnionMerge(plan, tuple(warnings), graph, tuple(m for _, m in members))


def _rules(alt: Alternative) -> str:
    return ", ".join(r for r in alt.rules if r) or "(unnamed)"


def _union_warnings(members: list[tuple[Alternative, MergeResult]], user: QueryGraph | None,
                    schema: StreamSchema) -> list[MergeWarning]:
    """PR/NR over the union: the consumer's filter against the disjunction of the grants'
    filters; the attributes no grant shows; each member's window warnings, naming the grant."""
    filters = [alt.policy.filter.condition for alt, _ in members if alt.policy.filter is not None]
    union_filter = None if len(filters) < len(members) else (  # a grant without one: no filter
        filters[0] if len(filters) == 1 else Or(tuple(filters)))
    uf = user.filter.condition if user is not None and user.filter is not None else None
    out: list[MergeWarning] = []
    try:
        analysis = analyse_filter(union_filter, uf, schema)
        out.extend(w for w in analysis.warnings if w.operator == "filter")
    except ConditionTooComplex:
        out.append(MergeWarning("INFO", "filter", "the grants' filters are too large to analyse "
                                "together for partial results; each is still enforced"))
    shown = set()
    for alt, _ in members:
        policy_map = alt.policy.map
        shown |= set(policy_map.attributes if policy_map is not None else schema.names)
    hidden = [n for n in schema.names if n not in shown]
    asks_map = user is not None and user.map is not None
    if hidden and not asks_map:
        out.append(MergeWarning("PR", "map", "partial result: no applicable grant shows "
                                f"attribute(s) {', '.join(hidden)}", tuple(hidden)))
    for i, (alt, m) in enumerate(members):
        for w in m.warnings:
            if w.operator not in ("filter", "map"):
                out.append(MergeWarning(w.kind, w.operator, f"grant {i} (rule {_rules(alt)}): "
                                        f"{w.message}", w.predicates))
    return out


__all__ = ["Alternative", "UnionMerge", "merge_union", "COMBINING_MODES", "INTERSECTION",
           "UNION"]
