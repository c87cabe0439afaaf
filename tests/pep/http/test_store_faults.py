"""The PostgreSQL store's faults get clear answers: a store URL that is wrong or unreachable stops
`xsg serve` with a message naming the setting and where it was set; a store lost while the
gateway runs turns writes into 503 with the reason, leaves nothing half-applied (no handle
granted by a change that did not commit, no policy half-changed), and the gateway recovers by
itself when the store is back (the test stops and restarts the session's PostgreSQL server)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pep.cli import main
from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

REPO = Path(__file__).resolve().parents[3]
POLICIES = REPO / "policies" / "weather"
XML = {"Content-Type": "application/xacml+xml"}
WEATHER = {"name": "weather", "time_attribute": "samplingtime", "schema": [
    {"name": n, "type": t} for n, t in (("samplingtime", "timestamp"), ("station", "string"),
                                        ("rainrate", "double"), ("windspeed", "double"))]}
ID = "urn:xsg:example:weather:nea-policy"


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("argv, env, status, said", [
    (["--store", "mysql://u@h/db"], {}, 2,
     "--store: expected a PostgreSQL URL (postgresql://user@host:port/database), found "
     "mysql://..."),
    ([], {"XSG_STORE": "postgresql://u:secret-pw@h:notaport/db"}, 2,
     "environment variable XSG_STORE: the port 'notaport' is not a number from 1 to 65535"),
    (["--store", "postgresql://xsg:secret-pw@127.0.0.1:{port}/xsg"], {}, 1,
     "cannot start the gateway: store (--store): cannot use PostgreSQL at "
     "xsg@127.0.0.1:{port}/xsg (schema xsg): connection failed"),
])
def test_a_wrong_or_unreachable_store_stops_serve_naming_the_setting(tmp_path, capsys,
                                                                      monkeypatch, argv, env,
                                                                      status, said):
    port = _closed_port()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = main(["serve", "--port", "0", "--data-dir", str(tmp_path / "d"), "--no-start-spark",
                 *(a.format(port=port) for a in argv)])
    out, err = capsys.readouterr()
    assert code == status, err
    assert said.format(port=port) in err, err
    assert "secret-pw" not in out + err and "Traceback" not in err


def test_an_unreachable_store_named_in_the_file_stops_the_process(tmp_path):
    """As a user meets it: the process exits non-zero at once, one line, no traceback."""
    config = tmp_path / "xsg.toml"
    port = _closed_port()
    config.write_text(f'store = "postgresql://xsg@127.0.0.1:{port}/xsg"\nstore_timeout = 2\n')
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pep.cli", "serve", "--config", str(config),
                           "--port", "0", "--data-dir", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1, done.stderr
    assert f"store ({config}: store): cannot use PostgreSQL at xsg@127.0.0.1:{port}/xsg" \
        in done.stderr
    assert "Connection refused" in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 60  # it did not wait for Spark


def _wait_until(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


def test_a_store_lost_while_running_refuses_writes_and_recovers(postgres, tmp_path):
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path / "data", runtime, store=postgres.new_url())
    client = app.test_client()
    try:
        assert client.post("/streams", json=WEATHER, headers=auth_header("nea")).status_code == 201
        policy = (POLICIES / "nea-weather-policy.xml").read_bytes()
        assert client.post("/policies", data=policy,
                           headers=auth_header("nea", **XML)).status_code == 201
        request = (POLICIES / "lta-request.xml").read_bytes()
        r = client.post("/requests", data=request, headers=auth_header("lta", **XML))
        assert r.status_code == 201
        kept = r.json["id"]
        engine = services.policies.engine
        second = policy.replace(b"nea-policy", b"second")

        postgres.stop()
        try:
            # a policy change that cannot be stored changes nothing and revokes nothing
            r = client.delete(f"/policies/{ID}", headers=auth_header("nea"))
            assert r.status_code == 503, r.json
            assert "the store cannot be reached, nothing was changed" in r.json["error"]
            assert r.headers["Retry-After"].isdigit()
            # why, but not where the database is (the log says that)
            assert "refused" in r.json["error"] or "closed" in r.json["error"], r.json
            assert f"port {postgres.port}" not in r.json["error"]
            assert services.policies.engine is engine and ID in engine.policies
            assert services.handles.buffer(kept) is not None and kept in runtime.attached
            r = client.post("/policies", data=second, headers=auth_header("nea", **XML))
            assert r.status_code == 503
            assert services.policies.engine is engine
            # a grant that cannot be stored is no grant: nothing attached, no window kept (nea
            # may read its stream raw, and has no handle yet)
            r = client.post("/requests", data=request, headers=auth_header("nea", **XML))
            assert r.status_code == 503, r.json
            assert set(runtime.attached) == {kept}
            assert services.windows.lookup("nea", "weather") is None
            assert len(services.windows) == 1 and services.windows.booking(kept) is not None
            r = client.post("/streams", json={**WEATHER, "name": "other"},
                            headers=auth_header("nea"))
            assert r.status_code == 503 and "the store cannot be reached" in r.json["error"]
            assert services.catalog.visibility("other") is None
        finally:
            postgres.start()

        # back by itself: the same gateway object, no restart
        r = _wait_until(lambda: (lambda r: r if r.status_code == 201 else None)(
            client.post("/policies", data=second, headers=auth_header("nea", **XML))))
        assert r is not None and r.status_code == 201
        assert client.post("/streams", json={**WEATHER, "name": "other"},
                           headers=auth_header("nea")).status_code == 201
        r = client.post("/requests", data=request, headers=auth_header("nea", **XML))
        assert r.status_code == 201 and r.json["new"]  # its window was left free
        assert client.delete(f"/policies/{ID}", headers=auth_header("nea")).status_code == 204
        listed = client.get("/handles", headers=auth_header("lta")).json["handles"]
        assert [(h["id"], h["state"]) for h in listed] == [(kept, "live")]
        # every version once, in order: the one before, then the two after the outage
        assert services.store.store_version() == 3
        assert [h.store_version for h in services.store.history(ID)] == [1, 3]
    finally:
        services.close()
