"""JWTs into identities: a token verified (algorithm, key, signature, claims) and its claims
mapped to an `Identity`; the last identity of each subject remembered for re-decisions."""
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common.auth import (
    AttributeValue,
    Identity,
    IdentityListener,
    parse_identity_attributes,
    with_inherited_roles,
)
from common.numbers import END_EPOCH_SECONDS, NumberError, check_float
from common.oidc.errors import InvalidToken
from common.oidc.jwks import JwksCache
from common.oidc.settings import OidcSettings
from common.roles import NO_HIERARCHY, RoleHierarchy, RoleHierarchyError

log = logging.getLogger(__name__)

MAX_EXP = END_EPOCH_SECONDS - 1  # 9999-12-31T23:59:59Z in Unix seconds
MAX_REMEMBERED = 10_000


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
        return datetime.fromtimestamp(float(timestamp), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError, OverflowError, OSError):
        return repr(timestamp)


def _unverified_part(token: str, index: int) -> dict[str, Any]:
    """A JWT segment decoded WITHOUT verification: only to word a refusal or read the header."""
    try:
        segment = token.split(".")[index]
        data = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except (ValueError, IndexError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _attribute_values(value: Any) -> tuple[AttributeValue, ...] | None:
    """Claim value -> identity attribute values of one type, or None when there are none."""
    items = value if isinstance(value, list) else [value]
    values = [v for v in items if isinstance(v, (str, bool, int))
              or (isinstance(v, float) and math.isfinite(v))]
    if not values:
        return None
    if len({type(v) for v in values}) > 1:
        values = [json.dumps(v) if not isinstance(v, str) else v for v in values]
    return tuple(values[:1024])


@dataclass(frozen=True)
class _Seen:
    """What the last verified token of a subject said: its identity with the roles the token
    gives (not widened), the token's own role hierarchy, and when the token expires. The
    identity a decision sees is widened with that hierarchy and the auth file's, as it is
    then (`JwtAuthenticator.identity_for`)."""

    identity: Identity
    hierarchy: RoleHierarchy
    exp: float


class JwtAuthenticator:
    """Verifies JWTs of one issuer and maps their claims to identities (module docstring)."""

    def __init__(self, settings: OidcSettings, keys: JwksCache | None = None,
                 remember_file: str | Path | None = None,
                 clock: Callable[[], float] = time.time,
                 hierarchy: Callable[[], RoleHierarchy] | None = None) -> None:
        self.settings = settings
        self.keys = keys or JwksCache(settings)
        self._clock = clock
        self._lock = threading.Lock()
        # the auth file's role hierarchy of the moment (`CompositeAuthenticator` gives it)
        self._file_hierarchy: Callable[[], RoleHierarchy] = hierarchy or (lambda: NO_HIERARCHY)
        # subject -> what its last token said, most recent last
        self._remembered: OrderedDict[str, _Seen] = OrderedDict()
        self._remember_file = Path(remember_file) if remember_file is not None else None
        self._read_stamp: int | None = None  # the file's mtime when it was last read
        self._listeners: list[IdentityListener] = []
        if self._remember_file is not None:
            self._load_remembered()

    def add_listener(self, callback: IdentityListener) -> None:
        """`callback({subject}, "new token claims")` when a verified token changes the identity
        remembered for its subject (module docstring)."""
        self._listeners.append(callback)

    def follow_hierarchy(self, hierarchy: Callable[[], RoleHierarchy]) -> None:
        """Widen every JWT identity with `hierarchy()` too (the auth file's, read per use)."""
        self._file_hierarchy = hierarchy

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
            why = (
                "symmetric (shared-secret) algorithms are refused; " if alg.startswith("HS") else ""
            )
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
        own, hierarchy = self._claimed(claims)
        seen = _Seen(own, hierarchy, expires)
        identity = self._effective(seen)
        self._remember(seen)
        return identity

    def identity_from(self, claims: Mapping[str, Any]) -> Identity:
        """The identity these (verified) claims stand for, its roles widened with the token's
        role hierarchy and the auth file's."""
        own, hierarchy = self._claimed(claims)
        return self._effective(_Seen(own, hierarchy, 0.0))

    def _effective(self, seen: _Seen) -> Identity:
        hierarchy = seen.hierarchy.union(self._file_hierarchy())
        return with_inherited_roles(seen.identity, hierarchy) if hierarchy else seen.identity

    def _claimed(self, claims: Mapping[str, Any]) -> tuple[Identity, RoleHierarchy]:
        """The identity with the token's own roles, and the token's role hierarchy (checked,
        alone and with the auth file's: a cycle refuses the token)."""
        identity = self._claimed_identity(claims)
        path = self.settings.role_hierarchy_claim
        value = claim(claims, path) if path is not None else None
        if value is None:
            return identity, NO_HIERARCHY
        try:
            hierarchy = RoleHierarchy.parse(value, f"token claim {path!r}")
            hierarchy.union(self._file_hierarchy()).check_acyclic(
                f"token claim {path!r} with the auth file's role_hierarchy")
        except RoleHierarchyError as exc:
            raise InvalidToken(str(exc)) from None
        return identity, hierarchy

    def _claimed_identity(self, claims: Mapping[str, Any]) -> Identity:
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
        """The last identity verified for `subject` (module docstring), its roles widened with
        its token's hierarchy and the auth file's as they are now; or None. A subject not known
        here is looked for in the remember file too, when it changed since it was read: other
        gateway processes sharing the data directory (`pep.cluster`) remember there the
        subjects whose tokens they verified, and this one may serve those subjects' handles."""
        with self._lock:
            seen = self._remembered.get(subject)
        if seen is None and self._remember_file is not None and self._file_changed():
            self._load_remembered(only_new=True)
            with self._lock:
                seen = self._remembered.get(subject)
        return self._effective(seen) if seen is not None else None

    def _file_changed(self) -> bool:
        try:
            stamp = self._remember_file.stat().st_mtime_ns if self._remember_file else None
        except OSError:
            return False
        return stamp != getattr(self, "_read_stamp", None)

    def expiry_of(self, subject: str) -> float | None:
        """When the last token seen for `subject` expires (epoch seconds), or None."""
        with self._lock:
            seen = self._remembered.get(subject)
        return seen.exp if seen is not None else None

    @property
    def identities(self) -> list[Identity]:
        with self._lock:
            remembered = list(self._remembered.values())
        return [self._effective(seen) for seen in remembered]

    def subjects_changed_by(self, previous: RoleHierarchy, current: RoleHierarchy
                            ) -> frozenset[str]:
        """The remembered subjects whose roles the auth file's hierarchy widens differently
        now (`current`) than before (`previous`)."""
        with self._lock:
            remembered = list(self._remembered.values())
        return frozenset(
            seen.identity.subject for seen in remembered
            if seen.hierarchy.union(previous).expand(seen.identity.roles)
            != seen.hierarchy.union(current).expand(seen.identity.roles))

    def _remember(self, seen: _Seen) -> None:
        subject = seen.identity.subject
        with self._lock:
            previous = self._remembered.pop(subject, None)
            self._remembered[subject] = seen
            while len(self._remembered) > MAX_REMEMBERED:
                self._remembered.popitem(last=False)
            changed = previous is None or (previous.identity, previous.hierarchy) != (
                seen.identity, seen.hierarchy)
            if changed and self._remember_file is not None:
                self._save_remembered()
        if previous is not None and self._effective(previous) != self._effective(seen):
            for callback in list(self._listeners):
                try:
                    callback(frozenset({subject}), "new token claims")
                except Exception:  # the caller is authenticated whatever happens
                    log.exception("identity listener failed for subject %r", subject)

    def _save_remembered(self) -> None:
        """Write the remembered identities (claims only, no token) atomically, mode 0600.
        Several processes may share the file (`identity_for`): under the file's lock, the
        subjects another process wrote and this one does not know are kept."""
        import fcntl

        path = self._remember_file
        assert path is not None  # called only when identities are remembered
        data = {seen.identity.subject: {
            "subject": seen.identity.subject, "roles": list(seen.identity.roles),
            "admin": seen.identity.admin,
            "attributes": {a: list(v) for a, v in seen.identity.attributes},
            "exp": seen.exp,
            **({"role_hierarchy": seen.hierarchy.as_json()} if seen.hierarchy else {})}
            for seen in self._remembered.values()}
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock_fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                try:
                    others = json.loads(path.read_text(encoding="utf-8")) if path.exists() \
                        else []
                except (OSError, ValueError):
                    others = []
                kept = [item for item in others if isinstance(item, dict)
                        and item.get("subject") not in data][-MAX_REMEMBERED:]
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump((kept + list(data.values()))[-MAX_REMEMBERED:], f)
                os.replace(tmp, path)
            finally:
                os.close(lock_fd)  # (closing lets the lock go)
        except OSError as exc:
            log.warning("cannot save the OIDC identities to %s: %s", path, exc)

    def _load_remembered(self, only_new: bool = False) -> None:
        """Read the remember file (at start), or (`only_new`: another process wrote it) take
        the subjects it holds that this process does not know."""
        path = self._remember_file
        if path is None or not path.exists():
            return
        try:
            self._read_stamp = path.stat().st_mtime_ns
            found = self._read_remembered(path)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("ignoring the remembered OIDC identities in %s: %s", path, exc)
            return
        with self._lock:
            for seen in found:
                subject = seen.identity.subject
                if not only_new:
                    self._remembered[subject] = seen
                elif subject not in self._remembered:
                    self._remembered[subject] = seen
                    self._remembered.move_to_end(subject, last=False)  # not the most recent

    @staticmethod
    def _read_remembered(path: Path) -> list[_Seen]:
        found = []
        for i, item in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            attributes = parse_identity_attributes(item.get("attributes", {}),
                                                   f"{path}: entry {i}")
            identity = Identity(subject=str(item["subject"]),
                                roles=tuple(str(r) for r in item.get("roles", ())),
                                admin=bool(item.get("admin")), attributes=attributes)
            hierarchy = RoleHierarchy.parse(item.get("role_hierarchy", {}),
                                            f"{path}: entry {i}: role_hierarchy")
            found.append(_Seen(identity, hierarchy, float(item.get("exp") or 0)))
        return found

