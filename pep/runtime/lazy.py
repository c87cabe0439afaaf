"""The Spark runtime, started on first use.

The SparkSession takes seconds to start, and a gateway with no live handle need not pay for it
before the first request: `LazyRuntime` creates the session and the `StreamRuntime` the first
time a handle attaches (or at once, when the gateway asks for it at start-up). This module
imports no Spark itself; the factory does, when it is called.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pep.core.plan import ExecutionPlan, JoinPlan, StreamDefinition, UnionPlan
    from pep.ports import Deliver, StreamReport, StreamRuntimePort


class LazyRuntime:
    """Creates the runtime on first use; `stop()` stops what it created."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._runtime: Any = None
        self._lock = threading.Lock()
        self._restoring = False  # `restoring`: a runtime made meanwhile begins restoring
        self._began = False  # the runtime was told to begin restoring

    @property
    def started(self) -> bool:
        return self._runtime is not None

    def get(self) -> Any:
        with self._lock:
            if self._runtime is None:
                self._runtime = self._factory()
                if self._restoring and hasattr(self._runtime, "begin_restore"):
                    self._runtime.begin_restore()
                    self._began = True
            return self._runtime

    @contextmanager
    def restoring(self) -> Iterator[None]:
        """`StreamRuntime.restoring`, for the runtime running now or made meanwhile (none is
        made for it: a gateway with nothing to restore starts no Spark)."""
        with self._lock:
            self._restoring = True
            if self._runtime is not None and hasattr(self._runtime, "begin_restore"):
                self._runtime.begin_restore()
                self._began = True
        try:
            yield
        finally:
            with self._lock:
                self._restoring = False
                began, self._began = self._began, False
                runtime = self._runtime
            if began:
                runtime.end_restore()

    def attach_handle(self, handle_id: str, stream: StreamDefinition,
                      plan: ExecutionPlan | UnionPlan, deliver: Deliver) -> None:
        """A stream's handle (`StreamRuntimePort`), when the factory makes a `StreamRuntime`."""
        self.get().attach_handle(handle_id, stream, plan, deliver)

    def attach_join(self, handle_id: str, streams: tuple[StreamDefinition, StreamDefinition],
                    plan: JoinPlan, deliver: Deliver) -> None:
        """A join's handle (`JoinRuntimePort`), when the factory makes a `JoinRuntime`."""
        self.get().attach_join(handle_id, streams, plan, deliver)

    def detach(self, handle_id: str) -> None:
        if self._runtime is not None:
            self._runtime.detach(handle_id)

    def redefine(self, stream: StreamDefinition) -> bool:
        """A changed stream (`StreamRuntime.redefine`); nothing runs before Spark started."""
        return self._runtime.redefine(stream) if self._runtime is not None else False

    def drop_stream(self, name: str) -> bool:
        """A deleted stream (`StreamRuntime.drop_stream`); nothing runs before Spark started."""
        return self._runtime.drop_stream(name) if self._runtime is not None else False

    def stats(self) -> StreamReport:
        return self._runtime.stats() if self._runtime is not None else {}

    def health(self) -> StreamReport:
        return self._runtime.health() if self._runtime is not None else {}

    def stop(self) -> None:
        with self._lock:
            if self._runtime is not None:
                self._runtime.stop()


def spark_runtime_factory(master: str, work_dir: Path, trigger_interval: float = 0.25,
                          extra_conf: dict[str, str] | None = None, log_level: str = "WARN",
                          progress: Callable[[str], Any] | None = None,
                          retention_seconds: float | None = 3600.0,
                          retention_bytes: int | None = 1 << 30,
                          stall_seconds: float = 30.0,
                          retention_for: Callable[[str], float | None] | None = None,
                          delivery: Any = None,
                          shared: tuple[float, float] | None = None
                          ) -> Callable[[], StreamRuntimePort]:
    """A factory for `LazyRuntime`: a SparkSession on `master` and a StreamRuntime over it,
    keeping its checkpoints and archived ingest files under `work_dir` (see
    `pep.runtime.runtime.RuntimeSettings` for the retention and stall arguments;
    `retention_for(stream)` is a stream's own retention, None for the default; `shared`: the
    shared query's trigger bounds (min, max) when ingest streams share one query).

    `extra_conf` goes to the session as spark-submit's --conf would (over the runtime's
    defaults), `log_level` is Spark's (log4j) level, and `progress(what)`, when given, returns
    a context manager held while the session starts (`xsg serve` prints progress with it)."""

    def build() -> StreamRuntimePort:  # mypy holds StreamRuntime to the port here
        from contextlib import nullcontext
        from dataclasses import replace

        from pep.runtime.runtime import RuntimeSettings, StreamRuntime
        from pep.runtime.session import create_spark_session

        step = progress(f"starting Spark on {master} (JVM, SparkSession, a warm-up query)"
                        ) if progress is not None else nullcontext()
        with step:
            spark = create_spark_session(master=master, extra_conf=extra_conf)
            spark.sparkContext.setLogLevel(log_level)
        settings = RuntimeSettings(
            trigger_interval=trigger_interval, retention_seconds=retention_seconds,
            retention_bytes=retention_bytes, stall_seconds=stall_seconds, delivery=delivery)
        if shared is not None:
            settings = replace(settings, shared_query=True, shared_trigger_min=shared[0],
                               shared_trigger_max=shared[1])
        return StreamRuntime(spark, work_dir, settings=settings, retention_for=retention_for)

    return build


__all__ = ["LazyRuntime", "spark_runtime_factory"]
