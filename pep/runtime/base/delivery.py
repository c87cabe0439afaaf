"""Handing a batch to the handles attached to a query: the rule both runtimes (shared stream
queries and joins) follow, in one place.

While a revocation pass decides handles again, deliveries wait before each handle (at most a
second: `pep.core.delivery_gate`). Each handle is delivered under its own lock, so that a
revocation, which takes the same lock and marks it inactive, either happens before the write
(nothing delivered) or after it; a handle whose callback refuses (False) or fails is marked inactive
and reported closed, so the runtime detaches it.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, MutableMapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from common.errors import described
from pep.core.delivery_gate import DELIVERY_GATE
from pep.core.refs import handle_ref
from pep.core.rows import RowBatch

log = logging.getLogger(__name__)

Deliver = Callable[[RowBatch], bool]


class DeliveryTarget(Protocol):
    """An attached handle as delivery sees it (the runtimes' own handle records)."""

    active: bool
    delivered_rows: int

    @property
    def id(self) -> str: ...

    @property
    def deliver(self) -> Deliver: ...

    @property
    def lock(self) -> AbstractContextManager[Any]: ...


def deliver_to(handles: Iterable[DeliveryTarget], batch: RowBatch,
               counters: MutableMapping[str, Any]) -> list[str]:
    """Deliver `batch` to every active handle; the ids of those that closed on the way."""
    closed: list[str] = []
    for handle in handles:
        DELIVERY_GATE.wait_open()  # a revocation pass first (`pep.core.delivery_gate`)
        with handle.lock:
            if not handle.active:
                continue
            try:
                ok = handle.deliver(batch)
            except Exception as exc:  # noqa: BLE001 - one handle's failure detaches it, not the batch
                log.error("deliver of handle %s failed (%s); detaching it",
                          handle_ref(handle.id), described(exc))
                ok = False
            if ok is False:
                handle.active = False
                closed.append(handle.id)
            else:
                handle.delivered_rows += len(batch)
                counters["rows_delivered"] += len(batch)
    return closed


__all__ = ["Deliver", "DeliveryTarget", "deliver_to"]
