"""`POST /requests`: a consumer asks for a stream and gets a handle.

The XACML request comes in one of two ways:
- the request document alone (`application/xacml+xml`, `application/xml`, `text/xml`,
  `application/xacml+json`, `application/json`), the user query, if any, embedded in the
  resource's `<Content>`;
- `multipart/form-data` with a part `request` (the XACML request) and an optional part `query`
  (the user query, XML or JSON); each part's own Content-Type says its format, and a part without
  one is recognised by its first character (`<` XML, `{` JSON).
The subject is always the authenticated caller, whatever the file says.

Answers: Permit -> 201 `{handle, id, stream, state, new, warnings, plan, sql, policy_ids}` (and
`privacy`, the caller's budgets, for a differentially private window) with `Location`; the
same subject asking again for the same plan on the same stream -> 200 with the same handle; a
private window the caller's privacy budget cannot pay for -> 403 with the figures; another
plan on a stream where the subject already has a live handle -> 409 naming the handle to
release (one window per user); Deny / NotApplicable / Indeterminate -> 403 with the
XACML response; NR -> 422 with the warning (no query is started); malformed -> 400.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from flask import Blueprint, Response, g, jsonify, request

from pdp.http.auth import (authenticate_request, current_identity, require_identity,
                           unauthorized)
from pep.core.errors import InvalidInput, Refusal, Unavailable, UnsupportedMedia
from pep.handles.one_window import WindowConflict
from pep.handles.records import StoredRequest
from pep.handles.service import StalePolicies
from pep.http.current import configured_base_url, current_engine, current_services, visible_schema
from pep.http.urls import public_base

XML_TYPES = ("application/xacml+xml", "application/xml", "text/xml")
JSON_TYPES = ("application/xacml+json", "application/json")
MAX_STALE_RETRIES = 3


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
    """The XACML request and optional user query from this HTTP request."""
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
            raise InvalidInput("multipart request without a 'request' part")
        body, media = req
        media = media or _sniff(body, XML_TYPES[0], JSON_TYPES[0])
        if media is None:
            raise InvalidInput("cannot tell whether the 'request' part is XML or JSON; "
                               "give it a Content-Type")
        query = part("query")
        user_query, query_type = (None, None)
        if query is not None and query[0].strip():
            user_query, query_type = query
            query_type = query_type or _sniff(user_query, "application/xml", "application/json")
            if query_type is None:
                raise InvalidInput("cannot tell whether the 'query' part is XML or JSON; "
                                   "give it a Content-Type")
        return StoredRequest(body, media, user_query, query_type)
    body = request.get_data(cache=False)
    media = request.mimetype or _sniff(body, XML_TYPES[0], JSON_TYPES[0])
    if media not in XML_TYPES + JSON_TYPES:
        raise UnsupportedMedia(f"unsupported Content-Type {request.mimetype or '(none)'}: send "
                               f"the XACML request as {', '.join(XML_TYPES + JSON_TYPES)} or "
                               "multipart/form-data")
    return StoredRequest(body, media)


# Defined once, at module level: the routes read the app's services (`pep.http.current`), so
# `request_stream` and `refused` can be called in a test's request context.
bp = Blueprint("xsg_requests", __name__)


@bp.post("/requests")
@require_identity()
def create_request() -> Response:
    """Ask for a stream: decide, plan, and open (or find) the caller's handle.
    ---
    post:
      requestBody:
        required: true
        content:
          application/xacml+xml:
            schema: {$ref: '#/components/schemas/XacmlXml'}
          application/xacml+json:
            schema: {$ref: '#/components/schemas/XacmlJson'}
          multipart/form-data:
            schema:
              type: object
              properties:
                request: {type: string, format: binary}
                query: {type: string, format: binary}
      responses:
        201: {description: "a new handle: {handle, id, stream, warnings, plan, sql, policy_ids}"}
        200: {description: the caller's live handle for the same plan}
        403: {description: "denied: the XACML response, or a query asking for hidden data"}
        409: {description: another query of the caller's is live on the stream}
        422: {description: "NR: no result can ever come; nothing is started"}
    """
    try:
        return request_stream()
    except Refusal as exc:
        refused(current_identity(), exc)
        raise


def refused(identity: Any, refusal: Refusal) -> None:
    """A refused stream request, as the audit trail and the metrics record it."""
    services = current_services()
    services.audit.refused(identity, refusal)
    services.metrics.stream_requests.labels(outcome="refused").inc()


def request_stream() -> Response:
    """Decide, plan and open (or find) the caller's handle (the body of `POST /requests`)."""
    services = current_services()
    handles, base_url = services.handles, configured_base_url()
    identity = current_identity()
    stored = read_access_request()
    if not stored.body.strip():
        raise InvalidInput("empty XACML request")
    for _attempt in range(MAX_STALE_RETRIES):
        epoch = handles.policy_epoch
        grant = services.decide_and_plan(current_engine(), stored.body, stored.media_type,
                                         identity, visible_schema, user_query=stored.user_query,
                                         user_query_type=stored.user_query_type,
                                         parsed=services.revocation.parsed.fill_only(),
                                         explain_missing_action=True)
        try:
            record, is_new = handles.open(identity.subject, identity.roles, identity.admin,
                                          grant.plan, grant.policy_ids or (), stored,
                                          epoch=epoch, plan_key=grant.decided_key)
        except StalePolicies:
            # a policy, or the caller's identity, changed while we decided: decide again,
            # as the caller's token stands for now (its roles may have been lowered)
            again = authenticate_request()
            if again is None:
                return unauthorized("the bearer token is no longer valid")
            g.xsg_identity = identity = again
            continue
        except WindowConflict as exc:
            existing = f"{public_base(base_url)}/handles/{exc.existing_handle_id}"
            exc.details.update(handle=existing, release=f"DELETE {existing}")
            raise
        url = f"{public_base(base_url)}/handles/{record.id}"
        body = {"handle": url, "id": record.id, "stream": record.stream,
                "streams": list(record.streams), "state": "live",
                "new": is_new, "warnings": _to_json(grant.warnings or []),
                "plan": _to_json(grant.plan_json if grant.plan_json is not None
                                 else json.loads(record.plan_json)),
                "sql": grant.sql, "policy_ids": sorted(grant.policy_ids or ())}
        if grant.grant_option:  # it may re-share it: POST /handles/<id>/derive
            body["grant_option"] = True
        guard = handles.privacy
        privacy = guard.status(identity.subject, grant.plan) if guard is not None else None
        if privacy is not None:  # a private window: the caller's budgets after admission
            body["privacy"] = privacy
        response = jsonify(body)
        response.status_code = 201 if is_new else 200
        response.headers["Location"] = url
        return response
    raise Unavailable("the policies kept changing while the request was decided; retry")


def requests_blueprint() -> Blueprint:
    """`POST /requests` (one Blueprint, registered on every gateway app)."""
    return bp


__all__ = ["bp", "read_access_request", "refused", "request_stream", "requests_blueprint"]
