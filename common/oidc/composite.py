"""The gateway's authenticator: the token file's opaque tokens first, then the issuer's JWTs."""
from __future__ import annotations

import logging
from pathlib import Path

from common.auth import (
    WATCH_INTERVAL,
    Identity,
    IdentityListener,
    TokenAuthenticator,
    TokenFileAuthenticator,
    bearer_token,
)
from common.oidc.settings import OidcSettings
from common.oidc.tokens import JwtAuthenticator, looks_like_jwt
from common.roles import RoleHierarchy

log = logging.getLogger(__name__)


class CompositeAuthenticator:
    """The auth file's tokens first, then (when an issuer is configured) the issuer's JWTs.

    `authenticate_header` returns the caller's identity, None for no or an unknown opaque
    token, and raises `AuthenticationFailed` for a JWT it refuses (the reason goes to the
    caller). `identities` lists the token file's identities, then the remembered JWT ones.

    The token file's role hierarchy widens JWT identities too (with the token's own, when
    `oidc.role_hierarchy_claim` names one): when the file's hierarchy changes, the JWT subjects
    whose roles it widens differently are announced to the listeners like any identity
    change (source "role hierarchy (auth file)")."""

    def __init__(self, tokens: TokenFileAuthenticator | TokenAuthenticator | None,
                 jwt: JwtAuthenticator | None = None) -> None:
        self.tokens = tokens
        self.jwt = jwt
        self._listeners: list[IdentityListener] = []
        if tokens is not None and jwt is not None:
            file = tokens
            jwt.follow_hierarchy(lambda: file.hierarchy)
            if isinstance(file, TokenFileAuthenticator):
                file.add_hierarchy_listener(self._file_hierarchy_changed)

    def _file_hierarchy_changed(self, previous: RoleHierarchy, current: RoleHierarchy) -> None:
        subjects = self.jwt.subjects_changed_by(previous, current) if self.jwt is not None \
            else frozenset()
        if not subjects:
            return
        for callback in list(self._listeners):
            try:
                callback(subjects, "role hierarchy (auth file)")
            except Exception:  # the new hierarchy is in force whatever happens
                log.exception("identity listener failed after the role hierarchy changed")

    def authenticate(self, token: str | None) -> Identity | None:
        if not token:
            return None
        if self.tokens is not None:
            identity = self.tokens.authenticate(token)
            if identity is not None:
                return identity
        if self.jwt is not None and looks_like_jwt(token):
            return self.jwt.authenticate(token)
        return None

    def authenticate_header(self, authorization: str | None) -> Identity | None:
        return self.authenticate(bearer_token(authorization))

    def reload(self) -> bool:
        """Re-read the token file now (SIGHUP)."""
        reload = getattr(self.tokens, "reload", None)
        return bool(reload()) if reload is not None else False

    def add_listener(self, callback: IdentityListener) -> None:
        """`callback(subjects, source)` whenever subjects' identities change: the token file
        re-read (on disk, by the watcher, on SIGHUP), a JWT with other claims, or the file's
        role hierarchy changed for JWT subjects."""
        self._listeners.append(callback)
        for source in (self.tokens, self.jwt):
            add = getattr(source, "add_listener", None)
            if add is not None:
                add(callback)

    def watch(self, interval: float = WATCH_INTERVAL) -> None:
        """Follow the token file from a thread (`TokenFileAuthenticator.watch`)."""
        watch = getattr(self.tokens, "watch", None)
        if watch is not None:
            watch(interval)

    def stop(self) -> None:
        stop = getattr(self.tokens, "stop", None)
        if stop is not None:
            stop()

    @property
    def identities(self) -> list[Identity]:
        found = list(self.tokens.identities) if self.tokens is not None else []
        if self.jwt is not None:
            found.extend(self.jwt.identities)
        return found

    def identity_for(self, subject: str) -> Identity | None:
        """A subject's current identity: the token file's entry, else the last verified JWT's."""
        if self.tokens is not None:
            identity = self.tokens.identity_for(subject)
            if identity is not None:
                return identity
        return self.jwt.identity_for(subject) if self.jwt is not None else None


def build_authenticator(auth_file: str | Path, oidc: OidcSettings | None = None,
                        remember_file: str | Path | None = None,
                        check_interval: float = 1.0) -> CompositeAuthenticator:
    """The gateway's authenticator: the (followed) token file, then the issuer's JWTs."""
    tokens = TokenFileAuthenticator(auth_file, check_interval=check_interval)
    jwt = JwtAuthenticator(oidc, remember_file=remember_file) if oidc is not None else None
    return CompositeAuthenticator(tokens, jwt)

