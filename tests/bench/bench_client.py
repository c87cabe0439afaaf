"""Benchmark of the xsg client: rows/s it takes from one handle, against raw `requests` line
reading of the same handle in the same run.

Run: .venv/bin/python tests/bench/bench_client.py [--rows N] [--passes P]

A real gateway (`xsg serve`, a child process, as the client's tests start it), one stream of
eight attributes (a timestamp, five doubles, a long, a string), one handle holding N rows in its
buffer (the gateway keeps 10,000 per handle: N is at most that). Each pass reads all N rows
from the start of the handle, once per reader, the readers taking turns:
- raw lines: `requests`, `iter_lines(chunk_size=65536)`, no decoding (the floor of reading);
- raw JSON: the same lines `json.loads`-ed, the rows picked out (what a consumer without the
  client must do at least; no types);
- client rows: `Client.open(...).rows()`, typed dicts (the timestamp parsed to a datetime);
- client events: `events()`, every event as an object (`Row(id, values)`);
- client batches: `batches(max_rows=N)`, Arrow record batches typed by the schema.
Each reader's figure is the median of its passes; the ratio that matters is client rows /
raw JSON (aim: at least 0.9). Only loopback traffic; the gateway is stopped at the end.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.harness import machine
from tests.client.conftest import ServeProcess, bearer
from tests.pep.conftest import TOKENS
from xsg_client import Client

SCHEMA = [("ts", "timestamp"), ("temperature", "double"), ("humidity", "double"),
          ("rainrate", "double"), ("windspeed", "double"), ("barometer", "double"),
          ("station", "long"), ("label", "string")]


def records(n: int) -> list[dict]:
    return [{"ts": f"2024-05-{1 + i // 86400 % 28:02d}T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:"
                   f"{i % 60:02d}.{i * 7919 % 1000000:06d}Z",
             "temperature": 20 + i % 17 / 3, "humidity": 50 + i % 13 / 7, "rainrate": i % 29 / 3,
             "windspeed": i % 11 / 5, "barometer": 1000 + i % 7 / 9, "station": 2 ** 40 + i,
             "label": f"station-{i % 100}"} for i in range(n)]


def raw_lines(url: str, n: int) -> int:
    got = 0
    with requests.get(url, headers=bearer("lta", Accept="application/x-ndjson"), stream=True,
                      timeout=60) as r:
        for line in r.iter_lines(chunk_size=65536):
            if line and line.startswith(b'{"id":') and b'"row":' in line:
                got += 1
                if got == n:
                    break
    return got


def raw_json(url: str, n: int) -> int:
    got = 0
    loads = json.loads
    with requests.get(url, headers=bearer("lta", Accept="application/x-ndjson"), stream=True,
                      timeout=60) as r:
        for line in r.iter_lines(chunk_size=65536):
            if not line:
                continue
            row = loads(line).get("row")
            if row is not None:
                got += 1
                if got == n:
                    break
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=7)
    args = parser.parse_args()
    n = min(args.rows, 10_000)
    print(f"machine: {machine('httpx', 'requests')}")
    with tempfile.TemporaryDirectory(prefix="xsg-bench-client-") as work:
        gateway = ServeProcess(Path(work), heartbeat=15.0)
        started = time.monotonic()
        gateway.start()
        print(f"gateway up in {time.monotonic() - started:.1f} s")
        try:
            gateway.stream("bench", SCHEMA, {})
            client = Client(gateway.url, TOKENS["lta"])
            grant = client.request("bench")
            data = records(n)
            for i in range(0, n, 2500):
                gateway.append("bench", data[i:i + 2500])
            deadline = time.monotonic() + 120
            while raw_json(grant.handle, n) < n:  # (returns at the handle's end otherwise)
                if time.monotonic() > deadline:
                    raise SystemExit("the handle did not get its rows in 120 s")
            schema = client.open(grant).schema  # once: readers below skip describing it

            def client_rows(url: str, rows: int) -> int:
                got = 0
                with client.open(url, schema=schema) as stream:
                    for _ in stream.rows():
                        got += 1
                        if got == rows:
                            break
                return got

            def client_events(url: str, rows: int) -> int:
                got = 0
                with client.open(url, schema=schema) as stream:
                    for _ in stream.events():
                        got += 1
                        if got == rows:
                            break
                return got

            def client_batches(url: str, rows: int) -> int:
                with client.open(url, schema=schema) as stream:
                    for batch in stream.batches(max_rows=rows, max_wait=30):
                        return int(batch.num_rows)
                return 0

            readers: dict[str, Callable[[str, int], int]] = {
                "raw lines (requests)": raw_lines, "raw JSON (requests + json)": raw_json,
                "client rows()": client_rows, "client events()": client_events,
                "client batches()": client_batches}
            rates: dict[str, list[float]] = {name: [] for name in readers}
            per_cpu: dict[str, list[float]] = {name: [] for name in readers}
            for _ in range(args.passes):
                for name, read in readers.items():
                    t0, c0 = time.perf_counter(), time.process_time()
                    got = read(grant.handle, n)
                    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
                    assert got == n, f"{name} read {got} of {n} rows"
                    rates[name].append(n / elapsed)
                    per_cpu[name].append(n / max(cpu, 1e-6))
            print(f"\n{n} rows per pass (a handle's buffer), {args.passes} passes, medians; "
                  "rows per second of wall clock, and per second of this process's CPU (the "
                  "reader's own cost, steadier on a loaded machine):")
            for name in readers:
                wall, cpu = rates[name], per_cpu[name]
                print(f"  {name:<28} {statistics.median(wall):>10,.0f} rows/s "
                      f"(min {min(wall):,.0f}, max {max(wall):,.0f}); "
                      f"{statistics.median(cpu):>10,.0f} rows/CPU-s")
            for figures, unit in ((rates, "rows/s"), (per_cpu, "rows/CPU-s")):
                base = statistics.median(figures["raw JSON (requests + json)"])
                print(f"client rows() / raw JSON, {unit}: "
                      f"{statistics.median(figures['client rows()']) / base:.2f}x (aim: at "
                      f"least 0.9x); client batches() / raw JSON: "
                      f"{statistics.median(figures['client batches()']) / base:.2f}x")
            client.close()
        finally:
            gateway.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
