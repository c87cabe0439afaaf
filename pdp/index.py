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

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from pdp.evaluation import AnyValue, Bags, EvalContext
from pdp.notes import AttributeKey

if TYPE_CHECKING:  # the policy compiler imports this module
    from pdp.policy_parser.model import MatchSpec
    from pdp.policy_parser.targets import TargetSpec

MIN_CHILDREN = 8

# One indexable AnyOf, as filter: {attribute key: (values, any MustBePresent)}.
AnyOfFilter = dict[AttributeKey, tuple[frozenset[AnyValue], bool]]
# An indexable AnyOf: one equality Match per AllOf (`_indexable_any_ofs`).
IndexableAnyOf = list["MatchSpec"]
Posting = tuple[AttributeKey, AnyValue]  # an attribute key and a literal tested against it
C = TypeVar("C")


class ChildIndex:
    __slots__ = ("always", "by_key", "mbp_by_key", "size", "filters")

    def __init__(self, size: int, always: list[int],
                 by_key: dict[AttributeKey, dict[AnyValue, list[int]]],
                 mbp_by_key: dict[AttributeKey, list[int]],
                 filters: dict[int, tuple[AnyOfFilter, ...]]) -> None:
        self.size = size
        self.always = frozenset(always)
        self.by_key = by_key
        self.mbp_by_key = mbp_by_key
        self.filters = filters

    def candidate_positions(self, bags: Bags) -> list[int]:
        found = _candidates(self, bags)
        return list(range(self.size)) if found is None else found

    def candidates(self, children: Sequence[C], ctx: EvalContext) -> list[C]:
        return [children[i] for i in self.candidate_positions(ctx.bags)]


def _candidates(index: ChildIndex | RootIndex, bags: Bags) -> list[int] | None:
    """The positions whose target could match the request's attribute bags, ascending: the
    always-candidates, those indexed under a value of the request, those with a MustBePresent
    designator for a key the request lacks (they are Indeterminate, not ruled out), less those
    a remaining AnyOf filter rules out. None when a
    value is unhashable: nothing can be ruled out, and the caller returns every position."""
    positions = set(index.always)
    try:
        for key, table in index.by_key.items():
            bag = bags.get(key)
            if bag:
                for value in bag:
                    hit = table.get(value)
                    if hit:
                        positions.update(hit)
            else:
                required = index.mbp_by_key.get(key)
                if required:
                    positions.update(required)
        filters = index.filters
        return [pos for pos in sorted(positions)
                if (checks := filters.get(pos)) is None
                or all(_may_match(f, bags) for f in checks)]
    except TypeError:
        return None


def _secondary_filters(any_ofs: list[IndexableAnyOf], primary: IndexableAnyOf
                       ) -> tuple[AnyOfFilter, ...]:
    """The target's AnyOfs other than the indexed one, as filters `_may_match` checks: per
    attribute key the values that could match and whether a MustBePresent designator reads it."""
    out = []
    for any_of in any_ofs:
        if any_of is primary:
            continue
        flt: AnyOfFilter = {}
        for m in any_of:
            values, mbp = flt.get(m.key, (frozenset(), False))
            flt[m.key] = (values | {m.value}, mbp or m.must_be_present)
        out.append(flt)
    return tuple(out)


def _may_match(any_of: AnyOfFilter, bags: Bags) -> bool:
    for key, (values, must_be_present) in any_of.items():
        bag = bags.get(key)
        if bag:
            for v in bag:
                if v in values:
                    return True
        elif must_be_present:
            return True
    return False


def _indexable_any_ofs(spec: TargetSpec | None) -> list[IndexableAnyOf]:
    """Every AnyOf of a target spec whose AllOfs all hold an indexable Match: per AnyOf, one
    MatchSpec per AllOf."""
    out = []
    for any_of in spec or ():
        chosen: IndexableAnyOf = []
        for all_of in any_of:
            match = next((m for m in all_of if m is not None), None)
            if match is None:
                break
            chosen.append(match)
        else:
            if chosen:
                out.append(chosen)
    return out


def _target_spec(child: object) -> TargetSpec | None:
    """A child's target spec; None (always a candidate) for a child without one."""
    spec: TargetSpec | None = getattr(child, "target_spec", None)
    return spec


def build_index(children: Sequence[object], min_children: int | None = None
                ) -> ChildIndex | None:
    """An index over the children's targets, or None when it would not pay off (fewer than
    MIN_CHILDREN children, read at call time so that tests can switch indexing off)."""
    if len(children) < (MIN_CHILDREN if min_children is None else min_children):
        return None
    per_child = [_indexable_any_ofs(_target_spec(c)) for c in children]
    # Selectivity of an attribute: how many distinct literals the children test it against.
    distinct: dict[AttributeKey, set[AnyValue]] = {}
    for any_ofs in per_child:
        for any_of in any_ofs:
            for m in any_of:
                try:
                    distinct.setdefault(m.key, set()).add(m.value)
                except TypeError:
                    return None
    always: list[int] = []
    by_key: dict[AttributeKey, dict[AnyValue, list[int]]] = {}
    mbp_by_key: dict[AttributeKey, list[int]] = {}
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
        secondary = _secondary_filters(any_ofs, primary)
        if secondary:
            filters[pos] = secondary
    if len(always) == len(children):
        return None
    return ChildIndex(len(children), always, by_key, mbp_by_key, filters)


# ---------------------------------------------------------------------------------------------
# The root's index: updated in place of rebuilt, one snapshot per engine generation.


class _Placed:
    """Where one child sits in a RootIndex: what to undo when it leaves."""

    __slots__ = ("postings", "mbp_keys", "counted", "always")

    def __init__(self, postings: tuple[Posting, ...], mbp_keys: tuple[AttributeKey, ...],
                 counted: tuple[Posting, ...], always: bool) -> None:
        self.postings = postings  # ((key, value), ...) of its primary AnyOf, without repeats
        self.mbp_keys = mbp_keys  # keys of its primary AnyOf with MustBePresent="true"
        self.counted = counted  # every (key, value) it adds to the selectivity counts
        self.always = always


_NOT_INDEXED = _Placed((), (), (), True)


class RootIndex:
    """The target index over the top-level documents, keyed by *slot* instead of position.

    A slot is a number the engine gives each top-level document; slots grow in the root's
    combining order, so sorting candidate slots gives the candidates in that order (as
    `ChildIndex` sorts positions). Because a slot never changes while its document stays,
    adding, replacing or removing a document touches only that document's postings: `changed`
    returns a new RootIndex and leaves this one as it was (copy-on-write: the outer tables and
    the posting tables of the attributes the change touches are copied, nothing is rebuilt from
    the other children). An engine generation keeps its own snapshot, so a decision in flight
    on the old engine sees the old set.

    Built from nothing with every child at once, it holds exactly what `build_index` would (same
    primary AnyOf per child, same filters); built step by step, a child's primary AnyOf is chosen
    with the selectivity counts of its own step. Any indexable AnyOf is a sound primary (see the
    module docstring), so this can only change how many candidates a request gets, never a
    decision. A match value that cannot be hashed makes its child always a candidate.
    """

    __slots__ = ("by_key", "mbp_by_key", "always", "filters", "placed", "distinct")

    def __init__(self, by_key: dict[AttributeKey, dict[AnyValue, tuple[int, ...]]],
                 mbp_by_key: dict[AttributeKey, frozenset[int]], always: frozenset[int],
                 filters: dict[int, tuple[AnyOfFilter, ...]], placed: dict[int, _Placed],
                 distinct: dict[AttributeKey, dict[AnyValue, int]]) -> None:
        self.by_key = by_key  # key -> {value: (slot, ...)}
        self.mbp_by_key = mbp_by_key  # key -> frozenset of slots
        self.always = always  # slots that are candidates for every request
        self.filters = filters  # slot -> (AnyOfFilter, ...)
        self.placed = placed  # slot -> _Placed, for every child
        self.distinct = distinct  # key -> {value: how many children test it}

    @classmethod
    def empty(cls) -> RootIndex:
        return cls({}, {}, frozenset(), {}, {}, {})

    def __len__(self) -> int:
        return len(self.placed)

    @property
    def useful(self) -> bool:
        """False when it could rule nothing out (every child is always a candidate)."""
        return len(self.always) < len(self.placed)

    def candidate_positions(self, bags: Bags) -> list[int]:
        """The slots of the children whose target could match, in ascending order."""
        found = _candidates(self, bags)
        return sorted(self.placed) if found is None else found

    def candidates(self, by_slot: Mapping[int, C], ctx: EvalContext) -> list[C]:
        return [by_slot[s] for s in self.candidate_positions(ctx.bags)]

    def changed(self, removed: Iterable[int] = (), added: Sequence[tuple[int, object]] = ()
                ) -> RootIndex:
        """A new index without the children in slots `removed` and with `added` ((slot, child)
        pairs; a slot both removed and added is a replacement). This index is not modified."""
        w = _Writer(self)
        for slot in removed:
            w.remove(slot)
        # Count every new child's literals first, then choose primaries: with all children added
        # at once this is exactly build_index's choice.
        analysed: list[tuple[int, list[IndexableAnyOf], tuple[Posting, ...]]] = []
        for slot, child in added:
            any_ofs = _indexable_any_ofs(_target_spec(child))
            counted: list[Posting] = []
            try:
                for any_of in any_ofs:
                    for m in any_of:
                        hash(m.value)
                        counted.append((m.key, m.value))
            except TypeError:
                any_ofs, counted = [], []
            unique = tuple(dict.fromkeys(counted))  # one count per child and (key, value)
            w.count(unique, +1)
            analysed.append((slot, any_ofs, unique))
        for slot, any_ofs, unique in analysed:
            w.place(slot, any_ofs, unique)
        return w.freeze()


class _Writer:
    """Copy-on-write editing of a RootIndex: every table is copied before its first change."""

    def __init__(self, base: RootIndex) -> None:
        self.by_key = dict(base.by_key)
        self.mbp_by_key = dict(base.mbp_by_key)
        self.always = set(base.always)
        self.filters = dict(base.filters)
        self.placed = dict(base.placed)
        self.distinct = dict(base.distinct)
        self._own_tables: set[AttributeKey] = set()
        self._own_counts: set[AttributeKey] = set()

    def _table(self, key: AttributeKey) -> dict[AnyValue, tuple[int, ...]]:
        if key not in self._own_tables:
            self._own_tables.add(key)
            self.by_key[key] = dict(self.by_key.get(key, ()))
        return self.by_key[key]

    def count(self, counted: Sequence[Posting], delta: int) -> None:
        for key, value in counted:
            if key not in self._own_counts:
                self._own_counts.add(key)
                self.distinct[key] = dict(self.distinct.get(key, ()))
            table = self.distinct[key]
            n = table.get(value, 0) + delta
            if n > 0:
                table[value] = n
            else:
                table.pop(value, None)
                if not table:
                    del self.distinct[key]
                    self._own_counts.discard(key)

    def remove(self, slot: int) -> None:
        placed = self.placed.pop(slot, None)
        if placed is None:
            return
        self.always.discard(slot)
        self.filters.pop(slot, None)
        for key, value in placed.postings:
            table = self._table(key)
            rest = tuple(s for s in table.get(value, ()) if s != slot)
            if rest:
                table[value] = rest
            else:
                table.pop(value, None)
                if not table:
                    del self.by_key[key]
                    self._own_tables.discard(key)
        for key in placed.mbp_keys:
            rest_set = self.mbp_by_key.get(key, frozenset()) - {slot}
            if rest_set:
                self.mbp_by_key[key] = rest_set
            else:
                self.mbp_by_key.pop(key, None)
        # Each (key, value) was counted once per child: undo exactly that.
        self.count(placed.counted, -1)

    def place(self, slot: int, any_ofs: list[IndexableAnyOf], counted: tuple[Posting, ...]
              ) -> None:
        if not any_ofs:
            self.always.add(slot)
            self.placed[slot] = _NOT_INDEXED if not counted else _Placed((), (), counted, True)
            return
        distinct = self.distinct
        primary = max(any_ofs, key=lambda a: min(len(distinct.get(m.key, ())) for m in a))
        postings: dict[Posting, None] = {}
        mbp_keys: dict[AttributeKey, None] = {}
        for match in primary:
            postings[(match.key, match.value)] = None
            if match.must_be_present:
                mbp_keys[match.key] = None
        for key, value in postings:
            table = self._table(key)
            table[value] = table.get(value, ()) + (slot,)
        for key in mbp_keys:
            self.mbp_by_key[key] = self.mbp_by_key.get(key, frozenset()) | {slot}
        secondary = _secondary_filters(any_ofs, primary)
        if secondary:
            self.filters[slot] = secondary
        self.placed[slot] = _Placed(tuple(postings), tuple(mbp_keys), counted, False)

    def freeze(self) -> RootIndex:
        return RootIndex(self.by_key, self.mbp_by_key, frozenset(self.always), self.filters,
                         self.placed, self.distinct)
