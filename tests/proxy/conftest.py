from __future__ import annotations

from dataclasses import dataclass

import pytest

from proxy.app import ProxyConfig, ProxyRuntime, create_app, runtime_of
from proxy.feed import wait_live
from server.serving import HttpServer
from tests.proxy.upstream import PROXY_TOKEN, SECRET, FakeGateway


@dataclass
class RunningProxy:
    url: str
    runtime: ProxyRuntime
    server: HttpServer


class _LateApp:
    """Lets the proxy's server bind first, so the proxy knows its own webhook URL."""

    app = None

    def __call__(self, environ, start_response):
        return self.app(environ, start_response)

    @property
    def extensions(self) -> dict:
        """The proxy app's: its server finds the native relay of handle streams there."""
        return self.app.extensions if self.app is not None else {}


@pytest.fixture
def gateway():
    gw = FakeGateway(heartbeat=0.2)
    server = HttpServer(gw.app, name="fake-gateway", threads=24).start()
    gw.url = server.url
    yield gw
    gw.hub.close()
    server.stop()


def start_proxy(gateway, **overrides) -> RunningProxy:
    late = _LateApp()
    server = HttpServer(late, name="proxy", threads=24).start()
    options = dict(upstream=gateway.url, feed_token=PROXY_TOKEN, webhook_secret=SECRET,
                   webhook_url=server.url + "/proxy/invalidate", feed_read_timeout=0.8,
                   feed_backoff=(0.05, 0.2))
    options.update(overrides)
    late.app = create_app(ProxyConfig(**options))
    return RunningProxy(server.url, runtime_of(late.app), server)


@pytest.fixture
def proxy(gateway):
    running = start_proxy(gateway)
    assert wait_live(running.runtime.sync, 5), running.runtime.stats()
    yield running
    running.runtime.close()
    running.server.stop()
