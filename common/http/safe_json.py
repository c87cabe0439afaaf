"""`request.get_json()` with the limits of `common.xmlsafe.parse_json`.

Flask parses a JSON body with `json.loads`, which recurses: a body of 100,000 `[` ends in a
RecursionError, which neither `get_json(silent=True)` nor Flask's 400 handling catches (they
catch ValueError), so the client got a 500. The provider installed here parses with the size and
depth limits every other JSON document of the gateway has, and refuses with a ValueError, so
`get_json(silent=True)` answers None and `get_json()` a 400 with the one error body.
"""
from __future__ import annotations

from typing import Any

from flask import Flask
from flask.json.provider import DefaultJSONProvider

from common.xmlsafe import parse_json


class SafeJSONProvider(DefaultJSONProvider):
    """Flask's JSON, except that parsing a request body is bounded in size and depth."""

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        """`s` parsed within the limits; `json.loads` options are not taken (none is used)."""
        if kwargs:
            raise TypeError(f"SafeJSONProvider.loads takes no options, got {sorted(kwargs)}")
        return parse_json(s)  # UnsafeDocumentError is a ValueError


def install_safe_json(app: Flask) -> None:
    """Parse `app`'s JSON request bodies with `SafeJSONProvider` (keeping the app's settings
    for writing JSON)."""
    provider = SafeJSONProvider(app)
    current = app.json
    # Flask's DefaultJSONProvider (or this one, installed before) holds the writing settings
    assert isinstance(current, DefaultJSONProvider), type(current)
    provider.sort_keys = current.sort_keys
    provider.ensure_ascii = current.ensure_ascii
    provider.compact = current.compact
    provider.mimetype = current.mimetype
    app.json = provider


__all__ = ["SafeJSONProvider", "install_safe_json"]
