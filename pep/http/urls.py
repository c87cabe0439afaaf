"""The gateway's public base URL, as handle URIs carry it."""
from __future__ import annotations

from flask import request


def public_base(base_url: str | None) -> str:
    """The configured public URL, else the one this request reached us by."""
    if base_url:
        return base_url.rstrip("/")
    return request.host_url.rstrip("/")
