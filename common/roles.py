"""Role hierarchies: a role that inherits another gets its grants.

The XACML RBAC profile (v1.0) says inheritance with policy sets: a senior role's permission
policy set references its juniors'. xsg's policies are attribute-based and written by many
owners, so it takes the profile's other half instead, the one its Role Enablement Authority
plays: the access subject's role bag (`urn:oasis:names:tc:xacml:2.0:subject:role`) holds every
role the caller has, those it was given and those they inherit, before the PDP sees a request.
A policy that grants `viewer` then grants every role that inherits `viewer`, wherever it is
decided (POST /pdp, AuthZEN, stream requests, re-decisions), and no policy changes.

A hierarchy is a map from a role to the roles it inherits (its juniors), from the auth file's
`role_hierarchy` and from a JWT claim (`oidc.role_hierarchy_claim`); a caller with the token's
or the file's hierarchy gets their union. Inheritance is transitive; a cycle is refused when the
hierarchy is read, naming the cycle. It widens the role bag only: `admin` still comes from the
auth file's flag or the token's own roles, never from an inherited role.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_ROLES = 10_000  # roles named in one hierarchy
MAX_JUNIORS = 1_000  # roles one role inherits directly
MAX_ROLE_LENGTH = 512


class RoleHierarchyError(ValueError):
    """A hierarchy that cannot be used (shape, size, a cycle); the message says where."""


@dataclass(frozen=True)
class RoleHierarchy:
    """Which roles each role inherits directly (`edges`: role -> juniors, sorted, canonical:
    two hierarchies that say the same are equal). Build with `parse` or `of`."""

    edges: tuple[tuple[str, tuple[str, ...]], ...] = ()
    _juniors: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False,
                                                 repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_juniors", dict(self.edges))

    def __bool__(self) -> bool:
        return bool(self.edges)

    @classmethod
    def of(cls, mapping: Mapping[str, Iterable[str]]) -> RoleHierarchy:
        """The hierarchy of a mapping already checked (no cycle check here: see `parse`)."""
        edges = {role: tuple(sorted(set(juniors))) for role, juniors in mapping.items()}
        return cls(tuple(sorted((r, j) for r, j in edges.items() if j)))

    @classmethod
    def parse(cls, data: Any, where: str) -> RoleHierarchy:
        """`{"senior": ["junior", ...], ...}` checked: strings, sizes, no cycle. Errors say
        `where` and the role."""
        if not isinstance(data, dict):
            raise RoleHierarchyError(f"{where}: must be an object of role -> list of the roles "
                                     f"it inherits, found {type(data).__name__}")
        if len(data) > MAX_ROLES:
            raise RoleHierarchyError(f"{where}: at most {MAX_ROLES} roles")
        mapping: dict[str, list[str]] = {}
        for role, juniors in data.items():
            _check_role(role, where)
            at = f"{where}: {role!r}"
            if isinstance(juniors, str):
                juniors = [juniors]
            if not isinstance(juniors, list):
                raise RoleHierarchyError(f"{at}: must be a list of the roles it inherits")
            if len(juniors) > MAX_JUNIORS:
                raise RoleHierarchyError(f"{at}: inherits more than {MAX_JUNIORS} roles")
            for junior in juniors:
                _check_role(junior, at)
            mapping[role] = list(juniors)
        hierarchy = cls.of(mapping)
        hierarchy.check_acyclic(where)
        return hierarchy

    def juniors(self, role: str) -> tuple[str, ...]:
        return self._juniors.get(role, ())

    def union(self, other: RoleHierarchy) -> RoleHierarchy:
        """Both hierarchies at once (a role inherits what either says)."""
        if not other:
            return self
        if not self:
            return other
        merged: dict[str, set[str]] = {r: set(j) for r, j in self.edges}
        for role, juniors in other.edges:
            merged.setdefault(role, set()).update(juniors)
        return RoleHierarchy.of(merged)

    def check_acyclic(self, where: str) -> None:
        """RoleHierarchyError naming a cycle (`a -> b -> a`) when there is one."""
        done: set[str] = set()
        for start in sorted(self._juniors):
            if start in done:
                continue
            # iterative depth-first search: a long chain must not exhaust Python's stack
            path = [start]
            on_path = {start}
            stack = [iter(self.juniors(start))]
            while stack:
                nxt = next(stack[-1], None)
                if nxt is None:
                    stack.pop()
                    finished = path.pop()
                    on_path.discard(finished)
                    done.add(finished)
                elif nxt in on_path:
                    cycle = path[path.index(nxt):] + [nxt]
                    raise RoleHierarchyError(f"{where}: roles inherit each other in a cycle: "
                                             f"{' -> '.join(cycle)}")
                elif nxt not in done:
                    path.append(nxt)
                    on_path.add(nxt)
                    stack.append(iter(self.juniors(nxt)))

    def expand(self, roles: Iterable[str]) -> tuple[str, ...]:
        """The roles given, in their order, then every role they inherit (breadth first, each
        once): the role bag a decision sees. Terminates on any graph."""
        out: list[str] = []
        seen: set[str] = set()
        for role in roles:
            if role not in seen:
                seen.add(role)
                out.append(role)
        if not self._juniors:
            return tuple(out)
        at = 0
        while at < len(out):
            for junior in self.juniors(out[at]):
                if junior not in seen:
                    seen.add(junior)
                    out.append(junior)
            at += 1
        return tuple(out)

    def as_json(self) -> dict[str, list[str]]:
        return {role: list(juniors) for role, juniors in self.edges}


def _check_role(role: Any, where: str) -> None:
    if not isinstance(role, str) or not role.strip():
        raise RoleHierarchyError(f"{where}: role names must be non-empty strings, found "
                                 f"{role!r}"[:300])
    if len(role) > MAX_ROLE_LENGTH:
        raise RoleHierarchyError(f"{where}: role name longer than {MAX_ROLE_LENGTH} characters")


NO_HIERARCHY = RoleHierarchy()

__all__ = ["MAX_JUNIORS", "MAX_ROLES", "NO_HIERARCHY", "RoleHierarchy", "RoleHierarchyError"]
