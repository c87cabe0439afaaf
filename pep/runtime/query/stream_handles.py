"""A stream's handles, whichever query serves it: its own (`executor.py`) or the shared one
(`pep/runtime/shared/member.py`).

Both make the same parts for a stream (`PlanRegistry`, `ResultRouter`, `QueryFigures`); what the
stream runtime asks about its handles is the same of either: attach one, detach one, the
handles left, the ones to carry over to a new query, the lateness of its time windows and the
stream's counters. This part answers it once, over those parts, and each executor holds one
(`executor.handles`) instead of repeating the calls.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pep.runtime.base.delivery import Deliver
from pep.runtime.plans.compile import CompiledPlan, CompiledUnion
from pep.runtime.query.figures import QueryFigures
from pep.runtime.query.registry import PlanRegistry
from pep.runtime.query.router import ResultRouter


class StreamHandles:
    """The handles of one stream (its `registry`), the lateness its `router` applies to their
    time windows, and its counters (`figures`). `on_change()`: called once a handle was added
    or removed (a query whose mode follows its plans, `QueryLifecycle.plans_changed`)."""

    def __init__(self, registry: PlanRegistry, router: ResultRouter, figures: QueryFigures,
                 on_change: Callable[[], None] | None = None) -> None:
        self._registry = registry
        self._router = router
        self._figures = figures
        self._on_change = on_change

    def add_handle(self, handle_id: str, compiled: CompiledPlan | CompiledUnion,
                   deliver: Deliver) -> None:
        self._registry.add_handle(handle_id, compiled, deliver)
        if self._on_change is not None:
            self._on_change()

    def remove_handle(self, handle_id: str) -> int:
        """Detach a handle (waiting for a delivery to it in progress); returns handles left."""
        left = self._registry.remove_handle(handle_id)
        if self._on_change is not None:
            self._on_change()
        return left

    def attached(self) -> list[tuple[str, CompiledPlan | CompiledUnion, Deliver]]:
        """The active handles with their plans (to move them onto a replacement query)."""
        return self._registry.attached()

    def has_handles(self) -> bool:
        return self._registry.has_handles()

    @property
    def lateness(self) -> float:
        """Seconds a time window's tuples may come late (`ResultRouter`)."""
        return self._router.lateness

    @lateness.setter
    def lateness(self, seconds: float) -> None:
        self._router.lateness = seconds

    def counters(self, query_id: str | None) -> dict[str, Any]:
        """The stream's figures with its handles', plans' and windows' (`stats()` adds the
        query's health)."""
        out = self._figures.snapshot()
        plans = self._registry.stats()
        out.update(handles=plans["handles"], plans=plans["plans"], query_id=query_id,
                   late_rows=plans["late_rows"] + out["late_rows"],
                   window_panes=plans["window_panes"])
        return out


__all__ = ["StreamHandles"]
