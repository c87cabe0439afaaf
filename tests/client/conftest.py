"""The xsg client's tests run against a real gateway: `xsg serve` as a child process
(`ServeProcess`, which tests/kafka/test_kafka_kill.py starts too), its output in files, on a
fixed port (a handle's URL survives a restart), local Spark, the auth file of
tests.pep.conftest, heartbeats every second.

One gateway serves the whole session (`served`); a test that restarts the gateway starts its own
(`ServeProcess`). Streams and policies are made through the gateway's HTTP API, as an owner
would (`Served.stream`), and records appended through it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.pep.conftest import TOKENS, write_auth
from tests.processes import free_port

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "client"
RULE_JSON = {"Content-Type": "application/vnd.xsg.rule+json"}
NDJSON = {"Content-Type": "application/x-ndjson"}


def bearer(who: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}", **extra}


class ServeProcess:
    """`xsg serve` on a fixed port; stdout and stderr go to files, never to a pipe."""

    def __init__(self, work: Path, port: int | None = None, tls: tuple[str, str] | None = None,
                 heartbeat: float = 1.0) -> None:
        self.work = work
        self.port = port or free_port()
        self.scheme = "https" if tls else "http"
        self.url = f"{self.scheme}://127.0.0.1:{self.port}"
        self.ca = tls[0] if tls else None
        auth = work / "auth.json"
        write_auth(auth)
        self.args = [sys.executable, "-u", "-m", "pep.cli", "serve", "--port", str(self.port),
                     "--data-dir", str(work / "data"), "--auth", str(auth),
                     "--heartbeat", str(heartbeat),
                     "--spark-master", "local[2]", "--conf", "spark.driver.memory=1g",
                     "--trigger-interval", "0.25"]
        if tls:
            self.args += ["--tls-cert", tls[0], "--tls-key", tls[1]]
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout: float = 180.0) -> ServeProcess:
        self.starts += 1
        with open(self.work / f"serve-{self.starts}.out", "wb") as out, \
                open(self.work / f"serve-{self.starts}.err", "wb") as err:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, cwd=self.work,
                                         env={**os.environ, "PYTHONPATH": str(REPO)},
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"xsg serve exited with {self.proc.returncode}: {self.stderr()}")
            try:
                r = requests.get(f"{self.url}/health", timeout=2, verify=self.ca or True)
                if r.status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.25)
        self.kill()
        pytest.fail(f"xsg serve did not become ready in {timeout} s: {self.stderr()}")

    def stderr(self) -> str:
        path = self.work / f"serve-{self.starts}.err"
        return path.read_text(errors="replace")[-4000:] if path.is_file() else ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM, as an operator stops it: readers get `shutdown`, live handles resume at
        the next start."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()

    # -- what an owner does, over HTTP ------------------------------------------------------------

    def call(self, method: str, path: str, who: str = "nea", ok: tuple[int, ...] = (200, 201),
             **kwargs: Any) -> requests.Response:
        headers = bearer(who, **kwargs.pop("headers", {}))
        r = requests.request(method, self.url + path, headers=headers, timeout=60,
                             verify=self.ca or True, **kwargs)
        assert r.status_code in ok, f"{method} {path}: {r.status_code} {r.text}"
        return r

    def stream(self, name: str, schema: list[tuple[str, str]], rule: dict[str, Any],
               time_attribute: str | None = None) -> None:
        """Register an ingest stream of nea's and a sharing rule on it for lta."""
        self.call("POST", "/streams", json={
            "name": name, "source": {"kind": "ingest"},
            **({"time_attribute": time_attribute} if time_attribute else {}),
            "schema": [{"name": n, "type": t} for n, t in schema]})
        body = {"stream": name, "who": {"subjects": ["lta"]}, **rule}
        self.call("POST", "/policies", headers=RULE_JSON, data=json.dumps(body))

    def append(self, stream: str, records: list[dict[str, Any]]) -> None:
        self.call("POST", f"/streams/{stream}/records", headers=NDJSON,
                  data="".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory):
    gateway = ServeProcess(tmp_path_factory.mktemp("xsg-client-gateway")).start()
    try:
        yield gateway
    finally:
        gateway.stop()


@dataclass
class RawReader:
    """A reader over raw HTTP (`requests`, NDJSON lines, `json.loads`), on a thread: what a
    consumer without the client gets."""

    url: str
    verify: str | bool = True
    lines: list[dict[str, Any]] | None = None

    def start(self) -> RawReader:
        self.lines = []
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        assert self.lines is not None
        try:
            with requests.get(self.url, headers=bearer("lta", Accept="application/x-ndjson"),
                              stream=True, timeout=60, verify=self.verify) as r:
                for raw in r.iter_lines():
                    if raw:
                        obj = json.loads(raw)
                        if obj.get("event") == "heartbeat":
                            continue
                        self.lines.append(obj)
                        if obj.get("event") in ("revoked", "released", "ended", "shutdown"):
                            return
        finally:
            self.done.set()

    def rows(self) -> list[dict[str, Any]]:
        return [x for x in self.lines or () if "row" in x]


def wait_for(predicate: Any, timeout: float = 90.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
