"""The caching proxy's stream relay on the shared server: a gateway stream that goes silent past
the relay's read bound, or breaks off, cuts the consumer's connection (no last chunk: the
consumer sees an interrupted stream and resumes), and a consumer that stops reading is cut by
the server's write bound, which closes the upstream response too."""
from __future__ import annotations

import socket
import time

import requests

from proxy.app import ProxyConfig, create_app
from proxy.forward import Timeouts
from server.serving import HttpServer


def upstream_app(environ, start_response):
    """/handles/<id>: one line, then silence (or, for /handles/endless, lines forever)."""
    start_response("200 OK", [("Content-Type", "application/x-ndjson")])
    path = environ["PATH_INFO"]

    def body():
        yield b'{"id":1,"row":{"x":1}}\n'
        if path.endswith("endless"):
            while True:
                yield b'{"id":2,"row":{"pad":"' + b"p" * 60000 + b'"}}\n'
        time.sleep(3)
    return body()


def start_pair(read_bound: float, write_timeout: float = 30.0):
    gateway = HttpServer(upstream_app, threads=2, name="fake-gateway").start()
    config = ProxyConfig(upstream=gateway.url, require_feed=False, start_feed=False,
                         timeouts=Timeouts(stream_read=read_bound))
    proxy = HttpServer(create_app(config), threads=2, name="proxy",
                       write_timeout=write_timeout).start()
    return gateway, proxy


def test_a_silent_upstream_stream_cuts_the_consumer():
    gateway, proxy = start_pair(read_bound=0.5)
    try:
        t0 = time.monotonic()
        with requests.get(f"{proxy.url}/handles/abc", stream=True, timeout=10) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines) == b'{"id":1,"row":{"x":1}}'
            try:
                for _ in lines:
                    pass
                ended = "cleanly"
            except requests.exceptions.ChunkedEncodingError:
                ended = "interrupted"
        assert ended == "interrupted" and time.monotonic() - t0 < 8
    finally:
        proxy.stop()
        gateway.stop()


def test_a_consumer_that_stops_reading_is_cut_and_the_upstream_closed():
    gateway, proxy = start_pair(read_bound=30, write_timeout=0.5)
    try:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", proxy.port))
        s.sendall(b"GET /handles/endless HTTP/1.1\r\nHost: p\r\n\r\n")
        deadline = time.monotonic() + 20
        while proxy.stats["write_failed"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proxy.stats["write_failed"] == 1
        # the proxy closed its upstream response: the fake gateway's writer fails in turn
        while gateway.connection_count and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gateway.connection_count == 0
        s.close()
    finally:
        proxy.stop()
        gateway.stop()


def test_relayed_streams_hold_no_proxy_thread():
    """The proxy relays handle streams on its event loop (proxy/relay.py): 20 readers, and its
    pool keeps its 2 threads."""
    gateway, proxy = start_pair(read_bound=30)
    socks = []
    try:
        for i in range(20):
            s = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
            s.sendall(f"GET /handles/h{i} HTTP/1.1\r\nHost: p\r\n\r\n".encode())
            socks.append(s)
        for s in socks:
            data = b""
            while b'"x":1' not in data:
                data += s.recv(65536)
        assert proxy.stream_count == 20 and proxy.thread_count == 2
    finally:
        for s in socks:
            s.close()
        proxy.stop()
        gateway.stop()
