"""Policy change events: how the stream side learns that a decision may no longer hold.

Subscribers are called synchronously, after the change is committed and the new engine is in
place, and before the HTTP call that made the change returns. That ordering is what lets a
DELETE /policies/<id> promise that every stream the policy allowed has been revoked when it
answers. A subscriber that fails is logged and skipped: one broken listener must not undo a
committed change or starve the others.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)

ChangeKind = Literal["added", "updated", "deleted"]


@dataclass(frozen=True)
class PolicyChange:
    kind: ChangeKind
    policy_id: str
    version: str  # the XACML Version of the policy written (of the last version, for a delete)
    owner: str  # the subject who made the change
    store_version: int = 0
    # The resource-ids whose decisions the change can alter: the scope of the policy before the
    # change united with its scope after (PolicyEngine.resource_scope). None: any resource.
    resources: frozenset[str] | None = None


Subscriber = Callable[[PolicyChange], None]


class PolicyEvents:
    """A tiny synchronous publish/subscribe hub."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Register a callback; returns a function that unsubscribes it (idempotent)."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def emit(self, change: PolicyChange) -> list[BaseException]:
        """Call every subscriber in subscription order; returns the errors that were logged."""
        with self._lock:
            subscribers = list(self._subscribers)
        errors: list[BaseException] = []
        for callback in subscribers:
            try:
                callback(change)
            except Exception as exc:  # isolation of subscribers is the point
                log.exception("policy event subscriber %r failed on %s", callback, change)
                errors.append(exc)
        return errors
