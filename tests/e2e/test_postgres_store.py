"""`xsg serve --store postgresql://...` as a user runs it: a child process keeping everything in
PostgreSQL. A policy written, a stream registered, a request granted; the gateway stopped and
started again (on a fresh data directory: what it remembers comes from the database), and the
handle is still there, resumed, with the grant's audit entry."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.pep.conftest import TOKENS, write_auth

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies" / "weather"
XML = {"Content-Type": "application/xacml+xml"}
WEATHER = {"name": "weather", "time_attribute": "samplingtime", "source": {"kind": "ingest"},
           "schema": [{"name": n, "type": t} for n, t in (
               ("samplingtime", "timestamp"), ("station", "string"), ("rainrate", "double"),
               ("windspeed", "double"))]}


def auth(who: str) -> dict:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


class Serve:
    """One `xsg serve` child process, its output in files (never a pipe nobody reads)."""

    def __init__(self, tmp_path: Path, name: str, store: str, auth_file: Path) -> None:
        self.out, self.err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        self.data = tmp_path / f"{name}-data"
        empty = tmp_path / "no-policies"
        empty.mkdir(exist_ok=True)
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "pep.cli", "serve", "--port", "0",
                 "--data-dir", str(self.data), "--auth", str(auth_file),
                 "--policies", str(empty), "--spark-master", "local[2]",
                 "--conf", "spark.sql.shuffle.partitions=2"],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=tmp_path,
                env={**os.environ, "PYTHONPATH": str(REPO), "XSG_STORE": store})
        self.url = self._wait_for_url(timeout=240)

    def _wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            for line in self.out.read_text(errors="replace").splitlines():
                if line.startswith("xsg gateway listening on "):
                    return line.split()[4]
            time.sleep(0.2)
        self.kill()
        pytest.fail("xsg serve did not come up:\n" + self.out.read_text(errors="replace")
                    + "\n--- stderr ---\n" + self.err.read_text(errors="replace")[-5000:])

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("xsg serve did not stop within 90 s of SIGTERM:\n"
                        + self.err.read_text(errors="replace")[-5000:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.mark.timeout(600)
def test_serve_on_postgresql_keeps_the_handle_across_a_restart(postgres, tmp_path):
    store = postgres.new_url()
    auth_file = tmp_path / "auth.json"
    write_auth(auth_file)
    first = Serve(tmp_path, "first", store, auth_file)
    try:
        banner = first.out.read_text()
        assert "store PostgreSQL xsg@127.0.0.1:" in banner and "(schema t" in banner
        base = first.url
        assert requests.post(f"{base}/streams", json=WEATHER, headers=auth("nea"),
                             timeout=60).status_code == 201
        r = requests.post(f"{base}/policies", data=(POLICIES / "nea-weather-policy.xml")
                          .read_bytes(), headers={**auth("nea"), **XML}, timeout=60)
        assert r.status_code == 201, r.text
        r = requests.post(f"{base}/requests", data=(POLICIES / "lta-request.xml").read_bytes(),
                          headers={**auth("lta"), **XML}, timeout=180)
        assert r.status_code == 201, r.text
        handle = r.json()["id"]
        assert first.stop() == 0, first.err.read_text(errors="replace")[-5000:]
    finally:
        first.kill()
    # everything it kept is in the database, nothing in SQLite files
    assert not list(first.data.rglob("*.db"))

    second = Serve(tmp_path, "second", store, auth_file)  # a fresh data directory
    try:
        base = second.url
        listed = requests.get(f"{base}/handles", headers=auth("lta"), timeout=60).json()
        assert [(h["id"], h["state"]) for h in listed["handles"]] == [(handle, "live")]
        assert [p["id"] for p in requests.get(f"{base}/policies", headers=auth("nea"),
                                              timeout=60).json()] == [
            "urn:xsg:example:weather:nea-policy"]
        assert [s["name"] for s in requests.get(f"{base}/streams", headers=auth("nea"),
                                                timeout=60).json()["streams"]] == ["weather"]
        kinds = [e["kind"] for e in requests.get(f"{base}/audit", headers=auth("nea"),
                                                 timeout=60).json()["entries"]]
        assert kinds == ["stream-registered", "policy-added", "granted", "handle-resumed"]
        assert second.stop() == 0, second.err.read_text(errors="replace")[-5000:]
    finally:
        second.kill()
    assert not list(second.data.rglob("*.db"))
