"""The audit trail as a table of the store: what `pep.audit.log` keeps in files, kept in the
PostgreSQL database when the gateway's store is PostgreSQL (every process on it then writes one
trail, and no entry lives on one machine's disk only).

Append-only: entries are inserted, never updated or deleted by the gateway. Each is the same
JSON object the files hold (`pep.audit.log`: time, seq, kind, fields; the same fields are
refused), with kind, subject and time beside it as columns for the queries. `seq` is serial
across every process on the store: a batch takes its numbers from the one row of `audit_clock`,
which stays locked until the batch commits, so entries commit in `seq` order and without gaps
(a reader following `after` misses none). A batch is one transaction: all its entries or none.

A query filters kind, subject, time and `after` in SQL, then, newest first, the streams and what
the caller may see (`pep.audit.views`) in Python, until it has `limit` entries; it answers them
oldest first, as the files do.

Retention is the operator's: the table is never pruned by the gateway (the files rotate; see
README "Operating: PostgreSQL store").
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from common.db import Database, open_database, opening
from common.migrations import Schema, Step, migrate
from pep.audit.log import _now, checked, encode, matches, new_entry
from pep.audit.views import AuditEntry, EntryView
from pep.core.jsontypes import JsonValue

PAGE = 500  # entries read at a time
ROWS_PER_INSERT = 150  # entries written per INSERT statement (`record_many`)

_TABLES = (
    "CREATE TABLE audit_entries (seq {int} PRIMARY KEY, time TEXT{c} NOT NULL,"
    " kind TEXT{c} NOT NULL, subject TEXT{c}, entry TEXT NOT NULL)",
    "CREATE INDEX audit_entries_kind ON audit_entries (kind, seq)",
    "CREATE INDEX audit_entries_subject ON audit_entries (subject, seq)",
    "CREATE TABLE audit_clock (id INTEGER PRIMARY KEY CHECK (id = 1), last {int} NOT NULL)",
    "INSERT INTO audit_clock (id, last) VALUES (1, 0)",
)
# the trail's versioned schema (`common.migrations`); texts compare as bytes on either database
SCHEMA = Schema("audit", (
    Step("audit entries and their sequence clock",
         sqlite=tuple(t.format(int="INTEGER", c="") for t in _TABLES),
         postgresql=tuple(t.format(int="BIGINT", c=' COLLATE "C"') for t in _TABLES)),
))


class AuditTable:
    """`pep.audit.log.AuditRecords` on a store's database (see the module docstring)."""

    def __init__(self, where: Database | str | Path) -> None:
        with opening("audit trail", str(where)):
            self._db = open_database(where, "audit")
        try:
            with opening("audit trail", self._db.describe()):
                migrate(self._db, SCHEMA)
        except BaseException:
            self._db.close()
            raise

    def record(self, kind: str, **fields: JsonValue) -> AuditEntry:
        """Append one entry; returns it. Fields that could hold secrets are refused."""
        return self.record_many([(kind, fields)])[0]

    def record_many(self, items: Iterable[tuple[str, AuditEntry]]) -> list[AuditEntry]:
        """Append entries (kind, fields) in one transaction, all checked before any is
        written."""
        items = checked(items)
        if not items:
            return []
        with self._db.transaction() as cur:
            last = int(cur.execute("UPDATE audit_clock SET last = last + ? WHERE id = 1"
                                   " RETURNING last", (len(items),)).fetchone()[0])
            now = _now()
            entries = [new_entry(now, last - len(items) + n, kind, fields)
                       for n, (kind, fields) in enumerate(items, 1)]
            rows = [(e["seq"], now, e["kind"], _text(e.get("subject")), encode(e))
                    for e in entries]
            # rows per statement (5 parameters each, within SQLite's 999): a revocation of 1,000
            # handles took 89 ms as one row per statement in PostgreSQL's pipeline
            for start in range(0, len(rows), ROWS_PER_INSERT):
                chunk = rows[start:start + ROWS_PER_INSERT]
                cur.execute("INSERT INTO audit_entries (seq, time, kind, subject, entry) VALUES "
                            + ", ".join(["(?, ?, ?, ?, ?)"] * len(chunk)),
                            [v for row in chunk for v in row])
        return entries

    def _pages(self, where: str, params: list[str | int],
               newest_first: bool) -> Iterator[AuditEntry]:
        """The entries that pass the SQL conditions, a page at a time."""
        order = "DESC" if newest_first else "ASC"
        bound: int | None = None
        while True:
            conditions = [where] if where else []
            if bound is not None:
                conditions.append("seq < ?" if newest_first else "seq > ?")
            sql = ("SELECT entry FROM audit_entries"
                   + (" WHERE " + " AND ".join(conditions) if conditions else "")
                   + f" ORDER BY seq {order} LIMIT {PAGE}")
            rows = self._db.fetchall(sql, params + ([bound] if bound is not None else []))
            for (text,) in rows:
                entry = json.loads(text)
                bound = int(entry["seq"])
                yield entry
            if len(rows) < PAGE:
                return

    def entries(self) -> Iterator[AuditEntry]:
        """Every entry, oldest first."""
        return self._pages("", [], newest_first=False)

    def query(self, *, kinds: Iterable[str] | None = None, stream: str | None = None,
              subject: str | None = None, since: str | None = None, until: str | None = None,
              after_seq: int | None = None, view: EntryView | None = None,
              limit: int = 1000) -> list[AuditEntry]:
        """As `pep.audit.log.AuditLog.query`: the newest `limit` matching entries (what `view`
        leaves of them), oldest first."""
        wanted = sorted(set(kinds)) if kinds else None
        conditions: list[str] = []
        params: list[str | int] = []
        if wanted is not None:
            conditions.append(f"kind IN ({', '.join('?' for _ in wanted)})")
            params.extend(wanted)
        for column, operator, value in (("subject", "=", subject), ("time", ">=", since),
                                        ("time", "<", until), ("seq", ">", after_seq)):
            if value is not None:
                conditions.append(f"{column} {operator} ?")
                params.append(value)
        out: list[AuditEntry] = []
        for entry in self._pages(" AND ".join(conditions), params, newest_first=True):
            if not matches(entry, set(wanted) if wanted else None, stream, subject, since,
                           until, after_seq):
                continue
            seen = view(entry) if view is not None else entry
            if seen is None:
                continue
            out.append(seen)
            if len(out) >= limit:
                break
        return out[::-1]

    def close(self) -> None:
        self._db.close()


def _text(value: JsonValue) -> str | None:
    return value if isinstance(value, str) else None


__all__ = ["AuditTable", "SCHEMA"]
