"""Prometheus metrics of one gateway: what operators watch, in the text format at GET /metrics.

Counters and histograms are updated where things happen (decisions, stream requests,
revocations); everything that is already kept as state (policies loaded, live handles, the
runtime's per-stream figures, rows dropped for slow readers) is read at scrape time by a
collector, so keeping metrics costs nothing between scrapes.

| metric | kind | labels |
|---|---|---|
| `xsg_decisions_total` | counter | `result` (Permit, Deny, NotApplicable, Indeterminate) |
| `xsg_decision_seconds` | histogram | |
| `xsg_stream_requests_total` | counter | `outcome` (granted, refused) |
| `xsg_revocations_total` | counter | |
| `xsg_revocation_seconds` | histogram (one policy change or event, every handle it ends) | |
| `xsg_policies_loaded` | gauge | |
| `xsg_live_handles` | gauge | `stream` |
| `xsg_rows_delivered_total`, `xsg_rows_in_total` | counter | `stream` |
| `xsg_rows_dropped_total` | counter (rows a slow reader's buffer dropped) | `stream` |
| `xsg_batch_seconds` | gauge (the last micro-batch's duration) | `stream` |
| `xsg_batches_total` | counter | `stream` |
| `xsg_stream_stalled` | gauge (1 while input waits without progress) | `stream` |
"""
from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypedDict

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pdp import Response
from pep.ports import StreamReport

if TYPE_CHECKING:  # pep.services builds the metrics: no import at run time
    from pep.services import GatewayServices

log = logging.getLogger(__name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.decisions = Counter("xsg_decisions", "XACML decisions made over /pdp, by result",
                                 ["result"], registry=self.registry)
        self.decision_seconds = Histogram("xsg_decision_seconds", "Time to decide one request",
                                          buckets=LATENCY_BUCKETS, registry=self.registry)
        self.stream_requests = Counter("xsg_stream_requests", "Stream requests, by outcome",
                                       ["outcome"], registry=self.registry)
        self.revocations = Counter("xsg_revocations", "Handles revoked",
                                   registry=self.registry)
        self.revocation_seconds = Histogram(
            "xsg_revocation_seconds", "Time to deal with one policy change or stream event",
            buckets=LATENCY_BUCKETS, registry=self.registry)

    def decided(self, response: Response, seconds: float) -> None:
        for result in response.results:
            self.decisions.labels(result=str(result.decision.value)).inc()
        self.decision_seconds.observe(seconds)

    def revoked(self, count: int, seconds: float) -> None:
        self.revocations.inc(count)
        self.revocation_seconds.observe(seconds)

    def watch(self, state: Callable[[], GatewayState]) -> None:
        """Read the gateway's state at every scrape (`state()` gives the figures)."""
        self.registry.register(_StateCollector(state))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class GatewayState(TypedDict):
    """The gateway's figures at a scrape (`gateway_state`): policies loaded, live handles and
    rows dropped per stream, and the runtime's figures per running stream."""

    policies: int
    live_handles: dict[str, int]
    dropped: dict[str, int]
    runtime: StreamReport


class _StateCollector:
    def __init__(self, state: Callable[[], GatewayState]) -> None:
        self._state = state

    def describe(self) -> list[Metric]:
        return []  # described at collection: the streams are only known then

    def collect(self) -> Iterator[Metric]:
        try:
            s = self._state()
        except Exception:  # a scrape must not fail because one figure does
            log.exception("metrics: reading the gateway's state failed")
            return
        yield GaugeMetricFamily("xsg_policies_loaded", "Policies in the engine",
                                value=s.get("policies", 0))
        live = GaugeMetricFamily("xsg_live_handles", "Live handles", labels=["stream"])
        for stream, n in sorted(s.get("live_handles", {}).items()):
            live.add_metric([stream], n)
        yield live
        dropped = CounterMetricFamily("xsg_rows_dropped", "Rows dropped for slow readers",
                                      labels=["stream"])
        for stream, n in sorted(s.get("dropped", {}).items()):
            dropped.add_metric([stream], n)
        yield dropped
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            "rows_delivered": CounterMetricFamily("xsg_rows_delivered", "Rows delivered to "
                                                  "handles", labels=["stream"]),
            "rows_in": CounterMetricFamily("xsg_rows_in", "Rows the stream's query read",
                                           labels=["stream"]),
            "batches": CounterMetricFamily("xsg_batches", "Micro-batches completed",
                                           labels=["stream"]),
            "batch_seconds": GaugeMetricFamily("xsg_batch_seconds", "Duration of the last "
                                               "micro-batch", labels=["stream"]),
            "stalled": GaugeMetricFamily("xsg_stream_stalled", "1 while input waits without "
                                         "progress", labels=["stream"]),
        }
        for stream, stats in sorted(s.get("runtime", {}).items()):
            figures = {
                "rows_delivered": stats.get("rows_delivered"),
                "rows_in": stats.get("rows_in"),
                "batches": stats.get("batches"),
                "batch_seconds": (stats["last_batch_ms"] / 1000.0
                                  if stats.get("last_batch_ms") is not None else None),
                "stalled": 1.0 if stats.get("stalled") else 0.0,
            }
            for name, value in figures.items():
                if value is not None:
                    families[name].add_metric([stream], float(value))
        yield from families.values()


def gateway_state(services: GatewayServices, hidden: Callable[[str], bool] | None = None
                  ) -> GatewayState:
    """The figures `_StateCollector` reads, from the gateway's services; streams for which
    `hidden(stream)` holds are left out (public metrics: restricted streams)."""
    # a join's handle counts on each of its two streams
    live = Tally(s for r in services.handles.live() for s in r.streams)
    stats = services.runtime.stats()
    state: GatewayState = {"policies": len(services.policies.engine.policies),
                           "live_handles": dict(live), "dropped": services.handles.dropped_rows(),
                           "runtime": stats}
    if hidden is not None:
        state["live_handles"] = {s: n for s, n in state["live_handles"].items() if not hidden(s)}
        state["dropped"] = {s: n for s, n in state["dropped"].items() if not hidden(s)}
        state["runtime"] = {s: v for s, v in state["runtime"].items() if not hidden(s)}
    return state


__all__ = ["GatewayMetrics", "GatewayState", "gateway_state", "CONTENT_TYPE"]
