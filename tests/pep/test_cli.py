"""The `xsg` command as operators meet it: version, help, settings, logs, start-up checks."""
from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import requests

from pep.cli import main
from pep.cli.logs import configure_logging, flush_repeats
from pep.log_repeats import repeating
from pep.config import SERVE_DEFAULTS, GatewayConfig, settings
from pep.http.app import create_app
from pep.services import build_services
from tests.pdp.api.conftest import AUTH_ENTRIES, LTA_REQUEST_XML, TOKENS, XML, bearer

REPO = Path(__file__).resolve().parents[2]
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version_comes_from_the_package_metadata(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"xsg {version('xsg')}"


def test_bare_xsg_prints_help_and_succeeds(capsys):
    code, out, _ = run(capsys)
    assert code == 0 and "usage: xsg" in out and "serve" in out and "examples:" in out


def test_serve_help_shows_each_default_once(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "(default: None" not in out and "%(default)" not in out
    for setting in settings(SERVE_DEFAULTS):
        assert out.count(f"env {setting.env})") == 1, setting.name
        assert out.count(f"(default: {setting.default_text}; env {setting.env})") == 1, setting.name
    assert out.count("(default: 8080;") == 1
    assert "flags > environment > file > defaults" in out


def test_a_port_in_use_is_reported_at_once_before_spark(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pep.cli", "serve", "--port", str(port), "--data-dir",
             str(tmp_path / "data")], capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1, proc.stderr
    assert f"127.0.0.1:{port} is already in use" in proc.stderr
    assert "Spark" not in proc.stdout and time.monotonic() - started < 30


def test_configuration_errors_are_usage_errors(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "xsg.toml"
    bad.write_text("port = 8080\nthreds = 4\n")
    code, _, err = run(capsys, "serve", "--config", str(bad))
    assert code == 2 and f"{bad}: unknown setting 'threds' (did you mean 'threads'?)" in err
    monkeypatch.setenv("XSG_THREADS", "lots")
    code, _, err = run(capsys, "serve")
    assert code == 2 and "XSG_THREADS: expected an integer, found 'lots'" in err
    monkeypatch.setenv("XSG_THREADS", "٣")  # int() reads it as 3
    code, _, err = run(capsys, "serve")
    assert code == 2 and "XSG_THREADS: expected an integer, found '٣'" in err


@pytest.mark.parametrize("argv", [["policy", "--timeout", "nan", "list"],
                                  ["policy", "--timeout", "٣", "list"],
                                  ["policy", "show", "x", "--store-version", "²"]])
def test_client_flags_are_ascii_finite_numbers(capsys, argv):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and "the value must be a" in capsys.readouterr().err


# -- logs -----------------------------------------------------------------------------------------

@pytest.fixture
def log_stream():
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    yield lambda fmt, level="INFO": configure_logging(level, fmt, stream) and stream
    for handler in list(root.handlers):
        if getattr(handler, "xsg", False):
            root.removeHandler(handler)
            for summary in handler.filters:
                summary.close()
    root.setLevel(level)


def gateway(tmp_path):
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps(AUTH_ENTRIES))
    services = build_services(GatewayConfig(data_dir=tmp_path / "data", auth_file=auth,
                                            policies_dir=None, port=0))
    return create_app(services=services).test_client(), services


def test_access_log_lines_in_json(tmp_path, log_stream):
    stream = log_stream("json")
    client, services = gateway(tmp_path)
    try:
        client.get("/handles?token=secret-in-query", headers=bearer("lta"))
        client.get("/handles/abcdef0123456789", headers=bearer("lta"))
        client.get("/health")
        client.get("/handles", headers={"Authorization": "Bearer wrong-token-value"})
    finally:
        services.close()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    access = [line for line in lines if line["logger"] == "xsg.access"]
    assert [(a["method"], a["path"], a["status"]) for a in access] == [
        ("GET", "/handles", 200), ("GET", access[1]["path"], 404), ("GET", "/health", 200),
        ("GET", "/handles", 401)]
    assert access[1]["path"].startswith("/handles/ref:") and "abcdef0123456789" not in \
        access[1]["path"]
    assert access[0]["subject"] == "lta" and access[3]["subject"] is None
    assert all(isinstance(a["duration_ms"], float) and a["time"].endswith("Z") for a in access)
    text = stream.getvalue()
    assert "secret-in-query" not in text and TOKENS["lta"] not in text
    assert "wrong-token-value" not in text


def test_text_lines_have_one_utc_timestamp_format_and_libraries_share_the_handler(log_stream):
    stream = log_stream("text")
    logging.getLogger("xsg.test").warning("hello")
    logging.getLogger("py4j.clientserver").warning("from py4j")
    logging.getLogger("SQLQueryContextLogger").warning("from pyspark")
    logging.getLogger("py4j.clientserver").info("a callback")  # py4j: warnings only
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and all(ISO_UTC.match(line) for line in lines), lines
    assert lines[0].endswith("WARNING xsg.test: hello")
    assert "py4j.clientserver: from py4j" in lines[1]
    assert "SQLQueryContextLogger: from pyspark" in lines[2]


def test_a_repeating_warning_is_written_once_then_summed_up(log_stream):
    """Issue 42: the gateway's log writes a warning marked as repeating once, then how often it
    came and the worst value, once per period (`pep.log_repeats`); the rest goes on as is."""
    stream = log_stream("text")
    handler = next(h for h in logging.getLogger().handlers if getattr(h, "xsg", False))
    lateness = logging.getLogger("pep.runtime.lateness")
    for i in range(40):
        lateness.warning("stream weather is falling behind: micro-batch %d took %.1f s", i,
                         0.3 + i / 20, extra=repeating("stream weather is falling behind",
                                                       0.3 + i / 20))
        if i == 20:
            logging.getLogger("xsg.test").warning("something else")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and all(ISO_UTC.match(line) for line in lines), lines
    assert lines[0].endswith("WARNING pep.runtime.lateness: stream weather is falling behind: "
                             "micro-batch 0 took 0.3 s")
    assert lines[1].endswith("WARNING xsg.test: something else")
    flush_repeats(handler)  # what `xsg serve` does as it ends (or a minute passing)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and re.search(
        r"WARNING pep.runtime.lateness: stream weather is falling behind: 40 times in the last "
        r"\d+\.\d s, worst 2\.2 s$", lines[2]), lines


# -- xsg serve in a child process, with Spark -----------------------------------------------------

def wait_for(path: Path, pattern: str, proc, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, path.read_text())
        if match:
            return match
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} not seen; stdout:\n{path.read_text()}")


def test_xsg_serve_from_a_config_file_with_progress_json_logs_and_token_reload(tmp_path):
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps(AUTH_ENTRIES))
    config = tmp_path / "xsg.toml"
    config.write_text(f'port = 0\ndata_dir = "data"\nauth_file = "{auth}"\n'
                      f'policies_dir = "{REPO / "policies"}"\nlog_format = "text"\n'
                      '[spark]\n"spark.sql.shuffle.partitions" = 2\n')
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pep.cli", "serve", "--config", str(config)],
            stdout=stdout, stderr=stderr, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO), "XSG_LOG_FORMAT": "json"})
    try:
        url = wait_for(out, r"xsg gateway listening on (\S+)", proc, 240).group(1)
        text = out.read_text()
        assert "starting Spark on local[*]" in text and re.search(
            r"starting Spark on local\[\*\] .*: done in \d+\.\d s", text), text
        r = requests.post(f"{url}/pdp", data=LTA_REQUEST_XML.read_bytes(), timeout=10,
                          headers={**bearer("lta"), "Content-Type": XML})
        assert r.status_code == 200
        # a new token file is used without a restart, a broken one is ignored
        auth.write_text(json.dumps([*AUTH_ENTRIES, {"token": "tok-new-0123456789",
                                                    "subject": "newcomer"}]))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = requests.get(f"{url}/handles", timeout=10,
                             headers={"Authorization": "Bearer tok-new-0123456789"})
            if r.status_code == 200:
                break
            time.sleep(0.3)
        assert r.status_code == 200
        auth.write_text("[not json")
        proc.send_signal(signal.SIGHUP)
        wait_for(err, "previous tokens stay in force", proc, 20)
        assert requests.get(f"{url}/handles", headers=bearer("lta"), timeout=10).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ours = [json.loads(line) for line in err.read_text().splitlines() if line.startswith("{")]
    access = [line for line in ours if line["logger"] == "xsg.access"]
    assert {"method": "POST", "path": "/pdp", "status": 200, "subject": "lta"}.items() <= \
        access[0].items()
    assert all(line["time"].endswith("Z") for line in ours)
    assert TOKENS["lta"] not in err.read_text() and "tok-new-0123456789" not in err.read_text()
