"""`make cluster` with edges, as a user runs it (deploy/local-cluster.sh, XSG_EDGES=2): its own
PostgreSQL, a Kafka broker with SCRAM users and ACLs (pep.delivery.grants), a gateway process
delivering through plan topics, two edges and the proxy in front relaying reads from them.
A handle requested and read through the proxy gets exactly the rows its policy allows, the
gateway itself sends readers to an edge, and SIGTERM stops everything, Kafka and PostgreSQL
included (Spark is `local[1]` here: the standalone master has tests of its own)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.e2e.test_cluster import ND, XML, records, register
from tests.e2e.test_restart_and_sse import sensor_request
from tests.processes import free_ports

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_make_cluster_with_edges_serves_reads_through_the_proxy_and_stops_on_sigterm(tmp_path):
    # PostgreSQL runs as the `postgres` user when the suite runs as root: a folder it can reach
    home = Path(tempfile.mkdtemp(prefix="xsg-local-cluster-"))
    home.chmod(0o755)
    env = {**os.environ, "XSG_SPARK_MASTER": "local[1]", "XSG_PROCESSES": "1",
           "XSG_EDGES": "2", "XSG_LOCAL_CLUSTER_DIR": str(home),
           "XSG_PORT": str(free_ports(1)), "XSG_FIRST_PORT": str(free_ports(1)),
           "XSG_FIRST_EDGE_PORT": str(free_ports(2)), "XSG_KAFKA_PORT": str(free_ports(3)),
           "XSG_PG_PORT": str(free_ports(1))}
    out = tmp_path / "cluster.out"
    with out.open("wb") as sink:
        script = subprocess.Popen([str(REPO / "deploy" / "local-cluster.sh")], cwd=REPO,
                                  env=env, stdout=sink, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 420
        while "Ctrl-C stops everything." not in out.read_text(errors="replace"):
            assert script.poll() is None and time.monotonic() < deadline, \
                out.read_text(errors="replace")[-5000:]
            time.sleep(0.5)
        banner = out.read_text()
        proxy = f"http://127.0.0.1:{env['XSG_PORT']}"
        edges = [f"http://127.0.0.1:{int(env['XSG_FIRST_EDGE_PORT']) + k}" for k in (0, 1)]
        assert f"edges     {edges[0]} {edges[1]}" in banner, banner
        tokens = {e["subject"]: e["token"]
                  for e in json.loads((home / "data" / "auth.json").read_text())}

        def auth(who: str, **extra: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {tokens[who]}", **extra}

        register(proxy, "readings", auth("nea"))  # the demo tokens, not the suite's
        r = requests.post(f"{proxy}/requests", headers=auth("lta", **XML), timeout=180,
                          data=sensor_request("readings"))
        assert r.status_code == 201, r.text
        handle = r.json()["id"]
        gateway = f"http://127.0.0.1:{env['XSG_FIRST_PORT']}"
        moved = requests.get(f"{gateway}/handles/{handle}", allow_redirects=False, timeout=30,
                             headers=auth("lta", Accept=ND["Content-Type"]))
        assert moved.status_code == 307, moved.text  # delivered through its plan topic
        assert moved.headers["Location"].split("/handles/")[0] in edges
        got: list[dict] = []

        def read() -> None:
            with requests.get(f"{proxy}/handles/{handle}", stream=True, timeout=(5, 60),
                              allow_redirects=False,
                              headers=auth("lta", Accept=ND["Content-Type"])) as resp:
                assert resp.status_code == 200, resp.text  # relayed by the proxy
                for raw in resp.iter_lines(chunk_size=1):
                    line = json.loads(raw) if raw else {}
                    if "row" in line:
                        got.append(line)
                        if len(got) == 3:
                            return
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(1.0)
        r = requests.post(f"{proxy}/streams/readings/records", timeout=60,
                          data=records([1.0, -2.0, 3.0, -4.0, 5.0], 0),
                          headers=auth("nea", **ND))
        assert r.status_code in (200, 201), r.text
        reader.join(120)
        assert [g["row"]["value"] for g in got] == [1.0, 3.0, 5.0]
        assert all(set(g["row"]) == {"ts", "value"} for g in got)  # `secret` projected away
        ids = [g["id"] for g in got]
        assert ids == sorted(set(ids))
        # the proxy follows the gateway's invalidation feed, so it caches: a repeated request
        # is a hit (one process here; with several the proxy forwards without caching)
        deadline = time.monotonic() + 60
        while requests.get(f"{proxy}/proxy/stats", timeout=10).json()["feed"]["state"] \
                != "live":
            assert time.monotonic() < deadline, "the proxy's feed never came up"
            time.sleep(0.5)
        again = requests.post(f"{proxy}/requests", headers=auth("lta", **XML), timeout=180,
                              data=sensor_request("readings"))
        assert again.status_code == 200 and again.json()["id"] == handle, again.text
        third = requests.post(f"{proxy}/requests", headers=auth("lta", **XML), timeout=180,
                              data=sensor_request("readings"))
        assert third.headers["X-XSG-Cache"] == "hit", third.headers
    finally:
        if script.poll() is None:
            script.send_signal(signal.SIGTERM)  # the script stops what it started
        try:
            script.wait(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)
    tail = out.read_text(errors="replace")
    assert "local-cluster: Kafka stopped" in tail and "PostgreSQL stopped" in tail, tail[-3000:]
    assert script.returncode == 0, tail[-3000:]
