"""The proxy on its HTTP server in front of a real (small) gateway, talking real HTTP.

The gateway stand-in (tests/proxy/upstream.py) uses the real InvalidationHub, so webhooks, the
SSE feed, signatures and the proxy's re-sync are all exercised over loopback sockets.
"""
from __future__ import annotations

import json
import logging
import random
import threading
import time

import requests

from common.invalidation import sign
from tests.proxy.conftest import start_proxy
from tests.proxy.test_canonical import HOSTILE, JSON_DOC, XML, XML_REORDERED
from tests.proxy.upstream import SECRET

ALICE = {"Authorization": "Bearer tok-alice", "Content-Type": "application/xacml+xml"}
ALICE_JSON = {"Authorization": "Bearer tok-alice", "Content-Type": "application/xacml+json"}
BOB = {"Authorization": "Bearer tok-bob", "Content-Type": "application/xacml+xml"}
ADMIN = {"Authorization": "Bearer tok-admin"}


def post(proxy, body=XML, headers=ALICE):
    return requests.post(proxy.url + "/requests", data=body, headers=headers, timeout=10)


def stats(proxy):
    return requests.get(proxy.url + "/proxy/stats", timeout=5).json()


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_repeated_request_is_answered_from_cache(gateway, proxy):
    first = post(proxy)
    assert first.status_code == 201 and first.headers["X-XSG-Cache"] == "miss"
    handle = first.json()["handle"]
    assert handle.startswith(proxy.url + "/handles/")  # consumers read through the proxy
    assert first.headers["Location"] == handle
    assert first.json()["new"] is True
    for body, headers in ((XML, ALICE), (XML_REORDERED, ALICE),
                          (json.dumps(JSON_DOC).encode(), ALICE_JSON)):
        again = post(proxy, body, headers)
        assert again.status_code == 200 and again.headers["X-XSG-Cache"] == "hit"
        assert again.json() == {**first.json(), "new": False}  # a repeat, as the gateway says
    assert gateway.request_calls == 1  # no decision, merge or query for the hits
    other = post(proxy, XML, BOB)  # another caller: never someone else's handle
    assert other.headers["X-XSG-Cache"] == "miss" and other.json()["handle"] != handle
    assert gateway.request_calls == 2
    s = stats(proxy)
    assert s["cache"]["hits"] == 3 and s["cache"]["size"] == 2 and s["mode"] == "caching"


def test_revocation_drops_the_entry_before_the_revoke_call_returns(gateway, proxy):
    handle = post(proxy).json()["handle"]
    ident = handle.rsplit("/", 1)[1]
    assert post(proxy).headers["X-XSG-Cache"] == "hit"
    # Revoke at the gateway directly (not through the proxy): only the hub can tell the proxy.
    r = requests.post(gateway.url + "/admin/revoke/" + ident, headers=ADMIN, timeout=5)
    assert r.status_code == 200
    # No waiting: by the time the revoke call returned, the entry is gone.
    assert ident not in proxy.runtime.cache.handles()
    after = post(proxy)
    assert after.headers["X-XSG-Cache"] == "miss" and after.json()["handle"] != handle
    assert gateway.request_calls == 2
    s = stats(proxy)
    assert s["feed"]["webhooks_received"] == 1 and s["cache"]["invalidations"] == 1


def test_release_and_policy_change_through_the_hub(gateway, proxy):
    handle = post(proxy).json()["handle"]
    # A release through the proxy: the reader's DELETE is forwarded, the hub confirms it.
    r = requests.delete(handle, headers=ALICE, timeout=5)
    assert r.status_code == 204
    assert post(proxy).headers["X-XSG-Cache"] == "miss"
    assert post(proxy).headers["X-XSG-Cache"] == "hit"
    # A policy change at the gateway flushes the whole cache before it returns.
    assert requests.delete(gateway.url + "/policies/p1", headers=ADMIN, timeout=5).status_code \
        == 204
    assert len(proxy.runtime.cache) == 0
    assert post(proxy).headers["X-XSG-Cache"] == "miss"


def test_handle_stream_is_passed_through_without_buffering(gateway, proxy):
    handle = post(proxy).json()["handle"]
    resp = requests.get(handle, headers={**ALICE, "Accept": "text/event-stream"}, stream=True,
                        timeout=10)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    lines = resp.iter_lines()
    first = [next(lines) for _ in range(3)]
    # The gateway's generator is still blocked on the gate: this event came through alone.
    assert first == [b"id: 1", b"event: tuple", b'data: {"n": 1}']
    assert not gateway.stream_gate.is_set()
    gateway.stream_gate.set()
    rest = [line for line in lines if line.startswith(b"data:")]
    assert rest == [b'data: {"n": 2}', b'data: {"n": 3}', b'data: {"n": 4}', b"data: {}"]
    # A revoked handle answers 410 through the proxy too.
    ident = handle.rsplit("/", 1)[1]
    requests.post(gateway.url + "/admin/revoke/" + ident, headers=ADMIN, timeout=5)
    gone = requests.get(handle, headers=ALICE, timeout=5)
    assert gone.status_code == 410
    # Someone else's handle stays invisible.
    assert requests.get(handle, headers=BOB, timeout=5).status_code == 404


def test_denials_errors_and_hostile_bodies_pass_through_uncached(gateway, proxy):
    denied = post(proxy, XML.replace(b"weather", b"deny-me"))
    assert denied.status_code == 403
    assert post(proxy, XML.replace(b"weather", b"deny-me")).status_code == 403
    assert gateway.request_calls == 2  # denials are never cached
    assert post(proxy, XML, {"Content-Type": "application/xacml+xml"}).status_code == 401
    calls = gateway.request_calls
    for name in ("billion laughs", "external entity", "deep nesting", "malformed"):
        r = post(proxy, HOSTILE[name])
        assert r.status_code == 201 and r.headers["X-XSG-Cache"] == "bypass", name
    assert gateway.request_calls == calls + 4  # each went to the gateway, none was cached
    assert len(proxy.runtime.cache) == 0
    s = stats(proxy)
    assert s["requests"]["bypassed"] >= 5 and "not cacheable" in s["requests"]["last_bypass_reason"]
    assert requests.get(proxy.url + "/health", timeout=5).json() == {"status": "ok"}
    conflict = post(proxy, XML.replace(b"weather", b"conflict-me"))
    assert conflict.status_code == 409
    assert conflict.json()["handle"].startswith(proxy.url + "/handles/")
    assert conflict.json()["release"] == "DELETE " + conflict.json()["handle"]


def test_forged_webhook_is_refused(gateway, proxy):
    ident = post(proxy).json()["handle"].rsplit("/", 1)[1]
    event = {"id": 99, "epoch": gateway.hub.epoch, "kind": "handle-revoked",
             "handle_ids": [ident]}
    body = json.dumps(event).encode()
    forged = sign("not-the-secret", body)
    r = requests.post(proxy.url + "/proxy/invalidate", data=body, headers=forged, timeout=5)
    assert r.status_code == 401
    assert post(proxy).headers["X-XSG-Cache"] == "hit"
    # Correctly signed but out of sequence (a gap): the proxy cannot trust its cache -> flush.
    r = requests.post(proxy.url + "/proxy/invalidate", data=body,
                      headers=sign(SECRET, body), timeout=5)
    assert r.status_code == 200 and r.json()["result"] == "flushed"
    assert len(proxy.runtime.cache) == 0
    garbage = b'{"id": "x"}'
    r = requests.post(proxy.url + "/proxy/invalidate", data=garbage,
                      headers=sign(SECRET, garbage), timeout=5)
    assert r.status_code == 400


def test_lost_feed_means_pass_through_until_it_is_back(gateway, proxy, caplog):
    caplog.set_level(logging.INFO)
    post(proxy)
    assert post(proxy).headers["X-XSG-Cache"] == "hit"
    gateway.feed_blocked = True
    gateway.hub.disconnect_feed_readers()
    assert wait_for(lambda: stats(proxy)["mode"] == "pass-through", 3)
    s = stats(proxy)
    assert s["feed"]["state"] == "down" and s["feed"]["last_error"]
    assert s["cache"]["size"] == 0
    calls = gateway.request_calls
    for _ in range(2):
        r = post(proxy)
        assert r.status_code in (200, 201) and r.headers["X-XSG-Cache"] == "bypass"
    assert gateway.request_calls == calls + 2
    assert "passing requests through uncached" in caplog.text
    gateway.feed_blocked = False
    assert wait_for(lambda: stats(proxy)["mode"] == "caching", 3)
    assert post(proxy).headers["X-XSG-Cache"] == "miss"
    assert post(proxy).headers["X-XSG-Cache"] == "hit"
    assert stats(proxy)["feed"]["resyncs"] >= 2


def test_unreachable_gateway_feed_from_the_start(gateway):
    running = start_proxy(gateway, upstream="http://127.0.0.1:9", feed_read_timeout=0.3)
    try:
        assert wait_for(lambda: stats(running)["feed"]["state"] == "down", 3)
        r = post(running)
        assert r.status_code == 502 and "unreachable" in r.json()["error"]
        assert stats(running)["mode"] == "pass-through"
    finally:
        running.runtime.close()
        running.server.stop()


def test_concurrent_requests_and_revocations_never_serve_a_revoked_handle(gateway, proxy):
    """Clients hammer the proxy while an admin revokes handles at the gateway; every hit is
    checked against the revocations that had returned before that request was sent."""
    returned: set[str] = set()
    lock = threading.Lock()
    violations: list[str] = []
    hits = [0]
    stop = time.monotonic() + 1.5
    bodies = [XML.replace(b"weather", f"stream{i}".encode()) for i in range(4)]

    def client(seed: int) -> None:
        rnd = random.Random(seed)
        session = requests.Session()
        while time.monotonic() < stop:
            with lock:
                already = set(returned)
            r = session.post(proxy.url + "/requests", data=rnd.choice(bodies), headers=ALICE,
                             timeout=10)
            assert r.status_code in (200, 201), r.text
            ident = r.json()["handle"].rsplit("/", 1)[1]
            if r.headers["X-XSG-Cache"] == "hit":
                hits[0] += 1
                if ident in already:
                    violations.append(ident)

    def revoker() -> None:
        session = requests.Session()
        rnd = random.Random(7)
        while time.monotonic() < stop:
            with gateway.lock:
                live = [h for h, e in gateway.handles.items() if e["state"] == "live"]
            if live:
                victim = rnd.choice(live)
                session.post(gateway.url + "/admin/revoke/" + victim, headers=ADMIN, timeout=10)
                with lock:
                    returned.add(victim)
            time.sleep(0.02)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=revoker))
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not violations, violations
    assert hits[0] > 5 and len(returned) > 3  # the race really ran both ways


def test_large_uploads_are_streamed_through_with_their_length(gateway, proxy):
    import hashlib
    body = (b'{"samplingtime": 1, "rainrate": 5.5}\n' * 60_000)  # about 2 MB
    assert len(body) > proxy.runtime.forwarder.buffer_limit
    r = requests.post(proxy.url + "/streams/weather/records", data=body,
                      headers={"Authorization": "Bearer tok-alice",
                               "Content-Type": "application/x-ndjson"}, timeout=30)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["bytes"] == len(body) and doc["sha256"] == hashlib.sha256(body).hexdigest()
    assert doc["chunked"] is False  # sent with a Content-Length, not re-chunked


def test_cli_configuration(monkeypatch):
    import pytest

    from proxy.cli import build_parser, config_from_args
    monkeypatch.setenv("XSG_PROXY_TOKEN", "feed-tok")
    monkeypatch.setenv("XSG_PROXY_SECRET", "hook-secret")
    args = build_parser().parse_args(["--upstream", "http://gw:8080", "--port", "9001",
                                      "--ttl", "30", "--cache-size", "50"])
    cfg = config_from_args(args)
    assert (cfg.feed_token, cfg.webhook_secret) == ("feed-tok", "hook-secret")
    assert cfg.webhook_url == "http://127.0.0.1:9001/proxy/invalidate"
    assert (cfg.ttl, cfg.max_entries) == (30, 50)
    with pytest.raises(SystemExit):
        config_from_args(build_parser().parse_args(["--upstream", "gw:8080"]))
    with pytest.raises(SystemExit):
        config_from_args(build_parser().parse_args(["--upstream", "http://gw", "--ttl", "0"]))


def test_chunked_uploads_are_relayed_and_canonicalised(gateway, proxy):
    import hashlib

    def pieces(data: bytes, size: int = 1000):
        for i in range(0, len(data), size):
            yield data[i:i + size]

    first = requests.post(proxy.url + "/requests", data=pieces(XML), headers=ALICE, timeout=10)
    assert first.status_code == 201 and first.headers["X-XSG-Cache"] == "miss"
    assert post(proxy).headers["X-XSG-Cache"] == "hit"  # same request, now with a length
    big = b"x" * (3 * 1024 * 1024)
    r = requests.post(proxy.url + "/streams/weather/records", data=pieces(big, 65536),
                      headers={"Authorization": "Bearer tok-alice"}, timeout=30)
    assert r.status_code == 200 and r.json()["sha256"] == hashlib.sha256(big).hexdigest()


def test_proxy_that_the_gateway_cannot_call_back_stops_caching(gateway):
    """Webhook URL unreachable from the gateway: events still come by the feed, but a revocation
    could return before the proxy knows, so the proxy passes through instead of caching."""
    running = start_proxy(gateway, webhook_url="http://127.0.0.1:9/proxy/invalidate",
                          webhook_grace=0.3)
    try:
        from proxy.feed import wait_live
        assert wait_live(running.runtime.sync, 5)
        ident = post(running).json()["handle"].rsplit("/", 1)[1]
        assert post(running).headers["X-XSG-Cache"] == "hit"
        started = time.monotonic()
        requests.post(gateway.url + "/admin/revoke/" + ident, headers=ADMIN, timeout=5)
        assert time.monotonic() - started < 2.0  # the hub did not hang on the dead webhook
        assert wait_for(lambda: stats(running)["feed"]["webhook_channel"] == "missing", 3)
        assert stats(running)["mode"] == "pass-through"
        assert post(running).headers["X-XSG-Cache"] == "bypass"
        assert gateway.hub.proxies()[0]["state"] == "stale"
    finally:
        running.runtime.close()
        running.server.stop()


def test_feed_timeout_shorter_than_the_heartbeat_is_lengthened(gateway):
    running = start_proxy(gateway, feed_read_timeout=0.1)  # the hub beats every 0.2 s
    try:
        from proxy.feed import wait_live
        assert wait_live(running.runtime.sync, 5)
        assert running.runtime.feed.read_timeout >= 0.4
        time.sleep(0.5)  # several heartbeats later the feed is still live
        assert stats(running)["feed"]["state"] == "live"
    finally:
        running.runtime.close()
        running.server.stop()


def test_handle_urls_are_rewritten_whatever_host_the_gateway_names(gateway, proxy):
    gateway.base_url = "http://gateway.internal:8080/"
    r = post(proxy)
    assert r.json()["handle"].startswith(proxy.url + "/handles/")
    assert r.headers["Location"] == r.json()["handle"]
    assert post(proxy).json()["handle"] == r.json()["handle"]  # the hit too


def test_metrics_count_hits_misses_and_invalidations_in_the_prometheus_format(gateway, proxy):
    from prometheus_client.parser import text_string_to_metric_families

    def scrape():
        r = requests.get(proxy.url + "/proxy/metrics", timeout=5)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
        return {s.name: s.value for family in text_string_to_metric_families(r.text)
                for s in family.samples}

    before = scrape()
    assert before["xsg_proxy_cache_enabled"] == 1
    handle = post(proxy).json()["handle"]
    post(proxy)
    post(proxy)
    after = scrape()
    assert after["xsg_proxy_cache_hits_total"] - before["xsg_proxy_cache_hits_total"] == 2
    assert after["xsg_proxy_cache_misses_total"] - before["xsg_proxy_cache_misses_total"] == 1
    assert after["xsg_proxy_cache_entries"] >= 1
    s = stats(proxy)  # the same numbers as /proxy/stats
    assert s["cache"]["hits"] == after["xsg_proxy_cache_hits_total"]
    requests.delete(handle, headers=ALICE, timeout=5)
    assert wait_for(lambda: scrape()["xsg_proxy_cache_invalidations_total"]
                    > after["xsg_proxy_cache_invalidations_total"])
