"""Spark's Python workers freeze their heap at their first tasks (PySpark collects garbage in
full after every task: 35-40 ms each with numpy, pyarrow and pandas imported); the driver's heap
is left alone."""
from __future__ import annotations

import gc
from collections.abc import Iterator

import pyarrow as pa

from pep.runtime import batch_frames
from pep.runtime.matcher import FROZEN_TASKS, freeze_worker_heap


assert batch_frames  # imported for its side effect: the matcher is pickled by value, as the
# runtime ships it to the workers


def test_the_driver_never_freezes():
    before = gc.get_freeze_count()
    assert freeze_worker_heap() is False
    assert gc.get_freeze_count() == before


def test_a_worker_freezes_a_bounded_number_of_times_and_collections_skip_the_frozen(spark):
    def probe(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        calls = [freeze_worker_heap() for _ in range(FROZEN_TASKS + 1)]
        again = calls[-1]  # past the first tasks' freezes a process freezes no more
        frozen = gc.get_freeze_count()
        tracked = len(gc.get_objects())
        for b in batches:
            yield pa.RecordBatch.from_pydict({"frozen": [frozen] * b.num_rows,
                                              "tracked": [tracked] * b.num_rows,
                                              "again": [again] * b.num_rows})

    rows = spark.range(16).repartition(4).mapInArrow(
        probe, "frozen long, tracked long, again boolean").collect()
    assert len(rows) == 16
    for r in rows:
        assert r.again is False
        # the imported modules' objects moved out: a collection walks far fewer than before
        assert r.frozen > 10_000 and r.tracked < r.frozen
