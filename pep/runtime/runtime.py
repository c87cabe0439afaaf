"""The facade the gateway calls: attach and detach handles to shared per-stream queries."""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from pyspark.sql import SparkSession

from pep.core.plan import ExecutionPlan, StreamDefinition
from pep.runtime.compile import PlanError, compile_plan
from pep.runtime.executor import StreamExecutor

log = logging.getLogger(__name__)


class StreamRuntime:
    """One shared Structured Streaming query per source stream, started by its first handle.

    `deliver(rows)` is called from the query's micro-batch thread, never after `detach()` of its
    handle returned; returning False (or raising) detaches the handle. Rows handed to handles
    with identical plans are the same list: treat them as read-only.
    """

    def __init__(self, spark: SparkSession, work_dir: Path, trigger_interval: float = 0.25,
                 max_files_per_trigger: int = 50, time_window_lateness: float = 0.0) -> None:
        self.spark = spark
        self.work_dir = Path(work_dir)
        self.trigger_interval = trigger_interval
        self.max_files_per_trigger = max_files_per_trigger
        self.time_window_lateness = time_window_lateness
        self._lock = threading.RLock()
        self._executors: dict[str, StreamExecutor] = {}
        self._handle_streams: dict[str, str] = {}
        self._stoppers: list[threading.Thread] = []
        self._closed = False

    def attach(self, handle_id: str, stream: StreamDefinition, plan: ExecutionPlan,
               deliver: Callable[[list[dict]], bool]) -> None:
        """Serve `plan` to `deliver`; raises PlanError / SourceError / ValueError on bad input."""
        if plan.stream != stream.name:
            raise PlanError(f"plan is for stream {plan.stream!r}, not {stream.name!r}")
        compiled = compile_plan(plan, stream.schema, stream.time_attribute)
        with self._lock:
            if self._closed:
                raise RuntimeError("the stream runtime has been stopped")
            if handle_id in self._handle_streams:
                raise ValueError(f"handle {handle_id!r} is already attached")
            executor = self._executors.get(stream.name)
            if executor is not None and executor.definition != stream:
                raise ValueError(f"stream {stream.name!r} is running with a different definition;"
                                 " detach its handles before redefining it")
            carried: list = []
            if executor is not None and not executor.active:
                # its query failed: a new attach starts a fresh query and moves the old handles
                # onto it (their windows restart), rather than attaching to a dead one
                carried = executor.attached()
                self._retire(executor)
                executor = None
            if executor is None:
                executor = StreamExecutor(self.spark, stream, self.work_dir,
                                          self.trigger_interval, self.max_files_per_trigger,
                                          self.time_window_lateness, self._closed_by_deliver)
                for old_id, old_plan, old_deliver in carried:
                    executor.add_handle(old_id, old_plan, old_deliver)
                executor.add_handle(handle_id, compiled, deliver)
                executor.start()
                self._executors[stream.name] = executor
            else:
                executor.add_handle(handle_id, compiled, deliver)
            self._handle_streams[handle_id] = stream.name

    def detach(self, handle_id: str) -> None:
        """Stop serving the handle (idempotent); the stream's query stops with its last handle."""
        with self._lock:
            stream = self._handle_streams.pop(handle_id, None)
            executor = self._executors.get(stream) if stream is not None else None
        if executor is None:
            return
        executor.remove_handle(handle_id)  # outside our lock: it may wait for a delivery
        with self._lock:
            last = (not executor.handle_ids() and self._executors.get(stream) is executor)
            if last:
                del self._executors[stream]
        if last:
            self._retire(executor)

    def _retire(self, executor: StreamExecutor) -> None:
        if executor.in_batch_thread():
            # a query cannot wait for its own micro-batch to finish: stop it from another thread
            t = threading.Thread(target=executor.stop, name="xsg-query-stop", daemon=True)
            with self._lock:
                self._stoppers = [s for s in self._stoppers if s.is_alive()] + [t]
            t.start()
        else:
            executor.stop()

    def _closed_by_deliver(self, handle_id: str) -> None:
        self.detach(handle_id)

    def handles(self) -> dict[str, str]:
        with self._lock:
            return dict(self._handle_streams)

    def stats(self) -> dict:
        with self._lock:
            executors = dict(self._executors)
        return {name: ex.stats() for name, ex in executors.items()}

    def query_id(self, stream_name: str) -> str | None:
        with self._lock:
            ex = self._executors.get(stream_name)
        return ex.query_id if ex is not None else None

    def stop(self) -> None:
        """Stop every query and wait for it; the runtime accepts no attach afterwards."""
        with self._lock:
            self._closed = True
            executors = list(self._executors.values())
            self._executors.clear()
            self._handle_streams.clear()
            stoppers = list(self._stoppers)
        for ex in executors:
            ex.stop()
        for t in stoppers:
            t.join(timeout=30)
