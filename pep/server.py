"""Serving the gateway on cheroot, a threaded production WSGI server.

Why cheroot: the gateway must be ONE process (it owns the SparkSession and its py4j gateway; a
pre-fork server such as gunicorn would give every worker its own JVM), and every streaming
reader (SSE / NDJSON) holds a thread for as long as it reads. cheroot runs a thread per active
connection and writes each chunk straight to the socket. Its pool does not grow by itself (`max`
is only a ceiling for `grow()`), so a small monitor grows it while readers occupy the threads
and shrinks it back when they leave.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

from cheroot import wsgi

log = logging.getLogger(__name__)

GROW_STEP = 16  # threads added at once when (almost) none is idle
SPARE_THREADS = 2


class GatewayServer:
    """A cheroot server that can run in the background (tests, embedding) or block (`serve`)."""

    def __init__(self, app: Callable, host: str = "127.0.0.1", port: int = 8080,
                 threads: int = 32, max_threads: int = 1000, request_queue_size: int = 128,
                 timeout: int = 30, shutdown_timeout: int = 5) -> None:
        self.server = wsgi.Server((host, port), app, numthreads=threads, max=max_threads,
                                  server_name="xsg", request_queue_size=request_queue_size,
                                  timeout=timeout, shutdown_timeout=shutdown_timeout)
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

    def start(self) -> None:
        """Bind, start the pool and serve in a background thread; returns when ready."""
        self.server.prepare()  # binds (port 0 becomes the real port) and starts the pool
        self._serve_thread = threading.Thread(target=self.server.serve, name="xsg-http",
                                              daemon=True)
        self._serve_thread.start()
        self._monitor_thread = threading.Thread(target=self._monitor_pool, name="xsg-pool",
                                                daemon=True)
        self._monitor_thread.start()

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

    def __enter__(self) -> GatewayServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _banner(services, server: GatewayServer, out) -> None:
    config = services.config
    base = config.public_base_url(server.port)
    print(f"xsg gateway listening on {server.url} (public URL {base})", file=out)
    print(f"  health    GET  {base}/health", file=out)
    print(f"  decide    POST {base}/pdp", file=out)
    print(f"  policies  GET|POST {base}/policies", file=out)
    print(f"  streams   GET|POST {base}/streams   requests POST {base}/requests   "
          f"handles GET {base}/handles", file=out)
    print(f"  explain   POST {base}/explain", file=out)
    print(f"  data dir  {config.data_dir.resolve()}  (policy store {config.store_path})", file=out)
    policies = services.policies.engine.policies
    print(f"  {len(policies)} policies loaded"
          + (f" ({len(services.seeded)} seeded from {config.policies_dir})" if services.seeded else ""),
          file=out)
    if config.uses_demo_auth:
        state = "created" if services.demo_auth_created else "from"
        print(f"  demo tokens ({state} {config.demo_auth_path}):", file=out)
        for entry in json.loads(config.demo_auth_path.read_text(encoding="utf-8")):
            role = "admin" if entry.get("admin") else "consumer"
            print(f"    {entry['subject']:<6} {role:<8} {entry['token']}", file=out)
        print(f"  try: curl -H 'Authorization: Bearer <token>' {base}/policies", file=out)
    else:
        print(f"  auth file {config.auth_file}", file=out)
    out.flush()


def start_proxy(config, gateway_url: str, out) -> subprocess.Popen:
    """`xsg serve --proxy-port P`: the caching proxy as a child process beside the gateway.

    It is the same program as `xsg proxy`, reached over HTTP like a proxy on another host; the
    feed token and webhook key travel in its environment, never on a command line."""
    env = dict(os.environ, XSG_PROXY_TOKEN=config.proxy_token or "",
               XSG_PROXY_SECRET=config.proxy_secret or "")
    cmd = [sys.executable, "-m", "pep.cli", "proxy", "--upstream", gateway_url,
           "--host", config.host, "--port", str(config.proxy_port)]
    proc = subprocess.Popen(cmd, env=env)
    host = config.host if config.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
    print(f"  proxy     http://{host}:{config.proxy_port} (caching proxy in front of the gateway; "
          f"stats at /proxy/stats)", file=out, flush=True)
    return proc


def serve(config, services=None, out=None) -> int:
    """Run the gateway in the foreground until SIGINT or SIGTERM; returns an exit status."""
    from pep.app import build_services, create_app

    out = out or sys.stdout
    if config.proxy_port and not (config.proxy_token and config.proxy_secret):
        config.proxy_token = config.proxy_token or secrets.token_urlsafe(32)
        config.proxy_secret = config.proxy_secret or secrets.token_urlsafe(32)
    services = services or build_services(config)
    app = create_app(services=services)
    server = GatewayServer(app, host=config.host, port=config.port, threads=config.threads,
                           max_threads=config.max_threads)
    proxy: subprocess.Popen | None = None
    stop = threading.Event()

    def on_signal(signum, _frame) -> None:
        log.info("received signal %s, stopping", signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        _banner(services, server, out)
        if config.proxy_port:
            proxy = start_proxy(config, server.url, out)
        while not stop.wait(1.0):
            pass
        print("stopping...", file=out, flush=True)
    finally:
        if proxy is not None:
            proxy.terminate()
            try:
                proxy.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proxy.kill()
        services.close_stream_side()  # readers end first, or the server waits for them forever
        server.stop()
        services.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
