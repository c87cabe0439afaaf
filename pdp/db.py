"""The one way xsg opens SQLite: WAL, synchronous=FULL, one connection shared under one lock.

Policies, streams and handles each live in their own database file, and all three want the same
things: a committed write survives a crash (synchronous=FULL), readers do not block the writer
(WAL), the server's threads share the connection (check_same_thread=False, guarded by an
RLock), and a write is exactly one transaction (isolation_level=None, BEGIN IMMEDIATE issued by
`transaction()`, rolled back on any exception so nothing is half-written).
"""
from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Database:
    """One SQLite file; `schema` (statements separated by ';') is applied in one transaction."""

    def __init__(self, path: str | Path, schema: str = "", *, foreign_keys: bool = False,
                 busy_timeout: float = 30.0) -> None:
        self.path = Path(path)
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
            if schema.strip():
                with self.transaction() as cur:
                    for statement in filter(str.strip, schema.split(";")):
                        cur.execute(statement)
        except BaseException:
            self.connection.close()
            raise

    def execute(self, sql: str, params: tuple | list = ()) -> sqlite3.Cursor:
        """One statement outside an explicit transaction (SQLite commits it by itself)."""
        with self.lock:
            return self.connection.execute(sql, params)

    def fetchone(self, sql: str, params: tuple | list = ()) -> Any:
        with self.lock:
            return self.connection.execute(sql, params).fetchone()

    def fetchall(self, sql: str, params: tuple | list = ()) -> list:
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

    def close(self) -> None:
        with self.lock:
            self.connection.close()


__all__ = ["Database"]
