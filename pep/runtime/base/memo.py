"""One bounded cache for what is costly to build in Spark and cheap to keep.

Building a source's streaming DataFrame or the generic filter expressions costs tenths of a
second of py4j round trips, paid when a stream's query starts. Both are descriptions (no state of
a running query), so they are built once per owner (the SparkSession, the JVM gateway) and key,
and reused. An entry built for another owner (a session that was stopped and replaced) is never
returned; least recently used entries go first when the cache is full.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

from cachetools import LRUCache


class OwnedCache:
    """A thread-safe LRU of values, each valid only for the owner it was built for."""

    def __init__(self, maxsize: int = 64) -> None:
        self._cache: LRUCache[Hashable, tuple[Any, Any]] = LRUCache(maxsize=maxsize)
        self._lock = threading.Lock()

    def get_or_build(self, owner: Any, key: Hashable, build: Callable[[], Any]) -> Any:
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0] is owner:
            return hit[1]
        value = build()  # outside the lock: building talks to the JVM
        with self._lock:
            self._cache[key] = (owner, value)
        return value


__all__ = ["OwnedCache"]
