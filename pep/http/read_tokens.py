"""Handle read tokens: how a browser's EventSource reads a handle without a bearer header.

An `EventSource` cannot send an `Authorization` header, so a handle's owner asks for a short
read credential with the bearer token and puts it in the stream URL:

    POST /handles/<id>/read-token        (bearer token of the handle's owner)
    -> 201 {"read_token": "...", "expires_at": "...", "expires_in": 300,
            "url": "<gateway>/handles/<id>?read_token=..."}
    GET  /handles/<id>?read_token=...   (Accept: text/event-stream; no Authorization header)

The token is `v1.<expiry>.<nonce>.<subject>.<mac>`: the MAC is HMAC-SHA256 under the gateway's
key (`read_token_key`, else a random key made when the process starts) over the purpose, the
method (GET), the handle id, the subject and the expiry. So a token:
- is good only for `GET /handles/<that id>`: the one view that accepts it is the handle read
  (`require_identity_or_read_token` in pep/http/handles.py), and the id is inside the MAC;
- acts only as the subject that owned the handle when it was minted, with that subject's current
  roles from the authenticator (a subject removed from the auth file is refused), and the handle
  view still checks that this subject owns the handle;
- expires after `read_token_ttl` seconds (default 300, at most 3600), and with the process when
  the key is a per-process one;
- is checked when a connection opens: an open stream goes on (the handle's own revocation ends
  it); a reconnection after expiry needs a fresh token (the console gets one and resumes with
  `last_event_id`).
It cannot change anything, list anything, or read another handle; it carries no bearer token.
A bearer `Authorization` header, when present, always wins and the token is ignored.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Flask, Response, current_app, g, jsonify, request

from common.auth import Identity
from common.http.auth import current_identity, require_identity, unauthorized
from common.numbers import check_float, parse_int
from pep.core.errors import Gone, NotFound
from pep.http.current import configured_base_url, current_services, may_see
from pep.http.urls import public_base
from pep.streams.visibility import hidden_from

READ_TOKENS_EXTENSION = "xsg.read_tokens"
QUERY_PARAMETER = "read_token"
DEFAULT_TTL = 300.0
MAX_TOKEN_LENGTH = 600
MAX_EXPIRY = 10 ** 12 - 1  # Unix seconds
_PURPOSE = b"xsg-handle-read-token/v1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ReadTokens:
    """Mints and verifies handle read tokens under one HMAC key."""

    def __init__(self, key: str | bytes | None = None, ttl: float = DEFAULT_TTL,
                 identities: Callable[[], Iterable[Identity]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if key is None or key == "" or key == b"":
            key = secrets.token_bytes(32)
        self._key = key.encode("utf-8") if isinstance(key, str) else bytes(key)
        self.ttl = check_float(ttl, "read_token_ttl", low=1, high=3600)
        self._identities = identities
        self._clock = clock

    def _mac(self, handle_id: str, subject: str, expiry: int, nonce: str) -> bytes:
        message = b"\x00".join((_PURPOSE, b"GET", handle_id.encode("utf-8"),
                                subject.encode("utf-8"), str(expiry).encode("ascii"),
                                nonce.encode("ascii")))
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def mint(self, handle_id: str, subject: str) -> tuple[str, int]:
        """(token, expiry as a Unix time) for GET of `handle_id` as `subject`."""
        expiry = int(self._clock() + self.ttl)
        nonce = _b64(secrets.token_bytes(9))
        mac = self._mac(handle_id, subject, expiry, nonce)
        token = f"v1.{expiry}.{nonce}.{_b64(subject.encode('utf-8'))}.{_b64(mac)}"
        return token, expiry

    def verify(self, token: str, handle_id: str) -> str | None:
        """The subject the token was minted for, when it is genuine, unexpired and for this
        handle; else None (never says which check failed)."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
            return None
        parts = token.split(".")
        if len(parts) != 5 or parts[0] != "v1":
            return None
        _, expiry_text, nonce, subject_b64, mac_b64 = parts
        try:
            expiry = parse_int(expiry_text, "read token expiry", high=MAX_EXPIRY)
            subject = _unb64(subject_b64).decode("utf-8")
            mac = _unb64(mac_b64)
        except (ValueError, UnicodeDecodeError):  # NumberError is a ValueError
            return None
        expected = self._mac(handle_id, subject, expiry, nonce)
        if not hmac.compare_digest(mac, expected):
            return None
        if self._clock() >= expiry:
            return None
        return subject

    def identity(self, subject: str) -> Identity | None:
        """The subject's current identity (roles may have changed since the token was minted)."""
        if self._identities is None:
            return None
        for identity in self._identities():
            if hmac.compare_digest(identity.subject.encode("utf-8"), subject.encode("utf-8")):
                return identity
        return None


def require_identity_or_read_token(handle_arg: str = "handle_id"
                                   ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Like `require_identity()`, but a request without an Authorization header may instead
    carry `?read_token=` minted for the handle named by the view's `handle_arg` argument. Only
    the handle read view uses it; without the read-token blueprint it is `require_identity()`."""

    def decorator(view: Callable[..., Any]) -> Callable[..., Any]:
        bearer_view = require_identity()(view)

        @functools.wraps(view)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            tokens: ReadTokens | None = current_app.extensions.get(READ_TOKENS_EXTENSION)
            token = request.args.get(QUERY_PARAMETER)
            if tokens is None or token is None or request.headers.get("Authorization") \
                    or request.method not in ("GET", "HEAD"):
                return bearer_view(*args, **kwargs)
            subject = tokens.verify(token, str(kwargs.get(handle_arg, "")))
            identity = tokens.identity(subject) if subject is not None else None
            if identity is None:
                return unauthorized("invalid or expired read token; get a new one with "
                                    "POST /handles/<id>/read-token")
            g.xsg_identity = identity
            return view(*args, **kwargs)

        return wrapped

    return decorator


def install_read_tokens(app: Flask, tokens: ReadTokens) -> None:
    """`POST /handles/<id>/read-token` on `app`, minting with `tokens`; installing it makes the
    handle read accept the tokens (`require_identity_or_read_token`)."""
    app.extensions[READ_TOKENS_EXTENSION] = tokens
    app.register_blueprint(bp)


# Defined once, at module level: the route reads the app's services (`pep.http.current`) and
# its ReadTokens (app.extensions), so any gateway app serves it.
bp = Blueprint("xsg_read_tokens", __name__)


@bp.post("/handles/<handle_id>/read-token")
@require_identity()
def mint_read_token(handle_id: str) -> Response:
    identity = current_identity()
    tokens: ReadTokens = current_app.extensions[READ_TOKENS_EXTENSION]
    record = current_services().handles.get_owned(handle_id, identity.subject)
    if record is None or hidden_from(may_see, identity)(record):
        raise NotFound("no such handle")
    if not record.live:
        raise Gone(f"handle is {record.state.value}", state=record.state.value,
                   reason=record.reason)
    token, expiry = tokens.mint(record.id, identity.subject)
    url = f"{public_base(configured_base_url())}/handles/{record.id}?{QUERY_PARAMETER}={token}"
    response = jsonify(
        read_token=token, url=url, expires_in=int(tokens.ttl),
        expires_at=datetime.fromtimestamp(expiry, UTC).isoformat().replace(
            "+00:00", "Z"))
    response.status_code = 201
    response.headers["Cache-Control"] = "no-store"
    return response


__all__ = ["ReadTokens", "require_identity_or_read_token", "install_read_tokens", "bp",
           "READ_TOKENS_EXTENSION", "QUERY_PARAMETER"]
