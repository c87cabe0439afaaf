"""The stores' versioned schemas (common/migrations.py), on SQLite and on PostgreSQL: an empty
database gets every step, an older one the steps it lacks (its data kept), a newer one is refused,
files of the first release (no versions table) are read, and gateways starting together on one
PostgreSQL database migrate one after the other."""
from __future__ import annotations

import re
import sqlite3
import threading

import pytest

from common.db import StoreError, open_storage
from common.migrations import VERSIONS_TABLE, migrate, schema_version
from pdp.store import SCHEMA as POLICIES, SQLPolicyStore
from pep.audit.table import SCHEMA as AUDIT, AuditTable
from pep.handles.privacy_budget import SCHEMA as PRIVACY, PrivacyLedger
from pep.handles.records import SCHEMA as HANDLES, HandleStore
from pep.streams.catalog import StreamCatalog
from pep.streams.entries import SCHEMA as STREAMS
from pep.streams.events import SCHEMA as EVENTS, StreamEvents

SCHEMAS = (POLICIES, STREAMS, EVENTS, HANDLES, PRIVACY, AUDIT)


def open_all(storage, tmp_path):
    """Every store of a gateway, opened (and so migrated) on `storage`."""
    catalog = StreamCatalog(storage.database("streams"), tmp_path / "d")
    return [SQLPolicyStore(storage.database("policies")), catalog,
            StreamEvents(storage.database("events"), catalog.get),
            HandleStore(storage.database("handles")), PrivacyLedger(storage.database("privacy")),
            AuditTable(storage.database("audit"))]


def test_an_empty_database_gets_every_step_of_every_store(storage, tmp_path):
    stores = open_all(storage, tmp_path)
    for schema in SCHEMAS:
        assert schema.version >= 1
        assert schema_version(storage.database(schema.store)) == schema.version, schema.store
    for store in stores:
        store.close()
    # opened again: nothing to do, nothing lost
    again = open_all(storage, tmp_path)
    assert all(schema_version(storage.database(s.store)) == s.version for s in SCHEMAS)
    for store in again:
        store.close()


def test_an_older_version_is_migrated_and_keeps_its_data(storage):
    db = storage.database("policies", foreign_keys=True)
    assert migrate(db, POLICIES, upto=1) == 0  # a store as version 1 left it: no version clock
    with db.transaction() as cur:
        for version, data in ((1, b"<a1/>"), (2, b"<a2/>"), (3, b"<b/>")):
            cur.execute("INSERT INTO policy_versions (store_version, policy_id, version, owner,"
                        " created_at, is_policy_set, deleted, data)"
                        " VALUES (?, ?, ?, ?, ?, 0, 0, ?)",
                        (version, "b" if version == 3 else "a", f"1.{version}", "nea",
                         "2026-01-01T00:00:00+00:00", data))
        cur.execute("INSERT INTO policy_current (policy_id, store_version) VALUES ('a', 2),"
                    " ('b', 3)")
    assert schema_version(db) == 1
    store = SQLPolicyStore(db)  # migrates to the latest version
    assert schema_version(db) == POLICIES.version == 2
    assert store.store_version() == 3 and store.get("a").data == b"<a2/>"
    assert [h.store_version for h in store.history("a")] == [1, 2]
    assert store.put("c", "1.0", "nea", b"<c/>").store_version == 4  # the clock took over
    store.close()

    handles = storage.database("handles")
    migrate(handles, HANDLES, upto=1)
    assert schema_version(handles) == 1
    store = HandleStore(handles)
    assert schema_version(handles) == HANDLES.version
    assert store.shared_key("k") == store.shared_key("k")  # the table version 2 added
    store.close()


def test_a_newer_version_is_refused_with_a_message(storage):
    db = storage.database("events")
    migrate(db, EVENTS)
    with db.transaction() as cur:
        cur.execute(f"UPDATE {VERSIONS_TABLE} SET version = 99 WHERE store = 'events'")
    with pytest.raises(StoreError, match=r"events store has schema version 99, newer than this"
                                          r" xsg knows \(1\)"):
        StreamEvents(storage.database("events"), lambda name: None)


# the first release's own statements (before versions): its policy store and its first catalogue
RELEASE_ONE_POLICIES = """
CREATE TABLE policy_versions (store_version INTEGER PRIMARY KEY AUTOINCREMENT,
    policy_id TEXT NOT NULL, version TEXT NOT NULL, owner TEXT NOT NULL, created_at TEXT NOT NULL,
    is_policy_set INTEGER NOT NULL, deleted INTEGER NOT NULL DEFAULT 0, data BLOB NOT NULL);
CREATE INDEX policy_versions_by_id ON policy_versions (policy_id, store_version);
CREATE TABLE policy_current (policy_id TEXT PRIMARY KEY,
    store_version INTEGER NOT NULL REFERENCES policy_versions (store_version));
CREATE TABLE store_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO store_meta VALUES ('schema', '1');
INSERT INTO policy_versions (policy_id, version, owner, created_at, is_policy_set, data)
    VALUES ('a', '1.0', 'nea', '2025-01-01T00:00:00+00:00', 0, x'3c612f3e');
INSERT INTO policy_versions (policy_id, version, owner, created_at, is_policy_set, data)
    VALUES ('a', '2.0', 'nea', '2025-01-02T00:00:00+00:00', 0, x'3c612f3e');
INSERT INTO policy_current VALUES ('a', 2);
"""
RELEASE_ONE_CATALOGUE = """
CREATE TABLE streams (name TEXT PRIMARY KEY COLLATE NOCASE, owner TEXT NOT NULL,
    schema_json TEXT NOT NULL, source_json TEXT NOT NULL, time_attribute TEXT,
    created_at TEXT NOT NULL, next_seq INTEGER NOT NULL DEFAULT 1);
CREATE TABLE deleted_streams (name TEXT PRIMARY KEY COLLATE NOCASE, owner TEXT NOT NULL,
    deleted_at TEXT NOT NULL, deleted_by TEXT NOT NULL);
INSERT INTO streams VALUES ('Weather', 'nea', '[["t", "timestamp"], ["v", "double"]]',
    '["ingest", []]', 't', '2025-01-01T00:00:00+00:00', 8);
"""


def test_files_of_the_first_release_are_read_and_migrated(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name, script in (("policies", RELEASE_ONE_POLICIES), ("streams", RELEASE_ONE_CATALOGUE)):
        with sqlite3.connect(data / f"{name}.db") as conn:
            conn.executescript(script)
    storage = open_storage(data)
    store = SQLPolicyStore(storage.database("policies", foreign_keys=True))
    assert store.store_version() == 2 and store.get("a").version == "2.0"
    assert store.put("a", "3.0", "nea", b"<a3/>").store_version == 3
    meta = store.database.fetchone("SELECT value FROM store_meta WHERE key = 'schema'")
    assert meta == ("2",)  # the first release refuses the file from now on, rather than misread it
    store.close()
    catalog = StreamCatalog(storage.database("streams"), data)
    entry = catalog.entry("weather")
    assert entry.definition.name == "Weather" and entry.visibility == "listed"
    assert entry.next_seq == 8 and entry.optional == () and entry.combining is None
    catalog.close()
    assert schema_version(storage.database("streams")) == STREAMS.version


def test_a_policy_file_with_an_unknown_first_release_marker_is_refused(tmp_path):
    path = tmp_path / "policies.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(RELEASE_ONE_POLICIES.replace("('schema', '1')", "('schema', '7')"))
    with pytest.raises(StoreError, match="policy store schema 7 is not supported"):
        SQLPolicyStore(path)


def test_no_two_stores_name_the_same_table_or_index():
    """One PostgreSQL schema holds every store's tables (common/postgres.py): their names must not
    collide."""
    named = re.compile(r"CREATE (?:TABLE|INDEX|COLLATION)(?: IF NOT EXISTS)? (\w+)", re.I)
    owners: dict[str, str] = {}
    from pep.cluster.store import SCHEMA as CLUSTER  # several processes' tables, same schema
    from pep.delivery.store import SCHEMA as DELIVERY  # plan topics and edges, same schema

    for schema in (*SCHEMAS, CLUSTER, DELIVERY):
        for step in schema.steps:
            for statement in (*step.sqlite, *step.postgresql):
                if not isinstance(statement, str):
                    continue
                for name in named.findall(statement):
                    assert owners.setdefault(name.lower(), schema.store) == schema.store, name
    assert VERSIONS_TABLE not in owners and len(owners) >= 10


def test_gateways_starting_together_migrate_one_after_the_other(postgres, tmp_path):
    url = postgres.new_url()
    storages = [open_storage(tmp_path / f"g{n}", url) for n in range(3)]
    errors = []

    def start(storage) -> None:
        try:
            for store in open_all(storage, tmp_path):
                store.close()
        except Exception as exc:  # noqa: BLE001 - reported below  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(s,)) for s in storages]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert errors == []
        assert all(schema_version(storages[0].database(s.store)) == s.version for s in SCHEMAS)
    finally:
        for storage in storages:
            storage.close()
