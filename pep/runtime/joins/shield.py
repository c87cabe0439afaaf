"""The Security Shield of a join's side on a stream with security punctuations (the paper's
SCJoin, section 5.4: each side keeps its own punctuations): what of the side's tuples its
consumer may see, before the side's filter, window and the join.

A join runs as a query of its own over the side's files (`joins/frames.py`), not in the
stream's shared query where `query/shield.py` works, so the side reads its stream's punctuation
log itself: per Arrow batch of the side's source (`DataFrame.mapInArrow`, on the Python
workers), the log as it is then (the ingest writes a batch's punctuations before the batch's
file can be read, into the stream's directory and its feeds alike: a tuple's segment is always
in it), each tuple's segment by its position, and the verdict of `pep.core.punctuations` for the
side plan's roles:
- a plain side: a tuple none of whose shown attributes is visible, or of which an attribute the
  side's filter, the join's keys, its time or its label read is hidden, is dropped (a joined row
  needs both tuples: a hidden one produces no joined row); other hidden attributes are null in
  the joined row;
- a windowed side: a tuple counts in the side's windows only when every attribute the window
  reads is visible (`counts_in_window`), as on a stream read alone.
"""
from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from pep.core.plan import ExecutionPlan, StreamDefinition
from pep.core.punctuations import (
    DEFER,
    LOG_NAME,
    REFINE,
    Condition,
    SegmentPolicy,
    counts_in_window,
    filter_attributes,
    read_log_line,
    segments,
    visible_attributes,
)
from pep.runtime.base.columns import SEQ_COLUMN


@dataclass(frozen=True)
class SideShield:
    """What a side's shield needs on the workers (pickled with the function)."""

    log: str  # the stream's punctuation log
    types: tuple[tuple[str, str], ...]  # the stream's attributes and types
    roles: frozenset[str]
    mode: str
    shown: tuple[str, ...]  # the side's attributes it outputs (plain side)
    reads: tuple[str, ...]  # what must be visible for the tuple to count at all
    windowed: bool

    def segments(self) -> tuple[list[int], list[SegmentPolicy]]:
        """The log as it is now, as segments; a log whose positions go back is trusted up to
        there only (never written so): every segment from there on denies."""
        types = dict(self.types)
        try:
            with open(self.log, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return [], []
        whole = text[:text.rfind("\n") + 1]
        entries = [read_log_line(line, types) for line in whole.splitlines() if line.strip()]
        starts, policies = segments(entries)
        for k in range(1, len(starts)):
            if starts[k] <= starts[k - 1]:
                starts = starts[:k]
                policies = policies[:k - 1] + [SegmentPolicy(complete=False)]
                break
        return starts, policies

    def apply(self, batch: pa.RecordBatch, starts: list[int],
              policies: list[SegmentPolicy]) -> pa.RecordBatch:
        """The batch's tuples this side may see, hidden attributes null."""
        n = batch.num_rows
        if not n:
            return batch
        names = batch.schema.names
        seqs = batch.column(names.index(SEQ_COLUMN)).to_pylist()
        types = dict(self.types)
        values: dict[str, list[object]] = {}

        def value(attribute: str, i: int) -> object:
            if attribute not in values:
                column = batch.column(names.index(attribute))
                if types.get(attribute) == "timestamp":  # as epoch seconds, as Condition reads
                    micros = pc.cast(column, pa.int64()).to_pylist()
                    values[attribute] = [None if m is None else m / 1_000_000.0
                                         for m in micros]
                else:
                    values[attribute] = column.to_pylist()
            return values[attribute][i]

        keep: list[bool] = []
        hidden: dict[str, list[bool]] = {a: [] for a in self.shown}
        verdicts: dict[tuple[int, frozenset[tuple[Condition, ...]]], frozenset[str]] = {}
        for i, seq in enumerate(seqs):
            if seq is None:  # no position, no segment: denied
                keep.append(False)
                continue
            k = bisect.bisect_right(starts, int(seq)) - 1
            policy = policies[k] if k >= 0 else SegmentPolicy()
            matched = frozenset(c for c in policy.conditions
                                if all(x.holds(value(x.attribute, i)) for x in c))
            seen = verdicts.get((k, matched))
            if seen is None:
                if self.windowed:
                    seen = frozenset(self.reads) if counts_in_window(
                        policy, self.roles, self.mode, self.reads, matched) else frozenset()
                else:
                    seen = visible_attributes(policy, self.roles, self.mode, self.shown,
                                              matched, self.reads)
                verdicts[(k, matched)] = seen
            keep.append(bool(seen))
            if seen and not self.windowed:
                for a in self.shown:
                    hidden[a].append(a not in seen)
        out = batch.filter(pa.array(keep, pa.bool_()))
        if self.windowed or not out.num_rows:
            return out
        columns = list(out.columns)
        for a, flags in hidden.items():
            if any(flags):
                j = names.index(a)
                columns[j] = pc.if_else(pa.array(flags, pa.bool_()),
                                        pa.nulls(out.num_rows, columns[j].type), columns[j])
        return pa.RecordBatch.from_arrays(columns, schema=out.schema)


def shielded_side(df: DataFrame, definition: StreamDefinition, plan: ExecutionPlan,
                  reads: tuple[str, ...]) -> DataFrame:
    """The side's source with its punctuations applied (see the module docstring). `reads`:
    what the join reads of the side's own attributes (its keys, its time, its label), by their
    schema names. The side's plan must carry its consumer's roles (`shielded_plan`)."""
    if plan.punctuation_roles is None:
        raise ValueError(f"stream {definition.name!r} carries security punctuations: the "
                         "join's side carries no roles to read them against")
    schema = definition.schema
    w = plan.window

    def canonical(names: list[str]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.name for n in names
                                   if (f := schema.lookup(n)) is not None))

    needed = [*filter_attributes(plan), *reads]
    if w is not None:
        needed += [a.attribute for a in w.aggregates] + list(w.keys)
        needed += [a for a, _ in w.label_bounds]
        needed += [w.time_attribute or definition.time_attribute or ""]
    shield = SideShield(
        str(Path(definition.source.option("path") or ".") / LOG_NAME),
        tuple((f.name, f.type) for f in schema.fields), frozenset(plan.punctuation_roles),
        DEFER if plan.punctuation_defer else REFINE,
        () if w is not None else canonical(list(plan.projection)), canonical(needed),
        w is not None)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        starts: list[int] = []
        policies: list[SegmentPolicy] = []
        size = -1
        for batch in batches:
            try:
                now = os.path.getsize(shield.log)
            except FileNotFoundError:
                now = 0
            if now != size:  # the log grew: read it again
                starts, policies = shield.segments()
                size = now
            yield shield.apply(batch, starts, policies)
    return df.mapInArrow(run, df.schema)


__all__ = ["SideShield", "shielded_side"]
