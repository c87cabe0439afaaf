"""The synchronous client: ask for a stream, read its handle, release it.

    from xsg_client import Client

    with Client("https://gateway:8080", token="...", ca_file="ca.pem") as xsg:
        grant = xsg.request("weather", action="subscribe", query={"filter": "rainrate > 8"})
        for warning in grant.warnings:
            print(warning["message"])
        with xsg.open(grant) as stream:
            for row in stream.rows():           # typed dicts: datetimes, exact ints
                ...
            print(stream.end)                    # End(kind='revoked', reason=...)
        xsg.release(grant)

Everything the gateway refuses is an `HTTPError` (status, the gateway's message and body);
reading a handle resumes across dropped connections and gateway restarts (`HandleStream`).
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Generator, Iterator, Mapping
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
from xsg_client.errors import HTTPError, Unreachable
from xsg_client.events import End, Event, Row
from xsg_client.schema import HandleSchema, plan_streams, schema_from_plan, stream_types

if TYPE_CHECKING:  # the extras: imported only when batches are asked for
    import pandas
    import pyarrow

USER_AGENT = "xsg-client/0.1.0"
HandleLike = Any  # a handle URL or id (str), a HandleRef, or a Grant / HandleInfo


class Client:
    """A connection to one gateway, as one subject (its bearer `token`).

    `url` defaults to `XSG_URL` (else http://127.0.0.1:8080), `token` to `XSG_TOKEN`;
    `ca_file` is a PEM file of the authorities that sign the gateway's certificate (HTTPS with
    a private CA); `timeout` bounds each call, `read_timeout` the silence of a handle stream
    before it counts as broken (the gateway sends a heartbeat every 15 s by default). Use it
    as a context manager, or `close()` it."""

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 ca_file: str | None = None, timeout: float = 30.0,
                 read_timeout: float = 60.0) -> None:
        self.settings = Settings.make(url, token, ca_file, timeout, read_timeout)
        redact_http_logs()
        self._http = httpx.Client(verify=self.settings.verify(), timeout=self.settings.timeout,
                                  headers={"User-Agent": USER_AGENT}, follow_redirects=False)

    @property
    def url(self) -> str:
        return self.settings.url

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls ------------------------------------------------------------------------------------

    def _call(self, method: str, url: str, what: str, *, bearer: bool = True,
              ok: tuple[int, ...] = (200, 201), **kwargs: Any) -> httpx.Response:
        headers = dict(kwargs.pop("headers", None) or {})
        if bearer:
            self.settings.need_token(f"{method} {what}")
            headers.update(self.settings.auth_headers())
        try:
            response = self._http.request(method, url, headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise Unreachable(self.url, transport_cause(exc)) from None
        if response.status_code not in ok:
            raise failure(method, what, response.status_code, response.text,
                          response.reason_phrase)
        return response

    # -- asking for a stream ----------------------------------------------------------------------

    def request(self, stream: str, action: str = "read", *, query: Query | None = None,
                subject: str | None = None) -> Grant:
        """Ask for `stream` (to `action` it), with your own `query` (its JSON form as a dict,
        or its XML or JSON text; optional): the gateway decides, merges your query with the
        policy's obligations, and opens (or finds) your handle. `HTTPError` when it refuses:
        403 (denied, or a query that asks for what is hidden), 409 (you already read this
        stream with another query: `body["handle"]` is the one to release), 422 (no result
        can ever come)."""
        return self.send(AccessRequest.for_stream(stream, action, subject, query))

    def request_file(self, path: str, *, query: Query | None = None) -> Grant:
        """Send a XACML request file (XML or JSON) as it is, with your own `query` beside it."""
        return self.send(AccessRequest.from_file(path, query))

    def send(self, access: AccessRequest) -> Grant:
        """Send an access request (`AccessRequest`) to `POST /requests`."""
        response = self._call("POST", f"{self.url}/requests", "/requests",
                              **access.http_content())
        return Grant.from_json(json_object(response.text, "POST /requests"))

    # -- handles -----------------------------------------------------------------------------------

    def handles(self) -> list[HandleInfo]:
        """Your handles, live and ended, oldest first."""
        body = json_object(self._call("GET", f"{self.url}/handles", "/handles").text,
                           "GET /handles")
        return [HandleInfo.from_json(h) for h in body.get("handles") or ()]

    def describe(self, handle: HandleLike) -> HandleInfo:
        """A handle's description (`HTTPError` 410 when it has ended: `body["state"]` and
        `body["reason"]` say how)."""
        ref = self.ref(handle)
        response = self._call("GET", ref.stream_url(), ref.shown, bearer=ref.read_token is None,
                              headers={"Accept": "application/json"})
        return HandleInfo.from_json(json_object(response.text, f"GET {ref.shown}"))

    def release(self, handle: HandleLike) -> dict[str, Any]:
        """Let a handle go: its readers get `released` and its query stops (if it was the
        last on its plan). Returns the gateway's answer (`id`, `state`, `reason`)."""
        ref = self.ref(handle)
        response = self._call("DELETE", ref.url, ref.shown)
        return json_object(response.text, f"DELETE {ref.shown}")

    def read_token(self, handle: HandleLike) -> ReadToken:
        """A short-lived read token for a handle of yours: its `url` reads the handle with no
        bearer token (for a browser's EventSource, or a process that must not hold your
        token); it expires after the gateway's `read_token_ttl` (300 s by default)."""
        ref = self.ref(handle)
        response = self._call("POST", f"{ref.url}/read-token", f"{ref.shown}/read-token")
        body = json_object(response.text, f"POST {ref.shown}/read-token")
        return ReadToken(str(body["read_token"]), str(body["url"]), str(body["expires_at"]),
                         int(body["expires_in"]))

    def ref(self, handle: HandleLike) -> HandleRef:
        """A handle reference (`BadHandle` for anything that is not one, or for a handle on
        another gateway: see `Settings.own`)."""
        return self.settings.own(handle_ref(handle, self.url))

    def schema(self, plan: Mapping[str, Any]) -> HandleSchema:
        """The schema of a handle with this plan: its streams' attribute types are read with
        `GET /streams/<name>` (a stream you may not see, or no bearer token: its columns are
        typed `json`, values as JSON gives them)."""
        types: dict[str, dict[str, str]] = {}
        if self.settings.token:
            for stream in plan_streams(plan):
                try:
                    response = self._call("GET", f"{self.url}/streams/{quote(stream, safe='')}",
                                          f"/streams/{stream}")
                except HTTPError:
                    continue
                types[stream] = stream_types(json_object(response.text, "GET /streams"))
        return schema_from_plan(plan, types)

    # -- reading -----------------------------------------------------------------------------------

    def open(self, handle: HandleLike, *, last_event_id: int | None = None,
             schema: HandleSchema | None = None, types: Mapping[str, str] | None = None,
             resume_after_shutdown: bool = True, reconnect_timeout: float | None = 300.0,
             idle_timeout: float | None = None) -> HandleStream:
        """A reader of `handle` (its URL, a read URL with `?read_token=`, its id, or a
        `Grant`), from after `last_event_id` (None: from the oldest row the gateway keeps).

        Its rows are typed by `schema` (default: derived from the handle's plan and its
        streams' schemas; `types` overrides some columns, e.g. `{"ts": "timestamp"}`). A
        connection that breaks is made again after the last event read, for at most
        `reconnect_timeout` seconds in a row (None: for ever), then `ConnectionLost`; the
        gateway stopping (`shutdown`) is waited out the same way unless
        `resume_after_shutdown` is False (then reading ends with it). With `idle_timeout`,
        reading stops once no event came for that many seconds (read what is there, then
        stop). `HTTPError` now when the gateway refuses the handle (404: not yours, or no such
        handle)."""
        ref = self.ref(handle)
        if ref.read_token is None:
            self.settings.need_token(f"reading {ref.shown}")
        options = ReadOptions(resume_after_shutdown, reconnect_timeout, idle_timeout)
        ended: End | None = None
        if schema is None:
            try:
                info = self.describe(ref)
                schema = self.schema(info.plan)
            except HTTPError as exc:
                if exc.status != 410:
                    raise
                ended = End(None, str(exc.body.get("state") or "ended"), exc.body.get("reason"))
                schema = HandleSchema(())
        if types:
            schema = schema.with_types(types)
        state = ReadState(ref, schema, last_event_id, options)
        state.end = ended
        return HandleStream(self, state)

    def _stream_headers(self, state: ReadState) -> dict[str, str]:
        headers = state.headers()
        if state.ref.read_token is None:
            headers.update(self.settings.auth_headers())
        return headers


class HandleStream:
    """A reader of one handle (`Client.open`): iterate it for every event (`events()`), or its
    rows only (`rows()`), or Arrow / pandas batches (`batches()`, `frames()`).

    Events are `Row`, `Gap`, `Notice` (`stalled`, `resumed`, ...), `Disconnected` and
    `Reconnected` (this reader's own connection), and last `End` (revoked, released, ended;
    shutdown when not resumed). `last_event_id` is where a later reader resumes; `end` is the
    `End` once it came. Reading again after a `break` goes on after the last event given."""

    def __init__(self, client: Client, state: ReadState) -> None:
        self._client = client
        self._state = state
        self._stop = threading.Event()
        self._response: httpx.Response | None = None

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

    def __enter__(self) -> HandleStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def close(self) -> None:
        """Stop reading (from any thread): the connection is closed, iteration ends."""
        self._stop.set()
        response = self._response
        if response is not None:
            _shut(response)

    def events(self) -> Iterator[Event]:
        """Every event, in order, until the handle's end (or `idle_timeout`, or `close()`)."""
        groups = self._groups()
        try:
            for group in groups:
                for i, event in enumerate(group):
                    try:
                        yield event
                    except GeneratorExit:
                        self._state.given(group, i)
                        raise
        finally:
            groups.close()

    def rows(self, on_event: Callable[[Event], None] | None = None) -> Iterator[dict[str, Any]]:
        """The rows only, as dicts of typed values; every other event goes to `on_event`
        (when given) as it comes, the final one included."""
        groups = self._groups()
        try:
            for group in groups:
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
            groups.close()

    def _groups(self) -> Generator[list[Event], None, None]:
        """The events in groups, as they come: those of one chunk read from the socket, or one
        event of this reader's own (`Disconnected`, `Reconnected`, an `End` it was answered)."""
        state, client = self._state, self._client
        if state.end is not None:
            if state.end.id is None:  # ended before this reader: say so once
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
                with client._http.stream("GET", state.ref.stream_url(),
                                         headers=client._stream_headers(state),
                                         timeout=timeout) as response:
                    self._response = response
                    text = None if response.status_code == 200 else response.read().decode(
                        "utf-8", "replace")
                    if (response.status_code == 401 and state.ref.read_token is not None
                            and settings.token and not renewed):
                        # the read token expired (or the gateway restarted with a key of its
                        # own): the owner's bearer token gets a new one
                        renewed = True
                        fresh = client.read_token(state.ref)
                        state.ref = state.ref.with_read_token(
                            client.ref(fresh.url).read_token)
                        continue
                    first = state.answered(response.status_code, text,
                                           response.headers.get("Retry-After"))
                    renewed = False
                    if first is not None:
                        yield [first]
                    if state.over():
                        return
                    for chunk in response.iter_bytes():
                        events = state.feed(chunk)
                        if events:
                            yield events
                        if state.over() or state.resume_cause is not None:
                            break
                        if state.idle():
                            return
                    if state.over():
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
            finally:
                self._response = None
            if self._stop.is_set():
                return
            disconnected = state.lost(cause, wait)
            yield [disconnected]
            if self._stop.wait(disconnected.retry_in):
                return

    def batches(self, max_rows: int = 10_000, max_wait: float = 1.0,
                id_column: str | None = None,
                on_event: Callable[[Event], None] | None = None
                ) -> Iterator[pyarrow.RecordBatch]:
        """The rows as Arrow record batches (needs pyarrow): a batch once `max_rows` rows came,
        or `max_wait` seconds after its first row, typed by the schema (timestamps as
        `timestamp[us, UTC]`, longs as int64); `id_column` adds each row's event id. The
        stream is read on a thread of its own meanwhile; other events go to `on_event`."""
        from xsg_client.batches import to_record_batch
        from xsg_client.tail import Tail

        with Tail(self) as tail:
            for rows, ids in tail.row_groups(max_rows, max_wait, on_event):
                yield to_record_batch(rows, self.schema, ids, id_column)

    def frames(self, max_rows: int = 10_000, max_wait: float = 1.0,
               id_column: str | None = None,
               on_event: Callable[[Event], None] | None = None
               ) -> Iterator[pandas.DataFrame]:
        """`batches()` as pandas DataFrames (needs pandas): longs as nullable `Int64` (exact,
        never through a float), timestamps as `datetime64[us, UTC]`."""
        from xsg_client.batches import to_pandas

        for batch in self.batches(max_rows, max_wait, id_column, on_event):
            yield to_pandas(batch)


def _shut(response: httpx.Response) -> None:
    """Close a streaming response from another thread: shut its socket down first (closing
    alone does not wake a thread blocked reading it)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


__all__ = ["Client", "HandleStream", "USER_AGENT"]
