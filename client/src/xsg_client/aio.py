"""The asyncio client: the same calls as `Client`, awaited, and handle streams read with
`async for`.

    from xsg_client import AsyncClient

    async with AsyncClient("https://gateway:8080", token="...") as xsg:
        grant = await xsg.request("weather")
        stream = await xsg.open(grant)
        async for row in stream.rows():
            ...

Reading resumes as the synchronous reader does (`xsg_client.client.HandleStream`): the same
state machine (`xsg_client._core.ReadState`) over httpx's asyncio transport.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from xsg_client._core import (
    Grant,
    HandleInfo,
    HandleRef,
    ReadOptions,
    ReadState,
    ReadToken,
    RetryLater,
    Settings,
    failure,
    handle_ref,
    json_object,
    redact_http_logs,
    transport_cause,
)
from xsg_client.access import AccessRequest, Query
from xsg_client.client import USER_AGENT, HandleLike
from xsg_client.errors import HTTPError, Unreachable
from xsg_client.events import End, Event, Row
from xsg_client.schema import HandleSchema, plan_streams, schema_from_plan, stream_types

if TYPE_CHECKING:
    import pandas
    import pyarrow


class AsyncClient:
    """`Client`, for asyncio (see `xsg_client.client.Client` for the arguments)."""

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 ca_file: str | None = None, timeout: float = 30.0,
                 read_timeout: float = 60.0) -> None:
        self.settings = Settings.make(url, token, ca_file, timeout, read_timeout)
        redact_http_logs()
        self._http = httpx.AsyncClient(verify=self.settings.verify(),
                                       timeout=self.settings.timeout,
                                       headers={"User-Agent": USER_AGENT},
                                       follow_redirects=False)

    @property
    def url(self) -> str:
        return self.settings.url

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, method: str, url: str, what: str, *, bearer: bool = True,
                    ok: tuple[int, ...] = (200, 201), **kwargs: Any) -> httpx.Response:
        headers = dict(kwargs.pop("headers", None) or {})
        if bearer:
            self.settings.need_token(f"{method} {what}")
            headers.update(self.settings.auth_headers())
        try:
            response = await self._http.request(method, url, headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise Unreachable(self.url, transport_cause(exc)) from None
        if response.status_code not in ok:
            raise failure(method, what, response.status_code, response.text,
                          response.reason_phrase)
        return response

    async def request(self, stream: str, action: str = "read", *, query: Query | None = None,
                      subject: str | None = None) -> Grant:
        """See `Client.request`."""
        return await self.send(AccessRequest.for_stream(stream, action, subject, query))

    async def request_file(self, path: str, *, query: Query | None = None) -> Grant:
        """See `Client.request_file`."""
        return await self.send(AccessRequest.from_file(path, query))

    async def send(self, access: AccessRequest) -> Grant:
        response = await self._call("POST", f"{self.url}/requests", "/requests",
                                    **access.http_content())
        return Grant.from_json(json_object(response.text, "POST /requests"))

    async def handles(self) -> list[HandleInfo]:
        """See `Client.handles`."""
        response = await self._call("GET", f"{self.url}/handles", "/handles")
        body = json_object(response.text, "GET /handles")
        return [HandleInfo.from_json(h) for h in body.get("handles") or ()]

    async def describe(self, handle: HandleLike) -> HandleInfo:
        """See `Client.describe`."""
        ref = self.ref(handle)
        response = await self._call("GET", ref.stream_url(), ref.shown,
                                    bearer=ref.read_token is None,
                                    headers={"Accept": "application/json"})
        return HandleInfo.from_json(json_object(response.text, f"GET {ref.shown}"))

    async def release(self, handle: HandleLike) -> dict[str, Any]:
        """See `Client.release`."""
        ref = self.ref(handle)
        response = await self._call("DELETE", ref.url, ref.shown)
        return json_object(response.text, f"DELETE {ref.shown}")

    async def read_token(self, handle: HandleLike) -> ReadToken:
        """See `Client.read_token`."""
        ref = self.ref(handle)
        response = await self._call("POST", f"{ref.url}/read-token", f"{ref.shown}/read-token")
        body = json_object(response.text, f"POST {ref.shown}/read-token")
        return ReadToken(str(body["read_token"]), str(body["url"]), str(body["expires_at"]),
                         int(body["expires_in"]))

    def ref(self, handle: HandleLike) -> HandleRef:
        """A handle reference (`BadHandle` for anything that is not one, or for a handle on
        another gateway: see `Settings.own`)."""
        return self.settings.own(handle_ref(handle, self.url))

    async def schema(self, plan: Mapping[str, Any]) -> HandleSchema:
        """See `Client.schema`."""
        types: dict[str, dict[str, str]] = {}
        if self.settings.token:
            for stream in plan_streams(plan):
                try:
                    response = await self._call(
                        "GET", f"{self.url}/streams/{quote(stream, safe='')}",
                        f"/streams/{stream}")
                except HTTPError:
                    continue
                types[stream] = stream_types(json_object(response.text, "GET /streams"))
        return schema_from_plan(plan, types)

    async def open(self, handle: HandleLike, *, last_event_id: int | None = None,
                   schema: HandleSchema | None = None, types: Mapping[str, str] | None = None,
                   resume_after_shutdown: bool = True,
                   reconnect_timeout: float | None = 300.0,
                   idle_timeout: float | None = None) -> AsyncHandleStream:
        """See `Client.open`."""
        ref = self.ref(handle)
        if ref.read_token is None:
            self.settings.need_token(f"reading {ref.shown}")
        options = ReadOptions(resume_after_shutdown, reconnect_timeout, idle_timeout)
        ended: End | None = None
        if schema is None:
            try:
                info = await self.describe(ref)
                schema = await self.schema(info.plan)
            except HTTPError as exc:
                if exc.status != 410:
                    raise
                ended = End(None, str(exc.body.get("state") or "ended"), exc.body.get("reason"))
                schema = HandleSchema(())
        if types:
            schema = schema.with_types(types)
        state = ReadState(ref, schema, last_event_id, options)
        state.end = ended
        return AsyncHandleStream(self, state)

    def _stream_headers(self, state: ReadState) -> dict[str, str]:
        headers = state.headers()
        if state.ref.read_token is None:
            headers.update(self.settings.auth_headers())
        return headers


class AsyncHandleStream:
    """`HandleStream` for asyncio: `async for event in stream`, `stream.rows()`,
    `stream.batches()`, `stream.frames()`."""

    def __init__(self, client: AsyncClient, state: ReadState) -> None:
        self._client = client
        self._state = state
        self._stop = asyncio.Event()

    @property
    def schema(self) -> HandleSchema:
        return self._state.schema

    @property
    def handle(self) -> str:
        return self._state.ref.url

    @property
    def last_event_id(self) -> int | None:
        return self._state.last_event_id

    @property
    def end(self) -> End | None:
        return self._state.end

    def __aiter__(self) -> AsyncIterator[Event]:
        return self.events()

    def close(self) -> None:
        """Stop reading: iteration ends at its next step (cancel the task reading it to end
        it at once)."""
        self._stop.set()

    async def events(self) -> AsyncIterator[Event]:
        """See `HandleStream.events`."""
        groups = self._groups()
        try:
            async for group in groups:
                for i, event in enumerate(group):
                    try:
                        yield event
                    except GeneratorExit:
                        self._state.given(group, i)
                        raise
        finally:
            await groups.aclose()

    async def rows(self, on_event: Callable[[Event], None] | None = None
                   ) -> AsyncIterator[dict[str, Any]]:
        """See `HandleStream.rows`."""
        groups = self._groups()
        try:
            async for group in groups:
                for i, event in enumerate(group):
                    if type(event) is Row:
                        try:
                            yield event.values
                        except GeneratorExit:
                            self._state.given(group, i)
                            raise
                    elif on_event is not None:
                        on_event(event)
        finally:
            await groups.aclose()

    async def _groups(self) -> AsyncGenerator[list[Event], None]:
        """See `HandleStream._groups`."""
        state, client = self._state, self._client
        if state.end is not None:
            if state.end.id is None:
                yield [state.end]
            return
        settings = client.settings
        idle = state.options.idle_timeout
        read_timeout = settings.read_timeout if idle is None else min(idle, settings.read_timeout)
        timeout = httpx.Timeout(settings.timeout, read=read_timeout)
        renewed = False
        while not self._stop.is_set():
            wait: float | None = None
            try:
                async with client._http.stream("GET", state.ref.stream_url(),
                                               headers=client._stream_headers(state),
                                               timeout=timeout) as response:
                    text = None
                    if response.status_code != 200:
                        text = (await response.aread()).decode("utf-8", "replace")
                    if (response.status_code == 401 and state.ref.read_token is not None
                            and settings.token and not renewed):
                        renewed = True
                        fresh = await client.read_token(state.ref)
                        state.ref = state.ref.with_read_token(client.ref(fresh.url).read_token)
                        continue
                    first = state.answered(response.status_code, text,
                                           response.headers.get("Retry-After"))
                    renewed = False
                    if first is not None:
                        yield [first]
                    if state.over():
                        return
                    async for chunk in response.aiter_bytes():
                        events = state.feed(chunk)
                        if events:
                            yield events
                        if (state.end is not None or state.resume_cause is not None
                                or self._stop.is_set()):
                            break
                        if state.idle():
                            return
                    if state.over() or self._stop.is_set():
                        return
                    cause = state.closed_cause()
            except RetryLater as exc:
                cause, wait = exc.cause, exc.retry_after
            except httpx.ReadTimeout:
                if idle is not None and state.idle():
                    return
                cause = f"nothing came for {read_timeout:g} s (not even a heartbeat)"
            except httpx.TransportError as exc:
                cause = transport_cause(exc)
            disconnected = state.lost(cause, wait)
            yield [disconnected]
            try:
                await asyncio.wait_for(self._stop.wait(), disconnected.retry_in)
                return
            except TimeoutError:
                pass

    async def batches(self, max_rows: int = 10_000, max_wait: float = 1.0,
                      id_column: str | None = None,
                      on_event: Callable[[Event], None] | None = None
                      ) -> AsyncIterator[pyarrow.RecordBatch]:
        """See `HandleStream.batches`: the stream is read by a task of its own meanwhile."""
        from xsg_client.batches import to_record_batch

        if max_rows < 1 or max_wait < 0:
            raise ValueError("max_rows must be at least 1 and max_wait at least 0")
        items: asyncio.Queue[Event | _Done] = asyncio.Queue(50_000)
        task = asyncio.ensure_future(_pump(self.events(), items))
        rows: list[dict[str, Any]] = []
        ids: list[int] = []
        first_at = 0.0
        try:
            while True:
                wait = None if not rows else max(0.0, first_at + max_wait - time.monotonic())
                try:
                    item = await asyncio.wait_for(items.get(), wait)
                except TimeoutError:
                    item = None
                done = False
                if isinstance(item, _Done):
                    if item.error is not None:
                        raise item.error
                    done = True
                elif isinstance(item, Row):
                    if not rows:
                        first_at = time.monotonic()
                    rows.append(item.values)
                    ids.append(item.id)
                elif item is not None and on_event is not None:
                    on_event(item)
                if rows and (len(rows) >= max_rows or done
                             or time.monotonic() >= first_at + max_wait):
                    yield to_record_batch(rows, self.schema, ids, id_column)
                    rows, ids = [], []
                if done:
                    return
        finally:
            task.cancel()

    async def frames(self, max_rows: int = 10_000, max_wait: float = 1.0,
                     id_column: str | None = None,
                     on_event: Callable[[Event], None] | None = None
                     ) -> AsyncIterator[pandas.DataFrame]:
        """See `HandleStream.frames`."""
        from xsg_client.batches import to_pandas

        async for batch in self.batches(max_rows, max_wait, id_column, on_event):
            yield to_pandas(batch)


class _Done:
    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


async def _pump(events: AsyncIterator[Event], items: asyncio.Queue[Event | _Done]
                ) -> None:
    error: BaseException | None = None
    try:
        async for event in events:
            await items.put(event)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer
        error = exc
    await items.put(_Done(error))


__all__ = ["AsyncClient", "AsyncHandleStream"]
