"""Reading and releasing handles: `GET /handles`, `GET /handles/<id>`, `DELETE /handles/<id>`.

A handle is read by its owner only (anyone else gets 404, the same as for an id that does not
exist):
- `Accept: text/event-stream`: Server-Sent Events. A row is `id: <n>` + `data: <row JSON>`
  (the default `message` event); a `gap` event (`data: {"lost": k, "resume_from": n}`) says
  rows were dropped because the reader was too slow or away (k is null when a gateway restart
  lost them); the last event is `revoked`, `released`, `ended` or `shutdown`, then the
  connection closes. A comment line is sent every `heartbeat` seconds (default 15) while
  nothing else is. Resume with `Last-Event-ID` (or `?last_event_id=`).
- `Accept: application/x-ndjson` (also the answer to `*/*` or no Accept): JSON lines, the same
  events: `{"id": n, "row": {...}}`, `{"id": n, "event": "gap", "lost": k, ...}`,
  `{"event": "heartbeat"}`, and finally `{"id": n, "event": "revoked", "reason": ...}`.
- `Accept: application/json`: the handle's description.
- A handle that is not live answers 410 Gone with its state and reason.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from flask import Blueprint, Response, jsonify, request

from pdp.http.auth import current_identity, require_identity
from pdp.http.errors import error_response
from pep.core.errors import Gone, InvalidInput, NotFound, Unavailable
from pep.handles.buffer import Event, HandleBuffer
from pep.handles.records import HandleRecord
from pep.handles.service import HandleService
from pep.http.read_tokens import require_identity_or_read_token
from pep.http.urls import public_base

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
DEFAULT_HEARTBEAT = 15.0


def sse_event(event: Event) -> str:
    """One SSE event; row data is single-line JSON, so one `data:` line suffices."""
    if event.kind == "row":
        return f"id: {event.id}\ndata: {event.data}\n\n"
    return f"id: {event.id}\nevent: {event.kind}\ndata: {event.data}\n\n"


def ndjson_event(event: Event) -> str:
    if event.kind == "row":
        return f'{{"id":{event.id},"row":{event.data}}}\n'
    data = event.data.strip()
    inner = data[1:-1].strip() if data.startswith("{") and data.endswith("}") else ""
    return f'{{"id":{event.id}' + (f",{inner}" if inner else "") + "}\n"


SSE_HEARTBEAT = ": keep-alive\n\n"
NDJSON_HEARTBEAT = '{"event":"heartbeat"}\n'


def stream_events(buffer: HandleBuffer, after: int | None, fmt: Callable[[Event], str],
                  heartbeat_text: str, heartbeat: float, opening: str = "") -> Iterator[bytes]:
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
        if buffer.closed and not events[-1].final:
            # Revoked while we were reading: rows not yet on the wire are withheld.
            events = buffer.read(events[-1].id, timeout=0) or events
            events = [e for e in events if e.final] or events
        yield "".join(fmt(e) for e in events).encode("utf-8")
        cursor = events[-1].id
        if events[-1].final:
            return


def _last_event_id() -> int | None:
    raw = request.headers.get("Last-Event-ID") or request.args.get("last_event_id") \
        or request.args.get("after")
    if raw is None or raw.strip() == "":
        return None
    raw = raw.strip()
    if not raw.isdigit() or len(raw) > 20:
        raise InvalidInput(f"Last-Event-ID must be a non-negative integer, got {raw[:40]!r}")
    return int(raw)


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


def create_handles_blueprint(handles: HandleService, base_url: str | None = None,
                             heartbeat: float = DEFAULT_HEARTBEAT) -> Blueprint:
    bp = Blueprint("xsg_handles", __name__)

    @bp.get("/handles")
    @require_identity()
    def list_handles():
        identity = current_identity()
        base = public_base(base_url)
        return jsonify(handles=[r.summary(base) for r in handles.list_for(identity.subject)])

    def live_handle_of_caller(handle_id: str) -> HandleRecord:
        """The caller's live handle; NotFound for a handle that is not the caller's (as for one
        that does not exist: no oracle of others' ids), Gone when it ended."""
        record = handles.get_owned(handle_id, current_identity().subject)
        if record is None:
            raise NotFound("no such handle")
        if not record.live:
            raise _gone(record)
        return record

    @bp.get("/handles/<handle_id>")
    @require_identity_or_read_token()  # a bearer token, or ?read_token= for this handle
    def read_handle(handle_id: str):
        record = live_handle_of_caller(handle_id)
        fmt = _wanted_format()
        if fmt is None:
            return error_response(406, f"a handle is read as {SSE} or {NDJSON} "
                                       "(application/json describes it)")
        if fmt == "application/json":
            return jsonify(record.summary(public_base(base_url)))
        after = _last_event_id()
        buffer = handles.buffer(handle_id)
        if buffer is None:
            record = handles.get(handle_id)
            if record is not None and not record.live:
                raise _gone(record)
            raise Unavailable("the handle is being restored; retry shortly", retry_after=1)
        if fmt == SSE:
            body = stream_events(buffer, after, sse_event, SSE_HEARTBEAT, heartbeat,
                                 opening=": connected\n\n")
        else:
            body = stream_events(buffer, after, ndjson_event, NDJSON_HEARTBEAT, heartbeat)
        response = Response(body, mimetype=fmt, direct_passthrough=True)
        response.headers["Cache-Control"] = "no-cache, no-store"
        response.headers["X-Accel-Buffering"] = "no"
        return response

    @bp.delete("/handles/<handle_id>")
    @require_identity()
    def release_handle(handle_id: str):
        live_handle_of_caller(handle_id)
        record = handles.release(handle_id, current_identity().subject)
        if record is None:
            raise NotFound("no such handle")
        return jsonify(id=record.id, state=record.state.value, reason=record.reason)

    return bp


def _gone(record: HandleRecord) -> Gone:
    return Gone(f"handle is {record.state.value}", state=record.state.value, reason=record.reason)


__all__ = ["create_handles_blueprint", "sse_event", "ndjson_event", "stream_events", "SSE",
           "NDJSON", "DEFAULT_HEARTBEAT"]
