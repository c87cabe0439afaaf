"""What routes refuse, said as kinds of failure, never as HTTP statuses.

A route (the PDP's, `pdp.http`; the stream side's; the proxy's) raises a refusal of one kind:
the input is invalid, what was asked for does not exist or was deleted, the caller may not do
it, it conflicts with what is stored, a service is not ready, ... The HTTP edge holds the one
table from these kinds to status codes (`common.http.errors.REFUSAL_STATUS`, which each side's
table extends) and answers each with the one JSON error body. The stream side's refusals of the
same names (`pep.core.errors`) are subclasses of these, so one vocabulary says what went wrong
on either side; this module knows nothing of HTTP or Flask.

A refusal carries a message that says what and where, and `details`: JSON-ready fields the edge
adds to the error body beside the message (a policy's id, the source, element and line of a
policy that does not load). They are kept as given, a None included (it is written `null`).
A kind may also name `headers` for the answer (`Unauthenticated`: the bearer challenge).
"""
from __future__ import annotations

from typing import Any, Protocol


class Located(Protocol):
    """An error that says where in a document it is (the PDP's `PolicyLoadError`)."""

    @property
    def message(self) -> str: ...

    @property
    def source(self) -> str | None: ...

    @property
    def element(self) -> str | None: ...

    @property
    def line(self) -> int | None: ...


class Refusal(Exception):
    """A route refused; `message` says why, `details` adds machine-readable fields."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class Unauthenticated(Refusal):
    """No valid bearer token: the caller is nobody the gateway knows. `headers` go into the
    answer (the challenge that says how to authenticate)."""

    headers = {"WWW-Authenticate": 'Bearer realm="xsg"'}


class InvalidInput(Refusal):
    """A body, document or query parameter that is malformed or empty."""

    @classmethod
    def of(cls, exc: Located) -> InvalidInput:
        """A document that does not load (a policy), said with where (source, element, line)."""
        return cls(exc.message, source=exc.source, element=exc.element, line=exc.line)


class UnsupportedMedia(Refusal):
    """The body's media type is not one the route reads."""


class NotAcceptable(Refusal):
    """The route cannot answer in any media type the request's Accept takes."""


class InputTooLarge(Refusal):
    """More input than the route takes at once (e.g. documents in one bulk add)."""


class NotFound(Refusal):
    """What was named does not exist (or is not the caller's to know about)."""


class Gone(Refusal):
    """What was named existed and is gone (a policy version that is a deletion)."""


class NotPermitted(Refusal):
    """The caller may not do this (to this policy: `pdp.manage` said no)."""


class Conflict(Refusal):
    """The change conflicts with what is stored: the id exists, or a policy set still
    references the policy to delete."""

    @classmethod
    def of(cls, exc: Located) -> Conflict:
        """A change the engine cannot load with what else it holds, said with where."""
        return cls(exc.message, source=exc.source, element=exc.element, line=exc.line)


class Unavailable(Refusal):
    """A service is not ready (the policy engine is not loaded yet); the client may retry."""


__all__ = ["Located", "Refusal", "Unauthenticated", "InvalidInput", "UnsupportedMedia",
           "NotAcceptable", "InputTooLarge", "NotFound", "Gone", "NotPermitted", "Conflict",
           "Unavailable"]
