"""Long-lived response bodies written by the event loop (the gateway's handle streams and its
invalidation feed, for instance).

A Flask route that answers with a stream does not iterate a generator on a thread. It hands the
server a `StreamBody` (`request.environ[STREAM_BODY](body)`) and returns its status and headers
with an empty body; the event loop then pulls the body whenever it says it has data (its `Wake`,
which any thread may call: the body's producer calls it when it appended data, `urgent()` when
what it appended ends the stream), writes what is there as one chunk (many events per write),
sends the body's heartbeat when nothing was written for its interval, and ends the response when
the body is finished, when the client goes away, or when the client's socket has not drained for
`write_timeout` seconds (the reader is too slow or not reading at all). A thousand readers cost
no thread.

Bytes are pulled only when the connection can take them at once (its transport is not paused),
so what a body withholds after being pulled (its access ended meanwhile, say) is never stuck
behind a slow client: at most the transport's buffer and the socket's (`STREAM_SNDBUF`) hold
bytes written before.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

STREAM_BODY = "xsg.stream_body"  # environ key: call it with a StreamBody (see the docstring)
STREAMED = "xsg.streamed"  # environ key, True once a route handed a StreamBody over
ON_STREAM_END = "xsg.on_stream_end"  # environ key: callables run when that stream has ended
CONNECTION = "xsg.connection"  # scope["extensions"] key: the connection's protocol object
PULL_BYTES = 128 * 1024  # at most about this much is taken from a body per write
# The kernel's send buffer of a streaming connection (Linux doubles it): without a bound it grows
# to tcp_wmem's maximum (4 MiB here), so a reader that stops reading would park megabytes in the
# kernel and show no stall for minutes.
STREAM_SNDBUF = 64 * 1024
FLUSH_CHUNK = 64  # streams woken per turn of the event loop (`_LoopWakes`)


class Wake(Protocol):
    """What a body's `start` is given (a `WakeCallback`), for the body's producer to call from
    any thread: `wake()` when data may be ready, `wake.urgent()` when what came ends the stream
    (a final event: written before other streams' data)."""

    def __call__(self) -> None: ...

    def urgent(self) -> None: ...


class StreamBody(Protocol):
    """A response body the event loop writes (see the module docstring). Every method runs on
    the event loop's thread and must not block (the `Wake` it is given may be called from any)."""

    heartbeat_interval: float  # seconds without a write after which `heartbeat()` is sent

    def start(self, wake: Wake) -> None:
        """Called once, before the first pull: call `wake()` (from any thread) whenever data
        may be ready."""

    def pull(self, max_bytes: int) -> tuple[bytes, bool]:
        """Whatever is ready now, without blocking (about `max_bytes` at most; b"" when
        nothing is), and whether the body is finished."""

    # Optional: `has_more() -> bool`, whether a pull now would give more than the last one
    # took (False saves the server a pull; without it the server pulls until one is empty).

    def heartbeat(self) -> bytes:
        """Bytes that keep an idle connection alive (b"" for none)."""

    def close(self) -> None:
        """The response ended (finished, client gone, stalled or server stopping); once."""


class StreamStats(Protocol):
    def count(self, name: str) -> None: ...


# ASGI's shapes, as the bridge and the streams use them
Scope = dict[str, Any]
Message = dict[str, Any]
Send = Callable[[Message], Awaitable[None]]
Receive = Callable[[], Awaitable[Message]]


class _LoopWakes:
    """The wakes of one event loop's streams, handed to the loop together: a producer may put
    data into a thousand streams' buffers one after the other (the gateway's micro-batch), and
    a `call_soon_threadsafe` each (a write to the loop's self-pipe, the loop woken and taking the
    GIL from the delivering thread each time) cost more than the puts. The first wake schedules one
    flush; the wakes that come before it runs join it.

    A flush wakes at most `FLUSH_CHUNK` streams and leaves the rest to the loop's next turn:
    a thousand streams woken at once ran in one turn of the loop (0.1-0.25 s of writing rows),
    and nothing the loop serves besides them (a record ingested, a decision, a revocation's
    request) was read until it ended: `POST /streams/<s>/records` took 0.3 s at p95 (14 ms at
    p50) with 1,000 readers at 100,000 rows/s. Between two chunks the loop polls its sockets.
    Final events (`urgent`) are not chunked: all those queued go in the first turn. Each turn's
    poll leaves the interpreter lock, and while a revocation's bookkeeping and the pool's closes
    ran, getting it back took up to the switch interval (5 ms): 5,000 `revoked` events in
    chunks of 64 reached their readers at p99 0.94-1.1 s, in one turn at 0.76-0.83 s."""

    __slots__ = ("loop", "lock", "pending", "urgent", "scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.pending: deque[_Waker] = deque()
        self.urgent: deque[_Waker] = deque()  # woken before `pending`, in the order they came
        self.scheduled = False

    def add(self, waker: _Waker, first: bool = False) -> None:
        """Queue `waker`; `first`: ahead of the others (a stream's final event, e.g. `revoked`,
        is not written after a micro-batch's rows to every other stream; a revocation's
        thousand final events go out in the order the handles were revoked)."""
        with self.lock:
            (self.urgent if first else self.pending).append(waker)
            if self.scheduled:
                return
            self.scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed: the server has stopped
            pass

    def _flush(self) -> None:
        with self.lock:
            wakers: list[_Waker] = []
            wakers.extend(self.urgent)  # final events: all of them in this turn
            self.urgent.clear()
            while self.pending and len(wakers) < FLUSH_CHUNK:
                wakers.append(self.pending.popleft())
            more = bool(self.urgent or self.pending)
            if not more:
                self.scheduled = False
        for waker in wakers:
            waker.set_now()
        if more:  # the rest after the loop's next look at its sockets
            self.loop.call_soon(self._flush)


_LOOP_WAKES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWakes] = \
    weakref.WeakKeyDictionary()


_LOOP_WAKES_LOCK = threading.Lock()  # the gateway's and the proxy's loops may share a process


def _loop_wakes(loop: asyncio.AbstractEventLoop) -> _LoopWakes:
    with _LOOP_WAKES_LOCK:
        wakes = _LOOP_WAKES.get(loop)
        if wakes is None:
            wakes = _LOOP_WAKES[loop] = _LoopWakes(loop)
        return wakes


class _Waker:
    """`wake()` from any thread marks the stream woken on the loop (`set_now`), at most one wake
    queued; `wait(timeout)` on the loop returns once woken (or after `timeout`). A future and a
    timer per wait, not `asyncio.wait_for` over an `asyncio.Event`: that made a Task, an Event
    waiter and a timer for every wake of every stream (~12% of the GIL's time with 1,000 readers
    at 100,000 rows/s, measured with py-spy)."""

    __slots__ = ("wakes", "loop", "woken", "waiter", "pending")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.wakes = _loop_wakes(loop)
        self.loop = loop
        self.woken = False
        self.waiter: asyncio.Future[None] | None = None
        self.pending = False

    def set_now(self) -> None:
        """On the loop: mark woken and end a `wait` in progress."""
        self.pending = False
        self.woken = True
        if self.waiter is not None:
            _expire(self.waiter)

    def is_set(self) -> bool:
        return self.woken

    def clear(self) -> None:
        self.woken = False

    async def wait(self, timeout: float) -> None:
        """Until woken (at once if it was since `clear`), at most `timeout` seconds."""
        if self.woken:
            return
        waiter = self.loop.create_future()
        self.waiter = waiter
        timer = self.loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    def wake(self) -> None:
        if not self.pending:
            self.pending = True
            self.wakes.add(self)

    def wake_first(self) -> None:
        """`wake`, ahead of the streams already queued (queued again if it was: the later
        entry then finds nothing to do)."""
        self.pending = True
        self.wakes.add(self, first=True)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class WakeCallback:
    """What a body's `start` is given: call it when there is data; `urgent()` when what came
    ends the stream (a final event), to be written before other streams' data."""

    __slots__ = ("_waker",)

    def __init__(self, waker: _Waker) -> None:
        self._waker = waker

    def __call__(self) -> None:
        self._waker.wake()

    def urgent(self) -> None:
        self._waker.wake_first()


async def _watch_disconnect(receive: Receive, gone: asyncio.Event, waker: _Waker) -> None:
    """The request body is read already: the next receive() returns when the client leaves."""
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
    finally:
        gone.set()
        waker.set_now()


async def writable(connection: Any, timeout: float) -> bool:
    """Wait until the connection's transport takes writes again (it is paused while its buffer
    is over the high-water mark); False when it did not within `timeout` seconds."""
    flow = getattr(connection, "flow", None)
    if flow is None or not flow.write_paused:
        return True
    try:
        await asyncio.wait_for(flow.drain(), timeout)
        return True
    except TimeoutError:
        return False


def abort(connection: Any) -> None:
    """Cut the connection (a client that does not read: nothing more can reach it)."""
    transport = getattr(connection, "transport", None)
    if transport is not None:
        transport.abort()


def bound_send_buffer(connection: Any) -> None:
    transport = getattr(connection, "transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SNDBUF)
        except OSError:
            pass


async def drive(body: StreamBody, scope: Scope, receive: Receive, send: Send,
                write_timeout: float, stats: StreamStats | None = None) -> None:
    """Write `body` as the rest of a response whose start was sent (see the module docstring);
    always closes the body."""
    loop = asyncio.get_running_loop()
    connection = scope.get("extensions", {}).get(CONNECTION)
    bound_send_buffer(connection)
    waker = _Waker(loop)
    gone = asyncio.Event()
    watcher = loop.create_task(_watch_disconnect(receive, gone, waker))
    if connection is not None:
        connection.streams += 1
    try:
        body.start(WakeCallback(waker))
        has_more: Callable[[], bool] | None = getattr(body, "has_more", None)
        last_sent = time.monotonic()
        interval = max(0.05, float(body.heartbeat_interval))
        more = False  # the last pull gave data: the body may hold more than one pull takes
        while not gone.is_set():
            wait = last_sent + interval - time.monotonic()
            if wait > 0 and not more and not waker.is_set():
                await waker.wait(wait)
            waker.clear()
            if gone.is_set():
                break
            if not await writable(connection, write_timeout):
                if stats is not None:
                    stats.count("stalled_closed")
                log.info("closing a stream whose client has not read for %.0f s", write_timeout)
                abort(connection)
                await asyncio.sleep(0)  # the transport reports the loss: the response is over
                break
            data, finished = body.pull(PULL_BYTES)
            # A pull takes at most PULL_BYTES (a handle's buffer, 1,000 events): the rest of a
            # large micro-batch is pulled at once, not at the next wake or heartbeat; a body
            # that can tell (`has_more`) saves the empty pull after it took everything
            more = bool(data) and (has_more is None or has_more())
            if not data and not finished:
                if time.monotonic() - last_sent < interval:
                    continue
                data = body.heartbeat()
            await send({"type": "http.response.body", "body": data, "more_body": not finished})
            last_sent = time.monotonic()
            if finished:
                break
    finally:
        watcher.cancel()
        if connection is not None:
            connection.streams -= 1
        try:
            body.close()
        except Exception:
            log.exception("closing a stream body")


__all__ = ["STREAM_BODY", "STREAMED", "ON_STREAM_END", "CONNECTION", "StreamBody", "Wake",
           "WakeCallback", "drive", "writable", "abort", "bound_send_buffer", "PULL_BYTES",
           "Message", "Receive", "Scope", "Send"]
