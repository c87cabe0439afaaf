"""Who may manage which policy: the rule the PAP asks before every read, write and delete.

`may_manage_policy(identity, policy_info)` is the PDP's own rule (administrators only). The
stream side widens it (stream owners manage the policies confined to their streams) by handing
its own function to the PAP's blueprint. The PAP always passes a `ManagedPolicy`, the policy's
info plus the document being judged: the new one for a write, the stored current one for reads,
updates and deletes (an update is judged on both). A rule may answer with a falsy `Veto`
instead of False to say why; the refusal then carries the reason.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from common.auth import Identity
from pdp.policy_parser import PolicyInfo

ManagePolicy = Callable[[Identity, PolicyInfo], "bool | Veto"]


@dataclass(frozen=True)
class ManagedPolicy(PolicyInfo):
    """What a ManagePolicy function judges: the policy's info and its XACML document."""

    data: bytes = b""

    @classmethod
    def of(cls, info: PolicyInfo, data: bytes) -> ManagedPolicy:
        return cls(**{f.name: getattr(info, f.name) for f in fields(PolicyInfo)}, data=data)


@dataclass(frozen=True)
class Veto:
    """A 'no' from a ManagePolicy function that says why; it is falsy like False."""

    reason: str

    def __bool__(self) -> bool:
        return False


def may_manage_policy(identity: Identity, policy_info: PolicyInfo) -> bool:
    """Administrators manage every policy; anyone else nothing (the stream side widens this)."""
    return identity.admin


__all__ = ["ManagePolicy", "ManagedPolicy", "Veto", "may_manage_policy"]
