"""The real thing: the gateway's HTTP server on a loopback port, `requests` as the client, and the
`xsg` CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from urllib.parse import quote

import pytest
import requests

from pep.cli import main
from pep.http.app import create_app
from pep.services import build_services
from server.serving import HttpServer
from tests.pdp.api.conftest import (
    LTA_REQUEST_JSON,
    LTA_REQUEST_XML,
    POLICIES,
    REPO,
    TOKENS,
    WEATHER_ID,
    WEATHER_POLICY,
    XML,
    make_config,
    simple_policy,
    xml_request,
)


@pytest.fixture
def live(tmp_path):
    services = build_services(make_config(tmp_path))
    server = HttpServer(create_app(services=services), host="127.0.0.1", port=0, threads=4,
                           max_threads=64)
    server.start()
    yield server, services
    server.stop()
    services.close()


def auth(who):
    return {"Authorization": f"Bearer {TOKENS[who]}"}


def test_http_end_to_end(live):
    server, _ = live
    url = server.url
    assert server.port > 0
    r = requests.get(f"{url}/health", timeout=5)
    assert r.status_code == 200 and r.json()["status"] == "ready"

    def decide(who, subject, resource):
        r = requests.post(f"{url}/pdp", data=xml_request(subject, resource), timeout=5,
                          headers={**auth(who), "Content-Type": XML,
                                   "Accept": "application/xacml+json"})
        assert r.status_code == 200, r.text
        return r.json()["Response"][0]["Decision"]

    assert decide("other", "other", "rain") == "NotApplicable"
    r = requests.post(f"{url}/policies", data=simple_policy("urn:test:rain", "rain", "other"),
                      headers={**auth("nea"), "Content-Type": XML}, timeout=5)
    assert r.status_code == 201 and r.json()["id"] == "urn:test:rain"
    assert decide("other", "other", "rain") == "Permit"
    r = requests.delete(f"{url}/policies/{quote('urn:test:rain', safe='')}", headers=auth("nea"),
                        timeout=5)
    assert r.status_code == 204
    assert decide("other", "other", "rain") == "NotApplicable"

    # a chunked upload (no Content-Length) over the limit is still refused
    def chunks():
        for _ in range(200):
            yield b"x" * 65536
    r = requests.post(f"{url}/policies", data=chunks(), timeout=10,
                      headers={**auth("nea"), "Content-Type": XML})
    assert r.status_code == 413

    server.stop()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/health", timeout=2)


def test_thread_pool_grows_while_requests_hold_threads(tmp_path):
    services = build_services(make_config(tmp_path))
    app = create_app(services=services)
    release = threading.Event()
    entered = []

    @app.get("/test-block")
    def block():  # stands in for a long-lived streaming reader
        entered.append(1)
        release.wait(10)
        return "done"

    server = HttpServer(app, port=0, threads=2, max_threads=40)
    server.start()
    results = []
    try:
        workers = [threading.Thread(target=lambda: results.append(
            requests.get(f"{server.url}/test-block", timeout=15).status_code)) for _ in range(12)]
        for w in workers:
            w.start()
        deadline = time.monotonic() + 10
        while len(entered) < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(entered) == 12, "requests were not all served concurrently"
        # a thread started for each request that found none idle, at once (no polling)
        assert server.thread_count >= 12
        # and the server still answers other callers meanwhile, on a thread of its own
        assert requests.get(f"{server.url}/health", timeout=5).status_code == 200
        assert server.thread_count >= 13
        release.set()
        for w in workers:
            w.join(15)
        assert results == [200] * 12
    finally:
        release.set()
        server.stop()
        services.close()


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_policy_commands_against_the_server(live, capsys, tmp_path):
    server, services = live
    common = ["policy", "--url", server.url, "--token", TOKENS["nea"]]
    new = tmp_path / "rain.xml"
    new.write_bytes(simple_policy("urn:test:rain", "rain", "other"))

    code, out, _ = run_cli(capsys, *common, "add", str(new))
    assert code == 0 and "added urn:test:rain version 1.0 (store version 6)" in out
    code, out, _ = run_cli(capsys, *common, "list")
    assert code == 0 and "urn:test:rain" in out and WEATHER_ID in out
    code, out, _ = run_cli(capsys, *common, "list", "--json")
    assert {p["id"] for p in json.loads(out)} >= {"urn:test:rain", WEATHER_ID}
    code, out, _ = run_cli(capsys, *common, "show", "urn:test:rain")
    assert code == 0 and 'PolicyId="urn:test:rain"' in out

    v2 = tmp_path / "rain2.xml"
    v2.write_bytes(simple_policy("urn:test:rain", "rain", "other", effect="Deny", version="2.0"))
    code, out, _ = run_cli(capsys, *common, "update", "urn:test:rain", str(v2))
    assert code == 0 and "version 2.0" in out
    code, out, _ = run_cli(capsys, *common, "show", "urn:test:rain", "--version", "1.0")
    assert 'Effect="Permit"' in out
    code, out, _ = run_cli(capsys, *common, "show", "urn:test:rain", "--history")
    assert [h["version"] for h in json.loads(out)] == ["1.0", "2.0"]

    # refusals are printed clearly, with a non-zero status
    code, _, err = run_cli(capsys, *common, "add", str(new))
    assert code == 1 and "HTTP 409" in err and "already exists" in err
    broken = tmp_path / "broken.xml"
    broken.write_bytes(b"<Policy xmlns='urn:oasis:names:tc:xacml:3.0:core:schema:wd-17'>")
    code, _, err = run_cli(capsys, *common, "add", str(broken))
    assert code == 1 and "HTTP 400" in err and "line" in err
    code, _, err = run_cli(capsys, "policy", "--url", server.url, "--token", TOKENS["lta"],
                           "delete", "urn:test:rain")
    assert code == 1 and "HTTP 403" in err
    code, _, err = run_cli(capsys, "policy", "--url", server.url, "--token", "wrong", "list")
    assert code == 1 and "HTTP 401" in err
    code, _, err = run_cli(capsys, *common, "add", str(tmp_path / "missing.xml"))
    assert code == 2 and "cannot read" in err

    code, out, _ = run_cli(capsys, *common, "delete", "urn:test:rain")
    assert code == 0 and "deleted urn:test:rain" in out
    assert "urn:test:rain" not in services.policies.engine.policies


def test_cli_needs_a_token_and_a_reachable_gateway(capsys, monkeypatch):
    monkeypatch.delenv("XSG_TOKEN", raising=False)
    code, _, err = run_cli(capsys, "policy", "--url", "http://127.0.0.1:9", "list")
    assert code == 2 and "XSG_TOKEN" in err
    code, _, err = run_cli(capsys, "policy", "--url", "http://127.0.0.1:9", "--token", "t", "list")
    assert code == 1 and "cannot reach the gateway" in err


def cli(*argv, **kw):
    return subprocess.run([sys.executable, "-m", "pep.cli", *argv], capture_output=True,
                          text=True, cwd=REPO, timeout=60, **kw)


def test_pdp_decide_offline(capsys):
    # once through `python -m pep.cli`, the rest in process
    r = cli("pdp", "decide", "--policies", str(POLICIES), "--request", str(LTA_REQUEST_XML))
    assert r.returncode == 0, r.stderr
    assert "<Decision>Permit</Decision>" in r.stdout
    assert r.stdout.count("<Obligation ") == 3 and "rainrate &gt; 5" in r.stdout
    code, out, _ = run_cli(capsys, "pdp", "decide", "--policies", str(POLICIES),
                           "--request", str(LTA_REQUEST_JSON))
    result = json.loads(out)["Response"][0]
    assert code == 0 and result["Decision"] == "Permit" and len(result["Obligations"]) == 3
    code, out, _ = run_cli(capsys, "pdp", "decide", "--policies", str(WEATHER_POLICY),
                           "--request", str(LTA_REQUEST_JSON), "--format", "xml")
    assert out.startswith("<?xml") and "Permit" in out
    code, _, err = run_cli(capsys, "pdp", "decide", "--policies", str(POLICIES),
                           "--request", "/nonexistent.xml")
    assert code == 2 and "cannot read /nonexistent.xml" in err
    code, _, err = run_cli(capsys, "pdp", "decide", "--policies", str(POLICIES),
                           "--request", str(WEATHER_POLICY))
    assert code == 2 and "invalid request" in err
    code, _, err = run_cli(capsys, "pdp", "decide", "--policies", str(POLICIES),
                           "--request", str(LTA_REQUEST_XML), "--root-policy", "urn:absent")
    assert code == 2 and "urn:absent" in err


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "xsg policy add" in out and "xsg pdp decide" in out
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--root-combining" in out and "--spark-master" in out


def _wait_for_banner(proc: subprocess.Popen, out_path, timeout: float) -> list[str]:
    """The child's stdout lines up to the banner's last line (`try:`), read from a file: the test
    never blocks on a pipe while the child lives (a child writing more than a pipe holds to a
    pipe nobody reads would block, and a read of a live child's pipe never returns)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = out_path.read_text(errors="replace").splitlines()
        if any(line.strip().startswith("try:") for line in lines) or proc.poll() is not None:
            return lines
        time.sleep(0.1)
    return out_path.read_text(errors="replace").splitlines()


def test_xsg_serve_embedded_defaults_and_graceful_stop(tmp_path):
    """No --auth: demo tokens are generated and printed; the store is seeded; SIGTERM stops it."""
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "pep.cli", "serve", "--port", "0", "--data-dir",
             str(tmp_path / "data"), "--policies", str(POLICIES)],
            stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        lines = _wait_for_banner(proc, out_path, timeout=120)
        tokens, roles, url = {}, {}, None
        for line in lines:
            if line.startswith("xsg gateway listening on "):
                url = line.split()[4]
            parts = line.split(None, 2)
            if len(parts) == 3 and parts[0] in ("nea", "lta", "other"):
                tokens[parts[0]], roles[parts[0]] = parts[1], parts[2]
        if not (url and set(tokens) == {"nea", "lta", "other"}):
            proc.kill()
            proc.wait(timeout=30)
            pytest.fail("no banner:\n" + "\n".join(lines) + "\n--- stderr ---\n"
                        + err_path.read_text(errors="replace")[-5000:])
        assert "5 policies loaded (5 seeded" in "\n".join(lines)
        # the banner names each subject's roles as the PDP sees them, and who may administer
        assert roles["nea"] == "roles: data-owner  + admin"
        assert roles["lta"] == "roles: consumer"
        assert roles["other"].startswith("roles: consumer, port-authority")
        auth_file = tmp_path / "data" / "auth.json"
        assert oct(auth_file.stat().st_mode & 0o777) == "0o600"
        assert (tmp_path / "data" / "policies.db").exists()
        r = requests.get(f"{url}/policies", headers={"Authorization": f"Bearer {tokens['nea']}"},
                         timeout=5)
        assert r.status_code == 200 and len(r.json()) == 5
        r = requests.post(f"{url}/pdp", data=LTA_REQUEST_XML.read_bytes(), timeout=5,
                          headers={"Authorization": f"Bearer {tokens['lta']}", "Content-Type": XML})
        assert b"Permit" in r.content
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
            pytest.fail("xsg serve did not stop within 60 s of SIGTERM:\n"
                        + err_path.read_text(errors="replace")[-5000:])
        assert code == 0, err_path.read_text(errors="replace")[-5000:]
        assert "stopping..." in out_path.read_text()
        # one log format: Spark's JVM lines look like ours, not like log4j's default
        err = err_path.read_text(errors="replace")
        assert "Using Spark's default log4j profile" not in err
        assert not re.search(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d ", err, re.MULTILINE), err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_xsg_serve_refuses_a_bad_auth_file(tmp_path, capsys):
    bad = tmp_path / "auth.json"
    bad.write_text('[{"token": "x"}]')
    code, _, err = run_cli(capsys, "serve", "--port", "0", "--data-dir", str(tmp_path / "d"),
                           "--auth", str(bad))
    assert code == 2
    assert "cannot start the gateway" in err and "'subject' must be a non-empty string" in err


def test_cli_stream_commands_show_and_delete_a_stream(live, capsys):
    server, services = live
    r = requests.post(f"{server.url}/streams", headers=auth("nea"), timeout=5, json={
        "name": "cli_gauge", "source": {"kind": "ingest"}, "description": "for the CLI",
        "schema": [{"name": "v", "type": "double"}]})
    assert r.status_code == 201, r.text
    common = ["stream", "--url", server.url, "--token", TOKENS["nea"]]
    code, out, _ = run_cli(capsys, *common, "list")
    assert code == 0 and "cli_gauge" in out
    code, out, _ = run_cli(capsys, *common, "show", "cli_gauge")
    assert code == 0 and json.loads(out)["description"] == "for the CLI"
    code, out, _ = run_cli(capsys, *common, "delete", "cli_gauge", "--dry-run")
    assert code == 0 and "would revoke 0 live handle(s)" in out
    assert services.catalog.get("cli_gauge") is not None
    code, _, err = run_cli(capsys, "stream", "--url", server.url, "--token", TOKENS["lta"],
                           "delete", "cli_gauge")
    assert code == 1 and "HTTP 403" in err
    code, _, err = run_cli(capsys, *common, "delete", "cli_gauge", "--keep-data", "-5")
    assert code == 1 and "HTTP 400" in err and "keep_data" in err
    code, out, _ = run_cli(capsys, *common, "delete", "cli_gauge", "--keep-data", "60")
    assert code == 0 and "deleted cli_gauge: 0 handle(s) revoked; files kept until" in out
    code, _, err = run_cli(capsys, *common, "show", "cli_gauge")
    assert code == 1 and "HTTP 404" in err
