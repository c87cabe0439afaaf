"""The shape of a micro-batch's jobs: what the attached plans read (projected, filtered, aggregated
and grouped attributes, which partials, masks, spatial tests), never how many plans there are or
their constants, so that the physical plans depend on it alone (`query/plan_table.py` computes
it)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    # what the rows job returns: the plain plans' projections and the aggregated and group-by
    # attributes of tuple windows whose tuples come back as rows, schema order
    plain_columns: tuple[str, ...]
    tuple_windows: bool
    time_windows: bool
    # value slots of the panes job: (column prefix, family, partials wanted), per family in
    # order; a plan's i-th aggregated attribute of family f is slot f<i>
    slots: tuple[tuple[str, str, frozenset[str]], ...]
    keys: tuple[str, ...]  # attributes some window plan groups by, schema order
    ordered_time_firsts: bool  # a time plan asks firstval/lastval: order ties by stream order
    full_order: bool  # the source may lack `_xsg_seq`: order by time, file, position too
    single_tuples: bool  # every tuple-window pane is one tuple: no aggregation in Spark
    read: frozenset[str]  # attributes filters, windows or time read (the value arrays)
    spatial: bool = False  # some plan's filter has a spatial predicate
    clamped: bool = False  # some window plan is differentially private: clamp its values
    masked: bool = False  # some plan masks (pep/runtime/privacy/masks.py): per-plan values
    masked_filters: bool = False  # some plan's filter compares masked values
    hashed: tuple[str, ...] = ()  # long attributes some row plan shows hashed (their text)
    kafka_cut: bool = False  # some plan starts at Kafka offsets (reads `_xsg_file`'s position)

    @property
    def windows(self) -> bool:
        return self.tuple_windows or self.time_windows

    @property
    def raw(self) -> bool:
        """Only one-tuple panes: the panes job returns each tuple's values, not partials."""
        return self.single_tuples and self.tuple_windows and not self.time_windows


def slot_names(shape: Shape) -> list[tuple[str, str]]:
    """(slot column prefix, family) of every value slot of the panes job."""
    return [(name, fam) for name, fam, _ in shape.slots]


__all__ = ["Shape", "slot_names"]
