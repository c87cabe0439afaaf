"""The invalidation protocol between the gateway and caching proxies: the event, its ids, its
signature. Both sides import this module and nothing else of each other.

An event says which handle answers died (`handle-revoked`, `handle-released`, `handle-ended`)
or that a policy changed (`policy-changed`). A policy change names in `streams` the streams
whose decisions it can alter (the policy's target scope before and after the change,
`pdp.events.PolicyChange.resources`): a proxy drops the answers on those streams. `streams`
null (absent, as from a gateway that does not say) means any stream: the proxy flushes. Event
ids grow by one per event within an *epoch*, a random string chosen when the gateway's hub
starts, so a proxy can tell "the gateway restarted and its counter began again" from "I missed
nothing"; on the wire an id is `<epoch>.<n>`.

Signature of a webhook delivery: `X-XSG-Signature: sha256=<hex HMAC-SHA256(secret, timestamp +
"." + body)>`, with the timestamp (Unix seconds) in `X-XSG-Timestamp`. Receivers reject
signatures older than a window; a replayed event can only make a proxy drop entries, never keep
one.
"""
from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from typing import Any

from common.numbers import INT64_MAX, NumberError, parse_int

KINDS = ("handle-revoked", "handle-released", "handle-ended", "policy-changed")
SIGNATURE_HEADER = "X-XSG-Signature"
TIMESTAMP_HEADER = "X-XSG-Timestamp"
EVENT_ID_HEADER = "X-XSG-Event-Id"
DEFAULT_SIGNATURE_WINDOW = 300.0
FEED_PATH = "/events/invalidations"
MAX_HANDLE_IDS = 10_000
MAX_EVENT_NUMBER = INT64_MAX
MAX_TIMESTAMP = 10 ** 12 - 1  # Unix seconds: twelve digits reach past the year 30000


class InvalidEventError(ValueError):
    """An event document that does not follow the invalidation protocol."""


@dataclass(frozen=True)
class InvalidationEvent:
    """One invalidation; `id` grows by one per event within `epoch`."""

    id: int
    epoch: str
    kind: str
    handle_ids: tuple[str, ...] = ()
    subject: str | None = None
    stream: str | None = None
    policy_id: str | None = None
    time: float = 0.0
    # policy-changed: the streams whose decisions the change can alter; None: any stream
    streams: tuple[str, ...] | None = None

    @property
    def sse_id(self) -> str:
        return format_event_id(self.epoch, self.id)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "epoch": self.epoch, "kind": self.kind,
                "handle_ids": list(self.handle_ids), "subject": self.subject,
                "stream": self.stream, "policy_id": self.policy_id, "time": self.time,
                "streams": None if self.streams is None else list(self.streams)}

    @classmethod
    def from_json(cls, doc: Any) -> InvalidationEvent:
        """Validate a received event document; raises InvalidEventError saying which field."""
        if not isinstance(doc, dict):
            raise InvalidEventError("event must be a JSON object")
        ident, epoch, kind = doc.get("id"), doc.get("epoch"), doc.get("kind")
        if not isinstance(ident, int) or isinstance(ident, bool) or ident < 1:
            raise InvalidEventError("event.id must be a positive integer")
        if not isinstance(epoch, str) or not epoch or len(epoch) > 64:
            raise InvalidEventError("event.epoch must be a non-empty string")
        if kind not in KINDS:
            raise InvalidEventError(f"event.kind must be one of {', '.join(KINDS)}, got {kind!r}")
        handle_ids = doc.get("handle_ids", [])
        if (not isinstance(handle_ids, list) or len(handle_ids) > MAX_HANDLE_IDS
                or not all(isinstance(h, str) and h for h in handle_ids)):
            raise InvalidEventError("event.handle_ids must be a list of non-empty strings")
        for name in ("subject", "stream", "policy_id"):
            if doc.get(name) is not None and not isinstance(doc.get(name), str):
                raise InvalidEventError(f"event.{name} must be a string or null")
        stamp = doc.get("time", 0.0)
        if not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
            raise InvalidEventError("event.time must be a number")
        streams = doc.get("streams")
        if streams is not None and (
                not isinstance(streams, list) or len(streams) > MAX_HANDLE_IDS
                or not all(isinstance(s, str) and s for s in streams)):
            raise InvalidEventError("event.streams must be null or a list of non-empty strings")
        return cls(ident, epoch, kind, tuple(handle_ids), doc.get("subject"), doc.get("stream"),
                   doc.get("policy_id"), float(stamp),
                   None if streams is None else tuple(streams))


def format_event_id(epoch: str, ident: int) -> str:
    return f"{epoch}.{ident}"


def parse_event_id(text: str | None) -> tuple[str, int] | None:
    """`<epoch>.<n>` -> (epoch, n); None for anything else (treated as "no position")."""
    if not text:
        return None
    epoch, sep, num = text.strip().rpartition(".")
    if not sep or not epoch:
        return None
    try:
        return epoch, parse_int(num, "event number", high=MAX_EVENT_NUMBER)
    except NumberError:
        return None


def _key(secret: str | bytes) -> bytes:
    return secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)


def sign(secret: str | bytes, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """Headers that authenticate `body` for a receiver that knows `secret`."""
    stamp = str(int(time.time()) if timestamp is None else int(timestamp))
    mac = hmac.new(_key(secret), stamp.encode("ascii") + b"." + body, hashlib.sha256).hexdigest()
    return {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: "sha256=" + mac}


def verify(secret: str | bytes, body: bytes, signature: str | None, timestamp: str | None,
           window: float = DEFAULT_SIGNATURE_WINDOW, now: float | None = None) -> str | None:
    """None when the signature is good; otherwise the reason it is refused."""
    if not signature or not timestamp:
        return "missing signature or timestamp header"
    try:
        stamp = parse_int(timestamp, TIMESTAMP_HEADER, high=MAX_TIMESTAMP)
    except NumberError:
        return "malformed timestamp"
    now = time.time() if now is None else now
    if abs(now - stamp) > window:
        return "timestamp outside the accepted window (clock skew or replay)"
    if not signature.startswith("sha256="):
        return "unsupported signature scheme"
    expected = sign(secret, body, stamp)[SIGNATURE_HEADER]
    if not hmac.compare_digest(expected.encode("ascii"), signature.encode("ascii", "replace")):
        return "bad signature"
    return None


__all__ = ["KINDS", "SIGNATURE_HEADER", "TIMESTAMP_HEADER", "EVENT_ID_HEADER",
           "DEFAULT_SIGNATURE_WINDOW", "FEED_PATH", "MAX_HANDLE_IDS", "MAX_EVENT_NUMBER",
           "InvalidEventError",
           "InvalidationEvent", "format_event_id", "parse_event_id", "sign", "verify"]
