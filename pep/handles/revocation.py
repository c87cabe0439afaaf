"""Revocation: a handle lives only while the current policies still grant exactly what it gets.

Re-evaluation means deciding the handle's stored request again, as its owner (the identity is
looked up afresh when the gateway knows how, else the one recorded with the handle), with the
current engine, through the same `decide_and_plan` that created it. The handle is revoked when
the answer is no longer Permit (Deny, NotApplicable, Indeterminate, NR, an error: deny when in
doubt), or when the plan differs (the obligations changed; comparing the plan's key covers filter, map and
window at once).

When it happens:
- on every policy change, synchronously inside the PDP's event, so that when
  `DELETE /policies/<id>` answers, every handle it allowed is already revoked. A deletion
  re-evaluates the handles that depended on the deleted policy (a policy that did not apply to a
  decision cannot change it by disappearing). An addition or an update re-evaluates every live
  handle: a new or changed Deny can apply to requests the old policy never matched.
- periodically (default every second) while any loaded policy mentions the environment or the
  current date/time: such a decision can change with nothing but the clock, so a time-limited
  grant ends within one period of its end. The check is coarse on purpose (simple and safe):
  when it is on, every live handle is decided again each period; when no policy mentions time,
  the timer costs nothing.
- at start-up (`restore_all`): every handle persisted as live is decided again and either
  resumed (re-attached to the runtime) or revoked/ended with a reason, never silently lost.
"""
from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pdp import Identity
from pep.core.access import decision_name
from pep.core.errors import Refusal
from pep.handles.records import HandleRecord
from pep.handles.service import HandleService

log = logging.getLogger(__name__)

TIME_MARKERS = re.compile(rb"environment|current-time|current-date|current-datetime",
                          re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    keep: bool
    reason: str | None = None
    policy_ids: tuple[str, ...] = ()


def policies_mention_time(policy_service: Any) -> bool:
    """True when a current policy could change its decision with the clock alone."""
    try:
        stored = policy_service.list()
    except Exception:  # noqa: BLE001 - if we cannot tell, assume it could
        log.exception("cannot list policies; assuming time-dependent policies")
        return True
    return any(not getattr(p, "deleted", False) and TIME_MARKERS.search(p.data or b"")
               for p in stored)


class RevocationService:
    """Keeps live handles in step with the policies (see the module docstring)."""

    def __init__(self, handles: HandleService, engine: Callable[[], Any], decide_and_plan: Callable,
                 schema_lookup: Callable[[str], Any],
                 identity_lookup: Callable[[str], Any] | None = None,
                 make_identity: Callable[[str, tuple[str, ...], bool], Any] | None = None,
                 time_sensitive: Callable[[], bool] | None = None,
                 interval: float = 1.0) -> None:
        self.handles = handles
        self.engine = engine
        self.decide_and_plan = decide_and_plan
        self.schema_lookup = schema_lookup
        self.identity_lookup = identity_lookup
        self.make_identity = make_identity or _default_identity
        self._time_sensitive_fn = time_sensitive
        self.time_sensitive = True if time_sensitive is None else bool(time_sensitive())
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sweeps = 0  # periodic sweeps run (observable in tests)

    # -- deciding again ---------------------------------------------------------------------------

    def identity_for(self, record: HandleRecord) -> Any:
        if self.identity_lookup is not None:
            return self.identity_lookup(record.subject)
        return self.make_identity(record.subject, record.roles, record.admin)

    def reevaluate(self, record: HandleRecord, engine: Any | None = None) -> Verdict:
        identity = self.identity_for(record)
        if identity is None:
            return Verdict(False, f"subject {record.subject!r} is no longer known to the gateway")
        engine = engine if engine is not None else self.engine()
        req = record.request
        try:
            grant = self.decide_and_plan(engine, req.body, req.media_type, identity,
                                         self.schema_lookup, user_query=req.user_query,
                                         user_query_type=req.user_query_type)
        except Refusal as exc:
            kind = type(exc).__name__
            return Verdict(False, f"the request is no longer permitted ({kind}): {exc.message}")
        except Exception as exc:  # noqa: BLE001 - anything else: deny when in doubt
            log.exception("re-evaluation of handle %s failed", record.id)
            return Verdict(False, f"re-evaluation failed: {str(exc) or type(exc).__name__}")
        decision = decision_name(grant.decision)
        if decision != "Permit":
            return Verdict(False, f"the decision is now {decision}")
        if grant.plan.key() != record.plan_key:
            return Verdict(False, "the policy's obligations changed what this handle may see")
        return Verdict(True, None, tuple(sorted(set(grant.policy_ids or ()))))

    def _apply(self, record: HandleRecord, engine: Any, why: str) -> bool:
        """Decide one handle again and revoke it if needed; True if it was revoked."""
        verdict = self.reevaluate(record, engine)
        if verdict.keep:
            if tuple(sorted(record.policy_ids)) != verdict.policy_ids:
                self.handles.set_policy_ids(record.id, verdict.policy_ids)
            return False
        revoked = self.handles.revoke(record.id, f"{why}: {verdict.reason}")
        if revoked:
            log.info("revoked handle %s of %s (%s: %s)", record.id[:8], record.subject, why,
                     verdict.reason)
        return revoked

    # -- policy events ----------------------------------------------------------------------------

    def on_policy_change(self, change: Any) -> None:
        """The PDP's event callback; returns only when every affected handle is dealt with."""
        engine = self.engine()
        why = f"policy {change.policy_id!r} {change.kind}"
        with self.handles.lock:
            self.handles.policy_epoch += 1
            live = self.handles.live()
            if change.kind == "deleted":
                # A handle with no recorded policies is treated as depending on every policy.
                targets = [r for r in live if not r.policy_ids or change.policy_id in r.policy_ids]
            else:
                targets = live
            for record in targets:
                self._apply(record, engine, why)
        if self._time_sensitive_fn is not None:
            self.time_sensitive = bool(self._time_sensitive_fn())

    def sweep(self) -> int:
        """One periodic pass over every live handle; returns how many were revoked."""
        engine = self.engine()
        revoked = 0
        for record in self.handles.live():
            with self.handles.lock:
                current = self.handles.get(record.id)
                if current is None or not current.live:
                    continue
                revoked += self._apply(current, engine, "periodic re-evaluation")
        self.sweeps += 1
        return revoked

    # -- start-up -----------------------------------------------------------------------------------

    def restore_all(self) -> tuple[list[str], list[str]]:
        """Decide every persisted live handle again: resume it or end it. Returns (resumed, ended)."""
        engine = self.engine()
        resumed: list[str] = []
        ended: list[str] = []
        for record in self.handles.live():
            verdict = self.reevaluate(record, engine)
            if not verdict.keep:
                self.handles.revoke(record.id, f"re-evaluated at gateway start: {verdict.reason}")
                ended.append(record.id)
            elif self.handles.resume(record, verdict.policy_ids):
                resumed.append(record.id)
            else:
                ended.append(record.id)
        if resumed or ended:
            log.info("restored handles: %d resumed, %d ended", len(resumed), len(ended))
        return resumed, ended

    # -- the periodic timer -------------------------------------------------------------------------

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
            if not self.time_sensitive:
                continue
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the timer must survive one bad pass
                log.exception("periodic re-evaluation failed")


def _default_identity(subject: str, roles: tuple[str, ...], admin: bool) -> Any:
    return Identity(subject=subject, roles=tuple(roles), admin=admin)


__all__ = ["RevocationService", "Verdict", "policies_mention_time", "TIME_MARKERS"]
