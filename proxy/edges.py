"""Which edge serves a handle's read when the gateway delivers through plan topics.

A gateway with `delivery = "kafka"` answers a read of a topic-delivered handle with a `307` to
one of its edges (`xsg edge`, docs/operate/edges.md). Passed through, that redirect takes the
reader away from the proxy for good: its reconnections no longer pass here, and which edge it
lands on is the gateway's choice, not the one of the part in front that sees the edges fail.
With `--edges`, the proxy follows such a redirect itself, to an edge of its own list:

- the edges are ordered per read by rendezvous hashing (highest hash of edge and key first,
  `common.edge_affinity`): the key is the one the gateway's redirect names (its plan topic's,
  so that a topic's readers meet on one edge, which then reads no topic for few of them), else
  the handle id; so a handle's readers, and a reader's reconnections, land on the same edge
  while it lives, the handles spread evenly, and removing one edge moves only its handles;
- an edge that refuses the connection, or answers 503 (an edge that lost its store or its
  control topic stops serving), is passed over for `DOWN_FOR` seconds, the next in that
  handle's order taking its share; when every edge is down, all are tried anyway.

Any edge can serve any handle, since a reader resumes by event id (its position in the plan
topic), so moving a reader to another edge loses and repeats nothing.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from urllib.parse import urlsplit

from common.edge_affinity import rendezvous

log = logging.getLogger(__name__)

DOWN_FOR = 5.0  # seconds an edge that refused is passed over


def edge_urls(value: str) -> tuple[str, ...]:
    """The `--edges` flag's comma-separated base URLs, checked: http(s), a host, no query."""
    urls = []
    for raw in value.split(","):
        url = raw.strip().rstrip("/")
        if not url:
            continue
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query \
                or parts.fragment:
            raise ValueError(f"an edge is an http(s) base URL, not {raw.strip()!r}")
        urls.append(url)
    if len(set(urls)) != len(urls):
        raise ValueError("an edge is named twice in --edges")
    return tuple(urls)


class EdgeChooser:
    """The edges of one gateway, in the order a handle's read tries them (module docstring)."""

    def __init__(self, edges: Iterable[str], down_for: float = DOWN_FOR) -> None:
        self.edges = tuple(edges)
        self.down_for = down_for
        self._down: dict[str, float] = {}
        self._lock = threading.Lock()

    def order(self, key: str) -> list[str]:
        """The edges for a read of `key` (the gateway's affinity key, else the handle id): its
        rendezvous order, those down lately last."""
        ranked = rendezvous(self.edges, key)
        now = time.monotonic()
        with self._lock:
            down = {edge for edge, until in self._down.items() if until > now}
        return [e for e in ranked if e not in down] + [e for e in ranked if e in down]

    def mark_down(self, edge: str, why: str) -> None:
        with self._lock:
            was_down = self._down.get(edge, 0.0) > time.monotonic()
            self._down[edge] = time.monotonic() + self.down_for
        if not was_down:
            log.warning("edge %s %s; its readers go to the next edge for %g s", edge, why,
                        self.down_for)


__all__ = ["DOWN_FOR", "EdgeChooser", "edge_urls"]
