"""The policy store, on SQLite and on PostgreSQL (`storage`, tests/conftest.py): versions,
history, restart, crash safety, threads, and versions that stay serial when two processes write
at once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from common.db import open_storage
from pdp.store import (
    PolicyExistsError,
    PolicyNotFoundError,
    SQLitePolicyStore,
    SQLPolicyStore,
    StoreError,
)

REPO = Path(__file__).resolve().parents[3]


def open_store(storage):
    return SQLPolicyStore(storage.database("policies", foreign_keys=True))


def reopened(storage):
    """The same store opened again, as by a new process (a new pool on PostgreSQL)."""
    return open_storage(storage.data_dir, storage.url)


@pytest.fixture
def store(storage):
    s = open_store(storage)
    yield s
    s.close()


def test_put_get_list_and_versions(store):
    assert store.is_empty() and store.store_version() == 0
    a1 = store.put("a", "1.0", "nea", b"<a1/>", must_exist=False)
    b1 = store.put("b", "1.0", "nea", b"<b1/>", is_policy_set=True, must_exist=False)
    a2 = store.put("a", "2.0", "admin2", b"<a2/>", must_exist=True)
    assert (a1.store_version, b1.store_version, a2.store_version) == (1, 2, 3)
    assert store.store_version() == 3
    assert store.get("a").data == b"<a2/>" and store.get("a").owner == "admin2"
    assert store.get("a", version="1.0").data == b"<a1/>"
    assert store.get("a", store_version=1).data == b"<a1/>"
    assert store.get("b").is_policy_set is True
    assert [p.policy_id for p in store.list()] == ["a", "b"]
    assert [h.version for h in store.history("a")] == ["1.0", "2.0"]
    with pytest.raises(PolicyNotFoundError):
        store.get("a", store_version=2)  # store version 2 belongs to b
    with pytest.raises(PolicyNotFoundError):
        store.get("a", version="9.9")


def test_the_list_is_in_the_byte_order_of_the_ids(store):
    """The engine's root takes the documents in this order (first-applicable depends on it), so
    both databases give the same one, whatever the PostgreSQL database's own collation."""
    ids = ["b", "B", "a_b", "a-c", "ab", "A", "Z9", "é", "urn:x:Y", "urn:x:y"]
    for policy_id in ids:
        store.put(policy_id, "1.0", "nea", b"<p/>")
    assert [p.policy_id for p in store.list()] == sorted(ids)


def test_create_and_update_guards(store):
    store.put("a", "1.0", "nea", b"<a/>", must_exist=False)
    with pytest.raises(PolicyExistsError):
        store.put("a", "1.1", "nea", b"<a2/>", must_exist=False)
    with pytest.raises(PolicyNotFoundError):
        store.put("zzz", "1.0", "nea", b"<z/>", must_exist=True)
    assert store.store_version() == 1  # refused writes leave no trace


def test_delete_is_a_tombstone_and_keeps_history(store):
    store.put("a", "1.0", "nea", b"<a1/>")
    tomb = store.delete("a", "nea")
    assert tomb.deleted and tomb.store_version == 2
    assert store.list() == []
    with pytest.raises(PolicyNotFoundError):
        store.get("a")
    history = store.history("a")
    assert [(h.store_version, h.deleted) for h in history] == [(1, False), (2, True)]
    assert store.get("a", store_version=1).data == b"<a1/>"
    with pytest.raises(PolicyNotFoundError):
        store.delete("a", "nea")
    # the id can be reused after a delete
    store.put("a", "3.0", "nea", b"<a3/>", must_exist=False)
    assert store.get("a").version == "3.0" and not store.is_empty()


def test_restart_keeps_everything(storage):
    s = open_store(storage)
    s.put("a", "1.0", "nea", b"<a1/>")
    s.put("a", "2.0", "nea", b"<a2/>")
    s.put("b", "1.0", "nea", b"<b/>")
    s.delete("b", "nea")
    s.close()
    storage.close()
    storage = reopened(storage)
    s2 = open_store(storage)
    try:
        assert [p.policy_id for p in s2.list()] == ["a"]
        assert s2.get("a").data == b"<a2/>"
        assert len(s2.history("a")) == 2 and s2.history("b")[-1].deleted
        assert s2.store_version() == 4
        assert s2.put("c", "1.0", "nea", b"<c/>").store_version == 5
    finally:
        s2.close()
        storage.close()


def test_wal_and_full_sync(tmp_path):
    store = SQLitePolicyStore(tmp_path / "policies.db")
    assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    store.close()


def test_exception_inside_the_write_rolls_back(storage):
    class Failing(SQLPolicyStore):
        def _set_current(self, cur, policy_id, store_version):
            super()._set_current(cur, policy_id, store_version)
            raise RuntimeError("crash between the two steps of a write")

    good = open_store(storage)
    good.put("a", "1.0", "nea", b"<a1/>")
    good.close()
    bad = Failing(storage.database("policies", foreign_keys=True))
    with pytest.raises(RuntimeError):
        bad.put("a", "2.0", "nea", b"<a2/>")
    with pytest.raises(RuntimeError):
        bad.delete("a", "nea")
    with pytest.raises(RuntimeError):
        bad.put_all([("x", "1.0", "nea", b"<x/>", False), ("y", "1.0", "nea", b"<y/>", False)])
    # the same connection is still usable and shows the previous state
    assert bad.get("a").data == b"<a1/>" and bad.store_version() == 1
    bad.close()
    again = open_store(storage)
    assert [p.policy_id for p in again.list()] == ["a"] and again.get("a").version == "1.0"
    assert again.store_version() == 1
    assert again.put("b", "1.0", "nea", b"<b/>").store_version == 2  # the numbers given back
    again.close()


def test_put_all_is_all_or_nothing(store):
    store.put("b", "1.0", "nea", b"<b/>")
    with pytest.raises(PolicyExistsError):
        store.put_all([("a", "1.0", "seed", b"<a/>", False), ("b", "1.0", "seed", b"<b2/>", False)])
    assert [p.policy_id for p in store.list()] == ["b"]
    written = store.put_all(
        [("a", "1.0", "seed", b"<a/>", False), ("c", "1.0", "seed", b"<c/>", True)]
    )
    assert [w.store_version for w in written] == [2, 3]


CRASHING_WRITER = textwrap.dedent("""
    import sys, time
    from common.db import open_storage
    from pdp.store import SQLPolicyStore

    class Stalling(SQLPolicyStore):
        def _set_current(self, cur, policy_id, store_version):
            super()._set_current(cur, policy_id, store_version)
            print("inside-transaction", flush=True)
            time.sleep(60)   # killed here, before COMMIT

    storage = open_storage(sys.argv[1], sys.argv[2] or None)
    s = Stalling(storage.database("policies", foreign_keys=True))
    big = b"<x>" + b"y" * 2_000_000 + b"</x>"
    s.put("a", "2.0", "killer", big)
""")


def test_writer_killed_mid_write_leaves_previous_state(storage):
    s = open_store(storage)
    s.put("a", "1.0", "nea", b"<a1/>")
    s.close()
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_WRITER, str(storage.data_dir),
                             storage.url or ""],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line = proc.stdout.readline()
        assert line.strip() == b"inside-transaction", proc.stderr.read().decode()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    after = open_store(storage)
    try:
        assert after.get("a").data == b"<a1/>" and after.get("a").version == "1.0"
        assert [h.version for h in after.history("a")] == ["1.0"]
        assert after.store_version() == 1
        after.put("a", "3.0", "nea", b"<a3/>")  # and the database is writable again
        assert after.get("a").version == "3.0"
    finally:
        after.close()


def test_concurrent_writers_from_threads(store):
    errors = []

    def writer(n: int) -> None:
        try:
            for i in range(20):
                store.put(f"p{n}", f"1.{i}", f"w{n}", f"<p{n} i='{i}'/>".encode())
                store.list()
        except Exception as exc:  # noqa: BLE001 - reported below  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.store_version() == 160
    assert len(store.list()) == 8
    assert all(len(store.history(f"p{n}")) == 20 for n in range(8))
    versions = [h.store_version for n in range(8) for h in store.history(f"p{n}")]
    assert sorted(versions) == list(range(1, 161))


def test_not_a_database_is_a_clear_error(tmp_path):
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open policy store"):
        SQLitePolicyStore(path)


def test_a_write_reads_only_its_own_policy(tmp_path):
    """put, put_all and delete issue the same statements however many policies are stored:
    nothing re-reads the stored set."""
    import re

    def statements(store, write):
        seen = []
        store._conn.set_trace_callback(seen.append)
        try:
            write(store)
        finally:
            store._conn.set_trace_callback(None)
        # The shape of each statement: the values bound into it differ between the stores.
        return [re.sub(r"x?'[^']*'|\b\d+\b", "?", sql) for sql in seen]

    traces = []
    for size in (3, 300):
        store = SQLitePolicyStore(tmp_path / f"s{size}.db")
        store.put_all([(f"p{i}", "1.0", "nea", b"<p/>" * 50, False) for i in range(size)])
        traces.append([
            statements(store, lambda s: s.put("new", "1.0", "nea", b"<n/>")),
            statements(store, lambda s: s.put("new", "2.0", "nea", b"<n2/>", must_exist=True)),
            statements(store, lambda s: s.put_all([("x", "1.0", "nea", b"<x/>", False)])),
            statements(store, lambda s: s.delete("new", "nea")),
        ])
        store.close()
    assert traces[0] == traces[1]
    for trace in traces[1]:
        for sql in trace:
            assert "policy_current c" not in sql  # the list() query
            if sql.lstrip().upper().startswith("SELECT"):
                assert "WHERE" in sql.upper()


TWO_WRITERS = textwrap.dedent("""
    import json, sys
    from common.db import open_storage
    from pdp.store import SQLPolicyStore

    storage = open_storage(sys.argv[1], sys.argv[2] or None)
    store = SQLPolicyStore(storage.database("policies", foreign_keys=True))
    name, count = sys.argv[3], int(sys.argv[4])
    print("ready", flush=True)
    sys.stdin.readline()  # go
    written = [store.put(f"{name}-{i % 5}", f"1.{i}", name, f"<p n='{i}'/>".encode()).store_version
               for i in range(count)]
    print(json.dumps(written), flush=True)
    storage.close()
""")


def test_versions_stay_serial_when_two_processes_write_at_once(storage):
    """Two writer processes on one store (two connections, two pools on PostgreSQL): every
    version is written once, none is lost or doubled, and a reader never sees a gap (a later
    version committed before an earlier one)."""
    count = 150
    procs = [subprocess.Popen([sys.executable, "-c", TWO_WRITERS, str(storage.data_dir),
                               storage.url or "", name, str(count)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, cwd=REPO, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
             for name in ("left", "right")]
    store = open_store(storage)
    db = store.database
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        seen_gaps, snapshots = [], 0
        deadline = time.monotonic() + 120
        while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
            versions = [row[0] for row in db.fetchall(
                "SELECT store_version FROM policy_versions ORDER BY store_version")]
            snapshots += 1
            if versions != list(range(1, len(versions) + 1)):
                seen_gaps.append(versions[-5:])
        written = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            written.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert seen_gaps == [], f"a reader saw versions out of order: {seen_gaps[:3]}"
    assert snapshots > 1
    for versions in written:
        assert versions == sorted(versions) and len(versions) == count
    assert sorted(written[0] + written[1]) == list(range(1, 2 * count + 1))
    assert store.store_version() == 2 * count
    for name, versions in zip(("left", "right"), written, strict=True):
        stored = [h.store_version for i in range(5) for h in store.history(f"{name}-{i}")]
        assert sorted(stored) == versions
    store.close()


def test_a_connection_lost_inside_a_write_keeps_nothing_of_it(postgres, tmp_path):
    """The PostgreSQL server goes away between the two steps of a write: the write fails as
    StoreUnavailable (a 503 at the HTTP edge), and once the server is back nothing of it is
    there, its version number included."""
    from common.db import StoreUnavailable

    class Cut(SQLPolicyStore):
        def _set_current(self, cur, policy_id, store_version):
            postgres.stop("immediate")  # as a crash of the server would
            super()._set_current(cur, policy_id, store_version)

    storage = open_storage(tmp_path, postgres.new_url(), timeout=2.0)
    try:
        store = open_store(storage)
        store.put("a", "1.0", "nea", b"<a1/>")
        try:
            with pytest.raises(StoreUnavailable, match="the store cannot be reached"):
                Cut(storage.database("policies")).put("a", "2.0", "nea", b"<a2/>")
        finally:
            postgres.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                version = store.store_version()
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "the store did not come back"
                time.sleep(0.2)
        assert version == 1 and [h.version for h in store.history("a")] == ["1.0"]
        assert store.put("a", "3.0", "nea", b"<a3/>").store_version == 2
    finally:
        storage.close()
