"""The one JSON error body, and the handlers that turn exceptions into it.

Every refusal the gateway and the proxy answer (PDP, PAP, stream side, proxy) is an RFC 9457
problem document, `Content-Type: application/problem+json`:
`{"type": "about:blank", "title": "<the status's phrase>", "status": <code>, "detail": "<what and
where>", "error": "<the same>", ...details}` (`error` stays for clients written against the
first release). One shape, so a client needs one parser. Errors a client can fix are 4xx;
anything unexpected is a 500 whose body says only to look at the gateway's log (the log has the
stack trace; the client never does).

Routes raise what went wrong, as kinds (`common.refusals`, and each side's own errors), and a
table from kinds to statuses decides the answer (`install_error_handlers`): `REFUSAL_STATUS`
below maps the shared kinds; the PDP's table (`pdp.http.ERROR_STATUS`) adds its own errors
over it, the gateway's adds the stream side's over that. An exception gets the status of the
most specific of its classes the table names (its MRO is walked, as Flask finds handlers).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from typing import Any

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

from common.numbers import NumberError
from common.refusals import (
    Conflict,
    Gone,
    InputTooLarge,
    InvalidInput,
    NotAcceptable,
    NotFound,
    NotPermitted,
    Unauthenticated,
    Unavailable,
    UnsupportedMedia,
)

log = logging.getLogger(__name__)

# exception type -> HTTP status; an exception gets the status of the most specific class in its
# MRO that the table names (as Flask finds error handlers), so the order of entries is free
ErrorTable = Mapping[type[BaseException], int] | Sequence[tuple[type[BaseException], int]]

# the shared kinds of refusal: what a route of any side raises when it refuses
REFUSAL_STATUS: dict[type[BaseException], int] = {
    InvalidInput: 400,
    NumberError: 400,  # a header, query parameter or field that is not the number it must be
    Unauthenticated: 401,
    NotPermitted: 403,
    NotFound: 404,
    NotAcceptable: 406,
    Conflict: 409,
    Gone: 410,
    InputTooLarge: 413,
    UnsupportedMedia: 415,
    Unavailable: 503,
}

PROBLEM_JSON = "application/problem+json"


def error_response(status: int, message: str, headers: dict[str, str] | None = None,
                   **details: Any) -> Response:
    """The error body every route answers with."""
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    response = jsonify(type="about:blank", title=title, status=status, detail=message,
                       error=message, **details)
    response.status_code = status
    response.content_type = PROBLEM_JSON
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def no_content() -> Response:
    """204: no body, hence no Content-Type either."""
    response = Response(status=204)
    del response.headers["Content-Type"]
    return response


def _as_dict(table: ErrorTable) -> Mapping[type[BaseException], int]:
    return table if isinstance(table, Mapping) else dict(table)


def status_for(exc: BaseException, table: ErrorTable) -> int | None:
    """The status of the most specific class of `exc` that the table names: its MRO is walked
    from the exception's own class up, as Flask finds handlers, so a subclass maps to its own
    status wherever the table lists it (for a class with two mapped bases, the MRO decides)."""
    statuses = _as_dict(table)
    for kind in type(exc).__mro__:
        status = statuses.get(kind)
        if status is not None:
            return status
    return None


def install_error_handlers(app: Flask, table: ErrorTable,
                           render: Callable[[BaseException, int], Response | None] | None = None
                           ) -> None:
    """Route every exception through `table` (the whole table: `REFUSAL_STATUS` and what a side
    adds over it); `render` may answer a mapped error in a form of its own (e.g. a XACML
    response), else the body is `error_response` with the exception's `message` and `details`
    (and its `headers`). Unmapped exceptions are logged and answered 500."""

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        message = exc.description or exc.name
        if exc.code == 413:
            message = (f"request body too large: the limit is "
                       f"{app.config['MAX_CONTENT_LENGTH']} bytes")
        headers = {}
        valid_methods = getattr(exc, "valid_methods", None)  # MethodNotAllowed's
        if exc.code == 405 and valid_methods:
            headers["Allow"] = ", ".join(valid_methods)
        return error_response(exc.code or 500, message, headers)

    @app.errorhandler(Exception)
    def mapped_error(exc: Exception) -> Response:
        return respond(exc, table, render)


def respond(exc: BaseException, table: ErrorTable,
            render: Callable[[BaseException, int], Response | None] | None = None) -> Response:
    """The answer to `exc` (inside an app context): its status in `table`, else a logged 500."""
    status = status_for(exc, table)
    if status is None:
        log.error("unhandled error", exc_info=exc)
        return error_response(500, "internal error; see the gateway log")
    if render is not None:
        answer = render(exc, status)
        if answer is not None:
            return answer
    details = getattr(exc, "details", None) or {}
    return error_response(status, getattr(exc, "message", None) or str(exc),
                          getattr(exc, "headers", None), **details)


__all__ = ["REFUSAL_STATUS", "PROBLEM_JSON", "error_response", "no_content",
           "install_error_handlers", "respond", "status_for", "ErrorTable"]
