"""Request authentication for Flask views: who is calling, as an `Identity`.

The app holds one authenticator (`install_authenticator`); a view decorated with
`require_identity()` runs only for a caller with a valid bearer token and finds it in
`current_identity()`. A caller without one is refused (`Unauthenticated`): the error table
answers 401 with a `WWW-Authenticate: Bearer realm="xsg"` challenge, and the body says what
was wrong with what was sent (`refusal_for`): no credentials, another scheme than Bearer (named:
Basic credentials are not a bad bearer token), a Bearer header without a token
(`error="invalid_request"`, RFC 6750 3.1), or a token nobody has (`error="invalid_token"`).
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from flask import Response, current_app, g, request

from common.auth import Identity
from common.http.errors import error_response
from common.refusals import Unauthenticated

AUTH_EXTENSION = "xsg.auth"


def install_authenticator(app: Any, authenticator: Any) -> None:
    app.extensions[AUTH_EXTENSION] = authenticator


CHALLENGE = 'Bearer realm="xsg"'
_SCHEME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,40}")  # an RFC 9110 token, bounded


def refusal_for(authorization: str | None) -> Unauthenticated:
    """Why these credentials (the Authorization header, or None) authenticate nobody: the 401
    that says what is missing or wrong, with its challenge (RFC 9110 11.6.1, RFC 6750 3)."""
    if authorization is None or not authorization.strip():
        return Unauthenticated("missing bearer token")
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        # one word is a token without its scheme more likely than a scheme: never echoed
        if not credentials.strip() or not _SCHEME.fullmatch(scheme):
            return Unauthenticated("malformed Authorization header: expected "
                                   "'Authorization: Bearer <token>'")
        # RFC 6750 3.1: no error code for an unsupported method, only the challenge
        return Unauthenticated(f"the {scheme} authentication scheme is not supported; send "
                               "'Authorization: Bearer <token>'", scheme=scheme,
                               supported=["Bearer"])
    refusal = Unauthenticated("missing bearer token: the Authorization header names the "
                              "Bearer scheme but holds no token") if not credentials.strip() \
        else Unauthenticated("invalid bearer token")
    error = "invalid_request" if not credentials.strip() else "invalid_token"
    refusal.headers = {"WWW-Authenticate": f'{CHALLENGE}, error="{error}"'}
    return refusal


def unauthorized(message: str | None = None) -> Response:
    """The 401 answer, for a view that answers it itself (the table's, for `Unauthenticated`):
    `message`, or what `refusal_for` says of the request's credentials."""
    refusal = refusal_for(request.headers.get("Authorization"))
    return error_response(401, message or refusal.message, refusal.headers, **refusal.details)


def authenticate_request() -> Identity | None:
    authenticator = current_app.extensions.get(AUTH_EXTENSION)
    if authenticator is None:  # a misconfigured app denies everything rather than allowing
        return None
    identity: Identity | None = authenticator.authenticate_header(
        request.headers.get("Authorization"))
    return identity


def require_identity() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the view runs only for an authenticated caller, available as
    `current_identity()`."""

    def decorator(view: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(view)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            identity = authenticate_request()
            if identity is None:
                raise refusal_for(request.headers.get("Authorization"))
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
           "authenticate_request", "refusal_for", "AUTH_EXTENSION", "CHALLENGE"]
