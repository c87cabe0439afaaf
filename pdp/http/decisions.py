"""POST /pdp: a XACML request decided as the authenticated caller, in the format its Accept asks
for (else the request's own), on the gateway's clock and environment (`decide_as`)."""
from __future__ import annotations

from flask import Response as FlaskResponse, request

from common.auth import Identity
from common.http.auth import current_identity, require_identity
from common.refusals import NotAcceptable, UnsupportedMedia
from pdp.errors import RequestSyntaxError
from pdp.http.context import (
    OFFERED,
    XACML_JSON,
    XACML_XML,
    Environment,
    current_pdp,
    read_body,
)
from pdp.http.why import explain_asked, explained
from pdp.request import RequestContext, bind_environment, bind_subject, media_kind, parse_request
from pdp.response import render_response
from pdp.results import STATUS_SYNTAX_ERROR, Decision, Response, Result, Status
from pdp.service import PolicyService
from pdp.urns import RESOURCE as RESOURCE_CATEGORY, RESOURCE_ID


def _request_kind() -> str | None:
    """'xml' / 'json' from Content-Type, None when it is neither (-> 415)."""
    try:
        return media_kind(request.headers.get("Content-Type", ""))
    except RequestSyntaxError:
        return None


def _response_media_type(request_kind: str) -> str | None:
    """Pick the response format from Accept; the request's format wins ties and `*/*`."""
    if not request.headers.get("Accept"):
        return OFFERED[request_kind][0]
    other = "json" if request_kind == "xml" else "xml"
    # For `*/*` werkzeug keeps the first offer, i.e. the request's own XACML media type.
    return request.accept_mimetypes.best_match(list(OFFERED[request_kind]) + list(OFFERED[other]))


def _xacml(response: Response, media_type: str, status: int = 200) -> FlaskResponse:
    return FlaskResponse(render_response(response, media_type), status=status,
                         content_type=media_type)



def decide_as(service: PolicyService, identity: Identity, ctx: RequestContext,
              environment: Environment | None = None) -> Response:
    """A request decided as the authenticated caller, on the gateway's clock and environment:
    what POST /pdp answers (its route and its fast path, pep/http/fast_pdp.py, both call this).
    `environment(resource_ids)` is asked with the request's resource-id values, so that the
    embedder can hand a decision only what concerns the resource it is about."""
    return service.decide(bind_as(identity, ctx, environment))


def bind_as(identity: Identity, ctx: RequestContext,
            environment: Environment | None = None) -> RequestContext:
    """The request as the gateway decides it: the caller as its subject, the gateway's clock
    and environment (`decide_as`; `?explain=1` explains this very request)."""
    ctx = bind_subject(ctx, identity)
    attributes = environment(ctx.values(RESOURCE_CATEGORY, RESOURCE_ID)) \
        if environment is not None else []
    return bind_environment(ctx, attributes)



@require_identity()
def decide() -> FlaskResponse:
    """Decide a XACML request, as the authenticated caller (whatever subject it names).
    ---
    post:
      parameters:
        - {name: explain, in: query, schema: {type: boolean},
           description: 'also say why: JSON {response, explanations}, by who asks (pdp.http.why)'}
      requestBody:
        required: true
        content:
          application/xacml+xml:
            schema: {$ref: '#/components/schemas/XacmlXml'}
          application/xacml+json:
            schema: {$ref: '#/components/schemas/XacmlJson'}
      responses:
        200:
          description: the XACML response, in the format Accept asks for (else the request's);
            with explain, JSON holding it and the explanations
          content:
            application/xacml+xml: {}
            application/xacml+json: {}
            application/json: {}
        400:
          description: a request that does not parse; a XACML response with syntax-error
        415:
          description: not a XACML media type
    """
    pdp = current_pdp()
    kind = _request_kind()
    if kind is None:
        raise UnsupportedMedia("unsupported Content-Type "
                               f"{request.headers.get('Content-Type')!r}: use {XACML_XML} "
                               f"or {XACML_JSON}")
    media_type = _response_media_type(kind)
    if media_type is None:
        raise NotAcceptable(f"cannot answer in {request.headers.get('Accept')!r}: "
                            f"{XACML_XML} and {XACML_JSON} are offered")
    try:
        ctx = parse_request(read_body(), request.headers["Content-Type"])
    except RequestSyntaxError as exc:
        status = Status(code=STATUS_SYNTAX_ERROR, message=str(exc))
        answer = Response(results=(Result(decision=Decision.INDETERMINATE, status=status),))
        return _xacml(answer, media_type, 400)
    if explain_asked():  # ?explain=1: the decision and why, as JSON (pdp.http.why)
        identity = current_identity()
        return explained(pdp, identity, bind_as(identity, ctx, pdp.environment))
    return _xacml(decide_as(pdp.service, current_identity(), ctx, pdp.environment), media_type)

