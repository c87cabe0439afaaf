"""The issuer's signing keys (its JWKS): discovered, fetched with a size limit, cached, fetched
again for an unknown key id at most once a period, and kept when a refresh fails."""
from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.oidc.errors import InvalidToken, KeysUnavailable
from common.oidc.settings import OidcSettings

log = logging.getLogger(__name__)

KEY_TYPE = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}
MAX_JWKS_BYTES = 512 * 1024
MAX_JWKS_KEYS = 100


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
            self._fetched_at -= (
                self.settings.jwks_cache_seconds - self.settings.jwks_refetch_seconds
            )
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

