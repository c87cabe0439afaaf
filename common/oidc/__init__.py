"""OIDC / JWT bearer tokens, beside the token file.

This package keeps the public names; its modules: `settings` (the issuer, checked), `errors`
(the refusals), `jwks` (the issuer's keys), `tokens` (a JWT verified and its claims made an
identity, remembered for re-decisions) and `composite` (the token file, then JWTs).

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

from common.oidc.composite import CompositeAuthenticator, build_authenticator
from common.oidc.errors import AuthenticationFailed, InvalidToken, KeysUnavailable
from common.oidc.jwks import JwksCache
from common.oidc.settings import ASYMMETRIC_ALGORITHMS, DEFAULT_ALGORITHMS, OidcSettings
from common.oidc.tokens import JwtAuthenticator, claim, looks_like_jwt

__all__ = ["ASYMMETRIC_ALGORITHMS", "DEFAULT_ALGORITHMS", "AuthenticationFailed",
           "CompositeAuthenticator", "InvalidToken", "JwksCache", "JwtAuthenticator",
           "KeysUnavailable", "OidcSettings", "build_authenticator", "claim", "looks_like_jwt"]
