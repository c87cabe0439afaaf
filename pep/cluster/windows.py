"""The one-window rule kept in the store: at most one live query per (subject, stream), whichever
process opens it (`pep.handles.one_window` keeps it in memory, for one process).

A booking (subject, stream) -> (handle, plan key) is a row of `window_bookings`, written in a
transaction that holds the subject's lock (PostgreSQL: an advisory lock), so two processes
cannot book one slot twice. A booking counts while its handle is live, or while it is being
opened (no handle row yet, booked less than `IN_FLIGHT` seconds ago). A handle that ends frees
its slots (`release_many`, one statement for a revocation's every handle); a booking whose
handle ended without that (its process died in between), or was never written and is older
than `IN_FLIGHT` (its process died while opening it), is free again.
"""
from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable

from common.db import Cursor, Database, opening
from common.migrations import migrate
from pep.cluster.store import NOW, SCHEMA
from pep.handles.one_window import Booking, WindowConflict, _conflict_message, _streams

IN_FLIGHT = 60.0  # seconds a booking without its handle yet still counts


class StoreWindows:
    """`WindowRegistryLike` over the cluster's `window_bookings` (the module docstring)."""

    def __init__(self, db: Database, new_handle_id: Callable[[], str] | None = None) -> None:
        with opening("cluster tables", db.describe()):
            migrate(db, SCHEMA)
        self._db = db
        self._new_id = new_handle_id or (lambda: secrets.token_urlsafe(24))

    def _lock(self, cur: Cursor, subject: str) -> None:
        if self._db.dialect.name == "postgresql":
            cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 11))", (subject,))

    @staticmethod
    def _counting(cur: Cursor, subject: str, streams: tuple[str, ...]) -> dict[str, Booking]:
        """The bookings of these slots that count (the module docstring)."""
        marks = ", ".join("?" for _ in streams)
        rows = cur.execute(
            "SELECT b.stream, b.plan_key, b.handle_id FROM window_bookings b"
            " LEFT JOIN handles h ON h.id = b.handle_id"
            f" WHERE b.subject = ? AND b.stream IN ({marks}) AND (h.state = 'live' OR"
            f" (h.id IS NULL AND b.booked_at > {NOW} - ?))",
            (subject, *streams, IN_FLIGHT)).fetchall()
        return {str(s): Booking(subject, str(s), str(k), str(h)) for s, k, h in rows}

    @staticmethod
    def _slots(cur: Cursor, handle_id: str) -> int:
        return int(cur.execute("SELECT COUNT(*) FROM window_bookings WHERE handle_id = ?",
                               (handle_id,)).fetchone()[0])

    @staticmethod
    def _book(cur: Cursor, subject: str, streams: tuple[str, ...], plan_key: str,
              handle_id: str) -> None:
        cur.executemany("INSERT INTO window_bookings (subject, stream, handle_id, plan_key,"
                        f" booked_at) VALUES (?, ?, ?, ?, {NOW}) ON CONFLICT (subject, stream)"
                        " DO UPDATE SET handle_id = excluded.handle_id,"
                        " plan_key = excluded.plan_key, booked_at = excluded.booked_at",
                        [(subject, s, handle_id, plan_key) for s in streams])

    def _held(self, cur: Cursor, subject: str, streams: tuple[str, ...],
              plan_key: str) -> str | None:
        """As `WindowRegistry._held`: the handle holding exactly these slots with this plan,
        None when all are free; WindowConflict naming another query's handle."""
        found = self._counting(cur, subject, streams)
        if not found:
            return None
        for booking in found.values():
            if booking.plan_key != plan_key:
                raise WindowConflict(booking.handle_id, _conflict_message(booking))
        ids = {b.handle_id for b in found.values()}
        if len(found) == len(streams) and len(ids) == 1:
            only = ids.pop()
            if self._slots(cur, only) == len(streams):
                return only
        other = next(iter(found.values()))
        raise WindowConflict(other.handle_id, _conflict_message(other))

    def acquire(self, subject: str, stream: str | tuple[str, ...], plan_key: str
                ) -> tuple[str, bool]:
        streams = _streams(stream)
        with self._db.transaction() as cur:
            self._lock(cur, subject)
            held = self._held(cur, subject, streams, plan_key)
            if held is not None:
                return held, False
            handle_id = self._new_id()
            self._book(cur, subject, streams, plan_key, handle_id)
        return handle_id, True

    def release(self, handle_id: str) -> bool:
        """Free the handle's slots (it ended, or its opening was refused); False if it held
        none."""
        return self._db.execute("DELETE FROM window_bookings WHERE handle_id = ?",
                                (handle_id,)) > 0

    def release_many(self, handle_ids: Iterable[str]) -> None:
        """`release` for many handles in one statement (a revocation pass)."""
        ids = list(handle_ids)
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            marks = ", ".join("?" for _ in chunk)
            self._db.execute(f"DELETE FROM window_bookings WHERE handle_id IN ({marks})", chunk)

    def restore(self, subject: str, stream: str | tuple[str, ...], plan_key: str,
                handle_id: str) -> None:
        """The handle (live, resumed by this process) holds its slots again."""
        streams = _streams(stream)
        with self._db.transaction() as cur:
            self._lock(cur, subject)
            for booking in self._counting(cur, subject, streams).values():
                if booking.handle_id != handle_id:
                    raise WindowConflict(booking.handle_id, _conflict_message(booking))
            self._book(cur, subject, streams, plan_key, handle_id)

    def lookup(self, subject: str, stream: str) -> Booking | None:
        with self._db.transaction() as cur:
            return self._counting(cur, subject, (stream,)).get(stream)

    def __len__(self) -> int:
        row = self._db.fetchone("SELECT COUNT(DISTINCT b.handle_id) FROM window_bookings b"
                                " JOIN handles h ON h.id = b.handle_id WHERE h.state = 'live'")
        return int(row[0]) if row else 0


__all__ = ["IN_FLIGHT", "StoreWindows"]
