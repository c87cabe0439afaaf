"""HTTP for the stream catalogue: register, list, describe, change, delete, append records.

Who may do what: registering a stream needs the `data-owner` (or `owner`) role or an
administrator, and the caller becomes the stream's owner; only administrators may register
sources that read the server's own files or network (files, socket, kafka). Appending records
(to `ingest` streams: a file the stream's query reads; to `kafka` streams: produced to the
topic, answered once the broker acknowledged them, 503 when it does not), changing a stream
(`PATCH /streams/<name>`: `definition.PATCHABLE`), deleting it (`DELETE /streams/<name>`) and
asking what its deletion would do (`GET /streams/<name>/dependents`) are for the stream's owner
and administrators; what follows a change or a deletion is `pep.streams.lifecycle`'s. Listing
and describing are open to every authenticated caller for the streams it may see (every
`listed` stream; a `restricted` one as `pep.streams.visibility` decides), without the source's
options unless they own the stream. A stream the caller may not see answers every route here
exactly as a name no stream has: 404 with the same body.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from flask import Blueprint, Flask, Response, current_app, jsonify, request

from common.auth import Identity
from common.http.auth import current_identity, require_identity
from pep.core.errors import InvalidInput, NotFound, NotPermitted, UnsupportedMedia
from pep.streams.catalog import StreamCatalog, StreamEntry
from pep.streams.definition import (
    LISTED,
    SETTINGS,
    StreamJson,
    describe,
    parse_keep_data,
    parse_registration,
    parse_stream_patch,
)
from pep.streams.lifecycle import StreamLifecycle
from pep.streams.ownership import owner_or_admin
from pep.streams.visibility import StreamVisibility

OWNER_ROLES = ("data-owner", "owner")
RECORD_MEDIA_TYPES = ("application/x-ndjson", "application/json", "application/jsonl",
                      "application/jsonlines", "text/plain")


def may_register(identity: Identity, owner_roles: Iterable[str] = OWNER_ROLES) -> bool:
    return identity.admin or any(r in owner_roles for r in identity.roles)


def describe_entry(entry: StreamEntry, identity: Identity) -> StreamJson:
    d = entry.definition
    return describe(d, entry.created_at, show_source=owner_or_admin(identity, d.owner),
                    visibility=entry.visibility, settings=entry.settings(),
                    optional=entry.optional, combining=entry.combining)


def _flag(name: str) -> bool:
    value = request.args.get(name, "false").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise InvalidInput(f"{name} must be true or false, got {value[:40]!r}")


STREAMS_EXTENSION = "xsg.streams"


@dataclass(frozen=True)
class StreamRoutes:
    """What the routes of `bp` work with, kept on the app that serves them (`install_streams`):
    `visibility` decides who sees a restricted stream, `lifecycle` changes and deletes streams."""

    catalog: StreamCatalog
    visibility: StreamVisibility
    lifecycle: StreamLifecycle
    owner_roles: tuple[str, ...] = OWNER_ROLES


def install_streams(app: Flask, catalog: StreamCatalog, owner_roles: Iterable[str] = OWNER_ROLES,
                    visibility: StreamVisibility | None = None,
                    lifecycle: StreamLifecycle | None = None) -> None:
    """The stream routes on `app`, over this catalogue. Without `visibility` only a stream's
    owner and administrators see a restricted stream; without `lifecycle`, changes and
    deletions touch the catalogue alone (nothing running to tell)."""
    app.extensions[STREAMS_EXTENSION] = StreamRoutes(
        catalog, visibility or StreamVisibility(catalog), lifecycle or StreamLifecycle(catalog),
        tuple(owner_roles))
    app.register_blueprint(bp)


def stream_routes() -> StreamRoutes:
    """The `StreamRoutes` of the app serving the current request."""
    routes: StreamRoutes = current_app.extensions[STREAMS_EXTENSION]
    return routes


# Defined once, at module level: the routes read the app's `StreamRoutes`, so any app that
# carries them serves these routes, and `entry_named` and `owned` can be called in a test's
# request context.
bp = Blueprint("xsg_streams", __name__)


@bp.post("/streams")
@require_identity()
def register_stream() -> Response:
    """Register a stream (data owners and administrators).
    ---
    post:
      requestBody:
        required: true
        content:
          application/json:
            schema: {$ref: '#/components/schemas/StreamRegistration'}
      responses:
        201: {description: the stream as registered}
    """
    routes = stream_routes()
    identity = current_identity()
    if not may_register(identity, routes.owner_roles):
        raise NotPermitted("registering a stream needs the data-owner role or an "
                           "administrator")
    if not request.is_json:
        raise UnsupportedMedia(f"a stream registration is JSON (application/json), not "
                               f"{request.mimetype or '(no Content-Type)'}")
    # not request.get_json: Flask's parser recurses, and a deeply nested array ends in a
    # RecursionError (a 500) instead of a refusal
    body = parse_registration(request.get_data(cache=False))
    unknown = set(body) - {"name", "schema", "source", "time_attribute", "visibility",
                           *SETTINGS}
    if unknown:
        raise InvalidInput(f"unknown key(s): {', '.join(sorted(map(str, unknown)))}")
    catalog = routes.catalog
    definition = catalog.register(body.get("name"), identity.subject, body.get("schema"),
                                  body.get("source"), body.get("time_attribute"),
                                  trusted=identity.admin,
                                  visibility=body.get("visibility", LISTED),
                                  **{k: body.get(k) for k in SETTINGS})
    entry = catalog.entry(definition.name)
    response = jsonify(describe(definition, entry.created_at if entry else None,
                                show_source=True,
                                visibility=entry.visibility if entry else None,
                                settings=entry.settings() if entry else None))
    response.status_code = 201
    response.headers["Location"] = f"/streams/{definition.name}"
    return response

@bp.get("/streams")
@require_identity()
def list_streams() -> Response:
    routes = stream_routes()
    identity = current_identity()
    return jsonify(streams=routes.catalog.list_visible(identity,
                                                       routes.visibility.seer(identity)))

def entry_named(name: str) -> StreamEntry:
    """The stream, if the caller may see it; NotFound, the same for a stream it may not see
    as for one that does not exist."""
    routes = stream_routes()
    entry = (routes.catalog.entry(name) if routes.visibility.may_see(current_identity(), name)
             else None)
    if entry is None:
        raise NotFound(f"no stream named {name!r}")
    return entry

@bp.get("/streams/<name>")
@require_identity()
def get_stream(name: str) -> Response:
    return jsonify(describe_entry(entry_named(name), current_identity()))

def owned(name: str, doing: str) -> StreamEntry:
    identity = current_identity()
    entry = entry_named(name)
    if not owner_or_admin(identity, entry.definition.owner):
        raise NotPermitted(f"only the owner of stream {entry.definition.name!r} or an "
                           f"administrator may {doing}")
    return entry

@bp.patch("/streams/<name>")
@require_identity()
def change_stream(name: str) -> Response:
    """Change a stream (owner or administrator): any of `visibility` ("listed" or
    "restricted"), `combining` ("intersection", "union" or null: how the obligations of
    several applicable rules combine), `description`, `lateness` and `retention` (seconds,
    null: the gateway's default), and `add_attributes` ([{name, type}]) or the whole
    `schema` (which may only add attributes after the existing ones).
    ---
    patch:
      requestBody:
        required: true
        content:
          application/json: {}
      responses:
        200: {description: "the stream as it is now, with `added` attributes and `revoked` handles"}
        400: {description: "an unknown field or a bad value (named); a schema change that is not
          an addition"}
        403: {description: not the stream's owner or an administrator}
        404: {description: no such stream (or one the caller may not see)}
        409: {description: the schema change would break the policies it names}
    """
    identity = current_identity()
    entry = owned(name, "change it")
    if not request.is_json:
        raise UnsupportedMedia(f"a stream change is JSON (application/json), not "
                               f"{request.mimetype or '(no Content-Type)'}")
    changes = parse_stream_patch(request.get_data(cache=False))
    entry, followed = stream_routes().lifecycle.change(entry.definition.name, changes, identity)
    return jsonify({**describe_entry(entry, identity), **followed})

@bp.get("/streams/<name>/dependents")
@require_identity()
def stream_dependents(name: str) -> Response:
    """What deleting the stream would do (owner or administrator): live handles (joins
    among them) that would be revoked, its events, and the policies that name it with
    what would become of each (`?remove_policies=true` as for the deletion).
    ---
    get:
      responses:
        200: {description: "{stream, live_handles, joins, subjects, events, policies,
          other_policies}"}
        403: {description: not the stream's owner or an administrator}
        404: {description: no such stream (or one the caller may not see)}
    """
    entry = owned(name, "see what depends on it")
    return jsonify(stream_routes().lifecycle.dependents(
        entry.definition.name, current_identity(), _flag("remove_policies")))

@bp.delete("/streams/<name>")
@require_identity()
def delete_stream(name: str) -> Response:
    """Delete a stream (owner or administrator): its live handles are revoked first, its
    query stops, its events go, its files go (`?keep_data=<seconds>`: kept that long) and
    the policies naming it are kept, or removed (`?remove_policies=true`: those confined
    to it that the caller may manage).
    ---
    delete:
      responses:
        200: {description: "what was done: {stream, handles_revoked, events_removed, policies,
          data}"}
        400: {description: a bad keep_data or remove_policies}
        403: {description: not the stream's owner or an administrator}
        404: {description: no such stream (or one the caller may not see)}
        503: {description: the deletion failed and was undone (its handles stay revoked)}
    """
    keep = parse_keep_data(request.args.get("keep_data"))
    remove = _flag("remove_policies")
    entry = owned(name, "delete it")
    return jsonify(stream_routes().lifecycle.delete(entry.definition.name, current_identity(),
                                                    keep, remove))

@bp.post("/streams/<name>/records")
@require_identity()
def append_records(name: str) -> Response:
    """Append records to an ingest stream: JSON lines, one record per line.
    ---
    post:
      requestBody:
        required: true
        content:
          application/x-ndjson:
            schema: {type: string}
          application/json:
            schema: {type: object}
      responses:
        201: {description: '{"stream": name, "appended": n}'}
    """
    entry = owned(name, "append records")
    if request.mimetype and request.mimetype not in RECORD_MEDIA_TYPES:
        raise UnsupportedMedia(f"records must be JSON lines "
                               f"({', '.join(RECORD_MEDIA_TYPES[:2])}), not {request.mimetype}")
    count = stream_routes().catalog.append_records(entry.definition.name,
                                                   request.get_data(cache=False))
    response = jsonify(stream=entry.definition.name, appended=count)
    response.status_code = 201 if count else 200
    return response



__all__ = ["bp", "install_streams", "stream_routes", "StreamRoutes", "entry_named", "owned",
           "describe_entry", "may_register", "OWNER_ROLES"]
