"""The plans attached to one stream's shared query: its handles, the plan states they share
(handles with the same plan key share one, computed once per micro-batch; a union of grants
shares its members'), the unions, and the registry's version with the plan sets of each
version. The one owner of this state: every other part reads it through `PlanRegistry`.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pep.runtime.base.delivery import Deliver
from pep.runtime.plans.clamp import is_private
from pep.runtime.plans.compile import CompiledPlan, CompiledUnion
from pep.runtime.plans.plan_schema import PLAIN, ROW_TUPLE, TIME, TUPLE
from pep.runtime.windows.pane_windows import PaneWindows


@dataclass
class AttachedHandle:
    id: str
    plan_id: int
    deliver: Deliver
    lock: threading.RLock = field(default_factory=threading.RLock)
    active: bool = True
    delivered_rows: int = 0
    union: str | None = None  # the key of the union of grants it reads (`pep.runtime.query.union`)


@dataclass
class PlanState:
    id: int
    compiled: CompiledPlan
    rows: bool  # its tuples come back as rows (plain plans, tuple windows with narrow panes)
    handles: dict[str, AttachedHandle] = field(default_factory=dict)
    windows: PaneWindows | None = None
    batches: int = 0
    unions: dict[str, int] = field(default_factory=dict)  # union key -> member index

    @property
    def used(self) -> bool:
        return bool(self.handles or self.unions)

    @property
    def kind(self) -> int:
        w = self.compiled.window
        if w is None:
            return PLAIN
        if w.kind == "time":
            return TIME
        return ROW_TUPLE if self.rows else TUPLE


@dataclass
class UnionState:
    """A union of grants: its members' plan ids (in the plan's order) and its handles."""

    compiled: CompiledUnion
    members: tuple[int, ...]
    handles: dict[str, AttachedHandle] = field(default_factory=dict)


@dataclass(frozen=True)
class PlanSets:
    """The attached plans of one version of the registry, and the subsets a micro-batch asks
    for. Built once per version (a handle attached or detached changes it): at 5,000 plans
    each pass over them cost 10-20 ms per batch while the event loop held the GIL."""

    version: int
    plans: list[PlanState]
    plain: list[PlanState]     # row plans whose filter can pass something (the rows job)
    windowed: list[PlanState]  # plans delivered through panes (the panes job)
    keeps_windows: bool          # some plan carries window state (routed in batch order)
    anchored: list[CompiledPlan]  # the plans whose filters read DISTANCE_TO anchors

    @staticmethod
    def of(version: int, plans: list[PlanState]) -> PlanSets:
        return PlanSets(version, plans,
                        [s for s in plans if s.rows and not s.compiled.passes_nothing],
                        [s for s in plans if not s.rows],
                        any(s.windows is not None for s in plans),
                        [s.compiled for s in plans if s.compiled.anchors])


@dataclass(frozen=True)
class Replayable:
    """The plans a restart gives again (`PlanRegistry.replayable`), and to which handles."""

    states: list[PlanState]
    unions: list[UnionState]
    targets: list[tuple[AttachedHandle, tuple[int, ...] | None]]  # (handle, its Kafka cut)


class PlanRegistry:
    """Attaching and detaching handles; a plan state lives while some handle or union uses it.

    Thread-safe: the gateway's threads attach and detach while the query's micro-batch reads
    the plan sets and the route worker delivers to the handles."""

    def __init__(self, tuple_pane_min: int) -> None:
        self._tuple_pane_min = tuple_pane_min
        self._lock = threading.RLock()
        self._plans: dict[int, PlanState] = {}
        self._plan_ids: dict[str, int] = {}
        self._handles: dict[str, AttachedHandle] = {}
        self._unions: dict[str, UnionState] = {}
        self._next_plan_id = 1
        self._version = 0
        self._sets: PlanSets | None = None  # of `_version` (`plan_sets`)
        # a micro-batch ran: a time-window plan attached now may have missed tuples of its
        # first windows (whether a batch ran is public: `health()`'s last_batch_at)
        self._ran_batch = False

    @property
    def version(self) -> int:
        return self._version

    def batch_ran(self) -> None:
        """A micro-batch ran (time-window plans attached from now on start late)."""
        self._ran_batch = True

    # ----- attaching and detaching -----------------------------------------------------------
    def add_handle(self, handle_id: str, compiled: CompiledPlan | CompiledUnion,
                   deliver: Deliver) -> None:
        with self._lock:
            if isinstance(compiled, CompiledUnion):
                self._add_union_handle(handle_id, compiled, deliver)
                return
            plan_id = self._plan_state(compiled)
            handle = AttachedHandle(handle_id, plan_id, deliver)
            self._plans[plan_id].handles[handle_id] = handle
            self._handles[handle_id] = handle

    def _plan_state(self, compiled: CompiledPlan) -> int:
        """The id of the plan's state, made when no attached plan has its key (under the lock)."""
        plan_id = self._plan_ids.get(compiled.key)
        if plan_id is None:
            plan_id = self._next_plan_id
            self._next_plan_id += 1
            rows = self._rows_mode(compiled)
            state = PlanState(plan_id, compiled, rows,
                              windows=self._new_windows(compiled, rows))
            self._plans[plan_id] = state
            self._plan_ids[compiled.key] = plan_id
            self._version += 1
        return plan_id

    def _add_union_handle(self, handle_id: str, compiled: CompiledUnion,
                          deliver: Deliver) -> None:
        union = self._unions.get(compiled.key)
        if union is None:
            members = tuple(self._plan_state(m) for m in compiled.members)
            union = UnionState(compiled, members)
            for index, plan_id in enumerate(members):
                self._plans[plan_id].unions[compiled.key] = index
            self._unions[compiled.key] = union
        handle = AttachedHandle(handle_id, -1, deliver, union=compiled.key)
        union.handles[handle_id] = handle
        self._handles[handle_id] = handle

    def _rows_mode(self, compiled: CompiledPlan) -> bool:
        w = compiled.window
        if is_private(w):
            return False  # its values are clamped by the panes job, never raw on the driver
        return w is None or (w.kind == "tuple"
                             and (bool(w.keys) or w.pane < self._tuple_pane_min))

    def _new_windows(self, compiled: CompiledPlan, rows: bool) -> PaneWindows | None:
        w = compiled.window
        if w is None:
            return None
        if w.kind == "tuple":
            return PaneWindows(w, single=rows)
        return PaneWindows(w, late_start=self._ran_batch)

    def remove_handle(self, handle_id: str) -> int:
        """Detach a handle (waiting for a delivery to it in progress); returns handles left."""
        with self._lock:
            handle = self._handles.get(handle_id)
        if handle is not None:
            with handle.lock:
                handle.active = False
        with self._lock:
            handle = self._handles.pop(handle_id, None)
            if handle is not None and handle.union is not None:
                union = self._unions.get(handle.union)
                if union is not None:
                    union.handles.pop(handle_id, None)
                    if not union.handles:
                        del self._unions[handle.union]
                        for plan_id in union.members:
                            state = self._plans.get(plan_id)
                            if state is not None:
                                state.unions.pop(handle.union, None)
                                self._drop_if_unused(state)
            elif handle is not None:
                state = self._plans.get(handle.plan_id)
                if state is not None:
                    state.handles.pop(handle_id, None)
                    self._drop_if_unused(state)
            return len(self._handles)

    def _drop_if_unused(self, state: PlanState) -> None:
        if not state.used and state.id in self._plans:
            del self._plans[state.id]
            del self._plan_ids[state.compiled.key]
            self._version += 1

    def raise_cuts(self, cuts: dict[int, tuple[int, ...]]) -> None:
        """Raise these plans' Kafka cuts (plan id -> per partition, the first offset given to
        it; never lowered): what a stopped real-time query already wrote to their topics is
        not given again (`pep.runtime.query.realtime_mode`). A new version: the next batch
        matches with them."""
        with self._lock:
            changed = False
            for pid, cut in cuts.items():
                state = self._plans.get(pid)
                if state is None:
                    continue
                old = state.compiled.start_offsets or ()
                width = max(len(old), len(cut))
                new = tuple(max(old[i] if i < len(old) else 0, cut[i] if i < len(cut) else 0)
                            for i in range(width))
                if new != old:
                    state.compiled = replace(state.compiled, start_offsets=new)
                    changed = True
            if changed:
                self._version += 1

    def attached(self) -> list[tuple[str, CompiledPlan | CompiledUnion, Deliver]]:
        """The active handles with their plans (to move them onto a replacement query)."""
        with self._lock:
            out: list[tuple[str, CompiledPlan | CompiledUnion, Deliver]] = [
                (h.id, self._plans[h.plan_id].compiled, h.deliver)
                for h in self._handles.values()
                if h.active and h.union is None and h.plan_id in self._plans]
            out += [(h.id, self._unions[h.union].compiled, h.deliver)
                    for h in self._handles.values()
                    if h.active and h.union is not None and h.union in self._unions]
            return out

    def has_handles(self) -> bool:
        """Whether any handle is attached (a detach asks after each handle: a list of the
        others each time made detaching 5,000 handles quadratic)."""
        with self._lock:
            return bool(self._handles)

    # ----- what a micro-batch reads ----------------------------------------------------------
    def current(self) -> tuple[list[PlanState], int]:
        sets = self.plan_sets()
        return sets.plans, sets.version

    def plan_sets(self) -> PlanSets:
        """The used plans and their subsets, for the registry's current version. A plan's set
        of users changes only under the lock, and a plan becomes used or unused only together
        with a new version (it is made with its first user and dropped with its last), so the
        sets of one version stay true."""
        with self._lock:
            sets = self._sets
            if sets is None or sets.version != self._version:
                sets = self._sets = PlanSets.of(
                    self._version, [s for s in self._plans.values() if s.used])
            return sets

    def unions(self, only: list[UnionState] | None = None) -> list[UnionState]:
        """The unions of grants with handles (of `only`, when given)."""
        with self._lock:
            return [u for u in (self._unions.values() if only is None else only) if u.handles]

    def union_targets(self, state: PlanState) -> list[tuple[UnionState, int]]:
        """The unions `state` is a member of, each with its index among their members."""
        with self._lock:
            return [(self._unions[key], index) for key, index in state.unions.items()
                    if key in self._unions]

    def replayable(self, can_replay: Callable[[CompiledPlan], bool]) -> Replayable:
        """What a restart can give again: the unions with handles every member of which is a
        row plan `can_replay`, the row plans without windows that `can_replay` and that have
        handles or are members of those unions, and their handles with their Kafka cuts."""
        with self._lock:
            unions = [u for u in self._unions.values()
                      if u.handles and all(self._plans[m].windows is None
                                           and can_replay(self._plans[m].compiled)
                                           for m in u.members)]
            members = {m for u in unions for m in u.members}
            states = [s for s in self._plans.values()
                      if (s.handles or s.id in members) and s.rows and s.windows is None
                      and can_replay(s.compiled)]
            targets = [(h, s.compiled.start_offsets) for s in states
                       for h in s.handles.values()]
            targets += [(h, u.compiled.members[0].start_offsets) for u in unions
                        for h in u.handles.values()]
            return Replayable(states, unions, targets)

    def stats(self) -> dict[str, Any]:
        """Handles, plans, and the windows' figures (late rows, stored panes)."""
        with self._lock:
            windows = [s.windows for s in self._plans.values() if s.windows is not None]
            return {"handles": len(self._handles), "plans": len(self._plans),
                    "late_rows": sum(w.late for w in windows),
                    "window_panes": sum(w.stored_panes for w in windows)}


__all__ = ["PlanRegistry", "AttachedHandle", "PlanSets", "PlanState", "Replayable",
           "UnionState"]
