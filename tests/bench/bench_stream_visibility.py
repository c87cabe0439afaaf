"""What restricted streams cost a listing: GET /streams with many streams and policies.

    .venv/bin/python tests/bench/bench_stream_visibility.py [--streams 1000] [--rounds 7]

A gateway in this process (real PDP, catalogue, SQLite; no Spark: nothing here starts a query),
`--streams` streams owned by `acme`, each with its own policy confined to it (a Permit for one
subject and one action id that no default probe tries, then Deny for everyone else), and
GET /streams through the app (Flask's test client: no network) as:
  * `root`, an administrator: sees everything without asking the PDP;
  * `lta`, permitted on every tenth stream: 90% of the restricted streams are probed in vain
    (three decisions each: the policy's action id, read, subscribe);
  * `nobody`, permitted on none;
each once with every stream `listed` and once with every stream `restricted`. Median of
`--rounds` listings; printed, never asserted. The response's JSON encoding of the streams'
schemas is part of every figure (it is what a listing does anyway).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.pep.http.test_stream_visibility import SECRET, auth_entries, bearer, policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    from pep.config import GatewayConfig
    from pep.http.app import create_app
    from pep.services import build_services
    from tests.pep.conftest import RecordingRuntime

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        (data / "auth.json").write_text(json.dumps(
            auth_entries() + [{"token": "tok-nobody-0123456789", "subject": "nobody",
                               "roles": ["consumer"]}]))
        config = GatewayConfig(data_dir=data, auth_file=data / "auth.json", policies_dir=None,
                               port=0)
        services = build_services(config, runtime=RecordingRuntime())
        client = create_app(services=services).test_client()
        started = time.perf_counter()
        documents = []
        for i in range(args.streams):
            name = f"s{i:04d}"
            services.catalog.register(name, "acme", SECRET["schema"])
            documents.append(policy(stream=name, who="lta" if i % 10 == 0 else "someone",
                                    policy_id=f"urn:bench:p{i}"))
        services.policies.add_many(documents, owner="acme")
        print(f"{args.streams} streams and policies set up in "
              f"{time.perf_counter() - started:.1f} s")

        def listing(who: str) -> tuple[float, int]:
            headers = bearer(who) if who != "nobody" else {
                "Authorization": "Bearer tok-nobody-0123456789"}
            times = []
            count = 0
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                r = client.get("/streams", headers=headers)
                times.append(time.perf_counter() - t0)
                count = len(r.json["streams"])
            return statistics.median(times), count

        # the first restricted listing after a policy change also gathers the action ids
        for visibility in ("listed", "restricted"):
            for i in range(args.streams):
                services.catalog.update(f"s{i:04d}", {"visibility": visibility}, by="acme")
            if visibility == "restricted":
                t0 = time.perf_counter()
                services.visibility.actions_for(services.policies.engine, "s0000")
                print(f"action ids gathered from {args.streams} policies (once per policy "
                      f"change): {(time.perf_counter() - t0) * 1e3:.1f} ms")
            for who in ("root", "lta", "nobody"):
                seconds, count = listing(who)
                print(f"{visibility:>10}  {who:<6}  {seconds * 1e3:8.1f} ms  "
                      f"({count} streams listed, {seconds / args.streams * 1e6:.0f} us per "
                      f"stream)")
        services.close()


if __name__ == "__main__":
    main()
