"""What the gateway records in the audit log, and when (`pep/services.py` wires the calls).

| kind | when | fields |
|---|---|---|
| `granted` | a request opened a handle (or got its live one back: `new` false) | subject, stream, handle_ref, plan_key, plan, policies (id, version, store_version); a join's also streams, sides |
| `refused` | a stream request was refused | subject, stream (when known), refusal (its kind), reason; a join's also streams, and side when the refusal came from one side |
| `handle-revoked`, `handle-released`, `handle-ended` | a handle ended | subject, stream, handle_ref, reason; a join's also streams |
| `handle-resumed` | a live handle was resumed at start, re-decided | subject, stream, handle_ref; a join's also streams |
| `policy-added`, `policy-updated`, `policy-deleted` | the PAP changed a policy | policy_id, version, store_version, by, streams (the change's resource scope; absent: any) |
| `stream-registered` | a stream was registered | stream, by, source (its kind) |
| `stream-changed` | an owner changed a stream (`PATCH /streams/<name>`) | stream, by, changes (settings as given; `add_attributes`) |
| `stream-deleted` | an owner deleted a stream (`DELETE /streams/<name>`) | stream, by, handles_revoked, events, policies_removed, policies_kept, kept_until (its files; absent: removed at once) |
| `event-defined`, `event-deleted` | an owner defined or removed a stream event | stream, event, by, condition, hold, key |
| `stream-derived` | a consumer with the grant option registered its handle's output as a derived stream (issue 48) | stream (the derived one), by, source, derived_from, handle_ref (the deriving handle's), plan (the deriving plan), upstream: {plan, policies} (the source owner's part) |
| `derivation-ended` | a derived stream's feed ended with its deriving handle | stream, derived_from, ended (how the deriving handle ended), handles_revoked, upstream: {reason} |

The plan is the authorised view (filter, map, window: what the policies and the query allow), not
data. Nothing else of a request is kept.

A join's entries name both streams (`streams`, the first is `stream`), and a grant carries each
side's part (`sides`: `[{"stream", "plan", "policies"}, ...]`) so that each stream's owner can
be shown its own side only (`pep.audit.views`). A side's policies are those whose target can
apply to its stream (`policy_scope(id)`: the resource-ids a policy can apply to, None for any).

An entry about a derived stream (its registration, its end, and every grant, refusal and handle
ending on it) names the streams it derives from, nearest first (`derived_from`, from `chain`),
so that each of their owners finds it and is shown the chain, and nothing of the derived
stream's owner's policies (`pep.audit.views`); what belongs to the source's owner (the policies
behind the deriving grant, the reason it ended) is under `upstream`, which only the source's
owner reads.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypedDict

from pep.audit.log import AuditRecords, handle_ref
from pep.core.errors import Refusal
from pep.core.explain import AnyPlanJson
from pep.core.jsontypes import JsonObject

if TYPE_CHECKING:  # what the trail is told about; those packages are wired above it
    from common.auth import Identity
    from pdp import PolicyChange
    from pep.core.plan import StreamDefinition
    from pep.handles.records import HandleRecord
    from pep.streams.derivations import DerivationRecord
    from pep.streams.entries import StreamEntry
    from pep.streams.events import EventJson


class PolicyVersion(TypedDict):
    """A policy a grant depended on, as the entry names it."""

    id: str
    version: str
    store_version: int


class JoinSide(TypedDict):
    """One side of a join's grant: what its stream's owner is shown (`pep.audit.views`)."""

    stream: str
    plan: JsonObject
    policies: list[PolicyVersion]


PolicyVersions = Callable[[Iterable[str]], list[PolicyVersion]]
PolicyScope = Callable[[str], "frozenset[str] | None"]
Chain = Callable[[str], list[str]]


def _any_stream(policy_id: str) -> None:
    return None


def _underived(stream: str) -> list[str]:
    return []


def _join_streams(record: HandleRecord) -> list[str] | None:
    """Both streams of a join's handle; None for a single stream's."""
    streams = list(record.streams)
    return streams if len(streams) > 1 else None


class AuditTrail:
    def __init__(self, log: AuditRecords, policy_versions: PolicyVersions,
                 policy_scope: PolicyScope = _any_stream, chain: Chain = _underived) -> None:
        self.log = log
        self._policy_versions = policy_versions
        self._policy_scope = policy_scope
        self._chain = chain

    def _derived_from(self, stream: str | None) -> list[str] | None:
        """The streams a derived stream derives from, nearest first (None: not derived)."""
        return (self._chain(stream) or None) if isinstance(stream, str) else None

    def granted(self, record: HandleRecord, is_new: bool) -> None:
        plan: JsonObject = json.loads(record.plan_json)
        policies = self._policy_versions(record.policy_ids)
        streams = _join_streams(record)
        self.log.record("granted", subject=record.subject, stream=record.stream,
                        streams=streams, handle_ref=handle_ref(record.id),
                        new=is_new, plan_key=record.plan_key, plan=plan, policies=policies,
                        sides=self._sides(plan, policies) if streams else None,
                        derived_from=None if streams else self._derived_from(record.stream))

    def _sides(self, plan: JsonObject, policies: list[PolicyVersion]) -> list[JoinSide]:
        """A join's two sides: each its stream, its plan and the policies that can apply to it."""
        scopes = {p["id"]: self._policy_scope(p["id"]) for p in policies}
        sides: list[JoinSide] = []
        for name in ("left", "right"):
            side = plan["join"][name]
            stream = side["stream"]
            sides.append({"stream": stream, "plan": side, "policies": [
                p for p in policies
                if (scope := scopes[p["id"]]) is None or stream in scope]})
        return sides

    def refused(self, identity: Identity, exc: Refusal, stream: str | None = None) -> None:
        streams = exc.details.get("streams")
        about = stream or exc.details.get("stream")
        self.log.record("refused", subject=identity.subject, stream=about,
                        streams=list(streams) if streams else None,
                        side=exc.details.get("side") if streams else None,
                        refusal=type(exc).__name__, reason=exc.message,
                        derived_from=None if streams else self._derived_from(about))

    def ended(self, records: list[HandleRecord]) -> None:
        self.log.record_many(
            (f"handle-{record.state.value}",
             {"subject": record.subject, "stream": record.stream,
              "streams": _join_streams(record), "handle_ref": handle_ref(record.id),
              "reason": record.reason, "derived_from": self._derived_from(record.stream)})
            for record in records)

    def resumed(self, records: list[HandleRecord]) -> None:
        self.log.record_many(
            ("handle-resumed", {"subject": record.subject, "stream": record.stream,
                                "streams": _join_streams(record),
                                "handle_ref": handle_ref(record.id),
                                "derived_from": self._derived_from(record.stream)})
            for record in records)

    def stream_derived(self, derivation: DerivationRecord, chain: list[str],
                       plan: AnyPlanJson) -> None:
        """A derived stream was registered (`pep.streams.derived`): the deriving plan is its
        owner's own handle's, the policies behind it the source owner's (`upstream`)."""
        self.log.record("stream-derived", stream=derivation.stream, by=derivation.owner,
                        source=derivation.source, derived_from=list(chain),
                        handle_ref=handle_ref(derivation.handle_id), plan=plan,
                        upstream={"plan": plan,
                                  "policies": self._policy_versions(derivation.policy_ids)})

    def derivation_ended(self, derivation: DerivationRecord, chain: list[str], how: str,
                         handles_revoked: int) -> None:
        """A derived stream's feed ended with its deriving handle (`how` it ended); the reason
        is the deriving handle's, which may quote the source owner's policies (`upstream`)."""
        self.log.record("derivation-ended", stream=derivation.stream, by=derivation.owner,
                        source=derivation.source, derived_from=list(chain),
                        handle_ref=handle_ref(derivation.handle_id), ended=how,
                        handles_revoked=handles_revoked,
                        upstream={"reason": derivation.reason})

    def policy_changed(self, change: PolicyChange) -> None:
        resources = change.resources
        self.log.record(f"policy-{change.kind}", policy_id=change.policy_id,
                        version=change.version, store_version=change.store_version,
                        by=change.owner,
                        streams=sorted(resources) if resources is not None else None)

    def event_changed(self, kind: str, event: EventJson) -> None:
        self.log.record(kind, stream=event["stream"], event=event["name"], by=event["owner"],
                        condition=event["condition"], hold=event["hold"], key=event["key"])

    def stream_registered(self, definition: StreamDefinition) -> None:
        self.log.record("stream-registered", stream=definition.name, by=definition.owner,
                        source=definition.source.kind,
                        derived_from=self._derived_from(definition.name))

    def stream_changed(self, entry: StreamEntry, changes: JsonObject, by: str) -> None:
        self.log.record("stream-changed", stream=entry.definition.name, by=by,
                        changes=dict(changes))

    def stream_deleted(self, stream: str, by: str, handles_revoked: int, events: list[str],
                       policies_removed: list[str], policies_kept: list[str],
                       kept_until: str | None) -> None:
        self.log.record("stream-deleted", stream=stream, by=by, handles_revoked=handles_revoked,
                        events=list(events), policies_removed=list(policies_removed),
                        policies_kept=list(policies_kept), kept_until=kept_until)


__all__ = ["AuditTrail", "JoinSide", "PolicyVersion"]
