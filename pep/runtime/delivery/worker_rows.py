"""The grouped matcher's admitted rows, one per (row, plan) it admits: what the plan topics'
writer keys and encodes natively (`topic_rows.py`). Runs on Spark's workers inside the rows
job's second `mapInArrow`, pickled by value with the matcher (numpy and pyarrow only: a worker
runs it without xsg installed)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def exploded_rows(matcher: Any, keep: list[str], bits_column: str, pid_column: str,
                  figures: tuple[str, str], counted: Any = None
                  ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The `mapInArrow` function over the admitted frame (`matcher.admitted_rows`' output): each
    admitted row repeated for every plan its bitmap names (`GroupedMatcher.pairs`), with the
    plan's id in `pid_column` and the `keep` columns. The tasks' figures rows pass through with
    a null plan id (the caller drops them), or, with `counted` (a Spark accumulator of
    {partition: (tuples read, highest position)}), are added to it, once per task: a task run
    again replaces its partition's figures rather than adding to them."""
    read_column, top_column = figures

    def explode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        read_total, top = 0, None
        for batch in batches:
            if not batch.num_rows:
                continue
            read = batch.column(batch.schema.get_field_index(read_column))
            is_figures = pc.is_valid(read)
            if pc.any(is_figures).as_py():
                rows = batch.filter(pc.invert(is_figures))
                facts = batch.filter(is_figures)
            else:
                rows, facts = batch, None
            if facts is not None and counted is not None:
                read_total += int(pc.sum(facts.column(facts.schema.get_field_index(
                    read_column))).as_py() or 0)
                high = pc.max(facts.column(facts.schema.get_field_index(top_column))).as_py()
                if high is not None:
                    top = high if top is None else max(top, high)
            elif facts is not None:
                yield pa.RecordBatch.from_arrays(
                    [pa.nulls(facts.num_rows, pa.int64()),
                     *(facts.column(facts.schema.get_field_index(n)) for n in keep),
                     facts.column(facts.schema.get_field_index(read_column)),
                     facts.column(facts.schema.get_field_index(top_column))],
                    names=[pid_column, *keep, read_column, top_column])
            if not rows.num_rows:
                continue
            bits = rows.column(rows.schema.get_field_index(bits_column))
            plan_ids, row_ids = matcher.pairs(bits)
            if not len(row_ids):
                continue
            take = pa.array(np.asarray(row_ids, dtype=np.int64))
            nulls = pa.nulls(len(row_ids), pa.int64())
            yield pa.RecordBatch.from_arrays(
                [pa.array(np.asarray(plan_ids, dtype=np.int64)),
                 *(rows.column(rows.schema.get_field_index(n)).take(take) for n in keep),
                 nulls, nulls],
                names=[pid_column, *keep, read_column, top_column])
        if counted is not None:
            from pyspark import TaskContext

            context = TaskContext.get()
            counted.add({context.partitionId() if context is not None else 0: (read_total, top)})
    return explode


__all__ = ["exploded_rows"]
