"""Many plain plans matched per micro-batch with array kernels, grouped by shape (no Spark here
but `freeze_worker_heap`'s question whether a task is running).

Past `plan_expressions.FEW_PLANS` plans the plan table's higher-order functions are what a
micro-batch costs: Spark runs them interpreted, per tuple and plan (measured here: ~1 s of
fixed cost per batch for 5,000 plans, the table being a literal in every task, and 3-14 us per
tuple and plan on top). A `GroupedMatcher` takes that work instead: the rows job returns each
tuple of the batch once with the values its filters read (one compiled Spark job, no plan
table), and the plans' tests run here over all tuples and all plans of one shape at once, the
constants of a shape being arrays. A shape is the structure of a plan's filter: per conjunct,
the (attribute, kind) of each comparison; plans that differ only in constants, operators and
start position share one. The outcome of each comparison is the one
`plan_expressions._predicate_holds` gives (Spark's ordering: NaN above every number and equal
to itself, a null operand never holds), so what a plan passes does not depend on which path
evaluated it (a test compares both).

The tests run on Spark's workers, not on the driver: `admitted_rows` is the rows job's
`DataFrame.mapInArrow` function; per Arrow record batch of the tuples it matches and returns only
the tuples some plan admits, each with a bitmap of the plans that admit it (`pairs` turns the
bitmaps into the routing's (plan id, row) pairs on the driver, plan-major without a sort), the
columns only the filters read left out. The matcher (its arrays, built per plans' version)
travels with the function, pickled with it; this module is pickled by value (`cloudpickle.
register_pickle_by_value` in the executor), so workers run the driver's own code.

Only plans whose comparisons are doubles, 64-bit integers or strings are grouped; spatial,
label and masked comparisons stay on the plan table (`GroupedMatcher.build` returns None).
"""
from __future__ import annotations

import gc
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pep.runtime.base.columns import FILE_COLUMN, KAFKA_OFFSET_AT, KAFKA_PARTITION_AT
from pep.runtime.plans.compile import (
    EQUAL,
    GREATER,
    INTEGER_KIND,
    LESS,
    NUMERIC_KIND,
    STRING_KIND,
    CompiledPlan,
)

FAMILY_OF_KIND = {NUMERIC_KIND: "d", INTEGER_KIND: "l", STRING_KIND: "s"}
# at most this many (tuple, plan) cells are tested at once: bounds the driver's memory per batch
CELLS_PER_CHUNK = 1 << 21
NO_START = np.iinfo(np.int64).min


def value_column(attribute: int, family: str) -> str:
    """The rows job's column holding attribute `attribute` (1-based) in `family`."""
    return f"_xsg_m{attribute}{family}"


@dataclass
class _Comparison:
    attribute: int
    family: str
    masks: np.ndarray      # int8, the accepted outcomes of each plan
    constants: np.ndarray  # float64, int64 or object (str)


@dataclass
class _Group:
    ids: np.ndarray                                 # int64 plan ids
    start_after: np.ndarray                         # int64, NO_START: none
    conjuncts: tuple[tuple[_Comparison, ...], ...]  # the filter, in disjunctive normal form
    # Kafka cuts: plans x partitions, the first offset each plan is given (0 where it has no
    # cut, or a shorter one: every record); None: no plan of the group has a cut
    start_offsets: np.ndarray | None = None


@dataclass
class GroupedMatcher:
    """The plain plans of a stream, grouped by shape; `match` gives (plan ids, row indices)."""

    groups: tuple[_Group, ...]
    columns: tuple[tuple[int, str], ...]  # (attribute, family) the rows job must return

    @staticmethod
    def build(plans: list[tuple[int, CompiledPlan]]) -> GroupedMatcher | None:
        """None when some plan has a comparison this matcher does not make (spatial, label,
        masked, or a null constant): the plan table then evaluates them all."""
        shapes: dict[tuple[Any, ...], list[tuple[int, CompiledPlan]]] = {}
        for plan_id, compiled in plans:
            signature = []
            for conj in compiled.conjuncts:
                part = []
                for row in conj:
                    a, _m, k, n, s = row[:5]
                    if len(row) > 5 or k not in FAMILY_OF_KIND:
                        return None
                    if (s if k == STRING_KIND else n) is None:
                        return None
                    part.append((a, k))
                signature.append(tuple(part))
            shapes.setdefault(tuple(signature), []).append((plan_id, compiled))
        groups = []
        columns: dict[tuple[int, str], None] = {}
        for shape, members in shapes.items():
            conjuncts = []
            for c, conj_shape in enumerate(shape):
                comparisons = []
                for j, (a, k) in enumerate(conj_shape):
                    family = FAMILY_OF_KIND[k]
                    columns[(a, family)] = None
                    rows = [compiled.conjuncts[c][j] for _, compiled in members]
                    masks = np.array([r[1] for r in rows], dtype=np.int8)
                    if family == "d":
                        constants = np.array([float(r[3]) for r in rows], dtype=np.float64)
                    elif family == "l":
                        constants = np.array([int(r[3]) for r in rows], dtype=np.int64)
                    else:
                        constants = np.array([r[4] for r in rows], dtype=object)
                    comparisons.append(_Comparison(a, family, masks, constants))
                conjuncts.append(tuple(comparisons))
            ids = np.array([pid for pid, _ in members], dtype=np.int64)
            starts = np.array([NO_START if c.start_after is None else int(c.start_after)
                               for _, c in members], dtype=np.int64)
            groups.append(_Group(ids, starts, tuple(conjuncts), _offsets(members)))
        return GroupedMatcher(tuple(groups), tuple(columns))

    @property
    def kafka(self) -> bool:
        """Some plan starts at Kafka offsets: matching reads the rows' `_xsg_file`."""
        return any(g.start_offsets is not None for g in self.groups)

    @property
    def plan_ids(self) -> np.ndarray:
        """Every plan's id, in the matcher's order: bit i of a `bitmaps` row is plan_ids[i]."""
        if not self.groups:
            return np.empty(0, np.int64)
        return np.concatenate([g.ids for g in self.groups])

    def _passing(self, table: pa.Table, seqs: pa.Array, files: pa.Array | None = None
                 ) -> Iterator[tuple[int, np.ndarray]]:
        """(index of the first plan in `plan_ids`, plans x tuples passing) per chunk of plans.
        `files`: the tuples' `_xsg_file` (a Kafka stream's: their positions, for the cuts)."""
        positions = (seqs.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64),
                     seqs.is_valid().to_numpy(zero_copy_only=False))
        kafka = kafka_positions(files) if files is not None and self.kafka else None
        n = table.num_rows
        values = {key: _values(table.column(value_column(*key)), key[1])
                  for key in self.columns}
        first = 0
        for group in self.groups:
            k = len(group.ids)
            step = max(1, CELLS_PER_CHUNK // max(n, 1))
            for lo in range(0, k, step):  # chunks of plans: a plan's rows stay together
                hi = min(k, lo + step)
                yield first + lo, _group_passes(group, values, lo, hi, positions, kafka)
            first += k

    def match(self, table: pa.Table, seqs: pa.Array, files: pa.Array | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """(plan ids, row indices) of every (plan, tuple) that passes: each plan's pairs
        together, its rows ascending (the plans in no particular order). `table` holds the
        `value_column`s; `seqs` the tuples' positions (a null one: every plan has started);
        `files` their `_xsg_file` (needed when some plan has a Kafka cut)."""
        ids = self.plan_ids
        plan_ids, row_ids = [], []
        for first, passed in self._passing(table, seqs, files):
            plans, rows = np.nonzero(passed)  # plan-major, rows ascending within a plan
            plan_ids.append(ids[first + plans])
            row_ids.append(rows)
        if not plan_ids:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate(plan_ids), np.concatenate(row_ids)

    def admitted(self, batch: pa.RecordBatch, seq_column: str, keep: list[str],
                 bits_column: str) -> pa.RecordBatch:
        """The tuples of `batch` some plan admits, in their order, with the columns `keep` and
        `bits_column`: per tuple, a bitmap of the plans admitting it (bit i, most significant
        first: `plan_ids`[i]; `pairs` reads them). A bitmap, not a list of ids: one binary
        value per tuple that Spark copies as it is, and the driver unpacks it plan-major, so
        its routing needs no sort."""
        n, k = batch.num_rows, len(self.plan_ids)
        bits = np.zeros((n, k), dtype=bool)
        files = (batch.column(FILE_COLUMN)
                 if self.kafka and FILE_COLUMN in batch.schema.names else None)
        if self.kafka and files is None:
            raise ValueError("plans with Kafka cuts need the tuples' positions (_xsg_file)")
        for first, passed in self._passing(pa.Table.from_batches([batch]),
                                           batch.column(seq_column), files):
            bits[:, first:first + len(passed)] = passed.T
        kept = np.flatnonzero(bits.any(axis=1))
        packed = np.packbits(bits[kept], axis=1)  # tuples x ceil(k / 8) bytes
        width = packed.shape[1]
        offsets = np.arange(len(kept) + 1, dtype=np.int32) * width
        bitmaps = pa.Array.from_buffers(pa.binary(), len(kept),
                                        [None, pa.py_buffer(offsets),
                                         pa.py_buffer(np.ascontiguousarray(packed))])
        chosen = batch.select(keep).take(pa.array(kept, pa.int64()))
        return pa.RecordBatch.from_arrays([*chosen.columns, bitmaps],
                                          names=[*keep, bits_column])

    def pairs(self, bitmaps: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """`admitted`'s bitmaps (one per row, of this matcher) as (plan ids, row indices): each
        plan's pairs together, its rows ascending, in chunks of plans (no sort)."""
        ids = self.plan_ids
        n, k = len(bitmaps), len(ids)
        width = (k + 7) // 8
        if not n or not k:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        offsets = np.frombuffer(bitmaps.buffers()[1], dtype=np.int32)[
            bitmaps.offset:bitmaps.offset + n + 1]
        if offsets[-1] - offsets[0] != n * width:
            raise ValueError("plan bitmaps of another matcher")
        data = np.frombuffer(bitmaps.buffers()[2], dtype=np.uint8)[
            offsets[0]:offsets[-1]].reshape(n, width)
        step = max(1, CELLS_PER_CHUNK // (8 * n))  # bytes of the bitmaps per chunk
        plan_ids, row_ids = [], []
        for lo in range(0, width, step):
            hi = min(width, lo + step)
            count = min(k, hi * 8) - lo * 8
            chunk = np.unpackbits(data[:, lo:hi], axis=1, count=count)
            plans, rows = np.nonzero(chunk.T)
            plan_ids.append(ids[lo * 8 + plans])
            row_ids.append(rows)
        return np.concatenate(plan_ids), np.concatenate(row_ids)


# Freezes per worker process, at its first tasks (`freeze_worker_heap`): the first task imports
# most of what the next ones use (pyarrow's and pandas' submodules: ~34,000 objects more)
FROZEN_TASKS = 2
# The process's count of them, in a module of its own: this module is pickled by value (its
# globals are made anew with every task's function), and gc.get_freeze_count() walks the whole
# frozen list (~3 ms per call here).
_FREEZES = "_xsg_worker_heap_freezes"


def freeze_worker_heap() -> bool:
    """In a Spark Python worker (a task is running), move every object alive now out of the
    garbage collector's reach, at the process's first `FROZEN_TASKS` tasks; whether it did.

    PySpark's daemon runs `gc.collect()` in a reused worker after every task. With numpy,
    pyarrow and pandas imported that full collection walks ~75,000 objects: 35-40 ms here, per
    task. The rows job of a micro-batch runs two or three tasks, so at four batches a second
    the workers spent ~0.3 of this machine's two cores collecting (py-spy: 95% of their
    samples), and a task handed to a worker still collecting waited for it. Frozen objects
    (the imported modules, mostly) are skipped by collections but still freed by reference
    counting; only reference cycles among what the first tasks left alive outlive them (a
    bounded cost: freezing at every task would keep each task's cyclic garbage for ever).
    The driver never freezes (no task runs there: a test calling the function directly)."""
    marker = sys.modules.get(_FREEZES)
    done = getattr(marker, "count", 0)
    if done >= FROZEN_TASKS:
        return False
    from pyspark import TaskContext
    if TaskContext.get() is None:
        return False
    if marker is None:
        marker = sys.modules[_FREEZES] = types.ModuleType(_FREEZES)
    gc.freeze()
    setattr(marker, "count", done + 1)  # noqa: B010 - mypy knows no attribute `count` of a module
    return True


def admitted_rows(matcher: GroupedMatcher, seq_column: str, keep: list[str], bits_column: str,
                  figures: tuple[str, str] | None = None
                  ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The rows job's `DataFrame.mapInArrow` function: each record batch's admitted tuples
    (`GroupedMatcher.admitted`); a batch admitting none yields nothing.

    With `figures` (two column names), each task also counts the tuples it read and their
    highest position, and yields them last as one row more: the first column the count, the
    second the position, every other column null (and both null on the admitted rows). They are
    the stream's own figures (`rows_in`, `max_position`), which the matcher has at hand: the
    batch needs no `DataFrame.observe` of its own (an analysis of the batch plan per micro-
    batch on the driver, and a metrics node in the job)."""
    def admit(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_worker_heap()
        read, top = 0, None
        kinds: list[pa.DataType] | None = None
        for batch in batches:
            if kinds is None:
                kinds = [batch.schema.field(name).type for name in keep]
            if not batch.num_rows:
                continue
            read += batch.num_rows
            highest = pc.max(batch.column(seq_column)).as_py()
            if highest is not None and (top is None or highest > top):
                top = highest
            out = matcher.admitted(batch, seq_column, keep, bits_column)
            if out.num_rows:
                if figures is not None:
                    nulls = pa.nulls(out.num_rows, pa.int64())
                    out = pa.RecordBatch.from_arrays([*out.columns, nulls, nulls],
                                                     names=[*out.schema.names, *figures])
                yield out
        if figures is not None and kinds is not None:
            yield pa.RecordBatch.from_arrays(
                [*(pa.nulls(1, t) for t in kinds), pa.nulls(1, pa.binary()),
                 pa.array([read], pa.int64()), pa.array([top], pa.int64())],
                names=[*keep, bits_column, *figures])
    return admit


def _values(column: pa.ChunkedArray, family: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, present) of one attribute in its family."""
    column = column.combine_chunks()
    present = column.is_valid().to_numpy(zero_copy_only=False)
    if family == "d":
        return column.fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64), present
    if family == "l":
        return column.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), present
    return np.array(column.fill_null("").to_pylist(), dtype=object), present


def _offsets(members: list[tuple[int, CompiledPlan]]) -> np.ndarray | None:
    """The group's Kafka cuts as plans x partitions (see `_Group.start_offsets`)."""
    cuts = [c.start_offsets for _, c in members]
    if all(cut is None for cut in cuts):
        return None
    width = max(len(cut or ()) for cut in cuts)
    out = np.zeros((len(cuts), max(width, 1)), dtype=np.int64)
    for i, cut in enumerate(cuts):
        if cut:
            out[i, :len(cut)] = cut
    return out


def kafka_positions(files: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(partitions, offsets) of Kafka records from their `_xsg_file` (base/columns.py: fixed places
    from the end); a tuple without one (null) has partition -1 and offset 0."""
    if isinstance(files, pa.ChunkedArray):
        files = files.combine_chunks()
    start, length = KAFKA_PARTITION_AT
    partitions = pc.cast(pc.utf8_slice_codeunits(files, start, start + length), pa.int64())
    offsets = pc.cast(pc.utf8_slice_codeunits(files, KAFKA_OFFSET_AT[0]), pa.int64())
    return (partitions.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64),
            offsets.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64))


def _group_passes(group: _Group, values: dict[Any, Any], lo: int, hi: int,
                  positions: tuple[np.ndarray, np.ndarray],
                  kafka: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """(plans lo..hi of the group) x (tuples): the filter and the start position hold."""
    passed = None
    for conj in group.conjuncts:
        holds = None
        for comp in conj:
            v, present = values[(comp.attribute, comp.family)]
            h = _holds(v, comp, lo, hi)
            h &= present[None, :]
            holds = h if holds is None else holds & h
        if holds is None:  # an empty conjunct: passes everything
            holds = np.ones((hi - lo, len(positions[0])), dtype=bool)
        passed = holds if passed is None else passed | holds
    if passed is None:
        passed = np.zeros((hi - lo, len(positions[0])), dtype=bool)
    starts = group.start_after[lo:hi]
    if (starts != NO_START).any():
        seqs, present = positions
        passed &= ~present[None, :] | (seqs[None, :] > starts[:, None])
    if group.start_offsets is not None:
        if kafka is None:
            raise ValueError("plans with Kafka cuts need the tuples' positions")
        partitions, offsets = kafka
        cuts = group.start_offsets[lo:hi]
        inside = np.flatnonzero((partitions >= 0) & (partitions < cuts.shape[1]))
        if len(inside):
            passed[:, inside] &= offsets[inside][None, :] >= cuts[:, partitions[inside]]
    return passed


def _holds(v: np.ndarray, comp: _Comparison, lo: int, hi: int) -> np.ndarray:
    """The comparison's outcome for plans lo..hi x tuples, within its accepted outcomes."""
    c = comp.constants[lo:hi, None]
    row = v[None, :]
    if comp.family == "d":
        # Spark orders NaN above every number, equal to itself
        v_nan, c_nan = np.isnan(row), np.isnan(c)
        with np.errstate(invalid="ignore"):
            less = (row < c) | (~v_nan & c_nan)
            equal = (row == c) | (v_nan & c_nan)
            greater = (row > c) | (v_nan & ~c_nan)
    else:
        less, equal, greater = row < c, row == c, row > c
    m = comp.masks[lo:hi, None]
    passes: np.ndarray = ((less & ((m & LESS) != 0)) | (equal & ((m & EQUAL) != 0))
                          | (greater & ((m & GREATER) != 0)))
    return passes


__all__ = ["GroupedMatcher", "admitted_rows", "freeze_worker_heap", "value_column",
           "kafka_positions",
           "CELLS_PER_CHUNK", "FROZEN_TASKS"]
