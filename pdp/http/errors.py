"""The one JSON error body, and the handlers that turn exceptions into it.

Every refusal the gateway answers (PDP, PAP, stream side, proxy feed) is an RFC 9457 problem
document, `Content-Type: application/problem+json`:
`{"type": "about:blank", "title": "<the status's phrase>", "status": <code>, "detail": "<what and
where>", "error": "<the same>", ...details}` (`error` stays for clients written against the
first release). One shape, so a client needs one parser. Errors a client can fix are 4xx;
anything unexpected is a 500 whose body says only to look at the gateway's log (the log has the
stack trace; the client never does).

The PDP's routes raise what went wrong (`pdp.refusals`, the PDP's own errors) and `ERROR_STATUS`
below is the one table from those kinds to statuses. It holds wherever the routes are mounted:
an embedder installs its own table (`install_error_handlers`), which adds its kinds over this
one and may give a kind of this one a status of its own.
"""
from __future__ import annotations

import logging
from http import HTTPStatus
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

from pdp.errors import PolicyLoadError, RequestSyntaxError
from pdp.numbers import NumberError
from pdp.refusals import (
    Conflict, Gone, InputTooLarge, InvalidInput, NotAcceptable, NotFound, NotPermitted,
    Unauthenticated, Unavailable, UnsupportedMedia,
)
from pdp.service import PolicyIdMismatchError
from pdp.store import PolicyExistsError, PolicyNotFoundError

log = logging.getLogger(__name__)

# exception type -> HTTP status; an exception gets the status of the most specific class in its
# MRO that the table names (as Flask finds error handlers), so the order of entries is free
ErrorTable = Union[Mapping[type[BaseException], int], Sequence[tuple[type[BaseException], int]]]

# the PDP's errors, by kind: what its routes raise, or let through from the service and store
ERROR_STATUS: dict[type[BaseException], int] = {
    InvalidInput: 400,
    NumberError: 400,  # a header, query parameter or field that is not the number it must be
    PolicyIdMismatchError: 400,
    PolicyLoadError: 400,
    RequestSyntaxError: 400,
    Unauthenticated: 401,
    NotPermitted: 403,
    NotFound: 404,
    PolicyNotFoundError: 404,
    NotAcceptable: 406,
    Conflict: 409,
    PolicyExistsError: 409,
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


def with_pdp(table: ErrorTable) -> dict[type[BaseException], int]:
    """An embedder's table over the PDP's `ERROR_STATUS`: what `respond` looks errors up in."""
    return {**ERROR_STATUS, **_as_dict(table)}


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
    """Route every exception through `table` (over the PDP's `ERROR_STATUS`); `render` may answer a mapped error in a form of
    its own (e.g. a XACML response), else the body is `error_response` with the exception's
    `message` and `details` (and its `headers`). Unmapped exceptions are logged and answered 500."""

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
    """The answer to `exc` (inside an app context): its status in `table` or, for a kind
    `table` does not map, in the PDP's `ERROR_STATUS`; else a logged 500."""
    status = status_for(exc, with_pdp(table))
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


__all__ = ["ERROR_STATUS", "error_response", "no_content", "install_error_handlers", "respond", "status_for",
           "with_pdp", "ErrorTable"]
