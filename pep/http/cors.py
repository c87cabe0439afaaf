"""CORS for other web apps: the origins in `cors_origins` may call the gateway's API from a
browser; every other origin gets no CORS headers, so browsers keep their same-origin rule.
Default: no origin at all (the console is served by the gateway itself and needs none).

- An allowed origin is exact (`https://app.example.org`, `http://127.0.0.1:3000`: scheme, host
  and port; no path), or `*` for any origin. No credentials mode: the API authenticates with a
  bearer `Authorization` header that the calling app sets, never with cookies, so no
  `Access-Control-Allow-Credentials` is ever sent and a page cannot borrow a user's session.
- Preflight (`OPTIONS` with `Access-Control-Request-Method`) from an allowed origin is answered
  here, 204, before any route or authentication runs: the methods the API uses, the request
  headers it reads (Authorization, Content-Type, Accept, Last-Event-ID), max age 10 minutes.
  A preflight from another origin goes on to the route as an ordinary OPTIONS (no CORS headers).
- Every other answer to an allowed origin carries `Access-Control-Allow-Origin: <origin>` and
  exposes the headers a client reads (Location, Retry-After, the policy version headers).
  `Vary: Origin` is always added when origins are configured, so caches keep answers apart.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from flask import Flask, Response, request

from common.http.errors import no_content

ALLOWED_METHODS = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
ALLOWED_HEADERS = "Authorization, Content-Type, Accept, Last-Event-ID"
EXPOSED_HEADERS = "Location, Retry-After, X-Policy-Version, X-Store-Version, X-XSG-Cache"
MAX_AGE = "600"
_ORIGIN = re.compile(r"^(https?)://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:\d{1,5})?$",
                     re.IGNORECASE)


def normalise_origins(origins: Iterable[str]) -> frozenset[str]:
    """The configured origins, checked and lower-cased; ValueError names a bad one."""
    out = set()
    for raw in origins:
        origin = str(raw).strip().rstrip("/")
        if origin == "*":
            out.add("*")
            continue
        if not _ORIGIN.match(origin):
            raise ValueError(f"CORS origin {raw!r} is not scheme://host[:port] (or *)")
        out.add(origin.lower())
    return frozenset(out)


def install_cors(app: Flask, origins: Iterable[str]) -> None:
    """Answer preflights from, and add CORS headers for, the allowed origins."""
    allowed = normalise_origins(origins)
    if not allowed:
        return
    any_origin = "*" in allowed

    def allowed_origin() -> str | None:
        origin = request.headers.get("Origin")
        if not origin:
            return None
        if any_origin or origin.lower() in allowed:
            return origin
        return None

    @app.before_request
    def cors_preflight() -> Response | None:
        if request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers:
            return None
        origin = allowed_origin()
        if origin is None:
            return None
        response = no_content()
        response.headers["Access-Control-Allow-Methods"] = ALLOWED_METHODS
        response.headers["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
        response.headers["Access-Control-Max-Age"] = MAX_AGE
        return response

    @app.after_request
    def cors_headers(response: Response) -> Response:
        response.vary.add("Origin")
        origin = allowed_origin()
        if origin is not None:
            response.headers["Access-Control-Allow-Origin"] = "*" if any_origin else origin
            if request.method != "OPTIONS":
                response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
        return response


__all__ = ["install_cors", "normalise_origins", "ALLOWED_METHODS", "ALLOWED_HEADERS"]
