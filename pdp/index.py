"""Target index: pick the children (policies or rules) whose target could match a request.

An AnyOf of a target is *indexable* when every one of its AllOfs holds an equality Match
(string/anyURI/integer/boolean-equal) between a literal and an attribute designator without
Issuer. Such an AnyOf can only match when, for at least one of its AllOfs, the request has the
literal among the attribute's values. When the attribute is absent and the designator has
MustBePresent=true, the Match would be Indeterminate rather than false, so that case keeps the
child too.

Each child is looked up through one indexable AnyOf (the one on the most selective attributes,
e.g. resource-id rather than action-id): a hash table from (attribute, value) to children gives
the first candidates. Its other indexable AnyOfs become filters checked on those candidates
(e.g. the action-id). Children without any indexable AnyOf are always candidates.

Why this never changes a decision: a child left out has an AnyOf that is false, so its target
is NoMatch whatever the other AnyOfs say, and the child is NotApplicable (and not applicable for
only-one-applicable). Every combining algorithm ignores NotApplicable children, and candidates
are evaluated in their original order, so the order-sensitive algorithms (first-applicable,
only-one-applicable) see the same sequence minus NotApplicable children.
`tests/pdp/engine/test_index.py` checks it against a full scan on random requests.
"""
from __future__ import annotations

from typing import Any, Sequence

MIN_CHILDREN = 8

# One indexable AnyOf, as filter: {attribute key: (values, any MustBePresent)}.
AnyOfFilter = dict


class ChildIndex:
    __slots__ = ("always", "by_key", "mbp_by_key", "size", "filters")

    def __init__(self, size: int, always: list[int], by_key: dict, mbp_by_key: dict,
                 filters: dict[int, tuple[AnyOfFilter, ...]]) -> None:
        self.size = size
        self.always = frozenset(always)
        self.by_key = by_key
        self.mbp_by_key = mbp_by_key
        self.filters = filters

    def candidate_positions(self, bags: dict) -> list[int]:
        positions = set(self.always)
        try:
            for key, table in self.by_key.items():
                bag = bags.get(key)
                if bag:
                    for value in bag:
                        hit = table.get(value)
                        if hit:
                            positions.update(hit)
                else:
                    required = self.mbp_by_key.get(key)
                    if required:
                        positions.update(required)
            filters = self.filters
            out = []
            for pos in sorted(positions):
                checks = filters.get(pos)
                if checks is None or all(_may_match(f, bags) for f in checks):
                    out.append(pos)
            return out
        except TypeError:  # an unhashable value: nothing can be ruled out
            return list(range(self.size))

    def candidates(self, children: Sequence[Any], ctx: Any) -> list[Any]:
        return [children[i] for i in self.candidate_positions(ctx.bags)]


def _may_match(any_of: AnyOfFilter, bags: dict) -> bool:
    for key, (values, must_be_present) in any_of.items():
        bag = bags.get(key)
        if bag:
            for v in bag:
                if v in values:
                    return True
        elif must_be_present:
            return True
    return False


def _indexable_any_ofs(spec: Any) -> list[list]:
    """Every AnyOf of a target spec whose AllOfs all hold an indexable Match: per AnyOf, one
    MatchSpec per AllOf."""
    out = []
    for any_of in spec or ():
        chosen = []
        for all_of in any_of:
            match = next((m for m in all_of if m is not None), None)
            if match is None:
                break
            chosen.append(match)
        else:
            if chosen:
                out.append(chosen)
    return out


def build_index(children: Sequence[Any], min_children: int | None = None) -> ChildIndex | None:
    """An index over the children's targets, or None when it would not pay off (fewer than
    MIN_CHILDREN children, read at call time so that tests can switch indexing off)."""
    if len(children) < (MIN_CHILDREN if min_children is None else min_children):
        return None
    per_child = [_indexable_any_ofs(getattr(c, "target_spec", None)) for c in children]
    # Selectivity of an attribute: how many distinct literals the children test it against.
    distinct: dict[tuple, set] = {}
    for any_ofs in per_child:
        for any_of in any_ofs:
            for m in any_of:
                try:
                    distinct.setdefault(m.key, set()).add(m.value)
                except TypeError:
                    return None
    always: list[int] = []
    by_key: dict[tuple, dict[Any, list[int]]] = {}
    mbp_by_key: dict[tuple, list[int]] = {}
    filters: dict[int, tuple[AnyOfFilter, ...]] = {}
    for pos, any_ofs in enumerate(per_child):
        if not any_ofs:
            always.append(pos)
            continue
        primary = max(any_ofs, key=lambda a: min(len(distinct[m.key]) for m in a))
        for match in primary:
            table = by_key.setdefault(match.key, {})
            hits = table.setdefault(match.value, [])
            if not hits or hits[-1] != pos:
                hits.append(pos)
            if match.must_be_present:
                lst = mbp_by_key.setdefault(match.key, [])
                if not lst or lst[-1] != pos:
                    lst.append(pos)
        secondary = []
        for any_of in any_ofs:
            if any_of is primary:
                continue
            flt: AnyOfFilter = {}
            for m in any_of:
                values, mbp = flt.get(m.key, (frozenset(), False))
                flt[m.key] = (values | {m.value}, mbp or m.must_be_present)
            secondary.append(flt)
        if secondary:
            filters[pos] = tuple(secondary)
    if len(always) == len(children):
        return None
    return ChildIndex(len(children), always, by_key, mbp_by_key, filters)
