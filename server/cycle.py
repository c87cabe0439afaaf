"""A response's head and body in one write when the body follows at once.

uvicorn writes a response's status line and headers when the application sends
`http.response.start`, and its body on `http.response.body`: two `write`s, hence two system
calls and, with `TCP_NODELAY`, two TCP segments and two wake-ups of the client for every small
answer. For the gateway's `POST /pdp` (a few hundred bytes each way) the second write cost
about as much as the decision's rendering. `CoalescingCycle` holds the head of a response that
declares its Content-Length until the body's first message, then writes both at once. A
response without a Content-Length (a stream, whose first event may come much later) keeps its
head written at once, so a reader still sees the status as soon as the route gives it.

Nothing else changes: the same checks run on the same messages (uvicorn's `send`, on a
transport that collects what it writes and passes on everything else), a client gone meanwhile
is handled as before, and a close requested while answering happens after the write.
"""
from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class _Collecting:
    """The connection's transport, collecting writes (and a close) until `flush`."""

    __slots__ = ("transport", "parts", "closing")

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.parts: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing or self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)

    def flush(self) -> None:
        if self.parts:
            self.transport.write(b"".join(self.parts))
        if self.closing:
            self.transport.close()


def _declares_length(message: dict[str, Any]) -> bool:
    return any(name.lower() == b"content-length" for name, _ in message.get("headers", ()))


class CoalescingCycle(RequestResponseCycle):
    """uvicorn's request/response cycle writing a sized response's head with its body (see the
    module docstring). The protocol (server/protocol.py) gives each cycle this class."""

    _held: Any = None  # a response start not written yet

    async def send(self, message: Any) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if message["type"] == "http.response.body":
                await self._send_together(held, message)
                return
            if message["type"] != "http.response.start":
                await super().send(held)  # then refuses `message`, as uvicorn always did
            # else a second start: uvicorn's own 500 for an app that failed before its body
            # (nothing was written yet, so the client gets that whole answer)
        if message["type"] == "http.response.start" and not self.response_started \
                and not self.disconnected and _declares_length(message):
            self._held = message
            return
        await super().send(message)

    async def _send_together(self, start: Any, body: Any) -> None:
        transport = self.transport
        collecting = _Collecting(transport)
        # stands in for the transport while the two messages are written (`_Collecting`)
        self.transport = collecting  # type: ignore[assignment]  # see above
        try:
            await super().send(start)
            await super().send(body)
        finally:
            self.transport = transport
            collecting.flush()


def coalescing(cycle: RequestResponseCycle | None) -> None:
    """Make `cycle` (just made by uvicorn, its task not started yet) a CoalescingCycle."""
    if cycle is not None and type(cycle) is RequestResponseCycle:
        cycle.__class__ = CoalescingCycle


__all__ = ["CoalescingCycle", "coalescing"]
