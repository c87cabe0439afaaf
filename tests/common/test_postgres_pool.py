"""The store's pool (`common.postgres`) on a real PostgreSQL server: a connection is checked with a
round trip only when it was idle a while or the server wrote to it meanwhile (a server that
stops does), so a restarted server still costs no failed request; a pool with no connection free
in time while the server answers is load (`StoreBusy`, a 503), not the store away."""
from __future__ import annotations

import logging
import threading

import pytest
from psycopg_pool import ConnectionPool

from common.db import StoreUnavailable
from common.postgres import PostgresBackend, StoreBusy


@pytest.mark.timeout(120)
def test_a_recent_connection_is_checked_without_a_round_trip_and_a_restart_fails_nothing(
        postgres, monkeypatch):
    checks: list[object] = []
    real = ConnectionPool.check_connection

    def counted(conn):  # the real check, counted
        checks.append(conn)
        real(conn)
    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    backend = PostgresBackend.connect(postgres.new_url(), pool_size=2, timeout=5.0)
    try:
        db = backend.database("pool")
        assert db.fetchone("SELECT 1") == (1,)  # a fresh connection: checked once
        first = len(checks)
        for _ in range(20):  # used within CHECK_IDLE_AFTER: no round trip of its own
            assert db.fetchone("SELECT 2") == (2,)
        assert len(checks) == first
        for mode in ("fast", "immediate"):  # the server ends its sessions: the next is checked
            postgres.stop(mode)
            postgres.start()
            assert db.fetchone("SELECT 3") == (3,)  # the first request after it, not a retry
            assert len(checks) > first
            first = len(checks)
    finally:
        backend.close()


@pytest.mark.timeout(60)
def test_no_connection_free_in_time_is_load_not_the_store_away(postgres, caplog):
    backend = PostgresBackend.connect(postgres.new_url(), pool_size=1, timeout=0.5)
    db = backend.database("busy")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with backend.connection():
            held.set()
            release.wait(10)
    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert held.wait(10)
        with caplog.at_level(logging.INFO, logger="common.postgres"):
            with pytest.raises(StoreBusy) as busy:
                db.fetchone("SELECT 1")
            with pytest.raises(StoreBusy):  # logged once, not per request
                db.fetchone("SELECT 1")
        assert isinstance(busy.value, StoreUnavailable)  # a 503 with Retry-After
        assert busy.value.headers["Retry-After"].isdigit()
        assert "busy" in str(busy.value) and "0.5 s" in str(busy.value)
        said = [r.getMessage() for r in caplog.records]
        assert not [m for m in said if "cannot be reached" in m], said
        assert len([m for m in said if "came free" in m]) == 1, said
        release.set()
        holder.join(10)
        assert db.fetchone("SELECT 1") == (1,)
        assert not [r for r in caplog.records if "reachable again" in r.getMessage()]
    finally:
        release.set()
        backend.close()


@pytest.mark.timeout(120)
def test_processes_starting_together_on_a_new_schema_all_connect(postgres):
    """Gateways started together on one new schema each create it when missing; PostgreSQL's
    `CREATE SCHEMA IF NOT EXISTS` is not safe against a concurrent one (the second fails with a
    duplicate key in pg_namespace: two cluster processes, one did not come up in CI). Eight
    connects at once on each of twenty new schemas all succeed."""
    def connect(url: str, start: threading.Barrier, backends: list[PostgresBackend],
                failures: list[BaseException]) -> None:
        start.wait(10)
        try:
            backends.append(PostgresBackend.connect(url, pool_size=1, timeout=10.0))
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
    for _ in range(20):
        url, start = postgres.new_url(), threading.Barrier(8)
        failures: list[BaseException] = []
        backends: list[PostgresBackend] = []
        threads = [threading.Thread(target=connect, args=(url, start, backends, failures))
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for backend in backends:
            backend.close()
        assert not failures, [str(f) for f in failures]
        assert len(backends) == 8
