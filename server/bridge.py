"""The ASGI application in front of a WSGI (Flask) app: bodies read and responses written by the
event loop, routes run on a thread pool, streams handed to the loop.

Why a bridge of our own rather than a2wsgi: a2wsgi runs the WSGI app on a thread from the
request's first byte and lets it read the body through the loop, so a body trickled one byte at
a time holds a thread for as long as the client likes; a2wsgi also iterates every response on
that thread, so a long-lived stream (an event feed, a reader following new data) would hold one
for its whole life, and it has no way for a route to hand a stream to the loop. Here:

- The request body is read on the event loop, whole, before any route sees it: at most `max_body`
  bytes (more: 413), and after a grace of `body_grace` seconds it must have averaged
  `min_body_rate` bytes/s (else 408 and the connection closes). A client that disconnects or
  whose framing is refused (server/protocol.py) mid-body gets nothing run.
- The route runs on the pool (server/pool.py) with the body as `wsgi.input`. A response with a
  Content-Length up to 1 MiB is collected on that thread and written by the loop; other bodies
  are pulled chunk by chunk, each chunk on the pool, each write bounded by `write_timeout`.
- A route that calls `environ[STREAM_BODY](body)` gets its body written by the loop
  (server/streaming.py): no thread for as long as the stream lasts. The WSGI response is closed
  when the stream ends, and the callables a route put in `environ[ON_STREAM_END]` (an access
  log's line) run then.
- `native` ASGI routes (an app's own, e.g. a relay of streams) are tried first, and an app's
  fast path (`FastPath`: one POST route the loop answers itself for the requests it can) before
  the WSGI app.
- A response with a Content-Length leaves in one write, its head with its body's first part
  (server/cycle.py): one system call and one TCP segment for a small answer, not two.
- The WSGI environ: PATH_INFO is the target's path percent-decoded once, except `%2F` (a quoted
  slash stays quoted, as before); header names with `_` are dropped (`X_Forwarded_For` would pass
  for `X-Forwarded-For`); a chunked body arrives with its CONTENT_LENGTH. The app's own `Date`
  header is dropped (the server sends one) and hop-by-hop headers are the server's business.
"""
from __future__ import annotations

import asyncio
import collections
import io
import logging
import re
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, Protocol
from urllib.parse import unquote_to_bytes

from server.pool import WorkerPool
from server.protocol import error_body
from server.streaming import (
    ON_STREAM_END,
    STREAM_BODY,
    STREAMED,
    Message,
    Receive,
    Scope,
    Send,
    StreamBody,
    drive,
    writable,
)

log = logging.getLogger(__name__)

CLOSERS = 2  # pool tasks closing ended responses at once (`Bridge._close_later`)

COLLECT_LIMIT = 1024 * 1024  # a response with a Content-Length up to this is collected at once
FAST_PATH_TRIED = "xsg.fast_path_tried"  # environ: the fast path looked at this request already
FAST_PATH_EXTENSION = "xsg.fast_path"  # a Flask app's extension holding its FastPath
NATIVE_ROUTES = "xsg.native_routes"  # a Flask app's extension listing its NativeRoutes
BRIDGE = "xsg.bridge"  # scope["extensions"] key of the Bridge (its write_timeout, its counters)
_QUOTED_SLASH = re.compile(rb"%2[fF]")
_DROPPED = frozenset({b"date", b"connection", b"transfer-encoding", b"keep-alive", b"server"})


# a WSGI application (PEP 3333): environ, start_response -> an iterable of bytes
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class NativeRoute(Protocol):
    """An ASGI handler the bridge tries before the WSGI app."""

    def matches(self, scope: Scope) -> bool: ...

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None: ...


class FastPath(Protocol):
    """One POST route answered on the event loop, without the WSGI app, for the requests it
    can answer at once (a frequent, small call whose framework share would cost more than its
    work). `answer` gets the request's parts and gives the body and media type of a 200, or
    None: the WSGI app then answers the request, with `environ[FAST_PATH_TRIED]` set. A
    request with a query string always goes to the app."""

    @property
    def path(self) -> str:
        """The path it answers, for POST."""

    def blocks(self, authorization: str | None) -> bool:
        """Whether answering may wait (e.g. on the network to authenticate): `answer` then
        runs on the pool, not on the loop."""

    def answer(self, authorization: str | None, content_type: str, accept: str | None,
               body: bytes, remote: str | None) -> tuple[bytes, str] | None: ...


class BodyRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def header(scope: Scope, name: bytes) -> bytes | None:
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    for key, value in headers:
        if key == name:
            return value
    return None


async def respond(send: Send, status: int, body: bytes, content_type: bytes = b"application/json",
                  headers: Iterable[tuple[bytes, bytes]] = (), close: bool = False) -> None:
    out = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
           *headers]
    if close:
        out.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def respond_error(send: Send, status: int, message: str, close: bool = True,
                        headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """The one error body, from the server itself."""
    await respond(send, status, error_body(status, message), headers=headers, close=close)


async def read_body(scope: Scope, receive: Receive, limit: int | None, min_rate: float,
                    grace: float) -> bytes | None:
    """The whole request body, or None when the client left (or its framing was refused) before
    it ended; BodyRefused for one over `limit` or slower than `min_rate` after `grace`."""
    declared = header(scope, b"content-length")
    if declared is not None and limit is not None and int(declared) > limit:
        raise BodyRefused(413, f"request body too large: the limit is {limit} bytes")
    parts: list[bytes] = []
    size = 0
    started = time.monotonic()
    while True:
        timeout = None
        if min_rate > 0:
            due = started + max(grace, (size + 1) / min_rate)
            timeout = due - time.monotonic()
            if timeout <= 0:
                raise BodyRefused(408, f"request body slower than {min_rate:g} bytes/s")
        try:
            message = await _within(receive(), timeout)
        except TimeoutError:
            raise BodyRefused(408, f"request body slower than {min_rate:g} bytes/s") from None
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        if chunk:
            parts.append(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                raise BodyRefused(413, f"request body too large: the limit is {limit} bytes")
        if not message.get("more_body", False):
            return b"".join(parts) if len(parts) != 1 else parts[0]


async def _within(awaitable: Awaitable[Message], timeout: float | None) -> Message:
    """`await awaitable`, at most `timeout` seconds (asyncio.TimeoutError): asyncio.timeout
    where there is one (3.11; no task per call, unlike wait_for, on the hot path)."""
    if timeout is None:
        return await awaitable
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(timeout):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout)  # pragma: no cover - Python 3.10


def path_info(raw_path: bytes) -> str:
    """The target's path decoded once, a quoted slash (%2F) left quoted."""
    if b"%" in raw_path:
        raw_path = b"%2F".join(unquote_to_bytes(p) for p in _QUOTED_SLASH.split(raw_path))
    return raw_path.decode("latin-1")


class _Answer:
    __slots__ = ("status", "headers", "body", "rest", "result", "stream", "on_end")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes,
                 rest: Any = None,
                 result: Any = None, stream: StreamBody | None = None,
                 on_end: list[Callable[[], None]] | None = None) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.rest = rest  # an iterator still to be pulled, or None
        self.result = result  # the WSGI iterable, closed when its stream ends
        self.stream = stream
        self.on_end = on_end or []  # environ[ON_STREAM_END]: run when the stream has ended


class Bridge:
    """The ASGI app (see the module docstring)."""

    def __init__(self, app: WsgiApp, pool: WorkerPool, *, max_body: int | None = None,
                 min_body_rate: float = 0.0, body_grace: float = 10.0,
                 write_timeout: float = 30.0, native: Iterable[NativeRoute] = (),
                 fast: FastPath | None = None, stats: Any = None,
                 server_name: str = "xsg") -> None:
        self.app = app
        self.pool = pool
        self.max_body = max_body
        self.min_body_rate = float(min_body_rate)
        self.body_grace = float(body_grace)
        self.write_timeout = float(write_timeout)
        self.native = tuple(native)
        self.fast = fast
        self.stats = stats
        self.server_name = server_name
        # responses to close on the pool, drained by at most CLOSERS tasks (`_close_later`)
        self._closing: collections.deque[tuple[Any, Iterable[Callable[[], None]]]] = \
            collections.deque()
        self._closing_lock = threading.Lock()
        self._closers = 0  # pool tasks draining it (at most CLOSERS)
        # once the server is stopping (`refuse`): new requests get a 503 with this message,
        # while the routes already running (`running`) finish against open databases
        self._gate = threading.Lock()
        self._refusal: str | None = None
        self._running = 0

    def refuse(self, message: str) -> None:
        """From now on answer every new request 503 `message` (the gateway is stopping: its
        databases are about to close); the routes already running go on (`running`)."""
        with self._gate:
            self._refusal = message

    @property
    def running(self) -> int:
        """Routes of the app running now (a stream counts until its route returned it)."""
        with self._gate:
            return self._running

    def _app_routes(self) -> tuple[NativeRoute, ...]:
        """The app's own native routes (looked up per request: an app may be bound late)."""
        extensions = getattr(self.app, "extensions", None)
        return tuple(extensions.get(NATIVE_ROUTES, ())) if extensions else ()

    def count(self, name: str) -> None:
        if self.stats is not None:
            self.stats[name] += 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "*":  # OPTIONS * (the protocol refused * for other methods)
            await respond(send, 200, b"", headers=[
                (b"allow", b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")])
            return
        for route in self.native or self._app_routes():
            if route.matches(scope):
                scope.setdefault("extensions", {})[BRIDGE] = self
                await route(scope, receive, send)
                return
        try:
            body = await read_body(scope, receive, self.max_body, self.min_body_rate,
                                   self.body_grace)
        except BodyRefused as exc:
            self.count(f"answered_{exc.status}")
            await respond_error(send, exc.status, exc.message)
            return
        if body is None:
            return  # the client left, or its framing was refused: nothing runs
        if self.fast is not None and scope["method"] == "POST" \
                and scope["path"] == self.fast.path and not scope.get("query_string"):
            if await self._fast_path(scope, body, send):
                return
            skip_fast = True
        else:
            skip_fast = False
        environ = self.environ(scope, body)
        if skip_fast:
            environ[FAST_PATH_TRIED] = True
        with self._gate:
            refusal = self._refusal
            if refusal is None:
                self._running += 1
        if refusal is not None:
            self.count("answered_503")
            await respond_error(send, 503, refusal, headers=[(b"retry-after", b"5")])
            return
        try:
            answer = await self.in_pool(self._run_app, environ)
        except Exception:
            log.exception("error in the WSGI app (%s %s)", scope["method"], scope["path"])
            await respond_error(send, 500, "internal error; see the server log")
            return
        finally:
            with self._gate:
                self._running -= 1
        await self._write(answer, scope, receive, send)

    async def _fast_path(self, scope: Scope, body: bytes, send: Send) -> bool:
        fast = self.fast
        assert fast is not None  # asked only when the app has a fast path
        auth = header(scope, b"authorization")
        args = (auth.decode("latin-1") if auth is not None else None,
                (header(scope, b"content-type") or b"").decode("latin-1"),
                _text(header(scope, b"accept")), body,
                scope["client"][0] if scope.get("client") else None)
        if fast.blocks(args[0]):
            answer = await self.in_pool(fast.answer, *args)
        else:
            answer = fast.answer(*args)
        if answer is None:
            return False
        data, media_type = answer
        await respond(send, 200, data, media_type.encode("latin-1"))
        return True

    # -- the pool -----------------------------------------------------------------------------

    async def in_pool(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on a pool thread; its result (or exception) here."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if future.done():
                return
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

        def task() -> None:
            try:
                value, ok = fn(*args), True
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                value, ok = exc, False
            try:
                loop.call_soon_threadsafe(settle, ok, value)
            except RuntimeError:  # the loop is closed: the server stopped meanwhile
                pass

        self.pool.submit(task)
        return await future

    # -- WSGI -----------------------------------------------------------------------------------

    def environ(self, scope: Scope, body: bytes) -> dict[str, Any]:
        server = scope.get("server") or ("", 0)
        client = scope.get("client")
        raw_path = scope.get("raw_path") or scope["path"].encode("latin-1")
        query = scope.get("query_string", b"")
        env: dict[str, Any] = {
            "REQUEST_METHOD": scope["method"], "SCRIPT_NAME": "",
            "PATH_INFO": path_info(raw_path), "QUERY_STRING": query.decode("latin-1"),
            "RAW_URI": (raw_path + (b"?" + query if query else b"")).decode("latin-1"),
            "SERVER_NAME": str(server[0]), "SERVER_PORT": str(server[1] or ""),
            "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
            "SERVER_SOFTWARE": self.server_name,
            "REMOTE_ADDR": client[0] if client else "", "REMOTE_PORT": str(client[1]) if client
            else "",
            "wsgi.version": (1, 0), "wsgi.url_scheme": scope.get("scheme", "http"),
            "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr,
            "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
            "wsgi.input_terminated": True,
        }
        env["REQUEST_URI"] = env["RAW_URI"]
        declared = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = True
                continue
            if name == b"transfer-encoding":
                continue  # the body is decoded: it has a length now
            text = value.decode("latin-1")
            if name == b"content-type":
                env["CONTENT_TYPE"] = text
                continue
            if b"_" in name:
                continue
            key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
            if key in env:
                text = env[key] + ("; " if key == "HTTP_COOKIE" else ",") + text
            env[key] = text
        if body or declared:
            env["CONTENT_LENGTH"] = str(len(body))
        return env

    def _run_app(self, environ: dict[str, Any]) -> _Answer:
        """(pool) Call the app; collect its answer, or its first chunk and the rest to pull."""
        state: dict[str, Any] = {}
        streams: list[StreamBody] = []
        written: list[bytes] = []

        def attach(body: StreamBody) -> None:
            streams.append(body)
            environ[STREAMED] = True

        environ[STREAM_BODY] = attach

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None
                           ) -> Callable[[bytes], None]:
            if exc_info is not None:
                try:
                    if state.get("sent"):
                        raise exc_info[1].with_traceback(exc_info[2])
                finally:
                    exc_info = None
            state["status"] = status
            state["headers"] = headers
            return written.append  # the legacy write(): collected before the body

        try:
            returned = self.app(environ, start_response)
        except BaseException:
            for stream in streams:  # handed over, then the route failed: release it
                stream.close()
            raise
        result: Iterable[bytes] | None = returned  # None once handed over (closed elsewhere)
        try:
            if streams:
                for extra in streams[:-1]:
                    extra.close()
                if "status" not in state:
                    raise RuntimeError("a stream body without start_response")
                status, headers = self._head(state, stream=True)
                answer = _Answer(status, headers, b"", result=result, stream=streams[-1],
                                 on_end=environ.get(ON_STREAM_END))
                result = None  # closed when the stream ends
                return answer
            iterator = iter(returned)
            length = _content_length(state.get("headers", ()))
            if length is not None and length <= COLLECT_LIMIT:
                data = written + [chunk for chunk in iterator if chunk]
                status, headers = self._head(state)
                return _Answer(status, headers, b"".join(data))
            first = b"".join(written)
            for chunk in iterator:
                if chunk:
                    first += chunk
                    break
            else:
                status, headers = self._head(state)
                return _Answer(status, headers, first)
            status, headers = self._head(state)
            answer = _Answer(status, headers, first, rest=iterator, result=result)
            result = None  # closed by the loop once pulled
            return answer
        finally:
            if result is not None and hasattr(result, "close"):
                result.close()

    @staticmethod
    def _head(state: dict[str, Any], stream: bool = False
              ) -> tuple[int, list[tuple[bytes, bytes]]]:
        if "status" not in state:
            raise RuntimeError("the app did not call start_response")
        status = int(state["status"][:3])
        out = []
        for name, value in state["headers"]:
            key = name.lower().encode("latin-1")
            if key in _DROPPED:
                if key == b"connection" and "close" in value.lower():
                    out.append((b"connection", b"close"))
                continue
            if stream and key == b"content-length":
                continue
            out.append((key, value.encode("latin-1")))
        if stream:  # a stream ends its connection, as its reader reconnects anyway
            out.append((b"connection", b"close"))
        return status, out

    async def _write(self, answer: _Answer, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": answer.status,
                    "headers": answer.headers})
        if answer.stream is not None:
            try:
                if scope["method"] == "HEAD":
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    answer.stream.close()
                else:
                    await drive(answer.stream, scope, receive, send, self.write_timeout,
                                self)
            finally:
                self._close_later(answer.result, answer.on_end)
            return
        if answer.rest is None:
            await send({"type": "http.response.body", "body": answer.body, "more_body": False})
            return
        connection = scope.get("extensions", {}).get("xsg.connection")
        try:
            await send({"type": "http.response.body", "body": answer.body, "more_body": True})
            while True:
                if not await writable(connection, self.write_timeout):
                    self.count("write_failed")
                    if connection is not None:
                        connection.transport.abort()
                    await asyncio.sleep(0)
                    return
                chunk = await self.in_pool(_next_chunk, answer.rest)
                if chunk is None:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:  # the client has the status line: cut the response
            log.info("a streamed response broke off", exc_info=True)
            if connection is not None:
                connection.transport.abort()
            await asyncio.sleep(0)
        finally:
            self._close_later(answer.result)

    def _close_later(self, result: Any, on_end: list[Callable[[], None]] | None = None) -> None:
        """Close a WSGI iterable and run a stream's end callbacks (the access log's line) on
        the pool: a close may block (a relay closes its upstream connection). Closes queue up
        for a pool task that drains them: a revocation ends a thousand streams at once, and a
        task each woke (or started) every pool thread, all taking the GIL from the event loop
        that writes the other readers' final events (the revocation's p99 at 1,000 readers).
        Two such tasks at most, so that one close that blocks does not hold up the others."""
        if (result is None or not hasattr(result, "close")) and not on_end:
            return
        with self._closing_lock:
            self._closing.append((result, on_end or ()))
            if self._closers >= CLOSERS:
                return
            self._closers += 1
        try:
            self.pool.submit(self._drain_closing)
        except RuntimeError:  # the pool is stopping
            self._drain_closing()

    def _drain_closing(self) -> None:
        while True:
            with self._closing_lock:
                if not self._closing:
                    self._closers -= 1
                    return
                result, on_end = self._closing.popleft()
            _close_quietly(result, on_end)


def _close_quietly(result: Any, on_end: Iterable[Callable[[], None]] = ()) -> None:
    try:
        if result is not None and hasattr(result, "close"):
            result.close()
    except Exception:
        log.exception("closing a response body")
    for callback in on_end:
        try:
            callback()
        except Exception:
            log.exception("after a stream")


def _next_chunk(iterator: Iterator[bytes]) -> bytes | None:
    """(pool) The next non-empty chunk, or None at the end."""
    for chunk in iterator:
        if chunk:
            return chunk
    return None


def _content_length(headers: Iterable[tuple[str, str]]) -> int | None:
    for name, value in headers:
        if name.lower() == "content-length":
            value = value.strip()
            if value.isascii() and value.isdigit() and len(value) < 19:
                return int(value)
            return None
    return None


def _text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None


__all__ = ["Bridge", "BodyRefused", "NativeRoute", "FastPath", "FAST_PATH_TRIED",
           "FAST_PATH_EXTENSION", "NATIVE_ROUTES", "BRIDGE", "read_body", "respond",
           "respond_error", "header", "path_info", "WsgiApp"]
