"""Request authentication for Flask views: who is calling, as an `Identity`.

The app holds one authenticator (`install_authenticator`); a view decorated with
`require_identity()` runs only for a caller with a valid bearer token and finds it in
`current_identity()`. A caller without one is refused (`Unauthenticated`): the error table
answers 401 with `WWW-Authenticate: Bearer`.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from flask import Response, current_app, g, request

from pdp.auth import Identity
from pdp.http.errors import error_response
from pdp.refusals import Unauthenticated

AUTH_EXTENSION = "xsg.auth"


def install_authenticator(app: Any, authenticator: Any) -> None:
    app.extensions[AUTH_EXTENSION] = authenticator


def unauthorized(message: str = "a valid bearer token is required") -> Response:
    """The 401 answer, for a view that answers it itself (the table's, for `Unauthenticated`)."""
    return error_response(401, message, Unauthenticated.headers)


def authenticate_request() -> Identity | None:
    authenticator = current_app.extensions.get(AUTH_EXTENSION)
    if authenticator is None:  # a misconfigured app denies everything rather than allowing
        return None
    identity: Identity | None = authenticator.authenticate_header(
        request.headers.get("Authorization"))
    return identity


def require_identity() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the view runs only for an authenticated caller, available as `current_identity()`."""

    def decorator(view: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(view)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            identity = authenticate_request()
            if identity is None:
                header = request.headers.get("Authorization")
                raise Unauthenticated("missing bearer token" if not header
                                      else "invalid bearer token")
            g.xsg_identity = identity
            return view(*args, **kwargs)

        return wrapped

    return decorator


def current_identity() -> Identity:
    identity: Identity | None = g.get("xsg_identity")
    if identity is None:
        raise RuntimeError("current_identity() outside a view decorated with require_identity()")
    return identity


__all__ = ["install_authenticator", "require_identity", "current_identity", "unauthorized",
           "authenticate_request", "AUTH_EXTENSION"]
