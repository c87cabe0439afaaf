"""Forwarding to the gateway over pooled connections, with responses streamed through.

Nothing here reads a whole response unless asked to: a handle's SSE or NDJSON stream goes from the
gateway to the consumer chunk by chunk as it arrives (chunked transfer is re-chunked by the server,
bytes are passed without decoding so Content-Encoding stays valid). Request bodies up to
`buffer_limit` are read and sent with a Content-Length; larger ones are streamed with their length.
"""
from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
from requests.adapters import HTTPAdapter

log = logging.getLogger(__name__)

_HANDLE_PATH = re.compile(r"/handles/([^/]+)")


def loggable_url_path(url: str) -> str:
    """An upstream URL as a log line may show it: the path, with a handle's id (a capability)
    replaced by its reference (the first 16 hex digits of its SHA-256, as the gateway's logs
    and audit name it) and no query string (a read token travels there)."""
    path = urlsplit(url).path
    return _HANDLE_PATH.sub(lambda m: "/handles/ref:" + hashlib.sha256(
        m.group(1).encode("utf-8")).hexdigest()[:16], path)

# RFC 9110 section 7.6.1, plus headers that the HTTP stack sets for each hop itself.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length", "expect"})
# What the proxy did with a request, on every answer it relays: hit, miss or bypass (the Flask
# routes of proxy/app.py and the native handle relay of proxy/relay.py both set it).
CACHE_HEADER = "X-XSG-Cache"
_CHUNK = 64 * 1024


class UpstreamError(Exception):
    """The gateway could not be reached or did not answer in time."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Timeouts:
    connect: float = 5.0
    read: float = 60.0  # ordinary calls
    # A handle stream is never silent for long: the gateway sends a heartbeat every 15 s (its
    # default) when it has nothing else. Nothing for this long means the gateway or the path to
    # it is gone: the relay is cut (the consumer reconnects with Last-Event-ID) rather than
    # holding the consumer's connection and a proxy thread forever. None: wait forever.
    stream_read: float | None = 60.0


def make_session(pool_size: int = 32, verify: bool | str = True) -> requests.Session:
    """`verify`: True (the system's CAs) or a CA file for a gateway on HTTPS."""
    session = requests.Session()
    session.trust_env = False  # proxy environment variables must not redirect gateway traffic
    session.verify = verify
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=pool_size, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class _SizedStream:
    """A request body of known length read in chunks, so `requests` sends a Content-Length."""

    def __init__(self, stream: Any, length: int) -> None:
        self._stream = stream
        self._left = length
        self.len = length

    def __len__(self) -> int:
        return self.len

    def read(self, size: int = _CHUNK) -> bytes:
        if self._left <= 0:
            return b""
        data = self._stream.read(min(size if size and size > 0 else _CHUNK, self._left))
        self._left -= len(data)
        return data

    def __iter__(self) -> Iterator[bytes]:
        while True:
            data = self.read(_CHUNK)
            if not data:
                return
            yield data


def iter_raw(resp: requests.Response) -> Iterator[bytes]:
    """The response body as it arrives, undecoded, without waiting for full buffers."""
    raw = resp.raw
    if raw.chunked and raw.supports_chunked_reads():
        yield from raw.read_chunked(_CHUNK, decode_content=False)
        return
    while True:
        data = raw.read1(_CHUNK, decode_content=False)
        if not data:
            return
        yield data


def request_headers(incoming: Any, client_addr: str | None, scheme: str, host: str) -> dict[str, str]:
    headers = {k: v for k, v in incoming.items() if k.lower() not in HOP_BY_HOP}
    connection = incoming.get("Connection", "")
    for token in connection.split(","):
        headers.pop(token.strip(), None)
    prior = incoming.get("X-Forwarded-For")
    if client_addr:
        headers["X-Forwarded-For"] = f"{prior}, {client_addr}" if prior else client_addr
    # What this proxy saw, not what the client claims: the gateway may build URLs from them.
    headers["X-Forwarded-Proto"] = scheme
    headers["X-Forwarded-Host"] = host
    headers["Accept-Encoding"] = incoming.get("Accept-Encoding", "identity")
    return headers


def response_headers(resp: requests.Response, keep_length: bool) -> list[tuple[str, str]]:
    out = []
    for key, value in resp.raw.headers.items():
        low = key.lower()
        if low in HOP_BY_HOP and not (low == "content-length" and keep_length):
            continue
        out.append((key, value))
    return out


class Forwarder:
    """Sends requests to the gateway through one pooled session."""

    def __init__(self, upstream: str, session: requests.Session | None = None,
                 timeouts: Timeouts | None = None, buffer_limit: int = 1024 * 1024) -> None:
        self.upstream = upstream.rstrip("/") + "/"
        self.session = session or make_session()
        self.timeouts = timeouts or Timeouts()
        self.buffer_limit = buffer_limit
        self._open: set[requests.Response] = set()
        self._lock = threading.Lock()
        self.sent = 0
        self.failures = 0

    def url_for(self, path: str, query_string: bytes) -> str:
        url = urljoin(self.upstream, path.lstrip("/"))
        if query_string:
            url += "?" + query_string.decode("latin-1")
        return url

    def send(self, method: str, path: str, query_string: bytes, headers: dict[str, str],
             body: bytes | _SizedStream | None, streaming: bool = False) -> requests.Response:
        """Forward one call; the response body is left unread (stream=True)."""
        read = self.timeouts.stream_read if streaming else self.timeouts.read
        try:
            resp = self.session.request(method, self.url_for(path, query_string), data=body,
                                        headers=headers, stream=True, allow_redirects=False,
                                        timeout=(self.timeouts.connect, read))
        except requests.Timeout:
            self._count(failed=True)
            raise UpstreamError("gateway did not answer in time", 504) from None
        except requests.RequestException as exc:
            self._count(failed=True)
            raise UpstreamError(f"gateway unreachable: {type(exc).__name__}", 502) from None
        self._count(failed=False)
        return resp

    def _count(self, failed: bool) -> None:
        with self._lock:
            if failed:
                self.failures += 1
            else:
                self.sent += 1

    def sized_body(self, stream: Any, length: int) -> _SizedStream:
        return _SizedStream(stream, length)

    def stream_body(self, resp: requests.Response) -> Iterator[bytes]:
        """Pass the body through; closing the generator (client gone) closes the upstream.

        When the upstream breaks off (error, or silent past `stream_read`), the consumer's
        connection is cut too, without the chunked body's last chunk: the consumer sees an
        interrupted stream, not one that ended, and resumes with Last-Event-ID."""
        with self._lock:
            self._open.add(resp)
        try:
            yield from iter_raw(resp)
        except Exception as exc:  # noqa: BLE001 - the client already has the status line
            log.info("upstream stream %s broke off: %s", loggable_url_path(resp.url),
                     type(exc).__name__)
            raise ConnectionAbortedError("the gateway's stream broke off") from None
        finally:
            with self._lock:
                self._open.discard(resp)
            resp.close()

    @staticmethod
    def read_limited(resp: requests.Response, limit: int) -> tuple[bytes, bool]:
        """Up to `limit` bytes of the body, and whether that is all of it."""
        parts: list[bytes] = []
        size = 0
        for chunk in iter_raw(resp):
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                return b"".join(parts), False
        return b"".join(parts), True

    def close(self) -> None:
        """Cut open streams (so server threads can finish) and the pool."""
        with self._lock:
            open_now = list(self._open)
            self._open.clear()
        for resp in open_now:
            try:
                resp.close()
            except Exception:  # noqa: BLE001
                pass
        self.session.close()
