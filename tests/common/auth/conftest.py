"""An OIDC issuer in the test: key pairs, a JWKS served over HTTP from a thread, tokens."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

AUDIENCE = "xsg-gateway"


def rsa_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def ec_key():
    return ec.generate_private_key(ec.SECP256R1())


def public_jwk(private_key, kid: str, alg: str | None = None) -> dict:
    if isinstance(private_key, rsa.RSAPrivateKey):
        jwk = jwt.algorithms.RSAAlgorithm.to_jwk(private_key.public_key(), as_dict=True)
    else:
        jwk = jwt.algorithms.ECAlgorithm.to_jwk(private_key.public_key(), as_dict=True)
    jwk.update({"kid": kid, "use": "sig"})
    if alg:
        jwk["alg"] = alg
    return jwk


def public_pem(private_key) -> bytes:
    return private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned_token(claims: dict, header: dict) -> str:
    """A JWT assembled by hand (alg none, or a forged HMAC): PyJWT refuses to make these."""
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}."


def hmac_token(claims: dict, secret: bytes, kid: str) -> str:
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(signature)}"


class Issuer:
    """The issuer's HTTP side (JWKS and discovery document) and a token factory."""

    def __init__(self) -> None:
        self.keys = {"k1": rsa_key()}
        self.published = ["k1"]  # kids in the served JWKS
        self.jwks_requests = 0
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # http.server's name
                if self.path == "/jwks":
                    issuer.jwks_requests += 1
                    body = json.dumps({"keys": [public_jwk(issuer.keys[k], k)
                                                for k in issuer.published]}).encode()
                elif self.path == "/.well-known/openid-configuration":
                    body = json.dumps({"issuer": issuer.url,
                                       "jwks_uri": issuer.url + "/jwks"}).encode()
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def claims(self, subject: str = "alice", **extra) -> dict:
        now = int(time.time())
        claims = {"iss": self.url, "aud": AUDIENCE, "sub": subject, "iat": now,
                  "nbf": now, "exp": now + 300, "realm_access": {"roles": ["consumer"]}}
        claims.update(extra)
        return {k: v for k, v in claims.items() if v is not None}

    def token(self, subject: str = "alice", kid: str = "k1", alg: str = "RS256",
              key=None, **claims) -> str:
        return jwt.encode(self.claims(subject, **claims), key or self.keys[kid], algorithm=alg,
                          headers={"kid": kid})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def issuer():
    it = Issuer()
    yield it
    it.close()
