"""A micro-batch's plan-topic records, routed and numbered on a worker: each row passed by some
plan repeated for every (plan, topic) it goes to, in stream order per topic, numbered from 0
(what the plan topics' writer keys and encodes natively, `topic_rows.py`). Runs inside the rows
job's `mapInArrow`, pickled by value with the matcher (numpy and pyarrow only: a worker runs it
without xsg installed)."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SORTABLE = ("is_integer", "is_floating", "is_string", "is_large_string", "is_boolean",
            "is_timestamp", "is_date", "is_binary", "is_large_binary", "is_decimal")
CHUNK = 10_000  # records per Arrow batch handed back to Spark


@dataclass(frozen=True)
class RouteTable:
    """Where each plan's rows go, as arrays a worker looks plans up in: `pids` ascending and
    unique; plan `pids[i]`'s routes are entries `starts[i]` to `starts[i] + counts[i] - 1` of
    `topics` (an index into `names`) and `projections` (the value's projection index)."""

    pids: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    topics: np.ndarray
    projections: np.ndarray
    names: tuple[str, ...]


def route_table(routes: Sequence[tuple[int, Sequence[str], int]]) -> RouteTable:
    """The table of (plan id, its topics, its projection index) triples."""
    names: dict[str, int] = {}
    pids: list[int] = []
    starts: list[int] = []
    counts: list[int] = []
    topics: list[int] = []
    projections: list[int] = []
    for pid, plan_topics, projection in sorted(routes, key=lambda r: r[0]):
        if not plan_topics:
            continue
        if pids and pids[-1] == pid:
            raise ValueError(f"plan {pid} routed twice")
        pids.append(pid)
        starts.append(len(topics))
        counts.append(len(plan_topics))
        for topic in plan_topics:
            topics.append(names.setdefault(topic, len(names)))
            projections.append(projection)
    return RouteTable(np.asarray(pids, np.int64), np.asarray(starts, np.int64),
                      np.asarray(counts, np.int64), np.asarray(topics, np.int64),
                      np.asarray(projections, np.int32), tuple(names))


def bitmap_pairs(matcher: Any, bits_column: str
                 ) -> Callable[[pa.RecordBatch], tuple[np.ndarray, np.ndarray]]:
    """(plan ids, row indices) of the grouped matcher's bitmaps (`GroupedMatcher.pairs`)."""
    def pairs(rows: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
        result: tuple[np.ndarray, np.ndarray] = matcher.pairs(
            rows.column(rows.schema.get_field_index(bits_column)))
        return result
    return pairs


def list_pairs(pids_column: str) -> Callable[[pa.RecordBatch], tuple[np.ndarray, np.ndarray]]:
    """(plan ids, row indices) of a column with a list of plan ids per row."""
    def pairs(rows: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
        lists = rows.column(rows.schema.get_field_index(pids_column))
        flat = pc.list_flatten(lists)
        at = pc.list_parent_indices(lists)
        return (np.asarray(flat.fill_null(-1), dtype=np.int64),
                np.asarray(at, dtype=np.int64))
    return pairs


def numbered_records(pairs: Callable[[pa.RecordBatch], tuple[np.ndarray, np.ndarray]],
                     keep: list[str], order: list[str], table: RouteTable,
                     out: tuple[str, str, str, str], figures: tuple[str, str] | None = None,
                     counted: Any = None, values: list[str] | None = None
                     ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The `mapInArrow` function that makes a micro-batch's plan-topic records without a
    shuffle: run over the batch in one task (the frame coalesced to one partition), it
    repeats each row for every (plan, topic) it goes to (`pairs` names the plans of each row,
    `table` their topics), puts them in order (topic, the stream's `order` columns, plan,
    then the kept values: a write run again after a failure numbers every row as the first did,
    whatever order the rows came in) and numbers each topic's records from 0 in that order.
    Out: three of the `out` columns (topic, projection index, number), then `keep`; with
    `values` (the row's value under each projection, made before: one column per projection
    index, in `keep`) only the topic, the number and the record's own value (`out`'s fourth),
    which also breaks ties in place of the kept columns. With `figures`,
    the rows whose first figures column is set are the tasks' figures, added to `counted` (a
    Spark accumulator of {partition: (tuples read, highest position)}, once per task: a task
    run again replaces its partition's figures) and are not records."""
    topic_name, projection_name, index_name, value_name = out
    names = pa.array(table.names, pa.string())

    def number(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        read_total, top = 0, None
        parts: list[pa.Table] = []
        for batch in batches:
            if not batch.num_rows:
                continue
            rows = batch
            if figures is not None:
                read = batch.column(batch.schema.get_field_index(figures[0]))
                is_figures = pc.is_valid(read)
                if pc.any(is_figures).as_py():
                    facts = batch.filter(is_figures)
                    rows = batch.filter(pc.invert(is_figures))
                    read_total += int(pc.sum(facts.column(facts.schema.get_field_index(
                        figures[0]))).as_py() or 0)
                    high = pc.max(facts.column(facts.schema.get_field_index(
                        figures[1]))).as_py()
                    if high is not None:
                        top = high if top is None else max(top, high)
            if rows.num_rows and len(table.pids):
                part = _routed(rows, pairs, keep, table, values)
                if part is not None:
                    parts.append(part)
        if counted is not None:
            from pyspark import TaskContext

            context = TaskContext.get()
            counted.add({context.partitionId() if context is not None else 0: (read_total, top)})
        if not parts:
            return
        records = pa.concat_tables(parts)
        carried = list(order) if values is not None else keep
        tiebreak = ["_value"] if values is not None else [
            n for n in keep if n not in order
            and any(getattr(pa.types, t)(records.schema.field(n).type) for t in SORTABLE)]
        records = records.append_column("_at", pa.array(np.arange(records.num_rows)))
        ordering = _sorted(records, ["_topic", *order, "_pid", *tiebreak, "_at"])
        records = records.take(ordering)
        topics = np.asarray(records.column("_topic"), dtype=np.int64)
        first = np.flatnonzero(np.r_[True, topics[1:] != topics[:-1]])
        sizes = np.diff(np.r_[first, len(topics)])
        index = pa.array(np.arange(len(topics)) - np.repeat(first, sizes), pa.int64())
        if values is not None:
            result = pa.table([names.take(pa.array(topics)), index, records.column("_value")],
                              names=[topic_name, index_name, value_name])
        else:
            result = pa.table([names.take(pa.array(topics)), records.column("_projection"),
                               index, *(records.column(n) for n in carried)],
                              names=[topic_name, projection_name, index_name, *carried])
        yield from result.to_batches(max_chunksize=CHUNK)
    return number


def _sorted(records: pa.Table, keys: list[str]) -> pa.Array:
    """The indices that sort `records` by `keys`, ascending, nulls last (as Spark's
    `asc_nulls_last`): per key on pyarrow 25 and later, for the whole sort before (a worker's
    pyarrow may be older than the gateway's: `pyarrow>=14`)."""
    if tuple(int(p) for p in pa.__version__.split(".")[:1]) >= (25,):
        return pc.sort_indices(records, sort_keys=[(k, "ascending", "at_end") for k in keys])
    return pc.sort_indices(records, sort_keys=[(k, "ascending") for k in keys],
                           null_placement="at_end")


def _routed(rows: pa.RecordBatch,
            pairs: Callable[[pa.RecordBatch], tuple[np.ndarray, np.ndarray]],
            keep: list[str], table: RouteTable, values: list[str] | None) -> pa.Table | None:
    """A batch's rows repeated for each (plan, topic) they go to: the `keep` columns (with
    `values`: only those that are not values, and the record's value as `_value`), the
    topic's index (`_topic`), the projection index (`_projection`) and the plan (`_pid`)."""
    plan_ids, row_ids = pairs(rows)
    plan_ids = np.asarray(plan_ids, dtype=np.int64)
    row_ids = np.asarray(row_ids, dtype=np.int64)
    if not len(plan_ids):
        return None
    at = np.searchsorted(table.pids, plan_ids)
    found = at < len(table.pids)
    found[found] = table.pids[at[found]] == plan_ids[found]  # plans without a topic: none
    if not found.any():
        return None
    at, plan_ids, row_ids = at[found], plan_ids[found], row_ids[found]
    counts = table.counts[at]
    pair = np.repeat(np.arange(len(at)), counts)
    entry = table.starts[at][pair] + (np.arange(len(pair))
                                      - np.repeat(np.cumsum(counts) - counts, counts))
    rows_of = row_ids[pair]
    projections = table.projections[entry]
    carried = [n for n in keep if values is None or n not in values]
    columns = [rows.column(rows.schema.get_field_index(n)).take(pa.array(rows_of))
               for n in carried]
    names = list(carried)
    if values is not None:  # projection j's value of row r is at j * rows + r of them all
        stacked = pa.concat_arrays([rows.column(rows.schema.get_field_index(v))
                                    for v in values])
        columns.append(stacked.take(pa.array(projections.astype(np.int64) * rows.num_rows
                                             + rows_of)))
        names.append("_value")
    return pa.table([*columns, pa.array(table.topics[entry]), pa.array(projections),
                     pa.array(plan_ids[pair])],
                    names=[*names, "_topic", "_projection", "_pid"])


__all__ = ["RouteTable", "bitmap_pairs", "list_pairs", "numbered_records",
           "route_table"]
