"""`GET /handles/<id>` relayed on the event loop: a handle stream costs the proxy no thread.

The Flask route relays with `requests` on a pool thread, which a stream would hold for as long
as it lasts (each consumer's reader one thread). This native route of the proxy's server
(server/bridge.py tries it before Flask) reads the gateway's answer with httpx's async client
and writes it through as it comes: undecoded bytes (Content-Encoding stays valid), each write
bounded by the server's `write_timeout` (a consumer that stops reading is cut; it resumes with
Last-Event-ID), the gateway's silence bounded by `Timeouts.stream_read`, the upstream closed
when the consumer leaves. A 404 or 410 drops the handle's cached answers, as the Flask route
does. The path goes upstream as the client sent it (never decoded and quoted again).
"""
from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING, Any

import httpx
from werkzeug.datastructures import Headers

from common.edge_affinity import AFFINITY_HEADER
from proxy.forward import (
    CACHE_HEADER,
    HOP_BY_HOP,
    NotForwardable,
    Timeouts,
    is_chunked,
    loggable_url_path,
    request_headers,
    tls_verify,
    wire_headers,
)
from server.bridge import BRIDGE, read_body, respond_error
from server.streaming import CONNECTION, Receive, Scope, Send, abort, writable

if TYPE_CHECKING:  # proxy.app builds the relay: no import at run time
    from proxy.app import ProxyRuntime
    from proxy.edges import EdgeChooser
    from server.bridge import Bridge

log = logging.getLogger(__name__)
# httpx logs every request it sends at INFO with its URL: here `/handles/<full handle id>`,
# which no log may carry (README "Logs": a handle_ref only). Our own lines say what matters.
logging.getLogger("httpx").setLevel(logging.WARNING)

_HANDLE = re.compile(r"^/handles/([^/]+)$")
HEADER_LIMIT = 64 * 1024  # a GET's body, if any, is read and dropped up to this


class HandleRelay:
    """The native route (see the module docstring); one per proxy app."""

    def __init__(self, runtime: ProxyRuntime) -> None:
        self.runtime = runtime
        self._client: httpx.AsyncClient | None = None

    def matches(self, scope: Scope) -> bool:
        return scope["method"] == "GET" and _HANDLE.match(scope["path"]) is not None

    def _client_for_loop(self) -> httpx.AsyncClient:
        if self._client is None:
            t = self.runtime.forwarder.timeouts or Timeouts()
            self._client = httpx.AsyncClient(
                trust_env=False, follow_redirects=False, verify=tls_verify(self.runtime.verify),
                timeout=httpx.Timeout(connect=t.connect, read=t.stream_read, write=t.connect,
                                      pool=t.connect),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))
        return self._client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime = self.runtime
        found = _HANDLE.match(scope["path"])
        assert found is not None  # the server calls a native route only when it `matches`
        ident = found.group(1)
        if await read_body(scope, receive, HEADER_LIMIT, 0, 0) is None:
            return
        incoming = Headers([(k.decode("latin-1"), v.decode("latin-1"))
                            for k, v in scope["headers"]])
        client_addr = scope["client"][0] if scope.get("client") else None
        headers = request_headers(incoming, client_addr, scope.get("scheme", "http"),
                                  incoming.get("Host", ""))
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        # the target as the client sent it (see proxy.forward.Forwarder): a URL would lose
        # its dot segments (`/handles/..` became `/`)
        target = runtime.forwarder.target(raw_path, scope.get("query_string", b""))
        client = self._client_for_loop()
        try:
            out_headers = wire_headers(headers)
        except NotForwardable as exc:
            await respond_error(send, 400, str(exc), close=False)
            return
        try:
            # several processes (a cluster): the next in turn, the others when it fails
            # before answering (a GET is safe to send again)
            origins = runtime.forwarder.order()
            for attempt, origin in enumerate(origins):
                try:
                    upstream = await client.send(client.build_request(
                        "GET", origin + "/", extensions={"target": target},
                        headers=out_headers), stream=True)
                    break
                except httpx.TransportError as exc:
                    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
                        runtime.forwarder.mark_down(origin)
                    if attempt == len(origins) - 1:
                        raise
        except httpx.TimeoutException:
            runtime.forwarder._count(failed=True)
            runtime.count("upstream_errors")
            await respond_error(send, 504, "gateway did not answer in time", close=False)
            return
        except httpx.HTTPError as exc:
            runtime.forwarder._count(failed=True)
            runtime.count("upstream_errors")
            await respond_error(send, 502, f"gateway unreachable: {type(exc).__name__}",
                                close=False)
            return
        runtime.forwarder._count(failed=False)
        runtime.count("forwarded")
        if upstream.status_code == 307 and runtime.edges is not None:
            # delivered through a plan topic: read on an edge of ours (proxy/edges.py)
            await upstream.aclose()
            query = scope.get("query_string", b"")
            edge_target = raw_path.encode("latin-1") + (b"?" + query if query else b"")
            # the readers of one plan topic meet on one edge (common/edge_affinity.py)
            key = upstream.headers.get(AFFINITY_HEADER) or ident
            from_edge = await self._from_edge(client, runtime.edges, key, edge_target,
                                              out_headers)
            if from_edge is None:
                runtime.count("upstream_errors")
                await respond_error(send, 502, "no edge of the gateway could be reached",
                                    close=False)
                return
            upstream = from_edge
        try:
            if upstream.status_code in (404, 410):
                runtime.cache.invalidate_handles([ident])
            keep_length = not is_chunked(upstream)
            out = [(k.lower(), v) for k, v in upstream.headers.raw
                   if k.lower().decode("latin-1") not in HOP_BY_HOP
                   or (k.lower() == b"content-length" and keep_length)]
            out = [(k, v) for k, v in out if k not in (b"date", b"server")]
            out.append((CACHE_HEADER.lower().encode(), b"bypass"))
            await send({"type": "http.response.start", "status": upstream.status_code,
                        "headers": out})
            await self._pass_body(upstream, scope, receive, send)
        finally:
            await upstream.aclose()

    @staticmethod
    async def _from_edge(client: httpx.AsyncClient, edges: EdgeChooser, key: str,
                         target: bytes, headers: list[tuple[bytes, bytes]]
                         ) -> httpx.Response | None:
        """The read's answer from the first edge of the handle's order that serves it: one
        that cannot be reached, or answers 503 (not serving), is passed over; the last one's
        503 is the answer (its Retry-After with it). None: no edge could be reached."""
        order = edges.order(key)
        for turn, edge in enumerate(order):
            try:
                answer = await client.send(client.build_request(
                    "GET", edge + "/", extensions={"target": target}, headers=headers),
                    stream=True)
            except httpx.TransportError as exc:
                if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
                    edges.mark_down(edge, "refused a connection")
                continue
            if answer.status_code == 503 and turn < len(order) - 1:
                edges.mark_down(edge, "is not serving (503)")
                await answer.aclose()
                continue
            return answer
        return None

    async def _pass_body(self, upstream: httpx.Response, scope: Scope, receive: Receive,
                         send: Send) -> None:
        """The body as it arrives; the consumer leaving, not reading, or the gateway breaking
        off ends it (the last two without the final chunk: an interrupted stream)."""
        connection = scope.get("extensions", {}).get(CONNECTION)
        bridge = scope.get("extensions", {}).get(BRIDGE)
        if connection is not None:
            connection.streams += 1
        relay = asyncio.ensure_future(self._copy(upstream, connection, bridge, send))
        gone = asyncio.ensure_future(_client_gone(receive))
        try:
            await asyncio.wait({relay, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if connection is not None:
                connection.streams -= 1
            for task in (relay, gone):
                task.cancel()
            await asyncio.gather(relay, gone, return_exceptions=True)
        if relay.done() and not relay.cancelled() and relay.exception() is not None:
            log.info("upstream stream %s broke off: %s",
                     loggable_url_path(self.runtime.forwarder.logged_url(upstream)),
                     type(relay.exception()).__name__)
            abort(connection)
            await asyncio.sleep(0)

    async def _copy(self, upstream: httpx.Response, connection: Any, bridge: Bridge | None,
                    send: Send) -> None:
        write_timeout = bridge.write_timeout if bridge is not None else 30.0
        async for chunk in upstream.aiter_raw():
            if not await writable(connection, write_timeout):
                if bridge is not None:
                    bridge.count("write_failed")
                abort(connection)
                await asyncio.sleep(0)
                return
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


async def _client_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


__all__ = ["HandleRelay"]
