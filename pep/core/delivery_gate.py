"""Revocation before rows: while a pass decides handles again, row deliveries wait.

A revocation pass is pure Python (deciding each affected handle's request again, closing the
buffers of those that lost their grant), and so is a micro-batch's routing of rows into a
thousand buffers: in one process they share one interpreter lock. With rows flowing at 100,000/s
a pass over 1,000 handles took 0.45-0.75 s to its last reader instead of the 0.1-0.15 s it
takes alone. A pass is the more urgent (it ends access that is no longer granted), so while one
runs, deliveries pause at their next handle (`pep.runtime.base.delivery.deliver_to`, before a
handle's lock is taken) and the CPU goes to the pass; the event loop keeps writing what is in
the buffers (the `revoked` events among it).

Bounded: a delivery waits at most `MAX_HOLD` seconds, whatever the pass does (a pass over
thousands of handles, or one waiting on something that waits for a delivery), then goes on.
A pass closes the gate only while it decides; ending and detaching the revoked handles (which
may wait for a micro-batch to be delivered) happen after it opened again.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

MAX_HOLD = 1.0  # seconds a delivery waits for passes, at most


class DeliveryGate:
    """Closed while any pass runs; deliveries wait at it (see the module docstring)."""

    def __init__(self, max_hold: float = MAX_HOLD) -> None:
        self.max_hold = max_hold
        self._cond = threading.Condition()
        self._holders: dict[int, int] = {}  # thread id -> how many passes it runs (nested)

    @contextmanager
    def closed(self) -> Iterator[None]:
        """Close the gate for the duration (passes may overlap and nest)."""
        me = threading.get_ident()
        with self._cond:
            self._holders[me] = self._holders.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                left = self._holders[me] - 1
                if left:
                    self._holders[me] = left
                else:
                    del self._holders[me]
                if not self._holders:
                    self._cond.notify_all()

    @property
    def is_open(self) -> bool:
        return not self._holders

    def wait_open(self) -> bool:
        """Wait until no pass runs, at most `max_hold` seconds; True if the gate is open. A
        thread that runs a pass itself does not wait for it."""
        if not self._holders:  # the usual case: no lock taken
            return True
        with self._cond:
            if threading.get_ident() in self._holders:
                return True
            return self._cond.wait_for(lambda: not self._holders, self.max_hold)


# One per process: the passes (pep.handles.revocation) and the deliveries
# (pep.runtime.base.delivery) of one gateway share its interpreter lock, which is what the gate
# is about.
DELIVERY_GATE = DeliveryGate()


__all__ = ["DeliveryGate", "DELIVERY_GATE", "MAX_HOLD"]
