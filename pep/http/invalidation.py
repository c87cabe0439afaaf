"""`/events/invalidations`: the invalidation feed and webhook registration for caching proxies.

A caller is let in with `Authorization: Bearer <the proxy token>` or as an administrator. These
routes authorise themselves, so they stay out of any user-token check in front of them.
"""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request

from common.http.errors import error_response
from common.invalidation import FEED_PATH, MAX_EVENT_NUMBER, parse_event_id
from common.numbers import NumberError, parse_int
from pep.invalidation.hub import InvalidationHub
from server.streaming import STREAM_BODY

INVALIDATION_EXTENSION = "xsg.invalidation"


@dataclass(frozen=True)
class InvalidationRoutes:
    """What the routes of `bp` work with, kept on the app that serves them
    (`install_invalidation`): the hub, and `require_admin()`, called inside a request, True when
    the caller is an administrator (it may also raise an HTTPException of its own)."""

    hub: InvalidationHub
    require_admin: Callable[[], bool] | None = None


def install_invalidation(app: Flask, hub: InvalidationHub,
                         require_admin: Callable[[], bool] | None = None) -> None:
    """`/events/invalidations` (SSE or `?after=N` JSON) and `/events/invalidations/subscribers`
    on `app`, over this hub.

    A caller is let in with `Authorization: Bearer <hub.proxy_token>`, or when `require_admin()`
    returns True. These routes authorise themselves: keep them out of any user-token check in
    front of them.
    """
    app.extensions[INVALIDATION_EXTENSION] = InvalidationRoutes(hub, require_admin)
    app.register_blueprint(bp)


def invalidation_routes() -> InvalidationRoutes:
    """The `InvalidationRoutes` of the app serving the current request."""
    routes: InvalidationRoutes = current_app.extensions[INVALIDATION_EXTENSION]
    return routes


# Defined once, at module level: the routes read the app's `InvalidationRoutes`, so any app
# that carries them serves these routes, and `refused` can be called in a test's request context.
bp = Blueprint("xsg_invalidation", __name__)


def refused() -> Response | None:
    """None when the caller may use these routes (the proxy token, or an administrator),
    else the refusal: 403 for a wrong token, 401 without one."""
    routes = invalidation_routes()
    hub = routes.hub
    header = request.headers.get("Authorization", "")
    token = header[7:].strip() if header[:7].lower() == "bearer " else ""
    if hub.proxy_token and token and hmac.compare_digest(
            hashlib.sha256(token.encode("utf-8")).digest(),
            hashlib.sha256(hub.proxy_token.encode("utf-8")).digest()):
        return None
    if routes.require_admin is not None and routes.require_admin():
        return None
    message = "the invalidation feed needs the proxy token or an administrator"
    if token:
        return error_response(403, message)
    return error_response(401, message, {"WWW-Authenticate": 'Bearer realm="xsg"'})


bp.before_request(refused)  # every route here: the proxy token or an administrator


def bad_request(message: str) -> Response:
    return error_response(400, message)


@bp.get(FEED_PATH)
def feed() -> Response:
    """The invalidation feed: SSE (Accept text/event-stream), or the events after `after`.
    ---
    get:
      parameters:
        - {name: after, in: query, schema: {type: string}, description: "N or <epoch>.<N>"}
        - {name: epoch, in: query, schema: {type: string}}
        - {name: last_event_id, in: query, schema: {type: string}}
        - {name: Last-Event-ID, in: header, schema: {type: string}}
      responses:
        200:
          description: the events after a position (JSON), or the live feed (SSE)
          content:
            application/json: {}
            text/event-stream: {}
    """
    hub = invalidation_routes().hub
    after = request.args.get("after")
    wants_sse = "text/event-stream" in request.headers.get("Accept", "") or after is None
    if after is not None or not wants_sse:
        position = parse_event_id(after) if after and "." in after else None
        if position is None:
            try:
                number = parse_int(after, "query parameter 'after'", high=MAX_EVENT_NUMBER)
            except NumberError as exc:
                return bad_request(f"{exc}; or an event id <epoch>.<N>")
            position = (request.args.get("epoch") or hub.epoch, number)
        events, complete = hub.events_after(position[1], position[0])
        return jsonify(epoch=hub.epoch, last_id=hub.last_id, reset=not complete,
                       events=[e.to_json() for e in events])
    last = request.headers.get("Last-Event-ID") or request.args.get("last_event_id")
    attach = request.environ.get(STREAM_BODY)
    try:
        if attach is not None:  # the gateway's server: its event loop writes the feed
            attach(hub.feed_body(last))
            body: Any = b""  # the stream is written by the event loop
        else:  # any other WSGI server: a generator on the server's thread
            body = hub.feed_stream(last)
    except (OverflowError, RuntimeError) as exc:  # too many readers; hub closed
        return error_response(503, str(exc))
    return Response(body, mimetype="text/event-stream", direct_passthrough=True,
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def webhook_from_body() -> str | Response:
    """The webhook URL a body names, or the 400 that says what is wrong with it."""
    doc = request.get_json(silent=True)
    webhook = doc.get("webhook") if isinstance(doc, dict) else None
    if not isinstance(webhook, str):
        return bad_request('body must be JSON {"webhook": "http(s)://..."}')
    return webhook


@bp.post(FEED_PATH + "/subscribers")
def register() -> Response:
    """Register a proxy's webhook URL for signed invalidation events.
    ---
    post:
      requestBody:
        required: true
        content:
          application/json:
            schema: {$ref: '#/components/schemas/Webhook'}
    """
    url = webhook_from_body()
    if isinstance(url, Response):
        return url
    hub = invalidation_routes().hub
    try:
        hub.register(url)
    except ValueError as exc:
        return bad_request(str(exc))
    return jsonify(registered=url, epoch=hub.epoch, last_id=hub.last_id)


@bp.delete(FEED_PATH + "/subscribers")
def unregister() -> Response:
    """Remove a proxy's webhook URL.
    ---
    delete:
      requestBody:
        required: true
        content:
          application/json:
            schema: {$ref: '#/components/schemas/Webhook'}
    """
    url = webhook_from_body()
    if isinstance(url, Response):
        return url
    return jsonify(unregistered=invalidation_routes().hub.unregister(url))


@bp.get(FEED_PATH + "/subscribers")
def subscribers() -> Response:
    return jsonify(invalidation_routes().hub.stats())


__all__ = ["bp", "install_invalidation", "invalidation_routes", "InvalidationRoutes", "refused"]
