"""A sized response leaves in one write, head and body together (server/cycle.py); a stream's
head still leaves at once; what uvicorn checked and did (lengths, closes, its 500) is kept.

The cycle is uvicorn's own, driven as its protocol drives it; the transport records the writes
(the socket is the one thing replaced). Over real sockets, every other test of pep/http reads
the answers these writes make.
"""
from __future__ import annotations

import asyncio
import logging
import socket

import pytest
from flask import Flask, Response
from uvicorn.protocols.http.flow_control import FlowControl

from server.cycle import CoalescingCycle
from server.serving import HttpServer


class Transport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def close(self) -> None:
        self.calls.append(("close", b""))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def cycle(transport: Transport, method: str = "POST", keep_alive: bool = True):
    scope = {"type": "http", "method": method, "http_version": "1.1", "path": "/x",
             "headers": []}
    return CoalescingCycle(scope=scope, transport=transport, flow=FlowControl(transport),
                           logger=logging.getLogger("t"), access_logger=logging.getLogger("t"),
                           access_log=False, default_headers=[], message_event=asyncio.Event(),
                           expect_100_continue=False, keep_alive=keep_alive,
                           on_response=lambda: None)


def start(length: int | None = None, status: int = 200) -> dict:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http.response.start", "status": status, "headers": headers}


def body(data: bytes, more: bool = False) -> dict:
    return {"type": "http.response.body", "body": data, "more_body": more}


def run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def test_a_sized_answer_is_one_write():
    t = Transport()

    async def go():
        c = cycle(t)
        await c.send(start(2))
        assert t.calls == []  # held until the body comes
        await c.send(body(b"ok"))
        assert c.response_complete

    run(go())
    assert len(t.calls) == 1 and t.calls[0][0] == "write"
    head, _, rest = t.calls[0][1].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: 2" in head and rest == b"ok"


def test_a_close_comes_after_the_write_and_a_large_body_keeps_its_chunks():
    t = Transport()

    async def go():
        c = cycle(t, keep_alive=False)
        await c.send(start(6))
        await c.send(body(b"abc", more=True))  # the head with the first chunk
        await c.send(body(b"def"))

    run(go())
    assert [k for k, _ in t.calls] == ["write", "write", "close"]
    assert t.calls[0][1].endswith(b"connection: close\r\n\r\nabc") and t.calls[1][1] == b"def"


def test_a_stream_head_leaves_at_once_and_length_checks_stay():
    t = Transport()

    async def go():
        c = cycle(t)
        await c.send(start(None))  # no Content-Length: a stream, chunked
        assert len(t.calls) == 1 and b"transfer-encoding: chunked" in t.calls[0][1]
        c2 = cycle(Transport())
        await c2.send(start(1))
        with pytest.raises(RuntimeError, match="longer than Content-Length"):
            await c2.send(body(b"too long"))

    run(go())


def test_an_app_failing_between_head_and_body_gets_uvicorns_500_whole():
    t = Transport()

    async def app(scope, receive, send):
        await send(start(2))
        raise ValueError("boom")

    async def go():
        c = cycle(t)
        await c.run_asgi(app)

    run(go())
    written = b"".join(d for k, d in t.calls if k == "write")
    assert written.startswith(b"HTTP/1.1 500 ") and written.endswith(b"Internal Server Error")
    assert b"200 OK" not in written


def test_over_a_real_socket_answers_are_whole_and_keep_alive_works():
    app = Flask("t")

    @app.post("/x")
    def x():
        return Response(b"hello", content_type="text/plain")

    @app.get("/head")
    def head_only():
        return Response(b"abc", content_type="text/plain")

    with HttpServer(app, port=0, threads=2) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nz"
                      b"HEAD /head HTTP/1.1\r\nHost: a\r\n\r\n"
                      b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
            data = b""
            while data.count(b"HTTP/1.1 200") < 3 or not data.endswith(b"hello"):
                chunk = s.recv(65536)
                assert chunk, data
                data += chunk
    answers = data.split(b"HTTP/1.1 ")[1:]
    assert answers[0].endswith(b"\r\n\r\nhello") and answers[2].endswith(b"\r\n\r\nhello")
    assert b"content-length: 3" in answers[1] and answers[1].endswith(b"\r\n\r\n")
