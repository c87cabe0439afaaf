"""At most one live query per (subject, stream).

eXACML+ section 3.4 (Example 2): with several sum windows of sizes N, N+1, ..., N+M over the
same stream, differences of their outputs rebuild the raw stream the policy meant to hide. So a
consumer holds at most one query per stream at a time. Repeating the identical request (same plan
key) is harmless and maps to the same handle; a different query must wait until the first handle
is released. The registry only books slots; the runtime starts and stops the queries.
"""
from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
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
    """Thread-safe bookings of (subject, stream) -> one handle."""

    def __init__(self, new_handle_id: Callable[[], str] | None = None) -> None:
        self._new_id = new_handle_id or (lambda: secrets.token_urlsafe(24))
        self._lock = threading.Lock()
        self._by_slot: dict[tuple[str, str], Booking] = {}
        self._by_handle: dict[str, Booking] = {}

    def acquire(self, subject: str, stream: str, plan_key: str) -> tuple[str, bool]:
        """(handle id, is_new). Raises WindowConflict when a different query holds the slot."""
        with self._lock:
            booking = self._by_slot.get((subject, stream))
            if booking is not None:
                if booking.plan_key == plan_key:
                    return booking.handle_id, False
                raise WindowConflict(booking.handle_id, _conflict_message(booking))
            handle_id = self._new_id()
            while handle_id in self._by_handle:
                handle_id = self._new_id()
            self._book(Booking(subject, stream, plan_key, handle_id))
            return handle_id, True

    def release(self, handle_id: str) -> bool:
        """Free the slot held by this handle; False if it held none."""
        with self._lock:
            booking = self._by_handle.pop(handle_id, None)
            if booking is None:
                return False
            del self._by_slot[(booking.subject, booking.stream)]
            return True

    def restore(self, subject: str, stream: str, plan_key: str, handle_id: str) -> None:
        """Re-book a handle that survived a restart (persisted elsewhere)."""
        with self._lock:
            booking = self._by_slot.get((subject, stream))
            if booking is not None:
                if booking.handle_id == handle_id and booking.plan_key == plan_key:
                    return
                raise WindowConflict(booking.handle_id, _conflict_message(booking))
            if handle_id in self._by_handle:
                raise ValueError(f"handle {handle_id} is already booked for another slot")
            self._book(Booking(subject, stream, plan_key, handle_id))

    def lookup(self, subject: str, stream: str) -> Booking | None:
        with self._lock:
            return self._by_slot.get((subject, stream))

    def booking(self, handle_id: str) -> Booking | None:
        with self._lock:
            return self._by_handle.get(handle_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_handle)

    def _book(self, booking: Booking) -> None:
        self._by_slot[(booking.subject, booking.stream)] = booking
        self._by_handle[booking.handle_id] = booking


def _conflict_message(booking: Booking) -> str:
    return (f"{booking.subject!r} already has a query running on stream {booking.stream!r} "
            f"(handle {booking.handle_id}); release that handle first (DELETE it): only one "
            "query per stream at a time, because several windows over one stream can rebuild "
            "the data the policy hides")
