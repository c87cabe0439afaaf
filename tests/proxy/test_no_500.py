"""No 500 anywhere (issue 19), through the caching proxy: the gateway's property-based run
(tests/pep/http/no500.py) sent through the proxy, in front of the same real gateway served over
HTTP (werkzeug's threaded server), and a hypothesis run over the proxy's own routes with odd
webhook timestamps, signatures and bodies. No answer may be a 5xx but a 502/504 saying the
gateway could not be reached (it always can here), and every refusal is the one error body.
"""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from werkzeug.test import Client

pytest.importorskip("schemathesis")

import schemathesis

from common.invalidation import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from tests.pep.http import no500
from tests.pep.http.no500 import (
    BODIES,
    error_body_problem,
    report,
    run_schema,
    seed,
    send,
)

# no500's fixtures, under their names for pytest: the gateway, and Hypothesis restored after
# these tests (autouse)
no500_gateway = no500.no500_gateway
hypothesis_as_found = no500.hypothesis_as_found
pytestmark = pytest.mark.timeout(240)

PROXY_EXAMPLES = 5
SECRET = "no500-webhook-secret"


@pytest.fixture(scope="module")
def gateway(no500_gateway):
    return no500_gateway


@pytest.fixture(scope="module")
def proxied(gateway):
    from proxy.app import ProxyConfig, create_app, runtime_of
    from server.serving import HttpServer

    # the gateway behind the proxy on its own server, as in production
    server = HttpServer(gateway.app, host="127.0.0.1", port=0, name="no500-gateway")
    server.start()
    app = create_app(ProxyConfig(upstream=server.url,
                                 webhook_secret=SECRET, require_feed=False, start_feed=False))
    yield app
    runtime_of(app).close()
    server.stop()


def test_no_route_through_the_proxy_answers_5xx(gateway, proxied):
    seed(gateway)
    schema = schemathesis.openapi.from_wsgi("/openapi.json", gateway.app)
    # the invalidation feed is the proxy's own upstream channel, an endless SSE stream that the
    # proxy relays as an ordinary answer: it is not a route for consumers through the proxy
    failures, answered = run_schema(schema, proxied, gateway.known, PROXY_EXAMPLES, BODIES,
                                    skip=lambda label: label == "GET /events/invalidations")
    assert not failures, report(failures)
    assert answered.get("2xx", 0) > 20 and answered.get("4xx", 0) > 100, answered


NASTY = st.one_of(st.text(max_size=30), st.sampled_from(
    ["²", "٣", "①", "1" * 5000, "-1", "9" * 13, "nan", "1e3", " 1 ", "", "\x00", "sha256=",
     "sha256=" + "0" * 64]))


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
       route=st.sampled_from(["/proxy/stats", "/proxy/metrics", "/proxy/health",
                              "/proxy/invalidate", "/proxy/nosuch"]),
       timestamp=st.one_of(st.none(), NASTY, st.just("now")),
       signature=st.one_of(st.none(), NASTY, st.just("good")),
       body=st.one_of(st.binary(max_size=200), st.sampled_from([
           b'{"id": 1, "epoch": "e", "kind": "policy-changed"}', b"[" * 5000 + b"]" * 5000,
           b'{"id": 1e999}', b'{"id": "\xb2"}', b"\xff\xfe"]), NASTY.map(str.encode)))
def test_the_proxys_own_routes_answer_below_500(proxied, method, route, timestamp, signature,
                                                body):
    headers = {}
    if timestamp == "now":
        timestamp = str(int(time.time()))
    if timestamp is not None:
        headers[TIMESTAMP_HEADER] = timestamp
    if signature == "good":
        signature = sign(SECRET, body, int(time.time()))[SIGNATURE_HEADER]
    if signature is not None:
        headers[SIGNATURE_HEADER] = signature
    status, content_type, answer = send(Client(proxied), {
        "method": method, "path": route, "headers": headers, "data": body})
    assert status < 500, answer[:300]
    if status >= 400 and method != "HEAD":
        assert error_body_problem(status, content_type, answer) is None, answer[:300]


@pytest.mark.parametrize("flag, value", [
    ("--port", "٣"), ("--port", "²"), ("--port", "0"), ("--threads", "1_0"),
    ("--cache-size", "1" * 5000), ("--ttl", "nan"), ("--ttl", "inf"), ("--feed-timeout", "٣"),
    ("--upstream-timeout", "-1")])
def test_the_proxy_flags_are_ascii_finite_numbers(flag, value, capsys):
    # int('٣') is 3 and float('nan') passes every comparison: both were taken
    from proxy.cli import build_parser

    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["--upstream", "http://gw:8080", flag, value])
    assert stop.value.code == 2
    assert f"argument {flag}: the value must be a" in capsys.readouterr().err


@pytest.mark.parametrize("body", [
    b"[" * 5000 + b"]" * 5000, b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 3000 + b"1" + b"}" * 3000, b"1" * 5000,
    b'{"id": 1e999, "epoch": "e", "kind": "policy-changed"}', b"\xff\xfe",
    b'{"id": "\xc2\xb2", "epoch": "e", "kind": "policy-changed"}'])
def test_a_signed_but_malformed_webhook_is_400(proxied, body):
    # a deep document made json.loads recurse out of the stack: a 500 even when signed
    headers = sign(SECRET, body, int(time.time()))
    status, content_type, answer = send(Client(proxied), {
        "method": "POST", "path": "/proxy/invalidate", "headers": headers, "data": body})
    assert status == 400, answer[:300]
    assert error_body_problem(status, content_type, answer) is None
    assert b"malformed invalidation event" in answer
