"""Memory per idle connection on the gateway's server (server.serving, uvicorn).

    .venv/bin/python tests/bench/bench_idle_connections.py [--connections 2000]

The real gateway app (services over a temporary data directory, a recording stand-in for Spark)
on its server on loopback; N connections are opened from this process and left idle, first
without a byte sent, then after one keep-alive request each (GET /health). The server process's
resident memory (VmRSS) is read before and after each crowd, once the crowd is settled; the
figure is the growth divided by N. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def settle() -> int:
    gc.collect()
    time.sleep(1.0)
    return rss()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--connections", type=int, default=2000)
    args = ap.parse_args()
    n = args.connections

    from server.serving import HttpServer, raise_fd_limit
    from tests.pep.conftest import RecordingRuntime, build_gateway

    raise_fd_limit(2 * n + 1024)
    with tempfile.TemporaryDirectory(prefix="xsg-idle-") as tmp:
        app, services = build_gateway(Path(tmp) / "data", RecordingRuntime())
        server = HttpServer(app, threads=4, idle_timeout=600, max_connections=2 * n + 100)
        server.start()
        try:
            # warm-up: the code paths of a request, once
            for _ in range(20):
                with socket.create_connection(("127.0.0.1", server.port)) as s:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
                    while s.recv(65536):
                        pass
            base = settle()
            silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(n)]
            while server.connection_count < n:
                time.sleep(0.05)
            after_silent = settle()
            kept = []
            for _ in range(n):
                s = socket.create_connection(("127.0.0.1", server.port))
                s.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
                kept.append(s)
            for s in kept:
                data = b""
                while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                    data += s.recv(65536)
            after_kept = settle()
            print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()}")
            print(f"server process RSS: {base / 2**20:.1f} MiB before; {n:,} connections that "
                  f"sent nothing: +{(after_silent - base) / 2**20:.1f} MiB "
                  f"({(after_silent - base) / n / 1024:.1f} KiB each); {n:,} more after one "
                  f"keep-alive request each: +{(after_kept - after_silent) / 2**20:.1f} MiB "
                  f"({(after_kept - after_silent) / n / 1024:.1f} KiB each); connections open "
                  f"{server.connection_count}, pool threads {server.thread_count}")
            for s in silent + kept:
                s.close()
        finally:
            server.stop()
            services.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
