"""Stream events over HTTP, for the stream's owner and administrators:

- `GET /streams/<name>/events`: the definitions and whether each is open now;
- `POST /streams/<name>/events` `{"name", "condition", "hold": seconds, "key": attribute}`: define
  one (the runtime starts evaluating it at once);
- `DELETE /streams/<name>/events/<event>`: remove it (an open event closes).

What an event is and what policies see of it: `pep/streams/events.py`.
"""
from __future__ import annotations

from typing import Any, Callable

from flask import Blueprint, jsonify, request

from pdp.http.auth import current_identity, require_identity
from pdp.http.errors import no_content
from pep.core.errors import InvalidInput, NotFound, NotPermitted
from pep.core.plan import StreamDefinition
from pep.streams.event_admin import StreamEventAdmin
from pep.streams.ownership import owner_or_admin


def events_blueprint(admin: StreamEventAdmin,
                     may_see: Callable[[Any, str], bool] | None = None) -> Blueprint:
    """The routes over `admin` (which stores, evaluates and audits); `may_see(identity, name)`:
    a stream the caller may not see answers as one that does not exist
    (`pep.streams.visibility`)."""
    bp = Blueprint("xsg_events", __name__)
    catalog, events = admin.catalog, admin.events

    def owned_stream(name: str) -> StreamDefinition:
        stream = catalog.get(name)
        if stream is not None and may_see is not None and not may_see(current_identity(), name):
            stream = None
        if stream is None or stream.name != name:
            raise NotFound(f"no stream named {name!r}")
        identity = current_identity()
        if not owner_or_admin(identity, stream.owner):
            raise NotPermitted(f"only the owner of stream {name!r} or an administrator manages "
                               "its events")
        return stream

    @bp.get("/streams/<name>/events")
    @require_identity()
    def list_events(name: str):
        owned_stream(name)
        return jsonify(events=[d.to_json(events.state(d)) for d in events.all(name)])

    @bp.post("/streams/<name>/events")
    @require_identity()
    def define_event(name: str):
        """Define a named event over a stream (its owner or an administrator).
        ---
        post:
          requestBody:
            required: true
            content:
              application/json:
                schema: {$ref: '#/components/schemas/EventDefinition'}
          responses:
            201: {description: the event's definition and state}
        """
        stream = owned_stream(name)
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise InvalidInput('expected a JSON object {"name", "condition", "hold", "key"}')
        unknown = set(body) - {"name", "condition", "hold", "key"}
        if unknown:
            raise InvalidInput(f"unknown key(s): {', '.join(sorted(map(str, unknown)))}")
        definition = admin.define(stream.name, body.get("name"), body.get("condition"),
                                  body.get("hold", 3600), body.get("key"),
                                  current_identity().subject)
        response = jsonify(definition.to_json(events.state(definition)))
        response.status_code = 201
        return response

    @bp.delete("/streams/<name>/events/<event>")
    @require_identity()
    def delete_event(name: str, event: str):
        stream = owned_stream(name)
        admin.delete(stream.name, event)
        return no_content()

    return bp


__all__ = ["events_blueprint"]
