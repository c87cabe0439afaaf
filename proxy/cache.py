"""The proxy's cache of handle answers: LRU-bounded, TTL-limited, and safe against racing
revocations.

Correctness rests on two rules, both enforced under one lock:

* An invalidation removes the entries at once and returns only after they are gone, so no lookup
  that starts after it can find them.
* An answer that was in flight while an invalidation happened is not inserted. A request takes a
  `generation()` snapshot before it goes upstream; `put` compares it with a short history of the
  invalidations made since. A flush (or a snapshot older than the history) refuses the insert; a
  targeted invalidation refuses it only when it named the answer's own handle, or one of its
  streams (an answer whose streams are unknown counts as on every stream). That keeps unrelated
  revocations and policy changes from starving the cache while never admitting a handle revoked
  mid-flight.

Each answer knows the streams it concerns (the handle's streams and the request's resource-ids):
`invalidate_streams` drops the entries on those streams, and the entries whose streams are not
known, for a policy change that can only alter decisions on them.

When the cache is disabled (the proxy lost its invalidation feed) lookups miss and inserts are
refused; disabling flushes.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

_HISTORY = 512
HANDLES, STREAMS = "handles", "streams"  # what a targeted invalidation names


def _concerns(dropped: tuple[str, frozenset[str]] | None, answer: CachedAnswer) -> bool:
    """Whether an invalidation (None: a flush) could concern `answer`."""
    if dropped is None:
        return True
    kind, names = dropped
    if kind == HANDLES:
        return answer.handle_id in names
    return answer.streams is None or not names.isdisjoint(answer.streams)


@dataclass(frozen=True)
class CachedAnswer:
    """A successful stream-request answer as the upstream gave it (before any URL rewriting)."""

    handle_id: str
    status: int
    body: bytes
    content_type: str
    location: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    # the streams whose policies decide this answer; None: not known (any policy change drops it)
    streams: frozenset[str] | None = None


@dataclass
class _Entry:
    answer: CachedAnswer
    expires: float
    created: float
    hits: int = 0


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    inserts: int = 0
    rejected_inserts: int = 0  # an invalidation overtook the answer, or the cache was disabled
    evictions: int = 0  # LRU
    expirations: int = 0  # TTL
    invalidations: int = 0  # entries dropped by targeted invalidations (handles)
    stream_invalidations: int = 0  # entries dropped by policy changes on their streams
    flushes: int = 0
    flushed_entries: int = 0


class HandleCache:
    """Thread-safe LRU + TTL map from a canonical request key to the upstream's handle answer."""

    def __init__(self, max_entries: int = 10_000, ttl: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        self.max_entries = max_entries
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._by_handle: dict[str, set[str]] = {}
        self._by_stream: dict[str, set[str]] = {}
        self._unscoped: set[str] = set()  # keys of entries whose streams are not known
        self._generation = 0
        # (generation after the change, what it dropped: FLUSH, or (HANDLES | STREAMS, names))
        self._history: deque[tuple[int, tuple[str, frozenset[str]] | None]] = \
            deque(maxlen=_HISTORY)
        self._enabled = True
        self._stats = CacheStats()

    # -- lookups and inserts ----------------------------------------------------------------

    def generation(self) -> int:
        """Snapshot to take before forwarding a request whose answer may be cached."""
        with self._lock:
            return self._generation

    @property
    def enabled(self) -> bool:
        with self._lock:
            return self._enabled

    def get(self, key: str) -> CachedAnswer | None:
        with self._lock:
            if not self._enabled:
                return None
            entry = self._entries.get(key)
            if entry is None:
                self._stats.misses += 1
                return None
            if entry.expires <= self._clock():
                self._remove(key)
                self._stats.expirations += 1
                self._stats.misses += 1
                return None
            self._entries.move_to_end(key)
            entry.hits += 1
            self._stats.hits += 1
            return entry.answer

    def put(self, key: str, answer: CachedAnswer, generation: int) -> bool:
        """Insert unless an invalidation since `generation` could concern this answer."""
        with self._lock:
            if not self._enabled or self._overtaken(answer, generation):
                self._stats.rejected_inserts += 1
                return False
            if key in self._entries:
                self._remove(key)
            now = self._clock()
            self._entries[key] = _Entry(answer, now + self.ttl, now)
            self._by_handle.setdefault(answer.handle_id, set()).add(key)
            if answer.streams is None:
                self._unscoped.add(key)
            else:
                for stream in answer.streams:
                    self._by_stream.setdefault(stream, set()).add(key)
            self._stats.inserts += 1
            while len(self._entries) > self.max_entries:
                oldest = next(iter(self._entries))
                self._remove(oldest)
                self._stats.evictions += 1
            return True

    def _overtaken(self, answer: CachedAnswer, generation: int) -> bool:
        if generation == self._generation:
            return False
        if generation > self._generation:
            return True  # a snapshot from the future cannot be trusted
        if not self._history or self._history[0][0] > generation + 1:
            return True  # the history no longer reaches back to the snapshot
        for gen, dropped in self._history:
            if gen > generation and _concerns(dropped, answer):
                return True
        return False

    # -- invalidation -------------------------------------------------------------------------

    def invalidate_handles(self, handle_ids: Iterable[str]) -> int:
        """Drop every entry that answers with one of these handles; returns how many went."""
        ids = frozenset(handle_ids)
        with self._lock:
            self._bump((HANDLES, ids))
            dropped = 0
            for handle_id in ids:
                for key in list(self._by_handle.get(handle_id, ())):
                    self._remove(key)
                    dropped += 1
            self._stats.invalidations += dropped
            return dropped

    def invalidate_streams(self, streams: Iterable[str]) -> int:
        """Drop every entry on one of these streams, and every entry whose streams are not
        known (a policy change on these streams may alter their decisions); returns how many."""
        names = frozenset(streams)
        with self._lock:
            self._bump((STREAMS, names))
            keys = set(self._unscoped)
            for stream in names:
                keys |= self._by_stream.get(stream, set())
            for key in keys:
                self._remove(key)
            self._stats.stream_invalidations += len(keys)
            return len(keys)

    def flush(self) -> int:
        with self._lock:
            return self._flush_locked()

    def _flush_locked(self) -> int:
        self._bump(None)
        count = len(self._entries)
        self._entries.clear()
        self._by_handle.clear()
        self._by_stream.clear()
        self._unscoped.clear()
        self._stats.flushes += 1
        self._stats.flushed_entries += count
        return count

    def set_enabled(self, enabled: bool) -> int:
        """Turn caching on or off; both directions flush. Returns the entries dropped."""
        with self._lock:
            self._enabled = enabled
            return self._flush_locked()

    def _bump(self, dropped: tuple[str, frozenset[str]] | None) -> None:
        self._generation += 1
        self._history.append((self._generation, dropped))

    def _remove(self, key: str) -> None:
        entry = self._entries.pop(key)
        keys = self._by_handle.get(entry.answer.handle_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_handle[entry.answer.handle_id]
        if entry.answer.streams is None:
            self._unscoped.discard(key)
            return
        for stream in entry.answer.streams:
            keys = self._by_stream.get(stream)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_stream[stream]

    # -- bookkeeping --------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def handles(self) -> set[str]:
        with self._lock:
            return set(self._by_handle)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            s = self._stats
            lookups = s.hits + s.misses
            return {"enabled": self._enabled, "size": len(self._entries),
                    "capacity": self.max_entries, "ttl_seconds": self.ttl,
                    "generation": self._generation, "hits": s.hits, "misses": s.misses,
                    "hit_ratio": round(s.hits / lookups, 4) if lookups else None,
                    "inserts": s.inserts, "rejected_inserts": s.rejected_inserts,
                    "evictions": s.evictions, "expirations": s.expirations,
                    "invalidations": s.invalidations,
                    "stream_invalidations": s.stream_invalidations, "flushes": s.flushes,
                    "flushed_entries": s.flushed_entries}
