"""What can go wrong, as exceptions a consumer can tell apart.

Every error of the client is an `XsgError`. A refusal of the gateway is an `HTTPError` carrying
the status and the gateway's one error body (`{"error": ..., ...}`), so a 403 says why and a 409
names the handle to release. A handle whose stream ended is not an error: reading it ends with
an `End` event (`xsg_client.events`). What is an error: a handle URL that is not one
(`BadHandle`), a connection that could not be made again within the time allowed
(`ConnectionLost`), rows that do not have the type the handle's schema says (`SchemaError`).

Messages never carry a handle id in full: the id is the handle's capability (whoever knows it
and holds the owner's token reads the stream), so it is shortened to its first characters.
"""
from __future__ import annotations

import json
import re
from typing import Any

HANDLE_ID_SHOWN = 6  # characters of a handle id a message shows
_XML_DECISION = re.compile(r"<(?:\w+:)?Decision>\s*(\w+)\s*</(?:\w+:)?Decision>")


def short_id(handle_id: str) -> str:
    """A handle id as messages show it: its first characters, then an ellipsis."""
    return handle_id[:HANDLE_ID_SHOWN] + "..." if len(handle_id) > HANDLE_ID_SHOWN else handle_id


class XsgError(Exception):
    """Any error of the xsg client."""


class BadHandle(XsgError, ValueError):
    """A handle reference that is neither a handle URL (`http(s)://HOST[:PORT]/handles/ID`)
    nor a handle id."""


class HTTPError(XsgError):
    """The gateway refused or failed: `status`, the gateway's message, and its whole error body
    (`body`: e.g. `handle` and `release` of a 409, the XACML response of a 403)."""

    def __init__(self, method: str, what: str, status: int, message: str,
                 body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{method} {what} failed: HTTP {status}: {message}")
        self.method = method
        self.what = what
        self.status = status
        self.message = message
        self.body: dict[str, Any] = body or {}


class Unreachable(XsgError):
    """No answer from the gateway at `url` (`cause`: refused, timed out, a failed TLS
    handshake, ...): the URL, the network or the gateway is wrong, nothing was refused."""

    def __init__(self, url: str, cause: str) -> None:
        super().__init__(f"cannot reach the gateway at {url}: {cause}")
        self.url = url
        self.cause = cause


class ConnectionLost(XsgError):
    """A handle stream could not be read again within `reconnect_timeout` seconds: the gateway
    stayed unreachable (or kept answering 429/5xx). The handle may well still be live; reading
    it again with `last_event_id` resumes where this reader stopped."""

    def __init__(self, message: str, last_event_id: int | None) -> None:
        super().__init__(message)
        self.last_event_id = last_event_id


class SchemaError(XsgError):
    """A value that does not have the type the handle's schema gives its column."""


class HandleEnded(XsgError):
    """Raised where a caller asked for it (the Spark source; `End.raise_for_end`): the handle's
    stream ended (`kind`: revoked, released, ended; or shutdown when not resumed)."""

    def __init__(self, kind: str, reason: str | None) -> None:
        super().__init__(end_message(kind) + (f": {reason}" if reason else ""))
        self.kind = kind
        self.reason = reason


_END_MESSAGES = {"revoked": "the handle was revoked", "released": "the handle was released",
                 "ended": "the handle ended",
                 "shutdown": "the gateway stopped (the handle stays live: it resumes when the "
                             "gateway starts again)"}


def end_message(kind: str) -> str:
    """How the end of a handle's stream is said (`kind`: revoked, released, ended, shutdown)."""
    return _END_MESSAGES.get(kind, f"the handle's stream ended ({kind})")


def error_message(text: str, fallback: str) -> tuple[str, dict[str, Any]]:
    """The gateway's message and body from an error response's text (`{"error": ...}`, with
    where the error is when the body says so); `fallback` when the body is not that."""
    try:
        body = json.loads(text)
    except ValueError:
        decision = _XML_DECISION.search(text)
        if decision is not None:  # a XACML response in XML (a denial of a request in XML)
            return f"the decision is {decision.group(1)}", {"decision": decision.group(1)}
        return (text.strip()[:500] or fallback), {}
    if isinstance(body, dict) and isinstance(body.get("Response"), list) and body["Response"]:
        result = body["Response"][0]  # a XACML response in JSON (a denial)
        if isinstance(result, dict):
            status = result.get("Status")
            said = status.get("StatusMessage") if isinstance(status, dict) else None
            return (f"the decision is {result.get('Decision')}" + (f": {said}" if said else ""),
                    {"decision": result.get("Decision"), **body})
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        where = ", ".join(f"{k} {body[k]}" for k in ("source", "element", "line", "position")
                          if body.get(k))
        return body["error"] + (f" ({where})" if where else ""), body
    return json.dumps(body)[:500], body if isinstance(body, dict) else {}


__all__ = ["XsgError", "BadHandle", "HTTPError", "Unreachable", "ConnectionLost", "SchemaError",
           "HandleEnded", "end_message", "error_message", "short_id"]
