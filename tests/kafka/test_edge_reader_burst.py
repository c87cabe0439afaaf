"""A burst of readers connecting to one edge at once (a proxy or an edge restarted, an edge
killed: its readers all move to the others) while the store is slow to answer them does not make
the edge lose its store: a real `xsg edge` process with a small pool (--store-pool-size 2) and a
short store time-out (1 s), a real PostgreSQL store holding the handles, the session's broker
holding their plan topic's rows. The store is made slow as a loaded database is: for `SLOW`
seconds after the readers connect, another session holds `delivery_handles` locked, so that
every reader check waits (the edge's own looks at the store do not read that table).

Before (issue 45, 5,000 handles over 4 edges on a loaded machine): every connecting reader took
a pooled connection for its own check, the edge's look at the store waited behind them past the
pool's time-out, and the edge counted the store as lost and stopped serving everyone ("lost the
store", /health 503). Now the readers' checks are one query for all those waiting, on one
connection (`pep.edge.node.ReaderChecks`): every reader is served (or told 503 with Retry-After,
and served on its retry), the edge keeps serving throughout, and no reader of a revoked handle
gets anything but 410."""
from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.pep.conftest import TOKENS, write_auth
from tests.processes import Process

REPO = Path(__file__).resolve().parents[2]
LIVE = 300  # live handles of lta, one reader each, all connecting at once
REVOKED = 30  # revoked handles of lta, one reader each among them
ROWS = 3  # rows in the plan topic (each live reader reads them all)
FINAL = ("revoked", "released", "ended", "shutdown")
SLOW = 4.0  # seconds the store keeps the readers' checks waiting (more than LOST_AFTER, 3 s)


@pytest.fixture
def burst_edge(postgres, kafka_broker, tmp_path):
    """The store's handles, the plan topic's rows, and an edge process serving them."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    from common.db import open_storage
    from common.migrations import migrate
    from pep.delivery.control import ensure_topics
    from pep.delivery.settings import DeliverySettings
    from pep.delivery.store import DeliveryStore
    from pep.handles.records import HandleRecord, HandleState, HandleStore, StoredRequest
    from pep.streams.entries import SCHEMA as CATALOG_SCHEMA

    url = postgres.new_url()
    prefix = f"burst{int(time.time() * 1000) % 1000000}."
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT",
                                prefix=prefix)
    topic = settings.plan_prefix + "p"
    ensure_topics(AdminClient({"bootstrap.servers": kafka_broker.bootstrap}), settings,
                  (settings.control_topic, settings.acks_topic, topic))
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "acks": "all"})
    for i in range(ROWS):
        producer.produce(topic, json.dumps({"v": i}).encode(), f"m:e:1:{i}".encode())
    assert producer.flush(30) == 0
    storage = open_storage(tmp_path, url, pool_size=2)
    try:
        handles = HandleStore(storage.database("handles"))
        migrate(storage.database("streams"), CATALOG_SCHEMA)
        store = DeliveryStore(storage.database("delivery"))
        live = [f"live-{i:04d}" for i in range(LIVE)]
        revoked = [f"revoked-{i:04d}" for i in range(REVOKED)]
        for hid in live + revoked:
            state = HandleState.LIVE if hid in live else HandleState.REVOKED
            handles.insert(HandleRecord(hid, "lta", (), False, "s", "{}", "k", (),
                                        StoredRequest(b"<Request/>", "application/xacml+xml"),
                                        state=state))
            store.bind(hid, topic, 0)
    finally:
        storage.close()
    auth_file = tmp_path / "auth.json"
    write_auth(auth_file)
    env = {**os.environ, "PYTHONPATH": str(REPO), "XSG_STORE": url,
           "XSG_DELIVERY_BROKERS": kafka_broker.bootstrap,
           "XSG_DELIVERY_SECURITY_PROTOCOL": "PLAINTEXT", "XSG_DELIVERY_TOPIC_PREFIX": prefix,
           "XSG_MAX_READERS_PER_SUBJECT": str(2 * (LIVE + REVOKED)),
           "XSG_STORE_TIMEOUT": "1", "XSG_DATA_DIR": str(tmp_path / "data")}
    edge = Process(tmp_path, "edge", [
        sys.executable, "-u", "-m", "pep.cli", "edge", "--port", "0", "--id", "burst",
        "--auth", str(auth_file), "--store-pool-size", "2"], env)
    try:
        base = edge.wait_for("xsg edge burst on ", 120).split()[4]
        yield base, url, live, revoked, edge
    finally:
        edge.kill(signal.SIGTERM)


def _read(base: str, handle: str, start: threading.Barrier, deadline: float) -> dict:
    """One reader: its statuses (a 503 retried after its Retry-After) and the event ids of the
    rows it got (until it has them all or the stream ends)."""
    where = urlsplit(base)
    out: dict = {"statuses": [], "rows": [], "errors": [], "retry_after": []}
    start.wait()
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection(where.hostname, where.port, timeout=20)
        try:
            conn.request("GET", f"/handles/{handle}", headers={
                "Authorization": f"Bearer {TOKENS['lta']}", "Accept": "application/x-ndjson"})
            r = conn.getresponse()
            out["statuses"].append(r.status)
            if r.status == 503:
                out["retry_after"].append(r.getheader("Retry-After"))
                r.read()
                time.sleep(float(r.getheader("Retry-After") or 1))
                continue
            if r.status != 200:
                out["body"] = r.read().decode(errors="replace")
                return out
            while len(out["rows"]) < ROWS:
                line = r.readline()
                if not line:
                    break
                event = json.loads(line)
                if "row" in event:
                    out["rows"].append(event["id"])
                elif event.get("event") in FINAL:
                    out["final"] = event
                    break
            return out
        except (OSError, http.client.HTTPException) as exc:  # connection refused/reset: again
            out["errors"].append(repr(exc))
            time.sleep(0.2)
        finally:
            conn.close()
    return out


@pytest.mark.timeout(120)
def test_a_burst_of_readers_is_served_and_the_edge_keeps_its_store(burst_edge):
    import psycopg

    base, url, live, revoked, edge = burst_edge
    handles = live + revoked
    start = threading.Barrier(len(handles) + 1)
    deadline = time.monotonic() + 40
    results: dict[str, dict] = {}
    health: list[int] = []
    stop = threading.Event()

    def reader(handle: str) -> None:
        results[handle] = _read(base, handle, start, deadline)

    def watch_health() -> None:
        where = urlsplit(base)
        while not stop.is_set():
            conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
            try:
                conn.request("GET", "/health")
                health.append(conn.getresponse().status)
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()
            stop.wait(0.1)

    threads = [threading.Thread(target=reader, args=(h,), daemon=True) for h in handles]
    for t in threads:
        t.start()
    watcher = threading.Thread(target=watch_health, daemon=True)
    watcher.start()
    with psycopg.connect(url) as slow:  # the store slow to answer the readers' checks
        slow.execute("LOCK TABLE delivery_handles IN ACCESS EXCLUSIVE MODE")
        began = time.monotonic()
        start.wait()  # every reader connects now
        time.sleep(SLOW)
        slow.commit()
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()) + 5)
    took = time.monotonic() - began
    time.sleep(1.5)  # the edge's looks after the burst (LOST_AFTER: 3 s)
    stop.set()
    watcher.join(timeout=15)

    log = edge.out.read_text(errors="replace") + edge.err.read_text(errors="replace")
    assert "lost the store" not in log, log[-3000:]
    assert "cannot be reached" not in log, log[-3000:]  # the store answered all along
    assert health and set(health) == {200}, health  # it served throughout
    unserved = {h: r for h in live if (r := results.get(h, {})).get("rows") != list(
        range(1, ROWS + 1))}
    assert not unserved, (f"{len(unserved)} of {len(live)} live readers not served in "
                          f"{took:.1f} s; e.g. {list(unserved.items())[:3]}")
    for h in live:  # a 503 is load told as load: with Retry-After, and nothing else but 200
        assert set(results[h]["statuses"]) <= {200, 503}, results[h]
        assert all(a and a.isdigit() for a in results[h]["retry_after"]), results[h]
    for h in revoked:  # deny: 410 (or 503 and then 410), never a row
        r = results[h]
        assert r["rows"] == [] and r["statuses"][-1] == 410, r
        assert set(r["statuses"]) <= {410, 503}, r
        assert "revoked" in r["body"]
