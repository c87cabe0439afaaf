"""`xsg serve`: the gateway in the foreground, with its banner and, optionally, a caching proxy.

The proxy runs as a child process (`python -m proxy`), reached over HTTP like a proxy on another
host; this module never imports it.
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import TextIO

from pep.config import GatewayConfig
from pep.http.app import create_app
from pep.services import GatewayServices, build_services
from server.bridge import WsgiApp
from server.serving import HttpServer, limit_malloc_arenas, run_until_signal, tune_gc

log = logging.getLogger(__name__)
PROGRESS_EVERY = 5.0  # seconds between "still starting ..." lines


class PortUnavailable(OSError):
    """The gateway's (or its proxy's) address cannot be bound; found before Spark starts."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "port unavailable"


def check_port(host: str, port: int | None, what: str = "the gateway") -> None:
    """Bind `host:port` once, as the server will (SO_REUSEADDR), and let it go again, so that a
    port in use is reported at once instead of after Spark's start-up."""
    if not port:
        return  # 0: any free port
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise PortUnavailable(f"cannot listen on {where} for {what}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortUnavailable(f"{where} is already in use (wanted for {what})") from None
        raise PortUnavailable(f"cannot listen on {where} for {what}: "
                              f"{exc.strerror or exc}") from None
    finally:
        sock.close()


class StartupProgress:
    """`with progress("starting Spark ..."):` says what start-up waits for, then every few
    seconds how long it has waited, then how long it took (Spark's start is 10 s or more)."""

    def __init__(self, out: TextIO, every: float = PROGRESS_EVERY) -> None:
        self.out = out
        self.every = every

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    @contextlib.contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        started = time.monotonic()
        self._say(f"  {what} ...")
        done = threading.Event()

        def tick() -> None:
            while not done.wait(self.every):
                self._say(f"  ... {what}: {time.monotonic() - started:.0f} s")

        ticker = threading.Thread(target=tick, name="xsg-progress", daemon=True)
        ticker.start()
        try:
            yield
        except BaseException:
            done.set()
            self._say(f"  {what}: failed after {time.monotonic() - started:.1f} s")
            raise
        finally:
            done.set()
            ticker.join()
        self._say(f"  {what}: done in {time.monotonic() - started:.1f} s")


@contextlib.contextmanager
def reload_on_sighup(services: GatewayServices) -> Iterator[None]:
    """SIGHUP re-reads the token file (the previous tokens stay if the new file is broken)."""
    reload = getattr(services.authenticator, "reload", None)
    if (reload is None or not hasattr(signal, "SIGHUP")
            or threading.current_thread() is not threading.main_thread()):
        yield
        return

    def on_hup(_signum: int, _frame: FrameType | None) -> None:
        log.info("SIGHUP: re-reading the auth file")
        # not in the signal handler itself: the main thread may hold the logging lock
        threading.Thread(target=reload, name="xsg-auth-reload", daemon=True).start()

    previous = signal.signal(signal.SIGHUP, on_hup)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def _banner(services: GatewayServices, server: HttpServer, out: TextIO,
            proxy_url: str | None = None) -> None:
    config = services.config
    base = config.public_base_url(server.port)
    print(f"xsg gateway listening on {server.url} (public URL {base})", file=out)
    print(f"  console   {base}/console   (the web console, in a browser)", file=out)
    if proxy_url is not None:
        print(f"  proxy     {proxy_url} (caching proxy in front of the gateway; stats at "
              "/proxy/stats)", file=out)
    print(f"  health    GET  {base}/health", file=out)
    print(f"  decide    POST {base}/pdp", file=out)
    print(f"  policies  GET|POST {base}/policies", file=out)
    print(f"  streams   GET|POST {base}/streams   requests POST {base}/requests   "
          f"handles GET {base}/handles", file=out)
    print(f"  explain   POST {base}/explain", file=out)
    storage = services.storage
    kept = (f"store {storage.describe()}" if storage is not None and storage.url is not None
            else f"policy store {config.store_path}")
    print(f"  data dir  {config.data_dir.resolve()}  ({kept})", file=out)
    if services.cluster is not None:
        print(f"  cluster   member {services.cluster.member} at {services.cluster.url} "
              f"(leases of {services.cluster.lease_seconds:g} s; GET {base}/cluster)", file=out)
    policies = services.policies.engine.policies
    seeded = (f" ({len(services.seeded)} seeded from {config.policies_dir})"
              if services.seeded else "")
    print(f"  {len(policies)} policies loaded" + seeded, file=out)
    token = None
    if config.uses_demo_auth:
        state = "created" if services.demo_auth_created else "from"
        print(f"  demo tokens ({state} {config.demo_auth_path}):", file=out)
        entries = json.loads(config.demo_auth_path.read_text(encoding="utf-8"))
        for entry in entries:
            # the roles the PDP will see for this subject, as the file gives them; "admin" is
            # the gateway's own right to manage policies and streams, not an XACML role
            roles = ", ".join(entry.get("roles") or []) or "no roles"
            admin = "  + admin" if entry.get("admin") else ""
            print(f"    {entry['subject']:<6} {entry['token']}  roles: {roles}{admin}", file=out)
        admin_entry = next((e for e in entries if e.get("admin")), None)
        if admin_entry is not None:
            token = str(admin_entry["token"])
            print(f"  for the xsg CLI and curl, as {admin_entry['subject']} (an administrator), "
                  "paste:", file=out)
    else:
        print(f"  auth file {config.auth_file}", file=out)
    if token is None:
        print("  for the xsg CLI and curl, paste (with your token):", file=out)
    print(f"    export XSG_URL={shlex.quote(base)}", file=out)
    print(f"    export XSG_TOKEN={shlex.quote(token) if token else '<token>'}", file=out)
    print('  try: curl -H "Authorization: Bearer $XSG_TOKEN" "$XSG_URL/policies"', file=out)
    out.flush()


def gateway_server(app: WsgiApp, config: GatewayConfig) -> HttpServer:
    """The gateway's HTTP server, with the configuration's limits (see server/serving.py)."""
    return HttpServer(app, host=config.host, port=config.port, threads=config.threads,
                      max_threads=config.max_threads, name="xsg",
                      max_connections=config.max_connections, idle_timeout=config.idle_timeout,
                      write_timeout=config.write_timeout, header_timeout=config.header_timeout,
                      min_body_rate=config.min_body_rate,
                      max_body=config.max_content_length,
                      tls_cert=str(config.tls_cert) if config.tls_cert else None,
                      tls_key=str(config.tls_key) if config.tls_key else None,
                      forwarded_allow_ips=config.forwarded_allow_ips)


def start_proxy(config: GatewayConfig, gateway_url: str) -> subprocess.Popen[bytes]:
    """The caching proxy as a child process beside the gateway.

    The feed token and webhook key travel in its environment, never on a command line."""
    env = dict(os.environ, XSG_PROXY_TOKEN=config.proxy_token or "",
               XSG_PROXY_SECRET=config.proxy_secret or "")
    cmd = [sys.executable, "-m", "proxy", "--upstream", gateway_url,
           "--host", config.host, "--port", str(config.proxy_port),
           "--log-level", config.log_level, "--log-format", config.log_format]
    if config.tls_cert is not None:
        # the proxy reaches the gateway over HTTPS with the gateway's certificate file as its CA
        # bundle (right for a self-signed certificate; one signed by a CA verifies only if the
        # file also holds that CA), and serves HTTPS itself with the same pair
        env.update(XSG_PROXY_UPSTREAM_CA=str(config.tls_cert),
                   XSG_PROXY_TLS_CERT=str(config.tls_cert), XSG_PROXY_TLS_KEY=str(config.tls_key))
    return subprocess.Popen(cmd, env=env)


def proxy_url(config: GatewayConfig) -> str:
    """The URL clients use for the proxy `xsg serve --proxy-port` runs beside the gateway."""
    host = config.host if config.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"{config.scheme}://{host}:{config.proxy_port}"


def serve(config: GatewayConfig, services: GatewayServices | None = None,
          out: TextIO | None = None) -> int:
    """Run the gateway in the foreground until SIGINT or SIGTERM; returns an exit status."""
    out = out or sys.stdout
    limit_malloc_arenas()  # before Spark's and the server's threads allocate (see its doc)
    if config.proxy_port and not (config.proxy_token and config.proxy_secret):
        config.proxy_token = config.proxy_token or secrets.token_urlsafe(32)
        config.proxy_secret = config.proxy_secret or secrets.token_urlsafe(32)
    check_port(config.host, config.port)
    if config.proxy_port:
        check_port(config.host, config.proxy_port, "the caching proxy")
    if services is None:
        where = f"[{config.host}]" if ":" in config.host else config.host
        print(f"starting the xsg gateway on {where}:{config.port} (data dir {config.data_dir})",
              file=out, flush=True)
        services = build_services(config, progress=StartupProgress(out))
    server = gateway_server(create_app(services=services), config)
    proxy: list[subprocess.Popen[bytes]] = []

    def started() -> None:
        tune_gc()  # what start-up built stays; see GC_THRESHOLDS
        if services.cluster is not None:  # the others reach this process from now on
            services.cluster.start(config.advertise_url or server.url)
        if config.proxy_port:
            proxy.append(start_proxy(config, server.url))
        _banner(services, server, out, proxy_url(config) if config.proxy_port else None)

    def stopping() -> None:
        print("stopping...", file=out, flush=True)
        for child in proxy:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
        # requests arriving from now on are refused (503), those running finish, before the
        # stream side closes its databases under them
        server.quiesce("the gateway is stopping")
        services.close_stream_side()  # readers end first, or the server waits for them forever

    try:
        with reload_on_sighup(services):
            run_until_signal(server, on_start=started, on_stop=stopping)
    finally:
        services.close()
    return 0


__all__ = ["PortUnavailable", "StartupProgress", "check_port", "gateway_server", "proxy_url",
           "serve", "start_proxy"]
