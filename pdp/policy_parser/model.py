"""What the policy compiler hands the engine: a document's source and identity, the references
it makes to other policies, and the indexable Matches of its targets."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pdp.evaluation import AnyPolicy
from pdp.policy_parser.versions import version_matches


@dataclass(frozen=True)
class PolicySource:
    """A policy document and where it came from (file path or store id, for messages)."""

    name: str
    data: bytes


@dataclass(frozen=True)
class PolicyInfo:
    id: str
    version: str
    is_policy_set: bool
    source: str


@dataclass(frozen=True)
class RefSpec:
    """A Policy(Set)IdReference: what it asks for. Hashable: the engine's link-table key."""

    is_policy_set: bool
    id: str
    version: str | None = None
    earliest: str | None = None
    latest: str | None = None

    def describe(self) -> str:
        kind = "PolicySetIdReference" if self.is_policy_set else "PolicyIdReference"
        cons = ", ".join(f"{k}={v}" for k, v in (("Version", self.version),
                                                 ("EarliestVersion", self.earliest),
                                                 ("LatestVersion", self.latest)) if v)
        return f"{kind} {self.id}" + (f" ({cons})" if cons else "")

    def matches(self, version: str) -> bool:
        return version_matches(version, self.version, self.earliest, self.latest)


@dataclass(frozen=True)
class MatchSpec:
    """An indexable Match: literal value equal to some value of the attribute `key`."""

    key: tuple[str, str, str]  # (category, attribute_id, datatype)
    value: Any
    must_be_present: bool


@dataclass
class CompiledDocument:
    info: PolicyInfo
    evaluator: AnyPolicy
    references: list[tuple[RefSpec, int | None]] = field(default_factory=list)


@dataclass(frozen=True)
class CompiledPolicy:
    """One document and its compiled form: what an engine generation (`pdp.engine`) takes without
    compiling again."""

    source: PolicySource
    compiled: CompiledDocument

    @property
    def info(self) -> PolicyInfo:
        return self.compiled.info

    @property
    def key(self) -> tuple[bool, str, str]:
        info = self.compiled.info
        return (info.is_policy_set, info.id, info.version)
