"""One stream query's writer of plan topics: which of a batch's plans the workers write
(`topic_rows.py`) and which the driver produces (`driver_rows.py`), the keys' prefix of a batch,
and the two writes. The shared query's runner and router call it through these few methods
(`pep/runtime/query/runner.py`, `router.py`); it reads the query's plan states by their fields
(`handles`, `windows`, `unions`, `id`, `compiled`), not by their class.

A handle delivered through a plan topic is attached with a deliver callable that has a `topic`
(`pep.ports.TopicTarget`): calling it says whether the handle is still open, and its rows never
reach the gateway's memory.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pyspark.sql import DataFrame

from pep.core.rows import RowBatch
from pep.runtime.delivery.driver_rows import DriverRows
from pep.runtime.delivery.topic_rows import PlanRoute, TopicRows, micro_batch_key


def topic_of(deliver: Any) -> str | None:
    """The plan topic a handle's deliver callable writes to, None for an in-process handle."""
    topic = getattr(deliver, "topic", None)
    return topic if isinstance(topic, str) and topic else None


class TopicWriter:
    """Plan topics for one stream's query (the module docstring). `epoch()`: the query's
    checkpoint's identity (its batches are numbered anew only with a new one); `stopping()`:
    the query is being stopped (a write waiting for the brokers gives up)."""

    def __init__(self, rows: TopicRows, driver: DriverRows, epoch: Callable[[], str],
                 stopping: Callable[[], bool]) -> None:
        self.rows = rows
        self.driver = driver
        self._epoch = epoch
        self._stopping = stopping

    def prefix(self, batch: int) -> str:
        return micro_batch_key(self._epoch(), batch)

    @staticmethod
    def split(plain: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """Of the rows job's plans: (those whose topic handles the workers write: no window,
        some handle with a topic; those the driver still needs: windows, members of unions,
        handles in the process). A plan may be in both."""
        worker, driver = [], []
        for state in plain:
            topics = [topic_of(h.deliver) for h in state.handles.values()]
            if state.windows is None and any(topics):
                worker.append(state)
            if state.windows is not None or state.unions or not all(topics):
                driver.append(state)
        return worker, driver

    @staticmethod
    def routes(states: Iterable[Any], sources: Callable[[Any], tuple[str, ...]]
               ) -> list[PlanRoute]:
        """Each plan's topics, projection and the frame's columns its rows read
        (`sources(state)`)."""
        out = []
        for state in states:
            topics = tuple(sorted({t for h in state.handles.values()
                                   if (t := topic_of(h.deliver)) is not None}))
            if topics:
                projection = tuple(state.compiled.projection)
                out.append(PlanRoute(state.id, topics, projection, sources(state)))
        return out

    def write_pids(self, frame: DataFrame, routes: Sequence[PlanRoute], order: Sequence[str],
                   batch: int) -> None:
        """The rows of a rows frame with plan-id lists, written from the workers."""
        if routes:
            self.rows.write(self.rows.from_pids(frame, routes, order, self.prefix(batch)),
                            self._stopping)

    def write_bits(self, admitted: DataFrame, matcher: Any, keep: Sequence[str],
                   routes: Sequence[PlanRoute], order: Sequence[str], batch: int) -> None:
        """The rows of the grouped matcher's admitted frame, written from the workers."""
        if routes:
            self.rows.write(self.rows.from_bits(admitted, matcher, keep, routes, order,
                                                self.prefix(batch)), self._stopping)

    def produce(self, handles: Sequence[Any], out: RowBatch, batch: int | None) -> None:
        """A batch the driver finished, produced once to each topic of `handles`."""
        topics = {t for h in handles if h.active and (t := topic_of(h.deliver)) is not None}
        if topics:
            self.driver.produce(topics, out, self.prefix(batch if batch is not None else 0))

    def flush(self) -> None:
        """Every record the driver produced is on the brokers (waits while they are away)."""
        self.driver.flush(self._stopping)


__all__ = ["TopicWriter", "topic_of"]
