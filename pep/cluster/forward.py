"""Any process answers any request: what another process serves is forwarded there.

A route that finds its streams served by another process raises `Elsewhere`
(`pep.cluster.placement`), which the app answers `421 Misdirected Request` with the serving
process's id in `X-XSG-Owner`. This native route of the gateway's server (tried before Flask,
`server.bridge`) runs the stream-side requests (`POST /requests`, `GET` and `DELETE
/handles/<id>`, `POST /handles/<id>/derive`, writes under `/streams/<name>`) through the app
itself; on such a 421 it sends the request, as the client sent it, to that process and relays
its answer: status, headers and body as they come (a handle's stream too, on the event loop,
holding no thread). So clients, and the caching proxy, need not know which process serves
what. Forwarding rather than
redirecting: a redirect would show clients the processes' own addresses, which they may not
reach (behind the proxy), and an HTTP client drops the Authorization header when a redirect
changes the port.

A forwarded request carries `X-XSG-Forwarded-By` (the forwarding process), so the process it
reaches answers it itself; if that one no longer serves the streams (its lease moved) its 421
comes back and the request is tried again here (at most `MAX_HOPS` times). A process that
cannot be reached (it died, its lease has not expired yet) is answered `503` with
`Retry-After`: its streams move within the lease.
"""
from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

import httpx

from server.bridge import BRIDGE, BodyRefused, header, read_body, respond_error
from server.streaming import CONNECTION, Receive, Send, abort, writable

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # its lines would carry handle ids

OWNER_HEADER = "X-XSG-Owner"
FORWARDED_HEADER = "X-XSG-Forwarded-By"
LOCAL = "xsg.cluster.local"  # scope extension: the app answers this request itself
MAX_HOPS = 3
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate",
                        b"proxy-authorization", b"te", b"trailer", b"trailers",
                        b"transfer-encoding", b"upgrade", b"content-length", b"expect"})
Scope = dict[str, Any]  # an ASGI scope
_HANDLE = re.compile(r"^/handles/[^/]+$")
_HANDLE_ACTION = re.compile(r"^/handles/[^/]+/[^/]+$")
_STREAM = re.compile(r"^/streams/[^/]+(?:/.*)?$")


class ForwardRoute:
    """The native route (module docstring). `member_url(member)` is where a process listens
    (None: no such process); `moving_within` the seconds a dead process's streams take to
    move (said in the 503)."""

    def __init__(self, member: str, member_url: Callable[[str], str | None],
                 moving_within: float, stream_read: float = 60.0,
                 read_timeout: float = 300.0) -> None:
        self.member = member
        self.member_url = member_url
        self.moving_within = moving_within
        self.stream_read = stream_read
        self.read_timeout = read_timeout
        self._client: httpx.AsyncClient | None = None
        self.forwarded = 0  # requests forwarded (observable)

    def matches(self, scope: Scope) -> bool:
        if scope.get("type") != "http" or (scope.get("extensions") or {}).get(LOCAL):
            return False
        if header(scope, FORWARDED_HEADER.lower().encode()) is not None:
            return False  # forwarded here: answered here
        method, path = scope["method"], scope["path"]
        if path == "/requests":
            return bool(method == "POST")
        if _HANDLE.match(path):
            return method in ("GET", "DELETE")
        if _HANDLE_ACTION.match(path):  # POST /handles/<id>/derive
            return bool(method == "POST")
        return _STREAM.match(path) is not None and method in ("POST", "PUT", "PATCH", "DELETE")

    def _client_for_loop(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                trust_env=False, follow_redirects=False,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        return self._client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        bridge = scope["extensions"][BRIDGE]
        try:
            body = await read_body(scope, receive, bridge.max_body, bridge.min_body_rate,
                                   bridge.body_grace)
        except BodyRefused as exc:
            await respond_error(send, exc.status, exc.message)
            return
        if body is None:
            return
        for hop in range(MAX_HOPS):
            owner = await self._here(bridge, scope, body, receive, send)
            if owner is None:
                return  # answered here
            if await self._there(bridge, owner, scope, body, receive, send):
                return
            await asyncio.sleep(0.2 * (hop + 1))  # it moved meanwhile: ask again
        await respond_error(send, 503, "the stream is moving between gateway processes; retry",
                            headers=[(b"retry-after", b"1")])

    async def _here(self, bridge: Any, scope: Scope, body: bytes, receive: Receive,
                    send: Send) -> str | None:
        """Run the request through the app here; the process to forward it to when the app
        answered 421 (nothing of that answer is sent), else None (the answer was sent)."""
        local = dict(scope)
        local["extensions"] = {**(scope.get("extensions") or {}), LOCAL: True}
        given = False
        owner: list[str] = []

        async def replay() -> dict[str, Any]:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return dict(await receive())

        async def answer(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] == 421:
                named = dict(message.get("headers") or ()).get(OWNER_HEADER.lower().encode())
                if named:
                    owner.append(bytes(named).decode("latin-1"))
                    return
            if owner:
                return  # the 421's body
            await send(message)

        await bridge(local, replay, answer)
        return owner[0] if owner else None

    async def _there(self, bridge: Any, member: str, scope: Scope, body: bytes,
                     receive: Receive, send: Send) -> bool:
        """Forward to `member` and relay its answer (True), or False when it answered 421 (it
        no longer serves the streams)."""
        url = await bridge.in_pool(self.member_url, member)
        if url is None or member == self.member:
            await self._unreachable(send, "it is not a member of this gateway any more")
            return True
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP
                   and k.lower() != FORWARDED_HEADER.lower().encode()]
        headers.append((FORWARDED_HEADER.encode(), self.member.encode()))
        client_addr = scope["client"][0] if scope.get("client") else None
        if client_addr:
            prior = header(scope, b"x-forwarded-for")
            headers = [(k, v) for k, v in headers if k.lower() != b"x-forwarded-for"]
            headers.append((b"x-forwarded-for", (prior + b", " if prior else b"")
                            + client_addr.encode()))
        if body:
            headers.append((b"content-length", str(len(body)).encode()))
        raw_path = scope.get("raw_path") or scope["path"].encode("latin-1")
        query = scope.get("query_string", b"")
        target = bytes(raw_path) + (b"?" + bytes(query) if query else b"")
        streaming = scope["method"] == "GET"
        client = self._client_for_loop()
        try:
            upstream = await client.send(client.build_request(
                scope["method"], url.rstrip("/") + "/", headers=headers, content=body or None,
                extensions={"target": target},
                timeout=httpx.Timeout(connect=3.0, write=30.0, pool=3.0,
                                      read=self.stream_read if streaming else self.read_timeout)),
                stream=True)
        except httpx.HTTPError as exc:
            await self._unreachable(send, type(exc).__name__)
            return True
        try:
            if upstream.status_code == 421 and upstream.headers.get(OWNER_HEADER):
                return False
            self.forwarded += 1
            keep_length = "chunked" not in upstream.headers.get("transfer-encoding", "").lower()
            out = [(k.lower(), v) for k, v in upstream.headers.raw
                   if k.lower() not in HOP_BY_HOP or (k.lower() == b"content-length"
                                                      and keep_length)]
            out = [(k, v) for k, v in out if k not in (b"date", b"server")]
            await send({"type": "http.response.start", "status": upstream.status_code,
                        "headers": out})
            await self._pass_body(upstream, scope, receive, send, bridge)
            return True
        finally:
            await upstream.aclose()

    async def _unreachable(self, send: Send, why: str) -> None:
        await respond_error(
            send, 503, f"the gateway process serving this stream cannot be reached ({why}); "
                       f"its streams move to another process within about "
                       f"{self.moving_within:.0f} s: retry", close=False,
            headers=[(b"retry-after", b"1")])

    async def _pass_body(self, upstream: httpx.Response, scope: Scope, receive: Receive,
                         send: Send, bridge: Any) -> None:
        """The body as it arrives; the client leaving, not reading, or the upstream breaking
        off ends it (the last two cut the connection: an interrupted stream, resumed with
        Last-Event-ID)."""
        connection = (scope.get("extensions") or {}).get(CONNECTION)
        relay = asyncio.ensure_future(self._copy(upstream, connection, bridge, send))
        gone = asyncio.ensure_future(_client_gone(receive))
        try:
            await asyncio.wait({relay, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (relay, gone):
                task.cancel()
            await asyncio.gather(relay, gone, return_exceptions=True)
        if relay.done() and not relay.cancelled() and relay.exception() is not None:
            log.info("cluster: a forwarded answer broke off: %s",
                     type(relay.exception()).__name__)
            abort(connection)
            await asyncio.sleep(0)

    @staticmethod
    async def _copy(upstream: httpx.Response, connection: Any, bridge: Any,
                    send: Send) -> None:
        write_timeout = bridge.write_timeout if bridge is not None else 30.0
        async for chunk in upstream.aiter_raw():
            if not await writable(connection, write_timeout):
                abort(connection)
                await asyncio.sleep(0)
                return
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _client_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


__all__ = ["FORWARDED_HEADER", "ForwardRoute", "OWNER_HEADER"]
