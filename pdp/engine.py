"""The PDP facade: compile a set of policy documents, then decide requests.

An engine is immutable once built; `with_changes` builds the next generation, reusing the
compiled form of every document whose bytes did not change. References between documents are
resolved per engine through a link table (RefSpec -> evaluator; `pdp.references`), which is
why compiled documents can be shared between generations. Building is all-or-nothing: any invalid
document, undefined or circular reference raises PolicyLoadError and no engine is produced.

Root: without `root_policy_id`, all top-level documents are combined under the root algorithm
(in the order given), through the target index. With `root_policy_id`, that document is the
root and the others are only reachable by reference.

Order of the root's children (first-applicable and the obligation order depend on it): the
order of `compile`'s sources; `with_changes` keeps it, replaces a document with the same id and
version where it stands, and appends every other upserted document at the end, in the order
given (an update that removes the id and upserts the new version therefore moves it to the end).

Incremental generations: each top-level document has a *slot*, a number that grows in root
order and stays with the document until it is removed or replaced. The root's target index
(`pdp.index.RootIndex`) is keyed by slot, so `with_changes` edits only the changed documents'
postings (copy-on-write: the old generation keeps its snapshot) instead of rebuilding the index
from every child, and the link table is recomputed over the documents that hold references only
(a document without references has no edges: it can neither be undefined nor part of a cycle).
The cost of a change is that of copying a few flat tables (pointer copies, microseconds per
thousand documents), not of re-analysing the documents. A document compiles once: `compile_policy`
gives a `CompiledPolicy` that `with_changes` takes as it is.

Decision trace: `decide_with_trace` returns, per Result, the ids of the top-level documents
that were applicable (evaluated to something other than NotApplicable), including documents
reached through references. The PEP uses it to know which handles a policy change can affect.
`dependencies(request)` is the wider, conservative set: every document that could take part in
the decision (index candidates plus everything they reference), applicable or not.
`resource_scope(policy_id)` is the resource-ids a document can apply to at all (or None).

ReturnPolicyIdList: the Result lists every applicable Policy and PolicySet, nested ones
included, in evaluation order: a policy is applicable when it evaluated to something other than
NotApplicable and its enclosing policy is applicable too (the definition the conformance suite's
upstream uses; the implicit root is not a policy and is not listed).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

import pdp.index as index_module
from common.xmlsafe import get_limits
from pdp import references
from pdp.combining import DENY_OVERRIDES_3_0, deny_unless_permit, policy_combiner
from pdp.errors import PolicyLoadError, RequestSyntaxError
from pdp.evaluation import (
    DENY,
    NOT_APPLICABLE,
    PERMIT,
    TO_DECISION,
    AnyPolicy,
    AnyValue,
    EvalContext,
    Outcome,
    PolicyCombiner,
    status_of_bug,
)
from pdp.index import RootIndex
from pdp.policy_parser import (
    CompiledDocument,
    CompiledPolicy,
    PolicyInfo,
    PolicySource,
    RefSpec,
    compile_document,
)
from pdp.references import defined_twice, latest_info, named_root
from pdp.request import Individual, RequestContext, parse_request
from pdp.results import STATUS_PROCESSING_ERROR, Decision, Response, Result, RuleGrant, Status
from pdp.target_scope import (
    NOT_APPLICABLE_WHEN_ALL_ARE,
    ScopeMemo,
    attribute_key,
    evaluator_scope,
    target_literals,
)
from pdp.why import Explanation, Node, explain_root

__all__ = ["PolicyEngine", "PolicySource", "PolicyInfo", "CompiledPolicy", "compile_policy",
           "policy_resource_scope",
           "inspect_policy", "DENY_OVERRIDES_3_0"]

_OK = Status()


_Entry = CompiledPolicy  # the name of earlier versions
DocKey = tuple[bool, str, str]  # (is a policy set, id, version): `CompiledPolicy.key`

# The last few documents compiled by `compile_policy`, by (source name, bytes, parser limits).
# The PAP checks a document (inspect_policy) before it hands the same bytes to
# PolicyService.add; this lets the add take that compiled form instead of compiling the bytes a
# second time. Compiled documents are immutable and shared between engine generations anyway,
# so sharing one more is safe. Large documents are not kept (memory), only compiled again.
_RECENT_SIZE = 16
_RECENT_MAX_BYTES = 256 * 1024
_recent: OrderedDict[tuple[str, bytes, tuple[int, int]], CompiledDocument] = OrderedDict()
_recent_lock = threading.Lock()


def policy_resource_scope(source: PolicySource) -> frozenset[str] | None:
    """The resource-ids one document on its own can apply to (see `resource_scope`); None when
    it could apply to any (references are not followed: they give None)."""
    return evaluator_scope(compile_policy(source).compiled.evaluator, {}, {})


def compile_policy(source: PolicySource) -> CompiledPolicy:
    """Parse, compile and validate one document on its own (references stay unresolved until
    it joins an engine); raises PolicyLoadError."""
    if len(source.data) > _RECENT_MAX_BYTES:
        return CompiledPolicy(source, compile_document(source))
    key = (source.name, source.data, get_limits())
    with _recent_lock:
        compiled = _recent.get(key)
        if compiled is not None:
            _recent.move_to_end(key)
    if compiled is None:
        compiled = compile_document(source)
        with _recent_lock:
            _recent[key] = compiled
            while len(_recent) > _RECENT_SIZE:
                _recent.popitem(last=False)
    return CompiledPolicy(source, compiled)


def inspect_policy(source: PolicySource) -> PolicyInfo:
    """Parse and fully validate one document on its own (references may stay unresolved)."""
    return compile_policy(source).info


class _Root:
    """The implicit root when no root policy is named: the top-level documents, combined.

    `by_slot` maps each document's slot to its evaluator, in root order; `index` is the target
    index when it is in use, `maintained` the one kept up to date across generations (None when
    the engine does not index)."""

    __slots__ = ("combine", "by_slot", "index", "maintained", "_children")

    def __init__(self, combine: PolicyCombiner, by_slot: dict[int, AnyPolicy],
                 maintained: RootIndex | None) -> None:
        self.combine = combine
        self.by_slot = by_slot
        self.maintained = maintained
        # Read MIN_CHILDREN now, as build_index does, so that tests can switch indexing off.
        use = (maintained is not None and len(by_slot) >= index_module.MIN_CHILDREN
               and maintained.useful)
        self.index = maintained if use else None
        # Every child in root order when there is no index (what `candidates` gives then).
        self._children: tuple[AnyPolicy, ...] = \
            tuple(by_slot.values()) if self.index is None else ()

    @property
    def children(self) -> tuple[AnyPolicy, ...]:
        return self._children if self.index is None else tuple(self.by_slot.values())

    def candidates(self, ctx: EvalContext) -> Sequence[AnyPolicy]:
        index = self.index
        if index is None:
            return self._children
        by_slot = self.by_slot
        return [by_slot[s] for s in index.candidate_positions(ctx.bags)]

    def evaluate(self, ctx: EvalContext) -> Outcome:
        return self.combine(self.candidates(ctx), ctx)


Upsert = PolicySource | CompiledPolicy


class PolicyEngine:
    """Compiled policies plus the root; `decide` turns requests into responses."""

    # Per generation, all treated as immutable once the engine is built:
    #   _by_slot    slot -> CompiledPolicy, in root order (slots ascend)
    #   _slot_of    (is_policy_set, id, version) -> slot
    #   _versions   id -> slots of its documents, ascending
    #   _referrers  slots of the documents that hold references
    #   _links, _refs_of   the link table and, per referring evaluator, what it reaches

    def __init__(self, entries: Sequence[CompiledPolicy], root_combining_alg: str,
                 root_policy_id: str | None, use_index: bool = True) -> None:
        """Build from nothing: `entries` in root order (a from-scratch compile)."""
        by_slot: dict[int, CompiledPolicy] = {}
        slot_of: dict[DocKey, int] = {}
        versions: dict[str, tuple[int, ...]] = {}
        for slot, entry in enumerate(entries):
            key = entry.key
            if key in slot_of:
                first = by_slot[slot_of[key]].info
                raise defined_twice(entry.info, first.source)
            by_slot[slot] = entry
            slot_of[key] = slot
            versions[entry.info.id] = versions.get(entry.info.id, ()) + (slot,)
        referrers = frozenset(s for s, e in by_slot.items() if e.compiled.references)
        links, refs_of = references.link_references(by_slot, versions, referrers)
        policies = {pid: latest_info(by_slot, slots) for pid, slots in versions.items()}
        try:
            combine = policy_combiner(root_combining_alg)
        except KeyError:
            raise PolicyLoadError(f"unknown root policy-combining algorithm {root_combining_alg}"
                                  ) from None
        self._setup(by_slot, slot_of, versions, len(by_slot), referrers, links, refs_of,
                    policies, root_combining_alg, root_policy_id, use_index, combine)
        if root_policy_id is None:
            maintained = None
            if use_index:
                maintained = RootIndex.empty().changed(
                    (), [(s, e.compiled.evaluator) for s, e in by_slot.items()])
            self._root: _Root | AnyPolicy = _Root(combine, {s: e.compiled.evaluator
                                                           for s, e in by_slot.items()},
                                                    maintained)
        else:
            self._root = named_root(by_slot, versions, root_policy_id)

    def _setup(self, by_slot: dict[int, CompiledPolicy], slot_of: dict[DocKey, int],
               versions: dict[str, tuple[int, ...]], next_slot: int, referrers: frozenset[int],
               links: dict[RefSpec, AnyPolicy], refs_of: dict[int, set[str]],
               policies: dict[str, PolicyInfo], root_combining_alg: str,
               root_policy_id: str | None, use_index: bool, combine: PolicyCombiner) -> None:
        self._by_slot = by_slot
        self._slot_of = slot_of
        self._versions = versions
        self._next_slot = next_slot
        self._referrers = referrers
        self._links = links
        self._refs_of = refs_of
        # Ids that some reference names: a change to any other id cannot alter the links.
        self._referenced = frozenset(spec.id for slot in referrers
                                     for spec, _ in by_slot[slot].compiled.references)
        self.policies: Mapping[str, PolicyInfo] = policies
        self.root_combining_alg = root_combining_alg
        self.root_policy_id = root_policy_id
        self.use_index = use_index
        self._combine = combine
        self._never_memo: dict[str, bool] = {}  # `never_permits`, per resource-id
        self._scope_memo: dict[str, frozenset[str] | None] = {}  # `resource_scope`, per id

    @property
    def _entries(self) -> tuple[CompiledPolicy, ...]:
        """The top-level documents in root order."""
        return tuple(self._by_slot.values())

    def documents(self) -> tuple[CompiledPolicy, ...]:
        """The top-level documents, compiled, in root order (what the linter reads)."""
        return tuple(self._by_slot.values())

    # -- building

    @classmethod
    def compile(cls, sources: Sequence[Upsert], root_combining_alg: str = DENY_OVERRIDES_3_0,
                root_policy_id: str | None = None, *, use_index: bool = True) -> PolicyEngine:
        entries = [s if isinstance(s, CompiledPolicy) else CompiledPolicy(s, compile_document(s))
                   for s in sources]
        return cls(entries, root_combining_alg, root_policy_id, use_index)

    def with_changes(self, upsert: Sequence[Upsert] = (),
                     remove_ids: Iterable[str] = ()) -> PolicyEngine:
        """Next generation: documents with an id in `remove_ids` are dropped (every version),
        then each upserted document replaces the one with the same id and version, or is added
        at the end. An upsert is a CompiledPolicy (taken as it is: see `compile_policy`) or a
        PolicySource (reusing the compiled form of a current document with the same bytes,
        else compiled). This engine is not modified; raises PolicyLoadError."""
        by_slot = dict(self._by_slot)
        slot_of = dict(self._slot_of)
        versions = dict(self._versions)
        next_slot = self._next_slot
        touched_slots: set[int] = set()
        touched_ids: dict[str, None] = {}
        for pid in remove_ids:
            for slot in versions.pop(pid, ()):
                del slot_of[by_slot.pop(slot).key]
                touched_slots.add(slot)
            touched_ids[pid] = None
        by_bytes: dict[bytes, CompiledDocument] | None = None
        for item in upsert:
            if isinstance(item, CompiledPolicy):
                entry = item
            else:
                if by_bytes is None:
                    by_bytes = {e.source.data: e.compiled for e in self._by_slot.values()}
                compiled = by_bytes.get(item.data) or compile_document(item)
                entry = CompiledPolicy(item, compiled)
            info = entry.info
            # Replace the first document (in root order) with this id and version, whatever
            # its kind, as the list-based engine did.
            same = [slot_of[k] for k in ((False, info.id, info.version),
                                         (True, info.id, info.version)) if k in slot_of]
            if same:
                slot = min(same)
                old_key = by_slot[slot].key
                if old_key != entry.key and entry.key in slot_of:
                    other = slot_of[entry.key]
                    first, second = sorted((slot, other))
                    later = entry.info if second == slot else by_slot[second].info
                    earlier_src = (entry.info if first == slot else by_slot[first].info).source
                    raise defined_twice(later, earlier_src)
                del slot_of[old_key]
            else:
                slot = next_slot
                next_slot += 1
                versions[info.id] = versions.get(info.id, ()) + (slot,)
            by_slot[slot] = entry
            slot_of[entry.key] = slot
            touched_slots.add(slot)
            touched_ids[info.id] = None
        return self._next(by_slot, slot_of, versions, next_slot, touched_slots, touched_ids)

    def _next(self, by_slot: dict[int, CompiledPolicy], slot_of: dict[DocKey, int],
              versions: dict[str, tuple[int, ...]], next_slot: int, touched_slots: set[int],
              touched_ids: dict[str, None]) -> PolicyEngine:
        referrers = self._referrers
        if any(s in referrers or (s in by_slot and by_slot[s].compiled.references)
               for s in touched_slots):
            referrers = frozenset((referrers - touched_slots) | {
                s for s in touched_slots if s in by_slot and by_slot[s].compiled.references})
            links, refs_of = references.link_references(by_slot, versions, referrers)
        elif referrers and not self._referenced.isdisjoint(touched_ids):
            # A document some reference may resolve to changed: resolve them all again.
            links, refs_of = references.link_references(by_slot, versions, referrers)
        else:  # the reference graph is untouched
            links, refs_of = self._links, self._refs_of
        # policies: an id keeps its place while its first document keeps its slot (new slots
        # come after all others); otherwise it is dropped, and appended again in the order of
        # first documents if it still has one. That is the order a from-scratch build gives.
        policies = dict(self.policies)
        old_versions = self._versions
        for pid in touched_ids:
            if pid not in versions or versions[pid][0] != old_versions.get(pid, (None,))[0]:
                policies.pop(pid, None)
        for pid in sorted((p for p in touched_ids if p in versions),
                          key=lambda p: versions[p][0]):
            policies[pid] = latest_info(by_slot, versions[pid])
        engine = PolicyEngine.__new__(PolicyEngine)
        engine._setup(by_slot, slot_of, versions, next_slot, referrers, links, refs_of, policies,
                      self.root_combining_alg, self.root_policy_id, self.use_index,
                      self._combine)
        old_root = self._root
        if isinstance(old_root, _Root):  # the implicit root: no root_policy_id
            evaluators = dict(old_root.by_slot)
            gone: list[int] = []
            replaced: list[int] = []
            fresh: list[int] = []
            for s in touched_slots:
                if s not in evaluators:
                    fresh.append(s)  # a new slot: greater than every slot of this engine
                elif s in by_slot:
                    replaced.append(s)
                else:
                    gone.append(s)
            fresh.sort()
            for s in gone:
                del evaluators[s]
            for s in replaced:  # assigning an existing key keeps its place in the order
                evaluators[s] = by_slot[s].compiled.evaluator
            for s in fresh:
                evaluators[s] = by_slot[s].compiled.evaluator
            maintained = None
            if old_root.maintained is not None:
                maintained = old_root.maintained.changed(
                    gone + replaced, [(s, evaluators[s]) for s in sorted(replaced) + fresh])
            engine._root = _Root(self._combine, evaluators, maintained)
        elif self.root_policy_id in touched_ids:
            engine._root = named_root(by_slot, versions, self.root_policy_id)
        else:
            engine._root = self._root
        return engine

    # -- what a document can reach

    def resource_scope(self, policy_id: str) -> frozenset[str] | None:
        """The resource-id values the top-level document(s) with this id can apply to: every
        request none of whose resource-id values (category resource, data type string) is in
        the answer finds them NotApplicable. Proven from their targets' string-equal matches on
        urn:oasis:names:tc:xacml:1.0:resource:resource-id, and through the children of a Policy
        or PolicySet whose combining algorithm is NotApplicable when all children are
        (`pdp.target_scope` says why that is sound). None when it could apply to any resource:
        no such constraint, a reference or child without one, or an id this engine does not
        hold (ask the engine from before a deletion, or use the scope the change event carries).
        Every version of the id is a root child, so the answer covers them all. Memoised: an
        engine never changes."""
        if policy_id in self._scope_memo:
            return self._scope_memo[policy_id]
        scope = self._scope_memo[policy_id] = self._resource_scope(policy_id)
        return scope

    def _resource_scope(self, policy_id: str) -> frozenset[str] | None:
        slots = self._versions.get(policy_id)
        if not slots:
            return None
        memo: ScopeMemo = {}
        union: set[str] = set()
        for slot in slots:
            scope = evaluator_scope(self._by_slot[slot].compiled.evaluator, self._links, memo)
            if scope is None:
                return None
            union |= scope
        return frozenset(union)

    def never_permits(self, resource_id: str) -> bool:
        """True when this engine can only answer NotApplicable (or Deny) to every request whose
        one resource-id (category resource, data type string) is `resource_id`, whoever asks:
        no top-level document can apply to it (`resource_scope`, whose proofs say why), and the
        root combines its children so that all NotApplicable give NotApplicable (or, with
        deny-unless-permit, Deny). False whenever that is not proven (a named root policy, a
        document without a scope, another root algorithm). A revocation pass uses it to decide
        one handle of such a stream for all of them. Memoised: an engine never changes."""
        known = self._never_memo.get(resource_id)
        if known is None:
            known = self._never_memo[resource_id] = self._never_permits(resource_id)
        return known

    def _never_permits(self, resource_id: str) -> bool:
        if self.root_policy_id is not None:
            return False
        if self._combine is not deny_unless_permit and \
                self._combine not in NOT_APPLICABLE_WHEN_ALL_ARE:
            return False
        for policy_id in self._versions:
            scope = self.resource_scope(policy_id)
            if scope is None or resource_id in scope:
                return False
        return True

    def target_values(self, policy_id: str, category: str, attribute_id: str,
                      datatype: str = "http://www.w3.org/2001/XMLSchema#string"
                      ) -> frozenset[AnyValue]:
        """The literals the targets of the document(s) with this id (and what they reference)
        compare an attribute with by equality, e.g. the action ids a policy names
        (`pdp.target_scope.target_literals`; values in Conditions are not found). Empty for an
        id this engine does not hold."""
        key = attribute_key(category, attribute_id, datatype)
        found: set[AnyValue] = set()
        for slot in self._versions.get(policy_id, ()):
            found |= target_literals(self._by_slot[slot].compiled.evaluator, self._links, key)
        return frozenset(found)

    # -- deciding

    def decide(self, request: RequestContext) -> Response:
        """Never raises: any failure becomes an Indeterminate result."""
        return self.decide_with_trace(request)[0]

    def decide_with_trace(self, request: RequestContext) -> tuple[Response, list[set[str]]]:
        results: list[Result] = []
        traces: list[set[str]] = []
        try:
            individuals = request.individuals()
        except Exception as exc:  # noqa: BLE001 - a bug must not crash the PDP: Indeterminate  # pragma: no cover
            return (Response((Result(Decision.INDETERMINATE, status_of_bug(exc)),)), [set()])
        for ind in individuals:
            result, docs = self._decide_one(ind)
            results.append(result)
            traces.append(docs)
        return Response(tuple(results)), traces

    def _decide_one(self, ind: Individual, ctx: EvalContext | None = None
                    ) -> tuple[Result, set[str]]:
        if ctx is None:
            ctx = EvalContext(ind.bags, self._links)
        try:
            outcome = self._root.evaluate(ctx)
        except Exception as exc:  # noqa: BLE001 - a bug must never crash the PDP; deny-biased Indeterminate
            return Result(Decision.INDETERMINATE, status_of_bug(exc),
                          attributes=ind.included_attributes()), set()
        d = outcome.decision
        decision = TO_DECISION[d]
        if decision is Decision.INDETERMINATE:
            status = outcome.status or Status(STATUS_PROCESSING_ERROR, "indeterminate")
        else:
            status = _OK
        if d == PERMIT or d == DENY:
            obligations, advice = outcome.obligations, outcome.advice
        else:
            obligations = advice = ()
        ids = None
        if ind.return_policy_id_list:
            ids = tuple(dict.fromkeys(outcome.policy_ids))
        grants: tuple[RuleGrant, ...] = ()
        if decision is Decision.PERMIT:
            grants = tuple(RuleGrant(rule, tuple(obls)) for rule, obls in outcome.grants)
        return (Result(decision, status, tuple(obligations), tuple(advice),
                       ind.included_attributes(), ids, grants), set(outcome.docs))

    def explain(self, request: RequestContext) -> tuple[Response, list[Explanation]]:
        """The decision and, per individual request, why it came out so (`pdp.why`): the
        decision is made as `decide` makes it, then explained by a second walk over the same
        evaluators in the same context. Never raises: an explanation that fails says so."""
        results = []
        explanations = []
        try:
            individuals = request.individuals()
        except Exception as exc:  # noqa: BLE001 - a bug must not crash the PDP: Indeterminate  # pragma: no cover
            return (Response((Result(Decision.INDETERMINATE, status_of_bug(exc)),)), [])
        for ind in individuals:
            ctx = EvalContext(ind.bags, self._links)
            result, _ = self._decide_one(ind, ctx)
            results.append(result)
            status = result.status.message if result.decision is Decision.INDETERMINATE \
                else None
            try:
                if isinstance(self._root, _Root):
                    candidates = list(self._root.candidates(ctx))
                    node, outcome, missing = explain_root(
                        ctx, self._root, self.root_combining_alg,
                        getattr(self._combine, "__name__", None), candidates,
                        len(self._root.by_slot))
                else:
                    node, outcome, missing = explain_root(ctx, self._root, "", None, None, 0)
            except Exception as exc:  # noqa: BLE001 - an explanation must not fail the decision
                node = Node("Root", None, None, None, None, NOT_APPLICABLE,
                            f"no explanation: {type(exc).__name__}: {exc}")
                explanations.append(Explanation(result.decision.value, status, node, [], False))
                continue
            consistent = TO_DECISION[outcome.decision] is result.decision
            explanations.append(Explanation(result.decision.value, status, node, missing,
                                            consistent))
        return Response(tuple(results)), explanations

    def decide_bytes(self, body: bytes, media_type: str) -> Response:
        """Parse and decide; a bad request becomes one Indeterminate result saying why."""
        try:
            request = parse_request(body, media_type)
        except RequestSyntaxError as exc:
            return Response((Result(Decision.INDETERMINATE,
                                    Status(exc.status_code, str(exc))),))
        except Exception as exc:  # noqa: BLE001 - a parser bug must not crash the caller: deny-biased answer
            return Response((Result(Decision.INDETERMINATE, status_of_bug(exc)),))
        return self.decide(request)

    def dependencies(self, request: RequestContext) -> set[str]:
        """Ids of every top-level document that could take part in deciding this request."""
        out: set[str] = set()
        for ind in request.individuals():
            ctx = EvalContext(ind.bags, self._links)
            roots = self._root.candidates(ctx) if isinstance(self._root, _Root) else [self._root]
            for ev in roots:
                if ev.doc_id is not None:
                    out.add(ev.doc_id)
                    out |= self._refs_of.get(id(ev), set())
        return out

