"""The names the core gives JSON it reads before checking it.

A document decoded from JSON (a consumer's query, a sharing rule, a stored plan, a request's
resource Content) holds values of any JSON type until its reader has looked at each one: that is
`JsonValue` (`Any`, so that the reader's `isinstance` checks narrow it), named so that every such
parameter says what it holds. The JSON the core writes has shapes of its own, TypedDicts declared
where it is written (`pep.core.explain`, `pep.core.rules.model`, ...).
"""
from __future__ import annotations

from typing import Any

JsonValue = Any  # a decoded JSON value of a type not checked yet
JsonObject = dict[str, JsonValue]  # a decoded JSON object, its members not checked yet

__all__ = ["JsonValue", "JsonObject"]
