"""Running a WSGI app on cheroot, in the foreground (the CLI) or a background thread (tests).

Every open handle stream holds one cheroot worker thread for as long as the consumer reads, so
the thread count bounds how many consumers can stream through one proxy at once.
"""
from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from cheroot import wsgi

log = logging.getLogger(__name__)


class BackgroundServer:
    """A cheroot server on its own thread; `port` is known once `start()` returns."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, threads: int = 32,
                 name: str = "xsg") -> None:
        self.server = wsgi.Server((host, port), app, numthreads=threads, server_name=name,
                                  shutdown_timeout=2, timeout=30)
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return self.server.bind_addr[0]

    @property
    def port(self) -> int:
        return self.server.bind_addr[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "BackgroundServer":
        self.server.prepare()  # binds now, so the port is known and connections queue up
        self._thread = threading.Thread(target=self.server.serve, name=f"{self.server.server_name}"
                                        "-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.stop()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_forever(app: Any, host: str, port: int, threads: int = 32, name: str = "xsg",
                  on_start: Any = None, on_stop: Any = None) -> None:
    """Serve until SIGINT or SIGTERM; `on_start` runs once the port is bound and served."""
    server = BackgroundServer(app, host, port, threads, name).start()
    if on_start is not None:
        on_start()
    done = threading.Event()

    def stop(_signum: int, _frame: Any) -> None:
        done.set()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    log.info("%s listening on %s", name, server.url)
    try:
        done.wait()
    finally:
        if on_stop is not None:
            on_stop()
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
