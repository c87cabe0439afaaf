"""End-to-end fixtures: ONE SparkSession and ONE gateway over its HTTP server for the whole run.

The gateway is the real thing (pep.services + pep.http.app + StreamRuntime on Spark), served by
server.serving.HttpServer on a free loopback port; tests talk to it with `requests`.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.pep.conftest import TOKENS, build_gateway

POLICIES = Path(__file__).resolve().parents[2] / "policies"


@dataclass
class Gateway:
    url: str
    app: object
    services: object
    server: object
    runtime: object

    def close(self) -> None:
        # Streaming readers first: their responses end only when their handles' buffers
        # close, and the server's stop waits for its workers.
        self.services.close_stream_side()
        self.server.stop()
        self.services.close()


def start_gateway(spark, data_dir: Path) -> Gateway:
    from pep.runtime.runtime import StreamRuntime
    from server.serving import HttpServer

    runtime = StreamRuntime(spark, data_dir / "runtime", trigger_interval=0.25)
    app, services = build_gateway(data_dir, runtime, heartbeat=1.0, interval=0.5)
    server = HttpServer(app, host="127.0.0.1", port=0, threads=16)
    server.start()
    return Gateway(server.url, app, services, server, runtime)


@pytest.fixture(scope="session")
def gateway(spark, tmp_path_factory):
    gw = start_gateway(spark, tmp_path_factory.mktemp("gateway"))
    yield gw
    gw.close()


def auth(who: str, **extra) -> dict:
    return {"Authorization": f"Bearer {TOKENS[who]}", **extra}


@dataclass
class Reader:
    """Reads a handle's NDJSON in a background thread, like a consumer's application."""

    url: str
    who: str = "lta"
    last_event_id: int | None = None
    lines: list = field(default_factory=list)
    status: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    final_at: float | None = None

    def start(self) -> Reader:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        headers = auth(self.who, Accept="application/x-ndjson")
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = str(self.last_event_id)
        try:
            with requests.get(self.url, headers=headers, stream=True, timeout=60) as r:
                self.status = r.status_code
                if r.status_code != 200:
                    return
                for raw in r.iter_lines(chunk_size=1):
                    if not raw:
                        continue
                    obj = json.loads(raw)
                    if obj.get("event") == "heartbeat":
                        continue
                    self.lines.append(obj)
                    if obj.get("event") in ("revoked", "released", "ended", "shutdown"):
                        self.final_at = time.monotonic()
                        return
        finally:
            self.done.set()

    @property
    def rows(self) -> list[dict]:
        return [x["row"] for x in self.lines if "row" in x]

    def kinds(self) -> list[str]:
        """Each line's kind in order: its event, or "row"."""
        return [x.get("event", "row") for x in self.lines]

    def wait(self, until: Callable[[], bool], timeout: float = 60) -> bool:
        """Whether `until()` came true within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            time.sleep(0.05)
        return bool(until())

    def wait_rows(self, n: int, timeout: float = 90) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.rows) < n and time.monotonic() < deadline and not self.done.is_set():
            time.sleep(0.05)
        return self.rows
