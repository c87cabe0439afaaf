"""Revocation: a handle lives only while the current policies still grant exactly what it gets.

Re-evaluation means deciding the handle's stored request again, as its owner (the identity is
looked up afresh when the gateway knows how, else the one recorded with the handle), with the
current engine, through the same `decide_and_plan` that created it. The handle is revoked when
the answer is no longer Permit (Deny, NotApplicable, Indeterminate, NR, an error: deny when in
doubt), or when the plan differs (the obligations changed; comparing the plan's key covers
filter, map and window at once).

When it happens:
- on every policy change, synchronously inside the PDP's event, so that when
  `DELETE /policies/<id>` answers, every handle it allowed is already revoked. Only the handles
  whose decision the change can alter are decided again: those on the streams the policy's
  target can match before or after the change (`PolicyChange.resources`; None means any stream;
  a join's handle is on both its streams, and deciding it again decides both sides), and for a
  deletion only those that depended on the deleted policy (a policy that did not apply
  to a decision cannot change it by disappearing). Handles with identical requests from one
  caller are decided once per pass, and the revocations of a pass are written in one
  transaction and published to proxies as one event. The stored requests are not parsed
  again: their parsed forms are kept (`pep.core.parsed`, filled when the handles opened) and
  bound to the caller afresh at every decision. Each revoked handle's buffer is closed
  as soon as its handle is decided (`HandleService.close_now`), so its reader gets `revoked`
  without waiting for the rest of the pass; the edges are told of the pass's revocations
  once all are decided (`add_closing_listener`), before the transaction. The pass
  then waits (at most `FINAL_READS_WAIT`, rows still held) until this process's readers were
  given it, before the bookkeeping (the transaction, detaching, the listeners) competes with
  the event loop for the interpreter.
- when subjects' identities change (`on_identity_change`): the auth file re-read (a change on
  disk, seen by its watcher or at a request, or SIGHUP), a subject removed from it, or a JWT
  whose claims differ from the ones remembered. Only the live handles of those subjects are
  decided again, with their new identity, synchronously, exactly as for a policy change: a
  handle no longer permitted, or whose plan differs (a `{subject:clearance}` in a filter now
  stands for another value), is revoked; a subject no longer known loses every handle. The
  policy epoch is bumped too, so that a request decided with the old identity meanwhile is
  decided again before it can open a handle.
- periodically (default every second) while any loaded policy mentions the environment or the
  current date/time: such a decision can change with nothing but the clock, so a time-limited
  grant ends within one period of its end. Which policies do is tracked per policy as they
  change (the check is coarse on purpose: a policy mentioning `environment` counts); when none
  does, the timer costs nothing.
- at start-up (`restore_all`): every handle persisted as live is decided again and either
  resumed (re-attached to the runtime) or revoked/ended with a reason, never silently lost.
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

from common.auth import Identity
from pdp import PolicyChange, PolicyEngine, PolicyService, Prospect
from pep.core.access import Grant, SchemaLookup, decision_name
from pep.core.delivery_gate import DELIVERY_GATE
from pep.core.errors import AccessDenied, Refusal
from pep.core.parsed import ParsedRequests, RequestMemo
from pep.core.refs import handle_ref
from pep.handles.records import HandleRecord, HandleState
from pep.handles.service import HandleService

log = logging.getLogger(__name__)

# How long a pass waits for its revoked readers to be given `revoked` before it records and
# detaches the handles (`HandleService.await_final_reads`); rows stay held meanwhile
# (`pep.core.delivery_gate`, itself bounded by MAX_HOLD).
FINAL_READS_WAIT = 0.3

TIME_MARKERS = re.compile(rb"environment|current-time|current-date|current-datetime",
                          re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    keep: bool
    reason: str | None = None
    policy_ids: tuple[str, ...] = ()
    changed: bool = False  # still permitted, but the obligations changed what it may see
    decided: bool = False  # a refusal that is the PDP's decision (not Permit), nothing else


@dataclass(frozen=True)
class WhatIf:
    """What a policy change would do to the live handles, decided and not applied: each handle
    that would be re-decided, with its verdict."""

    outcomes: tuple[tuple[HandleRecord, Verdict], ...]

    def outcome(self, verdict: Verdict) -> str:
        return "kept" if verdict.keep else "changed" if verdict.changed else "revoked"


# What deciding a handle's request again comes to: a refusal's Verdict, or (plan key, policy ids)
# while it is still permitted; shared in a pass between the handles of one identity's request.
Outcome = Verdict | tuple[str, tuple[str, ...]]
DecisionMemo = dict[tuple[Identity, bytes, str, bytes | None, str | None], Outcome]
# A policy change, announced (`pdp.PolicyChange`) or only foreseen (`pdp.Prospect`, `what_if`).
AnyChange = PolicyChange | Prospect


class DecideAndPlan(Protocol):
    """`pep.core.access.AccessPlanner.decide_and_plan`: a stored request decided and planned
    again (a Grant, or a Refusal raised)."""

    def __call__(self, engine: PolicyEngine, body: bytes, media_type: str, identity: Identity,
                 schema_lookup: SchemaLookup, user_query: bytes | None = None,
                 user_query_type: str | None = None, *,
                 parsed: RequestMemo | None = None) -> Grant: ...


def mentions_time(document: bytes | None) -> bool:
    """Could this policy's decision change with the clock alone? (Coarse, on purpose.)"""
    return document is not None and TIME_MARKERS.search(document) is not None


class TimeSensitivity:
    """Which current policies mention time, kept up to date one change at a time."""

    def __init__(self, policy_service: PolicyService) -> None:
        self._service = policy_service
        self._ids: set[str] = set()
        try:
            self._ids = {p.policy_id for p in policy_service.list() if mentions_time(p.data)}
        except Exception:  # if we cannot tell, assume time matters
            log.exception("cannot list policies; assuming time-dependent policies")
            self._ids = {"*"}

    def __bool__(self) -> bool:
        return bool(self._ids)

    def changed(self, change: PolicyChange) -> None:
        self._ids.discard(change.policy_id)
        if change.kind == "deleted":
            return
        try:
            document = self._service.get(change.policy_id).data
        except Exception:  # if we cannot tell, assume it does
            log.exception("cannot read policy %s; assuming it mentions time", change.policy_id)
            document = b"environment"
        if mentions_time(document):
            self._ids.add(change.policy_id)


class RevocationService:
    """Keeps live handles in step with the policies (see the module docstring)."""

    def __init__(self, handles: HandleService, engine: Callable[[], PolicyEngine],
                 decide_and_plan: DecideAndPlan, schema_lookup: SchemaLookup,
                 identity_lookup: Callable[[str], Identity | None] | None = None,
                 make_identity: Callable[[str, tuple[str, ...], bool], Identity] | None = None,
                 time_sensitivity: TimeSensitivity | None = None,
                 interval: float = 1.0, parsed: ParsedRequests | None = None) -> None:
        self.handles = handles
        self.engine = engine
        self.decide_and_plan = decide_and_plan
        self.schema_lookup = schema_lookup
        self.identity_lookup = identity_lookup
        self.make_identity = make_identity or _default_identity
        self._time_sensitivity = time_sensitivity
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sweeps = 0  # periodic sweeps run (observable in tests)
        self._tickers: list[Callable[[], object]] = []
        # `observer(revoked, seconds)` after each policy change or environment change (metrics)
        self.observer: Callable[[int, float], None] | None = None
        # the live handles' requests as parsed: a handle's stored request never changes, so a
        # pass binds and decides them again without parsing them again (`pep.core.parsed`)
        self.parsed = parsed if parsed is not None else ParsedRequests()
        # told of a pass's revocations once decided, before its transaction (`_tell_closing`)
        self._closing: list[Callable[[list[tuple[str, str, str | None]]], None]] = []

    def add_closing_listener(
            self, callback: Callable[[list[tuple[str, str, str | None]]], None]) -> None:
        """`callback(endings)`, (handle id, state, reason), when a pass has decided to revoke
        handles whose readers may be in other processes (the edges: `pep.delivery.topics.
        PlanTopics.closing`), as `HandleService.close_now` closes this process's readers:
        ahead of the transaction and the detaches (a policy's 1,000 handles: ~50 ms of them),
        after which `HandleService`'s listeners are told. Should the process stop in between,
        the handles are still live in the store and are decided again at start-up; an edge
        refuses readers of a handle it was told of meanwhile. A listener that fails is logged;
        the transaction's listeners tell the same handles again."""
        self._closing.append(callback)

    def _tell_closing(self, revocations: list[tuple[str, str]]) -> None:
        endings: list[tuple[str, str, str | None]] = [
            (hid, HandleState.REVOKED.value, reason) for hid, reason in revocations]
        for callback in list(self._closing):
            try:
                callback(endings)
            except Exception:  # the transaction's listeners tell it again
                log.exception("revocation closing listener failed for %d handles", len(endings))

    # -- deciding again ---------------------------------------------------------------------------

    def identity_for(self, record: HandleRecord) -> Identity | None:
        if self.identity_lookup is not None:
            return self.identity_lookup(record.subject)
        return self.make_identity(record.subject, record.roles, record.admin)

    @property
    def time_sensitive(self) -> bool:
        return True if self._time_sensitivity is None else bool(self._time_sensitivity)

    def reevaluate(self, record: HandleRecord, engine: PolicyEngine | None = None,
                   memo: DecisionMemo | None = None) -> Verdict:
        """Decide the handle's request again. `memo` shares the outcome between handles of one
        pass that carry the same request from the same identity."""
        identity = self.identity_for(record)
        if identity is None:
            return Verdict(False, f"subject {record.subject!r} is no longer known to the gateway")
        engine = engine if engine is not None else self.engine()
        req = record.request
        key = (identity, req.body, req.media_type, req.user_query, req.user_query_type)
        outcome = memo.get(key) if memo is not None else None
        if outcome is None:
            outcome = self._decide(record, identity, engine)
            if memo is not None:
                memo[key] = outcome
        if isinstance(outcome, Verdict):
            return outcome
        plan_key, policy_ids = outcome
        if plan_key != record.plan_key:
            return Verdict(False, "the policy's obligations changed what this handle may see",
                           policy_ids, changed=True)
        if _roles_changed(record, identity):
            return Verdict(False, "the subject's roles changed, which the stream's security "
                           "punctuations are read against", policy_ids, changed=True)
        return Verdict(True, None, policy_ids)

    def _decide(self, record: HandleRecord, identity: Identity,
                engine: PolicyEngine) -> Outcome:
        """A refusal's Verdict, or (plan key, policy ids) when the request is still permitted."""
        req = record.request
        try:
            grant = self.decide_and_plan(engine, req.body, req.media_type, identity,
                                         self.schema_lookup, user_query=req.user_query,
                                         user_query_type=req.user_query_type,
                                         parsed=self.parsed)
        except Refusal as exc:
            kind = type(exc).__name__
            return Verdict(False, f"the request is no longer permitted ({kind}): {exc.message}",
                           decided=isinstance(exc, AccessDenied))
        except Exception as exc:  # anything else: deny when in doubt
            log.exception("re-evaluation of handle %s failed", handle_ref(record.id))
            return Verdict(False, f"re-evaluation failed: {str(exc) or type(exc).__name__}")
        decision = decision_name(grant.decision)
        if decision != "Permit":
            return Verdict(False, f"the decision is now {decision}", decided=True)
        # the decided key: the plan's, and whether it gives the grant option (a policy change
        # that takes the option away changes what the handle was granted: it is revoked, and a
        # derived stream it feeds ends)
        return grant.decided_key, tuple(sorted(set(grant.policy_ids or ())))

    def _apply_all(self, records: list[HandleRecord], engine: PolicyEngine, why: str,
                   urgent: bool = True) -> int:
        """Decide handles again; revoke, in one batch, those no longer granted exactly what they
        get, and record changed policy ids in one transaction. Returns how many were revoked.
        `records` were read under the handles' lock, which the caller holds until this returns
        (what lets the revocations hand them to the listeners as they are)."""
        memo: DecisionMemo = {}
        refused: dict[str, Verdict] = {}  # see `_shared_refusal`
        revocations: list[tuple[str, str]] = []
        policy_updates: dict[str, tuple[str, ...]] = {}
        # rows wait while the handles are decided (`pep.core.delivery_gate`); ending and
        # detaching them, which may wait for a micro-batch's delivery, comes after. Not for the
        # periodic sweep, which runs every second while policies mention time.
        with DELIVERY_GATE.closed() if urgent else contextlib.nullcontext():
            for record in records:
                verdict = self._shared_refusal(record, engine, refused)
                if verdict is None:
                    verdict = self.reevaluate(record, engine, memo)
                    self._remember_refusal(record, engine, verdict, refused)
                if verdict.keep:
                    if tuple(sorted(record.policy_ids)) != verdict.policy_ids:
                        policy_updates[record.id] = verdict.policy_ids
                else:
                    reason = f"{why}: {verdict.reason}"
                    self.handles.close_now(record.id, reason)  # its reader learns it now
                    revocations.append((record.id, reason))
            if revocations:  # the edges' readers too (`pep.delivery.topics`)
                self._tell_closing(revocations)
            if urgent and revocations:
                # their readers get `revoked` before the bookkeeping below takes the CPU
                self.handles.await_final_reads([hid for hid, _ in revocations],
                                               FINAL_READS_WAIT)
        if policy_updates:
            self.handles.set_policy_ids_many(policy_updates)
        # the records as read under the handles' lock, held throughout: the listeners get
        # them as revoked rather than read back (`HandleService.finish_many`)
        revoked = self.handles.revoke_many(revocations, {r.id: r for r in records})
        if revoked:
            log.info("revoked %d handle(s) (%s)", len(revoked), why)
        return len(revoked)

    @staticmethod
    def _never_permitted_stream(record: HandleRecord, engine: PolicyEngine) -> str | None:
        """The record's one stream when `engine` proves that no request on it can be permitted
        now (`PolicyEngine.never_permits`: no policy can apply to it), else None."""
        streams = record.streams
        if len(streams) != 1 or not engine.never_permits(streams[0]):
            return None
        return streams[0]

    def _shared_refusal(self, record: HandleRecord, engine: PolicyEngine,
                        refused: dict[str, Verdict]) -> Verdict | None:
        """The refusal of a handle on a stream no request can be permitted on any more, when
        one handle of that stream was decided so in this pass: whoever asks, the PDP answers
        such a stream's requests alike (NotApplicable, or Deny under deny-unless-permit), so
        the other handles are not decided one by one (deleting the one policy of a stream read
        by a thousand consumers re-decided a thousand requests). Their subjects are still
        checked: one the gateway no longer knows is decided in full, for its own reason."""
        stream = self._never_permitted_stream(record, engine) if refused else None
        if stream is None or stream not in refused or self.identity_for(record) is None:
            return None
        return refused[stream]

    def _remember_refusal(self, record: HandleRecord, engine: PolicyEngine, verdict: Verdict,
                          refused: dict[str, Verdict]) -> None:
        if verdict.decided and not verdict.keep:
            stream = self._never_permitted_stream(record, engine)
            if stream is not None:
                refused.setdefault(stream, verdict)

    # -- policy events ----------------------------------------------------------------------------

    @staticmethod
    def affected(records: list[HandleRecord], change: AnyChange) -> list[HandleRecord]:
        """The live handles a policy change is to re-decide (see the module docstring)."""
        resources = change.resources
        targets = records
        if resources is not None:
            targets = [r for r in targets if any(s in resources for s in r.streams)]
        if change.kind == "deleted":
            # A handle with no recorded policies is treated as depending on every policy.
            targets = [r for r in targets
                       if not r.policy_ids or change.policy_id in r.policy_ids]
        return targets

    def what_if(self, change: AnyChange, engine: PolicyEngine) -> WhatIf:
        """What `change` (kind, policy_id, resources, as a PolicyChange) would do to the live
        handles if `engine` (the engine after it) were the live one: the same handles decided
        again the same way as `on_policy_change` would, and nothing applied, revoked or
        recorded. The handles are read without the write lock: a dry run does not wait for
        changes in progress, and answers for the state it read."""
        memo: DecisionMemo = {}
        return WhatIf(tuple((record, self.reevaluate(record, engine, memo))
                            for record in self.affected(self.handles.live(), change)))

    def on_policy_change(self, change: PolicyChange) -> None:
        """The PDP's event callback; returns only when every affected handle is dealt with."""
        started = time.perf_counter()
        if self._time_sensitivity is not None:
            self._time_sensitivity.changed(change)
        engine = self.engine()
        why = f"policy {change.policy_id!r} {change.kind}"
        revoked = 0
        with self.handles.lock:
            self.handles.policy_epoch += 1
            resources = change.resources
            live = (self.handles.live() if resources is None
                    else self.handles.live_on_streams(resources))
            targets = self.affected(self.handles.served(live), change)
            if targets:
                revoked = self._apply_all(targets, engine, why)
        if self.observer is not None:
            self.observer(revoked, time.perf_counter() - started)

    def on_environment_change(self, streams: Collection[str] | None = None,
                              why: str = "a stream event changed") -> None:
        """The gateway's own environment changed (a stream event opened, closed or grew): the
        live handles on those streams (a join's on either of its two; every handle when
        `streams` is None) are decided again. A decision about a stream sees only that stream's
        events, so no other handle's decision can change."""
        started = time.perf_counter()
        engine = self.engine()
        revoked = 0
        with self.handles.lock:
            self.handles.policy_epoch += 1
            targets = self.handles.served(self.handles.live())
            if streams is not None:
                targets = [r for r in targets if any(s in streams for s in r.streams)]
            if targets:
                revoked = self._apply_all(targets, engine, why)
        if self.observer is not None:
            self.observer(revoked, time.perf_counter() - started)

    def on_identity_change(self, subjects: Iterable[str], source: str = "identity") -> int:
        """Subjects' identities changed (`common.auth.IdentityListener`): decide their live handles
        again with the identities now in force; returns how many were revoked."""
        wanted = frozenset(subjects)
        if not wanted:
            return 0
        started = time.perf_counter()
        engine = self.engine()
        revoked = 0
        with self.handles.lock:
            self.handles.policy_epoch += 1
            if len(wanted) <= 16:  # the usual case: one subject; its handles by index
                targets = [r for s in sorted(wanted) for r in self.handles.list_for(s) if r.live]
            else:
                targets = [r for r in self.handles.live() if r.subject in wanted]
            targets = self.handles.served(targets)
            if targets:
                revoked = self._apply_all(targets, engine, f"identity changed ({source})")
        if self.observer is not None:
            self.observer(revoked, time.perf_counter() - started)
        return revoked

    def on_stream_change(self, stream: str, why: str) -> int:
        """A stream's definition changed (its owner added attributes): decide its live handles
        (a join's on either side) again against the stream as it is now, as for a policy change
        of that stream; a handle whose grant now differs (a policy without a map, or a query
        without one, covers the new attributes) is revoked. Returns how many were revoked."""
        started = time.perf_counter()
        engine = self.engine()
        revoked = 0
        with self.handles.lock:
            self.handles.policy_epoch += 1
            targets = self.handles.served(self.handles.live_on(stream))
            if targets:
                revoked = self._apply_all(targets, engine, why)
        if self.observer is not None:
            self.observer(revoked, time.perf_counter() - started)
        return revoked

    def every_tick(self, callback: Callable[[], object]) -> None:
        """Run `callback` on every period of the timer (e.g. closing stream events on time)."""
        self._tickers.append(callback)

    def sweep(self) -> int:
        """One periodic pass over every live handle; returns how many were revoked."""
        engine = self.engine()
        with self.handles.lock:
            revoked = self._apply_all(self.handles.served(self.handles.live()), engine,
                                      "periodic re-evaluation", urgent=False)
        self.sweeps += 1
        return revoked

    # -- start-up ----------------------------------------------------------------------------------

    def restore_all(self) -> tuple[list[str], list[str]]:
        """Decide every persisted live handle again: resume it or end it. Returns (resumed,
        ended)."""
        return self.restore(self.handles.live())

    def restore(self, records: Iterable[HandleRecord], when: str = "at gateway start"
                ) -> tuple[list[str], list[str]]:
        """Decide these live handles again and resume or end each (at start, or with several
        processes when this one takes their streams over). Returns (resumed, ended)."""
        engine = self.engine()
        resumed: list[str] = []
        ended: list[str] = []
        memo: DecisionMemo = {}
        for record in records:
            verdict = self.reevaluate(record, engine, memo)
            if not verdict.keep:
                self.handles.revoke(record.id, f"re-evaluated {when}: {verdict.reason}")
                ended.append(record.id)
            elif self.handles.resume(record, verdict.policy_ids):
                resumed.append(record.id)
            else:
                ended.append(record.id)
        if resumed or ended:
            log.info("restored handles: %d resumed, %d ended", len(resumed), len(ended))
        return resumed, ended

    # -- the periodic timer ------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None or self.interval <= 0:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="xsg-revocation", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for tick in list(self._tickers):
                try:
                    tick()
                except Exception:  # the timer must survive one bad tick
                    log.exception("periodic tick failed")
            if not self.time_sensitive:
                continue
            try:
                self.sweep()
            except Exception:  # the timer must survive one bad pass
                log.exception("periodic re-evaluation failed")


def _roles_changed(record: HandleRecord, identity: Identity) -> bool:
    """A handle on a punctuated stream runs with the roles its subject had when it opened
    (`ExecutionPlan.punctuation_roles`): other roles now mean another view."""
    if "punctuation_roles" not in record.plan_json:
        return False
    now = sorted(set(identity.roles))
    # a plain or window plan holds them; a join, each side on a punctuated stream; a union of
    # grants, each member: wherever they are in the stored plan
    pending: list[object] = [json.loads(record.plan_json)]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            held = item.get("punctuation_roles")
            if held is not None and list(held) != now:
                return True
            pending += item.values()
        elif isinstance(item, list):
            pending += item
    return False


def _default_identity(subject: str, roles: tuple[str, ...], admin: bool) -> Identity:
    return Identity(subject=subject, roles=tuple(roles), admin=admin)


__all__ = ["RevocationService", "Verdict", "WhatIf", "TimeSensitivity", "mentions_time",
           "TIME_MARKERS"]
