"""From an identity change to the readers' `revoked`: how long a lowered clearance keeps reading.

    .venv/bin/python tests/bench/bench_identity_revocation.py [--background 1000]
                                                             [--changed 1,20] [--rounds 3]

A gateway in this process on its own HTTP server, the multilevel example (policies/mls: the
filter is `level <= {subject:clearance}`), no Spark (a recording stand-in: the revocation path
does not touch Spark until it detaches). `--background` medics with a live handle each whose
identity does not change, and N changed medics (each of `--changed`) with a live handle each,
read as NDJSON over HTTP by one thread per reader. Then their clearance is lowered from 2 to 1
in the auth file, by the two ways an operator does it:
  * `file`: the new file is put in place (os.replace); the gateway's watcher notices it (it looks
    every 0.25 s, so this includes up to 0.25 s of waiting for the next look);
  * `reload`: the same, then the reload `xsg serve` runs on SIGHUP, called at once.
Latency: from the moment the new file is in place to each reader's `revoked` event; p50 and max
over the readers of `--rounds` rounds (the clearance is raised again and handles reopened between
rounds). Printed, never asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MLS = REPO / "policies" / "mls"
XML = {"Content-Type": "application/xacml+xml"}
VITALS = {"name": "vitals", "source": {"kind": "ingest"},
          "schema": [{"name": n, "type": t} for n, t in (
              ("sid", "long"), ("wt", "double"), ("bp", "double"), ("pr", "double"),
              ("level", "long"))]}
NEA = "tok-nea-0123456789"


def medic(subject: str, clearance: int) -> dict:
    return {"token": f"tok-{subject}-0123456789", "subject": subject,
            "roles": ["medic", f"clearance:{clearance}"], "attributes": {"clearance": clearance}}


def entries(background: int, changed: list[str], clearance: int) -> list[dict]:
    out = [{"token": NEA, "subject": "nea", "roles": ["data-owner"], "admin": True}]
    out += [medic(f"bg{i}", 1) for i in range(background)]
    out += [medic(s, clearance) for s in changed]
    return out


def replace(path: Path, data: list[dict]) -> float:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
    return time.monotonic()


def read_until_final(url: str, token: str, ready: threading.Event, out: list) -> None:
    with requests.get(url, headers={"Authorization": f"Bearer {token}",
                                    "Accept": "application/x-ndjson"},
                      stream=True, timeout=120) as r:
        ready.set()
        for raw in r.iter_lines(chunk_size=1):
            if raw and json.loads(raw).get("event") == "revoked":
                out.append(time.monotonic())
                return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--background", type=int, default=1000)
    parser.add_argument("--changed", default="1,20")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(x) for x in args.changed.split(",")]

    from pep.config import GatewayConfig
    from pep.http.app import create_app
    from pep.services import build_services
    from server.serving import HttpServer
    from tests.pep.conftest import RecordingRuntime

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        auth = data / "auth.json"
        everyone = [f"m{i}" for i in range(max(sizes))]
        replace(auth, entries(args.background, everyone, 2))
        config = GatewayConfig(data_dir=data, auth_file=auth, policies_dir=None, port=0,
                               reevaluation_interval=0)
        services = build_services(config, runtime=RecordingRuntime())
        server = HttpServer(create_app(services=services), host="127.0.0.1", port=0,
                            threads=16)
        server.start()
        base = server.url
        session = requests.Session()
        nea = {"Authorization": f"Bearer {NEA}"}
        assert session.post(f"{base}/streams", json=VITALS, headers=nea).status_code == 201
        assert session.post(f"{base}/policies", headers={**nea, **XML},
                            data=(MLS / "vitals-policy.xml").read_bytes()).status_code == 201
        request = (MLS / "medic-request.xml").read_bytes()

        def open_handle(subject: str) -> str:
            r = session.post(f"{base}/requests", data=request, headers={
                "Authorization": f"Bearer tok-{subject}-0123456789", **XML})
            assert r.status_code == 201, r.text
            return r.json()["handle"]

        decided: list[str] = []  # who the revocation service decided again
        real = services.revocation.decide_and_plan

        def counting(engine, body, media_type, identity, *rest, **kwargs):
            decided.append(identity.subject)
            return real(engine, body, media_type, identity, *rest, **kwargs)

        services.revocation.decide_and_plan = counting
        t0 = time.perf_counter()
        for i in range(args.background):
            open_handle(f"bg{i}")
        print(f"{args.background} background handles opened in "
              f"{time.perf_counter() - t0:.1f} s; load average "
              f"{os.getloadavg()[0]:.1f}")

        for n in sizes:
            changed = everyone[:n]
            for how in ("file", "reload"):
                latencies: list[float] = []
                for _ in range(args.rounds):
                    replace(auth, entries(args.background, everyone, 2))
                    services.authenticator.reload()
                    arrivals: list[float] = []
                    threads = []
                    for subject in changed:
                        ready = threading.Event()
                        thread = threading.Thread(
                            target=read_until_final, daemon=True,
                            args=(open_handle(subject), f"tok-{subject}-0123456789", ready,
                                  arrivals))
                        thread.start()
                        ready.wait(10)
                        threads.append(thread)
                    time.sleep(0.3)  # every reader is attached to its buffer
                    lowered = entries(args.background, changed, 1) + [
                        medic(s, 2) for s in everyone[n:]]
                    start = replace(auth, lowered)
                    if how == "reload":
                        services.authenticator.reload()
                    for thread in threads:
                        thread.join(30)
                    latencies += [a - start for a in arrivals]
                    assert len(arrivals) == n, (len(arrivals), n)
                print(f"{n:>4} changed, {how:<6}: change -> revoked p50 "
                      f"{statistics.median(latencies) * 1e3:6.1f} ms, max "
                      f"{max(latencies) * 1e3:6.1f} ms ({len(latencies)} readers, "
                      f"{args.background} other live handles untouched)")
        others = sum(1 for subject in decided if subject.startswith("bg"))
        print(f"re-decisions: {len(decided)}, of the background handles: {others}; live "
              f"handles at the end: {len(services.handles.live())}")
        services.close_stream_side()
        server.stop()
        services.close()


if __name__ == "__main__":
    main()
