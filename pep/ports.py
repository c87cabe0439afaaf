"""What the rest of the stream side needs of a runtime, said as Protocols (no Spark here).

The services (`pep/services.py`), the handles (`pep/handles/service.py`), the stream lifecycle,
the stream events, /health and /metrics call a runtime through these ports only; Spark's
implementations live under `pep/runtime` (`StreamRuntime`, `LazyRuntime`, `JoinRuntime`), and
the tests' stand-ins (`tests/pep/conftest.py: RecordingRuntime`) implement the same methods, so
a type checker holds every side to one shape.

Two kinds of runtime, because two kinds of plan: a stream runtime serves an `ExecutionPlan` (or
a `UnionPlan`) over one stream, a join runtime a `JoinPlan` over two. Both hand their results to
`deliver` as one `RowBatch` per plan and micro-batch (never a list of dicts); `deliver` returning
False (or raising) detaches the handle, and no batch is delivered after `detach` returned.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pep.core.plan import ExecutionPlan, JoinPlan, StreamDefinition, UnionPlan
from pep.core.rows import RowBatch

# the runtime's callback for one handle (or stream event): one plan's rows of one micro-batch
Deliver = Callable[[RowBatch], bool]



@dataclass(frozen=True)
class TopicTarget:
    """What a handle delivered through a plan topic is attached with instead of its buffer
    (`pep.delivery`): the runtime writes the plan's rows to `topic` (`pep/runtime/delivery`),
    and calling it with a batch only says whether the handle is still open (False: the runtime
    detaches it, as for a buffer that refused)."""

    topic: str
    is_open: Callable[[], bool]

    def __call__(self, batch: RowBatch) -> bool:
        return self.is_open()


# per stream (or join) name: the runtime's figures or state, JSON-ready
StreamReport = dict[str, dict[str, Any]]


class StreamRuntimePort(Protocol):
    """Runs the queries of single streams: one shared query per stream, handles attached to it.

    `attach_handle` raises (PlanError, SourceError, ValueError, ...) when the plan cannot be served;
    `redefine` and `drop_stream` return whether a running query was touched (False before Spark
    started); `health` and `stats` report per running stream (empty before Spark started)."""

    def attach_handle(self, handle_id: str, stream: StreamDefinition,
                      plan: ExecutionPlan | UnionPlan, deliver: Deliver) -> None: ...

    def detach(self, handle_id: str) -> None: ...

    def redefine(self, stream: StreamDefinition) -> bool: ...

    def drop_stream(self, name: str) -> bool: ...

    def health(self) -> StreamReport: ...

    def stats(self) -> StreamReport: ...

    def stop(self) -> None: ...


class JoinRuntimePort(Protocol):
    """Runs joins of two streams: one query per distinct `JoinPlan`, handles attached to it."""

    def attach_join(self, handle_id: str, streams: tuple[StreamDefinition, StreamDefinition],
                    plan: JoinPlan, deliver: Deliver) -> None: ...

    def detach(self, handle_id: str) -> None: ...

    def stats(self) -> StreamReport: ...

    def stop(self) -> None: ...


__all__ = ["Deliver", "StreamReport", "StreamRuntimePort", "JoinRuntimePort", "TopicTarget"]
