"""`xsg serve`: the gateway in the foreground, with its banner and, optionally, a caching proxy.

The proxy runs as a child process (`python -m proxy`), reached over HTTP like a proxy on another
host; this module never imports it.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from typing import TextIO

from pep.config import GatewayConfig
from pep.http.app import create_app
from pep.http.server import HttpServer, limit_malloc_arenas, run_until_signal
from pep.services import GatewayServices, build_services


def _banner(services: GatewayServices, server: HttpServer, out: TextIO) -> None:
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


def gateway_server(app, config: GatewayConfig) -> HttpServer:
    """The gateway's HTTP server, with the configuration's limits (see pep/http/server.py)."""
    return HttpServer(app, host=config.host, port=config.port, threads=config.threads,
                      max_threads=config.max_threads, name="xsg",
                      max_connections=config.max_connections, idle_timeout=config.idle_timeout,
                      write_timeout=config.write_timeout)


def start_proxy(config: GatewayConfig, gateway_url: str, out: TextIO) -> subprocess.Popen:
    """The caching proxy as a child process beside the gateway.

    The feed token and webhook key travel in its environment, never on a command line."""
    env = dict(os.environ, XSG_PROXY_TOKEN=config.proxy_token or "",
               XSG_PROXY_SECRET=config.proxy_secret or "")
    cmd = [sys.executable, "-m", "proxy", "--upstream", gateway_url,
           "--host", config.host, "--port", str(config.proxy_port)]
    proc = subprocess.Popen(cmd, env=env)
    host = config.host if config.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
    print(f"  proxy     http://{host}:{config.proxy_port} (caching proxy in front of the gateway; "
          f"stats at /proxy/stats)", file=out, flush=True)
    return proc


def serve(config: GatewayConfig, services: GatewayServices | None = None,
          out: TextIO | None = None) -> int:
    """Run the gateway in the foreground until SIGINT or SIGTERM; returns an exit status."""
    out = out or sys.stdout
    limit_malloc_arenas()  # before Spark's and the server's threads allocate (see its doc)
    if config.proxy_port and not (config.proxy_token and config.proxy_secret):
        config.proxy_token = config.proxy_token or secrets.token_urlsafe(32)
        config.proxy_secret = config.proxy_secret or secrets.token_urlsafe(32)
    services = services or build_services(config)
    server = gateway_server(create_app(services=services), config)
    proxy: list[subprocess.Popen] = []

    def started() -> None:
        _banner(services, server, out)
        if config.proxy_port:
            proxy.append(start_proxy(config, server.url, out))

    def stopping() -> None:
        print("stopping...", file=out, flush=True)
        for child in proxy:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
        services.close_stream_side()  # readers end first, or the server waits for them forever

    try:
        run_until_signal(server, on_start=started, on_stop=stopping)
    finally:
        services.close()
    return 0


__all__ = ["serve", "start_proxy", "gateway_server"]
