"""The policy store (PAP persistence): every write is a new, immutable store version.

The store keeps the full history (including deletions, as tombstones) so that an owner can see
what a policy said when a decision was made, and so that a crash in the middle of a write can
never leave a half-written state: a write is one transaction (SQLite in WAL mode with
synchronous=FULL, or PostgreSQL: `common.db`), so after a crash the database shows either all of a
write or none of it.

Store versions are serial: every write first takes the next number from the one row of
`policy_clock` (`UPDATE ... RETURNING`), which locks that row until the write commits or rolls
back. So writers, in this process or in others on the same PostgreSQL database, follow one
another; a write that rolls back gives its number back; and versions are committed in the order
of their numbers, without gaps (a reader that has seen version n has seen every version before
it).

The store knows nothing of XACML semantics: callers pass the PolicyId and Version they read from
the document. `PolicyStore` is the seam for another kind of store; `SQLPolicyStore` works on
either database.
"""
from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common.db import Cursor, Database, StoreError, open_database, opening, upsert_sql
from common.migrations import Schema, Step, migrate


class PolicyExistsError(StoreError):
    """`source`, when given, names the document that tried to reuse the id (bulk adds)."""

    def __init__(
        self, policy_id: str, source: str | None = None, detail: str | None = None
    ) -> None:
        message = f"policy {policy_id!r} already exists"
        if source is not None:
            message += f" (in {source}{': ' + detail if detail else ''})"
        super().__init__(message)
        self.policy_id = policy_id
        self.source = source


class PolicyNotFoundError(StoreError):
    def __init__(self, policy_id: str, version: str | int | None = None) -> None:
        what = f"policy {policy_id!r}" + (f" version {version!r}" if version is not None else "")
        super().__init__(f"{what} not found")
        self.policy_id = policy_id
        self.version = version


@dataclass(frozen=True)
class StoredPolicy:
    """One version of one policy, as written; `deleted` marks a tombstone (then data is b'')."""

    policy_id: str
    version: str  # the XACML Version attribute
    store_version: int  # global, strictly increasing write number
    owner: str  # the authenticated subject who wrote this version
    created_at: str  # ISO 8601, UTC
    is_policy_set: bool
    data: bytes
    deleted: bool = False

    def summary(self) -> dict[str, Any]:
        """JSON-ready description without the XML."""
        return {
            "id": self.policy_id,
            "version": self.version,
            "store_version": self.store_version,
            "owner": self.owner,
            "created_at": self.created_at,
            "is_policy_set": self.is_policy_set,
            "deleted": self.deleted,
        }


class PolicyStore(ABC):
    """What the policy service needs from a database."""

    @abstractmethod
    def put(self, policy_id: str, version: str, owner: str, data: bytes, *,
            is_policy_set: bool = False, must_exist: bool | None = None) -> StoredPolicy:
        """Write a new version. must_exist: True = update only, False = create only, None =
        either."""

    @abstractmethod
    def put_all(self, items: list[tuple[str, str, str, bytes, bool]]) -> list[StoredPolicy]:
        """Create several policies in one transaction (all or none)."""

    @abstractmethod
    def get(self, policy_id: str, version: str | None = None,
            store_version: int | None = None) -> StoredPolicy:
        """The current version, or a historical one by XACML version or store version."""

    @abstractmethod
    def list(self) -> list[StoredPolicy]:
        """Current (not deleted) policies, ordered by id."""

    @abstractmethod
    def history(self, policy_id: str) -> builtins.list[StoredPolicy]:
        """Every version of a policy, tombstones included, oldest first."""

    @abstractmethod
    def delete(self, policy_id: str, owner: str) -> StoredPolicy:
        """Write a tombstone; returns it. The history is kept."""

    @abstractmethod
    def store_version(self) -> int:
        """The number of the last write (0 for an empty store)."""

    def list_at(self, store_version: int) -> builtins.list[StoredPolicy]:
        """The current policies as they were once version `store_version` was written."""
        raise NotImplementedError(f"{type(self).__name__} keeps no history to list from")

    def versions_after(self, store_version: int, upto: int | None = None
                       ) -> builtins.list[StoredPolicy]:
        """Every version written after `store_version` (up to `upto`), tombstones included,
        in store order: what another process on the same store wrote since (`pep.cluster`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be followed by version")

    def current_sources(self) -> builtins.list[Any]:
        """The current policies as engine sources (PolicySource), ready to compile."""
        from pdp.engine import PolicySource

        return [PolicySource(source_name(p), p.data) for p in self.list()]

    def is_empty(self) -> bool:
        return self.store_version() == 0

    def close(self) -> None:  # noqa: B027 - optional: the default has nothing to release
        """Release resources; the default has none."""


def source_name(policy: StoredPolicy) -> str:
    """How a stored policy is named in load errors: enough to find it in the history."""
    return f"{policy.policy_id} (store version {policy.store_version})"


_V1_SQLITE = ("""CREATE TABLE IF NOT EXISTS policy_versions (
    store_version INTEGER PRIMARY KEY AUTOINCREMENT,
    policy_id     TEXT    NOT NULL,
    version       TEXT    NOT NULL,
    owner         TEXT    NOT NULL,
    created_at    TEXT    NOT NULL,
    is_policy_set INTEGER NOT NULL,
    deleted       INTEGER NOT NULL DEFAULT 0,
    data          BLOB    NOT NULL
)""",
              "CREATE INDEX IF NOT EXISTS policy_versions_by_id ON policy_versions (policy_id,"
              " store_version)",
              "CREATE TABLE IF NOT EXISTS policy_current (policy_id TEXT PRIMARY KEY,"
              " store_version INTEGER NOT NULL REFERENCES policy_versions (store_version))",
              "CREATE TABLE IF NOT EXISTS store_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
              "INSERT INTO store_meta (key, value) VALUES ('schema', '1')"
              " ON CONFLICT (key) DO NOTHING")


def _written_by_release_one(cur: Cursor) -> None:
    """A file without a versions row was written by the first release, whose own marker
    (store_meta) must say so."""
    found = cur.execute("SELECT value FROM store_meta WHERE key = 'schema'").fetchone()[0]
    if str(found) != "1":
        raise StoreError(f"policy store schema {found} is not supported (expected 1)")


# On PostgreSQL, policy ids compare as bytes, as SQLite's do: the list is in their order, and
# that order is the order of the root's documents (first-applicable depends on it).
SCHEMA = Schema("policies", (
    Step("policy versions, and the current version of each policy",
         sqlite=(*_V1_SQLITE, _written_by_release_one),
         postgresql=(
             "CREATE TABLE policy_versions (store_version BIGINT PRIMARY KEY,"
             " policy_id TEXT COLLATE \"C\" NOT NULL, version TEXT NOT NULL, owner TEXT NOT NULL,"
             " created_at TEXT NOT NULL, is_policy_set INTEGER NOT NULL,"
             " deleted INTEGER NOT NULL DEFAULT 0, data BYTEA NOT NULL)",
             "CREATE INDEX policy_versions_by_id ON policy_versions (policy_id, store_version)",
             "CREATE TABLE policy_current (policy_id TEXT COLLATE \"C\" PRIMARY KEY,"
             " store_version BIGINT NOT NULL REFERENCES policy_versions (store_version))")),
    Step("the version clock: the one row every writer locks, so versions are serial",
         sqlite=("CREATE TABLE policy_clock (id INTEGER PRIMARY KEY CHECK (id = 1),"
                 " last INTEGER NOT NULL)",
                 "INSERT INTO policy_clock (id, last)"
                 " SELECT 1, COALESCE(MAX(store_version), 0) FROM policy_versions",
                 # the first release reads this marker and refuses a store it does not know
                 "UPDATE store_meta SET value = '2' WHERE key = 'schema'"),
         postgresql=("CREATE TABLE policy_clock (id INTEGER PRIMARY KEY CHECK (id = 1),"
                     " last BIGINT NOT NULL)",
                     "INSERT INTO policy_clock (id, last)"
                     " SELECT 1, COALESCE(MAX(store_version), 0) FROM policy_versions")),
))
SCHEMA_VERSION = SCHEMA.version

_COLUMNS = ("v.policy_id, v.version, v.store_version, v.owner, v.created_at, v.is_policy_set, "
            "v.data, v.deleted")


def _row(row: tuple[Any, ...]) -> StoredPolicy:
    return StoredPolicy(policy_id=row[0], version=row[1], store_version=row[2], owner=row[3],
                        created_at=row[4], is_policy_set=bool(row[5]), data=bytes(row[6]),
                        deleted=bool(row[7]))


class SQLPolicyStore(PolicyStore):
    """The policy store on a `common.db.Database` (a SQLite file, given by its path, or the
    PostgreSQL database). Policy reads and writes are rare next to decisions, which never touch
    the store."""

    def __init__(self, where: Database | str | Path) -> None:
        self.path = Path(where) if isinstance(where, (str, Path)) else None
        description = str(where) if self.path is not None else "the policy store"
        with opening("policy store", description):
            self._db = open_database(where, "policies", foreign_keys=True)
        try:
            with opening("policy store", self._db.describe()):
                migrate(self._db, SCHEMA)
        except BaseException:
            self._db.close()
            raise
        self._lock = self._db.lock
        self._transaction = self._db.transaction

    @property
    def database(self) -> Database:
        return self._db

    @property
    def _conn(self) -> Any:
        """The SQLite connection (tests look at its settings and statements)."""
        return getattr(self._db, "connection", None)

    # -- writes ---------------------------------------------------------------------------------

    def put(self, policy_id: str, version: str, owner: str, data: bytes, *,
            is_policy_set: bool = False, must_exist: bool | None = None) -> StoredPolicy:
        if not policy_id:
            raise ValueError("policy id must not be empty")
        with self._transaction() as cur:
            store_version = self._next_version(cur)
            exists = self._current_version(cur, policy_id) is not None
            if must_exist is True and not exists:
                raise PolicyNotFoundError(policy_id)
            if must_exist is False and exists:
                raise PolicyExistsError(policy_id)
            stored = self._insert_version(cur, store_version, policy_id, version, owner,
                                          bytes(data), is_policy_set, deleted=False)
            self._set_current(cur, policy_id, stored.store_version)
        return stored

    def put_all(self, items: list[tuple[str, str, str, bytes, bool]]) -> list[StoredPolicy]:
        """Create several policies (id, version, owner, data, is_policy_set) in one transaction:
        all are written or none (used to seed an empty store)."""
        written = []
        with self._transaction() as cur:
            for policy_id, version, owner, data, is_policy_set in items:
                store_version = self._next_version(cur)
                if self._current_version(cur, policy_id) is not None:
                    raise PolicyExistsError(policy_id)
                stored = self._insert_version(cur, store_version, policy_id, version, owner,
                                              bytes(data), is_policy_set, deleted=False)
                self._set_current(cur, policy_id, stored.store_version)
                written.append(stored)
        return written

    def delete(self, policy_id: str, owner: str) -> StoredPolicy:
        with self._transaction() as cur:
            store_version = self._next_version(cur)
            current = self._current_version(cur, policy_id)
            if current is None:
                raise PolicyNotFoundError(policy_id)
            previous = self._by_store_version(cur, current)
            tombstone = self._insert_version(cur, store_version, policy_id, previous.version,
                                             owner, b"", previous.is_policy_set, deleted=True)
            self._set_current(cur, policy_id, None)
        return tombstone

    @staticmethod
    def _next_version(cur: Cursor) -> int:
        """The next store version; the clock's row stays locked until this write ends (the
        module docstring)."""
        row = cur.execute("UPDATE policy_clock SET last = last + 1 WHERE id = 1"
                          " RETURNING last").fetchone()
        return int(row[0])

    # Separate steps so that a crash test can interrupt a write between them.
    def _insert_version(self, cur: Cursor, store_version: int, policy_id: str, version: str,
                        owner: str, data: bytes, is_policy_set: bool,
                        deleted: bool) -> StoredPolicy:
        created_at = datetime.now(UTC).isoformat(timespec="milliseconds")
        cur.execute(
            "INSERT INTO policy_versions (store_version, policy_id, version, owner, created_at,"
            " is_policy_set, deleted, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (store_version, policy_id, version, owner, created_at, int(is_policy_set),
             int(deleted), data))
        return StoredPolicy(policy_id, version, store_version, owner, created_at,
                            is_policy_set, data, deleted)

    def _set_current(self, cur: Cursor, policy_id: str, store_version: int | None) -> None:
        if store_version is None:
            cur.execute("DELETE FROM policy_current WHERE policy_id = ?", (policy_id,))
        else:
            cur.execute(upsert_sql("policy_current", ("policy_id", "store_version"),
                                   ("policy_id",)), (policy_id, store_version))

    # -- reads ----------------------------------------------------------------------------------

    @staticmethod
    def _current_version(cur: Cursor, policy_id: str) -> int | None:
        row = cur.execute("SELECT store_version FROM policy_current WHERE policy_id = ?",
                          (policy_id,)).fetchone()
        return None if row is None else int(row[0])

    @staticmethod
    def _by_store_version(cur: Cursor, store_version: int) -> StoredPolicy:
        row = cur.execute(f"SELECT {_COLUMNS} FROM policy_versions v WHERE v.store_version = ?",
                          (store_version,)).fetchone()
        return _row(row)

    def get(self, policy_id: str, version: str | None = None,
            store_version: int | None = None) -> StoredPolicy:
        if store_version is not None:
            row = self._db.fetchone(
                f"SELECT {_COLUMNS} FROM policy_versions v "
                "WHERE v.policy_id = ? AND v.store_version = ?",
                (policy_id, int(store_version)))
            if row is None:
                raise PolicyNotFoundError(policy_id, store_version)
        elif version is not None:
            row = self._db.fetchone(
                f"SELECT {_COLUMNS} FROM policy_versions v "
                "WHERE v.policy_id = ? AND v.version = ? AND v.deleted = 0 "
                "ORDER BY v.store_version DESC LIMIT 1",
                (policy_id, version))
            if row is None:
                raise PolicyNotFoundError(policy_id, version)
        else:
            row = self._db.fetchone(
                f"SELECT {_COLUMNS} FROM policy_current c "
                "JOIN policy_versions v ON v.store_version = c.store_version "
                "WHERE c.policy_id = ?", (policy_id,))
            if row is None:
                raise PolicyNotFoundError(policy_id)
        return _row(row)

    def list(self) -> list[StoredPolicy]:
        rows = self._db.fetchall(
            f"SELECT {_COLUMNS} FROM policy_current c "
            "JOIN policy_versions v ON v.store_version = c.store_version "
            "ORDER BY v.policy_id")
        return [_row(r) for r in rows]

    def history(self, policy_id: str) -> builtins.list[StoredPolicy]:
        rows = self._db.fetchall(
            f"SELECT {_COLUMNS} FROM policy_versions v WHERE v.policy_id = ? "
            "ORDER BY v.store_version", (policy_id,))
        if not rows:
            raise PolicyNotFoundError(policy_id)
        return [_row(r) for r in rows]

    def list_at(self, store_version: int) -> builtins.list[StoredPolicy]:
        """The current policies as they were once version `store_version` was written (ordered
        by id, as `list`): one read, so no later write can slip into it."""
        rows = self._db.fetchall(
            f"SELECT {_COLUMNS} FROM policy_versions v JOIN (SELECT policy_id AS id,"
            " MAX(store_version) AS last FROM policy_versions WHERE store_version <= ?"
            " GROUP BY policy_id) newest ON newest.id = v.policy_id AND newest.last ="
            " v.store_version WHERE v.deleted = 0 ORDER BY v.policy_id", (int(store_version),))
        return [_row(r) for r in rows]

    def versions_after(self, store_version: int, upto: int | None = None
                       ) -> builtins.list[StoredPolicy]:
        rows = self._db.fetchall(
            f"SELECT {_COLUMNS} FROM policy_versions v WHERE v.store_version > ?"
            + (" AND v.store_version <= ?" if upto is not None else "")
            + " ORDER BY v.store_version",
            (int(store_version),) + ((int(upto),) if upto is not None else ()))
        return [_row(r) for r in rows]

    def store_version(self) -> int:
        row = self._db.fetchone("SELECT last FROM policy_clock WHERE id = 1")
        return int(row[0]) if row else 0

    def close(self) -> None:
        self._db.close()


# The first name of the SQL store, when SQLite was its only database.
SQLitePolicyStore = SQLPolicyStore
