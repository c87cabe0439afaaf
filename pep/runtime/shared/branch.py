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

from pep.runtime.base.arrow_ipc import Packer, unpack_blobs
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
from pep.runtime.shared.stage import AGAIN_TAG, ROWS_TAG, StageStream

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
    finish: Callable[[dict[str, pa.Table]], Route]


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
    figures_of = parts.figures
    router = parts.router

    def finish(results: dict[str, pa.Table]) -> Route:
        # every figure of a shared stream is counted on its route worker, in batch order
        # (`stage_finish` counts there too: a stream may go either way from batch to batch)
        def route() -> list[str]:
            rows_arrow = results.get(ROWS)
            figures: dict[str, Any] = {}
            if rows_arrow is not None and grouped is not None:
                rows_arrow, figures = split_figures(rows_arrow)
            counts = results.get(FIGURES)
            if counts is not None and counts.num_rows:
                tops = [t for t in counts.column("seq").to_pylist() if t is not None]
                figures = {"rows": sum(counts.column("rows").to_pylist()),
                           "seq": max(tops) if tops else None}
            figures_of.evaluated(len(plans))
            figures_of.observed(figures)
            panes_arrow = results.get(PANES)
            for arrow in (rows_arrow, panes_arrow):
                if arrow is not None:
                    figures_of.collected(arrow)
            closed: list[str] = []
            if rows_arrow is not None and rows_arrow.num_rows:
                closed += router.route_rows(rows_arrow, plain, shape, grouped)
            if windowed:
                closed += router.route_panes(panes_arrow, windowed, shape)
            return closed
        return route
    return Branch(frames, scalar is not None, finish)


# families a value of each attribute type has for the stage (`stage._value`); a label's code
# (its long form) is the plan table's, not the stage's
_STAGE_FAMILIES = {"double": "d", "long": "dl", "timestamp": "dl", "boolean": "dl",
                   "string": "s", "label": "s"}


@dataclass(frozen=True)
class StagePlan:
    """A stream's row plans as the shared stage runs them (`stage.py`): built once per plans'
    version, schema and tag, then the same object every batch (the stage's function is built
    again only when one of them changes)."""

    version: int
    layout: StreamLayout
    sets: PlanSets
    shape: Shape
    stream: StageStream


def stage_plan(parts: StreamParts, directory: str, tag: str) -> StagePlan | None:
    """The stream's plans for the shared stage, or None when some plan needs more than the
    grouped matcher over the stream's lines: window plans (their panes job, and the order of
    their routing), masks, spatial or label comparisons (the plan table), DISTANCE_TO anchors,
    or no row plan at all. Those streams keep their own jobs in the shared batch
    (`plan_branch`)."""
    sets = parts.registry.plan_sets()
    known = parts.memo.get("stage")
    if isinstance(known, StagePlan) and known.version == sets.version \
            and known.layout is parts.layout and known.stream.tag == tag \
            and known.stream.directory == directory:
        return known
    plan = _stage_plan(parts, sets, directory, tag)
    parts.memo["stage"] = plan
    return plan


def _stage_plan(parts: StreamParts, sets: PlanSets, directory: str, tag: str
                ) -> StagePlan | None:
    layout = parts.layout
    if not sets.plans or sets.windowed or sets.keeps_windows or sets.anchored \
            or layout.full_order or layout.kafka:
        return None
    shape = parts.table.shape_of(sets.plans, sets.version)
    if not shape.plain_columns or shape.hashed:
        return None
    grouped = grouped_matcher(parts, sets, shape)
    if grouped is None:
        return None
    types = layout.types
    names = layout.field_names
    values = []
    for attribute, family in grouped.columns:
        ftype = types[names[attribute - 1]]
        if family not in _STAGE_FAMILIES.get(ftype, ""):
            return None
        values.append((attribute, family, ftype))
    fields = tuple((f.name, f.type) for f in layout.schema.fields)
    if SEQ_COLUMN not in dict(fields):
        fields += ((SEQ_COLUMN, "long"),)
    keep = tuple(shape.plain_columns) + tuple(order_columns(layout, shape))
    if any(k not in dict(fields) for k in keep):  # an order column the lines do not hold
        return None
    stream = StageStream(tag, directory, fields, keep, tuple(values), grouped)
    return StagePlan(sets.version, layout, sets, shape, stream)


def stage_finish(parts: StreamParts, plan: StagePlan, blobs: list[bytes] | None) -> Route:
    """The route of the stream's stage results of a batch (`blobs`: its packed rows and its
    tasks' figures, not read yet), for its route worker: the results read, its figures
    counted and its rows routed there, as `plan_branch`'s `finish` does for the grouped
    matcher. Nothing of it on the batch's thread: each pyarrow call there lets the GIL go to
    the route workers, and waits up to a switch interval (5 ms) to get it back, per stream."""
    sets, shape, grouped = plan.sets, plan.shape, plan.stream.matcher
    figures, router, plain = parts.figures, parts.router, sets.plain

    def route() -> list[str]:
        counts: dict[str, Any] = {}
        rows_arrow = None
        if blobs:
            rows_arrow, counts = split_figures(unpack_blobs(blobs))
        figures.evaluated(len(sets.plans))
        figures.observed(counts)
        if rows_arrow is None or not rows_arrow.num_rows:
            return []
        figures.collected(rows_arrow)
        return router.route_rows(rows_arrow, plain, shape, grouped)
    return route


def needs_again(plan: StagePlan, blobs: dict[str, list[bytes]]) -> bool:
    """Some task found lines of the stream its parser does not read as Spark does: the
    stream's files of the batch are read by Spark's reader instead (`stage.parse_lines`)."""
    return f"{plan.stream.tag}/{AGAIN_TAG}" in blobs


def stage_rows(plan: StagePlan, blobs: dict[str, list[bytes]]) -> list[bytes] | None:
    """The stream's packed rows of the batch (`stage_finish` reads them)."""
    return blobs.get(f"{plan.stream.tag}/{ROWS_TAG}")


__all__ = ["Branch", "FIGURES", "PANES", "ROWS", "StagePlan", "StreamParts", "needs_again",
           "plan_branch", "stage_finish", "stage_plan", "stage_rows"]
