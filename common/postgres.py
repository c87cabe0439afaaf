"""PostgreSQL as the gateway's store: one database, one connection pool per process (psycopg 3
and psycopg_pool), every store's tables in one schema.

The schema is `xsg` unless the URL's libpq `options` set a `search_path` (then its first
schema): `postgresql://xsg@db:5432/xsg?options=-c%20search_path%3Dgateway_a` keeps a second
gateway's tables apart in the same database. It is created when missing; each store then
creates and migrates its own tables there (`common.migrations`). Table names do not collide across
stores (a test holds it), so one schema holds them all.

Connections are checked when taken from the pool (a server restarted meanwhile costs no
failed request), cheaply (`check_pooled`: a round trip only for a connection the server wrote to
while it was idle, as a server that stops does, or one idle for `CHECK_IDLE_AFTER` seconds), made
with a time-out, and autocommit outside `transaction()` (a read is one round trip). Each session
waits at most `lock_timeout` for a row another process holds, and the server ends one left idle
inside a transaction (`SESSION_SETTINGS`; a URL's own options win). When
the server cannot be reached, reads and writes raise `StoreUnavailable` with the reason; the pool
keeps trying in the background, and the first success after a failure is logged once, as the failure
was. When the server can be reached but every pooled connection stayed busy for the time-out (a
burst of requests), the caller gets `StoreBusy` (a `StoreUnavailable`: 503 with Retry-After) and the
store is not counted as away: load is not an outage.

Nothing here ever prints the URL's password: messages name user, host, port, database and schema
(`describe_url`).
"""
from __future__ import annotations

import functools
import logging
import re
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from common.db import POSTGRESQL, StoreUnavailable, _notify

log = logging.getLogger(__name__)

DEFAULT_SCHEMA = "xsg"
# the first key of the lock a schema is created under (`connect`; with the name's hash as the
# second): any fixed 32-bit number, xsg's own (migrations lock a 64-bit key: another space)
SCHEMA_LOCK = 0x78736701
NO_FREE_CONNECTION = "no connection free in time"
RECONNECT_SECONDS = 10.0  # the pool retries a failed connection this long, then on demand
DOWN_WAIT = 1.0  # seconds a connection is waited for while the store is known to be down
# a pooled connection idle for longer than this is checked with a round trip when taken (one
# used more recently is checked without one: `check_pooled`)
CHECK_IDLE_AFTER = 5.0
BUSY_LOG_EVERY = 60.0  # seconds between two log lines of a pool with no connection free
# Each session's bounds: a write waits at most this long for a row another process locked (then
# StoreUnavailable: a 503, nothing changed), and the server ends a session left idle inside a
# transaction (a hung process) so that it holds no lock for long (the version clock's row)
SESSION_SETTINGS = (("lock_timeout", "30s"), ("idle_in_transaction_session_timeout", "60s"))
SCHEMES = ("postgresql", "postgres")
_SEARCH_PATH = re.compile(r"(?:^|\s)-c\s*search_path\s*=\s*([^\s]+)")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
# where libpq says the server is, in its messages ("connection to server at "10.0.0.5", port
# 5432 failed: ...", "... on socket "/run/..." failed: ...")
_WHERE = re.compile(r'connection to server (?:at "[^"]*"(?: \([^)]*\))?, port \d+|on socket '
                    r'"[^"]*") failed: ')


def check_url(url: str) -> dict[str, Any]:
    """The connection parameters of a PostgreSQL URL; ValueError says what is wrong with it
    (never echoing its password)."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"expected a PostgreSQL URL (postgresql://user@host:port/database), "
                         f"found {parts.scheme + '://...' if parts.scheme else 'no scheme'}")
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise ValueError(_scrub(_first_line(exc), url)) from None
    for port in str(params.get("port") or "5432").split(","):
        if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"the port {port!r} is not a number from 1 to 65535")
    schema_of(params)
    return params


def schema_of(params: dict[str, Any]) -> str:
    """The schema the gateway's tables live in (module docstring)."""
    found = _SEARCH_PATH.search(str(params.get("options") or ""))
    if found is None:
        return DEFAULT_SCHEMA
    schema = found.group(1).split(",")[0].strip().strip('"')
    if not _IDENTIFIER.fullmatch(schema):
        raise ValueError(f"the search_path in the URL's options names {schema!r}, not a "
                         "schema name xsg can create ([A-Za-z_][A-Za-z0-9_]*)")
    return schema


def describe_url(url: str) -> str:
    """user@host:port/database (schema ...): where the store is, without a password."""
    try:
        params = conninfo_to_dict(url)
        schema = schema_of(params)
    except (psycopg.Error, ValueError):
        return "(a URL that does not parse)"
    user = str(params.get("user") or "")
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    return (f"{user + '@' if user else ''}{host}:{port}/{params.get('dbname') or user}"
            f" (schema {schema})")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0].strip()


def _scrub(text: str, url: str) -> str:
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    return text.replace(password, "***") if password else text


@functools.lru_cache(maxsize=1024)
def translate(statement: str) -> str:
    """A statement with `?` placeholders (SQLite's, the stores' one form) in psycopg's: `?`
    outside quotes becomes `%s`, and every `%` (a LIKE pattern's) is doubled."""
    out: list[str] = []
    quoted = False
    for char in statement:
        if char == "'":
            quoted = not quoted
        if char == "%":
            out.append("%%")
        elif char == "?" and not quoted:
            out.append("%s")
        else:
            out.append(char)
    return "".join(out)


# a pooled connection -> when it was last given back to the pool (`PostgresBackend.connection`;
# not the pool's `reset` callback: with one, the pool hands every connection given back to a
# worker thread before another caller may have it)
_returned: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = \
    weakref.WeakKeyDictionary()


def check_pooled(conn: psycopg.Connection[Any]) -> None:
    """The pool's `check` callback, run on every connection taken from it: raises for one that
    does not work (the pool then discards it and takes another), without a round trip when it
    can tell. `ConnectionPool.check_connection` sends an empty query each time (a round trip
    per look at the store, under load the most of an edge's look); here the round trip is
    made only for a connection that was idle more than `CHECK_IDLE_AFTER` seconds, or that the
    server wrote to while it was idle: a server that stops or restarts ends its sessions with
    a message and closes them, which makes their sockets readable (an idle autocommit session
    is sent nothing else: the gateway does not LISTEN on pooled connections). A connection cut
    without a word (a host gone) hangs the empty query as it would the real one."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    since = _returned.get(conn)
    if since is not None and time.monotonic() - since < CHECK_IDLE_AFTER:
        poller = select.poll()  # not select(): an edge's descriptors pass 1024
        poller.register(conn.pgconn.socket, select.POLLIN | select.POLLERR | select.POLLHUP)
        if not poller.poll(0):
            return
    ConnectionPool.check_connection(conn)


class StoreBusy(StoreUnavailable):
    """The server answers, but no pooled connection came free within the time-out: load (a
    burst of requests), not an outage. A 503 with Retry-After as `StoreUnavailable`; the store
    is not counted as away."""


class PostgresCursor:
    """A psycopg cursor that takes the stores' statements (`translate`)."""

    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def execute(self, statement: str, params: Sequence[Any] = (), /) -> PostgresCursor:
        self._cursor.execute(translate(statement), tuple(params))
        return self

    def executemany(self, statement: str, params: Iterable[Sequence[Any]], /) -> PostgresCursor:
        """One statement for many rows, sent in one pipeline (not a round trip per row)."""
        self._cursor.executemany(translate(statement), [tuple(p) for p in params])
        return self

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()


class PostgresBackend:
    """The pool every store of this process shares, and the store's reachability."""

    def __init__(self, url: str, pool: ConnectionPool, schema: str, timeout: float,
                 conninfo: str | None = None) -> None:
        self.url = url
        self.conninfo = conninfo or url  # the pool's: the schema and session settings in it
        self.schema = schema
        self.timeout = timeout
        self._pool = pool
        self._down_since: float | None = None
        self._state_lock = threading.Lock()
        self._probe: tuple[float, str] = (0.0, "")
        self._busy_logged = -BUSY_LOG_EVERY

    @classmethod
    def connect(cls, url: str, *, pool_size: int = 10, timeout: float = 5.0) -> PostgresBackend:
        """Connect once directly (so that a failure says why), create the schema when missing,
        then open the pool; StoreUnavailable (a StoreError) says what went wrong."""
        try:
            params = check_url(url)
        except ValueError as exc:
            raise StoreUnavailable(f"not a usable PostgreSQL URL: {exc}") from None
        schema = schema_of(params)
        options = str(params.get("options") or "")
        if not _SEARCH_PATH.search(options):
            options = f"{options} -c search_path={schema}".strip()
        for name, value in SESSION_SETTINGS:  # unless the URL sets them
            if name not in options:
                options += f" -c {name}={value}"
        conninfo = make_conninfo(url, options=options,
                                 application_name=params.get("application_name") or "xsg")
        connect_timeout = max(2, int(round(timeout)))
        where = describe_url(url)
        try:
            with psycopg.connect(conninfo, connect_timeout=connect_timeout,
                                 autocommit=True) as conn:
                found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                                     (schema,)).fetchone()
                if found is None:
                    # `CREATE SCHEMA IF NOT EXISTS` is not safe against a concurrent one (the
                    # second fails on pg_namespace's unique index): processes starting together
                    # create it one at a time, under a lock of the schema's name
                    with conn.transaction():
                        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                                     (SCHEMA_LOCK, schema))
                        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                            sql.Identifier(schema)))
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot use PostgreSQL at {where}: "
                                   f"{_scrub(_first_line(exc), url)}") from None
        pool = ConnectionPool(conninfo, min_size=1, max_size=max(1, pool_size), timeout=timeout,
                              kwargs={"autocommit": True, "connect_timeout": connect_timeout},
                              check=check_pooled,
                              reconnect_timeout=RECONNECT_SECONDS, name="xsg-store", open=False)
        try:
            pool.open(wait=True, timeout=max(timeout, 1.0))
        except PoolTimeout:
            pool.close()
            raise StoreUnavailable(f"cannot use PostgreSQL at {where}: no connection within "
                                   f"{timeout:g} s") from None
        log.info("store: PostgreSQL %s (a pool of up to %d connections)", where, pool_size)
        return cls(url, pool, schema, timeout, conninfo)

    def describe(self) -> str:
        return describe_url(self.url)

    def dedicated_connection(self) -> psycopg.Connection[Any]:
        """A connection of its own (autocommit), as the pool makes them; StoreUnavailable when
        the server cannot be reached."""
        try:
            return psycopg.connect(self.conninfo, autocommit=True,
                                   connect_timeout=max(2, int(round(self.timeout))))
        except psycopg.Error as exc:
            raise self._unavailable(_scrub(_first_line(exc), self.url)) from None

    def database(self, store: str) -> PostgresDatabase:
        return PostgresDatabase(self, store)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection (autocommit); a connection failure becomes StoreUnavailable.
        While the store is known to be down, a connection is waited for at most a second, so
        that the 503s come quickly (the pool keeps reconnecting in the background)."""
        wait = self.timeout if self._down_since is None else min(self.timeout, DOWN_WAIT)
        try:
            with self._pool.connection(timeout=wait) as conn:
                try:
                    yield conn
                finally:
                    _returned[conn] = time.monotonic()
        except PoolTimeout:
            reason = self._reason()
            if reason == NO_FREE_CONNECTION:
                raise self._busy(wait) from None
            raise self._unavailable(reason) from None
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise self._unavailable(_scrub(_first_line(exc), self.url)) from None
        else:
            if self._down_since is not None:
                self._back()

    def _reason(self) -> str:
        """Why no connection came in time: the error of one direct attempt (made at most
        once a second, so an outage under load does not add a connection per request)."""
        at, reason = self._probe
        now = time.monotonic()
        if now - at < 1.0 and reason:
            return reason
        try:
            with psycopg.connect(self.url, connect_timeout=2):
                reason = NO_FREE_CONNECTION
        except psycopg.Error as exc:
            reason = _scrub(_first_line(exc), self.url)
        self._probe = (now, reason)
        return reason

    def _busy(self, waited: float) -> StoreBusy:
        """No pooled connection free in time while the server answers: load. Logged at most
        once a minute (a burst answers many requests 503)."""
        now = time.monotonic()
        if now - self._busy_logged >= BUSY_LOG_EVERY:
            self._busy_logged = now
            log.warning("store: PostgreSQL %s answers, but none of the pool's %d connections "
                        "came free within %g s: requests are answered 503 (retry) meanwhile",
                        self.describe(), self._pool.max_size, waited)
        return StoreBusy(f"the store is busy, nothing was changed: no connection came free "
                         f"within {waited:g} s; retry")

    def _unavailable(self, reason: str) -> StoreUnavailable:
        """The error a caller gets: the reason without where the database is (clients are told
        why, not the database's address; the log says both, once)."""
        with self._state_lock:
            first = self._down_since is None
            if first:
                self._down_since = time.monotonic()
        if first:
            log.warning("store: PostgreSQL %s cannot be reached (%s); its reads and writes are "
                        "answered 503 until it is back", self.describe(), reason)
        public = _WHERE.sub("", reason).strip() or "connection failed"
        return StoreUnavailable(f"the store cannot be reached, nothing was changed: {public}")

    def _back(self) -> None:
        with self._state_lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            log.info("store: PostgreSQL %s is reachable again (after %.1f s)", self.describe(),
                     time.monotonic() - since)

    def close(self) -> None:
        self._pool.close()


class PostgresDatabase:
    """One store's view of the shared database (`common.db.Database`)."""

    dialect = POSTGRESQL

    def __init__(self, backend: PostgresBackend, store: str) -> None:
        self._backend = backend
        self.store = store
        self.lock = threading.RLock()
        self.on_commit: list[Callable[[str], None]] = []
        self._local = threading.local()  # the cursor of this thread's open transaction

    def describe(self) -> str:
        return f"PostgreSQL {self._backend.describe()}, {self.store} tables"

    @contextmanager
    def _cursor(self) -> Iterator[PostgresCursor]:
        held: PostgresCursor | None = getattr(self._local, "cursor", None)
        if held is not None:  # inside this thread's transaction: see its writes
            yield held
            return
        with self._backend.connection() as conn, conn.cursor() as cursor:
            yield PostgresCursor(cursor)

    def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        with self.lock:
            with self._cursor() as cur:
                changed = cur.execute(statement, params).rowcount
        _notify(self)
        return changed

    def fetchone(self, statement: str, params: Sequence[Any] = ()) -> Any:
        with self._cursor() as cur:
            return cur.execute(statement, params).fetchone()

    def fetchall(self, statement: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._cursor() as cur:
            return cur.execute(statement, params).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[PostgresCursor]:
        """BEGIN ... COMMIT on one pooled connection, under this store's lock; ROLLBACK on any
        exception (a connection lost meanwhile: StoreUnavailable, nothing kept)."""
        with self.lock:
            if getattr(self._local, "cursor", None) is not None:
                raise RuntimeError(f"a transaction of the {self.store} store is already open "
                                   "in this thread")
            with self._backend.connection() as conn:
                with conn.transaction(), conn.cursor() as raw:
                    cursor = PostgresCursor(raw)
                    self._local.cursor = cursor
                    try:
                        yield cursor
                    finally:
                        self._local.cursor = None
        _notify(self)

    def close(self) -> None:
        """Nothing of its own: the pool is the backend's (`common.db.Storage.close`)."""


__all__ = ["DEFAULT_SCHEMA", "PostgresBackend", "PostgresCursor", "PostgresDatabase", "StoreBusy",
           "check_pooled", "check_url", "describe_url", "schema_of", "translate"]
