"""How a handle is named where its id must not appear: logs, the audit trail, counters.

A handle's id is its capability (whoever holds it reads the stream), so it is never written
anywhere but to its owner. `handle_ref` is the first 16 hex digits of the id's SHA-256: stable,
so a line can be matched with the handle, and computable by the owner from the id it holds
(`GET /handles` gives both), but it gives the id to nobody.
"""
from __future__ import annotations

import hashlib


def handle_ref(handle_id: str) -> str:
    """How logs and the audit name a handle: a short hash, not the capability itself."""
    return hashlib.sha256(handle_id.encode("utf-8")).hexdigest()[:16]


MAX_HANDLE_ID = 200  # characters: no handle id is longer (`secrets.token_urlsafe(32)`: 43)


def possible_handle_id(text: object) -> bool:
    """Whether `text` may be a handle's id at all. Anything else is no handle, answered as one
    that does not exist without asking a store: PostgreSQL refuses a NUL byte with an error
    (a 500 on the gateway, a 503 blaming the store on an edge), which is no answer."""
    return isinstance(text, str) and 0 < len(text) <= MAX_HANDLE_ID and "\x00" not in text


__all__ = ["MAX_HANDLE_ID", "handle_ref", "possible_handle_id"]
