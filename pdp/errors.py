"""Errors shared across the PDP.

`Indeterminate` travels through evaluation (a function or a designator could not produce a
value); the other two are raised before evaluation and become a 4xx at the HTTP edge.
"""
from __future__ import annotations

from pdp.results import (
    STATUS_PROCESSING_ERROR,
    STATUS_SYNTAX_ERROR,
    MissingAttributeDetail,
)


class XacmlError(Exception):
    """Base class for everything the PDP raises on purpose."""


class Indeterminate(XacmlError):
    """Evaluation could not decide; carries the XACML status code to report."""

    def __init__(
        self,
        message: str,
        status_code: str = STATUS_PROCESSING_ERROR,
        missing: tuple[MissingAttributeDetail, ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.missing = missing


class ValueSyntaxError(XacmlError):
    """A lexical value is not valid for its datatype (e.g. 'abc' as an integer)."""


class PolicyLoadError(XacmlError):
    """A policy is invalid; says what and where (source name, element, line)."""

    def __init__(self, message: str, source: str | None = None, element: str | None = None,
                 line: int | None = None) -> None:
        self.message = message
        self.source = source
        self.element = element
        self.line = line
        where = ", ".join(
            p for p in (
                f"in {source}" if source else "",
                f"element {element}" if element else "",
                f"line {line}" if line else "",
            ) if p
        )
        super().__init__(f"{message} ({where})" if where else message)


class RequestSyntaxError(XacmlError):
    """A request is malformed; answered with status syntax-error, never evaluated."""

    status_code = STATUS_SYNTAX_ERROR
