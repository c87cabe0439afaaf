"""Where the gateway keeps what it must not forget: the `Database` seam, its SQLite form, and the
choice between SQLite files and one PostgreSQL database (`open_storage`).

Every store (policies, the stream catalogue, stream events, handles, privacy budgets and, on
PostgreSQL, the audit trail) talks to a `Database`, never to a driver. Two implement it:

- `SQLiteDatabase`: one file per store under the data directory (the embedded default). WAL,
  synchronous=FULL (a committed write survives a crash), one connection shared by the server's
  threads under one RLock, and a write is exactly one transaction (BEGIN IMMEDIATE ...
  COMMIT, rolled back on any exception, so nothing is half-written);
- `common.postgres.PostgresDatabase`: one PostgreSQL database for every store, through one
  connection pool per process (psycopg 3). A write is one transaction there too, and this
  process's writes to one store still go one at a time (its `lock`), as with SQLite; writers in
  other processes are ordered by the database (row locks: `pdp.store`'s version clock).

The stores write their SQL once, in the form both dialects read: `?` placeholders (the
PostgreSQL cursor turns them into its own, the one place they differ), `INSERT ... ON CONFLICT`
for upserts (`upsert_sql`, the one place they are written), and `Dialect` for the little that
must differ (`FOR UPDATE`). Table definitions are per dialect (`common.migrations`: each store's
versioned schema). What a store reads back is plain Python (int, float, str, bytes).

A store that cannot be reached raises `StoreUnavailable` (a 503 at the HTTP edge, with its
reason); every committed write passes through `transaction()` or `execute()`, the one place
where a later step can announce it to other processes (`Database.on_commit`).
"""
from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from common import refusals

log = logging.getLogger(__name__)

# the stores, by name: a SQLite file `<name>.db` under the data directory each, or their tables
# in the one PostgreSQL database (`common.migrations` lists each one's tables)
# ("cluster": the processes of one gateway on PostgreSQL, their streams' leases: pep/cluster;
# "delivery": plan topics, the handles reading them, the edges: pep/delivery)
STORE_NAMES = ("policies", "streams", "events", "handles", "privacy", "audit", "cluster",
               "delivery")
RETRY_AFTER_SECONDS = 5  # what a 503 for a store that cannot be reached asks clients to wait


class StoreError(Exception):
    """Base class for store errors that callers are expected to handle."""


class StoreUnavailable(StoreError, refusals.Unavailable):
    """The store cannot be reached (connection refused or lost, no connection free in time):
    the write or read did not happen (a write is one transaction: nothing of it is kept) and
    the client may retry. `setting` names the configuration setting that chose the store."""

    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    setting = "store"

    def __init__(self, message: str) -> None:
        refusals.Unavailable.__init__(self, message)


@dataclass(frozen=True)
class Dialect:
    """The little SQL that differs between the two databases (the rest is written once)."""

    name: str  # "sqlite" or "postgresql"
    for_update: str  # appended to a SELECT that locks the rows it reads until the commit


SQLITE = Dialect("sqlite", for_update="")
POSTGRESQL = Dialect("postgresql", for_update=" FOR UPDATE")


# A row as the driver gives it: the values of the columns read, in their order, of the types the
# driver maps the columns' to (the reader knows which it asked for).
Row = tuple[Any, ...]


class Cursor(Protocol):
    """What a store does with a transaction's cursor (sqlite3's, or `common.postgres`'s)."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Database(Protocol):
    """One store's database: SQLite's file or PostgreSQL's shared one (module docstring)."""

    dialect: Dialect
    store: str  # the store's name (STORE_NAMES)
    lock: threading.RLock  # held by this process's writes to this store
    on_commit: list[Callable[[str], None]]  # told the store's name after every committed write

    def describe(self) -> str:
        """Where the store is, for messages (never a password)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One write statement in a transaction of its own; the number of rows it changed."""

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first row of a read (None when there is none)."""

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Every row of a read."""

    def transaction(self) -> AbstractContextManager[Cursor]:
        """One write transaction: committed when the block ends, rolled back on any exception.
        Reads through this object in the same thread inside the block see its writes."""

    def close(self) -> None:
        """Release what this store holds (a shared pool is closed by its `Storage`)."""


def upsert_sql(table: str, columns: Sequence[str], key: Sequence[str],
               update: Sequence[str] | None = None, add: Sequence[str] = ()) -> str:
    """`INSERT ... ON CONFLICT (key) DO ...` in the form both dialects read: the `update`
    columns (default: every non-key column) take the new values, the `add` columns add them to
    what is there (written `table.column + excluded.column`: PostgreSQL needs the table named),
    and with neither the existing row is kept (DO NOTHING)."""
    marks = ", ".join("?" for _ in columns)
    head = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}) " \
           f"ON CONFLICT ({', '.join(key)}) DO "
    replaced = [c for c in columns if c not in key and c not in add] if update is None \
        else list(update)
    sets = [f"{c} = excluded.{c}" for c in replaced] \
        + [f"{c} = {table}.{c} + excluded.{c}" for c in add]
    return head + ("UPDATE SET " + ", ".join(sets) if sets else "NOTHING")


def _notify(db: Database) -> None:
    for callback in list(db.on_commit):
        try:
            callback(db.store)
        except Exception:  # a listener must not undo a committed write
            log.exception("commit listener failed for store %s", db.store)


class SQLiteDatabase:
    """One SQLite file (see the module docstring)."""

    dialect = SQLITE

    def __init__(self, path: str | Path, *, store: str = "", foreign_keys: bool = False,
                 busy_timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.store = store or self.path.stem
        self.on_commit: list[Callable[[str], None]] = []
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self.connection = sqlite3.connect(str(path), isolation_level=None,
                                          check_same_thread=False, timeout=busy_timeout)
        try:
            self.connection.execute("PRAGMA journal_mode=WAL")
            self.connection.execute("PRAGMA synchronous=FULL")
            if foreign_keys:
                self.connection.execute("PRAGMA foreign_keys=ON")
        except BaseException:
            self.connection.close()
            raise

    def describe(self) -> str:
        return str(self.path)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One statement outside an explicit transaction (SQLite commits it by itself)."""
        with self.lock:
            changed = self.connection.execute(sql, params).rowcount
        _notify(self)
        return changed

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Any:
        with self.lock:
            return self.connection.execute(sql, params).fetchone()

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self.lock:
            return self.connection.execute(sql, params).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Cursor]:
        """BEGIN IMMEDIATE ... COMMIT under the lock; ROLLBACK on any exception."""
        with self.lock:
            cur = self.connection.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                self.connection.rollback()
                raise
            else:
                cur.execute("COMMIT")
            finally:
                cur.close()
        _notify(self)

    def close(self) -> None:
        with self.lock:
            self.connection.close()


@contextmanager
def opening(what: str, where: str) -> Iterator[None]:
    """Around opening (and migrating) a store: a database error on the way becomes a
    StoreError that names the store and where it is (a file that is no database, a PostgreSQL
    role without the rights to create tables, ...)."""
    try:
        yield
    except StoreError:
        raise
    except Exception as exc:
        if isinstance(exc, sqlite3.Error) or type(exc).__module__.split(".")[0] == "psycopg":
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StoreError(f"{where}: cannot open {what}: {reason}") from None
        raise


def open_database(where: Database | str | Path, store: str, **sqlite_options: Any) -> Database:
    """`where` itself when it is a Database, else the SQLite file at that path."""
    if isinstance(where, (str, Path)):
        return SQLiteDatabase(where, store=store, **sqlite_options)
    return where


@dataclass
class Storage:
    """The databases of one gateway process: SQLite files under `data_dir` (`url` None), or
    the PostgreSQL database at `url`, whose connection pool every store shares."""

    data_dir: Path
    url: str | None = field(default=None, repr=False)  # may hold a password
    pool_size: int = 10
    timeout: float = 5.0
    _backend: Any = field(default=None, repr=False)

    @property
    def dialect(self) -> Dialect:
        return SQLITE if self.url is None else POSTGRESQL

    def open(self) -> Storage:
        """Connect (PostgreSQL); StoreUnavailable says why it cannot, naming no password."""
        if self.url is not None and self._backend is None:
            from common.postgres import PostgresBackend

            self._backend = PostgresBackend.connect(self.url, pool_size=self.pool_size,
                                                    timeout=self.timeout)
        return self

    def database(self, store: str, **sqlite_options: Any) -> Database:
        """The database of one store (`STORE_NAMES`)."""
        if store not in STORE_NAMES:
            raise ValueError(f"unknown store {store!r}")
        if self.url is None:
            return SQLiteDatabase(self.data_dir / f"{store}.db", store=store, **sqlite_options)
        self.open()
        database: Database = self._backend.database(store)
        return database

    def dedicated_connection(self) -> Any:
        """A PostgreSQL connection of its own, outside the pool, with the stores' settings (a
        LISTEN needs one that stays open: `pep.cluster`); StoreUnavailable when it cannot."""
        if self.url is None:
            raise ValueError("SQLite files have no connections to listen on")
        self.open()
        return self._backend.dedicated_connection()

    def describe(self) -> str:
        """Where everything is kept, for the banner and messages (never a password)."""
        if self.url is None:
            return f"SQLite files under {self.data_dir}"
        from common.postgres import describe_url

        return f"PostgreSQL {describe_url(self.url)}"

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None


def open_storage(data_dir: str | Path, url: str | None = None, *, pool_size: int = 10,
                 timeout: float = 5.0) -> Storage:
    """The storage a gateway's configuration chose (`store`), connected."""
    return Storage(Path(data_dir), url or None, pool_size, timeout).open()


__all__ = ["Cursor", "Database", "Dialect", "POSTGRESQL", "Row", "SQLITE", "STORE_NAMES",
           "SQLiteDatabase", "Storage", "StoreError", "StoreUnavailable", "open_database",
           "open_storage", "opening", "upsert_sql"]
