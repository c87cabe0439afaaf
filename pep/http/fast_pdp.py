"""`POST /pdp` without Flask's request machinery, for the requests that are answered 200.

A decision is the gateway's most frequent call, and Flask's share of it (request context, URL
adapter, context-local lookups, `Accept` matching, the response object) cost more than the
decision itself: about 0.25 ms of 0.4 ms per call. This WSGI wrapper answers, with the very
code the route in `pdp.http.api` uses (the token's identity, `parse_request`, `decide_as`, which
binds the caller and the gateway's environment and decides, and `render_response`), exactly the
requests that route would answer 200: a ready engine, a valid bearer token, a XACML XML or JSON
Content-Type, no Accept or one naming one of the offered types exactly, a Content-Length under the
app's limit, no query string (`?explain=1` is the route's), and a body that parses. Every other
request (a refusal of any kind, a chunked body, an Accept with alternatives or wildcards, any other
path) goes to the Flask app unchanged, its body
replayed: refusals keep the one error body and the route's own rules. The gateway's server
(server/serving.py) calls `answer` on its event loop with the body it has read (it is the app's
`server.bridge.FastPath`), and hands what it declines to Flask marked as tried.
`tests/pep/http/test_fast_pdp.py` checks both give the same answers.
"""
from __future__ import annotations

import io
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from common.auth import bearer_token
from common.http.auth import AUTH_EXTENSION
from common.oidc import looks_like_jwt
from pdp import PolicyService, RequestSyntaxError, media_kind, parse_request, render_response
from pdp.http import Environment, decide_as
from pep.http import access_log
from server.bridge import FAST_PATH_EXTENSION, FAST_PATH_TRIED

if TYPE_CHECKING:  # the WSGI types exist in typeshed only (wsgiref.types is Python 3.12's)
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment
    from flask import Flask

XACML_XML = "application/xacml+xml"
XACML_JSON = "application/xacml+json"
# What the route offers for each request kind (see pdp.http.api._OFFERED): an Accept naming
# exactly one of these gets it; no Accept gets the request's own XACML type.
_OFFERED = {"xml": (XACML_XML, "application/xml", "text/xml"),
            "json": (XACML_JSON, "application/json")}
_ALL_OFFERED = frozenset(_OFFERED["xml"] + _OFFERED["json"])


class FastPdp:
    """WSGI middleware in front of the gateway's Flask app (see the module docstring)."""

    def __init__(self, app: WSGIApplication, service: PolicyService,
                 extensions: Mapping[str, Any], max_content_length: int | None,
                 environment: Environment | None = None) -> None:
        self.app = app
        self.service = service
        self.environment = environment
        self.extensions = extensions  # the Flask app's: its authenticator is read per call
        self.limit = max_content_length
        self.answered = 0  # decisions answered here (the rest went to the app)
        self.path = "/pdp"  # what the server's loop sends here (`server.bridge.FastPath`)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse
                 ) -> Iterable[bytes]:
        """The WSGI form (any WSGI server, Flask's test client); the gateway's own server calls
        `answer` on its event loop instead and marks what it already tried."""
        if environ.get("PATH_INFO") != "/pdp" or environ.get("REQUEST_METHOD") != "POST" \
                or environ.get(FAST_PATH_TRIED) or environ.get("SCRIPT_NAME") \
                or environ.get("QUERY_STRING"):  # ?explain=1 (and the like): the route's
            return self.app(environ, start_response)
        length = environ.get("CONTENT_LENGTH", "")
        if not length.isdigit() or environ.get("HTTP_TRANSFER_ENCODING") \
                or (self.limit is not None and int(length) >= self.limit):
            return self.app(environ, start_response)
        size = int(length)
        data = environ["wsgi.input"].read(size) if size else b""
        answer = None
        if len(data) == size:
            answer = self.answer(environ.get("HTTP_AUTHORIZATION"),
                                 environ.get("CONTENT_TYPE", ""), environ.get("HTTP_ACCEPT"),
                                 data, environ.get("REMOTE_ADDR"))
        if answer is None:
            # the app answers (400 with a XACML body, ...): give it the body again
            environ["wsgi.input"] = io.BytesIO(data)
            environ["CONTENT_LENGTH"] = str(len(data))
            return self.app(environ, start_response)
        body, media_type = answer
        start_response("200 OK", [("Content-Type", media_type),
                                  ("Content-Length", str(len(body)))])
        return [body]

    def blocks(self, authorization: str | None) -> bool:
        """Whether authenticating may wait on the network (a JWT whose issuer's keys are
        fetched): then `answer` must not run on the server's event loop."""
        return looks_like_jwt(bearer_token(authorization) or "")

    def answer(self, authorization: str | None, content_type: str, accept: str | None,
               body: bytes, remote: str | None) -> tuple[bytes, str] | None:
        """The decision's body and media type, logged, or None: the Flask route answers
        instead (see the module docstring)."""
        started = time.perf_counter()
        answer = self._answer(authorization, content_type, accept, body)
        if answer is None:
            return None
        data, media_type, subject = answer
        self.answered += 1
        access_log.record({"method": "POST", "path": "/pdp", "status": 200, "subject": subject,
                           "remote": remote}, time.perf_counter() - started)
        return data, media_type

    def _answer(self, authorization: str | None, content_type: str, accept: str | None,
                data: bytes) -> tuple[bytes, str, str] | None:
        service = self.service
        if not service.ready:
            return None
        if self.limit is not None and len(data) >= self.limit:
            return None
        authenticator = self.extensions.get(AUTH_EXTENSION)
        try:
            identity = authenticator.authenticate_header(authorization) \
                if authenticator is not None else None
        except Exception:  # noqa: BLE001 - a refused JWT and the like: the route answers why
            return None
        if identity is None:
            return None
        try:
            kind = media_kind(content_type)
        except RequestSyntaxError:
            return None
        if accept is None or accept == "":
            media_type = _OFFERED[kind][0]
        else:
            media_type = accept.strip()
            if media_type not in _ALL_OFFERED:
                return None
        try:
            ctx = parse_request(data, content_type)
        except RequestSyntaxError:
            return None
        if ctx is None:
            return None
        response = decide_as(service, identity, ctx, self.environment)
        return render_response(response, media_type), media_type, identity.subject


def install_fast_pdp(app: Flask, service: PolicyService,
                     environment: Environment | None = None) -> FastPdp:
    """Put the fast path in front of `app.wsgi_app`; returns it."""
    fast = FastPdp(app.wsgi_app, service, app.extensions, app.config.get("MAX_CONTENT_LENGTH"),
                   environment)
    app.wsgi_app = fast  # type: ignore[method-assign]  # Flask's documented middleware hook
    app.extensions[FAST_PATH_EXTENSION] = fast  # the gateway's server answers on its loop
    return fast


__all__ = ["FastPdp", "install_fast_pdp"]
