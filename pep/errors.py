"""The refusal that the stream side's services raise and its HTTP layer turns into a 4xx."""
from __future__ import annotations


class RefusedError(Exception):
    """An operation was refused; `status` is the HTTP status it maps to, `message` says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
