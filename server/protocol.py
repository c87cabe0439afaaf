"""The HTTP/1.1 wire, strict: uvicorn's httptools protocol with the checks it leaves out.

uvicorn parses requests with llhttp (httptools), which already refuses malformed chunk sizes
(`0x28`, `+28`, `0_2f5`, `-0`), bad chunk extensions and trailers, bare CR, bare LF and NUL in
header lines, `Transfer-Encoding` with `Content-Length`, two `Content-Length`s, obs-fold, and
control characters in the target. What it lets through, this subclass refuses with 400 (the one
JSON error body, `Connection: close`), before the request reaches the application:

- `Host`: exactly one on HTTP/1.1 (at most one on 1.0), a valid `host[:port]` without userinfo.
  Apps build URLs from it (the gateway's handle URIs), so it must be a single, validated value.
- The target: origin-form (`/path?query`); absolute-form only with `http` or `https` and a valid
  authority, which then replaces `Host` (RFC 9112 3.2.2); `*` only with OPTIONS (answered by the
  application layer); nothing but visible ASCII.
- `Transfer-Encoding` on HTTP/1.0 (RFC 9112 6.1: the framing is faulty), or any coding but a
  lone `chunked` (then the body's end cannot be found: 400 rather than 501, since nothing after
  it can be trusted); two `Connection` headers (only one would count).
- HTTP versions other than 1.0 and 1.1: 505.

After a refusal nothing more is read from the connection: a request smuggled behind (in a header
value, in a body whose framing was refused, pipelined after it) is never parsed, let alone run.
Requests before it on the same connection are answered first.

Connections and deadlines (the old server's promises, kept): over `max_connections` open at
once, a new connection is answered 429 with `Retry-After` and closed; a connection idle for
`idle_timeout` before its first request or between requests is closed; a request head must be
complete `header_timeout` seconds after its first byte (else 408); a head over 64 KiB or with
more than 100 header lines is refused (431). Request bodies (minimum rate) and response writes
(`write_timeout`) are bounded where they are read and written (server/bridge.py,
server/streaming.py).
"""
from __future__ import annotations

import asyncio
import collections
import json
import re
from dataclasses import dataclass, field
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from server.cycle import coalescing
from server.streaming import CONNECTION

MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
REFUSED_LINGER = 2.0  # seconds a refused connection may still send before it is closed

_REASONS = {400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large",
            429: "Too Many Requests", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 505: "HTTP Version Not Supported"}
# host = IP-literal / IPv4address / reg-name (RFC 3986 3.2.2), then an optional port; a reg-name
# of unreserved characters only (the sub-delims and percent-encodings RFC 3986 also allows have
# no place in a name URLs are built from: `a,b` is what two joined Host headers look like)
_HOST = re.compile(rb"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~]+)(?::([0-9]{1,5}))?$")
_VISIBLE = re.compile(rb"^[\x21-\x7e]+$")


def error_body(status: int, message: str) -> bytes:
    """A JSON error body (`error`, `status`) for answers the server gives itself, outside any
    application."""
    return json.dumps({"error": message, "status": status}).encode()


def canned_response(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()
                    ) -> bytes:
    """A complete response with the one error body; the connection closes after it."""
    body = error_body(status, message)
    head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
            "Content-Type: application/json", f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in headers), "Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def valid_host(value: bytes) -> bool:
    match = _HOST.match(value)
    if match is None:
        return False
    port = match.group(1)
    return port is None or int(port) <= 65535


@dataclass
class Limits:
    """What the protocol enforces; one instance per server."""

    max_connections: int = 4096
    idle_timeout: float = 20.0
    header_timeout: float = 10.0
    retry_after: int = 2
    busy_message: str | None = None
    stats: collections.Counter[str] = field(default_factory=collections.Counter)

    def busy(self) -> bytes:
        message = self.busy_message or (
            f"too many connections: this server serves at most {self.max_connections} at once;"
            f" retry in {self.retry_after} s")
        return canned_response(429, message, (("Retry-After", str(self.retry_after)),))


class Refused(Exception):
    """Raised inside a parser callback: the request is answered `status` and the connection
    closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class StrictHttpProtocol(HttpToolsProtocol):
    """See the module docstring; `limits` is set on a subclass per server (`protocol_for`)."""

    limits: Limits = Limits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refusing = False  # answered 429 at the door
        self.broken = False  # a request was refused: nothing more is read
        self.streams = 0  # responses on this connection written by server.streaming
        self._in_head = False
        self._head_bytes = 0
        self._header_count = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refusal: Refused | None = None

    # -- the connection ---------------------------------------------------------------------------

    # uvicorn's signature: it narrows asyncio's BaseTransport to Transport (the override mypy
    # reports is uvicorn's, kept here)
    def connection_made(self, transport: asyncio.Transport  # type: ignore[override]  # above
                        ) -> None:
        super().connection_made(transport)
        limits = self.limits
        limits.stats["accepted"] += 1
        if len(self.connections) > limits.max_connections:
            self._refuse_at_the_door()
            return
        # idle before the first request, as between requests (uvicorn's keep-alive timer)
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def _refuse_at_the_door(self) -> None:
        """429 from here, then read (and drop) what the client sends until it closes or
        `REFUSED_LINGER` passes: closing with unread data would reset the connection and lose
        the answer. The connection does not count against the limit meanwhile."""
        self.limits.stats["refused"] += 1
        self.refusing = True
        self.connections.discard(self)
        self.transport.write(self.limits.busy())
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(REFUSED_LINGER, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refusing or self.broken:
            return
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # An upgrade (h2c, websocket) is not offered: the request is answered as HTTP/1.1
            # and the connection closes after it; whatever follows is not read.
            self.broken = True
            if self.cycle is not None:
                self.cycle.keep_alive = False
            return
        except httptools.HttpParserError as exc:
            refusal = self._refusal or Refused(400, f"malformed request: {_reason(exc)}")
            self._refuse(refusal)
            return
        if self._in_head and self._head_bytes > MAX_HEAD:
            self._refuse(Refused(431, "request head over 64 KiB"))
            return
        if not self._in_head and self._idle():
            # bytes that started no request (blank lines between requests): still idle
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def _idle(self) -> bool:
        return (self.timeout_keep_alive_task is None and not self.pipeline
                and (self.cycle is None or self.cycle.response_complete))

    def _refuse(self, refusal: Refused) -> None:
        """Answer `refusal` and close; requests before it on the connection are answered first
        (their responses are in progress or queued), nothing after it is read."""
        self.broken = True
        self._cancel_head_timer()
        self.limits.stats[f"answered_{refusal.status}"] += 1
        self.flow.pause_reading()
        cycle = self.cycle
        if self._in_head and cycle is not None and not cycle.response_complete:
            # an earlier request is still being answered: the connection closes after it
            cycle.keep_alive = False
            return
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the refused request itself: its body never completes
            cycle.message_event.set()
        self.transport.write(canned_response(refusal.status, refusal.message))
        self.transport.close()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._in_head and not self.broken and not self.transport.is_closing():
            self._refuse(Refused(408, f"request head not received within "
                                      f"{self.limits.header_timeout:g} s"))

    # -- parser callbacks -------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # uvicorn types extensions as dicts; this one is the connection itself (read by bridge)
        self.scope["extensions"] = {CONNECTION: self}  # type: ignore[dict-item]  # see above
        self._in_head = True
        self._head_bytes = 0
        self._header_count = 0
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_too_slow)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._head_bytes += len(url)
        if len(self.url) > MAX_HEAD:
            raise self._stop(Refused(431, "request head over 64 KiB"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._head_bytes += len(name) + len(value) + 4
        if self._header_count > MAX_HEADERS:
            raise self._stop(Refused(431, f"more than {MAX_HEADERS} request headers"))
        if self._head_bytes > MAX_HEAD:
            raise self._stop(Refused(431, "request head over 64 KiB"))
        super().on_header(name, value)

    def _stop(self, refusal: Refused) -> Refused:
        """Remember why parsing stops (httptools re-raises a callback's exception as its own)."""
        self._refusal = refusal
        return refusal

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        try:
            self._check_head()
        except Refused as refusal:
            raise self._stop(refusal) from None  # still in the head: see _refuse
        self._in_head = False
        super().on_headers_complete()
        coalescing(self.cycle)  # a sized answer's head and body in one write (server/cycle.py)

    def _check_head(self) -> None:
        version = self.parser.get_http_version()
        if version not in ("1.0", "1.1"):
            raise Refused(505, f"HTTP/{version} is not supported (HTTP/1.1 and 1.0 are)")
        method = self.parser.get_method()
        target = self.url
        if not _VISIBLE.match(target):
            raise Refused(400, "the request target holds characters other than visible ASCII")
        hosts = [v for n, v in self.headers if n == b"host"]
        if len(hosts) > 1:
            raise Refused(400, "more than one Host header")
        if not hosts and version == "1.1":
            raise Refused(400, "HTTP/1.1 requests need a Host header")
        if hosts and not valid_host(hosts[0]):
            raise Refused(400, "the Host header is not a valid host[:port]")
        if target[:1] == b"/":
            pass
        elif target == b"*":
            if method != b"OPTIONS":
                raise Refused(400, "the target * is for OPTIONS only")
        else:
            self._absolute_form(target)
        names = [n for n, _ in self.headers]
        if names.count(b"connection") > 1:
            raise Refused(400, "more than one Connection header")
        if b"transfer-encoding" in names:
            if version == "1.0":
                raise Refused(400, "Transfer-Encoding is not allowed in an HTTP/1.0 request")
            codings = [v for n, v in self.headers if n == b"transfer-encoding"]
            if len(codings) != 1 or codings[0].strip().lower() != b"chunked":
                raise Refused(400, "only the chunked transfer coding is supported")

    def _absolute_form(self, target: bytes) -> None:
        """`http(s)://authority/path?query`: its authority is the request's host."""
        scheme, sep, rest = target.partition(b"://")
        if not sep or scheme.lower() not in (b"http", b"https"):
            raise Refused(400, "the request target must be a path (/...), or an absolute "
                               "http(s) URI")
        cut = min([i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0] or [len(rest)])
        authority, path = rest[:cut], rest[cut:]
        if b"@" in authority or not authority or not valid_host(authority):
            raise Refused(400, "the authority of the request target is not a valid host[:port]")
        if b"#" in path:
            raise Refused(400, "a request target has no fragment")
        self.url = path if path[:1] == b"/" else b"/" + path
        self.headers[:] = [(n, v) for n, v in self.headers if n != b"host"]
        self.headers.append((b"host", authority))


def _reason(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text[:200]


def protocol_for(limits: Limits) -> type[StrictHttpProtocol]:
    """A protocol class bound to one server's limits (uvicorn instantiates it per connection)."""
    return type("XsgHttpProtocol", (StrictHttpProtocol,), {"limits": limits})


__all__ = ["StrictHttpProtocol", "Limits", "Refused", "protocol_for", "error_body",
           "canned_response", "valid_host", "MAX_HEAD", "MAX_HEADERS"]
