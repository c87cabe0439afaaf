"""The issuer whose JWTs the gateway accepts (`OidcSettings`), checked when it is configured:
URLs, audiences, the allow-list of asymmetric algorithms, time limits and claim paths."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from common.auth import AuthFileError, parse_identity_attributes
from common.numbers import check_float

# Asymmetric signature algorithms PyJWT verifies with a public key; nothing else may be listed.
ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                         "ES256", "ES384", "ES512", "EdDSA")
DEFAULT_ALGORITHMS = ("RS256", "PS256", "ES256")


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
    # a claim (dotted path) holding a role hierarchy, {"role": ["role it inherits", ...]}; the
    # token's roles are widened with it and with the auth file's (`common.roles`). None: not read
    role_hierarchy_claim: str | None = None
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
        if self.role_hierarchy_claim is not None and (
                not isinstance(self.role_hierarchy_claim, str) or not self.role_hierarchy_claim):
            raise ValueError("oidc.role_hierarchy_claim must name a claim (or be unset)")
        for attribute_id, claim in self.attributes:
            if not claim or not isinstance(claim, str):
                raise ValueError(f"oidc.attributes: {attribute_id!r} must name a claim path")
        try:  # the same rules as the auth file's attributes (ids, reserved names)
            parse_identity_attributes({a: "x" for a, _ in self.attributes}, "oidc.attributes")
        except AuthFileError as exc:
            raise ValueError(str(exc)) from None
