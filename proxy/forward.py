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
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO
from urllib.parse import urlsplit

import httpx
import requests
from requests.adapters import HTTPAdapter
from werkzeug.datastructures import Headers

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


class NotForwardable(UpstreamError):
    """The client's request cannot be written upstream as HTTP (a 400: the client's fault)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 400)


# RFC 9110 section 5.1 (token) and 5.5 (field-value: visible characters and obs-text, with
# spaces and tabs inside only); a server in front of the proxy refuses others before they get
# here, a WSGI caller need not.
_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VCHAR = r"[\x21-\x7e\x80-\xff]"
_FIELD_VALUE = re.compile(rf"(?:{_VCHAR}(?:[\t\x20-\x7e\x80-\xff]*{_VCHAR})?)?")


def wire_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """The headers as bytes (Latin-1, as they arrived); NotForwardable names one HTTP forbids."""
    out = []
    for name, value in headers.items():
        if not _FIELD_NAME.fullmatch(name):
            raise NotForwardable(f"header name {name!r} is not an HTTP token")
        if not _FIELD_VALUE.fullmatch(value):
            raise NotForwardable(f"header {name} has a character HTTP does not allow in a "
                                 "field value (a control character, or a space at an end)")
        out.append((name.encode("latin-1"), value.encode("latin-1")))
    return out


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
    """The invalidation feed's session (proxy/feed.py; its URLs are the proxy's own, so no
    request target needs to pass verbatim). `verify`: True (the system's CAs) or a CA file."""
    session = requests.Session()
    session.trust_env = False  # proxy environment variables must not redirect gateway traffic
    session.verify = verify
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=pool_size, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class _SizedStream:
    """A request body of known length read in chunks, so `requests` sends a Content-Length."""

    def __init__(self, stream: IO[bytes], length: int) -> None:
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


# A request's body as it goes upstream: bytes, a sized stream, chunks as they come, or none
UpstreamBody = bytes | _SizedStream | Iterator[bytes] | None

def request_headers(incoming: Headers, client_addr: str | None, scheme: str, host: str
                    ) -> dict[str, str]:
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


def tls_verify(verify: bool | str) -> bool | ssl.SSLContext:
    """httpx's form of `verify`: a CA file becomes a context (httpx no longer takes a path)."""
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return verify


def make_client(pool_size: int = 32, verify: bool | str = True) -> httpx.Client:
    """The forwarder's pooled client. `verify`: True (the system's CAs) or a CA file."""
    return httpx.Client(trust_env=False, follow_redirects=False, verify=tls_verify(verify),
                        limits=httpx.Limits(max_connections=None,
                                            max_keepalive_connections=pool_size))


def is_chunked(resp: httpx.Response) -> bool:
    return "chunked" in resp.headers.get("Transfer-Encoding", "").lower()


def response_headers(resp: httpx.Response, keep_length: bool) -> list[tuple[str, str]]:
    """The upstream's headers minus hop-by-hop ones, as sent (latin-1, never re-decoded)."""
    out = []
    for raw_key, raw_value in resp.headers.raw:
        key, value = raw_key.decode("latin-1"), raw_value.decode("latin-1")
        low = key.lower()
        if low in HOP_BY_HOP and not (low == "content-length" and keep_length):
            continue
        out.append((key, value))
    return out


# After a gateway process refused a connection, it is passed over for this long (tried only
# when every process was refused): several processes of one gateway share the traffic, and a
# dead one costs the requests that find it one refused connection each, not a time-out.
DOWN_FOR = 2.0
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _refused(exc: Exception) -> bool:
    """Nothing of the request reached the gateway: any request may be sent to another."""
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))


class Forwarder:
    """Sends requests to the gateway through one pooled httpx client.

    The gateway may be several processes (`upstream` a list: a cluster, pep/cluster): each
    request goes to the next one in turn, and a request one of them refused (the connection
    itself failed: nothing was sent) goes to the next; a safe request (GET, HEAD, OPTIONS) also
    when the connection broke before an answer. Any process answers any request (it forwards
    what another serves), so which one is only a matter of load.

    The request target goes upstream byte for byte as the client sent it (behind the upstream's
    own base path): httpcore's `target` extension writes it on the request line as given. No
    URL object is built from it, because every URL layer normalises: `urljoin` resolves `..`
    and `.` segments, requests decodes percent-escapes of unreserved characters (`%2e%2e`
    became `..`, `%62` became `b`), urllib3 upper-cases escapes and re-quotes a lone `%`, httpx
    removes dot segments. The gateway then decodes the path once, exactly as it would had the
    client called it directly."""

    def __init__(self, upstream: str | list[str] | tuple[str, ...],
                 client: httpx.Client | None = None,
                 timeouts: Timeouts | None = None, buffer_limit: int = 1024 * 1024) -> None:
        upstreams = [upstream] if isinstance(upstream, str) else list(upstream)
        if not upstreams:
            raise ValueError("no upstream")
        self.upstream = upstreams[0].rstrip("/") + "/"
        parts = [urlsplit(u.rstrip("/") + "/") for u in upstreams]
        self.origins = [f"{p.scheme}://{p.netloc}" for p in parts]
        self.origin = self.origins[0]
        self.base_path = parts[0].path.rstrip("/")  # "" or e.g. "/gateway"
        if any(p.path.rstrip("/") != self.base_path for p in parts):
            raise ValueError("the upstreams of one gateway must share their base path")
        self._next = 0
        self._down: dict[str, float] = {}  # origin -> monotonic time it may be tried again
        self.client = client or make_client()
        self.timeouts = timeouts or Timeouts()
        self.buffer_limit = buffer_limit
        self._open: set[httpx.Response] = set()
        self._lock = threading.Lock()
        self.sent = 0
        self.failures = 0

    def target(self, path: str, query_string: bytes) -> bytes:
        """The upstream request target for a client's raw `path` (it starts with "/") and raw
        query: the same bytes, behind the upstream's base path."""
        target = (self.base_path + path).encode("latin-1")
        if query_string:
            target += b"?" + query_string
        return target

    def url_for(self, path: str, query_string: bytes) -> str:
        """The upstream URL, for log lines (what is sent is `target`, never re-parsed)."""
        return self.origin + self.target(path, query_string).decode("latin-1")

    def order(self) -> list[str]:
        """The origins to try for one request: the next in turn first, those that refused a
        connection lately last."""
        import time

        with self._lock:
            start = self._next
            self._next = (self._next + 1) % len(self.origins)
            now = time.monotonic()
            down = {o for o, until in self._down.items() if until > now}
        turn = self.origins[start:] + self.origins[:start]
        return [o for o in turn if o not in down] + [o for o in turn if o in down]

    def mark_down(self, origin: str) -> None:
        import time

        if len(self.origins) > 1:
            with self._lock:
                self._down[origin] = time.monotonic() + DOWN_FOR
            log.warning("gateway process %s refused a connection; the others take its share "
                        "for %g s", origin, DOWN_FOR)

    def send(self, method: str, path: str, query_string: bytes, headers: dict[str, str],
             body: UpstreamBody, streaming: bool = False) -> httpx.Response:
        """Forward one call; the response body is left unread (read it with `stream_body`,
        `read_limited`, or close it). With several upstreams, a call one of them refused goes
        to the next (the class docstring)."""
        t = self.timeouts
        read = t.stream_read if streaming else t.read
        out_headers = wire_headers(headers)
        content: bytes | Iterator[bytes] | None = None
        if isinstance(body, _SizedStream):
            out_headers.append((b"Content-Length", str(body.len).encode()))
            content = iter(body)
        else:
            content = body
        resendable = content is None or isinstance(content, bytes)
        origins = self.order()
        for attempt, origin in enumerate(origins):
            last = attempt == len(origins) - 1 or not resendable
            try:
                req = self.client.build_request(
                    method, origin + "/", headers=out_headers, content=content,
                    timeout=httpx.Timeout(connect=t.connect, read=read, write=t.read,
                                          pool=t.connect),
                    extensions={"target": self.target(path, query_string)})
                resp = self.client.send(req, stream=True)
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                if _refused(exc):
                    self.mark_down(origin)
                if not last and (_refused(exc) or (method in SAFE_METHODS and isinstance(
                        exc, httpx.TransportError))):
                    continue
                self._count(failed=True)
                if isinstance(exc, httpx.TimeoutException):
                    raise UpstreamError("gateway did not answer in time", 504) from None
                raise UpstreamError(f"gateway unreachable: {type(exc).__name__}", 502) \
                    from None
            self._count(failed=False)
            return resp
        raise UpstreamError("gateway unreachable", 502)  # pragma: no cover - loop returns

    def _count(self, failed: bool) -> None:
        with self._lock:
            if failed:
                self.failures += 1
            else:
                self.sent += 1

    def sized_body(self, stream: IO[bytes], length: int) -> _SizedStream:
        return _SizedStream(stream, length)

    def stream_body(self, resp: httpx.Response) -> Iterator[bytes]:
        """Pass the body through; closing the generator (client gone) closes the upstream.

        When the upstream breaks off (error, or silent past `stream_read`), the consumer's
        connection is cut too, without the chunked body's last chunk: the consumer sees an
        interrupted stream, not one that ended, and resumes with Last-Event-ID."""
        with self._lock:
            self._open.add(resp)
        try:
            yield from resp.iter_raw()
        except Exception as exc:  # noqa: BLE001 - the client already has the status line
            log.info("upstream stream %s broke off: %s", loggable_url_path(self.logged_url(resp)),
                     type(exc).__name__)
            raise ConnectionAbortedError("the gateway's stream broke off") from None
        finally:
            with self._lock:
                self._open.discard(resp)
            resp.close()

    def logged_url(self, resp: httpx.Response) -> str:
        target = resp.request.extensions.get("target", b"/")
        origin = f"{resp.request.url.scheme}://{resp.request.url.netloc.decode('ascii')}"
        return origin + bytes(target).decode("latin-1")

    @staticmethod
    def read_limited(resp: httpx.Response, limit: int) -> tuple[bytes, bool]:
        """Up to `limit` bytes of the body, and whether that is all of it."""
        parts: list[bytes] = []
        size = 0
        for chunk in resp.iter_raw():
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
            except Exception:  # noqa: BLE001 - closing must go on
                pass
        self.client.close()
