"""Which edge reads a handle: every reader of one plan topic on the same edge.

Plans share topics (`pep.delivery.lanes`), and an edge reads every record of a topic it serves
one lane of: with readers spread over the edges by handle, each of 4 edges read every topic,
four times the records for a quarter of the rows, and an edge's CPU per million rows it
delivered was 1.27 times one edge's at 5,000 handles (docs/operate/edges.md). So a read goes
to the edges in the rendezvous order (highest hash of edge and key first) of a key of the
handle's Kafka topic: the topic's readers meet on one edge while it lives, the topics spread
evenly over the edges, and removing one edge moves only its topics' readers.

The gateway orders its live edges so for a reader it redirects (`307`), and sends the key with
the redirect (`AFFINITY_HEADER`), so that the caching proxy, which follows that redirect to
an edge of its own list, orders its edges by the same key. The key is a hash of the topic's
name: it says which handles share a topic, nothing of their plans or rows.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable

AFFINITY_HEADER = "XSG-Edge-Affinity"


def affinity_key(topic: str) -> str:
    """The key of a Kafka topic's readers (16 hex digits)."""
    return hashlib.blake2b(topic.encode("utf-8"), digest_size=8).hexdigest()


def weight(edge: str, key: str) -> int:
    """The rendezvous weight of `edge` for `key`."""
    digest = hashlib.blake2b(f"{edge}\n{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous(edges: Iterable[str], key: str) -> list[str]:
    """`edges` in `key`'s order, the first the one to read on."""
    return sorted(edges, key=lambda edge: weight(edge, key), reverse=True)


__all__ = ["AFFINITY_HEADER", "affinity_key", "rendezvous", "weight"]
