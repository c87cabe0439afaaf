"""Versioned schemas: each store's tables, written as numbered steps, and the one table that says
which step each store has reached (`xsg_schema`).

A store declares its `Schema`: steps 1, 2, ..., each with its statements for SQLite and for
PostgreSQL (the types differ: BLOB/BYTEA, REAL/DOUBLE PRECISION, SQLite's NOCASE/an ICU
collation). `migrate` runs, in one transaction, the steps a database has not had yet and
records the version reached, so an empty database gets every step, an older one the steps it
lacks, and a newer one (written by a later xsg) is refused with a message rather than misread.
On PostgreSQL the migration holds an advisory lock: gateway processes starting together migrate
one after the other.

Stores written before this table existed (SQLite files of earlier releases) have no row here:
they count as version 0, and each store's step 1 is written to be idempotent (`CREATE TABLE IF
NOT EXISTS`, columns added only when missing), so it brings such a file to version 1 as it would
an empty one.

Why our own and not a migration tool: the maintained ones (Alembic, yoyo, ...) either bring an
ORM's engine with them or keep one migration script per dialect per change in files of their
own; a store's few steps, in the store's own module, tested on both dialects
(tests/common/test_migrations.py), are less to carry.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from common.db import Cursor, Database, StoreError, upsert_sql

log = logging.getLogger(__name__)

VERSIONS_TABLE = "xsg_schema"
# held by a PostgreSQL migration (pg_advisory_xact_lock): any fixed number, xsg's own
MIGRATION_LOCK = 0x7873_6701

Statement = str | Callable[[Cursor], None]


@dataclass(frozen=True)
class Step:
    """One version of a store's schema: what brings the version before to this one."""

    describe: str
    sqlite: tuple[Statement, ...]
    postgresql: tuple[Statement, ...]

    def statements(self, dialect: str) -> tuple[Statement, ...]:
        return self.sqlite if dialect == "sqlite" else self.postgresql


@dataclass(frozen=True)
class Schema:
    """A store's schema: its steps, oldest first (version n = the first n steps applied)."""

    store: str
    steps: tuple[Step, ...]

    @property
    def version(self) -> int:
        return len(self.steps)


def schema_version(db: Database, store: str | None = None) -> int:
    """The version a store has reached in this database (0: none, or no versions table)."""
    with db.transaction() as cur:
        _versions_table(db, cur)
        row = cur.execute(f"SELECT version FROM {VERSIONS_TABLE} WHERE store = ?",
                          (store or db.store,)).fetchone()
    return int(row[0]) if row else 0


def _versions_table(db: Database, cur: Cursor) -> None:
    if db.dialect.name == "postgresql":
        cur.execute(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
    cur.execute(f"CREATE TABLE IF NOT EXISTS {VERSIONS_TABLE} (store TEXT PRIMARY KEY,"
                " version INTEGER NOT NULL, migrated_at TEXT NOT NULL)")


def migrate(db: Database, schema: Schema, upto: int | None = None) -> int:
    """Bring the store's tables in `db` to `schema`'s version (`upto`: only that far, for
    tests of older versions), in one transaction; returns the version found. StoreError when
    the database holds a newer version than `schema` knows."""
    target = schema.version if upto is None else upto
    with db.transaction() as cur:
        _versions_table(db, cur)
        row = cur.execute(f"SELECT version FROM {VERSIONS_TABLE} WHERE store = ?",
                          (schema.store,)).fetchone()
        found = int(row[0]) if row else 0
        if found > schema.version:
            raise StoreError(f"{db.describe()}: the {schema.store} store has schema version "
                             f"{found}, newer than this xsg knows ({schema.version}); run the "
                             "xsg that wrote it, or restore a backup")
        for number in range(found + 1, target + 1):
            for statement in schema.steps[number - 1].statements(db.dialect.name):
                if isinstance(statement, str):
                    cur.execute(statement)
                else:
                    statement(cur)
        if target > found:
            now = datetime.now(UTC).isoformat(timespec="seconds")
            cur.execute(upsert_sql(VERSIONS_TABLE, ("store", "version", "migrated_at"),
                                   ("store",)), (schema.store, target, now))
    if target > found and found:
        log.info("%s: %s store migrated from schema version %d to %d (%s)", db.describe(),
                 schema.store, found, target,
                 "; ".join(step.describe for step in schema.steps[found:target]))
    elif target > found:
        log.debug("%s: %s store created at schema version %d", db.describe(), schema.store,
                  target)
    return found


__all__ = ["MIGRATION_LOCK", "Schema", "Statement", "Step", "VERSIONS_TABLE", "migrate",
           "schema_version"]
