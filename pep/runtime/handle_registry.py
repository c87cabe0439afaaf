"""The handles of one stream's shared query and the plan states they share: handles with the same
plan key share one state (computed once per micro-batch), a union of grants shares its members'.
"""
from __future__ import annotations



from pep.runtime.compile import CompiledPlan, CompiledUnion
from pep.runtime.privacy import is_private
from pep.runtime.windows import PaneWindows
from pep.runtime.executor_state import (AttachedHandle, Deliver, ExecutorState, PlanState,
                                        UnionState)


class HandleRegistry(ExecutorState):
    """Attaching and detaching handles; a plan state lives while some handle or union uses it."""

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
                             and (bool(w.keys) or w.pane < self.tuple_pane_min))

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


__all__ = ["HandleRegistry"]
