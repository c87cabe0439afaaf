"""Stream events over HTTP, for the stream's owner and administrators:

- `GET /streams/<name>/events`: the definitions and whether each is open now;
- `POST /streams/<name>/events` `{"name", "condition", "hold": seconds, "key": attribute}`: define
  one (the runtime starts evaluating it at once);
- `DELETE /streams/<name>/events/<event>`: remove it (an open event closes).

What an event is and what policies see of it: `pep/streams/events.py`.
"""
from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from common.http.auth import current_identity, require_identity
from common.http.errors import no_content
from pep.core.errors import InvalidInput, NotFound, NotPermitted
from pep.core.plan import StreamDefinition
from pep.http.current import current_services
from pep.streams.ownership import owner_or_admin

# Defined once, at module level: the routes read the app's services (`current_services`), so
# any app that carries them serves these routes, and `owned_stream` can be called in a test's
# request context.
bp = Blueprint("xsg_events", __name__)


def owned_stream(name: str) -> StreamDefinition:
    """The stream spelled exactly `name`, when the caller may see it (else NotFound, as for a
    name no stream has: `pep.streams.visibility`) and manages it (its owner or an
    administrator; else NotPermitted)."""
    services = current_services()
    identity = current_identity()
    stream = services.catalog.get(name)
    if (stream is not None and services.visibility is not None
            and not services.visibility.may_see(identity, name)):
        stream = None
    if stream is None or stream.name != name:
        raise NotFound(f"no stream named {name!r}")
    if not owner_or_admin(identity, stream.owner):
        raise NotPermitted(f"only the owner of stream {name!r} or an administrator manages "
                           "its events")
    return stream


@bp.get("/streams/<name>/events")
@require_identity()
def list_events(name: str) -> Response:
    owned_stream(name)
    events = current_services().stream_events
    return jsonify(events=[d.to_json(events.state(d)) for d in events.all(name)])


@bp.post("/streams/<name>/events")
@require_identity()
def define_event(name: str) -> Response:
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
    services = current_services()
    definition = services.event_admin.define(stream.name, body.get("name"),
                                             body.get("condition"), body.get("hold", 3600),
                                             body.get("key"), current_identity().subject)
    response = jsonify(definition.to_json(services.stream_events.state(definition)))
    response.status_code = 201
    return response


@bp.delete("/streams/<name>/events/<event>")
@require_identity()
def delete_event(name: str, event: str) -> Response:
    stream = owned_stream(name)
    current_services().event_admin.delete(stream.name, event)
    return no_content()


def events_blueprint() -> Blueprint:
    """The events' routes (one Blueprint, registered on every gateway app)."""
    return bp


__all__ = ["bp", "events_blueprint", "owned_stream"]
