"""Bearer-token authentication and the identity a request is decided as.

The gateway never trusts who a XACML request says its subject is: the subject is whoever
authenticated. Tokens come from an auth file: a JSON list of
`{"token", "subject", "roles": [...], "admin": bool, "attributes": {id: value or [values]}}`,
or an object `{"tokens": [that list], "role_hierarchy": {"role": ["role it inherits", ...]}}`
whose hierarchy (`common.roles`) widens every identity's roles with the roles they inherit (a
cycle is refused when the file is read). Tokens are compared in constant time
(every entry is compared, on SHA-256 digests, so neither the position of the match nor the
token's length shows in the timing).

`TokenFileAuthenticator` is the file as a running gateway uses it: re-read when it changes on
disk (looked at, at most once a second, on use, and every `WATCH_INTERVAL` seconds by a watcher
thread once `watch()` is called, so that a change is noticed without any request) and on
`reload()` (`xsg serve` calls it on SIGHUP); a new file that does not load is logged and the
previous tokens stay in force. After every re-read that is used, its listeners hear which
subjects' identities changed (`changed_subjects`: added, removed, or with other roles, admin
flag or attributes; roles as the hierarchy widens them, so a changed hierarchy changes exactly
the subjects whose roles it widens differently), and its hierarchy listeners hear of a changed
hierarchy (the JWT side re-decides its own subjects with it), so that the gateway can re-decide
those subjects' live handles at once (`pep.handles.revocation`). OIDC / JWT bearer tokens are
`common.oidc`'s.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from common.roles import NO_HIERARCHY, RoleHierarchy, RoleHierarchyError

log = logging.getLogger(__name__)


class AuthFileError(ValueError):
    """The auth file is missing, malformed, or inconsistent; raised at start-up."""


AttributeValue = str | int | float | bool
MAX_IDENTITY_ATTRIBUTES = 64
MAX_ATTRIBUTE_VALUES = 1024
WATCH_INTERVAL = 0.25  # seconds between two looks at the auth file by its watcher thread

# `listener(subjects, source)`: these subjects' identities changed (`source` says how, for logs
# and the audit trail: "auth file", "new token claims").
IdentityListener = Callable[[frozenset[str], str], None]
# what tells one version of the auth file from another: (mtime_ns, size, inode)
FileSignature = tuple[int, int, int]
# `listener(previous, current)`: the auth file's role hierarchy changed.
HierarchyListener = Callable[[RoleHierarchy, RoleHierarchy], None]


@dataclass(frozen=True)
class Identity:
    """Who authenticated: the only source of the XACML access-subject (see `pdp.request.
    bind_subject`) and of the values a policy's `{subject:...}` placeholders stand for.

    `attributes` are the caller's other attributes as the gateway knows them (from the auth file,
    later from token claims): `(attribute id, values)` pairs; a value's Python type gives its
    XACML data type (str string, bool boolean, int integer, float double)."""

    subject: str
    roles: tuple[str, ...] = ()
    admin: bool = False
    attributes: tuple[tuple[str, tuple[AttributeValue, ...]], ...] = ()

    def attribute(self, attribute_id: str) -> tuple[AttributeValue, ...] | None:
        for name, values in self.attributes:
            if name == attribute_id:
                return values
        return None


def parse_identity_attributes(
    data: Any, at: str
) -> tuple[tuple[str, tuple[AttributeValue, ...]], ...]:
    """`{"clearance": 1, "ship-list": [123, 456]}` -> identity attributes; errors name the key."""
    if not isinstance(data, dict):
        raise AuthFileError(f"{at}: 'attributes' must be an object of attribute id -> value(s)")
    if len(data) > MAX_IDENTITY_ATTRIBUTES:
        raise AuthFileError(f"{at}: at most {MAX_IDENTITY_ATTRIBUTES} attributes")
    out = []
    for name, raw in data.items():
        if not isinstance(name, str) or not name.strip() or len(name) > 512:
            raise AuthFileError(f"{at}: attribute ids must be non-empty strings")
        values = raw if isinstance(raw, list) else [raw]
        if len(values) > MAX_ATTRIBUTE_VALUES:
            raise AuthFileError(f"{at}: attribute {name!r} has more than "
                                f"{MAX_ATTRIBUTE_VALUES} values")
        for v in values:
            if not isinstance(v, (str, int, float, bool)) or (isinstance(v, float)
                                                              and not math.isfinite(v)):
                raise AuthFileError(f"{at}: attribute {name!r}: values must be strings, "
                                    "numbers or booleans")
        if len({type(v) for v in values}) > 1:
            raise AuthFileError(f"{at}: attribute {name!r}: all values must have one type")
        if name in ("subject-id", "role") or name.endswith((":subject-id", ":role")):
            raise AuthFileError(f"{at}: attribute {name!r} is bound from 'subject' and 'roles'")
        out.append((name, tuple(values)))
    return tuple(out)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


class TokenAuthenticator:
    """Maps bearer tokens to identities; an identity's roles are widened with `hierarchy`."""

    def __init__(self, entries: Iterable[tuple[str, Identity]],
                 hierarchy: RoleHierarchy = NO_HIERARCHY) -> None:
        self.hierarchy = hierarchy
        # Keyed by the SHA-256 of the token: a lookup reveals nothing usable through timing (an
        # attacker controls the token, not its digest) and costs the same with 3 tokens or 3,000.
        self._by_digest: dict[bytes, Identity] = {}
        self._by_subject: dict[str, Identity] = {}  # a subject's first entry (re-decisions)
        for token, identity in entries:
            if not token:
                raise AuthFileError(f"empty token for subject {identity.subject!r}")
            if hierarchy:
                identity = with_inherited_roles(identity, hierarchy)
            d = _digest(token)
            if d in self._by_digest:
                raise AuthFileError(f"token for subject {identity.subject!r} is used twice")
            self._by_digest[d] = identity
            self._by_subject.setdefault(identity.subject, identity)
        # Every identity a subject has here (several tokens may name one subject).
        self._all_by_subject: dict[str, frozenset[Identity]] = {}
        for identity in self._by_digest.values():
            self._all_by_subject[identity.subject] = (
                self._all_by_subject.get(identity.subject, frozenset()) | {identity})

    @classmethod
    def from_file(cls, path: str | Path) -> TokenAuthenticator:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise AuthFileError(f"cannot read auth file {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise AuthFileError(f"auth file {path} is not UTF-8: {exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AuthFileError(f"auth file {path} is not valid JSON: {exc.msg} "
                                f"(line {exc.lineno}, column {exc.colno})") from None
        try:
            return cls(*parse_auth_file(data, str(path)))
        except AuthFileError as exc:
            if str(path) in str(exc):
                raise
            raise AuthFileError(f"{path}: {exc}") from None

    def authenticate(self, token: str | None) -> Identity | None:
        if not token:
            return None
        return self._by_digest.get(_digest(token))

    def authenticate_header(self, authorization: str | None) -> Identity | None:
        """Accepts `Authorization: Bearer <token>` (scheme case-insensitive)."""
        return self.authenticate(bearer_token(authorization))

    @property
    def identities(self) -> list[Identity]:
        return list(self._by_digest.values())

    def identity_for(self, subject: str) -> Identity | None:
        """The identity of `subject` (its first entry), or None."""
        return self._by_subject.get(subject)

    def identities_of(self, subject: str) -> frozenset[Identity]:
        """Every identity the file gives `subject` (one per token naming it)."""
        return self._all_by_subject.get(subject, frozenset())

    @property
    def subjects(self) -> frozenset[str]:
        return frozenset(self._all_by_subject)


def with_inherited_roles(identity: Identity, hierarchy: RoleHierarchy) -> Identity:
    """The identity whose roles are its own and every role they inherit (`common.roles`)."""
    roles = hierarchy.expand(identity.roles)
    if roles == identity.roles:
        return identity
    return Identity(identity.subject, roles, identity.admin, identity.attributes)


def changed_subjects(old: TokenAuthenticator, new: TokenAuthenticator) -> frozenset[str]:
    """The subjects whose identities differ between two versions of the token file: added,
    removed, or with other roles, admin flag or attributes under any of their tokens. A
    subject that only got another token (same identity) has not changed."""
    return frozenset(subject for subject in old.subjects | new.subjects
                     if old.identities_of(subject) != new.identities_of(subject))


class Authenticator(Protocol):
    """What the HTTP edge and the revocation service use of an authenticator."""

    def authenticate_header(self, authorization: str | None) -> Identity | None: ...

    @property
    def identities(self) -> list[Identity]: ...


class TokenFileAuthenticator:
    """The auth file, followed while the gateway runs.

    Loaded at construction (an unusable file raises `AuthFileError`: the gateway does not start).
    Afterwards it is re-read when its size, modification time or inode change (looked at on use,
    at most every `check_interval` seconds, and by the watcher thread of `watch()`) and whenever
    `reload()` is called. A new version that does not load is logged once and ignored: the tokens
    in force stay until a good version appears. A version that is used is announced to the
    listeners (`add_listener`) with the subjects whose identities changed, after the new tokens
    are in force and outside this object's lock."""

    def __init__(self, path: str | Path, check_interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.check_interval = check_interval
        self._clock = clock
        self._lock = threading.Lock()
        signature = self._stat()
        self._current = TokenAuthenticator.from_file(self.path)
        self._signature = signature
        self._rejected: FileSignature | None = None  # a broken version's signature, logged once
        self._checked = clock()
        self.reloads = 0  # successful re-reads (observable in tests)
        self._listeners: list[IdentityListener] = []
        self._hierarchy_listeners: list[HierarchyListener] = []
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def add_listener(self, callback: IdentityListener) -> None:
        """`callback(subjects, "auth file")` after every re-read that changed some identity."""
        self._listeners.append(callback)

    def add_hierarchy_listener(self, callback: HierarchyListener) -> None:
        """`callback(previous, current)` after every re-read that changed the role hierarchy
        (after the identity listeners)."""
        self._hierarchy_listeners.append(callback)

    @property
    def hierarchy(self) -> RoleHierarchy:
        """The role hierarchy of the file in force."""
        return self._current.hierarchy

    def _stat(self) -> FileSignature | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def reload(self) -> bool:
        """Re-read the file now (SIGHUP); True when the new tokens are in force."""
        with self._lock:
            previous = self._current
            changed = self._load(self._stat(), force=True)
        self._announce(changed, previous)
        return changed is not None

    def _load(self, signature: FileSignature | None, force: bool = False) -> frozenset[str] | None:
        """Read the file; the subjects whose identities changed when the new version is in
        force, None when it was not used."""
        if not force and signature == self._rejected:
            return None
        try:
            fresh = TokenAuthenticator.from_file(self.path)
        except AuthFileError as exc:
            self._rejected = signature
            log.error("auth file %s changed but cannot be used; the previous tokens stay in "
                      "force: %s", self.path, exc)
            return None
        previous, self._current = self._current, fresh
        self._signature = signature
        self._rejected = None
        self.reloads += 1
        changed = changed_subjects(previous, fresh)
        log.info("auth file %s reloaded: %d tokens, %d subject(s) changed", self.path,
                 len(fresh.identities), len(changed))
        return changed

    def _announce(self, changed: frozenset[str] | None, previous: TokenAuthenticator) -> None:
        if changed is None:
            return
        for callback in list(self._listeners) if changed else ():
            try:
                callback(changed, "auth file")
            except Exception:  # the new tokens are in force whatever a listener does
                log.exception("identity listener failed after reloading %s", self.path)
        current = self._current
        if current.hierarchy == previous.hierarchy:
            return
        for hierarchy_callback in list(self._hierarchy_listeners):
            try:
                hierarchy_callback(previous.hierarchy, current.hierarchy)
            except Exception:  # as above
                log.exception("role hierarchy listener failed after reloading %s", self.path)

    def _maybe_reload(self, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._checked < self.check_interval:
            return
        if not self._lock.acquire(blocking=False):
            return  # another thread is looking; use the tokens in force meanwhile
        changed = None
        previous = self._current
        try:
            self._checked = now
            signature = self._stat()
            if signature is not None and signature != self._signature:
                changed = self._load(signature)
        finally:
            self._lock.release()
        self._announce(changed, previous)

    def poll(self) -> None:
        """Look at the file now (the watcher's step): re-read it if it changed on disk."""
        self._maybe_reload(force=True)

    def watch(self, interval: float = WATCH_INTERVAL) -> None:
        """Look at the file every `interval` seconds from a daemon thread until `stop()`, so a
        change is noticed (and its listeners told) without waiting for a request. Idempotent."""
        if self._watcher is not None or interval <= 0:
            return
        self._watch_stop.clear()

        def run() -> None:
            while not self._watch_stop.wait(interval):
                try:
                    self.poll()
                except Exception:  # the watcher must survive one bad look
                    log.exception("looking at auth file %s failed", self.path)

        self._watcher = threading.Thread(target=run, name="xsg-auth-watch", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        """Stop the watcher thread (idempotent)."""
        self._watch_stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
            self._watcher = None

    def authenticate(self, token: str | None) -> Identity | None:
        self._maybe_reload()
        return self._current.authenticate(token)

    def authenticate_header(self, authorization: str | None) -> Identity | None:
        self._maybe_reload()
        return self._current.authenticate_header(authorization)

    @property
    def identities(self) -> list[Identity]:
        self._maybe_reload()
        return self._current.identities

    def identity_for(self, subject: str) -> Identity | None:
        self._maybe_reload()
        return self._current.identity_for(subject)

    def identities_of(self, subject: str) -> frozenset[Identity]:
        return self._current.identities_of(subject)


def parse_auth_file(data: Any, where: str = "auth file"
                    ) -> tuple[list[tuple[str, Identity]], RoleHierarchy]:
    """The auth file's JSON, in either form: a list of entries, or an object with `tokens`
    (that list) and `role_hierarchy` (role -> roles it inherits; a cycle is an error). The
    entries' identities carry the roles they were given; `TokenAuthenticator` widens them."""
    if not isinstance(data, dict):
        return parse_auth_entries(data, where), NO_HIERARCHY
    if "tokens" not in data:
        raise AuthFileError(f"{where}: expected a JSON list of entries, or an object with "
                            "'tokens' (that list) and 'role_hierarchy'; found an object without "
                            "'tokens'")
    unknown = set(data) - {"tokens", "role_hierarchy"}
    if unknown:
        raise AuthFileError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
                            "the object form has 'tokens' and 'role_hierarchy'")
    try:
        hierarchy = RoleHierarchy.parse(data.get("role_hierarchy", {}),
                                        f"{where}: role_hierarchy")
    except RoleHierarchyError as exc:
        raise AuthFileError(str(exc)) from None
    return parse_auth_entries(data["tokens"], f"{where}: tokens"), hierarchy


def parse_auth_entries(data: Any, where: str = "auth file") -> list[tuple[str, Identity]]:
    """Validate the auth file's JSON; every error names the entry and the field."""
    if not isinstance(data, list):
        raise AuthFileError(
            f"{where}: expected a JSON list of entries, found {type(data).__name__}"
        )
    entries = []
    for i, item in enumerate(data):
        at = f"{where}: entry {i}"
        if not isinstance(item, dict):
            raise AuthFileError(f"{at}: expected an object, found {type(item).__name__}")
        unknown = set(item) - {"token", "subject", "roles", "admin", "attributes"}
        if unknown:
            raise AuthFileError(f"{at}: unknown field(s) {', '.join(sorted(unknown))}")
        token, subject = item.get("token"), item.get("subject")
        roles, admin = item.get("roles", []), item.get("admin", False)
        if not isinstance(token, str) or not token.strip():
            raise AuthFileError(f"{at}: 'token' must be a non-empty string")
        if token != token.strip() or any(c.isspace() for c in token):
            raise AuthFileError(f"{at}: 'token' must not contain whitespace")
        if not isinstance(subject, str) or not subject.strip():
            raise AuthFileError(f"{at}: 'subject' must be a non-empty string")
        if not isinstance(roles, list) or not all(isinstance(r, str) and r for r in roles):
            raise AuthFileError(f"{at}: 'roles' must be a list of non-empty strings")
        if not isinstance(admin, bool):
            raise AuthFileError(f"{at}: 'admin' must be true or false")
        attributes = parse_identity_attributes(item.get("attributes", {}), at)
        entries.append((token, Identity(subject=subject, roles=tuple(roles), admin=admin,
                                        attributes=attributes)))
    if not entries:
        raise AuthFileError(f"{where}: no entries; nobody could use the gateway")
    return entries


def write_auth_file(path: str | Path, entries: list[dict[str, Any]] | dict[str, Any]) -> None:
    """Write an auth file readable by its owner only (it holds secrets): a list of entries, or
    the object form with `tokens` and `role_hierarchy`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(entries, f, indent=2)
        f.write("\n")


def new_token() -> str:
    """192 random bits, URL-safe. Never one that begins with '-': `xsg stream --token <token>`
    (argparse) took such a token for an option, one token in 64 (a walkthrough's step failed
    so); drawing again costs no bit of the 192."""
    while True:
        token = secrets.token_urlsafe(24)
        if not token.startswith("-"):
            return token
