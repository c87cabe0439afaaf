"""What reading a handle gives: rows, and the events around them that a consumer may act on.

The gateway's NDJSON (`pep/http/handles.py`) is one JSON object per line:
`{"id": n, "row": {...}}` for a row; `{"id": n, "event": "gap", "lost": k, "resume_from": m,
"reason": ...}` when rows were dropped (k is null when a gateway restart lost them); a notice
`{"id": n, "event": kind, ...}` (`stalled`: the stream's query makes no progress; `resumed`: it
runs again); `{"event": "heartbeat"}` while nothing else comes; and last a final event
`{"id": n, "event": "revoked" | "released" | "ended" | "shutdown", "reason": ...}`. Every event
with an id is a place to resume from (`Last-Event-ID`).

The reader adds two events of its own: `Disconnected` (the connection broke or the gateway
stopped, a new one is tried after `retry_in` seconds) and `Reconnected` (reading goes on after
`last_event_id`). Heartbeats are not given to the caller.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from xsg_client.errors import HandleEnded, SchemaError, end_message
from xsg_client.schema import typed_row

FINAL_KINDS = ("revoked", "released", "ended", "shutdown")


class Row(NamedTuple):
    """A result row: `values` maps the schema's columns to typed values. (A named tuple, not a
    dataclass: one is made per row, and a tuple is the cheapest object to make.)"""

    id: int
    values: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Gap:
    """Rows this reader will never get: `lost` of them (None: unknown, a gateway restart lost
    what it held in memory), dropped before it read them; reading goes on at `resume_from`."""

    id: int
    lost: int | None
    resume_from: int | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class Notice:
    """A notice of the gateway that is not a row (`kind`: `stalled`, `resumed`, ...); the
    handle stays live. `data` is the notice's JSON object without `id` and `event`."""

    id: int
    kind: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The connection ended before the handle's final event (`cause` says how: a network error,
    the gateway stopping, a 503 while it restores the handle); the next attempt, the
    `attempt`-th in a row, comes in `retry_in` seconds."""

    cause: str
    attempt: int
    retry_in: float
    last_event_id: int | None


@dataclass(frozen=True, slots=True)
class Reconnected:
    """Reading goes on over a new connection, after `last_event_id`, `outage` seconds after the
    old one was lost."""

    last_event_id: int | None
    outage: float


@dataclass(frozen=True, slots=True)
class End:
    """The handle's stream is over: `kind` revoked (the policy no longer allows it), released
    (its owner let it go), ended (the gateway could not keep it, or its privacy budget is
    spent) or shutdown (the gateway stopped, and this reader was asked not to resume);
    `reason` in the gateway's words. `id` is None when the handle had ended before this reader
    connected (the gateway answered 410 Gone)."""

    id: int | None
    kind: str
    reason: str | None

    def __str__(self) -> str:
        return end_message(self.kind) + (f": {self.reason}" if self.reason else "")

    def raise_for_end(self) -> None:
        """Raise `HandleEnded` (for callers that treat the end of a stream as a failure)."""
        raise HandleEnded(self.kind, self.reason)


Event = Row | Gap | Notice | Disconnected | Reconnected | End


def parse_line(line: bytes | str, timestamps: tuple[str, ...]) -> Row | Gap | Notice | End | None:
    """One NDJSON line of the gateway as an event (None for a heartbeat or an empty line)."""
    if not line or line.isspace():
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        raise SchemaError(f"the gateway sent a line that is not JSON: {line[:200]!r}") from None
    row = obj.get("row") if isinstance(obj, dict) else None
    if row is not None:
        return Row(obj["id"], typed_row(row, timestamps) if timestamps else row)
    return parse_event(obj)


def parse_event(obj: Any) -> Gap | Notice | End | None:
    """A non-row NDJSON object as an event (None for a heartbeat)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("event"), str):
        raise SchemaError(f"the gateway sent an object that is no event: {str(obj)[:200]}")
    kind = obj["event"]
    if kind == "heartbeat":
        return None
    event_id = obj.get("id")
    if not isinstance(event_id, int):
        raise SchemaError(f"the gateway sent a {kind!r} event without an id")
    if kind == "gap":
        return Gap(event_id, obj.get("lost"), obj.get("resume_from"), obj.get("reason"))
    if kind in FINAL_KINDS:
        return End(event_id, kind, obj.get("reason"))
    return Notice(event_id, kind, {k: v for k, v in obj.items() if k not in ("id", "event")})


__all__ = ["Row", "Gap", "Notice", "Disconnected", "Reconnected", "End", "Event",
           "FINAL_KINDS", "parse_line", "parse_event"]
