"""HTTP for the stream catalogue: register, list, describe, and append records.

Who may do what: registering a stream needs the `data-owner` (or `owner`) role or an
administrator, and the caller becomes the stream's owner; only administrators may register
sources that read the server's own files or network (files, socket, kafka). Appending records is
for the stream's owner and administrators, to `ingest` streams (a file the stream's query reads)
and `kafka` streams (produced to the topic; answered once the broker acknowledged them, 503 when
it does not). Listing and describing are open to every
authenticated caller, without the source's options unless they own the stream (see
`pep.streams.catalog`).
"""
from __future__ import annotations

from typing import Iterable

from flask import Blueprint, jsonify, request

from pdp import Identity
from pdp.http.auth import current_identity, require_identity
from pep.core.errors import InvalidInput, NotFound, NotPermitted, UnsupportedMedia
from pep.streams.catalog import StreamCatalog, StreamEntry
from pep.streams.definition import describe, parse_registration

OWNER_ROLES = ("data-owner", "owner")
RECORD_MEDIA_TYPES = ("application/x-ndjson", "application/json", "application/jsonl",
                      "application/jsonlines", "text/plain")


def may_register(identity: Identity, owner_roles: Iterable[str] = OWNER_ROLES) -> bool:
    return identity.admin or any(r in owner_roles for r in identity.roles)


def create_streams_blueprint(catalog: StreamCatalog,
                             owner_roles: Iterable[str] = OWNER_ROLES) -> Blueprint:
    bp = Blueprint("xsg_streams", __name__)
    owner_roles = tuple(owner_roles)

    @bp.post("/streams")
    @require_identity()
    def register_stream():
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
        unknown = set(body) - {"name", "schema", "source", "time_attribute"}
        if unknown:
            raise InvalidInput(f"unknown key(s): {', '.join(sorted(map(str, unknown)))}")
        definition = catalog.register(body.get("name"), identity.subject, body.get("schema"),
                                      body.get("source"), body.get("time_attribute"),
                                      trusted=identity.admin)
        entry = catalog.entry(definition.name)
        response = jsonify(describe(definition, entry.created_at if entry else None,
                                    show_source=True))
        response.status_code = 201
        response.headers["Location"] = f"/streams/{definition.name}"
        return response

    @bp.get("/streams")
    @require_identity()
    def list_streams():
        return jsonify(streams=catalog.list_visible(current_identity()))

    def entry_named(name: str) -> StreamEntry:
        entry = catalog.entry(name)
        if entry is None:
            raise NotFound(f"no stream named {name!r}")
        return entry

    @bp.get("/streams/<name>")
    @require_identity()
    def get_stream(name: str):
        identity = current_identity()
        entry = entry_named(name)
        d = entry.definition
        return jsonify(describe(d, entry.created_at,
                                show_source=identity.admin or d.owner == identity.subject))

    @bp.post("/streams/<name>/records")
    @require_identity()
    def append_records(name: str):
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


__all__ = ["create_streams_blueprint", "may_register", "OWNER_ROLES"]
