"""`/events/invalidations`: the invalidation feed and webhook registration for caching proxies.

A caller is let in with `Authorization: Bearer <the proxy token>` or as an administrator. These
routes authorise themselves, so they stay out of any user-token check in front of them.
"""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, jsonify, request

from pdp.http.errors import error_response
from pdp.numbers import NumberError, parse_int
from pep.invalidation.hub import InvalidationHub
from pep.http.streaming import STREAM_BODY
from pep.invalidation.protocol import FEED_PATH, MAX_EVENT_NUMBER, parse_event_id


def invalidation_blueprint(hub: InvalidationHub,
                           require_admin: Callable[[], bool] | None = None) -> Blueprint:
    """`/events/invalidations` (SSE or `?after=N` JSON) and `/events/invalidations/subscribers`.

    A caller is let in with `Authorization: Bearer <hub.proxy_token>`, or when `require_admin()`
    (called inside the request) returns True; it may also raise an HTTPException of its own.
    These routes authorise themselves: keep them out of any user-token check in front of them.
    """
    bp = Blueprint("xsg_invalidation", __name__)

    def refused():
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if hub.proxy_token and token and hmac.compare_digest(
                hashlib.sha256(token.encode("utf-8")).digest(),
                hashlib.sha256(hub.proxy_token.encode("utf-8")).digest()):
            return None
        if require_admin is not None and require_admin():
            return None
        message = "the invalidation feed needs the proxy token or an administrator"
        if token:
            return error_response(403, message)
        return error_response(401, message, {"WWW-Authenticate": 'Bearer realm="xsg"'})

    bp.before_request(refused)  # every route here: the proxy token or an administrator

    def bad_request(message: str):
        return error_response(400, message)

    @bp.get(FEED_PATH)
    def feed():
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

    def webhook_from_body():
        doc = request.get_json(silent=True)
        if not isinstance(doc, dict) or not isinstance(doc.get("webhook"), str):
            return None, bad_request('body must be JSON {"webhook": "http(s)://..."}')
        return doc["webhook"], None

    @bp.post(FEED_PATH + "/subscribers")
    def register():
        """Register a proxy's webhook URL for signed invalidation events.
        ---
        post:
          requestBody:
            required: true
            content:
              application/json:
                schema: {$ref: '#/components/schemas/Webhook'}
        """
        url, error = webhook_from_body()
        if error is not None:
            return error
        try:
            hub.register(url)
        except ValueError as exc:
            return bad_request(str(exc))
        return jsonify(registered=url, epoch=hub.epoch, last_id=hub.last_id)

    @bp.delete(FEED_PATH + "/subscribers")
    def unregister():
        """Remove a proxy's webhook URL.
        ---
        delete:
          requestBody:
            required: true
            content:
              application/json:
                schema: {$ref: '#/components/schemas/Webhook'}
        """
        url, error = webhook_from_body()
        if error is not None:
            return error
        return jsonify(unregistered=hub.unregister(url))

    @bp.get(FEED_PATH + "/subscribers")
    def subscribers():
        return jsonify(hub.stats())

    return bp


__all__ = ["invalidation_blueprint"]
