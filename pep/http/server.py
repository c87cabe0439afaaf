"""The HTTP/1.1 server of the gateway and of the proxy: one I/O thread, an elastic worker pool,
and long-lived streams written by the I/O thread.

Why a server of our own (it replaced cheroot): the gateway must be ONE process (it owns the
SparkSession and its py4j link; a pre-fork server would give every worker its own JVM), so
everything HTTP costs is paid under one GIL. cheroot served each connection on a pool thread from
its first byte to its last: an idle connection that never sent a request held a thread for its
whole socket timeout, a streaming reader held one for as long as it read, a reader that stopped
reading left its thread blocked in `send`, and the pool grew by polling (16 threads per 0.2 s).
Its request handling alone cost about 0.3 ms per request on this machine (2,200 trivial
requests/s, against 6,700/s for the lean path below). Here:

- One I/O thread (`selectors`) accepts, holds every idle keep-alive connection and every
  connection that has not sent a request yet (no thread; closed after `idle_timeout`), answers
  connections over `max_connections` with a 429 itself, and writes every streaming response
  handed to it (`STREAM_BODY`, below), chunk by chunk, from buffers that others fill.
- A worker thread takes a connection only while a request is being read, answered and written.
  The pool grows the moment a request finds no idle worker (up to `max_threads`; a burst of a
  thousand requests starts a thousand threads at once, none waits for a poll) and shrinks after
  `idle_timeout` without work.
- Streams: a WSGI app that finds `environ[STREAM_BODY]` may call it with a `StreamBody` and
  return its status and headers with an empty body. The worker writes the headers and leaves;
  the I/O thread then pulls the body when it says it has data (its `wake` callback), writes
  whole chunks (many events per `send`), adds the body's heartbeat when nothing was written for
  its interval, and ends the connection when the body is finished, when the client goes away,
  or when a write has made no progress for `write_timeout` seconds (the reader is too slow or
  not reading at all: its socket does not drain). A thousand readers cost no thread.
- Other streaming bodies (a generator: the proxy's relay, or any WSGI app) are written by their
  worker, each `send` bounded by `write_timeout` as well.

HTTP: HTTP/1.1 and 1.0, keep-alive, pipelining (answered in order), chunked request bodies,
`Expect: 100-continue`, HEAD; a request head over 64 KiB is refused (431) and one that takes more
than `header_timeout` to arrive is dropped (408). `Transfer-Encoding` with `Content-Length` is
refused (400), any coding but `chunked` too (501). PATH_INFO is percent-decoded except `%2F`, as
cheroot did (a quoted slash stays quoted).
"""
from __future__ import annotations

import collections
import ctypes
import ctypes.util
import email.utils
import errno
import itertools
import json
import logging
import os
import re
import resource
import selectors
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol
from urllib.parse import unquote_to_bytes

log = logging.getLogger(__name__)

STREAM_BODY = "xsg.stream_body"  # environ key: call it with a StreamBody to stream from the I/O thread
MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
PULL_BYTES = 128 * 1024  # at most this much is taken from a stream body per write
# The kernel's send buffer of a streaming connection (Linux doubles it): without a bound it grows
# to tcp_wmem's maximum (4 MiB here), so a reader that stops reading would park megabytes in the
# kernel and show no stall for minutes. 128 KiB in flight still carry ~2.5 MB/s at 50 ms RTT.
STREAM_SNDBUF = 64 * 1024
LINGER = 0.02  # seconds a worker waits for the next request on a keep-alive connection
TICK = 0.25  # seconds between the I/O thread's checks of deadlines, stalls and heartbeats
DRAIN_LIMIT = 1024 * 1024  # unread request body drained to keep a connection, at most
_RECV = 65536
_QUOTED_SLASH = re.compile(rb"%2[fF]")
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^`|~0-9A-Za-z]+$")
_NO_BODY = {204, 304}
# what a worker does with a connection after answering a request on it
KEEP, CLOSE, DETACHED = "keep", "close", "detached"


class StreamBody(Protocol):
    """A response body written by the I/O thread (see the module docstring).

    Every method is called from the I/O thread except `wake`'s target, which the body calls from
    any thread (it must be cheap: it only marks the stream ready)."""

    heartbeat_interval: float  # seconds without a write after which `heartbeat()` is sent

    def start(self, wake: Callable[[], None]) -> None:
        """Called once, before the first pull: call `wake()` whenever data may be ready."""

    def pull(self, max_bytes: int) -> tuple[bytes, bool]:
        """Whatever is ready now, without blocking (about `max_bytes` at most; b"" when
        nothing is), and whether the body is finished (nothing follows)."""

    def heartbeat(self) -> bytes:
        """Bytes that keep an idle connection alive (b"" for none)."""

    def retract(self) -> bool:
        """Optional: True when bytes pulled but not written yet must not be written any more
        (e.g. the handle was revoked meanwhile); asked when the body wakes the stream."""

    def close(self) -> None:
        """The connection ended (finished, client gone, stalled or server stopping); once."""


class _Busy(Exception):
    def __init__(self, status: int, message: str, close: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close


def error_body(status: int, message: str) -> bytes:
    """The gateway's one error body shape (see pdp.http.errors.error_response), for answers
    the server gives itself, outside any app."""
    return json.dumps({"error": message, "status": status}).encode()


_REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 408: "Request Timeout",
            413: "Payload Too Large", 429: "Too Many Requests", 431:
            "Request Header Fields Too Large", 500: "Internal Server Error",
            501: "Not Implemented", 503: "Service Unavailable",
            505: "HTTP Version Not Supported"}


def canned_response(status: int, body: bytes, headers: Iterable[tuple[str, str]] = (),
                    close: bool = True) -> bytes:
    head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
            "Content-Type: application/json", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers]
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class _Date:
    """The Date header, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def get(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._value = b"Date: " + email.utils.formatdate(now, usegmt=True).encode() + b"\r\n"
            self._second = now
        return self._value


_date = _Date()


# -- memory -----------------------------------------------------------------------------------------

def _libc() -> Any:
    try:
        name = ctypes.util.find_library("c")
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


_LIBC = _libc()


def trim_memory() -> bool:
    """Give freed heap memory back to the system (glibc `malloc_trim`); False where unsupported.

    CPython frees large strings and buffers with `free`, and glibc keeps what it freed in its
    arenas (one per thread that allocated, up to 8 per core) until asked: after a burst of
    readers the process would keep its peak size although nothing uses it any more."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is None:
        return False
    try:
        trim(0)
        return True
    except Exception:  # noqa: BLE001
        return False


def limit_malloc_arenas(count: int = 2) -> bool:
    """Fewer glibc arenas for a process with many threads: less memory kept in fragments
    (`mallopt(M_ARENA_MAX)`); affects arenas created afterwards. False where unsupported."""
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:
        return False
    try:
        return bool(mallopt(-8, int(count)))  # M_ARENA_MAX
    except Exception:  # noqa: BLE001
        return False


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file limit towards `wanted` (never above the hard limit)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        return soft
    except (OSError, ValueError):
        return -1


# -- the worker pool --------------------------------------------------------------------------------

class _Workers:
    """Threads that run tasks. A task goes to the most recently idle thread (so that threads
    beyond what the load needs stay idle and leave after `idle_exit` seconds), and a new thread
    starts at once when none is idle, up to `max`."""

    def __init__(self, min_threads: int, max_threads: int, idle_exit: float, name: str) -> None:
        self.min = max(1, min_threads)
        self.max = max(self.min, max_threads)
        self.idle_exit = idle_exit
        self.name = name
        self._lock = threading.Lock()
        self._tasks: collections.deque = collections.deque()
        self._idle: list[threading.Event] = []  # a stack: the last to go idle is woken first
        self._threads: set[threading.Thread] = set()
        self._stopping = False
        self._ids = itertools.count(1)
        self.peak = 0

    @property
    def count(self) -> int:
        return len(self._threads)

    @property
    def idle(self) -> int:
        return len(self._idle)

    def start(self) -> None:
        with self._lock:
            for _ in range(self.min):
                self._spawn()

    def submit(self, fn: Callable, *args: Any) -> None:
        with self._lock:
            if self._stopping:
                raise RuntimeError("the server is stopping")
            self._tasks.append((fn, args))
            if self._idle:
                self._idle.pop().set()
            elif len(self._threads) < self.max:
                self._spawn()

    def _spawn(self) -> None:
        t = threading.Thread(target=self._run, name=f"{self.name}-worker-{next(self._ids)}",
                             daemon=True)
        self._threads.add(t)
        self.peak = max(self.peak, len(self._threads))
        t.start()

    def _run(self) -> None:
        me = threading.current_thread()
        wake = threading.Event()
        lock, tasks = self._lock, self._tasks
        while True:
            task = None
            with lock:
                if tasks:
                    task = tasks.popleft()
                elif self._stopping:
                    self._threads.discard(me)
                    return
                else:
                    wake.clear()
                    self._idle.append(wake)
            if task is None:
                if not wake.wait(self.idle_exit):
                    with lock:
                        if wake in self._idle and len(self._threads) > self.min:
                            self._idle.remove(wake)  # not chosen meanwhile: leave
                            self._threads.discard(me)
                            return
                        if wake in self._idle:
                            self._idle.remove(wake)
                continue
            fn, args = task
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - a task's failure must not kill its thread
                log.exception("server task failed")
            del fn, args, task

    def stop(self, timeout: float) -> None:
        with self._lock:
            self._stopping = True
            for wake in self._idle:
                wake.set()
            self._idle.clear()
            threads = list(self._threads)
        deadline = time.monotonic() + timeout
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))


# -- connections ------------------------------------------------------------------------------------

class _Conn:
    __slots__ = ("sock", "fd", "addr", "buf", "closed", "deadline", "server", "requests",
                 "__weakref__")

    def __init__(self, server: "HttpServer", sock: socket.socket, addr: Any) -> None:
        self.server = server
        self.sock = sock
        self.fd = sock.fileno()
        self.addr = addr
        self.buf = b""
        self.closed = False
        self.deadline = 0.0
        self.requests = 0

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        self.server._closed_one()


class _Stream:
    """A connection whose response body the I/O thread writes."""

    __slots__ = ("conn", "body", "chunked", "out", "off", "finished", "last_progress",
                 "last_sent", "queued", "want_write", "registered", "closed")

    def __init__(self, conn: _Conn, body: StreamBody, chunked: bool) -> None:
        now = time.monotonic()
        self.conn = conn
        self.body = body
        self.chunked = chunked
        self.out = b""
        self.off = 0
        self.finished = False
        self.last_progress = now
        self.last_sent = now
        self.queued = False
        self.want_write = False
        self.registered = False
        self.closed = False


class _Body:
    """wsgi.input: the request body, from the connection's buffer and socket, never past its
    end (Content-Length or the last chunk)."""

    def __init__(self, conn: _Conn, length: int | None, chunked: bool, expect_continue: bool,
                 timeout: float) -> None:
        self.conn = conn
        self.remaining = length or 0  # bytes left of a Content-Length body / of the current chunk
        self.chunked = chunked
        self.done = not chunked and not length
        self.expect_continue = expect_continue
        self.timeout = timeout

    def _fill(self) -> bool:
        conn = self.conn
        if self.expect_continue:
            self.expect_continue = False
            conn.server._send_all(conn.sock, b"HTTP/1.1 100 Continue\r\n\r\n")
        conn.sock.settimeout(self.timeout)
        data = conn.sock.recv(_RECV)
        if not data:
            raise ConnectionError("the client closed the connection in the request body")
        conn.buf += data
        return True

    def _next_chunk(self) -> None:
        conn = self.conn
        while True:
            i = conn.buf.find(b"\r\n")
            if i >= 0:
                break
            if len(conn.buf) > 4096:
                raise ValueError("bad chunk size line")
            self._fill()
        line = conn.buf[:i].split(b";", 1)[0].strip()
        conn.buf = conn.buf[i + 2:]
        try:
            size = int(line, 16)
        except ValueError:
            raise ValueError("bad chunk size") from None
        if size < 0:
            raise ValueError("bad chunk size")
        if size == 0:  # trailers until an empty line
            while True:
                while b"\r\n" not in conn.buf:
                    if len(conn.buf) > MAX_HEAD:
                        raise ValueError("trailers too long")
                    self._fill()
                line, conn.buf = conn.buf.split(b"\r\n", 1)
                if not line:
                    break
            self.done = True
        self.remaining = size

    def _take(self, n: int) -> bytes:
        conn = self.conn
        if not conn.buf:
            self._fill()
        data = conn.buf[:n]
        conn.buf = conn.buf[len(data):]
        self.remaining -= len(data)
        if self.chunked and self.remaining == 0:
            while len(conn.buf) < 2:
                self._fill()
            if conn.buf[:2] != b"\r\n":
                raise ValueError("chunk not followed by CRLF")
            conn.buf = conn.buf[2:]
        elif not self.chunked and self.remaining == 0:
            self.done = True
        return data

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            parts = []
            while True:
                part = self.read(1 << 20)
                if not part:
                    return b"".join(parts)
                parts.append(part)
        out: list[bytes] = []
        want = size
        while want > 0 and not self.done:
            if self.chunked and self.remaining == 0:
                self._next_chunk()
                if self.done:
                    break
            data = self._take(min(want, self.remaining))
            out.append(data)
            want -= len(data)
        return b"".join(out)

    def read1(self, size: int = -1) -> bytes:
        return self.read(size if size and size > 0 else _RECV)

    def readline(self, size: int | None = -1) -> bytes:
        out = bytearray()
        while not self.done and (size is None or size < 0 or len(out) < size):
            if self.chunked and self.remaining == 0:
                self._next_chunk()
                if self.done:
                    break
            if not self.conn.buf:
                self._fill()
            limit = self.remaining
            if size is not None and size >= 0:
                limit = min(limit, size - len(out))
            window = self.conn.buf[:limit]
            i = window.find(b"\n")
            out += self._take(i + 1 if i >= 0 else len(window))
            if i >= 0:
                break
        return bytes(out)

    def readlines(self, hint: int = -1) -> list[bytes]:
        lines = []
        while True:
            line = self.readline()
            if not line:
                return lines
            lines.append(line)

    def __iter__(self):
        return iter(self.readline, b"")

    def drain(self, limit: int) -> bool:
        """Read and drop the rest of the body (at most `limit` bytes); True when it all went."""
        if self.expect_continue:
            return False  # the client waits for our go before sending it: close instead
        taken = 0
        while not self.done:
            data = self.read(65536)
            if not data:
                break
            taken += len(data)
            if taken > limit:
                return False
        return self.done


# -- the server -------------------------------------------------------------------------------------

class HttpServer:
    """The server (see the module docstring); `port` is known once `start()` returns.

    `threads` workers start with it and stay; at most `max_threads` run; `max_connections` are
    open at once (more are answered 429 with `Retry-After: retry_after`); a connection idle for
    `idle_timeout` seconds between requests (or before its first) is closed; a request head must
    arrive within `header_timeout`; a body read waits at most `timeout` seconds per read; a
    response write that makes no progress for `write_timeout` seconds ends the connection."""

    def __init__(self, app: Callable, host: str = "127.0.0.1", port: int = 0,
                 threads: int = 32, max_threads: int = 1000, name: str = "xsg",
                 request_queue_size: int = 1024, timeout: float = 30,
                 shutdown_timeout: float = 5, max_connections: int = 4096,
                 idle_timeout: float = 20.0, write_timeout: float = 30.0,
                 header_timeout: float = 10.0, retry_after: int = 2,
                 busy_message: str | None = None) -> None:
        if threads < 1 or max_threads < threads:
            raise ValueError(f"threads ({threads}) must be >= 1 and <= max_threads ({max_threads})")
        self.app = app
        self.name = name
        self.timeout = float(timeout)
        self.shutdown_timeout = float(shutdown_timeout)
        self.max_connections = int(max_connections)
        self.idle_timeout = float(idle_timeout)
        self.write_timeout = float(write_timeout)
        self.header_timeout = float(header_timeout)
        self.min_threads = threads
        self.linger = LINGER
        self.stream_sndbuf = STREAM_SNDBUF
        self._workers = _Workers(threads, max_threads, max(self.idle_timeout, 5.0), name)
        self._bind = (host, port)
        self._backlog = request_queue_size
        self._sock: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
        self._io_thread: threading.Thread | None = None
        self._running = False
        self._stopping = threading.Event()
        self._stop_flag = False  # the same, read on every request without a call
        self._base_environ: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._open = 0  # connections open (idle, in a worker, or streaming)
        self._calls: collections.deque = collections.deque()  # work for the I/O thread
        self._ready: collections.deque = collections.deque()  # streams whose body has data
        self._wake_r = self._wake_w = -1
        self._wake_pending = False
        self._idle: dict[int, _Conn] = {}  # fd -> connection waiting for a request (I/O thread)
        self._streams: dict[int, _Stream] = {}  # fd -> stream (I/O thread)
        self._refusing: dict[int, tuple[socket.socket, float]] = {}
        self._busy = canned_response(429, error_body(429, busy_message or (
            f"too many connections: this server serves at most {self.max_connections} at once;"
            f" retry in {retry_after} s")), [("Retry-After", str(retry_after))])
        self._server_header = f"Server: {name}\r\n".encode("latin-1")
        self.peak_connections = 0
        self._peak_since_trim = 0
        self._last_trim = time.monotonic()
        self._last_close = 0.0
        self.stats = collections.Counter()

    # -- public -----------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._sock is None:
            return int(self._bind[1])
        return int(self._sock.getsockname()[1])

    @property
    def host(self) -> str:
        return str(self._sock.getsockname()[0] if self._sock is not None else self._bind[0])

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    @property
    def thread_count(self) -> int:
        return self._workers.count

    @property
    def connection_count(self) -> int:
        return self._open

    @property
    def stream_count(self) -> int:
        return len(self._streams)

    def start(self) -> "HttpServer":
        """Bind, start the workers and the I/O thread; returns when the port accepts."""
        raise_fd_limit(self.max_connections + 512)
        host, port = self._bind
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepts
            sock.bind((host, port))
            sock.listen(self._backlog)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._base_environ = {
            "SCRIPT_NAME": "", "SERVER_NAME": host, "SERVER_PORT": str(self.port),
            "SERVER_SOFTWARE": self.name, "REMOTE_ADDR": "", "REMOTE_PORT": "",
            "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr,
            "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
            "wsgi.input_terminated": True}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel.register(sock, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._workers.start()
        self._running = True
        self._io_thread = threading.Thread(target=self._io_loop, name=f"{self.name}-io",
                                           daemon=True)
        self._io_thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting; streams get `shutdown_timeout` to send what their bodies still have
        (e.g. a final event), requests in progress as long to finish; then everything closes."""
        if self._stopping.is_set() or self._sock is None:
            return
        self._stopping.set()
        self._stop_flag = True
        self._call(self._begin_stop)
        deadline = time.monotonic() + self.shutdown_timeout
        while time.monotonic() < deadline and self._open > 0:
            time.sleep(0.02)
        self._running = False
        self._wake()
        if self._io_thread is not None:
            self._io_thread.join(timeout=10)
        self._workers.stop(max(0.0, deadline - time.monotonic()) + 1.0)

    def __enter__(self) -> "HttpServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- the I/O thread ---------------------------------------------------------------------------

    def _call(self, fn: Callable, *args: Any) -> None:
        """Run `fn(*args)` on the I/O thread, soon."""
        self._calls.append((fn, args))
        self._wake()

    def _wake(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass

    def _io_loop(self) -> None:
        sel = self._sel
        next_tick = time.monotonic() + TICK
        try:
            while self._running:
                timeout = max(0.0, next_tick - time.monotonic())
                if self._calls or self._ready:
                    timeout = 0.0
                try:
                    events = sel.select(timeout)
                except InterruptedError:
                    continue
                for key, mask in events:
                    data = key.data
                    try:
                        if data == "accept":
                            self._accept()
                        elif data == "wake":
                            try:
                                while os.read(self._wake_r, 4096):
                                    pass
                            except BlockingIOError:
                                pass
                            # only now: a wake between the read and this line leaves its byte
                            # (a spare wake-up), never a flag set with no byte behind it
                            self._wake_pending = False
                        elif data == "idle":
                            conn = self._idle.pop(key.fd, None)
                            sel.unregister(key.fd)
                            if conn is not None:
                                self._dispatch(conn)
                        elif data == "stream":
                            st = self._streams.get(key.fd)
                            if st is not None:
                                if mask & selectors.EVENT_READ:
                                    self._stream_readable(st)
                                if mask & selectors.EVENT_WRITE and not st.closed:
                                    self._pump(st)
                        elif data == "refuse":
                            self._refuse_readable(key.fd)
                    except Exception:  # noqa: BLE001 - the I/O thread must survive anything
                        log.exception("server I/O")
                while self._calls:
                    fn, args = self._calls.popleft()
                    try:
                        fn(*args)
                    except Exception:  # noqa: BLE001
                        log.exception("server I/O call")
                ready = self._ready
                for _ in range(len(ready)):
                    st = ready.popleft()
                    st.queued = False
                    if st.closed:
                        continue
                    try:
                        if st.off < len(st.out) and self._retracted(st):
                            if st.off:  # part of the chunk went: the rest cannot be unsaid
                                self._end_stream(st)
                                continue
                            st.out = b""
                        if not st.want_write or not st.out:
                            self._pump(st)
                    except Exception:  # noqa: BLE001
                        log.exception("stream write")
                        self._end_stream(st)
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + TICK
                    self._tick(now)
        finally:
            self._close_everything()

    def _accept(self) -> None:
        for _ in range(256):
            try:
                sock, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("cannot accept a connection: %s", exc)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                raise
            self.stats["accepted"] += 1
            if self._open >= self.max_connections or self._stopping.is_set():
                self._refuse(sock)
                continue
            with self._lock:
                self._open += 1
                if self._open > self.peak_connections:
                    self.peak_connections = self._open
                if self._open > self._peak_since_trim:
                    self._peak_since_trim = self._open
            sock.setblocking(False)
            conn = _Conn(self, sock, addr)
            self._watch_idle(conn)

    def _refuse(self, sock: socket.socket) -> None:
        """Answer 429 from here (no worker), then read what the client sends until it closes
        (closing with unread data would reset the connection and lose the answer)."""
        self.stats["refused"] += 1
        try:
            sock.setblocking(False)
            sock.send(self._busy)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self._refusing) >= 1024:
            sock.close()
            return
        fd = sock.fileno()
        self._refusing[fd] = (sock, time.monotonic() + 2.0)
        self._sel.register(fd, selectors.EVENT_READ, "refuse")

    def _refuse_readable(self, fd: int) -> None:
        sock, _ = self._refusing.get(fd, (None, 0))
        if sock is None:
            return
        try:
            if sock.recv(_RECV):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._drop_refused(fd)

    def _drop_refused(self, fd: int) -> None:
        sock, _ = self._refusing.pop(fd, (None, 0))
        if sock is not None:
            try:
                self._sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            sock.close()

    def _watch_idle(self, conn: _Conn) -> None:
        """(I/O thread) Wait, without a thread, for the connection's next request."""
        if conn.closed:
            return
        if self._stopping.is_set():
            conn.close()
            return
        conn.deadline = time.monotonic() + self.idle_timeout
        self._idle[conn.fd] = conn
        try:
            self._sel.register(conn.fd, selectors.EVENT_READ, "idle")
        except (KeyError, ValueError, OSError):
            self._idle.pop(conn.fd, None)
            conn.close()

    def _dispatch(self, conn: _Conn) -> None:
        try:
            self._workers.submit(self._serve, conn)
        except RuntimeError:
            conn.close()

    def _tick(self, now: float) -> None:
        expired = [c for c in self._idle.values() if c.deadline <= now]
        for conn in expired:
            self._idle.pop(conn.fd, None)
            try:
                self._sel.unregister(conn.fd)
            except (KeyError, ValueError):
                pass
            self.stats["idle_closed"] += 1
            conn.close()
        for fd in [fd for fd, (_, dl) in self._refusing.items() if dl <= now]:
            self._drop_refused(fd)
        for st in list(self._streams.values()):
            if st.closed:
                continue
            if st.off < len(st.out):
                if now - st.last_progress > self.write_timeout:
                    self.stats["stalled_closed"] += 1
                    log.info("closing a stream whose client has not read for %.0f s",
                             now - st.last_progress)
                    self._end_stream(st)
            elif not st.finished and now - st.last_sent >= st.body.heartbeat_interval:
                try:
                    beat = st.body.heartbeat()
                except Exception:  # noqa: BLE001
                    log.exception("stream heartbeat")
                    beat = b""
                st.last_sent = now
                if beat:
                    self._queue_out(st, beat, False)
                    self._pump(st)
        # Give memory back once a crowd has gone and its connections have settled (their
        # buffers are freed as they close): see trim_memory.
        settled = now - self._last_close >= 1.0
        if settled and ((self._peak_since_trim - self._open >= 32 and now - self._last_trim > 2.0)
                        or (now - self._last_trim > 60.0 and self._peak_since_trim > self._open)):
            self._last_trim = now
            self._peak_since_trim = self._open
            trim_memory()

    def _begin_stop(self) -> None:
        try:
            self._sel.unregister(self._sock)
        except (KeyError, ValueError):
            pass
        self._sock.close()
        for conn in list(self._idle.values()):
            try:
                self._sel.unregister(conn.fd)
            except (KeyError, ValueError):
                pass
            conn.close()
        self._idle.clear()

    def _close_everything(self) -> None:
        for st in list(self._streams.values()):
            self._end_stream(st)
        for conn in list(self._idle.values()):
            conn.close()
        self._idle.clear()
        for fd in list(self._refusing):
            self._drop_refused(fd)
        try:
            self._sock.close()
        except OSError:
            pass
        try:
            self._sel.close()
        except Exception:  # noqa: BLE001
            pass
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _closed_one(self) -> None:
        with self._lock:
            self._open -= 1
        self._last_close = time.monotonic()

    # -- streams (I/O thread) ---------------------------------------------------------------------

    def _add_stream(self, conn: _Conn, body: StreamBody, chunked: bool) -> None:
        if self._stopping.is_set() and not self._running:
            self._close_body(body)
            conn.close()
            return
        st = _Stream(conn, body, chunked)
        self._streams[conn.fd] = st
        try:
            if self.stream_sndbuf:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.stream_sndbuf)
            conn.sock.setblocking(False)
            self._sel.register(conn.fd, selectors.EVENT_READ, "stream")
            st.registered = True
            body.start(lambda st=st: self._stream_ready(st))
            self._pump(st)
        except Exception:  # noqa: BLE001
            log.exception("starting a stream")
            self._end_stream(st)

    @staticmethod
    def _retracted(st: _Stream) -> bool:
        retract = getattr(st.body, "retract", None)
        return bool(retract is not None and retract())

    def _stream_ready(self, st: _Stream) -> None:
        """(any thread) The body of `st` may have data."""
        if not st.queued and not st.closed:
            st.queued = True
            self._ready.append(st)
            self._wake()

    def _queue_out(self, st: _Stream, data: bytes, last: bool) -> None:
        if st.chunked:
            if data:
                data = b"%x\r\n%s\r\n" % (len(data), data)
            if last:
                data += b"0\r\n\r\n"
        st.out = data
        st.off = 0

    def _pump(self, st: _Stream) -> None:
        sock = st.conn.sock
        while not st.closed:
            if st.off >= len(st.out):
                if st.finished:
                    self._end_stream(st)
                    return
                data, finished = st.body.pull(PULL_BYTES)
                if finished:
                    st.finished = True
                if not data and not finished:
                    self._want_write(st, False)
                    return
                self._queue_out(st, data, finished)
                st.last_sent = time.monotonic()
                if not st.out:
                    continue
            try:
                sent = sock.send(memoryview(st.out)[st.off:])
            except (BlockingIOError, InterruptedError):
                self._want_write(st, True)
                return
            except OSError:
                self._end_stream(st)
                return
            st.off += sent
            st.last_progress = time.monotonic()
            if st.off < len(st.out):
                self._want_write(st, True)
                return
            st.out, st.off = b"", 0

    def _want_write(self, st: _Stream, want: bool) -> None:
        if st.want_write == want or st.closed:
            return
        st.want_write = want
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
        try:
            self._sel.modify(st.conn.fd, events, "stream")
        except (KeyError, ValueError, OSError):
            self._end_stream(st)

    def _stream_readable(self, st: _Stream) -> None:
        """The client sent something or went away: bytes are dropped, EOF ends the stream."""
        try:
            data = st.conn.sock.recv(_RECV)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._end_stream(st)

    def _end_stream(self, st: _Stream) -> None:
        if st.closed:
            return
        st.closed = True
        self._streams.pop(st.conn.fd, None)
        if st.registered:
            try:
                self._sel.unregister(st.conn.fd)
            except (KeyError, ValueError):
                pass
        self._close_body(st.body)
        st.out = b""
        st.conn.close()

    @staticmethod
    def _close_body(body: StreamBody) -> None:
        try:
            body.close()
        except Exception:  # noqa: BLE001
            log.exception("closing a stream body")

    # -- a worker serving a connection ------------------------------------------------------------

    def _send_all(self, sock: socket.socket, data: bytes | memoryview) -> None:
        """Send everything; each send may wait `write_timeout` seconds for the client to read."""
        sock.settimeout(self.write_timeout)
        view = memoryview(data)
        while view:
            sent = sock.send(view)
            view = view[sent:]

    def _serve(self, conn: _Conn) -> None:
        """(worker) Answer the requests the connection has sent, then hand it back idle."""
        try:
            while not conn.closed:
                after = self._one_request(conn)
                if after == DETACHED:
                    return  # the I/O thread writes its stream now
                if after == CLOSE or self._stop_flag:
                    conn.close()
                    return
                if conn.buf:
                    continue  # a pipelined request is already here
                try:
                    # a client in a hurry sends its next request at once: wait a moment for
                    # it here rather than pass the connection to the I/O thread and back
                    conn.sock.settimeout(self.linger)
                    more = conn.sock.recv(_RECV)
                except (BlockingIOError, InterruptedError, socket.timeout):
                    break
                except OSError:
                    conn.close()
                    return
                if not more:
                    conn.close()
                    return
                conn.buf = more
        except Exception:  # noqa: BLE001
            log.exception("serving a connection")
            conn.close()
            return
        if not conn.closed:
            self._call(self._watch_idle, conn)

    def _read_head(self, conn: _Conn) -> bytes | None:
        sock = conn.sock
        buf = conn.buf
        deadline = None
        while True:
            if buf[:2] == b"\r\n":  # stray CRLFs between requests are allowed
                buf = buf.lstrip(b"\r\n")
            i = buf.find(b"\r\n\r\n")
            if i >= 0:
                conn.buf = buf[i + 4:]
                if i > MAX_HEAD:
                    raise _Busy(431, "request head over 64 KiB")
                return buf[:i]
            if len(buf) > MAX_HEAD:
                raise _Busy(431, "request head over 64 KiB")
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.header_timeout
            elif now >= deadline:
                raise _Busy(408, f"request head not received within {self.header_timeout:g} s")
            sock.settimeout(deadline - now)
            try:
                data = sock.recv(_RECV)
            except socket.timeout:
                raise _Busy(408, f"request head not received within "
                                 f"{self.header_timeout:g} s") from None
            except OSError:
                return None
            if not data:
                return None
            buf += data
            conn.buf = buf

    def _one_request(self, conn: _Conn) -> str:
        """Read, answer and write one request: KEEP, CLOSE or DETACHED (a stream)."""
        try:
            head = self._read_head(conn)
        except _Busy as exc:
            self._answer_error(conn, exc.status, exc.message)
            return CLOSE
        if head is None:
            return CLOSE
        conn.requests += 1
        self.stats["requests"] += 1
        try:
            environ, body, keep_alive, http10 = self._environ(conn, head)
        except _Busy as exc:
            self._answer_error(conn, exc.status, exc.message)
            return CLOSE
        return self._run_app(conn, environ, body, keep_alive, http10)

    def _environ(self, conn: _Conn, head: bytes) -> tuple[dict, _Body, bool, bool]:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3:
            raise _Busy(400, "malformed request line")
        method, target, version = parts
        if version == b"HTTP/1.1":
            http10 = False
        elif version == b"HTTP/1.0":
            http10 = True
        elif version.startswith(b"HTTP/"):
            raise _Busy(505, "HTTP version not supported")
        else:
            raise _Busy(400, "malformed request line")
        if not _TOKEN.match(method):
            raise _Busy(400, "malformed method")
        if target[:1] != b"/":
            if target == b"*":
                target = b"*"
            elif b"://" in target[:10]:  # absolute-form
                rest = target.split(b"://", 1)[1]
                slash = rest.find(b"/")
                target = rest[slash:] if slash >= 0 else b"/"
            else:
                raise _Busy(400, "malformed request target")
        path, _, query = target.partition(b"?")
        if b"%" in path:
            path = b"%2F".join(unquote_to_bytes(p) for p in _QUOTED_SLASH.split(path))
        env = self._base_environ.copy()
        env["REQUEST_METHOD"] = method.decode("ascii")
        env["PATH_INFO"] = path.decode("latin-1")
        env["QUERY_STRING"] = query.decode("latin-1")
        env["REQUEST_URI"] = env["RAW_URI"] = target.decode("latin-1")
        env["SERVER_PROTOCOL"] = "HTTP/1.0" if http10 else "HTTP/1.1"
        if conn.addr:
            env["REMOTE_ADDR"] = conn.addr[0]
            env["REMOTE_PORT"] = str(conn.addr[1])
        if len(lines) > MAX_HEADERS + 1:
            raise _Busy(431, f"more than {MAX_HEADERS} request headers")
        length = None
        te = None
        connection = b""
        expect = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or not _TOKEN.match(name):
                raise _Busy(400, "malformed request header")
            value = value.strip(b" \t")
            lname = name.lower()
            if lname == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise _Busy(400, "bad Content-Length")
                length = int(value)
                env["CONTENT_LENGTH"] = value.decode("ascii")
                continue
            if lname == b"content-type":
                env["CONTENT_TYPE"] = value.decode("latin-1")
                continue
            if lname == b"transfer-encoding":
                te = value.lower() if te is None else te + b"," + value.lower()
            elif lname == b"connection":
                connection = value.lower()
            elif lname == b"expect":
                if value.lower() == b"100-continue":
                    expect = True
            if b"_" in name:
                continue  # X_Forwarded_For would pass for X-Forwarded-For: dropped
            key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
            text = value.decode("latin-1")
            env[key] = f"{env[key]},{text}" if key in env else text
        chunked = False
        if te is not None:
            if length is not None:
                raise _Busy(400, "Transfer-Encoding and Content-Length together")
            if te.replace(b" ", b"") != b"chunked":
                raise _Busy(501, "only the chunked transfer coding is supported")
            chunked = True
        tokens = {t.strip() for t in connection.split(b",")} if connection else set()
        keep_alive = (b"keep-alive" in tokens) if http10 else (b"close" not in tokens)
        body = _Body(conn, length, chunked, expect and not http10 and (chunked or bool(length)),
                     self.timeout)
        env["wsgi.input"] = body
        return env, body, keep_alive, http10

    def _answer_error(self, conn: _Conn, status: int, message: str) -> None:
        self.stats[f"answered_{status}"] += 1
        try:
            self._send_all(conn.sock, canned_response(status, error_body(status, message)))
        except OSError:
            pass

    def _run_app(self, conn: _Conn, environ: dict, body: _Body, keep_alive: bool,
                 http10: bool) -> str:
        state: dict[str, Any] = {}
        stream: list[StreamBody] = []
        environ[STREAM_BODY] = stream.append
        head_only = environ["REQUEST_METHOD"] == "HEAD"
        sock = conn.sock

        def start_response(status: str, headers: list, exc_info: Any = None) -> Callable:
            if exc_info is not None:
                try:
                    if state.get("sent"):
                        raise exc_info[1].with_traceback(exc_info[2])
                finally:
                    exc_info = None
            elif "status" in state:
                raise AssertionError("start_response called twice without exc_info")
            state["status"] = status
            state["headers"] = headers
            return write

        def head_bytes(with_length: int | None) -> bytes:
            status = state["status"]
            code = int(status[:3])
            lines = [b"HTTP/1.1 ", status.encode("latin-1"), b"\r\n"]
            has_length = False
            close = not keep_alive
            for name, value in state["headers"]:
                low = name.lower()
                if low == "content-length":
                    if stream:
                        continue
                    has_length = True
                elif low == "transfer-encoding":
                    continue
                elif low == "connection":
                    if "close" in value.lower():
                        close = True
                    continue
                lines += (name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n")
            framing = "none"
            if code < 200 or code in _NO_BODY:
                framing = "none"
            elif stream:
                framing = "close" if http10 else "chunked"
                close = True
            elif has_length:
                framing = "length"
            elif with_length is not None:
                framing = "length"
                lines += (b"Content-Length: ", str(with_length).encode(), b"\r\n")
            elif http10:
                framing, close = "close", True
            else:
                framing = "chunked"
            if framing == "chunked" and not head_only:
                lines.append(b"Transfer-Encoding: chunked\r\n")
            if close:
                lines.append(b"Connection: close\r\n")
            elif http10:
                lines.append(b"Connection: keep-alive\r\n")
            lines += (_date.get(), self._server_header, b"\r\n")
            state["framing"] = framing if not head_only else "none"
            state["close"] = close
            return b"".join(lines)

        def send_body(data: bytes) -> None:
            framing = state["framing"]
            if not data or framing == "none":
                return
            if framing == "chunked":
                self._send_all(sock, b"%x\r\n%s\r\n" % (len(data), data))
            else:
                self._send_all(sock, data)

        def write(data: bytes) -> None:  # the legacy WSGI write()
            if not state.get("sent"):
                self._send_all(sock, head_bytes(None))
                state["sent"] = True
            send_body(data)

        result = None
        try:
            try:
                result = self.app(environ, start_response)
                if stream:
                    if "status" not in state:
                        raise RuntimeError("a stream body without start_response")
                    self._send_all(sock, head_bytes(None))
                    state["sent"] = True
                    body_obj = stream.pop()
                    chunked = state["framing"] == "chunked"
                    if head_only:
                        self._close_body(body_obj)
                        return CLOSE
                    self._call(self._add_stream, conn, body_obj, chunked)
                    return DETACHED
                # The first chunk (most answers have just one) goes out with the headers.
                iterator = iter(result)
                first = b""
                for first in iterator:
                    if first:
                        break
                if "status" not in state:
                    raise RuntimeError("the app did not call start_response")
                if not state.get("sent"):
                    rest = None
                    if isinstance(result, (list, tuple)) and len(result) <= 1:
                        rest = len(first)
                    head = head_bytes(rest)
                    state["sent"] = True
                    if first and state["framing"] == "chunked":
                        self._send_all(sock, head + b"%x\r\n%s\r\n" % (len(first), first))
                    elif first and state["framing"] != "none":
                        self._send_all(sock, head + first)
                    else:
                        self._send_all(sock, head)
                else:
                    send_body(first)
                for data in iterator:
                    send_body(data)
                if state["framing"] == "chunked":
                    self._send_all(sock, b"0\r\n\r\n")
            finally:
                for item in stream:
                    self._close_body(item)
                if result is not None and hasattr(result, "close"):
                    try:
                        result.close()
                    except Exception:  # noqa: BLE001
                        log.exception("closing a response body")
        except (socket.timeout, ConnectionError, BrokenPipeError):
            self.stats["write_failed"] += 1
            return CLOSE
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.EBADF, errno.ENOTCONN):
                log.warning("writing a response: %s", exc)
            return CLOSE
        except Exception:  # noqa: BLE001
            log.exception("error in the WSGI app (%s %s)", environ.get("REQUEST_METHOD"),
                          environ.get("PATH_INFO"))
            if not state.get("sent"):
                self._answer_error(conn, 500, "internal error; see the server log")
            return CLOSE
        if state.get("close") or state.get("framing") == "close":
            return CLOSE
        try:
            if not body.done and not body.drain(DRAIN_LIMIT):
                return CLOSE
        except (OSError, ValueError, ConnectionError):
            return CLOSE
        return KEEP if keep_alive else CLOSE


def run_until_signal(server: HttpServer, on_start: Callable[[], None] | None = None,
                     on_stop: Callable[[], None] | None = None) -> None:
    """Start `server`, run until SIGINT or SIGTERM, then `on_stop` (before the server stops:
    streaming readers must get their final events first) and stop it."""
    done = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        log.info("received signal %s, stopping", signum)
        done.set()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        log.info("%s listening on %s", server.name, server.url)
        if on_start is not None:
            on_start()
        while not done.wait(1.0):
            pass
    finally:
        try:
            if on_stop is not None:
                on_stop()
        finally:
            server.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)


__all__ = ["HttpServer", "StreamBody", "STREAM_BODY", "run_until_signal", "trim_memory",
           "limit_malloc_arenas", "raise_fd_limit", "error_body", "canned_response"]
