"""`POST /pdp` without Flask's request machinery, for the requests that are answered 200.

A decision is the gateway's most frequent call, and Flask's share of it (request context, URL
adapter, context-local lookups, `Accept` matching, the response object) cost more than the
decision itself: about 0.25 ms of 0.4 ms per call. This WSGI wrapper answers, with the very
code the route in `pdp.http.api` uses (the token's identity, `parse_request`, `decide_as`, which
binds the caller and the gateway's environment and decides, and `render_response`), exactly the
requests that route would answer 200: a ready engine, a valid bearer token, a XACML XML or JSON Content-Type, no
Accept or one naming one of the offered types exactly, a Content-Length under the app's limit,
and a body that parses. Every other request (a refusal of any kind, a chunked body, an Accept
with alternatives or wildcards, any other path) goes to the Flask app unchanged, its body
replayed: refusals keep the one error body and the route's own rules.
`tests/pep/http/test_fast_pdp.py` checks both give the same answers.
"""
from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import time

from pdp.errors import RequestSyntaxError
from pdp.http.api import decide_as
from pdp.http.auth import AUTH_EXTENSION
from pdp.request import media_kind, parse_request
from pdp.response import render_response
from pep.http import access_log

XACML_XML = "application/xacml+xml"
XACML_JSON = "application/xacml+json"
# What the route offers for each request kind (see pdp.http.api._OFFERED): an Accept naming
# exactly one of these gets it; no Accept gets the request's own XACML type.
_OFFERED = {"xml": (XACML_XML, "application/xml", "text/xml"),
            "json": (XACML_JSON, "application/json")}
_ALL_OFFERED = frozenset(_OFFERED["xml"] + _OFFERED["json"])


class FastPdp:
    """WSGI middleware in front of the gateway's Flask app (see the module docstring)."""

    def __init__(self, app: Callable, service: Any, extensions: dict,
                 max_content_length: int | None,
                 environment: Callable[[list[str]], list] | None = None) -> None:
        self.app = app
        self.service = service
        self.environment = environment
        self.extensions = extensions  # the Flask app's: its authenticator is read per call
        self.limit = max_content_length
        self.answered = 0  # decisions answered here (the rest went to the app)

    def __call__(self, environ: dict, start_response: Callable) -> Any:
        if environ.get("PATH_INFO") != "/pdp" or environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        started = time.perf_counter()
        answer = self._answer(environ)
        if answer is None:
            return self.app(environ, start_response)
        body, media_type, subject = answer
        self.answered += 1
        start_response("200 OK", [("Content-Type", media_type),
                                  ("Content-Length", str(len(body)))])
        access_log.record({"method": "POST", "path": "/pdp", "status": 200, "subject": subject,
                           "remote": environ.get("REMOTE_ADDR")}, time.perf_counter() - started)
        return [body]

    def _answer(self, environ: dict) -> tuple[bytes, str, str] | None:
        """The decision's body, media type and subject, or None: the app answers instead."""
        service = self.service
        if not service.ready or environ.get("SCRIPT_NAME"):
            return None
        authenticator = self.extensions.get(AUTH_EXTENSION)
        try:
            identity = authenticator.authenticate_header(environ.get("HTTP_AUTHORIZATION")) \
                if authenticator is not None else None
        except Exception:  # noqa: BLE001 - a refused JWT and the like: the route answers why
            return None
        if identity is None:
            return None
        content_type = environ.get("CONTENT_TYPE", "")
        try:
            kind = media_kind(content_type)
        except RequestSyntaxError:
            return None
        accept = environ.get("HTTP_ACCEPT")
        if accept is None or accept == "":
            media_type = _OFFERED[kind][0]
        else:
            media_type = accept.strip()
            if media_type not in _ALL_OFFERED:
                return None
        length = environ.get("CONTENT_LENGTH", "")
        if not length.isdigit() or environ.get("HTTP_TRANSFER_ENCODING"):
            return None
        size = int(length)
        if self.limit is not None and size >= self.limit:
            return None
        data = environ["wsgi.input"].read(size) if size else b""
        try:
            ctx = parse_request(data, content_type)
        except RequestSyntaxError:
            ctx = None
        if ctx is None or len(data) != size:
            # the app answers (400 with a XACML body, ...): give it the body again
            environ["wsgi.input"] = io.BytesIO(data)
            environ["CONTENT_LENGTH"] = str(len(data))
            return None
        response = decide_as(service, identity, ctx, self.environment)
        return render_response(response, media_type), media_type, identity.subject


def install_fast_pdp(app: Any, service: Any,
                     environment: Callable[[list[str]], list] | None = None) -> FastPdp:
    """Put the fast path in front of `app.wsgi_app`; returns it."""
    fast = FastPdp(app.wsgi_app, service, app.extensions, app.config.get("MAX_CONTENT_LENGTH"),
                   environment)
    app.wsgi_app = fast
    return fast


__all__ = ["FastPdp", "install_fast_pdp"]
