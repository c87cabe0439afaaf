"""Keeping the cache in step with the gateway's invalidation events, from either channel.

Events arrive by webhook (synchronous with the revocation) and by the feed (a background SSE
stream). Both go through `apply`, which keeps the position (epoch, last id) and is idempotent:

* the next id in the same epoch: drop what it names: a handle event its handles (one without
  ids flushes everything), a `policy-changed` the answers on the streams it names and those
  whose streams are not known; a `policy-changed` without streams (a policy whose target cannot
  be narrowed to streams, or a gateway that does not say) flushes everything;
* an id already seen: ignored (the other channel delivered it first);
* a gap or another epoch (an event was missed, or the gateway restarted): flush, then continue
  from the new position. The flush covers whatever was missed, so caching may go on.

The cache serves only while the feed is `live`. When the feed is lost the cache is disabled
(which flushes) and the proxy forwards everything; when the feed is back it re-syncs: flush, then
resume from the last id (the gateway replays what it still holds, or says that it cannot).

When the proxy expects webhooks, it also watches that they keep coming: an event that arrived by
the feed but not by webhook within `webhook_grace` seconds means the gateway can no longer reach
the proxy synchronously (so a revocation could return before the proxy knows). The cache then
stays off until a webhook arrives again or the feed re-syncs (which re-registers the webhook).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from common.invalidation import InvalidationEvent, format_event_id
from proxy.cache import HandleCache

log = logging.getLogger(__name__)

CONNECTING, LIVE, DOWN, NO_FEED = "connecting", "live", "down", "no-feed"


class CacheSync:
    def __init__(self, cache: HandleCache, require_feed: bool = True,
                 expect_webhooks: bool = False, webhook_grace: float = 3.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cache = cache
        self._lock = threading.Lock()
        self._clock = clock
        self.epoch: str | None = None
        self.last_id: int | None = None
        self.state = CONNECTING if require_feed else NO_FEED
        self.since = time.time()
        self.expect_webhooks = expect_webhooks
        self.webhook_grace = webhook_grace
        self.webhook_ok = True
        self._unconfirmed: dict[int, float] = {}  # event id -> when the feed delivered it
        self.events_applied = 0
        self.duplicates = 0
        self.gaps = 0
        self.resyncs = 0
        self.webhooks_received = 0
        self.webhooks_rejected = 0
        self.webhooks_missing = 0
        self.last_error: str | None = None
        self._update_enabled()

    @property
    def position(self) -> str | None:
        with self._lock:
            if self.epoch is None or self.last_id is None:
                return None
            return format_event_id(self.epoch, self.last_id)

    def _update_enabled(self) -> int:
        """Caller holds the lock (or is __init__). Flushes on every change."""
        wanted = self.state in (LIVE, NO_FEED) and self.webhook_ok
        if wanted != self.cache.enabled:
            return self.cache.set_enabled(wanted)
        return 0

    def apply(self, event: InvalidationEvent, channel: str) -> str:
        """Apply one event; returns 'applied', 'duplicate', or 'flushed' (gap or new epoch)."""
        with self._lock:
            if channel == "webhook":
                self._webhook_seen(event)
            outcome = self._apply_locked(event, channel)
            if channel == "feed" and self.expect_webhooks and outcome != "duplicate":
                self._unconfirmed[event.id] = self._clock()
            return outcome

    def _apply_locked(self, event: InvalidationEvent, channel: str) -> str:
        if self.epoch == event.epoch and self.last_id is not None:
            if event.id <= self.last_id:
                self.duplicates += 1
                return "duplicate"
            if event.id == self.last_id + 1:
                self.last_id = event.id
                self.events_applied += 1
                self._drop(event)
                return "applied"
        # A gap, a new epoch, or no position yet: something may have been missed.
        self.gaps += 1
        dropped = self.cache.flush()
        log.warning("invalidation %s via %s: position was %s; cache flushed (%d entries)",
                    event.sse_id, channel,
                    None if self.last_id is None else format_event_id(self.epoch or "?",
                                                                        self.last_id),
                    dropped)
        if self.epoch != event.epoch:
            self._unconfirmed.clear()
        self.epoch, self.last_id = event.epoch, event.id
        self.events_applied += 1
        return "flushed"

    def _drop(self, event: InvalidationEvent) -> None:
        if event.kind == "policy-changed" and event.streams is not None:
            count = self.cache.invalidate_streams(event.streams)
            log.info("invalidation %s (%s %s): %d entries dropped for %d streams", event.sse_id,
                     event.kind, event.policy_id or "", count, len(event.streams))
        elif event.kind == "policy-changed" or not event.handle_ids:
            count = self.cache.flush()
            log.info("invalidation %s (%s %s): cache flushed (%d entries)", event.sse_id,
                     event.kind, event.policy_id or "", count)
        else:
            count = self.cache.invalidate_handles(event.handle_ids)
            log.info("invalidation %s (%s): %d entries dropped for %d handles", event.sse_id,
                     event.kind, count, len(event.handle_ids))

    def _webhook_seen(self, event: InvalidationEvent) -> None:
        self._unconfirmed.pop(event.id, None)
        if not self.webhook_ok:
            self.webhook_ok = True
            dropped = self._update_enabled()
            log.info("invalidation webhooks arrive again (%s): caching resumes (%d flushed)",
                     event.sse_id, dropped)

    def check_webhooks(self) -> None:
        """Called on every feed message: have webhooks stopped coming?"""
        if not self.expect_webhooks:
            return
        with self._lock:
            if not self._unconfirmed or not self.webhook_ok:
                return
            oldest = min(self._unconfirmed.values())
            if self._clock() - oldest <= self.webhook_grace:
                return
            missing = sorted(self._unconfirmed)
            self._unconfirmed.clear()
            self.webhook_ok = False
            self.webhooks_missing += len(missing)
            self.last_error = f"webhook not received for events {missing[:5]}"
            dropped = self._update_enabled()
        log.warning("invalidation events %s came by the feed but not by webhook within %.1f s: "
                    "the gateway cannot reach this proxy synchronously; passing requests "
                    "through uncached (%d entries flushed)", missing[:5], self.webhook_grace,
                    dropped)

    def feed_hello(self, epoch: str, last_id: int, resumed: bool,
                   webhook_registered: bool = True) -> None:
        """The feed (re)connected: flush, take the position; cache on if the webhook is too."""
        with self._lock:
            self.cache.flush()
            self.resyncs += 1
            if not (resumed and self.epoch == epoch and self.last_id is not None):
                self.epoch, self.last_id = epoch, last_id
            self._unconfirmed.clear()
            previous = self.state
            self.state, self.since, self.last_error = LIVE, time.time(), None
            self.webhook_ok = webhook_registered or not self.expect_webhooks
            if not self.webhook_ok:
                self.last_error = "webhook registration failed"
            self._update_enabled()
        log.info("invalidation feed live (was %s) at %s, resumed=%s; cache re-synced%s",
                 previous, format_event_id(epoch, last_id), resumed,
                 "" if self.webhook_ok else "; webhook not registered: passing through uncached")

    def feed_lost(self, reason: str) -> None:
        """Stop serving from cache until the feed is back."""
        with self._lock:
            self.last_error = reason
            if self.state == DOWN:
                return
            previous = self.state
            self.state, self.since = DOWN, time.time()
            dropped = self._update_enabled()
        log.warning("invalidation feed unavailable (%s; was %s): passing requests through "
                    "uncached, %d entries flushed", reason, previous, dropped)

    def note_webhook(self, accepted: bool) -> None:
        with self._lock:
            if accepted:
                self.webhooks_received += 1
            else:
                self.webhooks_rejected += 1

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"state": self.state, "since": self.since,
                    "position": (None if self.epoch is None or self.last_id is None
                                 else format_event_id(self.epoch, self.last_id)),
                    "events_applied": self.events_applied, "duplicates": self.duplicates,
                    "gaps": self.gaps, "resyncs": self.resyncs,
                    "webhook_channel": ("not expected" if not self.expect_webhooks
                                        else "ok" if self.webhook_ok else "missing"),
                    "webhooks_received": self.webhooks_received,
                    "webhooks_rejected": self.webhooks_rejected,
                    "webhooks_missing": self.webhooks_missing, "last_error": self.last_error}
