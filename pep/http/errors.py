"""The gateway's statuses: the stream side's own kinds, over the PDP's table.

Services raise refusals by kind (`pep.core.errors`) and the PDP raises its own errors; routes
let them propagate, and the table decides the status. The kinds both sides have (invalid input,
not found, ...: the stream side's are subclasses of the shared ones, `common.refusals`) and the
PDP's errors have their status in the PDP's table (`pdp.http.ERROR_STATUS`, over
`common.http.errors.REFUSAL_STATUS`); `ERROR_STATUS` here holds the kinds only the stream side
has, and `GATEWAY_STATUS` is both tables, what the gateway answers by. An exception gets the
status of the most specific of its classes the table names (its MRO is walked, as Flask finds
handlers), so the order of entries does not matter and a subclass may have a status of its own.
A refusal that carries a XACML response (a denial, a request that does not parse) is answered
in XACML, in the request's format; every other one gets the JSON error body of
`common.http.errors`, with the refusal's details (attribute, line, handle, ...) beside the
message.
"""
from __future__ import annotations

from flask import Flask, Response

from common.http.errors import error_response, install_error_handlers, respond, status_for
from pdp import media_kind, render_response
from pdp.http import ERROR_STATUS as PDP_STATUS
from pep.core.errors import AccessDenied, MalformedRequest, Unavailable, Unprocessable

# the kinds only the stream side has (the others, and the PDP's errors where a route lets them
# through, are in the PDP's table)
ERROR_STATUS: dict[type[BaseException], int] = {
    MalformedRequest: 400,
    AccessDenied: 403,
    Unprocessable: 422,
}

# what the gateway answers by: the PDP's table (the shared kinds and the PDP's errors), the
# stream side's kinds over it
GATEWAY_STATUS: dict[type[BaseException], int] = {**PDP_STATUS, **ERROR_STATUS}

XACML_MEDIA = {"xml": "application/xacml+xml", "json": "application/xacml+json"}


def _render(exc: BaseException, status: int) -> Response | None:
    """XACML for a refusal that carries a XACML response; a Retry-After for Unavailable."""
    decision = getattr(exc, "decision", None)
    media_type = getattr(exc, "media_type", None)
    if decision is not None and media_type:
        media = XACML_MEDIA[media_kind(media_type)]
        return Response(render_response(decision, media), status=status, content_type=media)
    if isinstance(exc, Unavailable) and exc.retry_after is not None:
        return error_response(status, exc.message, {"Retry-After": str(exc.retry_after)},
                              **exc.details)
    return None


def install(app: Flask) -> None:
    """Answer every error raised in `app` through the table."""
    install_error_handlers(app, GATEWAY_STATUS, render=_render)


def response_for(exc: BaseException) -> Response:
    """The answer the gateway gives for `exc` (inside an app context)."""
    return respond(exc, GATEWAY_STATUS, _render)


def status_of(exc: BaseException) -> int | None:
    """The status the gateway gives an exception (tests and tools): as `response_for` finds it,
    in this table over the PDP's."""
    return status_for(exc, GATEWAY_STATUS)


__all__ = ["ERROR_STATUS", "GATEWAY_STATUS", "install", "response_for", "status_of"]
