"""A request target reaches the gateway exactly as the client sent it (issue 41, item 5).

The proxy used to rebuild the upstream URL: `urljoin` resolved `..` and `.` segments, requests
decoded escapes of unreserved characters (`%2e%2e` became `..`, `%62` became `b`), urllib3
upper-cased escapes, httpx removed dot segments on the handle relay. Each rewrite lets a path
mean one thing to the proxy (which routes, caches and invalidates on it) and another to the
gateway. Attacked from the client's side with raw sockets (no client library normalises the
target first), checked on what the gateway's server received.
"""
from __future__ import annotations

import socket

import pytest

from tests.proxy.test_canonical import XML

TARGETS = [
    "/%2562ars-x",                      # the case: decoded once, by the gateway only
    "/%62ars-x",                        # an escaped unreserved character stays escaped
    "/%2e%2e/%2E%2E/policies",          # escaped dot segments, either case
    "/a/%2e%2e/handles/x",
    "/a/../handles/x",                  # a literal dot segment is not resolved by the proxy
    "/a/./b",
    "/a//b",
    "/streams/a%2Fb/records",           # an escaped slash
    "/handles/x%2F..%2F..%2Fpolicies",
    "/%7euser",                         # lower-case hex stays lower-case
    "/streams/%E2%82%AC",
    "/x?q=%2562&r=%62&s=a+b&t=%2e%2e",  # the query too
]
RELAYED = [                             # GET /handles/<id>: the proxy's native relay
    "/handles/..",
    "/handles/.",
    "/handles/%2e%2e",
    "/handles/%2e%2e?read_token=%2E%2e",
    "/handles/abc%2562",
]


def exchange(url: str, method: str, target: str, body: bytes = b"",
             content_type: str = "application/xacml+xml") -> bytes:
    """One request with `target` written on the request line as is; the answer's head."""
    host, port = url.split("//", 1)[1].split(":")
    head = (f"{method} {target} HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer tok-alice\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode("latin-1")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n\r\n", 1)[0]


def received(gateway) -> list[str]:
    with gateway.lock:
        return [t for t in gateway.targets if not t.startswith("/events/invalidations")]


@pytest.mark.parametrize("method", ["GET", "DELETE", "POST"])
@pytest.mark.parametrize("target", TARGETS)
def test_the_gateway_receives_the_target_byte_for_byte(gateway, proxy, method, target):
    gateway.targets.clear()
    status = exchange(proxy.url, method, target, b"{}" if method == "POST" else b"")
    assert status.startswith(b"HTTP/1.1 "), status
    assert received(gateway) == [target]


@pytest.mark.parametrize("target", RELAYED)
def test_a_handle_read_reaches_the_gateway_as_sent(gateway, proxy, target):
    gateway.targets.clear()
    exchange(proxy.url, "GET", target)
    assert received(gateway) == [target]


def test_two_spellings_of_a_stream_request_are_two_cache_entries(gateway, proxy):
    """`/%72equests` is `/requests` to both servers here, but the proxy cannot know what decodes
    the path behind it: a cache entry is for one raw path (a miss costs one call; a wrong hit
    hands out another request's handle)."""
    first = exchange(proxy.url, "POST", "/requests", XML)
    again = exchange(proxy.url, "POST", "/requests", XML)
    other = exchange(proxy.url, "POST", "/%72equests", XML)
    assert b"x-xsg-cache: miss" in first.lower() and b"x-xsg-cache: hit" in again.lower()
    assert b"x-xsg-cache: miss" in other.lower()
    assert received(gateway)[-1] == "/%72equests" and gateway.request_calls == 2


def test_a_header_http_forbids_is_the_callers_400_not_a_502(gateway):
    """A WSGI caller can hand the proxy a header value no HTTP message may carry; the proxy
    says which header, and does not blame the gateway (a 502) for it."""
    from werkzeug.test import Client

    from proxy.app import ProxyConfig, create_app, runtime_of

    app = create_app(ProxyConfig(upstream=gateway.url, require_feed=False, start_feed=False))
    try:
        for value in ("\x0c", "a\x0cb", "a\x7fb"):
            answer = Client(app).get("/streams", headers={"X-Odd": value})
            assert answer.status_code == 400, answer.get_data()
            assert "header X-Odd" in answer.get_json()["error"]
        assert runtime_of(app).stats()["requests"]["upstream_errors"] == 0
    finally:
        runtime_of(app).close()
