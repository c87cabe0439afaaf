"""The proxy writes its log lines as the gateway does (common/logs.py): an operator's pipeline
that reads `xsg serve --log-format json` reads `xsg proxy --log-format json` too."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests.processes import free_port

REPO = Path(__file__).resolve().parents[2]


def test_proxy_logs_json_lines_with_utc_times_and_stops_with_one_info_line(tmp_path):
    port = free_port()
    err = tmp_path / "proxy.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith("XSG_PROXY_")}
    with err.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "--upstream", "http://127.0.0.1:9", "--port",
             str(port), "--log-format", "json"],
            cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
            stderr=sink)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                requests.get(f"http://127.0.0.1:{port}/proxy/health", timeout=1)
                break
            except requests.ConnectionError:
                assert proc.poll() is None, err.read_text()
                time.sleep(0.2)
        else:
            raise AssertionError("the proxy did not listen: " + err.read_text())
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, err.read_text()
    lines = [json.loads(line) for line in err.read_text().splitlines()]  # every line is JSON
    assert lines, "the proxy wrote no log line"
    for line in lines:
        assert line["time"].endswith("Z") and "T" in line["time"], line
        assert {"level", "logger", "message"} <= line.keys(), line
    warnings = [line["message"] for line in lines if line["level"] == "WARNING"]
    assert any("no feed token" in m for m in warnings), warnings
    assert not [line for line in lines if line["level"] in ("ERROR", "CRITICAL")], lines
    stop = [i for i, line in enumerate(lines) if "received signal" in line["message"]]
    assert stop == [len(lines) - 1] and lines[-1]["level"] == "INFO", lines  # one INFO line


def test_an_unknown_log_format_is_refused_at_the_command_line():
    run = subprocess.run([sys.executable, "-m", "proxy", "--upstream", "http://127.0.0.1:9",
                          "--log-format", "xml"], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert run.returncode == 2 and "--log-format" in run.stderr, run.stderr
