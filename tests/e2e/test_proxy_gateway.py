"""The caching proxy in front of the whole gateway (real PDP, handles, Spark runtime, hub).

A consumer asks through the proxy: the first request is a miss that the gateway answers with a new
handle, the identical second one a hit that never reaches it; the handle streams rows through the
proxy. Then the data owner deletes the policy at the gateway: by the time that DELETE returns, the
proxy has dropped the entry (the hub's webhook is acknowledged before the revocation returns), so
the same request is no hit, and the old handle answers 410 through the proxy.
"""
from __future__ import annotations

import secrets

import pytest
import requests

from tests.e2e.conftest import POLICIES, Gateway, Reader, auth
from tests.e2e.test_paper_scenario import FIELDS, NEA_POLICY_ID, make_records, ndjson

XML = {"Content-Type": "application/xacml+xml"}


class _LateApp:
    """Binds the proxy's port before its app exists, so the webhook URL names the real port."""

    app = None

    def __call__(self, environ, start_response):
        return self.app(environ, start_response)

    @property
    def extensions(self) -> dict:
        """The proxy app's: its server finds the native relay of handle streams there."""
        return self.app.extensions if self.app is not None else {}


@pytest.fixture
def stack(spark, tmp_path):
    from pep.invalidation.hub import InvalidationHub
    from pep.runtime.runtime import StreamRuntime
    from proxy.app import ProxyConfig, create_app, runtime_of
    from proxy.feed import wait_live
    from server.serving import HttpServer
    from tests.pep.conftest import build_gateway

    token, secret = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    hub = InvalidationHub(secret=secret, proxy_token=token, heartbeat=0.5)
    runtime = StreamRuntime(spark, tmp_path / "gw" / "runtime", trigger_interval=0.25)
    app, services = build_gateway(tmp_path / "gw", runtime, heartbeat=1.0, interval=0.5,
                                  invalidation=hub)  # build_services subscribes it to policy events
    server = HttpServer(app, host="127.0.0.1", port=0, threads=16)
    server.start()
    gw = Gateway(server.url, app, services, server, runtime)

    late = _LateApp()
    proxy_server = HttpServer(late, name="proxy", threads=16).start()
    late.app = create_app(ProxyConfig(upstream=gw.url, feed_token=token, webhook_secret=secret,
                                      webhook_url=proxy_server.url + "/proxy/invalidate",
                                      feed_read_timeout=2.0, feed_backoff=(0.05, 0.2)))
    proxy = runtime_of(late.app)
    try:
        assert wait_live(proxy.sync, 10), proxy.stats()
        yield gw, proxy_server.url, proxy, hub
    finally:
        proxy.close()
        proxy_server.stop()
        gw.close()
        hub.close()
        runtime.stop()


def test_cached_handle_through_the_proxy_dies_with_its_policy(stack):
    gw, proxy_url, proxy, hub = stack
    schema = [{"name": n, "type": t} for n, t in FIELDS]
    r = requests.post(f"{gw.url}/streams", headers=auth("nea"), timeout=30,
                      json={"name": "weather", "schema": schema, "source": {"kind": "ingest"},
                            "time_attribute": "samplingtime"})
    assert r.status_code == 201, r.text
    r = requests.post(f"{gw.url}/policies", headers=auth("nea", **XML), timeout=30,
                      data=(POLICIES / "weather" / "nea-weather-policy.xml").read_bytes())
    assert r.status_code == 201, r.text
    body = (POLICIES / "weather" / "lta-request.xml").read_bytes()

    def ask() -> requests.Response:
        return requests.post(f"{proxy_url}/requests", headers=auth("lta", **XML), data=body,
                             timeout=60)

    first = ask()
    assert first.status_code == 201, first.text
    assert first.headers["X-XSG-Cache"] == "miss" and first.json()["new"] is True
    handle, hid = first.json()["handle"], first.json()["id"]
    assert handle == f"{proxy_url}/handles/{hid}"  # rewritten: consumers read through the proxy
    second = ask()
    assert second.status_code == 200 and second.headers["X-XSG-Cache"] == "hit"
    assert second.json()["handle"] == handle and second.json()["new"] is False
    live = requests.get(f"{gw.url}/handles", headers=auth("lta"), timeout=10).json()["handles"]
    assert [h["id"] for h in live] == [hid]  # the hit made no new handle at the gateway
    assert proxy.stats()["cache"]["hits"] == 1

    reader = Reader(handle).start()  # NDJSON through the proxy, chunk by chunk
    records = make_records(30)
    r = requests.post(f"{gw.url}/streams/weather/records", data=ndjson(records), timeout=30,
                      headers=auth("nea", **{"Content-Type": "application/x-ndjson"}))
    assert r.status_code == 201 and r.json()["appended"] == 30
    kept = sum(1 for x in records if x["rainrate"] > 5)  # Figure 2: windows of 5 every 2
    expected = (kept - 5) // 2 + 1
    rows = reader.wait_rows(expected, timeout=60)
    assert reader.status == 200 and len(rows) == expected, (reader.status, reader.lines[-3:])
    assert {"window_start", "avg_rainrate", "max_windspeed"} <= set(rows[0])

    r = requests.delete(f"{gw.url}/policies/{NEA_POLICY_ID}", headers=auth("nea"), timeout=30)
    assert r.status_code == 204
    # no waiting: the revocation returned only after the proxy acknowledged the invalidation
    assert hid not in proxy.cache.handles()
    again = ask()
    assert again.headers["X-XSG-Cache"] != "hit"
    assert again.status_code == 403  # the policy is gone: not permitted any more
    assert reader.done.wait(10) and reader.lines[-1]["event"] == "revoked"
    r = requests.get(handle, headers=auth("lta", Accept="application/x-ndjson"), timeout=10)
    assert r.status_code == 410 and r.json()["state"] == "revoked"
    assert proxy.stats()["feed"]["webhooks_received"] >= 1
