"""One stream's share of a shared micro-batch: the DataFrames its jobs would collect on a query
of its own, to be collected with every other stream's in one Spark job, and what routes their
results into its handles afterwards.

The choices are the per-stream runner's (`query/runner.py`), made by the same parts on the
same data: the registry's plan sets, the plan table's shape, the rows job's matcher (a few
plans compiled, the grouped matcher, or the plan table), the panes job for windows; only the
collection differs. Where the per-stream runner observes the stream's figures on its jobs,
a branch adds a frame of its positions (`figures`), summed up on the workers
(`arrow_ipc.summary_packer`): an observation is bound to the DataFrame it was made on, not to a
union of them, and an aggregate would be a shuffle (a job of its own).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame

from pep.runtime.base.arrow_ipc import Packer
from pep.runtime.base.columns import BITS_COLUMN, READ_COLUMN, SEQ_COLUMN, TOP_COLUMN
from pep.runtime.plans.batch_shape import Shape
from pep.runtime.plans.matcher import GroupedMatcher, admitted_rows
from pep.runtime.query.batch_columns import order_columns
from pep.runtime.query.figures import QueryFigures
from pep.runtime.query.panes_job import PanesJob
from pep.runtime.query.plan_table import PlanTable
from pep.runtime.query.registry import PlanRegistry, PlanSets
from pep.runtime.query.router import ResultRouter
from pep.runtime.query.rows_job import RowsJob, split_figures
from pep.runtime.query.runner import MicroBatchRunner, Route
from pep.runtime.query.settings import StreamLayout

log = logging.getLogger(__name__)

ROWS, PANES, FIGURES = "rows", "panes", "figures"


@dataclass(frozen=True)
class StreamParts:
    """The parts of one stream's query that a shared batch uses (`member.py` makes them)."""

    layout: StreamLayout
    registry: PlanRegistry
    table: PlanTable
    rows: RowsJob
    panes: PanesJob
    router: ResultRouter
    runner: MicroBatchRunner
    figures: QueryFigures
    memo: dict[str, Any]  # the branch's own: the grouped matcher of the plans' version


@dataclass(frozen=True)
class Branch:
    """A stream's frames in a shared batch (tag, DataFrame, what runs on the workers before it
    is packed: the grouped matcher's function, in the packing's Python stage), whether one of
    them reads the plan table (whole-stage code generation is then off for the job, as on the
    stream's own query), and `finish(results)`: its results by tag into a route for its route
    worker."""

    frames: list[tuple[str, DataFrame, Packer | None]]
    plan_table: bool
    finish: Callable[[dict[str, pa.Table]], Route | None]


def grouped_matcher(parts: StreamParts, sets: PlanSets, shape: Shape
                    ) -> GroupedMatcher | None:
    """In a shared batch the grouped matcher takes every row plan it can test, however few:
    its tests run in the one Python stage that packs the stream's rows anyway, where the
    compiled few-plans matcher would need a Python stage more (the packing) and a scan more
    (the figures, which the matcher's tasks count)."""
    if shape.spatial or shape.masked or not sets.plain:
        return None
    memo = parts.memo
    if memo.get("version") != sets.version:
        memo["version"] = sets.version
        memo["grouped"] = GroupedMatcher.build([(s.id, s.compiled) for s in sets.plain])
    grouped: GroupedMatcher | None = memo["grouped"]
    return grouped


def plan_branch(parts: StreamParts, frame: DataFrame) -> Branch | None:
    """The stream's frames over `frame` (its tuples of the batch, `sources/shared_files.py`),
    or None when no plan is attached."""
    sets = parts.registry.plan_sets()
    plans, version = sets.plans, sets.version
    if not plans:
        return None
    if sets.keeps_windows:
        # the plan table carries tuple windows' pane offsets, and time windows advance their
        # watermarks, in routing: the stream's batch before this one is routed first
        parts.runner.drain()
    parts.table.anchors.update(frame, sets.anchored)  # nothing without DISTANCE_TO
    shape = parts.table.shape_of(plans, version)
    grouped = grouped_matcher(parts, sets, shape)
    rows_by = grouped if grouped is not None else parts.rows.matcher(sets, shape)
    scalar: Column | None = None
    if rows_by is None or sets.windowed:
        _, scalar = parts.table.plan_table(plans, version, shape)
    few = rows_by if isinstance(rows_by, Column) else None
    grouped = rows_by if isinstance(rows_by, GroupedMatcher) else None
    plain, windowed = sets.plain, sets.windowed
    frames: list[tuple[str, DataFrame, Packer | None]] = []
    counted = grouped is not None and bool(plain) and bool(shape.plain_columns)
    if plain and shape.plain_columns:
        if grouped is not None:
            keep = list(shape.plain_columns) + order_columns(parts.layout, shape)
            frames.append((ROWS, parts.rows.values_frame(frame, shape, grouped),
                           admitted_rows(grouped, SEQ_COLUMN, keep, BITS_COLUMN,
                                         (READ_COLUMN, TOP_COLUMN))))
        elif few is not None or scalar is not None:
            frames.append((ROWS, parts.rows.rows_frame(frame, scalar, shape, few), None))
    if windowed and scalar is not None:
        frames.append((PANES, parts.panes.panes_frame(frame, scalar, shape), None))
    if not counted:
        frames.append((FIGURES, frame.select(SEQ_COLUMN), None))
    parts.figures.evaluated(len(plans))

    def finish(results: dict[str, pa.Table]) -> Route | None:
        rows_arrow = results.get(ROWS)
        figures: dict[str, Any] = {}
        if rows_arrow is not None and grouped is not None:
            rows_arrow, figures = split_figures(rows_arrow)
        counts = results.get(FIGURES)
        if counts is not None and counts.num_rows:
            tops = [t for t in counts.column("seq").to_pylist() if t is not None]
            figures = {"rows": sum(counts.column("rows").to_pylist()),
                       "seq": max(tops) if tops else None}
        parts.figures.observed(figures)
        panes_arrow = results.get(PANES)
        for arrow in (rows_arrow, panes_arrow):
            if arrow is not None:
                parts.figures.collected(arrow)
        router = parts.router

        def route() -> list[str]:
            closed: list[str] = []
            if rows_arrow is not None and rows_arrow.num_rows:
                closed += router.route_rows(rows_arrow, plain, shape, grouped)
            if windowed:
                closed += router.route_panes(panes_arrow, windowed, shape)
            return closed
        return route
    return Branch(frames, scalar is not None, finish)


__all__ = ["Branch", "FIGURES", "PANES", "ROWS", "StreamParts", "plan_branch"]
