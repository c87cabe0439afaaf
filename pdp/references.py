"""References between policy documents, resolved per engine generation.

A Policy(Set)IdReference is linked to the latest top-level document whose id and version match
it (`link_references`: the link table RefSpec -> evaluator); an undefined reference, a cycle
or a chain of references deeper than MAX_REFERENCE_DEPTH is a load error naming the document.
Beside it: which version of an id is the latest, and the root a configuration names.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pdp.errors import PolicyLoadError
from pdp.evaluation import AnyPolicy
from pdp.policy_parser import CompiledDocument, CompiledPolicy, PolicyInfo, RefSpec

MAX_REFERENCE_DEPTH = 32


def version_key(version: str) -> tuple[int, ...]:
    """A VersionType as numbers, in the order XACML compares versions."""
    return tuple(int(p) for p in version.split("."))


def defined_twice(info: PolicyInfo, also_in: str) -> PolicyLoadError:
    """The load error of two documents with the same id and version."""
    return PolicyLoadError(f"{'PolicySet' if info.is_policy_set else 'Policy'} {info.id} "
                           f"version {info.version} is defined twice (also in {also_in})",
                           info.source)


def latest_info(by_slot: Mapping[int, CompiledPolicy], slots: Sequence[int]) -> PolicyInfo:
    """The info of the highest version (the first in root order among equals)."""
    best = None
    for slot in slots:
        info = by_slot[slot].compiled.info
        if best is None or version_key(info.version) > version_key(best.version):
            best = info
    assert best is not None
    return best


def named_root(by_slot: Mapping[int, CompiledPolicy], versions: Mapping[str, Sequence[int]],
                root_policy_id: str) -> AnyPolicy:
    """The root a configuration names: the highest version of that document."""
    slots = versions.get(root_policy_id, ())
    if not slots:
        raise PolicyLoadError(f"root policy {root_policy_id} is not among the documents")
    return max((by_slot[s].compiled.evaluator for s in slots),
               key=lambda ev: version_key(ev.identifier.version))


def link_references(by_slot: Mapping[int, CompiledPolicy], versions: Mapping[str, Sequence[int]],
          referrers: Iterable[int]
                    ) -> tuple[dict[RefSpec, AnyPolicy], dict[int, set[str]]]:
    """Resolve every reference to the latest matching top-level document; detect cycles and
    over-deep reference chains.

    Only the documents that hold references (`referrers`, slots) are walked: any other document
    is a leaf of the reference graph (depth 1, on no cycle), so the result and the first error
    found are those of a walk over every document in root order."""
    docs = [by_slot[s] for s in sorted(referrers)]
    links: dict[RefSpec, AnyPolicy] = {}
    if not docs:
        return links, {}
    edges: dict[int, list[CompiledDocument]] = {}
    resolved: dict[RefSpec, CompiledDocument] = {}
    for e in docs:
        targets = []
        for spec, line in e.compiled.references:
            best = resolved.get(spec)
            if best is None:
                for slot in versions.get(spec.id, ()):
                    other = by_slot[slot].compiled
                    if other.info.is_policy_set == spec.is_policy_set and \
                            spec.matches(other.info.version):
                        if best is None or version_key(other.info.version) > version_key(
                            best.info.version
                        ):
                            best = other
                if best is None:
                    raise PolicyLoadError(f"undefined reference: {spec.describe()} matches no "
                                          "policy document", e.source.name,
                                          "PolicySetIdReference" if spec.is_policy_set
                                          else "PolicyIdReference", line)
                resolved[spec] = best
                links[spec] = best.evaluator
            targets.append(best)
        edges[id(e.compiled)] = targets
    no_edges: list[CompiledDocument] = []
    # Cycle detection (iterative DFS with colours).
    WHITE, GREY, BLACK = 0, 1, 2
    colour: dict[int, int] = {}
    for e in docs:
        start = e.compiled
        if colour.get(id(start), WHITE) != WHITE:
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
            c = colour.get(id(nxt), WHITE)
            if c == GREY:
                cycle = path[path.index(nxt):] + [nxt]
                raise PolicyLoadError("circular policy reference: " +
                                      " -> ".join(d.info.id for d in cycle), nxt.info.source)
            if c == WHITE:
                colour[id(nxt)] = GREY
                stack.append((nxt, iter(edges.get(id(nxt), no_edges))))
                path.append(nxt)
    # Reference depth: evaluation recurses along references, so bound the chain length.
    depth: dict[int, int] = {}

    def chain(doc: CompiledDocument) -> int:
        todo = [(doc, False)]
        while todo:
            node, expanded = todo.pop()
            if id(node) in depth:
                continue
            kids = edges.get(id(node), no_edges)
            if expanded or not kids:
                depth[id(node)] = 1 + max((depth[id(k)] for k in kids), default=0)
            else:
                todo.append((node, True))
                todo.extend((k, False) for k in kids if id(k) not in depth)
        return depth[id(doc)]

    for e in docs:
        if chain(e.compiled) > MAX_REFERENCE_DEPTH:
            raise PolicyLoadError(f"policy references nest more than {MAX_REFERENCE_DEPTH} "
                                  f"documents deep from {e.compiled.info.id}", e.source.name)
    # Transitive references per document evaluator, for dependencies().
    refs_of: dict[int, set[str]] = {}
    for e in docs:
        seen: set[str] = set()
        todo = list(edges[id(e.compiled)])
        while todo:
            d = todo.pop()
            if d.info.id in seen:
                continue
            seen.add(d.info.id)
            todo.extend(edges.get(id(d), no_edges))
        refs_of[id(e.compiled.evaluator)] = seen
    return links, refs_of
