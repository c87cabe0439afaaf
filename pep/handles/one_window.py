"""At most one live query per (subject, stream).

eXACML+ section 3.4 (Example 2): with several sum windows of sizes N, N+1, ..., N+M over the
same stream, differences of their outputs rebuild the raw stream the policy meant to hide. So a
consumer holds at most one query per stream at a time. Repeating the identical request (same plan
key) is harmless and maps to the same handle; a different query must wait until the first handle
is released. The registry only books slots; the runtime starts and stops the queries.

A join reads two streams, so its handle books a slot on each (all or none): a consumer's live
queries on a stream include the joins that read it, and a join cannot open while another query
of the caller's is live on either of its streams (the conflict names that query's handle).
"""
from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pep.core.errors import Conflict


class WindowConflict(Conflict):
    """The subject already holds a different query on this stream; names the handle to release."""

    def __init__(self, existing_handle_id: str, message: str) -> None:
        super().__init__(message)
        self.existing_handle_id = existing_handle_id


@dataclass(frozen=True)
class Booking:
    subject: str
    stream: str
    plan_key: str
    handle_id: str


class WindowRegistry:
    """Thread-safe bookings of (subject, stream) -> one handle; a join's handle holds two."""

    def __init__(self, new_handle_id: Callable[[], str] | None = None) -> None:
        self._new_id = new_handle_id or (lambda: secrets.token_urlsafe(24))
        self._lock = threading.Lock()
        self._by_slot: dict[tuple[str, str], Booking] = {}
        self._by_handle: dict[str, list[Booking]] = {}

    def acquire(self, subject: str, stream: str | tuple[str, ...], plan_key: str
                ) -> tuple[str, bool]:
        """(handle id, is_new) for a query on `stream` (a join: a tuple of its streams, all
        booked or none). Raises WindowConflict when a different query holds one of the slots."""
        streams = _streams(stream)
        with self._lock:
            held = self._held(subject, streams, plan_key)
            if held is not None:
                return held, False
            handle_id = self._new_id()
            while handle_id in self._by_handle:
                handle_id = self._new_id()
            self._book(subject, streams, plan_key, handle_id)
            return handle_id, True

    def release(self, handle_id: str) -> bool:
        """Free every slot held by this handle; False if it held none."""
        with self._lock:
            bookings = self._by_handle.pop(handle_id, None)
            if not bookings:
                return False
            for booking in bookings:
                del self._by_slot[(booking.subject, booking.stream)]
            return True

    def release_many(self, handle_ids: Iterable[str]) -> None:
        """`release` each of these handles."""
        for handle_id in handle_ids:
            self.release(handle_id)

    def restore(self, subject: str, stream: str | tuple[str, ...], plan_key: str,
                handle_id: str) -> None:
        """Re-book a handle that survived a restart (persisted elsewhere)."""
        streams = _streams(stream)
        with self._lock:
            held = self._held(subject, streams, plan_key)
            if held is not None:
                if held == handle_id:
                    return
                raise WindowConflict(held, _conflict_message(self._by_slot[(subject,
                                                                            streams[0])]))
            if handle_id in self._by_handle:
                raise ValueError(f"handle {handle_id} is already booked for another slot")
            self._book(subject, streams, plan_key, handle_id)

    def lookup(self, subject: str, stream: str) -> Booking | None:
        with self._lock:
            return self._by_slot.get((subject, stream))

    def booking(self, handle_id: str) -> Booking | None:
        """The handle's (first) booking."""
        with self._lock:
            bookings = self._by_handle.get(handle_id)
            return bookings[0] if bookings else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_handle)

    def _held(self, subject: str, streams: tuple[str, ...], plan_key: str) -> str | None:
        """The handle holding exactly these slots with this plan, None when they are all free;
        raises WindowConflict naming the handle of another query on one of them."""
        found = [self._by_slot.get((subject, s)) for s in streams]
        if all(b is None for b in found):
            return None
        for booking in found:
            if booking is not None and booking.plan_key != plan_key:
                raise WindowConflict(booking.handle_id, _conflict_message(booking))
        ids = {b.handle_id if b is not None else None for b in found}
        only = next(iter(ids))
        if (len(ids) == 1 and only is not None
                and len(self._by_handle.get(only, ())) == len(streams)):
            return only
        other = next(b for b in found if b is not None)
        raise WindowConflict(other.handle_id, _conflict_message(other))

    def _book(self, subject: str, streams: tuple[str, ...], plan_key: str,
              handle_id: str) -> None:
        bookings = [Booking(subject, s, plan_key, handle_id) for s in streams]
        for booking in bookings:
            self._by_slot[(subject, booking.stream)] = booking
        self._by_handle[handle_id] = bookings


def _streams(stream: str | tuple[str, ...]) -> tuple[str, ...]:
    return (stream,) if isinstance(stream, str) else tuple(dict.fromkeys(stream))


def _conflict_message(booking: Booking) -> str:
    return (f"{booking.subject!r} already has a query running on stream {booking.stream!r} "
            f"(handle {booking.handle_id}); release that handle first (DELETE it): only one "
            "query per stream at a time, because several windows over one stream can rebuild "
            "the data the policy hides")
