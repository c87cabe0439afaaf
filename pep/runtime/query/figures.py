"""The figures of one stream's shared query (`stats()`): batches, rows in and delivered, the plans
evaluated, what the jobs brought to the driver, the highest stream position, the last batch's
time and the last error. One owner; the parts that count are handed it.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from common.errors import described


class QueryFigures:
    """The query's counters. `counters` is what delivery counts delivered rows in
    (`delivery.deliver_to`)."""

    def __init__(self) -> None:
        self.counters: dict[str, Any] = {
            "batches": 0, "rows_in": 0, "rows_delivered": 0, "last_batch_ms": None,
            "plan_evaluations": 0, "late_rows": 0, "last_error": None,
            "driver_rows": 0, "driver_bytes": 0, "max_position": None,
        }
        # a punctuated Kafka stream's tuples are counted by its shield (`tuples_read`):
        # Spark's progress counts its punctuation records too, which are no rows
        self._shield_counts = False

    def counted_by_shield(self) -> None:
        """From now on `rows_in` is what `tuples_read` says; Spark's progress is ignored."""
        self._shield_counts = True

    @property
    def last_error(self) -> str | None:
        error: str | None = self.counters["last_error"]
        return error

    def failed(self, exc: BaseException) -> None:
        """A batch, its routing or the query's start failed (`health()` says so, and the
        stall notices: their kinds only, `common.errors.described`)."""
        self.counters["last_error"] = described(exc)

    def batch_took(self, millis: float) -> None:
        self.counters["last_batch_ms"] = millis

    def evaluated(self, plans: int) -> None:
        """A batch ran its jobs for `plans` plans."""
        self.counters["batches"] += 1
        self.counters["plan_evaluations"] += plans

    def rows_read(self, rows: int) -> None:
        """A batch's input rows as Spark reported them (`query/progress.py`; Kafka streams)."""
        if not self._shield_counts:
            self.counters["rows_in"] += rows

    def tuples_read(self, tuples: int) -> None:
        """A punctuated Kafka stream's batch: its tuples, as its shield counted them."""
        self.counters["rows_in"] += tuples

    def observed(self, figures: dict[str, Any]) -> None:
        """A batch's figures, observed or counted by its tasks: {"rows", "seq"}."""
        self.counters["rows_in"] += int(figures.get("rows") or 0)
        seq = figures.get("seq")
        if seq is not None:
            top = self.counters["max_position"]
            self.counters["max_position"] = seq if top is None else max(top, seq)

    def collected(self, arrow: pa.Table) -> None:
        """A job's result, brought to the driver."""
        self.counters["driver_rows"] += arrow.num_rows
        self.counters["driver_bytes"] += arrow.nbytes

    def snapshot(self) -> dict[str, Any]:
        return dict(self.counters)


__all__ = ["QueryFigures"]
