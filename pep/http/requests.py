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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Flask, Response, current_app, g, jsonify, request

from common.auth import Authenticator, Identity
from common.http.auth import current_identity, require_identity, unauthorized
from pep.audit.trail import AuditTrail
from pep.core.access import AccessPlanner, SchemaLookup
from pep.core.errors import InvalidInput, Refusal, Unavailable, UnsupportedMedia
from pep.core.parsed import ParsedRequests
from pep.handles.one_window import WindowConflict
from pep.handles.records import StoredRequest
from pep.handles.service import HandleService, StalePolicies
from pep.http.urls import public_base
from pep.metrics import GatewayMetrics
from pep.streams.catalog import StreamCatalog
from pep.streams.visibility import StreamVisibility

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


@dataclass(frozen=True)
class RequestRoutes:
    """What `POST /requests` works with, handed over by the app factory (`install_requests`):
    the view takes it from the app once and passes it down, so nothing on the request's path
    looks a service up."""

    engine: Callable[[], Any]  # the policy engine of the moment (a policy change swaps it)
    access: AccessPlanner  # decide and plan, with the catalogue's and stream events' lookups
    handles: HandleService  # opens (or finds) the caller's handle and starts its delivery
    parsed: ParsedRequests  # parsed forms kept for the revocation passes (filled, never read)
    catalog: StreamCatalog  # the streams' schemas
    visibility: StreamVisibility | None  # who may see which stream (None: everybody, every one)
    authenticator: Authenticator  # the caller's token again, after a policy change
    audit: AuditTrail
    metrics: GatewayMetrics
    base_url: str | None  # the configured public URL (None: the URL the request came to)


REQUESTS_EXTENSION = "xsg.requests"

# Defined once, at module level: the view finds its `RequestRoutes` on the app serving it.
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
    routes: RequestRoutes = current_app.extensions[REQUESTS_EXTENSION]
    authorization = request.headers.get("Authorization")

    def authenticate_again() -> Identity | None:
        """The caller's token as it stands now (its identity may have changed meanwhile);
        what the access log and the audit then name."""
        identity = routes.authenticator.authenticate_header(authorization)
        if identity is not None:
            g.xsg_identity = identity
        return identity

    try:
        return request_stream(routes, current_identity(), read_access_request(),
                              public_base(routes.base_url), authenticate_again)
    except Refusal as exc:
        refused(routes, current_identity(), exc)
        raise


def refused(routes: RequestRoutes, identity: Identity, refusal: Refusal) -> None:
    """A refused stream request, as the audit trail and the metrics record it."""
    routes.audit.refused(identity, refusal)
    routes.metrics.stream_requests.labels(outcome="refused").inc()


def visible_schemas(routes: RequestRoutes, identity: Identity) -> SchemaLookup:
    """The schemas of the streams `identity` may see: a stream it may not see
    (pep/streams/visibility.py) has none, as a stream that does not exist."""
    visibility, catalog = routes.visibility, routes.catalog

    def schema(name: str) -> Any:
        if visibility is not None and not visibility.may_see(identity, name):
            return None
        return catalog.schema(name)

    return schema


def request_stream(routes: RequestRoutes, identity: Identity, stored: StoredRequest, base: str,
                   authenticate_again: Callable[[], Identity | None]) -> Response:
    """Decide, plan and open (or find) the caller's handle (the body of `POST /requests`):
    `routes.access.decide_and_plan` (pep/core/access.py) decides the request with the engine
    of the moment and plans what it grants, `routes.handles.open` (pep/handles/service.py)
    opens the handle and attaches it to its stream's query, whose rows reach the handle's
    buffer; the answer names the handle's URL under `base`, which the reader then reads
    (`GET /handles/<id>`, pep/http/handles.py). A policy that changed while this request was
    decided makes it decided again, as the caller's token stands then (`authenticate_again`)."""
    handles = routes.handles
    if not stored.body.strip():
        raise InvalidInput("empty XACML request")
    for _attempt in range(MAX_STALE_RETRIES):
        epoch = handles.policy_epoch
        grant = routes.access.decide_and_plan(routes.engine(), stored.body, stored.media_type,
                                              identity, visible_schemas(routes, identity),
                                              user_query=stored.user_query,
                                              user_query_type=stored.user_query_type,
                                              parsed=routes.parsed.fill_only(),
                                              explain_missing_action=True)
        try:
            record, is_new = handles.open(identity.subject, identity.roles, identity.admin,
                                          grant.plan, grant.policy_ids or (), stored,
                                          epoch=epoch, plan_key=grant.decided_key)
        except StalePolicies:
            # a policy, or the caller's identity, changed while we decided: decide again,
            # as the caller's token stands for now (its roles may have been lowered)
            again = authenticate_again()
            if again is None:
                return unauthorized("the bearer token is no longer valid")
            identity = again
            continue
        except WindowConflict as exc:
            existing = f"{base}/handles/{exc.existing_handle_id}"
            exc.details.update(handle=existing, release=f"DELETE {existing}")
            raise
        url = f"{base}/handles/{record.id}"
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


def install_requests(app: Flask, routes: RequestRoutes) -> None:
    """`POST /requests` on `app`, working with `routes`."""
    app.extensions[REQUESTS_EXTENSION] = routes
    app.register_blueprint(bp)


__all__ = ["REQUESTS_EXTENSION", "RequestRoutes", "bp", "install_requests",
           "read_access_request", "refused", "request_stream", "visible_schemas"]
