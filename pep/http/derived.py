"""HTTP for derived streams (issue 48): a consumer with the grant option re-shares its handle.

- `POST /handles/<id>/derive` `{"name", "description"?, "visibility"?}`: the caller's live
  handle's rows become a stream it owns (`pep.streams.derived`), `restricted` unless it says
  `listed`. 201 with the stream as registered and `derived_from` (the source stream and what
  the derived stream holds: the deriving grant's masks and window, its time attribute) and
  `Location: /streams/<name>`. 404: not the caller's handle (or none); 410: the handle ended;
  403: the grant carries no grant option, or no longer permits the handle as it is; 409: the
  name is taken, the handle already feeds a derived stream, its grant changed since it opened,
  or a policy kept for that name is wider than this grant; 422: a join or a union of grants;
  400/415: a body that is not a JSON object of those fields.
- `GET /streams/<name>/derivation`: the derivation as the caller may see it (its owner, the
  owners of the streams it derives from, administrators; anyone else 404), with its chain.

From then on the derived stream is a stream like any other (`/streams/<name>`, its policies
through `/policies`, requested through `/requests`), whose owner may not append to it.
"""
from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from common.http.auth import current_identity, require_identity
from common.xmlsafe import parse_json
from pep.core.errors import InvalidInput, NotFound, Unavailable, UnsupportedMedia
from pep.http.current import current_services
from pep.http.handles import live_handle_of_caller
from pep.streams.derived import DerivedStreams

MAX_BODY = 64 * 1024

bp = Blueprint("xsg_derived", __name__)


def _derived() -> DerivedStreams:
    derived = current_services().derived
    if derived is None:
        raise Unavailable("this gateway derives no streams")
    return derived


def _body() -> Any:
    if not request.is_json:
        raise UnsupportedMedia(f"a derivation is JSON (application/json), not "
                               f"{request.mimetype or '(no Content-Type)'}")
    data = request.get_data(cache=False)
    if len(data) > MAX_BODY:
        raise InvalidInput(f"a derivation is at most {MAX_BODY} bytes, this one {len(data)}")
    try:
        return parse_json(data)
    except ValueError as exc:  # bad JSON, too deep, not UTF-8 (UnsafeDocumentError included)
        raise InvalidInput(f"a derivation is a JSON object: {str(exc)[:200]}") from None


@bp.post("/handles/<handle_id>/derive")
@require_identity()
def derive_stream(handle_id: str) -> Response:
    """Re-share a handle's rows as a derived stream the caller owns (the grant option).
    ---
    post:
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [name]
              properties:
                name: {type: string}
                description: {type: string}
                visibility: {type: string, enum: [listed, restricted]}
      responses:
        201: {description: "the derived stream, with derived_from"}
        400: {description: a malformed body (named)}
        403: {description: "the grant carries no grant option, or no longer permits the handle"}
        404: {description: "no such handle of the caller's"}
        409: {description: "the name is taken, the handle feeds one already, its grant changed,
          or a kept policy is wider"}
        410: {description: the handle ended}
        422: {description: a join or a union of grants cannot be derived}
    """
    identity = current_identity()
    live_handle_of_caller(handle_id)  # 404 / 410 as for reading it
    body = _body()
    out = _derived().derive(identity, handle_id, body)
    response = jsonify(out)
    response.status_code = 201
    response.headers["Location"] = f"/streams/{out['name']}"
    return response


@bp.get("/streams/<name>/derivation")
@require_identity()
def stream_derivation(name: str) -> Response:
    """What a derived stream derives from, as the caller may see it.
    ---
    get:
      responses:
        200: {description: "{stream, owner, source, state, chain, ...}"}
        404: {description: no such derived stream the caller may see the derivation of}
    """
    try:
        return jsonify(_derived().chain_view(name, current_identity()))
    except NotFound:
        raise NotFound(f"no derived stream named {name!r} whose derivation you may see") \
            from None


def derived_blueprint() -> Blueprint:
    """POST /handles/<id>/derive and GET /streams/<name>/derivation (registered on every
    gateway app; they read the services from app.extensions)."""
    return bp


__all__ = ["bp", "derived_blueprint"]
