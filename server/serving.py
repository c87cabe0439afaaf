"""The HTTP server of the gateway and of the proxy: uvicorn in the process's own thread.

The gateway must stay ONE process (it owns the SparkSession and its py4j link to the JVM; a
pre-fork server would give every worker its own JVM and its own state), so the server runs in
it: uvicorn's event loop (uvloop when installed) on a thread of its own, parsing with httptools
(llhttp) through the strict protocol of server/protocol.py, serving the Flask app through the
bridge of server/bridge.py (routes on a thread pool, bodies and streams on the loop).
`HttpServer(app, ...).start()` returns once the port accepts; `stop()` lets responses in
progress (streams sending their last events) finish within `shutdown_timeout`, then cuts the
rest. `run_until_signal` runs one until SIGINT or SIGTERM.

Limits: `max_connections` open at once (one more: 429 with `Retry-After`); `idle_timeout` before
or between requests; a request head within `header_timeout` of its first byte (408); a body of
at most `max_body` bytes (413) that averages `min_body_rate` bytes/s after `header_timeout`
seconds (408); a response write that makes no progress for `write_timeout` ends the connection.
`threads` pool threads stay, up to `max_threads` run routes at once. TLS with `tls_cert` and
`tls_key` (PEM files). Behind a reverse proxy, `forwarded_allow_ips` (addresses or networks)
are trusted for `X-Forwarded-For` (the client's address) and `X-Forwarded-Proto` (the scheme,
hence `https` URLs built from the request); nobody is trusted by default.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import uvicorn

from server.bridge import FAST_PATH_EXTENSION, Bridge, FastPath, NativeRoute, WsgiApp
from server.pool import WorkerPool
from server.protocol import Limits, error_body, protocol_for

log = logging.getLogger(__name__)
DEFAULT_MAX_BODY = 16 * 1024 * 1024
TRIM_EVERY = 2.0  # seconds between checks whether memory should be given back

# uvicorn's own INFO lines (started, shutting down, waiting for connections) say nothing ours
# do not: its warnings and errors still reach the gateway's log
logging.getLogger("uvicorn.error").setLevel(logging.WARNING)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio works too
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class HttpServer:
    """One server (see the module docstring); `port` is known once `start()` returns."""

    def __init__(self, app: WsgiApp, host: str = "127.0.0.1", port: int = 0, *,
                 threads: int = 32, max_threads: int = 1000, name: str = "xsg",
                 max_connections: int = 4096, idle_timeout: float = 20.0,
                 write_timeout: float = 30.0, header_timeout: float = 10.0,
                 min_body_rate: float = 1024.0, max_body: int | None = None,
                 retry_after: int = 2, busy_message: str | None = None,
                 shutdown_timeout: float = 5.0, tls_cert: str | None = None,
                 tls_key: str | None = None, forwarded_allow_ips: Iterable[str] = (),
                 native: Iterable[NativeRoute] = (), fast: FastPath | None = None,
                 backlog: int = 1024) -> None:
        if threads < 1 or max_threads < threads:
            raise ValueError(f"threads ({threads}) must be >= 1 and <= max_threads ({max_threads})")
        if bool(tls_cert) != bool(tls_key):
            raise ValueError("TLS needs both a certificate and its key")
        self.app = app
        self.name = name
        self.shutdown_timeout = float(shutdown_timeout)
        self.max_connections = int(max_connections)
        self.tls = bool(tls_cert)
        self.limits = Limits(max_connections=int(max_connections),
                             idle_timeout=float(idle_timeout),
                             header_timeout=float(header_timeout), retry_after=int(retry_after),
                             busy_message=busy_message)
        self.stats = self.limits.stats
        self.pool = WorkerPool(threads, max_threads, max(float(idle_timeout), 5.0), name)
        if fast is None:
            fast = getattr(app, "extensions", {}).get(FAST_PATH_EXTENSION)
        if max_body is None:  # a Flask app's own limit, else 16 MiB
            max_body = getattr(app, "config", {}).get("MAX_CONTENT_LENGTH") or DEFAULT_MAX_BODY
        self.bridge = Bridge(app, self.pool, max_body=max_body, min_body_rate=min_body_rate,
                             body_grace=header_timeout, write_timeout=write_timeout,
                             native=native, fast=fast, stats=self.stats, server_name=name)
        trusted = list(forwarded_allow_ips)
        # The apps log their own access lines (the gateway's `xsg.access`: no query strings, no
        # secrets in paths). uvicorn's would print raw request lines, ids and tokens included; its
        # protocol decides per connection from `hasHandlers()`, which any handler on the root
        # logger with propagation turned back on satisfies, so the logger is switched off here.
        logging.getLogger("uvicorn.access").disabled = True
        self._config = uvicorn.Config(
            self.bridge, host=host, port=port, http=protocol_for(self.limits), ws="none",
            lifespan="off", interface="asgi3", log_config=None, access_log=False,
            # uvicorn declares these int and uses them as seconds for asyncio's timers: a float
            # (0.5 s) works
            timeout_keep_alive=idle_timeout,  # type: ignore[arg-type]  # see above
            timeout_graceful_shutdown=shutdown_timeout,  # type: ignore[arg-type]  # see above
            server_header=False, headers=[("server", name)], proxy_headers=bool(trusted),
            forwarded_allow_ips=trusted or None, ssl_certfile=tls_cert, ssl_keyfile=tls_key,
            backlog=backlog)
        self._bind = (host, port)
        self._backlog = backlog
        self._sock: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._stopped = False
        self.peak_connections = 0

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
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def thread_count(self) -> int:
        return self.pool.count

    @property
    def connection_count(self) -> int:
        return len(self._server.server_state.connections) if self._server is not None else 0

    @property
    def stream_count(self) -> int:
        if self._server is None:
            return 0
        return sum(getattr(c, "streams", 0) for c in list(self._server.server_state.connections))

    def start(self) -> HttpServer:
        """Bind, load TLS, start the pool and the loop's thread; returns when the port accepts."""
        raise_fd_limit(self.max_connections + 512)
        self._config.load()  # TLS files are read here: a bad pair fails now, in the caller
        host, port = self._bind
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind((host, port))
            sock.listen(self._backlog)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._server = uvicorn.Server(self._config)
        self.pool.start()
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-loop", daemon=True)
        self._thread.start()
        if not self._started.wait(30) or self._failure is not None:
            self.stop()
            raise RuntimeError(f"the {self.name} server did not start") from self._failure
        return self

    def quiesce(self, message: str, timeout: float = 10.0) -> bool:
        """Answer new requests 503 `message` from now on and wait (up to `timeout` seconds)
        for the routes running to return; streams go on until `stop()`. For a stop that
        closes what the routes use first (the gateway's databases): a request arriving
        meanwhile is refused, not a 500. True when none was left running."""
        self.bridge.refuse(message)
        deadline = time.monotonic() + timeout
        while self.bridge.running and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self.bridge.running

    def stop(self) -> None:
        """Stop accepting; responses in progress (streams sending a last event) get
        `shutdown_timeout` seconds, then every connection is cut."""
        if self._stopped or self._server is None:
            return
        self._stopped = True
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(self.shutdown_timeout + 10)
        self.pool.stop(2.0)

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- the loop's thread ------------------------------------------------------------------------

    def _run(self) -> None:
        loop = _new_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start() or logged
            self._failure = exc
            if self._started.is_set():
                log.exception("the %s server stopped on an error", self.name)
        finally:
            self._started.set()
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def _serve(self) -> None:
        server = self._server
        assert server is not None and self._sock is not None
        server.lifespan = self._config.lifespan_class(self._config)
        trim = asyncio.get_running_loop().create_task(self._trim_memory())
        try:
            await server.startup(sockets=[self._sock])
            self._started.set()
            await server.main_loop()
            await self._shutdown()
        finally:
            trim.cancel()

    async def _shutdown(self) -> None:
        """Stop accepting, close idle connections, give responses in progress (streams sending
        their last events) `shutdown_timeout`, then cut the connections left: their tasks see
        the client gone and end by themselves (uvicorn's own shutdown cancels them instead,
        logging each as an error)."""
        server = self._server
        assert server is not None  # started by _serve before it can be shut down
        state = server.server_state
        for listener in server.servers:
            listener.close()
        for connection in list(state.connections):
            connection.shutdown()
        deadline = time.monotonic() + self.shutdown_timeout
        while (state.connections or state.tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for connection in list(state.connections):
            connection.transport.abort()
        deadline = time.monotonic() + 2.0
        while state.tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for task in list(state.tasks):
            task.cancel()
        for listener in server.servers:
            await listener.wait_closed()

    async def _trim_memory(self) -> None:
        """Give memory back once a crowd of connections has gone (see trim_memory)."""
        server = self._server
        assert server is not None  # trimmed while serving only
        peak = 0
        last = time.monotonic()
        while True:
            await asyncio.sleep(TRIM_EVERY)
            now_open = len(server.server_state.connections)
            self.peak_connections = max(self.peak_connections, now_open)
            peak = max(peak, now_open)
            if peak - now_open >= 32 or (time.monotonic() - last > 60 and peak > now_open):
                peak = now_open
                last = time.monotonic()
                trim_memory()


# -- the process ----------------------------------------------------------------------------------

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
    arenas until asked: after a burst of readers the process would keep its peak size although
    nothing uses it any more."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is None:
        return False
    try:
        trim(0)
        return True
    except Exception:  # noqa: BLE001 - a failed trim is no fault: False
        return False


def limit_malloc_arenas(count: int = 2) -> bool:
    """Fewer glibc arenas for a process with many threads: less memory kept in fragments
    (`mallopt(M_ARENA_MAX)`); affects arenas created afterwards. False where unsupported."""
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:
        return False
    try:
        return bool(mallopt(-8, int(count)))  # M_ARENA_MAX
    except Exception:  # noqa: BLE001 - a failed setting is no fault: False
        return False


# The cyclic garbage collector's thresholds for a gateway process (Python's are 700, 10, 10).
# With 1,000 live handles the process holds millions of objects and makes ~100,000 new ones a
# second (a row's entry in each buffer it reaches); with Python's thresholds a full collection
# ran every 1.5-2 s and stopped the whole process for 0.2-0.3 s each time (every delivery, the
# micro-batch's py4j calls, the event loop), and young collections promoted objects that a
# micro-batch's routing still held. Measured (tests/bench/bench_many_readers.py, 1,000 handles
# at 50%): no full collection in the 30 s window instead of ~20, micro-batches p50 0.28 s
# instead of 0.50 s, p95 ingest-to-reader 0.96 s instead of 1.37-1.6 s. A young collection
# now takes ~10 ms; cyclic garbage is found a little later (after 20,000 allocations, not 700).
GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc(freeze: bool = True) -> None:
    """Set `GC_THRESHOLDS` and, with `freeze`, move every object alive now (the modules, Spark's
    and the PDP's start-up state) out of the collector's reach for good (`gc.freeze`): full
    collections then walk only what was made since. For a server process, once started.
    (A switch interval of 1 ms instead of Python's 5 ms measured no better, twice: not set.)"""
    gc.set_threshold(*GC_THRESHOLDS)
    if freeze:
        gc.collect()
        gc.freeze()


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


def run_until_signal(server: HttpServer, on_start: Callable[[], None] | None = None,
                     on_stop: Callable[[], None] | None = None) -> None:
    """Start `server`, run until SIGINT or SIGTERM, then `on_stop` (before the server stops:
    streaming readers must get their final events first) and stop it."""
    done = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        log.info("%s received signal %s, stopping", server.name, signum)
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


__all__ = ["HttpServer", "run_until_signal", "trim_memory", "limit_malloc_arenas", "tune_gc",
           "GC_THRESHOLDS", "raise_fd_limit", "error_body", "FAST_PATH_EXTENSION"]
