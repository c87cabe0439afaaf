"""How a bearer JWT is refused: `InvalidToken` (401, with the bearer challenge that says why)
or `KeysUnavailable` (503: the issuer's keys cannot be fetched, the token may well be valid)."""
from __future__ import annotations


class AuthenticationFailed(Exception):
    """A bearer token was presented and refused; `message` says why (never the token)."""

    status = 401

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def headers(self) -> dict[str, str]:
        description = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "'"
                              for c in self.message)[:300]
        return {"WWW-Authenticate": f'Bearer realm="xsg", error="invalid_token", '
                                    f'error_description="{description}"'}


class InvalidToken(AuthenticationFailed):
    """The token is not a valid token of the configured issuer (401)."""


class KeysUnavailable(AuthenticationFailed):
    """The issuer's keys could not be fetched, so the token cannot be checked (503)."""

    status = 503

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}
