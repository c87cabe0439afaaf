"""A micro-batch's results into handles: the rows job's rows ordered, encoded once per projection
and given to each plain plan (and union of grants); tuple windows' rows and the panes job's
partials into windows (`windows/pane_windows.py`); delivery under each handle's lock. Runs on the
query's route worker, one batch behind the query (`query/route_worker.py`), or in the replay before
it starts.
"""
from __future__ import annotations

import operator
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pep.core.labels import LabelError, Lattice
from pep.core.rows import RowBatch
from pep.runtime.base.columns import BITS_COLUMN, PIDS_COLUMN, SEQ_COLUMN
from pep.runtime.base.delivery import deliver_to
from pep.runtime.base.encode import json_array, value_texts
from pep.runtime.delivery.writer import TopicWriter, topic_of
from pep.runtime.plans.batch_shape import Shape
from pep.runtime.plans.matcher import GroupedMatcher
from pep.runtime.query.batch_columns import order_columns
from pep.runtime.query.figures import QueryFigures
from pep.runtime.query.registry import AttachedHandle, PlanRegistry, PlanState, UnionState
from pep.runtime.query.settings import StreamLayout
from pep.runtime.query.shield import BatchShield
from pep.runtime.query.union import member_masks, merged_rows, tag_rows
from pep.runtime.windows.pane_partials import (
    KEY_SEP,
    NO_SEQ,
    PARTS,
    PaneLayout,
    empty_partials,
    partials_from_arrow,
    partials_from_values,
)


class ResultRouter:
    """The jobs' Arrow results into `RowBatch`es, delivered to each plan's handles; which
    micro-batch is being delivered and the last one delivered in full."""

    def __init__(self, layout: StreamLayout, registry: PlanRegistry, figures: QueryFigures,
                 lateness: float, topics: TopicWriter | None = None) -> None:
        self._layout = layout
        # delivery through plan topics: what the driver finishes for handles that read topics
        # is produced there once per topic (`pep.runtime.delivery`)
        self._topics = topics
        self._registry = registry
        self._figures = figures
        self.lateness = lateness  # seconds: a time window's tuples this late still count
        # Kafka: deliveries carry their micro-batch (`RowBatch.batch`, counted from the
        # checkpoint's `batch_base`), which positioned buffers name their rows by; set by the
        # one thread routing a batch (the route worker, or the replay before the query starts)
        self._batch_base = 0
        self._routing_batch: int | None = None
        self._completed_batch = -1  # the last batch whose every delivery was made

    def redefine(self, layout: StreamLayout) -> None:
        """The stream's definition changed."""
        self._layout = layout

    # ----- which micro-batch ------------------------------------------------------------------
    def resume(self, batch_base: int, completed_batch: int) -> None:
        """A query starts on its checkpoint: its batches are numbered from `batch_base` in the
        deliveries, and `completed_batch` (and those before it) were delivered in full."""
        self._batch_base = batch_base
        self._completed_batch = completed_batch

    @property
    def completed_batch(self) -> int:
        return self._completed_batch

    def position(self, batch_id: int) -> int:
        """A batch's number in the deliveries (`RowBatch.batch`)."""
        return self._batch_base + batch_id

    def begin(self, batch_id: int | None) -> None:
        """The batch whose results are routed next (None: no batch's)."""
        self._routing_batch = None if batch_id is None else self._batch_base + batch_id

    def delivered(self, batch_id: int) -> None:
        """Every delivery of the batch was made."""
        self._completed_batch = max(self._completed_batch, batch_id)

    # ----- rows and windows into handles ------------------------------------------------------

    def route_rows(self, arrow: pa.Table, plans: list[PlanState], shape: Shape,
                    grouped: GroupedMatcher | None = None,
                    written: frozenset[int] = frozenset(),
                    unions: list[UnionState] | None = None,
                    shield: BatchShield | None = None) -> list[str]:
        """Deliver the rows job's rows to `plans`' handles and to the unions of grants (those
        given; None: every union with handles). `written`: the plans whose rows the workers
        wrote to their handles' topics already (only their other handles get them here).
        `shield`: the stream's security punctuations in this batch (`query/shield.py`), which
        each plan's rows pass first."""
        keys = [(c, "ascending", "at_end") for c in order_columns(self._layout, shape)]
        arrow = arrow.take(pc.sort_indices(arrow, sort_keys=keys))
        if grouped is not None:  # a plan's pairs together, in stream order
            plan_ids, row_ids = grouped.pairs(arrow.column(BITS_COLUMN).combine_chunks())
        else:
            matches = arrow.column(PIDS_COLUMN).combine_chunks()
            plan_ids = pc.list_flatten(matches).to_numpy(zero_copy_only=False)
            row_ids = pc.list_parent_indices(matches).to_numpy(zero_copy_only=False)
            # a plan's pairs together, in stream order (a stable sort); a radix sort when the
            # ids span at most 2^16 (numpy sorts 16-bit keys so), else a merge sort
            sort_keys = plan_ids
            if len(plan_ids):
                low = plan_ids.min()
                if int(plan_ids.max()) - int(low) < 1 << 16:
                    sort_keys = (plan_ids - low).astype(np.uint16)
            by_plan = np.argsort(sort_keys, kind="stable")
            plan_ids, row_ids = plan_ids[by_plan], row_ids[by_plan]
        seqs = arrow.column(SEQ_COLUMN).combine_chunks().fill_null(NO_SEQ).to_numpy()
        hidden: dict[int, dict[int, frozenset[str]]] = {}
        if shield is not None:
            plan_ids, row_ids, hidden = shield.apply(plan_ids, row_ids, seqs,
                                                     {s.id: s for s in plans})
            shield.shield.moved(int(seqs.min()) if len(seqs) else None)
        bounds = plan_runs(plan_ids)
        groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[PlanState]] = {}
        closed: list[str] = []
        for state in plans:
            if state.id not in bounds:
                continue
            if state.windows is not None:
                closed += self._row_windows(state, arrow, row_ids[slice(*bounds[state.id])],
                                            seqs)
            elif state.id in hidden:  # attributes hidden by punctuations: its own encoding
                if state.handles:
                    lo, hi = bounds[state.id]
                    state.batches += 1
                    closed += self._deliver(state, _hidden_batch(
                        arrow, state.compiled.projection,
                        tuple(self._layout.row_columns(state.compiled,
                                                       state.compiled.projection)),
                        row_ids[lo:hi], seqs, hidden[state.id]))
            elif state.handles:  # a member of unions only is delivered through them, below
                projection = state.compiled.projection
                sources = tuple(self._layout.row_columns(state.compiled, projection))
                groups.setdefault((projection, sources), []).append(state)
        for (projection, sources), members in groups.items():
            for state, out in zip(members, _member_batches(
                    arrow, projection, sources, [bounds[s.id] for s in members], row_ids,
                    seqs), strict=True):
                state.batches += 1
                closed += self._deliver(state, out, state.id in written)
        closed += self._route_unions(arrow, row_ids, bounds, seqs, plans, unions, hidden)
        return closed

    def _route_unions(self, arrow: pa.Table, row_ids: np.ndarray,
                      bounds: dict[int, tuple[int, int]], seqs: np.ndarray,
                      plans: list[PlanState], only: list[UnionState] | None = None,
                      hidden: dict[int, dict[int, frozenset[str]]] | None = None
                      ) -> list[str]:
        """Each union's plain members' rows, merged per tuple (`pep.runtime.query.union`).
        `hidden`: per member, the rows whose attributes punctuations hide from it (the
        members of a union are one consumer's: a row's hidden attributes are the same for
        every member that has it, each knowing those of its own projection)."""
        unions = self._registry.unions(only)
        if not unions:
            return []
        states = {s.id: s for s in plans}
        closed: list[str] = []
        for union in unions:
            members = [(bit, pid) for bit, pid in enumerate(union.members)
                       if pid in states and states[pid].windows is None]
            if not members:
                continue
            mask = member_masks(arrow.num_rows, row_ids, bounds, members)
            projections = {bit: states[pid].compiled.projection for bit, pid in members}
            gone: dict[int, frozenset[str]] = {}
            for _, pid in members:
                for row, names in (hidden or {}).get(pid, {}).items():
                    gone[row] = gone.get(row, frozenset()) | names
            out = merged_rows(arrow, mask, projections, self._layout.field_names, _json_texts, seqs,
                              NO_SEQ, gone)
            if out is not None:
                closed += self._deliver_to(list(union.handles.values()), out)
        return closed

    def _row_windows(self, state: PlanState, arrow: pa.Table, idx: np.ndarray,
                     seqs: np.ndarray) -> list[str]:
        """A tuple window's tuples of this batch (in stream order) into one-tuple panes."""
        windows = state.windows
        assert windows is not None
        w = windows.window
        take = pa.array(idx)
        keys = None
        names = self._layout.field_names
        column = dict(zip(names, self._layout.row_columns(state.compiled, names), strict=True))
        if w.keys:
            texts = [value_texts(arrow.column(column[k]).take(take)) for k in w.keys]
            joined = texts[0] if len(texts) == 1 else \
                pc.binary_join_element_wise(*texts, KEY_SEP)
            keys = np.array(joined.to_pylist(), dtype=object)
        lattices = dict(w.lattices)
        values = [_family_values(arrow.column(column[attr]).take(take), ftype,
                                 lattices.get(attr))
                  for attr, ftype in w.attributes]
        partials = partials_from_values(windows.layout, keys, seqs[idx], values)
        result = windows.add(partials)
        state.batches += 1
        if not len(result):
            return []
        return self._deliver(state, RowBatch(tuple(result.texts), result.nbytes,
                                             result.last_position))

    # ----- window plans: panes into windows ---------------------------------------------------
    def route_panes(self, arrow: pa.Table | None, plans: list[PlanState], shape: Shape
                     ) -> list[str]:
        bounds: dict[int, tuple[int, int]] = {}
        if arrow is not None and arrow.num_rows:
            arrow = arrow.sort_by("pid")
            pids = arrow.column("pid").to_numpy()
            ids, starts = np.unique(pids, return_index=True)
            ends = list(starts[1:].tolist()) + [len(pids)]
            bounds = dict(zip(ids.tolist(), zip(starts.tolist(), ends, strict=True), strict=True))
        closed: list[str] = []
        for state in plans:
            windows = state.windows
            assert windows is not None
            layout = windows.layout
            batch_time = None
            if state.id in bounds:
                lo, hi = bounds[state.id]
                assert arrow is not None  # bounds come from it
                mine = arrow.slice(lo, hi - lo)
                partials = partials_from_arrow(mine, layout, _slot_columns(layout),
                                               raw=shape.raw)
                if layout.timed:
                    batch_time = pc.max(mine.column("mt")).as_py()
            else:
                partials = empty_partials(layout)
            # the plan's own watermark: only tuples its filter passed move it
            watermark = windows.advance(batch_time, self.lateness) if layout.timed else None
            result = windows.add(partials, watermark)
            state.batches += 1
            if len(result):
                out = RowBatch(tuple(result.texts), result.nbytes, result.last_position)
                closed += self._deliver(state, out)
        return closed

    def _deliver(self, state: PlanState, out: RowBatch, written: bool = False) -> list[str]:
        closed = self._deliver_to(list(state.handles.values()), out, written)
        if state.unions and state.windows is not None:
            # a windowed member's windows go to its unions' handles, tagged with its index
            for union, index in self._registry.union_targets(state):
                closed += self._deliver_to(list(union.handles.values()), tag_rows(out, index))
        return closed

    def _deliver_to(self, handles: list[AttachedHandle], out: RowBatch,
                    written: bool = False) -> list[str]:
        if self._layout.kafka and self._routing_batch is not None:
            out = replace(out, batch=self._routing_batch)  # its micro-batch (Kafka)
        if self._topics is not None:
            to_topics = [h for h in handles if topic_of(h.deliver) is not None]
            if to_topics:
                # once per topic (`written`: the workers wrote them in the batch), then each
                # handle is asked whether it is still open, as a delivery would
                handles = [h for h in handles if topic_of(h.deliver) is None]
                if not written:
                    self._topics.produce(to_topics, out, self._routing_batch)
                closed = deliver_to(to_topics, out, self._figures.counters)
                return closed + deliver_to(handles, out, self._figures.counters)
        return deliver_to(handles, out, self._figures.counters)


def _family_values(column: pa.ChunkedArray, ftype: str, lattice: Lattice | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """An attribute's values as the windows' family dtype, and where they are present (NaN
    counts as absent, as null does; a label's text that is no label of its lattice too)."""
    column = column.combine_chunks()
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    if ftype == "label" and lattice is not None:  # its code, each distinct text parsed once
        texts = column.fill_null("")
        uniq, inverse = np.unique(np.array(texts.to_pylist(), dtype=object),
                                  return_inverse=True)
        codes = np.array([_label_code(t, lattice) for t in uniq.tolist()], dtype=np.int64)
        values = codes[inverse] if len(uniq) else np.empty(0, np.int64)
        return np.where(values < 0, 0, values), valid & (values >= 0)
    if ftype == "string":
        return np.array(column.to_pylist(), dtype=object), valid
    if ftype == "double":
        values = column.fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        nan = np.isnan(values)
        if nan.any():
            valid = valid & ~nan
            values = np.where(nan, 0.0, values)
        return values, valid
    if ftype == "timestamp":
        column = column.cast(pa.timestamp("us")).cast(pa.int64())
    elif ftype == "boolean":
        column = column.cast(pa.int64())
    return column.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), valid


def _label_code(text: str, lattice: Lattice) -> int:
    try:
        return lattice.parse(text).code
    except LabelError:
        return -1


def _slot_columns(layout: PaneLayout) -> dict[str, str]:
    """This plan's attribute j -> the panes job's slot columns (per family, in order)."""
    seen = {"d": 0, "l": 0, "s": 0}
    out = {}
    for j, fam in enumerate(layout.families):
        name = f"{fam}{seen[fam]}"
        seen[fam] += 1
        out[f"v{j}"] = name
        for part in PARTS:
            out[f"{part}{j}"] = f"{name}_{part}"
    return out


def _json_texts(table: pa.Table) -> tuple[list[str], np.ndarray]:
    """Each row's JSON text, and its length in bytes."""
    encoded = json_array([(name, table.column(name), False) for name in table.column_names],
                         table.num_rows)
    return encoded.to_pylist(), pc.binary_length(encoded).to_numpy().astype(np.int64)


def _member_batches(arrow: pa.Table, projection: tuple[str, ...], sources: tuple[str, ...],
                    spans: list[tuple[int, int]], row_ids: np.ndarray, seqs: np.ndarray
                    ) -> list[RowBatch]:
    """The `RowBatch` of each plan of one projection (its pairs are `row_ids[lo:hi]` for its
    span, in stream order; every span non-empty): the rows any of them passed encoded once,
    each plan's picked from those.

    A fixed number of numpy calls per group, none per plan: some numpy calls (searchsorted,
    and others past a size) release the interpreter lock, and with the event loop busy each
    release costs up to the switch interval (5 ms) before this thread runs again; a
    searchsorted per plan made a third of routing's time at 1,000 handles."""
    if len(spans) == 1:
        lo, hi = spans[0]
        rows = row_ids[lo:hi]
        texts, lengths = _json_texts(_projected(arrow, projection, sources, rows))
        top = int(seqs[rows].max())
        return [RowBatch(tuple(texts), int(lengths.sum()), None if top == NO_SEQ else top)]
    picked = np.concatenate([row_ids[lo:hi] for lo, hi in spans])
    counts = np.fromiter((hi - lo for lo, hi in spans), np.int64, len(spans))
    starts = np.zeros(len(spans), np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    rows = np.unique(picked)  # sorted: the stream order of the rows' texts
    at = np.empty(arrow.num_rows, np.int64)
    at[rows] = np.arange(len(rows))
    at = at[picked]  # each pick's place among the encoded rows
    texts, lengths = _json_texts(_projected(arrow, projection, sources, rows))
    sizes = np.add.reduceat(lengths[at], starts).tolist()
    tops = np.maximum.reduceat(seqs[picked], starts).tolist()
    chosen = operator.itemgetter(*at.tolist())(texts)  # a tuple: two spans or more, none empty
    return [RowBatch(chosen[begin:begin + count], size, None if top == NO_SEQ else top)
            for begin, count, size, top in zip(starts.tolist(), counts.tolist(), sizes, tops,
                                               strict=True)]


def _hidden_batch(arrow: pa.Table, projection: tuple[str, ...], sources: tuple[str, ...],
                  rows: np.ndarray, seqs: np.ndarray, hidden: dict[int, frozenset[str]]
                  ) -> RowBatch:
    """One plan's rows, the attributes punctuations hide from it null in the rows that hide
    them (the values are replaced before encoding: never in its text)."""
    table = _projected(arrow, projection, sources, rows)
    columns = []
    for name in projection:
        mask = pa.array([name in hidden.get(int(r), ()) for r in rows.tolist()], pa.bool_())
        column = table.column(name)
        columns.append(pc.if_else(mask, pa.nulls(len(rows), column.type), column))
    texts, lengths = _json_texts(pa.table(columns, names=list(projection)))
    top = int(seqs[rows].max())
    return RowBatch(tuple(texts), int(lengths.sum()), None if top == NO_SEQ else top)


def _projected(arrow: pa.Table, projection: tuple[str, ...], sources: tuple[str, ...],
               rows: np.ndarray) -> pa.Table:
    return arrow.select(list(sources)).rename_columns(list(projection)).take(pa.array(rows))



def plan_runs(plan_ids: np.ndarray[Any, Any]) -> dict[int, tuple[int, int]]:
    """Each plan's (start, end) in `plan_ids`, where each plan's pairs are one run; none when
    no pair is left (the shield may hide every tuple of a batch from every plan)."""
    if not len(plan_ids):
        return {}
    starts = np.concatenate(([0], np.flatnonzero(np.diff(plan_ids)) + 1))
    ends = [*starts[1:].tolist(), len(plan_ids)]
    return dict(zip(plan_ids[starts].tolist(), zip(starts.tolist(), ends, strict=True),
                    strict=True))


__all__ = ["ResultRouter", "plan_runs"]
