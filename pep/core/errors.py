"""What can go wrong on the stream side, said as kinds of failure, never as HTTP statuses.

Every refusal the gateway's services raise is a `Refusal` of one kind: the input is invalid, the
thing asked for does not exist, the caller may not do it, it conflicts with what is live, ... The
HTTP edge holds the table from these kinds to status codes, the way OPA's server/writer maps
its error codes: services stay testable without a web framework, and one place decides what a
client sees.

A refusal carries a message that says what and where, and optional `details` (JSON-ready
fields such as the offending attribute, line or handle) that the edge adds to the error body.

The kinds the PDP's routes refuse with too (`common.refusals`: invalid input, not found, ...) are
subclasses of the shared ones, so one vocabulary says what went wrong on either side and each
kind has its status in the shared table (`common.http.errors.REFUSAL_STATUS`, under the PDP's
`pdp.http.ERROR_STATUS`); the ones only the stream side has (a denied or malformed stream
request, an unprocessable query) are in `pep/http/errors.py`.
"""
from __future__ import annotations

from typing import Any

from common import refusals
from pdp import Response


class Refusal(refusals.Refusal):
    """An operation was refused; `message` says why, `details` adds machine-readable fields
    (unlike the PDP's, a None detail is left out)."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = {k: v for k, v in details.items() if v is not None}


class InvalidInput(Refusal, refusals.InvalidInput):
    """Malformed or impossible input: a bad document, query, condition, schema or record."""


class UnsupportedMedia(Refusal, refusals.UnsupportedMedia):
    """The body's media type is not one the operation reads."""


class InputTooLarge(Refusal, refusals.InputTooLarge):
    """The input (a body, a batch of records) is over a size limit. Named apart from the
    analysis' internal bound (`pep.core.analysis`), which is no refusal."""


class NotFound(Refusal, refusals.NotFound):
    """The thing named does not exist (or is not the caller's to know about)."""


class Gone(Refusal, refusals.Gone):
    """The thing named existed and has ended."""


class NotPermitted(Refusal, refusals.NotPermitted):
    """The caller may not do this: a role or ownership rule, or a query for hidden data."""


class AccessDenied(NotPermitted):
    """The PDP did not permit the request. `decision` is the XACML response (a `pdp.Response`)
    and `media_type` its format, so that the edge can answer in XACML."""

    def __init__(self, message: str, decision: Response | None = None,
                 media_type: str | None = None, **details: Any) -> None:
        super().__init__(message, **details)
        self.decision = decision
        self.media_type = media_type


class MalformedRequest(InvalidInput):
    """A XACML request that does not parse; like AccessDenied it carries the XACML answer
    (an Indeterminate result with a syntax-error status)."""

    def __init__(self, message: str, decision: Response | None = None,
                 media_type: str | None = None, **details: Any) -> None:
        super().__init__(message, **details)
        self.decision = decision
        self.media_type = media_type


class Conflict(Refusal, refusals.Conflict):
    """The operation conflicts with the current state (exists already, another live query)."""


class Unprocessable(Refusal):
    """Well-formed, but it cannot be served: a time window on a stream without event time, a
    query that can never return anything, one too large to analyse."""


class NoResult(Unprocessable):
    """The query can never return a tuple (NR): nothing is started."""


class TooComplex(Unprocessable):
    """The query is too large to analyse or to run safely."""


class Unavailable(Refusal, refusals.Unavailable):
    """A part the operation needs is not ready or failed; the client may retry."""

    def __init__(self, message: str, retry_after: int | None = None, **details: Any) -> None:
        super().__init__(message, **details)
        self.retry_after = retry_after


__all__ = ["Refusal", "InvalidInput", "UnsupportedMedia", "InputTooLarge", "NotFound", "Gone",
           "NotPermitted", "AccessDenied", "MalformedRequest", "Conflict", "Unprocessable",
           "NoResult", "TooComplex", "Unavailable"]
