"""A stream's life after registration: its owner changes it, or deletes it.

Both are driven from here, over collaborators handed in by `pep/services.py` (this module
imports no handle, runtime or HTTP code): the catalogue, the stream events, the runtime (its
`redefine`, `drop_stream`, `detach`), the policies (listed, judged with the gateway's
`may_manage`, deleted), and three functions over the live handles. Every operation on one
stream holds the catalogue's life-cycle lock for that stream (`StreamCatalog.changing`), so a
change, a deletion and an event definition never interleave.

**Change** (`change`, `PATCH /streams/<name>`): visibility, description, lateness (seconds the
stream's time windows wait for late tuples), retention (seconds committed ingest files stay in
the archive) and attributes added to the schema (`definition.extend_schema`: additions only; a
change that removes or retypes an attribute is refused, naming the policies that name it). Then:
- the runtime is told (`redefine`): a new lateness applies from the next micro-batch; added
  attributes restart the stream's running query on its checkpoint, which continues after the
  last committed batch, so no acknowledged record is lost or read twice, and the attached plans
  with their open windows carry over;
- live handles on the stream (a join's on either side) are decided again, before the answer
  (whose `revoked` counts those revoked), when the owner changed how its grants combine
  (`combining`: a handle whose grant differs under the new mode is revoked) or added
  attributes: plans list their attributes explicitly, so a handle whose grant names its
  attributes (a policy's map, or the consumer's own) keeps exactly what it had; one whose
  grant covered "every attribute" (no map anywhere) would now get more, and is revoked like
  any handle whose grant changed (its reader gets `revoked`; asking again gives the new
  attributes).

**Deletion** (`delete`, `DELETE /streams/<name>`), in this order:
1. what becomes of the policies that name the stream is settled first (`policy_fates`): with
   `remove_policies`, those confined to this stream alone that the caller may manage are
   removed after the stream is gone; all others are kept (and say why);
2. the catalogue hides the stream (`begin_delete`): from now on no request, ingest, event or
   registration finds it, so a handle opened after this point is refused (404);
3. every live handle on it (joins on either side included) is revoked under the handle lock,
   before any new handle could be created (`HandleService.open` looks the stream up again under
   that lock); attaches already on their way are waited for; then every handle it ever had is
   set apart (`bury_handles`): to its owner it answers 404 from now on, like the stream, and
   keeps doing so if the name is registered again (it was the deleted stream's handle, not the
   new stream's; a 410 there would bring it back as if it were one of the new stream's);
4. its events are removed and detached, and the runtime stops its query (`drop_stream`);
5. its row goes, its name is reserved to its former owner (`deleted_streams`), and its files
   (ingest directory, checkpoint, archive) move to `deleted/<name>-<time>-<id>/` under the data
   directory: removed at once, or after `keep_data` seconds by `sweep_kept`;
6. the policies to remove are deleted through the PAP (audited as `policy-deleted`), and the
   deletion is audited (`stream-deleted`).
A failure between 2 and 5 restores the stream (its handles stay revoked, and are its owners'
again: 410) and answers 503.
"""
from __future__ import annotations

import json
import logging
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, TypedDict

from common.auth import Identity
from common.errors import described
from pdp import ManagedPolicy, ManagePolicy, PolicyService, StoredPolicy
from pep.audit.trail import AuditTrail
from pep.core.errors import Unavailable
from pep.handles.records import HandleRecord
from pep.ports import StreamRuntimePort
from pep.streams.catalog import StreamCatalog, StreamEntry
from pep.streams.definition import (
    SchemaChange,
    StreamConflict,
    StreamNotFound,
    StreamPatch,
    extend_schema,
)
from pep.streams.events import StreamEvents
from pep.streams.policy_check import policies_naming

log = logging.getLogger(__name__)

KEPT_FILE = "deleted.json"


class PolicyFateJson(TypedDict):
    """A policy's fate as the owner is shown it: `action` is what would be done (`remove`,
    `keep`) before a deletion, what was done (`removed`, `kept`) after it."""

    id: str
    action: str
    reason: str


class ChangeOutcome(TypedDict):
    """What followed an owner's change (`PATCH /streams/<name>` answers it beside the stream):
    the attributes added, the handles revoked when decided again, what the runtime could not
    take."""

    added: list[str]
    revoked: int
    warnings: list[str]


class StreamDependents(TypedDict):
    """What deleting a stream would do (`GET /streams/<name>/dependents`)."""

    stream: str
    live_handles: int
    joins: int
    subjects: int
    events: list[str]
    policies: list[PolicyFateJson]
    other_policies: int


class KeptData(TypedDict):
    kept_until: str


class StreamDeletion(TypedDict):
    """What deleting a stream did (`DELETE /streams/<name>`); `data` is `removed`, or until
    when its files are kept."""

    stream: str
    deleted: bool
    handles_revoked: int
    events_removed: list[str]
    policies: list[PolicyFateJson]
    other_policies: int
    data: KeptData | Literal["removed"]


@dataclass(frozen=True)
class PolicyFate:
    """What a stream's deletion does to one policy that names the stream."""

    policy_id: str
    remove: bool
    reason: str

    def to_json(self, done: bool | None = None) -> PolicyFateJson:
        out: PolicyFateJson = {"id": self.policy_id, "action": "remove" if self.remove else "keep",
               "reason": self.reason}
        if done is not None:
            out["action"] = "removed" if done else "kept"
        return out


@dataclass
class StreamLifecycle:
    """Changes and deletions of streams (module docstring). Every collaborator but the
    catalogue may be None (a gateway without handles, runtime or policies: nothing to do)."""

    catalog: StreamCatalog
    events: StreamEvents | None = None
    runtime: StreamRuntimePort | None = None  # redefine(definition), drop_stream(name), detach(id)
    policies: PolicyService | None = None
    may_manage: ManagePolicy | None = None
    revoke_stream: Callable[[str, str], int] | None = None      # revoke live handles on it
    redecide_stream: Callable[[str, str], int] | None = None    # decide them again
    live_on: Callable[[str], list[HandleRecord]] | None = None  # the live handles on it
    bury_handles: Callable[[str], list[str]] | None = None      # set apart all its handles
    unbury_handles: Callable[[list[str]], None] | None = None   # undo that (a failed deletion)
    wait_for_attaches: Callable[[str], bool] | None = None
    runtime_dirs: Callable[[str], list[tuple[str, Path]]] | None = None
    deleted_dir: Path | None = None    # where deleted streams' files wait (data_dir/deleted)
    audit: AuditTrail | None = None
    # with several gateway processes: raises unless this process serves the stream (it then
    # goes to the one that does: `pep.cluster`); changes and deletions run where its query does
    claim: Callable[[str], None] | None = None
    _swept: float = field(default=0.0, repr=False)
    _sweep_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- policies that name a stream ---------------------------------------------------------

    def _policies_about(self, stream: str) -> list[tuple[StoredPolicy, frozenset[str] | None]]:
        """(stored policy, resource scope) of every current policy; scope None: any stream."""
        if self.policies is None:
            return []
        engine = self.policies.engine
        return [(p, engine.resource_scope(p.policy_id)) for p in self.policies.list()]

    def _manages(self, identity: Identity, stored: StoredPolicy) -> bool:
        if identity.admin:
            return True
        if self.may_manage is None or self.policies is None:
            return False
        info = self.policies.policy_info(stored.policy_id)
        return info is not None and bool(self.may_manage(identity,
                                                         ManagedPolicy.of(info, stored.data)))

    def policy_fates(self, stream: str, identity: Identity, remove: bool
                     ) -> tuple[list[PolicyFate], int]:
        """What deleting `stream` does to each policy whose target names it, as the caller may
        see it: (fates of the policies it may manage, how many others name the stream). A
        policy that may apply to any stream is not about this one and is not listed."""
        fates: list[PolicyFate] = []
        hidden = 0
        for stored, scope in self._policies_about(stream):
            if scope is None or stream not in scope:
                continue
            if not self._manages(identity, stored):
                hidden += 1
                continue
            if scope != frozenset({stream}):
                fates.append(PolicyFate(stored.policy_id, False,
                                        "it also applies to other streams: kept"))
            elif remove:
                fates.append(PolicyFate(stored.policy_id, True,
                                        "confined to this stream: removed with it"))
            else:
                fates.append(PolicyFate(stored.policy_id, False,
                                        "kept (ask with remove_policies=true to remove it); it "
                                        "applies again if the name is registered again"))
        return fates, hidden

    def _entry(self, name: str) -> StreamEntry:
        """The catalogue's entry of the stream `name` (StreamNotFound when there is none)."""
        entry = self.catalog.entry(name)
        if entry is None:
            raise StreamNotFound(f"no stream named {name!r}")
        return entry

    # -- change -------------------------------------------------------------------------------

    def change(self, name: str, changes: StreamPatch, identity: Identity
               ) -> tuple[StreamEntry, ChangeOutcome]:
        """Apply an owner's validated change (`definition.parse_stream_patch`); returns the
        stream as it is now and what followed ({"added": [...], "revoked": n, "warnings"})."""
        by = identity.subject
        with self.catalog.changing(name):
            entry = self._entry(name)
            registered = entry.definition.name
            if self.claim is not None:
                self.claim(registered)
            try:
                extend_schema(entry.definition, changes)
            except SchemaChange as exc:
                raise self._naming_policies(entry, exc, identity) from None
            now = self.catalog.update(registered, changes, by)
            added = [f.name for f in now.definition.schema.fields[
                len(entry.definition.schema.fields):]]
            warnings: list[str] = []
            if now.definition != entry.definition and self.runtime is not None:
                try:
                    self.runtime.redefine(now.definition)
                except Exception as exc:  # noqa: BLE001 - the change is committed; say so
                    log.error("stream %s: the runtime could not take the change: %s",
                              registered, described(exc))
                    warnings.append(f"the stream's running query could not be restarted "
                                    f"({described(exc)}); it is restarted with the next handle")
            # decided again here, before the answer, so that its `revoked` is what happened
            why = []
            if added:
                why.append(f"stream {registered!r} gained attribute(s) {', '.join(added)}")
            if now.combining != entry.combining:
                why.append("the stream's combining mode changed")
            revoked = 0
            if why and self.redecide_stream is not None:
                revoked = self.redecide_stream(registered, "; ".join(why))
        return now, {"added": added, "revoked": revoked, "warnings": warnings}

    def _naming_policies(self, entry: StreamEntry, exc: SchemaChange, identity: Identity
                         ) -> Exception:
        """A refused schema change, naming the policies that name what it would remove or
        retype (those the caller may manage by id, the others counted)."""
        about = [(p.policy_id, p.data, scope) for p, scope in
                 self._policies_about(entry.definition.name)]
        naming = policies_naming(entry.definition, exc.attributes, about)
        if not naming:
            return exc
        stored = {p.policy_id: p for p, _ in self._policies_about(entry.definition.name)}
        shown, hidden = [], 0
        for policy_id in sorted(naming):
            if stored.get(policy_id) is not None and self._manages(identity, stored[policy_id]):
                uses = ", ".join(f"{a}" + (f" (line {line})" if line else "")
                                 for a, line in naming[policy_id])
                shown.append(f"policy {policy_id!r} names {uses}")
            else:
                hidden += 1
        parts = shown + ([f"{hidden} polic{'y' if hidden == 1 else 'ies'} you may not manage "
                          "name(s) them"] if hidden else [])
        return StreamConflict(f"{exc.message}. It would break what policies name: "
                              f"{'; '.join(parts)}",
                              policies=sorted(p for p in naming if p in stored and
                                              self._manages(identity, stored[p])),
                              attributes=list(exc.attributes))

    # -- deletion -----------------------------------------------------------------------------

    def dependents(self, name: str, identity: Identity,
                   remove_policies: bool = False) -> StreamDependents:
        """What deleting the stream would do, for the confirmation an owner is shown."""
        entry = self._entry(name)
        registered = entry.definition.name
        live = self.live_on(registered) if self.live_on is not None else []
        fates, hidden = self.policy_fates(registered, identity, remove_policies)
        events = [d.name for d in self.events.all(registered)] if self.events is not None else []
        return {"stream": registered, "live_handles": len(live),
                "joins": sum(1 for r in live if len(r.streams) > 1),
                "subjects": len({r.subject for r in live}),
                "events": events, "policies": [f.to_json() for f in fates],
                "other_policies": hidden}

    def delete(self, name: str, identity: Identity, keep_data: float = 0.0,
               remove_policies: bool = False) -> StreamDeletion:
        """Delete the stream (module docstring); returns what was done."""
        by = identity.subject
        with self.catalog.changing(name):
            entry = self._entry(name)
            registered = entry.definition.name
            if self.claim is not None:
                self.claim(registered)
            fates, hidden = self.policy_fates(registered, identity, remove_policies)
            self.catalog.begin_delete(registered)
            holding: Path | None = None
            buried: list[str] = []
            try:
                revoked, events = self._stop_everything(registered, by)
                if self.bury_handles is not None:
                    buried = self.bury_handles(registered)
                kept_until, holding = self._hold_files(entry, by, keep_data)
                self.catalog.finish_delete(registered, by, holding / "streams"
                                           if holding is not None else None)
            except Exception as exc:
                if holding is not None:
                    self._restore_files(registered, holding)
                if buried and self.unbury_handles is not None:
                    self.unbury_handles(buried)
                self.catalog.abort_delete(registered)
                if isinstance(exc, StreamNotFound):
                    raise
                log.error("deleting stream %s failed: %s", registered, described(exc))
                raise Unavailable(f"stream {registered!r} could not be deleted "
                                  f"({described(exc)}); its live "
                                  "handles were revoked; try again") from None
            if holding is not None and kept_until is None:
                shutil.rmtree(holding, ignore_errors=True)
        removed = self._remove_policies([f for f in fates if f.remove], registered, by)
        outcome: StreamDeletion = {
            "stream": registered, "deleted": True, "handles_revoked": revoked,
            "events_removed": events,
            "policies": [f.to_json(done=f.policy_id in removed) for f in fates],
            "other_policies": hidden,
            "data": ({"kept_until": kept_until} if kept_until else "removed"),
        }
        if self.audit is not None:
            self.audit.stream_deleted(
                registered, by, handles_revoked=revoked, events=events,
                policies_removed=sorted(removed),
                policies_kept=sorted(f.policy_id for f in fates if f.policy_id not in removed),
                kept_until=kept_until)
        return outcome

    def _stop_everything(self, stream: str, by: str) -> tuple[int, list[str]]:
        """Revoke the live handles, wait for attaches under way, remove and detach the events,
        stop the query: afterwards nothing reads or writes the stream's files."""
        revoked = 0
        if self.revoke_stream is not None:
            revoked = self.revoke_stream(stream, f"stream {stream!r} was deleted by {by!r}")
        if self.wait_for_attaches is not None and not self.wait_for_attaches(stream):
            raise RuntimeError("a handle on it was still being attached after 60 s")
        events: list[str] = []
        if self.events is not None:
            for definition in self.events.all(stream):
                self.events.delete(stream, definition.name)
                if self.runtime is not None:
                    self.runtime.detach(definition.runtime_id)
                events.append(definition.name)
                if self.audit is not None:
                    self.audit.event_changed("event-deleted", definition.to_json())
        if self.runtime is not None:
            self.runtime.drop_stream(stream)
        return revoked, events

    def _hold_files(self, entry: StreamEntry, by: str, keep_data: float
                    ) -> tuple[str | None, Path | None]:
        """Move the runtime's files of the stream (checkpoint, archive) to a holding directory
        of its own, with a note saying until when it is kept; (kept until, directory)."""
        if self.deleted_dir is None:
            return None, None
        name = entry.definition.name
        stamp = datetime.now(UTC)
        holding = self.deleted_dir / (f"{name}-{stamp.strftime('%Y%m%dT%H%M%SZ')}-"
                                      f"{secrets.token_hex(4)}")
        holding.mkdir(parents=True)
        kept_until = None
        if keep_data > 0:
            kept_until = datetime.fromtimestamp(stamp.timestamp() + keep_data,
                                                UTC).isoformat(timespec="seconds")
        note = {"stream": name, "owner": entry.definition.owner, "deleted_by": by,
                "deleted_at": stamp.isoformat(timespec="seconds"),
                "keep_until": kept_until or stamp.isoformat(timespec="seconds")}
        (holding / KEPT_FILE).write_text(json.dumps(note, indent=1))
        for label, path in (self.runtime_dirs(name) if self.runtime_dirs is not None else []):
            if path.exists():
                shutil.move(str(path), str(holding / label))
        return kept_until, holding

    def _restore_files(self, name: str, holding: Path) -> None:
        """A deletion that failed before the catalogue let the stream go: its files go back."""
        for label, path in (self.runtime_dirs(name) if self.runtime_dirs is not None else []):
            if (holding / label).exists() and not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(holding / label), str(path))
        shutil.rmtree(holding, ignore_errors=True)

    def _remove_policies(self, fates: Iterable[PolicyFate], stream: str, by: str) -> set[str]:
        removed: set[str] = set()
        if self.policies is None:  # no policies: none has a fate
            return removed
        for fate in fates:
            engine = self.policies.engine
            scope = engine.resource_scope(fate.policy_id) \
                if fate.policy_id in engine.policies else frozenset({stream})
            if scope != frozenset({stream}):
                log.warning("policy %s was changed meanwhile to apply beyond stream %s: kept",
                            fate.policy_id, stream)
                continue
            try:
                self.policies.delete(fate.policy_id, by)
                removed.add(fate.policy_id)
            except Exception as exc:  # noqa: BLE001 - report it as kept, with why
                if type(exc).__name__ == "PolicyNotFoundError":
                    removed.add(fate.policy_id)  # deleted meanwhile: gone all the same
                else:
                    log.warning("policy %s not removed with its stream: %s", fate.policy_id, exc)
        return removed

    def sweep_kept(self, now: float | None = None, every: float = 60.0) -> int:
        """Remove deleted streams' files whose keeping time is over (at most once per `every`
        seconds; 0: now); returns how many directories went."""
        if self.deleted_dir is None or not self.deleted_dir.is_dir():
            return 0
        now = time.time() if now is None else now
        with self._sweep_lock:
            if every and now - self._swept < every:
                return 0
            self._swept = now
        gone = 0
        for holding in self.deleted_dir.iterdir():
            try:
                note = json.loads((holding / KEPT_FILE).read_text())
                until = datetime.fromisoformat(note["keep_until"]).timestamp()
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not ours, or being written: left alone
            if until <= now:
                shutil.rmtree(holding, ignore_errors=True)
                gone += 1
        return gone


__all__ = ["ChangeOutcome", "PolicyFate", "PolicyFateJson", "StreamDeletion", "StreamDependents",
           "StreamLifecycle"]
