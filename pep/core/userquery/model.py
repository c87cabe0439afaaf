"""A consumer's query as parsed, before any schema: `UserQuery` (and `JoinQuery` for a join's
second side), `UserQueryError` with its position, the size limits, and the values both forms read
alike (a window's epsilon/delta ask, a join's time bound)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, TypedDict

from pep.core.jsontypes import JsonValue
from pep.core.obligations import MAX_WINDOW
from pep.core.privacy import PrivacyAsk

MAX_QUERY_BYTES = 64 * 1024
MAX_QUERY_DEPTH = 16


class UserQueryError(ValueError):
    """The user's query is malformed or does not fit the stream."""

    def __init__(self, message: str, position: str | None = None) -> None:
        self.message = message
        self.position = position
        super().__init__(f"{message} ({position})" if position else message)


@dataclass(frozen=True)
class UserQuery:
    """A parsed, not yet schema-checked, user query."""

    stream: str | None = None
    filter: str | None = None
    map: tuple[str, ...] | None = None
    window_kind: Literal["tuple", "time"] | None = None
    window_size: int | None = None
    window_step: int | None = None
    aggregates: tuple[str, ...] = ()
    has_window: bool = False
    filter_position: str | None = None  # where the filter text sits in the document
    window_keys: tuple[str, ...] | None = None  # None: the policy's
    window_min_count: int = 1
    window_coarsen: bool = False
    join: JoinQuery | None = None  # a second stream joined with this one
    window_privacy: PrivacyAsk | None = None  # a smaller epsilon/delta than the policy's
    masks: tuple[str, ...] = ()  # "attribute:mask" texts: coarser masks asked for

    @property
    def is_empty(self) -> bool:
        return (self.filter is None and self.map is None and not self.has_window
                and self.join is None and not self.masks)


@dataclass(frozen=True)
class JoinQuery:
    """The join part of a user query: the second stream, the condition, the second side's query.

    `side` is the second stream's own filter, map and window (its `stream` is the join's)."""

    stream: str
    on: tuple[tuple[str, str], ...]  # (attribute of the request's side, attribute of the second)
    within: float | None
    side: UserQuery


class WindowPrivacy(TypedDict, total=False):
    """The epsilon and delta a window asks for, as either form has read them."""

    epsilon: float
    delta: float


PRIVACY_KEYS: tuple[Literal["epsilon"], Literal["delta"]] = ("epsilon", "delta")


def privacy_ask(window: WindowPrivacy) -> PrivacyAsk | None:
    if "epsilon" not in window and "delta" not in window:
        return None
    return PrivacyAsk(window.get("epsilon"), window.get("delta"))


def within_seconds(value: JsonValue, where: str | None) -> float:
    """A join's time bound in seconds: a finite number >= 0 (and not absurdly large)."""
    if isinstance(value, bool):
        raise UserQueryError("within must be a number of seconds", where)
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise UserQueryError(f"within {value!r} is not a number of seconds", where) from None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise UserQueryError("within must be a finite number of seconds, at least 0", where)
    if value > MAX_WINDOW:
        raise UserQueryError(f"within {value} is over the limit of {MAX_WINDOW} seconds", where)
    return float(value)
