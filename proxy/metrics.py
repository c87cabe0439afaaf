"""GET /proxy/metrics: the caching proxy's counters in the Prometheus text format.

Read from the proxy's own statistics at every scrape (the same numbers as /proxy/stats), so
nothing is counted twice and the request path pays nothing for metrics. Public, like
/proxy/stats: it tells how well the cache works, nothing about who asked for what.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_CACHE_COUNTERS = {
    "hits": "Requests answered from the cache",
    "misses": "Cacheable requests forwarded to the gateway",
    "inserts": "Answers stored in the cache",
    "rejected_inserts": "Answers not stored because a change overtook them",
    "evictions": "Entries evicted for room",
    "expirations": "Entries expired by their time to live",
    "invalidations": "Entries dropped by invalidation events",
    "stream_invalidations": "Entries dropped by policy changes on their streams",
    "flushes": "Whole-cache flushes",
}
_FEED_COUNTERS = {
    "events_applied": "Invalidation events applied",
    "gaps": "Gaps found in the invalidation feed (each flushes the cache)",
    "resyncs": "Resynchronisations with the gateway's feed",
    "webhooks_received": "Webhooks received",
    "webhooks_rejected": "Webhooks rejected (bad signature or body)",
}


class ProxyCollector:
    """A prometheus_client collector over `stats()` (ProxyRuntime.stats)."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        cache, feed = stats.get("cache", {}), stats.get("feed", {})
        for key, doc in _CACHE_COUNTERS.items():
            yield CounterMetricFamily(f"xsg_proxy_cache_{key}", doc, value=cache.get(key, 0))
        yield GaugeMetricFamily("xsg_proxy_cache_entries", "Entries in the cache",
                                value=cache.get("size", 0))
        yield GaugeMetricFamily("xsg_proxy_cache_enabled",
                                "1 while caching, 0 in pass-through mode",
                                value=1 if cache.get("enabled") else 0)
        for key, doc in _FEED_COUNTERS.items():
            yield CounterMetricFamily(f"xsg_proxy_feed_{key}", doc, value=feed.get(key, 0))
        yield CounterMetricFamily("xsg_proxy_upstream_calls", "Requests forwarded to the gateway",
                                  value=stats.get("upstream_calls", 0))
        yield CounterMetricFamily("xsg_proxy_upstream_failures",
                                  "Forwarded requests that got no answer",
                                  value=stats.get("upstream_failures", 0))


def metrics_text(stats: Callable[[], dict[str, Any]]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProxyCollector(stats))
    return generate_latest(registry)


__all__ = ["CONTENT_TYPE", "ProxyCollector", "metrics_text"]
