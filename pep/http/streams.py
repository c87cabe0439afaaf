"""HTTP for the stream catalogue: register, list, describe, change, and append records.

Who may do what: registering a stream needs the `data-owner` (or `owner`) role or an
administrator, and the caller becomes the stream's owner; only administrators may register
sources that read the server's own files or network (files, socket, kafka). Appending records and
changing a stream (`PATCH /streams/<name>`: its `visibility` for now, `definition.PATCHABLE`) are
for the stream's owner and administrators. Listing and describing are open to every
authenticated caller for the streams it may see (every `listed` stream; a `restricted` one as
`pep.streams.visibility` decides), without the source's options unless they own the stream. A
stream the caller may not see answers every route here exactly as a name no stream has: 404 with
the same body.
"""
from __future__ import annotations

from typing import Iterable

from flask import Blueprint, jsonify, request

from pdp import Identity
from pdp.http.auth import current_identity, require_identity
from pep.core.errors import InvalidInput, NotFound, NotPermitted, UnsupportedMedia
from pep.streams.catalog import StreamCatalog, StreamEntry
from pep.streams.definition import LISTED, describe, parse_registration, parse_stream_patch
from pep.streams.visibility import StreamVisibility

OWNER_ROLES = ("data-owner", "owner")
RECORD_MEDIA_TYPES = ("application/x-ndjson", "application/json", "application/jsonl",
                      "application/jsonlines", "text/plain")


def may_register(identity: Identity, owner_roles: Iterable[str] = OWNER_ROLES) -> bool:
    return identity.admin or any(r in owner_roles for r in identity.roles)


def describe_entry(entry: StreamEntry, identity: Identity) -> dict:
    d = entry.definition
    return describe(d, entry.created_at, show_source=identity.admin or d.owner == identity.subject,
                    visibility=entry.visibility, combining=entry.combining)


def create_streams_blueprint(catalog: StreamCatalog,
                             owner_roles: Iterable[str] = OWNER_ROLES,
                             visibility: StreamVisibility | None = None) -> Blueprint:
    """`visibility` decides who sees a restricted stream; without it, only the stream's owner
    and administrators do."""
    bp = Blueprint("xsg_streams", __name__)
    owner_roles = tuple(owner_roles)
    visibility = visibility or StreamVisibility(catalog)

    @bp.post("/streams")
    @require_identity()
    def register_stream():
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
        identity = current_identity()
        if not may_register(identity, owner_roles):
            raise NotPermitted("registering a stream needs the data-owner role or an "
                               "administrator")
        if not request.is_json:
            raise UnsupportedMedia(f"a stream registration is JSON (application/json), not "
                                   f"{request.mimetype or '(no Content-Type)'}")
        # not request.get_json: Flask's parser recurses, and a deeply nested array ends in a
        # RecursionError (a 500) instead of a refusal
        body = parse_registration(request.get_data(cache=False))
        unknown = set(body) - {"name", "schema", "source", "time_attribute", "visibility"}
        if unknown:
            raise InvalidInput(f"unknown key(s): {', '.join(sorted(map(str, unknown)))}")
        definition = catalog.register(body.get("name"), identity.subject, body.get("schema"),
                                      body.get("source"), body.get("time_attribute"),
                                      trusted=identity.admin,
                                      visibility=body.get("visibility", LISTED))
        entry = catalog.entry(definition.name)
        response = jsonify(describe(definition, entry.created_at if entry else None,
                                    show_source=True,
                                    visibility=entry.visibility if entry else None))
        response.status_code = 201
        response.headers["Location"] = f"/streams/{definition.name}"
        return response

    @bp.get("/streams")
    @require_identity()
    def list_streams():
        identity = current_identity()
        return jsonify(streams=catalog.list_visible(identity, visibility.seer(identity)))

    def entry_named(name: str) -> StreamEntry:
        """The stream, if the caller may see it; NotFound, the same for a stream it may not see
        as for one that does not exist."""
        entry = catalog.entry(name) if visibility.may_see(current_identity(), name) else None
        if entry is None:
            raise NotFound(f"no stream named {name!r}")
        return entry

    @bp.get("/streams/<name>")
    @require_identity()
    def get_stream(name: str):
        return jsonify(describe_entry(entry_named(name), current_identity()))

    @bp.patch("/streams/<name>")
    @require_identity()
    def change_stream(name: str):
        """Change a stream: `{"visibility": "listed" | "restricted"}`, `{"combining":
        "intersection" | "union" | null}` (owner or administrator).
        ---
        patch:
          requestBody:
            required: true
            content:
              application/json: {}
          responses:
            200: {description: the stream as it is now}
            400: {description: an unknown field or a bad value (named)}
            403: {description: not the stream's owner or an administrator}
            404: {description: no such stream (or one the caller may not see)}
        """
        identity = current_identity()
        entry = entry_named(name)
        if not (identity.admin or entry.definition.owner == identity.subject):
            raise NotPermitted(f"only the owner of stream {entry.definition.name!r} or an "
                               "administrator may change it")
        if not request.is_json:
            raise UnsupportedMedia(f"a stream change is JSON (application/json), not "
                                   f"{request.mimetype or '(no Content-Type)'}")
        changes = parse_stream_patch(request.get_data(cache=False))
        entry = catalog.update(entry.definition.name, changes, by=identity.subject)
        return jsonify(describe_entry(entry, identity))

    @bp.post("/streams/<name>/records")
    @require_identity()
    def append_records(name: str):
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
        identity = current_identity()
        entry = entry_named(name)
        if not (identity.admin or entry.definition.owner == identity.subject):
            raise NotPermitted(f"only the owner of stream {entry.definition.name!r} or an "
                               "administrator may append records")
        if request.mimetype and request.mimetype not in RECORD_MEDIA_TYPES:
            raise UnsupportedMedia(f"records must be JSON lines "
                                   f"({', '.join(RECORD_MEDIA_TYPES[:2])}), not {request.mimetype}")
        count = catalog.append_records(entry.definition.name, request.get_data(cache=False))
        response = jsonify(stream=entry.definition.name, appended=count)
        response.status_code = 201 if count else 200
        return response

    return bp


__all__ = ["create_streams_blueprint", "describe_entry", "may_register", "OWNER_ROLES"]
