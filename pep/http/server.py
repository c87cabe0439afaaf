"""Serving a WSGI app on cheroot, a threaded production WSGI server: the gateway and the proxy.

Why cheroot: the gateway must be ONE process (it owns the SparkSession and its py4j gateway; a
pre-fork server such as gunicorn would give every worker its own JVM), and every streaming
reader (SSE / NDJSON) holds a thread for as long as it reads; the proxy, too, holds one per
reader it relays. cheroot runs a thread per active connection and writes each chunk straight to
the socket. Its pool does not grow by itself (`max` is only a ceiling for `grow()`), so a small
monitor grows it while readers occupy the threads and shrinks it back when they leave.
"""
from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from cheroot import wsgi

log = logging.getLogger(__name__)

GROW_STEP = 16  # threads added at once when (almost) none is idle
SPARE_THREADS = 2


class HttpServer:
    """A cheroot server that runs in a background thread; `port` is known once `start()` returns."""

    def __init__(self, app: Callable, host: str = "127.0.0.1", port: int = 0,
                 threads: int = 32, max_threads: int = 1000, name: str = "xsg",
                 request_queue_size: int = 128, timeout: int = 30,
                 shutdown_timeout: int = 5) -> None:
        self.server = wsgi.Server((host, port), app, numthreads=threads, max=max_threads,
                                  server_name=name, request_queue_size=request_queue_size,
                                  timeout=timeout, shutdown_timeout=shutdown_timeout)
        self.name = name
        self.min_threads = threads
        self._serve_thread: threading.Thread | None = None
        self._monitor_thread: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def port(self) -> int:
        return int(self.server.bind_addr[1])

    @property
    def host(self) -> str:
        return str(self.server.bind_addr[0])

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    @property
    def thread_count(self) -> int:
        return len(self.server.requests._threads)  # cheroot exposes no public count

    def start(self) -> "HttpServer":
        """Bind, start the pool and serve in a background thread; returns when ready."""
        self.server.prepare()  # binds (port 0 becomes the real port) and starts the pool
        self._serve_thread = threading.Thread(target=self.server.serve, name=f"{self.name}-http",
                                              daemon=True)
        self._serve_thread.start()
        self._monitor_thread = threading.Thread(target=self._monitor_pool,
                                                name=f"{self.name}-pool", daemon=True)
        self._monitor_thread.start()
        return self

    def _monitor_pool(self) -> None:
        pool = self.server.requests
        while not self._stopping.wait(0.2):
            try:
                idle = pool.idle
                if idle < SPARE_THREADS:
                    pool.grow(GROW_STEP)
                elif idle > 2 * GROW_STEP and self.thread_count > self.min_threads:
                    pool.shrink(idle - GROW_STEP)
            except Exception:  # noqa: BLE001 - the monitor must never take the server down
                log.exception("thread pool monitor")

    def stop(self) -> None:
        """Stop accepting, let running requests finish (up to shutdown_timeout), stop the pool."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self.server.stop()
        if self._serve_thread is not None:
            self._serve_thread.join(timeout=10)

    def __enter__(self) -> "HttpServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def run_until_signal(server: HttpServer, on_start: Callable[[], None] | None = None,
                     on_stop: Callable[[], None] | None = None) -> None:
    """Start `server`, run until SIGINT or SIGTERM, then `on_stop` (before the server stops:
    streaming readers must end first, or the server waits for them) and stop it."""
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


__all__ = ["HttpServer", "run_until_signal"]
