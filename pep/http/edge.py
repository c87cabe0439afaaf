"""An edge's HTTP face: `GET /handles/<id>` (SSE or NDJSON, a bearer token or a read token,
`Last-Event-ID`) from the handle's plan topic, and `GET /health`.

The reading is the gateway's (`pep.http.handles`): the same formats, the same resumption
parameters, the same per-subject reader limit, the same stream body for the server's event loop
(`HandleStream` over a `pep.edge.reader.TopicReader` instead of a handle's buffer). The caller
is who it authenticated as (the gateway's token file and OIDC issuers, `common.oidc`), or the
subject a read token was minted for (the gateway's key, shared through the store); the handle
must be theirs and live in the store (`EdgeNode.open`), checked at every (re)connection. An
edge describes no handle (`application/json` is the gateway's) and changes nothing.
"""
from __future__ import annotations

from typing import Any

from flask import Flask, Response, current_app, jsonify, request

from common.http.auth import current_identity, install_authenticator
from common.http.errors import error_response
from common.http.safe_json import install_safe_json
from common.oidc import AuthenticationFailed
from pep.edge.node import EdgeNode
from pep.http import access_log, errors
from pep.http.handles import (
    NDJSON,
    NDJSON_HEARTBEAT,
    READER_RETRY_AFTER,
    SSE,
    SSE_HEARTBEAT,
    HandleStream,
    ReaderSlots,
    _Generated,
    _last_event_id,
    _released_once,
    _wanted_format,
    ndjson_event,
    sse_event,
    stream_events,
)
from pep.http.read_tokens import READ_TOKENS_EXTENSION, ReadTokens, require_identity_or_read_token
from server.streaming import STREAM_BODY

EDGE_EXTENSION = "xsg.edge"
READERS_EXTENSION = "xsg.edge_readers"


@require_identity_or_read_token()
def read_handle(handle_id: str) -> Response:
    """Read a handle's stream from its plan topic (the module docstring)."""
    node: EdgeNode = current_app.extensions[EDGE_EXTENSION]
    readers: ReaderSlots = current_app.extensions[READERS_EXTENSION]
    heartbeat: float = current_app.config["XSG_HEARTBEAT"]
    fmt = _wanted_format()
    if fmt not in (SSE, NDJSON):
        return error_response(406, f"an edge serves a handle as {SSE} or {NDJSON} (the "
                                   "gateway describes it: application/json)")
    after = _last_event_id()
    subject = current_identity().subject
    if not readers.acquire(subject):
        return error_response(
            429, f"{subject!r} already reads {readers.per_subject} handle streams at once on "
                 "this edge, the most one subject may; close one, or retry later",
            headers={"Retry-After": str(READER_RETRY_AFTER)}, limit=readers.per_subject)
    release = _released_once(lambda: readers.release(subject))
    try:
        reader = node.open(handle_id, subject, after)
    except BaseException:
        release()
        raise

    def done() -> None:
        node.closed(reader)
        release()
    try:
        sse = fmt == SSE
        fmt_event = sse_event if sse else ndjson_event
        beat = SSE_HEARTBEAT if sse else NDJSON_HEARTBEAT
        opening = ": connected\n\n" if sse else ""
        buffer: Any = reader  # the reading interface `HandleStream` pulls from
        attach = request.environ.get(STREAM_BODY)
        if attach is not None:  # the project's server: its event loop writes the stream
            attach(HandleStream(buffer, after, fmt_event, beat, heartbeat, opening,
                                on_close=done))
            body: Any = b""
        else:  # any other WSGI server: a generator on the server's thread
            body = _Generated(stream_events(buffer, after, fmt_event, beat, heartbeat, opening),
                              done)
    except BaseException:
        done()
        raise
    response = Response(body, mimetype=fmt, direct_passthrough=True)
    response.headers["Cache-Control"] = "no-cache, no-store"
    response.headers["X-Accel-Buffering"] = "no"
    return response


def health() -> Response:
    """200 while the edge serves (store and control topic reached), 503 otherwise."""
    node: EdgeNode = current_app.extensions[EDGE_EXTENSION]
    body = jsonify(status="ok" if node.serving else "unavailable", edge=node.edge,
                   readers=node.reader_count())
    body.status_code = 200 if node.serving else 503
    return body


def create_edge_app(node: EdgeNode, authenticator: Any, read_tokens: ReadTokens,
                    heartbeat: float, max_readers_per_subject: int) -> Flask:
    """The edge's app over its node, the gateway's authenticator and read tokens."""
    app = Flask(__name__)
    app.config["XSG_HEARTBEAT"] = heartbeat
    app.extensions[EDGE_EXTENSION] = node
    app.extensions[READERS_EXTENSION] = ReaderSlots(max_readers_per_subject)
    app.extensions[READ_TOKENS_EXTENSION] = read_tokens
    install_safe_json(app)
    install_authenticator(app, authenticator)
    errors.install(app)
    app.register_error_handler(AuthenticationFailed, lambda exc: error_response(
        exc.status, exc.message, exc.headers))
    access_log.install(app)
    app.add_url_rule("/handles/<handle_id>", view_func=read_handle, methods=["GET"])
    app.add_url_rule("/health", view_func=health, methods=["GET"])
    return app


__all__ = ["create_edge_app"]
