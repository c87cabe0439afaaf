"""OIDC / JWT bearer tokens, beside the token file.

A gateway configured with an issuer accepts, besides the tokens of its auth file, JSON Web Tokens
signed by that issuer (an access token from Keycloak, Auth0, Entra ID, ...):

- **Signature**: checked with PyJWT against the issuer's JWKS (`jwks_uri`, or discovered from
  `<issuer>/.well-known/openid-configuration`), fetched with `requests` and cached for
  `jwks_cache_seconds`. A token whose `kid` is not among the cached keys makes the gateway fetch
  the JWKS again, at most once every `jwks_refetch_seconds` (so a key rotation is picked up by the
  first token signed with the new key, and a flood of made-up `kid`s costs one fetch per period).
  When a refresh fails the cached keys stay in use; when there never were keys the caller gets
  503 (the token may well be valid).
- **Algorithms**: only asymmetric ones, from an allow-list (default RS256, PS256, ES256;
  RS/PS/ES 256-512 and EdDSA may be listed). `alg: none` and the HMAC family (HS256: the "public
  key as shared secret" confusion) are refused before any key is looked at, and the key's type
  (and its declared `alg`, when the JWK has one) must match the token's algorithm.
- **Claims**: `iss` must equal the issuer, `aud` must contain one of the configured audiences,
  `exp` is required, `exp`, `nbf` and `iat` are checked with `leeway` seconds of clock skew.
- **Identity**: the subject from `subject_claim` (default `sub`), roles from every claim path in
  `roles_claims` (dotted paths, e.g. Keycloak's `realm_access.roles` or a flat `roles`; a claim
  whose full name contains dots, such as `https://example.com/roles`, is found under that name
  first), `admin` when the roles contain `admin_role`, and identity attributes from `attributes`
  (XACML attribute id -> claim path; strings, numbers, booleans or lists of them).

Every refusal raises `InvalidToken` (401) or `KeysUnavailable` (503) with a message that says
why; the HTTP edge answers it with the one error body and `WWW-Authenticate: Bearer
error="invalid_token", error_description="..."`.

JWT identities cannot be listed as the token file's can, yet the revocation service needs a
handle owner's current identity when it re-decides. `JwtAuthenticator` therefore remembers the
last identity it verified for each subject (and that token's expiry), bounded to the most recent
`MAX_REMEMBERED` subjects, optionally in a file so that a restart keeps them. Re-decisions use
that identity even after its token expired: a token's lifetime limits when it may be presented,
not how long a granted stream may run (as with the token file); the claims are refreshed
whenever the subject presents a new token. When a token's claims give a subject another
identity than the one remembered (other roles, admin flag or attributes), the listeners
(`add_listener`) hear of it before `authenticate` returns, so the subject's live handles are
re-decided with the new claims at once (a subject seen for the first time has nothing to
re-decide).
"""
from __future__ import annotations

import base64
import json
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pdp.auth import (WATCH_INTERVAL, AuthFileError, Identity, IdentityListener,
                      TokenAuthenticator, TokenFileAuthenticator, bearer_token,
                      parse_identity_attributes)
from pdp.numbers import END_EPOCH_SECONDS, NumberError, check_float

log = logging.getLogger(__name__)

MAX_EXP = END_EPOCH_SECONDS - 1  # 9999-12-31T23:59:59Z in Unix seconds

# Asymmetric signature algorithms PyJWT verifies with a public key; nothing else may be listed.
ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                         "ES256", "ES384", "ES512", "EdDSA")
DEFAULT_ALGORITHMS = ("RS256", "PS256", "ES256")
KEY_TYPE = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}
MAX_JWKS_BYTES = 512 * 1024
MAX_JWKS_KEYS = 100
MAX_REMEMBERED = 10_000


class AuthenticationFailed(Exception):
    """A bearer token was presented and refused; `message` says why (never the token)."""

    status = 401

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def headers(self) -> dict[str, str]:
        description = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "'"
                              for c in self.message)[:300]
        return {"WWW-Authenticate": f'Bearer realm="xsg", error="invalid_token", '
                                    f'error_description="{description}"'}


class InvalidToken(AuthenticationFailed):
    """The token is not a valid token of the configured issuer (401)."""


class KeysUnavailable(AuthenticationFailed):
    """The issuer's keys could not be fetched, so the token cannot be checked (503)."""

    status = 503

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}


@dataclass(frozen=True)
class OidcSettings:
    """The issuer whose JWTs the gateway accepts, and how claims become an `Identity`."""

    issuer: str
    audience: tuple[str, ...]
    jwks_uri: str | None = None  # None: from <issuer>/.well-known/openid-configuration
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    leeway: float = 30.0  # seconds of clock skew allowed on exp, nbf and iat
    subject_claim: str = "sub"
    roles_claims: tuple[str, ...] = ("realm_access.roles", "roles")
    admin_role: str | None = None  # a caller with this role is an administrator
    attributes: tuple[tuple[str, str], ...] = ()  # (XACML attribute id, claim path)
    jwks_cache_seconds: float = 300.0  # keys are fetched again after this long
    jwks_refetch_seconds: float = 10.0  # at most one fetch per period for an unknown kid
    http_timeout: float = 5.0  # seconds per JWKS / discovery request

    def __post_init__(self) -> None:
        if isinstance(self.audience, str):
            object.__setattr__(self, "audience", (self.audience,))
        if isinstance(self.attributes, Mapping):
            object.__setattr__(self, "attributes", tuple(self.attributes.items()))
        for name in ("algorithms", "roles_claims", "audience"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "attributes", tuple(tuple(p) for p in self.attributes))
        if not isinstance(self.issuer, str) or not self.issuer.startswith(("https://", "http://")):
            raise ValueError(f"oidc.issuer must be an http(s) URL, found {self.issuer!r}")
        if self.jwks_uri is not None and not self.jwks_uri.startswith(("https://", "http://")):
            raise ValueError(f"oidc.jwks_uri must be an http(s) URL, found {self.jwks_uri!r}")
        if not self.audience or not all(isinstance(a, str) and a for a in self.audience):
            raise ValueError("oidc.audience must name at least one audience (the client id the "
                             "tokens are issued for)")
        if not self.algorithms:
            raise ValueError("oidc.algorithms must list at least one algorithm")
        for alg in self.algorithms:
            if alg not in ASYMMETRIC_ALGORITHMS:
                why = ("symmetric (shared-secret) algorithms are refused"
                       if alg.upper().startswith("HS") else
                       "unsigned tokens are refused" if alg.lower() == "none" else
                       "unknown algorithm")
                raise ValueError(f"oidc.algorithms: {alg!r}: {why}; allowed: "
                                 f"{', '.join(ASYMMETRIC_ALGORITHMS)}")
        # finite and in range (a NaN passes every comparison, an infinite timeout never fires)
        object.__setattr__(self, "leeway", check_float(self.leeway, "oidc.leeway", low=0,
                                                       high=300))
        for name in ("jwks_cache_seconds", "jwks_refetch_seconds", "http_timeout"):
            object.__setattr__(self, name, check_float(getattr(self, name), f"oidc.{name}",
                                                       low=0.001, high=86400))
        if not self.subject_claim:
            raise ValueError("oidc.subject_claim must name a claim")
        for attribute_id, claim in self.attributes:
            if not claim or not isinstance(claim, str):
                raise ValueError(f"oidc.attributes: {attribute_id!r} must name a claim path")
        try:  # the same rules as the auth file's attributes (ids, reserved names)
            parse_identity_attributes({a: "x" for a, _ in self.attributes}, "oidc.attributes")
        except AuthFileError as exc:
            raise ValueError(str(exc)) from None


# -- the issuer's keys ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Key:
    kid: str | None
    kty: str
    alg: str | None
    key: Any


def _http_get_json(url: str, timeout: float) -> Any:
    import requests

    response = requests.get(url, timeout=timeout, headers={"Accept": "application/json"},
                            stream=True)
    try:
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code} from {url}")
        body = response.raw.read(MAX_JWKS_BYTES + 1, decode_content=True)
    finally:
        response.close()
    if len(body) > MAX_JWKS_BYTES:
        raise ValueError(f"{url} answered more than {MAX_JWKS_BYTES} bytes")
    return json.loads(body)


class JwksCache:
    """The issuer's signing keys, fetched on first use and kept for `jwks_cache_seconds`."""

    def __init__(self, settings: OidcSettings,
                 get_json: Callable[[str, float], Any] = _http_get_json,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._get_json = get_json
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: tuple[_Key, ...] | None = None
        self._fetched_at = -math.inf  # when the keys were last fetched (or tried)
        self._jwks_uri = settings.jwks_uri
        self._failure: str | None = None  # why the last fetch failed
        self.fetches = 0  # JWKS fetches tried (observable in tests)

    def _uri(self) -> str:
        if self._jwks_uri is None:
            url = self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
            document = self._get_json(url, self.settings.http_timeout)
            if not isinstance(document, dict) or not isinstance(document.get("jwks_uri"), str):
                raise ValueError(f"{url} names no jwks_uri")
            if document.get("issuer") != self.settings.issuer:
                raise ValueError(f"{url} is the configuration of issuer "
                                 f"{document.get('issuer')!r}, not {self.settings.issuer!r}")
            self._jwks_uri = document["jwks_uri"]
        return self._jwks_uri

    def _fetch(self) -> None:
        """Fetch the JWKS (under the lock). Keeps the previous keys when it fails."""
        import jwt

        self._fetched_at = self._clock()
        self.fetches += 1
        try:
            document = self._get_json(self._uri(), self.settings.http_timeout)
            if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
                raise ValueError("the JWKS has no 'keys' list")
        except Exception as exc:  # noqa: BLE001 - any failure: keep what we have
            log.warning("cannot fetch the JWKS of %s: %s", self.settings.issuer, exc)
            self._failure = str(exc)
            if self._keys is None:
                raise KeysUnavailable(f"cannot verify the token now: the keys of issuer "
                                      f"{self.settings.issuer} cannot be fetched ({exc})") from None
            # keep the cached keys, and try again after a refetch period, not a cache period
            self._fetched_at -= self.settings.jwks_cache_seconds - self.settings.jwks_refetch_seconds
            return
        self._failure = None
        keys = []
        for entry in document["keys"][:MAX_JWKS_KEYS]:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            kty = entry.get("kty")
            if kty not in ("RSA", "EC", "OKP"):
                continue
            try:
                key = jwt.PyJWK(entry).key
            except Exception as exc:  # noqa: BLE001 - one bad key must not hide the others
                log.warning("JWKS of %s: skipping key %r: %s", self.settings.issuer,
                            entry.get("kid"), exc)
                continue
            kid = entry.get("kid")
            keys.append(_Key(kid if isinstance(kid, str) else None, kty, entry.get("alg"), key))
        self._keys = tuple(keys)
        log.info("fetched %d signing keys of %s", len(keys), self.settings.issuer)

    @staticmethod
    def _find(keys: tuple[_Key, ...], kid: str | None, alg: str) -> list[_Key]:
        family = KEY_TYPE[alg[:2]]
        return [k for k in keys if (kid is None or k.kid == kid) and k.kty == family
                and (k.alg is None or k.alg == alg)]

    def key_for(self, kid: str | None, alg: str) -> Any:
        """The public key that must have signed a token with this `kid` and `alg`."""
        with self._lock:
            now = self._clock()
            if (self._keys is None and self._failure is not None
                    and now - self._fetched_at < self.settings.jwks_refetch_seconds):
                # the issuer was unreachable a moment ago: do not hammer it on every request
                raise KeysUnavailable(f"cannot verify the token now: the keys of issuer "
                                      f"{self.settings.issuer} cannot be fetched "
                                      f"({self._failure})")
            if self._keys is None or now - self._fetched_at >= self.settings.jwks_cache_seconds:
                self._fetch()
            found = self._find(self._keys or (), kid, alg)
            if not found and kid is not None and any(k.kid == kid for k in self._keys or ()):
                raise InvalidToken(f"key {kid!r} of the issuer is not a {KEY_TYPE[alg[:2]]} key "
                                   f"for {alg}")
            if not found and kid is not None:
                wait = self.settings.jwks_refetch_seconds - (now - self._fetched_at)
                if wait > 0:
                    raise InvalidToken(f"unknown key id {kid!r}: not among the issuer's keys "
                                       f"(fetched again in at most {math.ceil(wait)} s)")
                self._fetch()  # a rotation: the issuer may have published a new key
                found = self._find(self._keys or (), kid, alg)
                if not found:
                    raise InvalidToken(f"unknown key id {kid!r}: not among the issuer's keys")
        if kid is None and len(found) != 1:
            raise InvalidToken(f"the token names no key id (kid) and the issuer has "
                               f"{len(found)} {alg} keys")
        return found[0].key


# -- tokens -> identities -------------------------------------------------------------------------

def looks_like_jwt(token: str) -> bool:
    parts = token.split(".")
    return len(parts) == 3 and bool(parts[0]) and bool(parts[1])


def claim(claims: Mapping[str, Any], path: str) -> Any:
    """The claim at a dotted path (`realm_access.roles`); a claim named with the dots wins."""
    if path in claims:
        return claims[path]
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _when(timestamp: Any) -> str:
    try:
        return datetime.fromtimestamp(float(timestamp), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError, OverflowError, OSError):
        return repr(timestamp)


def _unverified_part(token: str, index: int) -> dict:
    """A JWT segment decoded WITHOUT verification: only to word a refusal or read the header."""
    try:
        segment = token.split(".")[index]
        data = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except (ValueError, IndexError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _attribute_values(value: Any) -> tuple | None:
    """Claim value -> identity attribute values of one type, or None when there are none."""
    items = value if isinstance(value, list) else [value]
    values = [v for v in items if isinstance(v, (str, bool, int))
              or (isinstance(v, float) and math.isfinite(v))]
    if not values:
        return None
    if len({type(v) for v in values}) > 1:
        values = [json.dumps(v) if not isinstance(v, str) else v for v in values]
    return tuple(values[:1024])


class JwtAuthenticator:
    """Verifies JWTs of one issuer and maps their claims to identities (module docstring)."""

    def __init__(self, settings: OidcSettings, keys: JwksCache | None = None,
                 remember_file: str | Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.keys = keys or JwksCache(settings)
        self._clock = clock
        self._lock = threading.Lock()
        # subject -> (identity, exp of the last token seen), most recent last
        self._remembered: OrderedDict[str, tuple[Identity, float]] = OrderedDict()
        self._remember_file = Path(remember_file) if remember_file is not None else None
        self._listeners: list[IdentityListener] = []
        if self._remember_file is not None:
            self._load_remembered()

    def add_listener(self, callback: IdentityListener) -> None:
        """`callback({subject}, "new token claims")` when a verified token changes the identity
        remembered for its subject (module docstring)."""
        self._listeners.append(callback)

    def authenticate(self, token: str) -> Identity:
        """The identity a valid token stands for; raises `InvalidToken` saying why not."""
        import jwt

        s = self.settings
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"malformed token: {exc}") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg.lower() == "none":
            raise InvalidToken("unsigned token (alg none) refused")
        if alg not in s.algorithms:
            why = "symmetric (shared-secret) algorithms are refused; " if alg.startswith("HS") else ""
            raise InvalidToken(f"algorithm {alg} refused: {why}accepted: "
                               f"{', '.join(s.algorithms)}")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise InvalidToken("malformed token: 'kid' is not a string")
        key = self.keys.key_for(kid, alg)
        try:
            claims = jwt.decode(token, key, algorithms=[alg], audience=list(s.audience),
                                issuer=s.issuer, leeway=s.leeway,
                                options={"require": ["exp", "iss", "aud"]})
        except jwt.ExpiredSignatureError:
            exp = _unverified_part(token, 1).get("exp")
            raise InvalidToken(f"token expired at {_when(exp)}") from None
        except jwt.ImmatureSignatureError:
            payload = _unverified_part(token, 1)
            which = "nbf" if payload.get("nbf") is not None else "iat"
            raise InvalidToken(f"token not valid yet: {which} is {_when(payload.get(which))}"
                               ) from None
        except jwt.InvalidAudienceError:
            aud = _unverified_part(token, 1).get("aud")
            raise InvalidToken(f"token audience {aud!r} is not {' or '.join(s.audience)}"
                               ) from None
        except jwt.InvalidIssuerError:
            iss = _unverified_part(token, 1).get("iss")
            raise InvalidToken(f"token issuer {iss!r} is not {s.issuer}") from None
        except jwt.MissingRequiredClaimError as exc:
            raise InvalidToken(f"token has no {exc.claim!r} claim") from None
        except jwt.InvalidSignatureError:
            raise InvalidToken(f"signature does not verify with the issuer's key "
                               f"{kid!r}") from None
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"invalid token: {exc}") from None
        try:  # PyJWT checked it is a number in the future; a float beyond year 9999 overflows
            expires = check_float(claims.get("exp"), "the token's 'exp' claim", low=0,
                                  high=MAX_EXP)
        except NumberError as exc:
            raise InvalidToken(exc.message) from None
        identity = self.identity_from(claims)
        self._remember(identity, expires)
        return identity

    def identity_from(self, claims: Mapping[str, Any]) -> Identity:
        s = self.settings
        subject = claim(claims, s.subject_claim)
        if not isinstance(subject, str) or not subject.strip():
            raise InvalidToken(f"token has no subject: claim {s.subject_claim!r} is missing or "
                               "not a string")
        roles: list[str] = []
        for path in s.roles_claims:
            value = claim(claims, path)
            for role in value if isinstance(value, list) else [value]:
                if isinstance(role, str) and role and role not in roles:
                    roles.append(role)
        attributes = []
        for attribute_id, path in s.attributes:
            values = _attribute_values(claim(claims, path))
            if values is not None:
                attributes.append((attribute_id, values))
        admin = s.admin_role is not None and s.admin_role in roles
        return Identity(subject=subject, roles=tuple(roles), admin=admin,
                        attributes=tuple(attributes))

    # -- identities of JWT callers, for re-decisions ----------------------------------------------

    def identity_for(self, subject: str) -> Identity | None:
        """The last identity verified for `subject` (module docstring), or None."""
        with self._lock:
            entry = self._remembered.get(subject)
        return entry[0] if entry is not None else None

    def expiry_of(self, subject: str) -> float | None:
        """When the last token seen for `subject` expires (epoch seconds), or None."""
        with self._lock:
            entry = self._remembered.get(subject)
        return entry[1] if entry is not None else None

    @property
    def identities(self) -> list[Identity]:
        with self._lock:
            return [identity for identity, _ in self._remembered.values()]

    def _remember(self, identity: Identity, exp: float) -> None:
        with self._lock:
            previous = self._remembered.pop(identity.subject, None)
            self._remembered[identity.subject] = (identity, exp)
            while len(self._remembered) > MAX_REMEMBERED:
                self._remembered.popitem(last=False)
            changed = previous is None or previous[0] != identity
            if changed and self._remember_file is not None:
                self._save_remembered()
        if previous is not None and previous[0] != identity:
            for callback in list(self._listeners):
                try:
                    callback(frozenset({identity.subject}), "new token claims")
                except Exception:  # noqa: BLE001 - the caller is authenticated whatever happens
                    log.exception("identity listener failed for subject %r", identity.subject)

    def _save_remembered(self) -> None:
        """Write the remembered identities (claims only, no token) atomically, mode 0600."""
        path = self._remember_file
        assert path is not None  # called only when identities are remembered
        data = [{"subject": i.subject, "roles": list(i.roles), "admin": i.admin,
                 "attributes": {a: list(v) for a, v in i.attributes}, "exp": exp}
                for i, exp in self._remembered.values()]
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot save the OIDC identities to %s: %s", path, exc)

    def _load_remembered(self) -> None:
        path = self._remember_file
        if path is None or not path.exists():
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            for i, item in enumerate(data):
                attributes = parse_identity_attributes(item.get("attributes", {}),
                                                       f"{path}: entry {i}")
                identity = Identity(subject=str(item["subject"]),
                                    roles=tuple(str(r) for r in item.get("roles", ())),
                                    admin=bool(item.get("admin")), attributes=attributes)
                self._remembered[identity.subject] = (identity, float(item.get("exp") or 0))
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("ignoring the remembered OIDC identities in %s: %s", path, exc)
            self._remembered.clear()


# -- the token file first, then JWTs --------------------------------------------------------------

class CompositeAuthenticator:
    """The auth file's tokens first, then (when an issuer is configured) the issuer's JWTs.

    `authenticate_header` returns the caller's identity, None for no or an unknown opaque
    token, and raises `AuthenticationFailed` for a JWT it refuses (the reason goes to the
    caller). `identities` lists the token file's identities, then the remembered JWT ones."""

    def __init__(self, tokens: TokenFileAuthenticator | TokenAuthenticator | None,
                 jwt: JwtAuthenticator | None = None) -> None:
        self.tokens = tokens
        self.jwt = jwt

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
        re-read (on disk, by the watcher, on SIGHUP) or a JWT with other claims."""
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


__all__ = ["ASYMMETRIC_ALGORITHMS", "AuthenticationFailed", "CompositeAuthenticator",
           "InvalidToken", "JwksCache", "JwtAuthenticator", "KeysUnavailable", "OidcSettings",
           "build_authenticator", "claim", "looks_like_jwt"]
