"""The PDP facade: compile a set of policy documents, then decide requests.

An engine is immutable once built; `with_changes` builds the next generation, reusing the
compiled form of every document whose bytes did not change. References between documents are
resolved per engine through a link table (RefSpec -> evaluator), which is why compiled
documents can be shared between generations. Building is all-or-nothing: any invalid document,
undefined or circular reference raises PolicyLoadError and no engine is produced.

Root: without `root_policy_id`, all top-level documents are combined under the root algorithm
(in the order given), through the target index. With `root_policy_id`, that document is the
root and the others are only reachable by reference.

Decision trace: `decide_with_trace` returns, per Result, the ids of the top-level documents
that were applicable (evaluated to something other than NotApplicable), including documents
reached through references. The PEP uses it to know which handles a policy change can affect.
`dependencies(request)` is the wider, conservative set: every document that could take part in
the decision (index candidates plus everything they reference), applicable or not.

ReturnPolicyIdList: the Result lists every applicable Policy and PolicySet, nested ones
included, in evaluation order: a policy is applicable when it evaluated to something other than
NotApplicable and its enclosing policy is applicable too (the definition the conformance suite's
upstream uses; the implicit root is not a policy and is not listed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pdp.combining import DENY_OVERRIDES_3_0, policy_combiner
from pdp.errors import PolicyLoadError, RequestSyntaxError
from pdp.evaluation import (DENY, PERMIT, TO_DECISION, EvalContext, Outcome, PolicyEvaluator,
                            status_of_bug)
from pdp.index import build_index
from pdp.policy_parser import (CompiledDocument, PolicyInfo, PolicySource, RefSpec,
                               compile_document)
from pdp.request import Individual, RequestContext, parse_request
from pdp.results import (STATUS_PROCESSING_ERROR, Decision, Response, Result, Status)

__all__ = ["PolicyEngine", "PolicySource", "PolicyInfo", "inspect_policy", "DENY_OVERRIDES_3_0"]

_OK = Status()
MAX_REFERENCE_DEPTH = 32


def inspect_policy(source: PolicySource) -> PolicyInfo:
    """Parse and fully validate one document on its own (references may stay unresolved)."""
    return compile_document(source).info


class _Root:
    """The implicit root when no root policy is named: the top-level documents, combined."""

    __slots__ = ("combine", "children", "index")

    def __init__(self, combine: Any, children: Sequence[PolicyEvaluator]) -> None:
        self.combine = combine
        self.children = tuple(children)
        self.index = build_index(self.children)

    def candidates(self, ctx: EvalContext) -> Sequence[Any]:
        return self.children if self.index is None else self.index.candidates(self.children, ctx)

    def evaluate(self, ctx: EvalContext) -> Outcome:
        return self.combine(self.candidates(ctx), ctx)


@dataclass(frozen=True)
class _Entry:
    source: PolicySource
    compiled: CompiledDocument


class PolicyEngine:
    """Compiled policies plus the root; `decide` turns requests into responses."""

    def __init__(self, entries: Sequence[_Entry], root_combining_alg: str,
                 root_policy_id: str | None, use_index: bool = True) -> None:
        self._entries = tuple(entries)
        self.root_combining_alg = root_combining_alg
        self.root_policy_id = root_policy_id
        self.use_index = use_index
        self._links, self._refs_of = _link(self._entries)
        infos: dict[str, PolicyInfo] = {}
        for e in self._entries:
            info = e.compiled.info
            prev = infos.get(info.id)
            if prev is None or _vt(info.version) > _vt(prev.version):
                infos[info.id] = info
        self.policies: Mapping[str, PolicyInfo] = infos
        try:
            combine = policy_combiner(root_combining_alg)
        except KeyError:
            raise PolicyLoadError(f"unknown root policy-combining algorithm {root_combining_alg}"
                                  ) from None
        if root_policy_id is None:
            self._root: Any = _Root(combine, [e.compiled.evaluator for e in self._entries])
            if not use_index:
                self._root.index = None
        else:
            candidates = [e.compiled.evaluator for e in self._entries
                          if e.compiled.info.id == root_policy_id]
            if not candidates:
                raise PolicyLoadError(f"root policy {root_policy_id} is not among the documents")
            self._root = max(candidates, key=lambda ev: _vt(ev.identifier.version))

    # -- building

    @classmethod
    def compile(cls, sources: Sequence[PolicySource], root_combining_alg: str = DENY_OVERRIDES_3_0,
                root_policy_id: str | None = None, *, use_index: bool = True) -> "PolicyEngine":
        entries = [_Entry(s, compile_document(s)) for s in sources]
        return cls(entries, root_combining_alg, root_policy_id, use_index)

    def with_changes(self, upsert: Sequence[PolicySource] = (),
                     remove_ids: Sequence[str] = ()) -> "PolicyEngine":
        """Next generation: documents with an id in `remove_ids` are dropped (every version),
        then each upserted document replaces the one with the same id and version, or is added.
        Unchanged documents are not recompiled."""
        removed = set(remove_ids)
        by_bytes = {e.source.data: e.compiled for e in self._entries}
        entries = [e for e in self._entries if e.compiled.info.id not in removed]
        for src in upsert:
            compiled = by_bytes.get(src.data) or compile_document(src)
            key = (compiled.info.id, compiled.info.version)
            for i, e in enumerate(entries):
                if (e.compiled.info.id, e.compiled.info.version) == key:
                    entries[i] = _Entry(src, compiled)
                    break
            else:
                entries.append(_Entry(src, compiled))
        return PolicyEngine(entries, self.root_combining_alg, self.root_policy_id, self.use_index)

    # -- deciding

    def decide(self, request: RequestContext) -> Response:
        """Never raises: any failure becomes an Indeterminate result."""
        return self.decide_with_trace(request)[0]

    def decide_with_trace(self, request: RequestContext) -> tuple[Response, list[set[str]]]:
        results = []
        traces: list[set[str]] = []
        try:
            individuals = request.individuals()
        except Exception as exc:  # pragma: no cover - defensive
            return (Response((Result(Decision.INDETERMINATE, status_of_bug(exc)),)), [set()])
        for ind in individuals:
            result, docs = self._decide_one(ind)
            results.append(result)
            traces.append(docs)
        return Response(tuple(results)), traces

    def _decide_one(self, ind: Individual) -> tuple[Result, set[str]]:
        ctx = EvalContext(ind.bags, self._links)
        try:
            outcome = self._root.evaluate(ctx)
        except Exception as exc:  # a bug must never crash the PDP; deny-biased Indeterminate
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
        return (Result(decision, status, tuple(obligations), tuple(advice),
                       ind.included_attributes(), ids), set(outcome.docs))

    def decide_bytes(self, body: bytes, media_type: str) -> Response:
        """Parse and decide; a bad request becomes one Indeterminate result saying why."""
        try:
            request = parse_request(body, media_type)
        except RequestSyntaxError as exc:
            return Response((Result(Decision.INDETERMINATE,
                                    Status(exc.status_code, str(exc))),))
        except Exception as exc:  # a parser bug must not crash the caller: deny-biased answer
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


def _vt(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _link(entries: Sequence[_Entry]) -> tuple[dict, dict]:
    """Resolve every reference to the latest matching top-level document; detect cycles."""
    seen_keys: dict[tuple[bool, str, str], str] = {}
    for e in entries:
        info = e.compiled.info
        key = (info.is_policy_set, info.id, info.version)
        if key in seen_keys:
            raise PolicyLoadError(f"{'PolicySet' if info.is_policy_set else 'Policy'} {info.id} "
                                  f"version {info.version} is defined twice (also in "
                                  f"{seen_keys[key]})", info.source)
        seen_keys[key] = info.source
    links: dict[RefSpec, PolicyEvaluator] = {}
    edges: dict[int, list[CompiledDocument]] = {}
    by_id: dict[tuple[bool, str], list[CompiledDocument]] = {}
    for e in entries:
        by_id.setdefault((e.compiled.info.is_policy_set, e.compiled.info.id), []).append(e.compiled)
    for e in entries:
        targets = []
        for spec, line in e.compiled.references:
            best = None
            for other in by_id.get((spec.is_policy_set, spec.id), ()):
                if spec.matches(other.info.version):
                    if best is None or _vt(other.info.version) > _vt(best.info.version):
                        best = other
            if best is None:
                raise PolicyLoadError(f"undefined reference: {spec.describe()} matches no "
                                      "policy document", e.source.name,
                                      "PolicySetIdReference" if spec.is_policy_set
                                      else "PolicyIdReference", line)
            links[spec] = best.evaluator
            targets.append(best)
        edges[id(e.compiled)] = targets
    # Cycle detection (iterative DFS with colours).
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {id(e.compiled): WHITE for e in entries}
    for e in entries:
        start = e.compiled
        if colour[id(start)] != WHITE:
            continue
        stack = [(start, iter(edges[id(start)]))]
        path = [start]
        colour[id(start)] = GREY
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[id(node)] = BLACK
                stack.pop()
                path.pop()
                continue
            c = colour[id(nxt)]
            if c == GREY:
                cycle = path[path.index(nxt):] + [nxt]
                raise PolicyLoadError("circular policy reference: " +
                                      " -> ".join(d.info.id for d in cycle), nxt.info.source)
            if c == WHITE:
                colour[id(nxt)] = GREY
                stack.append((nxt, iter(edges[id(nxt)])))
                path.append(nxt)
    # Reference depth: evaluation recurses along references, so bound the chain length.
    depth: dict[int, int] = {}

    def chain(doc: CompiledDocument) -> int:
        todo = [(doc, False)]
        while todo:
            node, expanded = todo.pop()
            if id(node) in depth:
                continue
            kids = edges[id(node)]
            if expanded or not kids:
                depth[id(node)] = 1 + max((depth[id(k)] for k in kids), default=0)
            else:
                todo.append((node, True))
                todo.extend((k, False) for k in kids if id(k) not in depth)
        return depth[id(doc)]

    for e in entries:
        if chain(e.compiled) > MAX_REFERENCE_DEPTH:
            raise PolicyLoadError(f"policy references nest more than {MAX_REFERENCE_DEPTH} "
                                  f"documents deep from {e.compiled.info.id}", e.source.name)
    # Transitive references per document evaluator, for dependencies().
    refs_of: dict[int, set[str]] = {}
    for e in entries:
        seen: set[str] = set()
        todo = list(edges[id(e.compiled)])
        while todo:
            d = todo.pop()
            if d.info.id in seen:
                continue
            seen.add(d.info.id)
            todo.extend(edges[id(d)])
        refs_of[id(e.compiled.evaluator)] = seen
    return links, refs_of
