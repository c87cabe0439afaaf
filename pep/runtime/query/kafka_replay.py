"""A restart of a Kafka stream's query: what its restored handles' readers may not have read,
given again before the query's first batch. The micro-batches its checkpoint names and its
topic still holds are read again (one batch query, `sources/replay.py` says which records each batch
read) and run through the rows job of the replayable plans; their rows are routed under the ids
the batches had.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pyarrow as pa
from pyspark.sql import Column, SparkSession

from common.errors import described
from pep.core import punctuations
from pep.core.rows import RowBatch
from pep.runtime.base.columns import FILE_COLUMN
from pep.runtime.base.delivery import deliver_to
from pep.runtime.plans.batch_shape import Shape
from pep.runtime.plans.compile import CompiledPlan
from pep.runtime.plans.matcher import GroupedMatcher, kafka_positions
from pep.runtime.query.figures import QueryFigures
from pep.runtime.query.plan_table import PlanTable
from pep.runtime.query.registry import PlanRegistry, PlanSets, PlanState
from pep.runtime.query.router import ResultRouter
from pep.runtime.query.rows_job import RowsJob
from pep.runtime.query.settings import StreamLayout
from pep.runtime.sources.frames import kafka_options, kafka_range_frame
from pep.runtime.sources.kafka_offsets import KafkaOffsets
from pep.runtime.sources.replay import (
    BatchRange,
    batch_of,
    batch_ranges,
    batch_start,
    covers,
    last_committed,
    offsets_json,
    split_by_batch,
    still_held,
)

log = logging.getLogger(__name__)


def replayable_compiled(plan: CompiledPlan) -> bool:
    """A compiled plan whose rows a restart can compute again (`pep.core.plan.replayable`):
    cut at Kafka offsets, no window, no DISTANCE_TO anchor."""
    return plan.start_offsets is not None and plan.window is None and not plan.anchors


class KafkaReplay:
    """Gives restored handles the rows of the micro-batches before a restart again."""

    def __init__(self, spark: SparkSession, layout: StreamLayout, registry: PlanRegistry,
                 table: PlanTable, rows: RowsJob, router: ResultRouter,
                 figures: QueryFigures) -> None:
        self._spark = spark
        self._layout = layout
        self._registry = registry
        self._table = table
        self._rows = rows
        self._router = router
        self._figures = figures

    def redefine(self, layout: StreamLayout) -> None:
        """The stream's definition changed."""
        self._layout = layout

    def replay(self, location: Path, fresh: bool) -> None:
        """Before a restored Kafka stream's query starts on its checkpoint at `location`: each
        replayable handle (a positioned buffer, `pep.core.plan.replayable`) is told from which
        micro-batch on its rows follow (`RowBatch.resumed_from`), then given again the rows of
        every batch its stream's checkpoint names and its topic still holds, up to the last one
        delivered (Spark runs the rest), under the ids they had (`sources/replay.py`). `fresh`: the
        query starts without a checkpoint: nothing can be read again. A replay that fails (the
        broker away) leaves the rows of those batches lost, and says so (`resumed_from`: the
        first live batch)."""
        found = self._registry.replayable(replayable_compiled)
        states, unions, targets = found.states, found.unions, found.targets
        if not targets:
            return
        definition = self._layout.definition
        topic = kafka_options(definition)[1]
        last = -1 if fresh else max(last_committed(location), self._router.completed_batch)
        ranges: list[BatchRange] = []
        replayed: list[tuple[int, pa.Table]] = []
        shape: Shape | None = None
        grouped: GroupedMatcher | None = None
        started = time.perf_counter()
        # a punctuated stream's records would need their partitions' punctuations before them
        # (`query/source_shield.py`): not read again; their readers get a gap
        if last >= 0 and not punctuations.enabled(definition):
            try:
                ranges = batch_ranges(location, topic, last)
                if ranges:
                    earliest = KafkaOffsets().start_offsets(definition)
                    ranges = still_held(ranges, dict(enumerate(earliest)))
                if ranges:
                    replayed, shape, grouped = self._replay_rows(ranges, states)
            except Exception as exc:  # noqa: BLE001 - the handles resume; the rows are lost
                log.warning("stream %s: the micro-batches before the restart could not be "
                            "read again (%s); readers that had not read them get a gap",
                            definition.name, described(exc))
                ranges, replayed = [], []
        first = ranges[0].batch if ranges else last + 1
        start = None if fresh else (ranges[0].start if ranges
                                    else batch_start(location, topic, first))
        for handle, cut in targets:
            whole = start is not None and cut is not None and covers(cut, start)
            marker = RowBatch((), 0, resumed_from=0 if whole else self._router.position(first))
            deliver_to([handle], marker, self._figures.counters)
        try:
            for batch_id, table in replayed:
                self._router.begin(batch_id)
                if table.num_rows and shape is not None:
                    self._router.route_rows(table, states, shape, grouped, unions=unions)
        finally:
            self._router.begin(None)
        if ranges:
            log.info("stream %s: micro-batches %d-%d read again for %d restored handles "
                     "(%.2f s)", definition.name, ranges[0].batch, ranges[-1].batch,
                     len(targets), time.perf_counter() - started)

    def _replay_rows(self, ranges: list[BatchRange], states: list[PlanState]
                     ) -> tuple[list[tuple[int, pa.Table]], Shape, GroupedMatcher | None]:
        """The rows job of `states` over the records of `ranges`, read again from Kafka (one
        batch query), split by the micro-batch each record came in."""
        definition = self._layout.definition
        topic = kafka_options(definition)[1]
        partitions = sorted({p for r in ranges for p in (*r.start, *r.end)})
        start = {p: ranges[0].start.get(p, 0) for p in partitions}
        end = {p: ranges[-1].end.get(p, start[p]) for p in partitions}
        frame = kafka_range_frame(self._spark, definition,
                                  json.dumps({topic: partitions}), offsets_json(topic, start),
                                  offsets_json(topic, end))
        version = -1 - self._registry.version  # its own shape and tables, rebuilt for the query
        sets = PlanSets.of(version, states)
        shape = self._table.shape_of(states, version)
        rows_by = self._rows.matcher(sets, shape)
        grouped = rows_by if isinstance(rows_by, GroupedMatcher) else None
        if grouped is not None:
            arrow, _ = self._rows.admitted_arrow(frame, shape, grouped)
        else:
            _, scalar = self._table.plan_table(states, version, shape)
            arrow = self._rows.rows_frame(frame, scalar, shape,
                                          rows_by if isinstance(rows_by, Column) else None
                                          ).toArrow()
        parts, offsets = kafka_positions(arrow.column(FILE_COLUMN))
        return split_by_batch(arrow, batch_of(parts, offsets, ranges), ranges), shape, grouped


__all__ = ["KafkaReplay", "replayable_compiled"]
