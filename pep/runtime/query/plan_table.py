"""The batch's shape (what the attached plans read, never how many there are) and the plan table:
every attached plan as a struct of one row (`plans/plan_schema.py`), rebuilt from Arrow when the set
of plans changes, a tuple window's open pane moves or a DISTANCE_TO anchor moves (the anchors'
positions are kept here: `anchors`).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession

from pep.runtime.plans.batch_shape import Shape
from pep.runtime.plans.clamp import bound_arrays, is_private
from pep.runtime.plans.compile import FAMILIES, MASKED_KIND, CompiledPlan, row_attributes
from pep.runtime.plans.plan_expressions import value_arrays
from pep.runtime.plans.plan_schema import (
    FAMILY_FIELDS,
    PLAIN,
    PLAN_TABLE_ARROW,
    TIME_KINDS,
    PlanField,
)
from pep.runtime.plans.spatial import AnchorTracker, predicate_struct
from pep.runtime.privacy.masks import mask_struct
from pep.runtime.query.registry import PlanState
from pep.runtime.query.settings import StreamLayout


class PlanTable:
    """The attached plans as data (one row of plan structs) and the batch's `Shape`, each
    cached for the registry's version it was built for."""

    def __init__(self, spark: SparkSession, layout: StreamLayout,
                 mask_key: Callable[[str], bytes] | None) -> None:
        self._spark = spark
        self._layout = layout
        self._mask_key_of = mask_key
        self.anchors = AnchorTracker(spark, value_arrays, layout.schema)  # DISTANCE_TO
        self._table: tuple[Any, DataFrame | None, Column | None] | None = None
        self._table_lock = threading.Lock()
        self._shape: tuple[int, Shape] | None = None

    def redefine(self, layout: StreamLayout, restarted: bool) -> None:
        """The stream's definition changed; `restarted`: its schema grew (the query restarts),
        so the shape and the table are built again and the anchors carried over to it."""
        self._layout = layout
        if restarted:
            self.anchors = self.anchors.with_schema(layout.schema)
            with self._table_lock:
                self._table = None
            self._shape = None

    def prepare(self, plans: list[PlanState], version: int) -> None:
        """Build the shape and the table ahead of the first micro-batch."""
        if plans:
            shape = self.shape_of(plans, version)
            self.plan_table(plans, version, shape)

    def shape_of(self, plans: list[PlanState], version: int) -> Shape:
        cached = self._shape
        if cached is not None and cached[0] == version:
            return cached[1]
        names, types = self._layout.field_names, self._layout.types
        plain: set[str] = set()
        keys: set[str] = set()
        read: set[str] = set()
        slots: dict[str, set[str]] = {}
        tuples = timed = ordered = False
        single = True
        masked = any(s.compiled.masks for s in plans)
        hashed: set[str] = set()
        for s in plans:
            if s.rows:
                hashed.update(names[i - 1] for i, m in s.compiled.masks
                              if m.kind == "hash" and types[names[i - 1]] == "long")
            for conj in s.compiled.conjuncts:
                read.update(names[i - 1] for row in conj for i in row_attributes(row))
            w = s.compiled.window
            if w is None:
                plain.update(s.compiled.projection)
                continue
            if s.rows:
                plain.update(a for a, _ in w.attributes)
                plain.update(w.keys)
                continue
            windows = s.windows
            assert windows is not None  # a windowed plan has its panes (`PlanSets._new_windows`)
            layout = windows.layout
            keys.update(w.keys)
            read.update(a for a, _ in w.attributes)
            if s.compiled.masks:
                read.update(w.keys)  # masked keys are computed per plan from the values
            seen = {"d": 0, "l": 0, "s": 0}
            for fam, parts in zip(layout.families, layout.parts, strict=True):
                slots.setdefault(f"{fam}{seen[fam]}", set()).update(parts)
                seen[fam] += 1
            if w.kind == "tuple":
                tuples = True
                single &= layout.width == 1
            else:
                timed = True
                read.add(w.time_attribute or "")
                ordered |= any(f in ("firstval", "lastval") for _, f, _ in w.aggregates)
        if masked:
            read.update(keys)  # every plan's keys are computed from the values then
            if self._layout.full_order and self._layout.time_attr:
                # the time that orders tuples is read under each plan's mask of it
                read.add(self._layout.time_attr)
        order = list(names)
        slot_list = tuple((name, name[0], frozenset(parts)) for fam in "dls"
                          for name, parts in sorted(slots.items(), key=lambda kv: int(kv[0][1:]))
                          if name[0] == fam)
        shape = Shape(tuple(n for n in order if n in plain), tuples, timed, slot_list,
                      tuple(n for n in order if n in keys), ordered, self._layout.full_order,
                      single, frozenset(read),
                      any(len(row) > 5 for s in plans for conj in s.compiled.conjuncts
                          for row in conj),
                      clamped=any(is_private(s.compiled.window) for s in plans if not s.rows),
                      masked=masked,
                      masked_filters=any(row[2] & MASKED_KIND for s in plans
                                         for conj in s.compiled.conjuncts
                                         for row in conj if len(row) == 5),
                      kafka_cut=any(s.compiled.start_offsets is not None for s in plans),
                      hashed=tuple(n for n in order if n in hashed and n in plain))
        self._shape = (version, shape)
        return shape

    def _offsets(self, plans: list[PlanState]) -> tuple[tuple[int, int], ...]:
        return tuple((s.id, s.windows.pane_offset()) for s in plans
                     if s.windows is not None and s.windows.layout.width > 1
                     and not s.windows.layout.timed)

    def plan_table(self, plans: list[PlanState], version: int, shape: Shape
                   ) -> tuple[DataFrame | None, Column | None]:
        """The plans as one row of data (and its scalar-subquery column), rebuilt only when the
        set of plans changed or a tuple window's open pane moved (pane width > 1).

        Built in the gateway's session (the batch of the query's cloned session reads a
        LocalRelation from it just as well)."""
        key = (version, self._offsets(plans), self.anchors.version)
        with self._table_lock:  # start() and the first micro-batch may ask at once
            cached = self._table
            if cached is not None and cached[0] == key:
                return cached[1], cached[2]
            frame = self._build_table(plans, shape)
            scalar = frame.scalar() if frame is not None else None
            self._table = (key, frame, scalar)
            return frame, scalar

    def _build_table(self, plans: list[PlanState], shape: Shape) -> DataFrame | None:
        index, types = self._layout.index, self._layout.types
        data = []
        for s in plans:
            c = s.compiled
            if c.passes_nothing:
                continue
            row: dict[str, Any] = {
                PlanField.ID: s.id, PlanField.KIND: PLAIN, PlanField.START_AFTER: c.start_after,
                PlanField.START_OFFSETS: (None if c.start_offsets is None
                                          else list(c.start_offsets)),
                PlanField.CONJUNCTS: [[predicate_struct(r, self.anchors.segments) for r in conj]
                                      for conj in c.conjuncts],
                PlanField.PANE_WIDTH: None, PlanField.PANE_OFFSET: None,
                PlanField.TIME_INDEX: None, PlanField.TIME_KIND: None, PlanField.KEYS: [],
                PlanField.DOUBLES: [], PlanField.LONGS: [], PlanField.STRINGS: [],
                PlanField.LOW: None, PlanField.HIGH: None, PlanField.MASKS: self._mask_structs(c)}
            w = c.window
            windows = s.windows
            if w is not None and windows is not None:
                lo, hi = bound_arrays(w, index)
                row.update({PlanField.KIND: s.kind, PlanField.PANE_WIDTH: windows.layout.width,
                            PlanField.LOW: lo, PlanField.HIGH: hi,
                            PlanField.PANE_OFFSET: windows.pane_offset(),
                            PlanField.KEYS: [index[k] for k in w.keys]})
                if w.kind == "time" and w.time_attribute is not None:
                    row.update({PlanField.TIME_INDEX: index[w.time_attribute],
                                PlanField.TIME_KIND: TIME_KINDS[types[w.time_attribute]]})
                by_family: dict[str, list[int | None]] = {"d": [], "l": [], "s": []}
                for attr, ftype in w.attributes:
                    by_family[FAMILIES[ftype]].append(index[attr])
                for fam in "dls":
                    count = sum(1 for _, f, _ in shape.slots if f == fam)
                    padding = [None] * (count - len(by_family[fam]))
                    row[FAMILY_FIELDS[fam]] = by_family[fam] + padding
            data.append(row)
        if not data:
            return None
        # from Arrow: a LocalRelation, so reading it as a subquery needs no Spark job
        return self._spark.createDataFrame(pa.Table.from_pylist([{"plans": data}],
                                                                schema=PLAN_TABLE_ARROW))

    def _mask_key(self, owner: str) -> bytes:
        if self._mask_key_of is None:
            raise RuntimeError("this runtime has no hash keys: a hash mask cannot be served")
        return self._mask_key_of(owner)

    def _mask_structs(self, compiled: CompiledPlan) -> list[dict[str, Any] | None] | None:
        """The plan's masks as one struct per attribute (None where it shows the raw value),
        the owner's hash key inside hash masks only; None when the plan masks nothing."""
        if not compiled.masks:
            return None
        names, types = self._layout.field_names, self._layout.types
        out: list[dict[str, Any] | None] = [None] * len(names)
        for index, mask in compiled.masks:
            ftype = types[names[index - 1]]
            key = self._mask_key(self._layout.definition.owner) if mask.kind == "hash" else None
            out[index - 1] = mask_struct(mask, ftype, key)
        return out


__all__ = ["PlanTable"]
