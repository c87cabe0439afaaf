"""HTTP for access requests and handles: POST /requests, GET/DELETE /handles/<id>, GET /handles.

POST /requests takes the XACML request in one of two ways:
- the request document alone (`application/xacml+xml`, `application/xml`, `text/xml`,
  `application/xacml+json`, `application/json`), the user query, if any, embedded in the
  resource's `<Content>` (as the request processor reads it);
- `multipart/form-data` with a part `request` (the XACML request) and an optional part `query`
  (the user query, XML or JSON); each part's own Content-Type says its format, and a part without
  one is recognised by its first character (`<` XML, `{` JSON).
The subject is always the authenticated caller (the processor binds it), whatever the file says.

Answers: Permit -> 201 `{handle, id, stream, warnings, plan, sql, policy_ids}` with `Location`;
the same subject asking again for the same plan on the same stream -> 200 with the same handle;
another plan on a stream where the subject already has a live handle -> 409 naming the handle
to release (one window per user); Deny / NotApplicable / Indeterminate -> 403 with the XACML
response; NR -> 422 with the warning (no query is started); malformed -> 400.

Reading a handle (`GET /handles/<id>`), by its owner only (anyone else gets 404, the same as for
an id that does not exist):
- `Accept: text/event-stream`: Server-Sent Events. A row is `id: <n>` + `data: <row JSON>`
  (the default `message` event); a `gap` event (`data: {"lost": k, "resume_from": n}`) says
  rows were dropped because the reader was too slow or away (k is null when a gateway restart
  lost them); the last event is `revoked`, `released`, `ended` or `shutdown`, then the
  connection closes. A comment line is sent every `heartbeat` seconds (default 15) while
  nothing else is. Resume with `Last-Event-ID` (or `?last_event_id=`).
- `Accept: application/x-ndjson` (also the answer to `*/*` or no Accept): JSON lines, the same
  events: `{"id": n, "row": {...}}`, `{"id": n, "event": "gap", "lost": k, ...}`,
  `{"event": "heartbeat"}`, and finally `{"id": n, "event": "revoked", "reason": ...}`.
- A handle that is not live answers 410 Gone with its state and reason.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

from flask import Blueprint, Response, jsonify, request

from pdp.auth import current_identity, require_identity
from pep.revocation import decision_name
from pep.handles import Event, HandleBuffer, HandleError, HandleService, StalePolicies, \
    StoredRequest

log = logging.getLogger(__name__)

XML_TYPES = ("application/xacml+xml", "application/xml", "text/xml")
JSON_TYPES = ("application/xacml+json", "application/json")
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
DEFAULT_HEARTBEAT = 15.0
MAX_STALE_RETRIES = 3


def _error(status: int, message: str, **extra) -> Response:
    response = jsonify(error=message, status=status, **extra)
    response.status_code = status
    return response


def _sniff(data: bytes, xml_type: str, json_type: str) -> str | None:
    head = data.lstrip()[:1]
    if head == b"<":
        return xml_type
    if head in (b"{", b"["):
        return json_type
    return None


def _to_json(value: Any) -> Any:
    if hasattr(value, "to_json") and callable(value.to_json):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    if hasattr(value, "value") and not isinstance(value, (str, int, float, bool)):
        return _to_json(value.value)  # enums
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def read_access_request() -> StoredRequest:
    """The XACML request and optional user query from this HTTP request; ValueError if unusable."""
    if request.mimetype == "multipart/form-data":
        def part(name: str) -> tuple[bytes, str | None] | None:
            f = request.files.get(name)
            if f is not None:
                mt = f.mimetype if f.mimetype not in ("", "application/octet-stream",
                                                     "text/plain") else None
                return f.read(), mt
            text = request.form.get(name)
            if text is not None:
                return text.encode("utf-8"), None
            return None

        req = part("request")
        if req is None:
            raise ValueError("multipart request without a 'request' part")
        body, media = req
        media = media or _sniff(body, XML_TYPES[0], JSON_TYPES[0])
        if media is None:
            raise ValueError("cannot tell whether the 'request' part is XML or JSON; "
                             "give it a Content-Type")
        query = part("query")
        user_query, query_type = (None, None)
        if query is not None and query[0].strip():
            user_query, query_type = query
            query_type = query_type or _sniff(user_query, "application/xml", "application/json")
            if query_type is None:
                raise ValueError("cannot tell whether the 'query' part is XML or JSON; "
                                 "give it a Content-Type")
        return StoredRequest(body, media, user_query, query_type)
    body = request.get_data(cache=False)
    media = request.mimetype or _sniff(body, XML_TYPES[0], JSON_TYPES[0])
    if media not in XML_TYPES + JSON_TYPES:
        raise ValueError(f"unsupported Content-Type {request.mimetype or '(none)'}: send the XACML "
                         f"request as {', '.join(XML_TYPES + JSON_TYPES)} or multipart/form-data")
    return StoredRequest(body, media)


# -- event formatting ---------------------------------------------------------------------------------

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
        raise ValueError(f"Last-Event-ID must be a non-negative integer, got {raw[:40]!r}")
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


# -- the blueprint -----------------------------------------------------------------------------------------

def create_handles_blueprint(handles: HandleService, engine: Callable[[], Any],
                             schema_lookup: Callable[[str], Any],
                             prepare: Callable | None = None,
                             refused_type: type | None = None,
                             conflict_type: type | None = None,
                             base_url: Callable[[], str] | str | None = None,
                             heartbeat: float = DEFAULT_HEARTBEAT) -> Blueprint:
    """`prepare`, `refused_type` and `conflict_type` default to the processor's `prepare` and
    `Refused` and the window registry's `WindowConflict`."""
    if prepare is None or refused_type is None:
        from pep import processor

        prepare = prepare or processor.prepare
        refused_type = refused_type or processor.Refused
    if conflict_type is None:
        from pep.single_window import WindowConflict

        conflict_type = WindowConflict
    bp = Blueprint("xsg_handles", __name__)

    def base() -> str:
        if callable(base_url):
            return base_url().rstrip("/")
        if base_url:
            return base_url.rstrip("/")
        return request.host_url.rstrip("/")

    @bp.post("/requests")
    @require_identity()
    def create_request():
        identity = current_identity()
        try:
            stored = read_access_request()
        except ValueError as exc:
            return _error(400 if "unsupported" not in str(exc) else 415, str(exc))
        if not stored.body.strip():
            return _error(400, "empty XACML request")
        for _attempt in range(MAX_STALE_RETRIES):
            epoch = handles.policy_epoch
            try:
                prepared = prepare(engine(), stored.body, stored.media_type, identity,
                                   schema_lookup, user_query=stored.user_query,
                                   user_query_type=stored.user_query_type)
            except refused_type as exc:
                return Response(exc.body, status=exc.status, content_type=exc.content_type)
            decision = decision_name(prepared.decision)
            if decision != "Permit":  # the processor refuses these itself; never start a query
                return _error(403, f"the decision is {decision}")
            try:
                record, is_new = handles.open(identity.subject, identity.roles, identity.admin,
                                              prepared.plan, prepared.policy_ids or (), stored,
                                              epoch=epoch)
            except StalePolicies:
                continue  # a policy changed while we decided: decide again
            except conflict_type as exc:
                existing = f"{base()}/handles/{exc.existing_handle_id}"
                return _error(409, str(getattr(exc, "message", exc)), handle=existing,
                              release=f"DELETE {existing}")
            except HandleError as exc:
                return _error(exc.status, exc.message)
            url = f"{base()}/handles/{record.id}"
            plan_json = prepared.plan_json
            if isinstance(plan_json, (str, bytes)):
                try:
                    plan_json = json.loads(plan_json)
                except ValueError:
                    pass
            body = {"handle": url, "id": record.id, "stream": record.stream, "state": "live",
                    "new": is_new, "warnings": _to_json(prepared.warnings or []),
                    "plan": _to_json(plan_json if plan_json is not None
                                     else json.loads(record.plan_json)),
                    "sql": getattr(prepared, "sql", None),
                    "policy_ids": sorted(prepared.policy_ids or ())}
            response = jsonify(body)
            response.status_code = 201 if is_new else 200
            response.headers["Location"] = url
            return response
        return _error(503, "the policies kept changing while the request was decided; retry")

    @bp.get("/handles")
    @require_identity()
    def list_handles():
        identity = current_identity()
        return jsonify(handles=[r.summary(base()) for r in handles.list_for(identity.subject)])

    def _gone(record) -> Response:
        return _error(410, f"handle is {record.state.value}", state=record.state.value,
                      reason=record.reason)

    def _live_handle_of_caller(handle_id: str):
        """The caller's live handle, or the answer to give: 404 for a handle that is not the
        caller's (as for one that does not exist: no oracle of others' ids), 410 when it ended."""
        record = handles.get_owned(handle_id, current_identity().subject)
        if record is None:
            return _error(404, "no such handle")
        if not record.live:
            return _gone(record)
        return record

    @bp.get("/handles/<handle_id>")
    @require_identity()
    def read_handle(handle_id: str):
        record = _live_handle_of_caller(handle_id)
        if isinstance(record, Response):
            return record
        fmt = _wanted_format()
        if fmt is None:
            return _error(406, f"a handle is read as {SSE} or {NDJSON} "
                               "(application/json describes it)")
        if fmt == "application/json":
            return jsonify(record.summary(base()))
        try:
            after = _last_event_id()
        except ValueError as exc:
            return _error(400, str(exc))
        buffer = handles.buffer(handle_id)
        if buffer is None:
            record = handles.get(handle_id)
            if record is not None and not record.live:
                return _gone(record)
            response = _error(503, "the handle is being restored; retry shortly")
            response.headers["Retry-After"] = "1"
            return response
        if fmt == SSE:
            body = stream_events(buffer, after, sse_event, SSE_HEARTBEAT, heartbeat,
                                 opening=": connected\n\n")
            mimetype = SSE
        else:
            body = stream_events(buffer, after, ndjson_event, NDJSON_HEARTBEAT, heartbeat)
            mimetype = NDJSON
        response = Response(body, mimetype=mimetype, direct_passthrough=True)
        response.headers["Cache-Control"] = "no-cache, no-store"
        response.headers["X-Accel-Buffering"] = "no"
        return response

    @bp.delete("/handles/<handle_id>")
    @require_identity()
    def release_handle(handle_id: str):
        record = _live_handle_of_caller(handle_id)
        if isinstance(record, Response):
            return record
        record = handles.release(handle_id, current_identity().subject)
        if record is None:
            return _error(404, "no such handle")
        return jsonify(id=record.id, state=record.state.value, reason=record.reason)

    return bp


__all__ = ["create_handles_blueprint", "sse_event", "ndjson_event", "stream_events",
           "read_access_request", "SSE", "NDJSON"]
