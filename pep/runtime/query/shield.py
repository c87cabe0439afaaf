"""The Security Shield (the security punctuations paper's section 5.1) of a stream whose owner
enabled punctuations (`pep.core.punctuations`): which of a micro-batch's rows each plan may get,
and which of their attributes it may see, per tuple, in stream order.

The ingest writes each batch's punctuations to the stream's log (`.punctuations.jsonl` in its
ingest directory, which Spark's file source does not list) before the batch's tuples can be
read, each with the position (`_xsg_seq`) of the first tuple it precedes; punctuation records
never reach Spark's source as tuples. So the shield's state is the log: it survives a restart
of the gateway or of the stream's query, a batch run again after a failure, and files a query
skipped unread, and a tuple's segment is found by its position alone. Per batch:
- `prepare` reads what the log gained and, when some segment in play has tuple-level DDPs
  (punctuations for the tuples matching a predicate), asks Spark which tuples of the batch
  match which of them: one small job over the batch, only the matching tuples' positions come
  back (`BatchShield.matches`);
- `BatchShield.apply`, in routing, keeps of the rows job's (plan, row) pairs those the tuple's
  segment shows to the plan's roles, and says which attributes of the kept rows each plan may
  not see (the router encodes such a plan's rows on their own, the hidden values null).
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Protocol

import numpy as np
from pyspark.sql import Column, DataFrame, functions as F

from pep.core.punctuations import (
    LOG_NAME,
    REFINE,
    Condition,
    Punctuation,
    SegmentPolicy,
    ShieldState,
    counts_in_window,
    read_log_line,
    visible_attributes,
)
from pep.runtime.base.columns import SEQ_COLUMN
from pep.runtime.query.registry import PlanState
from pep.runtime.query.settings import StreamLayout

log = logging.getLogger(__name__)

Conditions = tuple[Condition, ...]
_BITS = 62  # conditions per long column of the matching job
PRUNE_AT = 4096  # segments wholly behind the routed batches kept at most


class Moves(Protocol):
    """What a batch's shield tells its stream's shield after routing (`PunctuationShield.moved`;
    a `files` or `kafka` stream's, `query/source_shield.py`, makes its segments per batch)."""

    def moved(self, low: int | None) -> None: ...


class PunctuationShield:
    """One stream's punctuations: its log, read as it grows, as segments."""

    def __init__(self, layout: StreamLayout) -> None:
        self._layout = layout
        path = layout.definition.source.option("path")
        self._path = Path(path or ".") / LOG_NAME
        self._offset = 0  # bytes of the log read
        self._state = ShieldState()
        self.starts: list[int] = []  # the segments' first positions, increasing
        self.policies: list[SegmentPolicy] = []
        # per segment, its policy's verdict class: segments whose policies differ only in
        # `ts` and `sn` give every consumer the same verdict, computed once
        self.kinds: list[int] = []
        self._kinds: dict[tuple[object, ...], int] = {}
        self.conditioned: list[int] = []  # the segments with tuple DDPs
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        # segments wholly behind the batches routed are dropped past PRUNE_AT of them (a row
        # that comes back before the first one kept is denied)
        self.pruned = False
        # the query's thread reads the log and prepares a batch while the route worker routes
        # the one before (`query/route_worker.py`): the segments change under this lock, and
        # each batch routes a snapshot of them taken when it was prepared
        self._lock = threading.Lock()
        self._broken = False  # the log went back in position: every segment from there denied
        self._floor = 0  # the lowest position a batch has held lately: older segments' DDPs
        # are not asked of Spark any more (a row behind it in such a segment is denied)

    def redefine(self, layout: StreamLayout) -> None:
        self._layout = layout

    @property
    def discarded(self) -> int:
        return self._state.discarded

    def refresh(self) -> None:
        """Read the punctuations the log gained (whole lines only)."""
        try:
            size = os.path.getsize(self._path)
        except FileNotFoundError:
            return
        if size <= self._offset:
            return
        with open(self._path, "rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        end = data.rfind(b"\n") + 1
        entries = [read_log_line(line, self._layout.types)
                   for line in data[:end].decode("utf-8").splitlines() if line.strip()]
        with self._lock:
            self._add(entries)
        self._offset += end

    def _add(self, entries: list[tuple[int, Punctuation]]) -> None:
        for k, (at, sp) in enumerate(entries):
            self._state.add(sp)
            if k + 1 < len(entries) and entries[k + 1][0] == at:
                continue  # the segment's policy once all its punctuations are in
            if self.starts and at < self.starts[-1] and not self._broken:
                # never written so (the ingest numbers positions under the stream's lock): a
                # log out of order cannot be trusted, so nothing after it is shown
                log.error("stream %s: punctuation log out of order at position %s; no tuple "
                          "from there on is delivered", self._layout.name, at)
                self._broken = True
            policy = SegmentPolicy(complete=False) if self._broken else self._state.policy()
            if self._broken:
                at = max(at, self.starts[-1])
            kind = self._kinds.setdefault(verdict_key(policy), len(self._kinds))
            if self.starts and self.starts[-1] == at:
                self.policies[-1] = policy
                self.kinds[-1] = kind
                if self.conditioned and self.conditioned[-1] == len(self.starts) - 1:
                    self.conditioned.pop()
            else:
                self.starts.append(at)
                self.policies.append(policy)
                self.kinds.append(kind)
            if policy.conditions:
                self.conditioned.append(len(self.starts) - 1)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The segments' starts and verdict classes as arrays (made again when they grew)."""
        if self._arrays is None or len(self._arrays[0]) != len(self.starts) \
                or (len(self.kinds) and self._arrays[1][-1] != self.kinds[-1]):
            self._arrays = (np.asarray(self.starts, dtype=np.int64),
                            np.asarray(self.kinds, dtype=np.int64))
        return self._arrays

    def prepare(self, batch: DataFrame) -> BatchShield:
        """The batch's shield: the log read, the segments as they are now, the tuple DDPs in
        play matched in Spark."""
        self.refresh()
        with self._lock:
            first = max(0, int(np.searchsorted(self.starts, self._floor, side="right")) - 1)
            wanted: dict[Conditions, list[tuple[int, int]]] = {}
            at = int(np.searchsorted(self.conditioned, first))
            for i in self.conditioned[at:]:
                hi = self.starts[i + 1] if i + 1 < len(self.starts) else -1
                for conds in self.policies[i].conditions:
                    wanted.setdefault(conds, []).append((self.starts[i], hi))
            starts, kinds = self.arrays()
            policies = list(self.policies)
            pruned = self.pruned
        index = {c: j for j, c in enumerate(wanted)}
        matches: dict[int, int] = {}
        if wanted:
            matches = match_tuples(batch, wanted, index)
        return BatchShield(self, starts, kinds, policies, pruned, first, index, matches)

    def shielded(self, batch: DataFrame) -> tuple[DataFrame, BatchShield]:
        """The batch the jobs read (an ingest stream's: as it is; its punctuations are in the
        log, never in its files) and its shield."""
        return batch, self.prepare(batch)

    def moved(self, low: int | None) -> None:
        """The lowest position of a batch routed: segments before it need no matching job, and
        past PRUNE_AT of them they are dropped."""
        if low is None:
            return
        with self._lock:
            self._floor = max(self._floor, low)
            first = int(np.searchsorted(self.starts, self._floor, side="right")) - 1
            if first >= PRUNE_AT:
                del self.starts[:first], self.policies[:first], self.kinds[:first]
                self.conditioned = [i - first for i in self.conditioned if i >= first]
                self._arrays = None
                self.pruned = True


def verdict_key(policy: SegmentPolicy) -> tuple[object, ...]:
    """What a policy's verdicts depend on (not its punctuations' `ts` and `sn`)."""
    def parts(sps: tuple[Punctuation, ...]) -> tuple[object, ...]:
        return tuple((p.roles, p.sign, p.where, p.attributes) for p in sps)
    return (parts(policy.current), parts(policy.fixed), policy.complete)


def _condition_column(c: Condition) -> Column:
    col = F.col(f"`{c.attribute}`")
    value = F.lit(c.value)
    if c.type == "timestamp":
        value = value.cast("timestamp")
    elif c.type == "double":
        value = value.cast("double")
    ops = {"=": col == value, "!=": col != value, "<": col < value, "<=": col <= value,
           ">": col > value, ">=": col >= value}
    return ops[c.op]


def match_tuples(batch: DataFrame, wanted: dict[Conditions, list[tuple[int, int]]],
             index: dict[Conditions, int]) -> dict[int, int]:
    """Which tuple DDPs each tuple of the batch meets, where they are in force: {position:
    bit mask over `index`}, only the tuples meeting some."""
    seq = F.col(SEQ_COLUMN)
    tests = []
    for conds, ranges in wanted.items():
        spans = [(seq >= lo) & (seq < hi) if hi >= 0 else seq >= lo for lo, hi in ranges]
        inside = reduce(lambda a, b: a | b, spans)
        holds = reduce(lambda a, b: a & b, (_condition_column(c) for c in conds))
        tests.append((index[conds], F.coalesce(inside & holds, F.lit(False))))
    columns = []
    for start in range(0, len(tests), _BITS):
        chunk = tests[start:start + _BITS]
        columns.append(reduce(lambda a, b: a + b, (F.when(t, F.lit(1 << (j - start)))
                                                   .otherwise(F.lit(0)) for j, t in chunk))
                       .cast("long").alias(f"_xsg_pm{start // _BITS}"))
    names = [f"_xsg_pm{i}" for i in range(len(columns))]
    any_bit = reduce(lambda a, b: a | b, (F.col(n) != 0 for n in names))
    table = batch.select(seq, *columns).where(any_bit).toArrow()
    out: dict[int, int] = {}
    if not table.num_rows:
        return out
    seqs = table.column(SEQ_COLUMN).to_pylist()
    parts = [table.column(n).to_pylist() for n in names]
    for i, s in enumerate(seqs):
        if s is not None:
            out[int(s)] = sum(int(p[i]) << (k * _BITS) for k, p in enumerate(parts))
    return out


@dataclass
class BatchShield:
    """A batch's segments and matches (`PunctuationShield.prepare`), applied in routing."""

    shield: Moves
    starts: np.ndarray  # the segments when the batch was prepared (`PunctuationShield`)
    kinds: np.ndarray
    policies: list[SegmentPolicy]
    pruned: bool  # segments before the first were dropped: a row before it is denied
    first: int  # the first segment whose tuple DDPs were matched
    index: dict[Conditions, int]
    matches: dict[int, int]
    _verdicts: dict[tuple[object, ...], frozenset[str]] = field(default_factory=dict)

    def apply(self, plan_ids: np.ndarray, row_ids: np.ndarray, seqs: np.ndarray,
              states: dict[int, PlanState]
              ) -> tuple[np.ndarray, np.ndarray, dict[int, dict[int, frozenset[str]]]]:
        """The (plan, row) pairs each plan may have (pairs of a plan together, in stream
        order, as given), and per plan the rows whose attributes it may not all see: {plan id:
        {row: hidden attributes}}. A tuple window's plan whose tuples come back as rows
        (`PlanState.rows`) keeps the tuples that count in its windows (`counts_in_window`),
        whole.

        Vectorised per plan: the verdict is computed once per distinct (segment, matches) of
        the plan's rows, numpy picks the rows."""
        if not len(row_ids):
            return plan_ids, row_ids, {}
        row_seqs = seqs[row_ids]
        starts, kinds = self.starts, self.kinds
        segment = np.searchsorted(starts, row_seqs, side="right") - 1
        # a row's class: its segment and which tuple DDPs it matches (a small id per mask)
        masks: dict[int, int] = {0: 0}
        if self.matches:
            ids = np.fromiter((masks.setdefault(self.matches.get(int(q), 0), len(masks))
                               for q in row_seqs.tolist()), np.int64, len(row_seqs))
        else:
            ids = np.zeros(len(row_seqs), np.int64)
        bits_of = {i: m for m, i in masks.items()}
        # rows of segments whose policies give the same verdicts share a class; a segment
        # before `first` (its matches not computed) is a class of its own
        kind = np.where(segment >= 0, kinds[np.maximum(segment, 0)], -1) if len(kinds) \
            else np.full(len(segment), -1, np.int64)
        stale = (segment < self.first).astype(np.int64)
        classes = ((kind + 1) * (len(masks) + 1) + ids) * 2 + stale
        keep = np.zeros(len(row_ids), dtype=bool)
        hidden: dict[int, dict[int, frozenset[str]]] = {}
        cuts = np.flatnonzero(np.diff(plan_ids)) + 1
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(plan_ids)], strict=True):
            state = states.get(int(plan_ids[lo]))
            if state is None:
                continue
            uniq, first, inverse = np.unique(classes[lo:hi], return_index=True,
                                             return_inverse=True)
            projection = state.compiled.projection
            verdicts = [self._visible(state, int(segment[lo + f]), int(row_seqs[lo + f]),
                                      bits_of[int(ids[lo + f])])
                        for f in first.tolist()]
            keep[lo:hi] = np.array([bool(v) for v in verdicts], dtype=bool)[inverse]
            partial = [k for k, v in enumerate(verdicts) if v and len(v) < len(projection)
                       and state.windows is None]
            if partial:
                rows = hidden.setdefault(state.id, {})
                for k in partial:
                    gone = frozenset(projection) - verdicts[k]
                    for at in (np.flatnonzero(inverse == k) + lo).tolist():
                        rows[int(row_ids[at])] = gone
        return plan_ids[keep], row_ids[keep], hidden

    def _visible(self, state: PlanState, segment: int, seq: int, bits: int
                 ) -> frozenset[str]:
        if segment < 0 and self.pruned:
            return frozenset()  # its segment was dropped: denied
        policy = self.policies[segment] if segment >= 0 else SegmentPolicy()
        if policy.conditions and (segment < self.first or seq < 0):
            return frozenset()  # its matches were not computed: denied
        roles, mode, reads = state.compiled.punctuations or (frozenset(), REFINE, ())
        key = (int(self.kinds[segment]) if segment >= 0 else -1, bits, state.id)
        found = self._verdicts.get(key)
        if found is None:
            matched = frozenset(c for c in policy.conditions
                                if bits >> self.index[c] & 1)
            if state.windows is not None:
                found = frozenset(reads) if counts_in_window(policy, roles, mode, reads,
                                                             matched) else frozenset()
            else:
                found = visible_attributes(policy, roles, mode, state.compiled.projection,
                                           matched, reads)
            self._verdicts[key] = found
        return found

    def window_filter(self, plans: list[PlanState], batch: DataFrame
                      ) -> Callable[[Column], Column]:
        """For the panes job: given a plan's id, whether the batch's tuple counts in that
        window plan's windows (`counts_in_window` under the tuple's segment), as a Column over
        the batch's row. Applied to the plans a tuple passes before the panes are numbered and
        aggregated (`PanesJob.panes_frame`), where the plan's filter is: a tuple a segment
        hides is in no pane of the plan, numbers no tuple of its tuple windows and moves no
        clock of its time windows.

        One small job gives the batch's first and last positions; the expression covers the
        segments between them, runs of segments with the same verdict as one range, and the
        tuple DDPs of a segment as their comparisons (every combination of those it has met or
        not; past MAX_WINDOW_CONDITIONS of them, its tuples are denied). A tuple outside the
        segments (no position; behind segments dropped) is denied."""
        seq = F.col(SEQ_COLUMN)
        row = batch.agg(F.min(seq).alias("lo"), F.max(seq).alias("hi")).first()
        low = None if row is None else row["lo"]
        high = None if row is None else row["hi"]
        if low is not None:  # (a stream with window plans only routes no rows to say it)
            self.shield.moved(int(low))
        cases: list[tuple[int, Column]] = []
        for state in plans:
            cases.append((state.id, F.lit(False) if low is None or high is None
                          else self._window_counts(state, int(low), int(high))))

        def counts(pid: Column) -> Column:
            out = None
            for plan_id, test in cases:
                out = (F.when(pid == F.lit(plan_id), test) if out is None
                       else out.when(pid == F.lit(plan_id), test))
            return F.lit(False) if out is None else out.otherwise(F.lit(False))
        return counts

    def _window_counts(self, state: PlanState, low: int, high: int) -> Column:
        seq = F.col(SEQ_COLUMN)
        starts = self.starts.tolist()
        first = int(np.searchsorted(self.starts, low, side="right")) - 1
        last = int(np.searchsorted(self.starts, high, side="right")) - 1
        roles, mode, reads = state.compiled.punctuations or (frozenset(), REFINE, ())

        def span(i: int) -> Column:
            lo = starts[i] if i >= 0 else None
            hi = starts[i + 1] if i + 1 < len(starts) else None
            inside = F.lit(True)
            if lo is not None:
                inside = seq >= F.lit(lo)
            if hi is not None:
                inside = inside & (seq < F.lit(hi))
            return inside

        terms: list[Column] = []
        run: int | None = None  # the first segment of a run of counted ones
        for i in range(first, last + 1):
            if i < 0 and self.pruned:
                ok: bool | list[Column] = False  # its segment was dropped: denied
            else:
                ok = self._segment_counts(state, i, roles, mode, reads)
            if ok is True:
                run = i if run is None else run
                continue
            if run is not None:
                terms.append(_between(seq, starts, run, i))
                run = None
            if isinstance(ok, list) and ok:
                terms.append(span(i) & reduce(lambda a, b: a | b, ok))
        if run is not None:
            terms.append(_between(seq, starts, run, last + 1))
        if not terms:
            return F.lit(False)
        return F.coalesce(reduce(lambda a, b: a | b, terms), F.lit(False))

    def _segment_counts(self, state: PlanState, segment: int, roles: frozenset[str],
                        mode: str, reads: tuple[str, ...]) -> bool | list[Column]:
        """Whether a segment's tuples count in the plan's windows: True, False, or the tests
        of the combinations of its tuple DDPs under which they do."""
        policy = self.policies[segment] if segment >= 0 else SegmentPolicy()
        conditions = policy.conditions
        if len(conditions) > MAX_WINDOW_CONDITIONS:
            return False
        kind = int(self.kinds[segment]) if segment >= 0 else -1
        out: list[Column] = []
        for bits in range(1 << len(conditions)):
            met = tuple(c for j, c in enumerate(conditions) if bits >> j & 1)
            key = ("window", kind, met, state.id)
            found = self._verdicts.get(key)
            if found is None:
                matched = frozenset(met)
                found = frozenset(reads) if counts_in_window(policy, roles, mode, reads,
                                                             matched) else frozenset()
                self._verdicts[key] = found
            if not found:
                continue
            if not conditions:
                return True
            tests = [_holds(c) if bits >> j & 1 else ~_holds(c)
                     for j, c in enumerate(conditions)]
            out.append(reduce(lambda a, b: a & b, tests))
        if not conditions:
            return False
        return True if len(out) == 1 << len(conditions) else out


MAX_WINDOW_CONDITIONS = 6  # distinct tuple DDPs of one segment the window filter enumerates


def _holds(conds: Conditions) -> Column:
    """Whether a tuple meets a tuple DDP (a null compares as unmet, as in `Condition.holds`)."""
    return F.coalesce(reduce(lambda a, b: a & b, (_condition_column(c) for c in conds)),
                      F.lit(False))


def _between(seq: Column, starts: list[int], first: int, end: int) -> Column:
    """Positions from segment `first` (-1: before any) up to segment `end`'s start."""
    inside = F.lit(True)
    if first >= 0:
        inside = seq >= F.lit(starts[first])
    if end < len(starts):
        inside = inside & (seq < F.lit(starts[end]))
    return inside


__all__ = ["PunctuationShield", "BatchShield", "Moves", "Conditions", "PRUNE_AT",
           "MAX_WINDOW_CONDITIONS", "match_tuples", "verdict_key"]
