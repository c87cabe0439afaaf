"""The one table from what went wrong to the HTTP status a client gets.

Services raise refusals by kind (`pep.core.errors`) and the PDP raises its own errors; routes
let them propagate, and this table decides the status. An exception gets the status of the most
specific of its classes the table names (its MRO is walked, as Flask finds handlers), so the
order of entries does not matter and a subclass may have a status of its own. A refusal that carries a XACML response (a denial, a request that does
not parse) is answered in XACML, in the request's format; every other one gets the JSON error
body of `pdp.http.errors`, with the refusal's details (attribute, line, handle, ...) beside the
message.
"""
from __future__ import annotations

from flask import Flask, Response

from pdp import (PolicyExistsError, PolicyIdMismatchError, PolicyLoadError, PolicyNotFoundError,
                 RequestSyntaxError, media_kind, render_response)
from pdp.http.errors import error_response, install_error_handlers, respond, status_for
from pdp.numbers import NumberError
from pep.core.errors import (AccessDenied, Conflict, Gone, InputTooLarge, InvalidInput,
                             MalformedRequest, NotFound, NotPermitted, Unavailable, Unprocessable,
                             UnsupportedMedia)

ERROR_STATUS: dict[type[BaseException], int] = {
    # the stream side's refusals, by kind
    InvalidInput: 400,
    MalformedRequest: 400,
    InputTooLarge: 413,
    NumberError: 400,  # a header, query parameter or field that is not the number it must be
    UnsupportedMedia: 415,
    NotPermitted: 403,
    AccessDenied: 403,
    NotFound: 404,
    Gone: 410,
    Conflict: 409,
    Unprocessable: 422,
    Unavailable: 503,
    # the PDP's errors, where a route lets them through
    PolicyNotFoundError: 404,
    PolicyExistsError: 409,
    PolicyIdMismatchError: 400,
    PolicyLoadError: 400,
    RequestSyntaxError: 400,
}

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
    install_error_handlers(app, ERROR_STATUS, render=_render)


def response_for(exc: BaseException) -> Response:
    """The answer the gateway gives for `exc` (inside an app context)."""
    return respond(exc, ERROR_STATUS, _render)


def status_of(exc: BaseException) -> int | None:
    """The status the table gives an exception (tests and tools)."""
    return status_for(exc, ERROR_STATUS)


__all__ = ["ERROR_STATUS", "install", "response_for", "status_of"]
