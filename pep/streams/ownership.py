"""Stream owners manage the policies of their own streams, and nothing else.

Administrators manage every policy. Anyone else may add, replace, delete, read or list a policy
only when the policy is provably confined to streams that the caller owns: its top-level Target
must require the resource-id (category resource, string-equal, MustBePresent="false") to be one
of the caller's streams, spelled exactly as registered (`pdp.policy_scope` says why that is
enough: such a policy is NotApplicable to every other stream, whatever its rules). Replacing or
deleting a policy judges the stored current version as well as the new one, so an owner cannot
take over another's policy by writing a confined version over it.

A confined policy must also read nothing of another stream: the events it names (in a Condition,
an Obligation or Advice expression, a VariableDefinition, a Target, or an obligation's
placeholder) must be events of the streams it is confined to (`pep.streams.event_scope` says
where it looks). Otherwise its advice could hand the caller another owner's event keys, or its
condition tell whether another owner's event is open.

The rule is judged again on every call against the live catalogue, not remembered.
"""
from __future__ import annotations

from collections.abc import Callable

from common.auth import Identity
from pdp import (
    RESOURCE_ID,
    ManagedPolicy,
    PolicyInfo,
    Veto,
    confined_resource_ids,
    may_manage_policy,
)
from pep.core.plan import StreamDefinition
from pep.streams.entries import DeletedStream
from pep.streams.event_scope import foreign_event

StreamLookup = Callable[[str], "StreamDefinition | None"]

UNCONFINED = ("its top-level <Target> must confine it to your streams: an <AnyOf> in which every "
              "<AllOf> has a string-equal <Match> of a string literal against the resource's "
              f"{RESOURCE_ID} (category resource, MustBePresent=\"false\"), and no policy "
              "references")


def owner_or_admin(identity: Identity, owner: str | None) -> bool:
    """Whether `identity` may manage what `owner` owns (a stream, its events and rules, a
    policy): administrators always, else only its owner. `owner` None (nothing found): only
    administrators."""
    return bool(identity.admin) or (owner is not None and owner == identity.subject)


def stream_owner_rule(lookup: StreamLookup,
                      may_see: Callable[[Identity, str], bool] | None = None,
                      former: Callable[[str], DeletedStream | None] | None = None
                      ) -> Callable[[Identity, PolicyInfo], bool | Veto]:
    """The gateway's `may_manage`: administrators always, owners for policies confined to their
    streams. `lookup(name)` is the catalogue's `get` (a StreamDefinition with `.owner`);
    `may_see(identity, name)` (`pep.streams.visibility`): a stream the caller may not see is
    refused in the words used for a name no stream has. `former(name)` (the catalogue's
    `deleted`): a deleted stream's name and former owner, who still manages the policies it
    kept when it deleted the stream (the name stays reserved to it)."""

    def may_manage(identity: Identity, info: PolicyInfo) -> bool | Veto:
        if may_manage_policy(identity, info):
            return True
        data = info.data if isinstance(info, ManagedPolicy) else None
        if not data:
            return Veto("only administrators manage policies whose document is not at hand")
        streams = confined_resource_ids(data)
        if streams is None:
            return Veto(f"policy {info.id!r} is not confined to streams you own; {UNCONFINED}")
        if not streams:
            return Veto(f"policy {info.id!r} names no stream in its target")
        for name in sorted(streams):
            stream: StreamDefinition | DeletedStream | None = lookup(name)
            if stream is not None and may_see is not None and not may_see(identity, name):
                stream = None
            if stream is None and former is not None:
                stream = former(name)  # a deleted stream: its name is its former owner's
            if stream is None or stream.name != name:
                return Veto(f"policy {info.id!r} is about {name!r}, which is not a registered "
                            "stream (names are matched exactly)")
            if stream.owner != identity.subject:
                return Veto(f"policy {info.id!r} is about stream {name!r}, which "
                            f"{identity.subject!r} does not own")
        foreign = foreign_event(data, streams)
        if foreign is not None:
            line = f" (line {foreign.line})" if foreign.line else ""
            return Veto(f"policy {info.id!r} reads attribute {foreign.attribute!r}{line}, an "
                        f"event of stream {foreign.stream!r}; a policy may read only the events "
                        f"of the streams it is confined to ({', '.join(sorted(streams))})")
        return True

    return may_manage
