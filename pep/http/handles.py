"""Reading and releasing handles: `GET /handles`, `GET /handles/<id>`, `DELETE /handles/<id>`.

A handle is read by its owner only (anyone else gets 404, the same as for an id that does not
exist):
- `Accept: text/event-stream`: Server-Sent Events. A row is `id: <n>` + `data: <row JSON>`
  (the default `message` event); a `gap` event (`data: {"lost": k, "resume_from": n}`) says
  rows were dropped because the reader was too slow or away (k is null when rows may have died
  with a restarted gateway and nobody can count them; a Kafka handle without a window is given
  such rows again, under the ids they had: no gap); a notice is `id: <n>` + `event: <kind>` + `data:
  {"event": kind, ...}` (e.g. `stalled`: the stream's query makes no progress; it is not a row and
  the stream goes on); the last event is `revoked`, `released`, `ended` or `shutdown`, then the
  connection closes. A comment line is sent every `heartbeat` seconds (default 15) while nothing
  else is. Resume with `Last-Event-ID` (or `?last_event_id=`): every event with an id (rows, gaps,
  notices) is a place to resume from.
- `Accept: application/x-ndjson` (also the answer to `*/*` or no Accept): JSON lines, the same
  events: `{"id": n, "row": {...}}`, `{"id": n, "event": "gap", "lost": k, ...}`,
  `{"id": n, "event": "stalled", ...}` (a notice), `{"event": "heartbeat"}`, and finally
  `{"id": n, "event": "revoked", "reason": ...}`.
- `Accept: application/json`: the handle's description.
- A handle that is not live answers 410 Gone with its state and reason, except one that ended
  on its own terms keeping its rows (its privacy budget spent): a reader that connects after
  the end still gets the rows it paid for (from its Last-Event-ID), then the final `ended`
  event; after a reader was given that event, or `KEPT_ROWS_SECONDS` (15 minutes) after the
  end, it answers 410 too. A handle of a deleted
  stream answers 404, like its stream, for good (`pep/streams/lifecycle.py`).

Delivery: on the gateway's server (`server.serving`) a reader holds no thread. The route hands
a `HandleStream` to the server's event loop (`server.streaming`), which is woken when the
handle's buffer gets events and writes whatever is there as one chunk (many events per write;
the rows' JSON texts go out as the runtime encoded them). A reader whose socket does not drain for
the server's `write_timeout` is disconnected; its handle stays live and it may reconnect with
`Last-Event-ID` (rows it missed meanwhile are still there, or a `gap` says how many went).
Under another WSGI server (or Flask's test client) the same events come from a generator.

Limits: a subject reads at most `max_readers_per_subject` streams at once (all its handles
together); one more is answered 429 with `Retry-After`.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from common.edge_affinity import AFFINITY_HEADER
from common.http.auth import current_identity, require_identity
from common.http.errors import error_response
from common.numbers import parse_int
from pep.core.errors import Gone, NotFound, Unavailable
from pep.handles.buffer import Event, HandleBuffer
from pep.handles.records import HandleRecord
from pep.http.current import configured_base_url, current_services, may_see
from pep.http.read_tokens import require_identity_or_read_token
from pep.http.urls import public_base
from pep.streams.visibility import hidden_from
from server.streaming import STREAM_BODY, Wake

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
DEFAULT_HEARTBEAT = 15.0
DEFAULT_MAX_READERS_PER_SUBJECT = 32
READER_RETRY_AFTER = 5  # seconds, in the Retry-After of a refused reader


def sse_event(event: Event) -> str:
    """One SSE event; row data is single-line JSON, so one `data:` line suffices."""
    if event.kind == "row":
        return f"id: {event.id}\ndata: {event.data}\n\n"
    return f"id: {event.id}\nevent: {event.kind}\ndata: {event.data}\n\n"


SSE_ROW = "id: %d\ndata: %s\n\n"  # sse_event of a row
NDJSON_ROW = '{"id":%d,"row":%s}\n'  # ndjson_event of a row


def ndjson_event(event: Event) -> str:
    if event.kind == "row":
        return f'{{"id":{event.id},"row":{event.data}}}\n'
    data = event.data.strip()
    inner = data[1:-1].strip() if data.startswith("{") and data.endswith("}") else ""
    return f'{{"id":{event.id}' + (f",{inner}" if inner else "") + "}\n"


SSE_HEARTBEAT = ": keep-alive\n\n"
NDJSON_HEARTBEAT = '{"event":"heartbeat"}\n'


def stream_events(buffer: HandleBuffer, after: int | None, fmt: Callable[[Event], str],
                  heartbeat_text: str, heartbeat: float, opening: str = ""
                  ) -> Generator[bytes, None, None]:
    """Yield formatted events (UTF-8 bytes, as WSGI wants them) as they come; a heartbeat when
    idle; stop after the final event."""
    if opening:
        yield opening.encode()
    beat = heartbeat_text.encode()
    cursor = after
    while True:
        events = buffer.read(cursor, timeout=heartbeat)
        if not events:
            yield beat
            continue
        if buffer.withholds and not events[-1].final:
            # Revoked while we were reading: rows not yet on the wire are withheld.
            events = buffer.read(events[-1].id, timeout=0) or events
            events = [e for e in events if e.final] or events
        yield "".join(fmt(e) for e in events).encode("utf-8")
        cursor = events[-1].id
        if events[-1].final:
            return


class HandleStream:
    """A handle's events as a `server.streaming.StreamBody`: the server's event loop pulls
    what the buffer has (never waiting), formatted, when the buffer calls the server's `Wake`
    (its waiter; `urgent()` for the final event)."""

    def __init__(self, buffer: HandleBuffer, after: int | None, fmt: Callable[[Event], str],
                 heartbeat_text: str, heartbeat: float, opening: str = "",
                 on_close: Callable[[], None] | None = None,
                 row_template: str | None = None) -> None:
        self.buffer = buffer
        self.cursor = after
        self.fmt = fmt
        # `fmt` of a row event as `row_template % (id, row)`: rows then take the buffer's
        # one-pass path (`HandleBuffer.read_rows_text`)
        self.row_template = row_template
        self.heartbeat_interval = heartbeat
        self._beat = heartbeat_text.encode()
        self._opening = opening.encode()
        self._on_close = on_close
        self._wake: Wake | None = None
        self._closed = False

    def start(self, wake: Wake) -> None:
        self._wake = wake
        self.buffer.add_waiter(wake)

    def pull(self, max_bytes: int) -> tuple[bytes, bool]:
        out, self._opening = self._opening, b""
        buffer = self.buffer
        if self.row_template is not None:
            rows = buffer.read_rows_text(self.cursor, self.row_template, max_bytes)
            # revoked since (withholds): the event path below reads its final event instead
            if rows is not None and not buffer.withholds:
                text, self.cursor = rows
                return out + text.encode("utf-8"), False
        events = buffer.read(self.cursor, timeout=0, max_bytes=max_bytes)
        if not events:
            return out, False
        if buffer.withholds and not events[-1].final:
            # Revoked while we were reading: rows not yet on the wire are withheld.
            events = [e for e in buffer.read(events[-1].id, timeout=0) if e.final] or events
        self.cursor = events[-1].id
        fmt = self.fmt
        text = "".join([fmt(e) for e in events])
        return out + text.encode("utf-8"), events[-1].final

    def has_more(self) -> bool:
        """Whether the buffer holds something this stream has not pulled: after a pull that
        took it all, the server waits for the next wake instead of pulling again for nothing
        (an empty pull takes the buffer's lock twice and builds a read; per stream and micro-
        batch, with thousands of streams on one event loop)."""
        buffer = self.buffer
        cursor = buffer.base if self.cursor is None else self.cursor
        return cursor < buffer.last_id

    def retract(self) -> bool:
        """Bytes pulled but not written yet must not go out: the handle ended meanwhile (its
        final event follows instead)."""
        return self.buffer.withholds

    def heartbeat(self) -> bytes:
        return self._beat

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._wake is not None:
            self.buffer.remove_waiter(self._wake)
        if self._on_close is not None:
            self._on_close()


class ReaderSlots:
    """How many handle streams each subject reads at once, bounded per subject."""

    def __init__(self, per_subject: int) -> None:
        self.per_subject = per_subject
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, subject: str) -> bool:
        with self._lock:
            n = self._counts.get(subject, 0)
            if n >= self.per_subject:
                return False
            self._counts[subject] = n + 1
            return True

    def release(self, subject: str) -> None:
        with self._lock:
            n = self._counts.get(subject, 0) - 1
            if n > 0:
                self._counts[subject] = n
            else:
                self._counts.pop(subject, None)

    def count(self, subject: str) -> int:
        with self._lock:
            return self._counts.get(subject, 0)

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


def _released_once(release: Callable[[], None]) -> Callable[[], None]:
    done = threading.Lock()

    def once() -> None:
        if done.acquire(blocking=False):
            release()
    return once


class _Generated:
    """A handle stream on a WSGI server's thread. `release` (run once) frees the reader's slot
    when the stream ends or when the server closes it, also before its first event: a
    generator closed before it started never runs its `finally`, and the slot would stay
    taken (at the per-subject limit: a 429 for every new reader of that subject)."""

    def __init__(self, body: Generator[bytes, None, None], release: Callable[[], None]) -> None:
        self._body = body
        self._release = release

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._body)
        except BaseException:  # the end of the stream, or its failure
            self._release()
            raise

    def close(self) -> None:
        try:
            self._body.close()
        finally:
            self._release()


def _last_event_id() -> int | None:
    """Where a reader resumes: the Last-Event-ID header, else ?last_event_id=, else ?after=."""
    for field, raw in (("header Last-Event-ID", request.headers.get("Last-Event-ID")),
                       ("query parameter 'last_event_id'", request.args.get("last_event_id")),
                       ("query parameter 'after'", request.args.get("after"))):
        if raw:
            return None if raw.strip() == "" else parse_int(raw, field)
    return None


def _wanted_format() -> str | None:
    accept = request.accept_mimetypes
    if not request.headers.get("Accept") or accept.provided is False:
        return NDJSON
    explicit = [m for m, q in accept if q > 0]
    for m in explicit:
        if m in (SSE, NDJSON, "application/json"):
            return m
    if any(m in ("*/*", "application/*", "text/*") for m in explicit):
        return SSE if "text/*" in explicit and "*/*" not in explicit else NDJSON
    return None


READERS_EXTENSION = "xsg.handle_readers"


# The routes are module-level functions reading the app's services (`pep.http.current`) and its
# ReaderSlots (app.extensions), so they can be called in a test's request context;
# `create_handles_blueprint` mounts them on a Blueprint of their own per app, which carries that
# app's `readers` (for tests and monitoring).


@require_identity()
def list_handles() -> Response:
    identity = current_identity()
    base = public_base(configured_base_url())
    hidden = hidden_from(may_see, identity)
    return jsonify(handles=[r.summary(base) for r in
                            current_services().handles.list_for(identity.subject)
                            if not hidden(r)])


def handle_of_caller(handle_id: str) -> HandleRecord:
    """The caller's handle, live or ended; NotFound for a handle that is not the caller's (as
    for one that does not exist: no oracle of others' ids), that is hidden with its stream, or
    that belonged to a deleted stream."""
    record = current_services().handles.get_owned(handle_id, current_identity().subject)
    if record is None or hidden_from(may_see, current_identity())(record):
        raise NotFound("no such handle")
    return record


def live_handle_of_caller(handle_id: str) -> HandleRecord:
    """The caller's live handle (`handle_of_caller`); Gone when it ended."""
    record = handle_of_caller(handle_id)
    if not record.live:
        raise _gone(record)
    return record


@require_identity_or_read_token()  # a bearer token, or ?read_token= for this handle
def read_handle(handle_id: str) -> Response:
    """Read a handle's stream (SSE or NDJSON, by Accept), or describe it (application/json).
    ---
    get:
      parameters:
        - {name: after, in: query, schema: {type: integer, minimum: 0}}
        - {name: last_event_id, in: query, schema: {type: integer, minimum: 0}}
        - {name: read_token, in: query, schema: {type: string}}
        - {name: Last-Event-ID, in: header, schema: {type: integer, minimum: 0}}
      responses:
        200:
          description: the stream, or the handle's description
          content:
            text/event-stream: {}
            application/x-ndjson: {}
            application/json: {}
    """
    services = current_services()
    handles, heartbeat = services.handles, services.config.heartbeat
    readers: ReaderSlots = current_app.extensions[READERS_EXTENSION]
    record = handle_of_caller(handle_id)
    # an ended handle is Gone, but one that ended keeping its paid rows (a privacy budget
    # spent) streams them, then its final event, to a reader that comes after the end
    kept = None if record.live else handles.kept_buffer(handle_id)
    if not record.live and kept is None:
        raise _gone(record)
    fmt = _wanted_format()
    if fmt is None:
        return error_response(406, f"a handle is read as {SSE} or {NDJSON} "
                                   "(application/json describes it)")
    if fmt == "application/json":
        if not record.live:
            raise _gone(record)
        return jsonify(record.summary(public_base(configured_base_url())))
    delivery = getattr(services, "delivery", None)  # plan topics (pep/delivery), or None
    edge = delivery.edge_url(handle_id) if delivery is not None and record.live else None
    if edge is not None:  # delivered through its plan topic (pep/delivery): read on an edge
        query = request.query_string.decode("latin-1")
        moved = Response(status=307)
        moved.headers["Location"] = f"{edge[0]}/handles/{handle_id}" + (
            f"?{query}" if query else "")
        moved.headers[AFFINITY_HEADER] = edge[1]  # for the proxy's choice of edge
        return moved
    after = _last_event_id()
    buffer = kept if kept is not None else handles.buffer(handle_id)
    if buffer is None and handles.placement is not None:
        # several processes (`pep.cluster`): read where it is served (this raises to send the
        # request there), or taken over here first when no live process serves it
        handles.placement.claim(record.streams)
        buffer = handles.buffer(handle_id)
    if buffer is None:
        stored = handles.get(handle_id)
        if stored is not None and not stored.live:
            raise _gone(stored)
        raise Unavailable("the handle is being restored; retry shortly", retry_after=1)
    subject = current_identity().subject
    if not readers.acquire(subject):
        return error_response(
            429, f"{subject!r} already reads {readers.per_subject} handle streams at once, "
                 "the most one subject may; close one, or retry later",
            headers={"Retry-After": str(READER_RETRY_AFTER)},
            limit=readers.per_subject)
    release = _released_once(lambda: readers.release(subject))
    try:
        if fmt == SSE:
            args = (buffer, after, sse_event, SSE_HEARTBEAT, heartbeat, ": connected\n\n")
            row = SSE_ROW
        else:
            args = (buffer, after, ndjson_event, NDJSON_HEARTBEAT, heartbeat, "")
            row = NDJSON_ROW
        attach = request.environ.get(STREAM_BODY)
        if attach is not None:  # the gateway's server: its event loop writes the stream
            attach(HandleStream(*args, on_close=release, row_template=row))
            body: Any = b""  # the stream is written by the event loop
        else:  # any other WSGI server: a generator on the server's thread
            body = _Generated(stream_events(*args), release)
    except BaseException:
        release()
        raise
    response = Response(body, mimetype=fmt, direct_passthrough=True)
    response.headers["Cache-Control"] = "no-cache, no-store"
    response.headers["X-Accel-Buffering"] = "no"
    return response


@require_identity()
def release_handle(handle_id: str) -> Response:
    live_handle_of_caller(handle_id)
    record = current_services().handles.release(handle_id, current_identity().subject)
    if record is None:
        raise NotFound("no such handle")
    return jsonify(id=record.id, state=record.state.value, reason=record.reason)


def create_handles_blueprint(max_readers_per_subject: int = DEFAULT_MAX_READERS_PER_SUBJECT
                             ) -> Blueprint:
    """GET /handles, GET and DELETE /handles/<id>, with this many handle streams one subject may
    read at once (`readers`). The caller's ended handles on a stream it may not see
    (`pep.streams.visibility`) are not listed and answer 404, as if that stream never existed."""
    bp = Blueprint("xsg_handles", __name__)
    readers = ReaderSlots(max_readers_per_subject)
    bp.readers = readers  # type: ignore[attr-defined]  # for tests and monitoring
    bp.record_once(lambda state: state.app.extensions.__setitem__(READERS_EXTENSION, readers))
    bp.add_url_rule("/handles", view_func=list_handles, methods=["GET"])
    bp.add_url_rule("/handles/<handle_id>", view_func=read_handle, methods=["GET"])
    bp.add_url_rule("/handles/<handle_id>", view_func=release_handle, methods=["DELETE"])
    return bp


def _gone(record: HandleRecord) -> Gone:
    return Gone(f"handle is {record.state.value}", state=record.state.value, reason=record.reason)


__all__ = ["create_handles_blueprint", "sse_event", "ndjson_event", "SSE_ROW", "NDJSON_ROW",
           "stream_events", "SSE", "NDJSON", "DEFAULT_HEARTBEAT",
           "DEFAULT_MAX_READERS_PER_SUBJECT", "HandleStream", "ReaderSlots"]
