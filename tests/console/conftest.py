"""Fixtures for the console: a whole gateway (real PDP, catalogue, handles; the RecordingRuntime
in place of Spark, so rows are pushed by the test) served by the gateway's HTTP server on a
loopback port, and headless Chromium driven by Playwright.

The browser is Debian's `chromium` (`/usr/bin/chromium`, or `XSG_CHROMIUM`); Playwright's own
browser download cannot work here. When Playwright or Chromium is missing the browser tests skip
and say what to install. Screenshots go to a temporary directory, or to `XSG_CONSOLE_SCREENSHOTS`
when set (`XSG_CONSOLE_SCREENSHOTS=docs/console make test` refreshes the committed ones).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.pep.conftest import TOKENS, RecordingRuntime, write_auth

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
WEATHER_POLICY_ID = "urn:xsg:example:weather:nea-policy"
CHROMIUM = os.environ.get("XSG_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def weather_registration() -> dict:
    entry = dict(json.loads((POLICIES / "streams.json").read_text())[0])
    entry.pop("owner", None)
    return entry


def auth(who: str, **extra) -> dict:
    return {"Authorization": f"Bearer {TOKENS[who]}", **extra}


@dataclass
class ConsoleGateway:
    url: str
    app: object
    services: object
    server: object
    runtime: RecordingRuntime

    def api(self, method: str, path: str, who: str = "nea", **kwargs) -> requests.Response:
        headers = auth(who, **kwargs.pop("headers", {}))
        return requests.request(method, self.url + path, headers=headers, timeout=10, **kwargs)

    def add_weather(self) -> None:
        r = self.api("POST", "/streams", json=weather_registration())
        assert r.status_code == 201, r.text

    def add_policy(self, xml: bytes | str) -> None:
        data = xml.encode() if isinstance(xml, str) else xml
        r = self.api("POST", "/policies", data=data,
                     headers={"Content-Type": "application/xacml+xml"})
        assert r.status_code == 201, r.text

    def add_weather_policy(self) -> None:
        self.add_policy((POLICIES / "weather" / "nea-weather-policy.xml").read_bytes())

    def close(self) -> None:
        self.services.close_stream_side()  # readers end first, or the server waits for them
        self.server.stop()
        self.services.close()


def start_gateway(data_dir: Path, buffer_rows: int = 10_000, wrap=None, runtime=None,
                  **config_fields) -> ConsoleGateway:
    """A gateway on a loopback port; `wrap(app)` may put WSGI middleware in front of it;
    `runtime` replaces the RecordingRuntime."""
    from pep.config import GatewayConfig
    from pep.http.app import create_app
    from pep.services import build_services
    from server.serving import HttpServer

    data_dir.mkdir(parents=True, exist_ok=True)
    auth_file = data_dir / "auth.json"
    write_auth(auth_file)
    config_fields.setdefault("cors_origins", ())
    config = GatewayConfig(data_dir=data_dir, auth_file=auth_file, policies_dir=None, port=0,
                           heartbeat=0.5, reevaluation_interval=0.25, **config_fields)
    runtime = runtime if runtime is not None else RecordingRuntime()
    services = build_services(config, runtime=runtime, buffer_rows=buffer_rows)
    app = create_app(services=services)
    server = HttpServer(
        wrap(app) if wrap else app, host="127.0.0.1", port=0, threads=16, name="xsg-console-test"
    )
    server.start()
    return ConsoleGateway(server.url, app, services, server, runtime)


@pytest.fixture
def gateway_factory(tmp_path):
    started: list[ConsoleGateway] = []

    def make(**kwargs) -> ConsoleGateway:
        gw = start_gateway(tmp_path / f"data{len(started)}", **kwargs)
        started.append(gw)
        return gw

    yield make
    for gw in started:
        gw.close()


@pytest.fixture
def gateway(gateway_factory) -> ConsoleGateway:
    return gateway_factory()


# -- the browser -----------------------------------------------------------------------------------

def browser_missing() -> str | None:
    """Why the browser tests cannot run here, with what to install; None when they can."""
    try:
        import playwright.sync_api  # noqa: F401 - imported to see that it is installed
    except ImportError:
        return ("the playwright package is not installed: .venv/bin/pip install -e '.[test]' "
                "(`make test` does it)")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return (f"headless Chromium is not at {CHROMIUM}: install Debian's package with "
                "`apt-get install chromium` (`make test` does it when run as root) or set "
                "XSG_CHROMIUM to a Chromium binary")
    return None


@pytest.fixture(scope="module")
def browser():
    missing = browser_missing()
    if missing:
        pytest.skip(f"browser tests skipped: {missing}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def shots(tmp_path_factory) -> Path:
    target = os.environ.get("XSG_CONSOLE_SCREENSHOTS")
    path = Path(target) if target else tmp_path_factory.mktemp("console-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path
