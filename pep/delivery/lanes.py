"""Plan lanes: the plans of one stream share plan topics, each plan under a lane of its own.

A plan topic per plan cost the brokers a log (an open file, two memory maps, ~40 KB of heap),
Spark's producer a batch and a send per topic per micro-batch, and an edge a partition in every
fetch: at 5,000 handles, a plan each, each topic got about one row a micro-batch and those
per-topic costs took both cores of this project's machine (docs/operate/edges.md, "Plan
lanes"). So up to `DeliverySettings.plans_per_topic` plans of a stream share one topic, each
plan's records under its lane:

- a plan's **destination** names both, `<topic>#<lane>` (`destination`); it is what the store
  binds a handle to and what the runtime routes a plan's rows to. A destination without `#` is
  a topic of one plan (made with `plans_per_topic = 1`, or before lanes): its records carry no
  lane, and it is read as before;
- a lane's records are keyed `<lane>|<key>` (`lane_key`), `<key>` as for a topic of one plan
  (`m:...`, `r:...`, `c:...`): numbered, checked for holes and told apart per lane, so a
  plan's reader sees exactly what it would see on a topic of its own, at the same positions
  (event ids stay offsets + 1 of the topic: a lane's ids are increasing, not consecutive);
- records of the whole topic carry no lane (the warm record `w:`, fence records `f:...`).

Kafka topic names hold only `[a-zA-Z0-9._-]` and no record key of xsg holds `|`, so neither
mark can be mistaken.
"""
from __future__ import annotations

import secrets
from collections.abc import Iterable

LANE_MARK = "#"  # destination: <topic>#<lane>
LANE_END = b"|"  # a lane's record key: <lane>|<key>
LANE_BYTES = 4  # random bytes of a lane's name (8 hex digits; unique within its topic)


def destination(topic: str, lane: str) -> str:
    """The destination of a plan on `topic` under `lane` ('' : the topic's only plan)."""
    return f"{topic}{LANE_MARK}{lane}" if lane else topic


def new_lane() -> str:
    """A fresh lane name (never reused: a topic's ended lanes keep their records)."""
    return secrets.token_hex(LANE_BYTES)


def kafka_topic(dest: str) -> str:
    """The Kafka topic of a destination."""
    return dest.split(LANE_MARK, 1)[0]


def lane_of(dest: str) -> str:
    """The lane of a destination ('' for a topic of one plan)."""
    _, _, lane = dest.partition(LANE_MARK)
    return lane


def kafka_topics(dests: Iterable[str]) -> list[str]:
    """The distinct Kafka topics of some destinations, sorted."""
    return sorted({kafka_topic(d) for d in dests})


def lane_key(lane: str, key: bytes) -> bytes:
    """A record's key under `lane` ('' : the key unchanged)."""
    return lane.encode("ascii") + LANE_END + key if lane else key


def split_lane(key: bytes) -> tuple[bytes, bytes]:
    """(lane, the key without it) of a record's key, the lane undecoded (an edge's readers
    are kept by it: one look per record of every lane); (b'', key) for a key without a lane."""
    at = key.find(LANE_END)
    return (b"", key) if at < 0 else (key[:at], key[at + 1:])


def split_key(key: bytes | None) -> tuple[str, bytes | None]:
    """(lane, the key without it) of a record's key; ('', key) for a key without a lane."""
    if key is None:
        return "", None
    lane, rest = split_lane(key)
    return lane.decode("ascii", "replace"), rest


__all__ = ["LANE_END", "LANE_MARK", "destination", "kafka_topic", "kafka_topics", "lane_key",
           "lane_of", "new_lane", "split_key", "split_lane"]
