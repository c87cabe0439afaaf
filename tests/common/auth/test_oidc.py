"""OIDC / JWT bearer tokens: verified against a JWKS served over HTTP, refused with a reason."""
from __future__ import annotations

import json
import time

import jwt
import pytest

from common.auth import Identity
from common.oidc import (
    InvalidToken,
    JwksCache,
    JwtAuthenticator,
    KeysUnavailable,
    OidcSettings,
    claim,
)
from pep.config import GatewayConfig
from pep.http.app import create_app
from pep.services import build_services
from tests.common.auth.conftest import (
    AUDIENCE,
    ec_key,
    hmac_token,
    public_pem,
    rsa_key,
    unsigned_token,
)
from tests.pdp.api.conftest import AUTH_ENTRIES, TOKENS, XML, bearer, simple_policy, xml_request


def settings(issuer, **overrides) -> OidcSettings:
    values = dict(issuer=issuer.url, audience=(AUDIENCE,), jwks_uri=issuer.url + "/jwks",
                  admin_role="xsg-admin", jwks_refetch_seconds=0.2,
                  attributes=(("clearance", "clearance"), ("urn:example:ships", "ext.ships")))
    values.update(overrides)
    return OidcSettings(**values)


# -- the authenticator ----------------------------------------------------------------------------

def test_a_valid_token_becomes_an_identity(issuer):
    auth = JwtAuthenticator(settings(issuer))
    token = issuer.token("alice", roles=["xsg-admin", "analyst"], clearance=2,
                         ext={"ships": [123, 456]})
    identity = auth.authenticate(token)
    assert identity == Identity("alice", ("consumer", "xsg-admin", "analyst"), True,
                                (("clearance", (2,)), ("urn:example:ships", (123, 456))))
    assert auth.identity_for("alice") == identity
    assert auth.expiry_of("alice") == jwt.decode(token, options={"verify_signature": False})["exp"]


def test_claim_paths():
    claims = {"sub": "a", "realm_access": {"roles": ["r"]}, "https://example.com/roles": ["x"]}
    assert claim(claims, "realm_access.roles") == ["r"]
    assert claim(claims, "https://example.com/roles") == ["x"]
    assert claim(claims, "realm_access.missing") is None and claim(claims, "sub.x") is None


def test_es256_and_key_type_must_match_the_algorithm(issuer):
    issuer.keys["e1"] = ec_key()
    issuer.published.append("e1")
    auth = JwtAuthenticator(settings(issuer))
    assert auth.authenticate(issuer.token("bob", kid="e1", alg="ES256")).subject == "bob"
    forged = jwt.encode(issuer.claims("bob"), ec_key(), algorithm="ES256",
                        headers={"kid": "k1"})  # an EC signature naming the RSA key
    with pytest.raises(InvalidToken, match="'k1' of the issuer is not a EC key"):
        auth.authenticate(forged)


def test_the_allow_list_refuses_symmetric_and_unknown_algorithms(issuer):
    for alg in ("HS256", "none", "XYZ"):
        with pytest.raises(ValueError, match=alg):
            settings(issuer, algorithms=("RS256", alg))
    with pytest.raises(ValueError, match="audience"):
        settings(issuer, audience=())
    # an algorithm the key could do but the operator did not list
    auth = JwtAuthenticator(settings(issuer, algorithms=("ES256",)))
    with pytest.raises(InvalidToken, match="algorithm RS256 refused"):
        auth.authenticate(issuer.token())


def test_keys_are_discovered_cached_and_refetched_once_for_an_unknown_kid(issuer):
    auth = JwtAuthenticator(settings(issuer, jwks_uri=None, jwks_refetch_seconds=0.3))
    for _ in range(3):
        auth.authenticate(issuer.token())
    assert issuer.jwks_requests == 1  # fetched once, then cached
    issuer.keys["k2"] = rsa_key()
    issuer.published = ["k2"]  # the issuer rotates: k1 withdrawn, k2 signs
    time.sleep(0.35)
    assert auth.authenticate(issuer.token("carol", kid="k2")).subject == "carol"
    assert issuer.jwks_requests == 2
    # made-up kids right after: refused without hammering the issuer
    for kid in ("k7", "k8", "k9"):
        with pytest.raises(InvalidToken, match=f"unknown key id '{kid}'"):
            auth.authenticate(jwt.encode(issuer.claims(), issuer.keys["k2"], algorithm="RS256",
                                         headers={"kid": kid}))
    assert issuer.jwks_requests == 2


def test_unreachable_keys_are_a_503_not_a_bad_token(issuer):
    cache = JwksCache(settings(issuer, jwks_uri="http://127.0.0.1:9/jwks", http_timeout=1.0,
                               jwks_refetch_seconds=5.0))
    auth = JwtAuthenticator(cache.settings, keys=cache)
    with pytest.raises(KeysUnavailable, match="cannot be fetched"):
        auth.authenticate(issuer.token())
    with pytest.raises(KeysUnavailable):  # not fetched again at once
        auth.authenticate(issuer.token())
    assert cache.fetches == 1


def test_remembered_identities_survive_a_restart(issuer, tmp_path):
    path = tmp_path / "oidc-identities.json"
    auth = JwtAuthenticator(settings(issuer), remember_file=path)
    alice = auth.authenticate(issuer.token("alice", clearance=3))
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    text = path.read_text()
    assert "alice" in text and "eyJ" not in text  # claims only, never a token
    again = JwtAuthenticator(settings(issuer), remember_file=path)
    assert again.identity_for("alice") == alice


def test_processes_sharing_the_remember_file_know_each_others_subjects(issuer, tmp_path):
    """Several gateway processes share one data directory (pep/cluster): each keeps the
    subjects the others remembered, and finds one it never saw a token of (its handle moved
    there) instead of deciding it is no longer known."""
    path = tmp_path / "oidc-identities.json"
    first = JwtAuthenticator(settings(issuer), remember_file=path)
    second = JwtAuthenticator(settings(issuer), remember_file=path)  # both started
    alice = first.authenticate(issuer.token("alice", clearance=3))
    bob = second.authenticate(issuer.token("bob", clearance=1))  # keeps alice in the file
    assert sorted(item["subject"] for item in json.loads(path.read_text())) == ["alice", "bob"]
    assert second.identity_for("alice") == alice  # read from the file: another's subject
    assert first.identity_for("bob") == bob
    assert first.identity_for("carol") is None
    newer = first.authenticate(issuer.token("bob", clearance=2))  # its own view wins here
    assert first.identity_for("bob") == newer != bob


# -- through the gateway --------------------------------------------------------------------------

@pytest.fixture
def gateway(issuer, tmp_path):
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(json.dumps(AUTH_ENTRIES))
    config = GatewayConfig(data_dir=tmp_path / "data", auth_file=auth_file, policies_dir=None,
                           port=0, oidc=settings(issuer))
    services = build_services(config)
    try:
        yield create_app(services=services).test_client(), services
    finally:
        services.close()


def jwt_bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_a_valid_jwt_through_the_gateway(issuer, gateway):
    client, services = gateway
    r = client.post("/policies", data=simple_policy("urn:test:alice", "rain", "alice"),
                    headers={**bearer("nea"), "Content-Type": XML})  # the token file still works
    assert r.status_code == 201, r.get_json()
    token = issuer.token("alice")
    # the subject is the token's, whatever the request says
    r = client.post("/pdp", data=xml_request("mallory", "rain"),
                    headers={**jwt_bearer(token), "Content-Type": XML})
    assert r.status_code == 200 and b"Permit" in r.data
    r = client.get("/handles", headers=jwt_bearer(token))
    assert r.status_code == 200
    # re-decisions find the JWT owner's identity (see common/oidc.py)
    assert services.revocation.identity_lookup("alice").subject == "alice"
    assert services.revocation.identity_lookup("nea").admin is True
    # an admin role from the token
    admin = issuer.token("root", roles=["xsg-admin"])
    assert client.get("/policies", headers=jwt_bearer(admin)).status_code == 200
    assert services.revocation.identity_lookup("root").admin is True
    assert services.revocation.identity_lookup("alice").admin is False


def _now() -> int:
    return int(time.time())


REFUSALS = {
    "expired": (lambda i: i.token(exp=_now() - 3600, iat=_now() - 7200, nbf=None),
                "token expired at"),
    "not yet valid": (lambda i: i.token(nbf=_now() + 3600), "token not valid yet: nbf"),
    "wrong audience": (lambda i: i.token(aud="another-client"),
                       f"token audience 'another-client' is not {AUDIENCE}"),
    "wrong issuer": (lambda i: i.token(iss="https://evil.example"),
                     "token issuer 'https://evil.example' is not"),
    "wrong key": (lambda i: i.token(key=rsa_key()), "signature does not verify"),
    "alg none": (lambda i: unsigned_token(i.claims(), {"alg": "none", "kid": "k1"}),
                 "unsigned token (alg none) refused"),
    "HS256 with the public key": (lambda i: hmac_token(i.claims(), public_pem(i.keys["k1"]),
                                                       "k1"),
                                  "algorithm HS256 refused: symmetric"),
    "unknown kid": (lambda i: jwt.encode(i.claims(), rsa_key(), algorithm="RS256",
                                         headers={"kid": "nope"}), "unknown key id 'nope'"),
    "no exp": (lambda i: i.token(exp=None), "token has no 'exp' claim"),
    "malformed": (lambda i: "eyJhbGciOi.eyJzdWIi.x", "malformed token"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refused_tokens_get_a_401_saying_why(issuer, gateway, case):
    client, _ = gateway
    make, reason = REFUSALS[case]
    r = client.get("/handles", headers=jwt_bearer(make(issuer)))
    assert r.status_code == 401, r.get_json()
    body = r.get_json()
    assert body["status"] == 401 and reason in body["error"], body
    challenge = r.headers["WWW-Authenticate"]
    assert challenge.startswith('Bearer realm="xsg", error="invalid_token", error_description="')
    assert reason in challenge


def test_key_rotation_through_the_gateway(issuer, gateway):
    client, _ = gateway
    assert client.get("/handles", headers=jwt_bearer(issuer.token())).status_code == 200
    issuer.keys["k2"] = ec_key()
    issuer.published.append("k2")
    time.sleep(0.25)  # past the refetch period
    r = client.get("/handles", headers=jwt_bearer(issuer.token("dave", kid="k2", alg="ES256")))
    assert r.status_code == 200, r.get_json()


def test_opaque_tokens_and_missing_headers_keep_their_answers(gateway):
    client, _ = gateway
    r = client.get("/handles", headers={"Authorization": "Bearer not-a-known-token"})
    assert r.status_code == 401 and r.get_json()["error"] == "invalid bearer token"
    r = client.get("/handles")
    assert r.status_code == 401 and r.get_json()["error"] == "missing bearer token"
    assert client.get("/handles", headers=bearer("lta")).status_code == 200
    assert TOKENS["lta"]
