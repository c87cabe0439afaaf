"""The facade the gateway calls: attach and detach handles to shared per-stream queries."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from common.errors import described
from pep.core.plan import ExecutionPlan, StreamDefinition, UnionPlan
from pep.core.rows import RowBatch
from pep.runtime.base.delivery import Deliver
from pep.runtime.delivery.writer import topic_of
from pep.runtime.lateness import LateBatch, LateBatches
from pep.runtime.plans.compile import (
    CompiledPlan,
    CompiledUnion,
    PlanError,
    compile_plan,
    compile_union,
)
from pep.runtime.privacy.mask_keys import MaskKeys
from pep.runtime.query.executor import StreamExecutor
from pep.runtime.query.settings import DEFAULT_TUPLE_PANE_MIN
from pep.runtime.shared.member import SharedStreamExecutor, can_share
from pep.runtime.shared.query import SharedQuery
from pep.runtime.shared.trigger import DEFAULT_HIGH, DEFAULT_LOW, TriggerBounds
from pep.runtime.sources.checkpoints import (
    DEFAULT_RETENTION_BYTES,
    DEFAULT_RETENTION_SECONDS,
    Janitor,
    Retention,
    StreamCheckpoint,
)

log = logging.getLogger(__name__)

Executor = StreamExecutor | SharedStreamExecutor  # a stream's own query, or the shared one

DEFAULT_STALL_SECONDS = 30.0
# the shared query's batches are late past its trigger's longest interval (`shared_trigger_max`)
SHARED_LIMIT = "the shared query's longest trigger interval"


@dataclass(frozen=True)
class RuntimeSettings:
    """What the runtime's construction takes from the gateway's configuration."""

    trigger_interval: float = 0.25
    max_files_per_trigger: int = 50
    time_window_lateness: float = 0.0
    retention_seconds: float | None = DEFAULT_RETENTION_SECONDS  # archived ingest files
    retention_bytes: int | None = DEFAULT_RETENTION_BYTES
    stall_seconds: float = DEFAULT_STALL_SECONDS  # input waiting this long without a batch
    janitor_interval: float = 5.0  # seconds between retention sweeps and stall checks
    # tuple windows with panes (gcd of size and step) narrower than this travel as rows and
    # are combined on the driver; wider ones are aggregated per pane in Spark
    tuple_pane_min: int = DEFAULT_TUPLE_PANE_MIN
    # delivery through plan topics (a `pep.delivery.settings.DeliverySettings`): handles
    # attached with a topic target have their rows written to it (`pep/runtime/delivery`)
    delivery: Any = None
    # One shared query for the process's ingest streams (pep/runtime/shared/), its trigger
    # between these bounds (seconds); a micro-batch lists `max_files_per_trigger` files per
    # stream on it
    shared_query: bool = False
    shared_trigger_min: float = DEFAULT_LOW
    shared_trigger_max: float = DEFAULT_HIGH


class StreamRuntime:
    """One shared Structured Streaming query per source stream, started by its first handle.

    `deliver(batch)` is called from the query's micro-batch thread with a `RowBatch`, never
    after `detach()` of its handle returned; returning False (or raising) detaches the handle.
    Handles with identical plans receive the same RowBatch object.

    Each stream's query keeps its checkpoint under `work_dir/checkpoints/<stream>/`: a query
    stopped with handles attached (`stop()`) continues where it stopped at the next start; a
    stream's first handle (the query stopped with its last handle, or never ran) starts at the
    stream's current end. Ingested files the query has committed move to
    `work_dir/archive/<stream>/` and are removed by the retention settings.
    """

    def __init__(self, spark: SparkSession, work_dir: Path, trigger_interval: float = 0.25,
                 max_files_per_trigger: int = 50, time_window_lateness: float = 0.0,
                 settings: RuntimeSettings | None = None,
                 retention_for: Callable[[str], float | None] | None = None,
                 mask_keys: MaskKeys | None = None) -> None:
        """`retention_for(stream)`: the stream's own archive retention in seconds (None: the
        settings' `retention_seconds`), asked at every sweep. `mask_keys`: the owners' keys of
        hash masks (made under the work directory when not given)."""
        if settings is None:
            settings = RuntimeSettings(trigger_interval, max_files_per_trigger,
                                       time_window_lateness)
        self.settings = settings
        self.spark = spark
        self.work_dir = Path(work_dir)
        # the owners' hash-mask keys (pep/runtime/privacy/mask_keys.py), shared with the join
        # runtime
        self.mask_keys = mask_keys if mask_keys is not None else \
            MaskKeys(self.work_dir / "mask-keys")
        self.trigger_interval = settings.trigger_interval
        self.max_files_per_trigger = settings.max_files_per_trigger
        self.time_window_lateness = settings.time_window_lateness
        self.retention = Retention(settings.retention_seconds, settings.retention_bytes)
        self.retention_for = retention_for
        self._lock = threading.RLock()
        self._executors: dict[str, Executor] = {}
        self._shared: SharedQuery | None = None  # made with the first stream it serves
        self._handle_streams: dict[str, str] = {}
        self._stoppers: list[threading.Thread] = []
        self._closed = False
        self._stall_warned: set[str] = set()
        self._late = LateBatches(settings.trigger_interval)  # "falling behind", for the log
        self._shared_late: LateBatches | None = None  # the shared query's, made with it
        # while the gateway restores its handles (`restoring`): queries not started yet
        self._restoring = False
        self._held: list[Executor] = []
        self._last_sweep = 0.0
        self._janitor = Janitor(self._tick, settings.janitor_interval)
        self._janitor.start()
        # new plan topics made known to Spark's producer before their first rows (the same
        # options as the rows' writes: the same producer, pep/runtime/delivery/warm.py)
        self._warmer: Any = None
        if settings.delivery is not None:
            from pep.runtime.delivery.warm import TopicWarmer

            self._warmer = TopicWarmer(spark, settings.delivery.spark_options())
        # plan topics: Spark's Kafka sink options and the driver's producer, shared by the
        # streams' queries (pep/runtime/delivery)
        self._topics: tuple[dict[str, str], Any] | None = None
        if settings.delivery is not None:
            from pep.runtime.delivery.driver_rows import DriverRows

            self._topics = (settings.delivery.spark_options(),
                            DriverRows(settings.delivery.client(), settings.delivery.client(**{
                                "group.id": settings.delivery.group_prefix + "gateway"})))

    def attach_handle(self, handle_id: str, stream: StreamDefinition,
                      plan: ExecutionPlan | UnionPlan, deliver: Callable[[RowBatch], bool]
                      ) -> None:
        """Serve `plan` to `deliver`; raises PlanError / SourceError / ValueError on bad input."""
        if plan.stream != stream.name:
            raise PlanError(f"plan is for stream {plan.stream!r}, not {stream.name!r}")
        compiled: CompiledPlan | CompiledUnion
        if isinstance(plan, UnionPlan):
            compiled = compile_union(plan, stream.schema, stream.time_attribute)
            members = compiled.members
        else:
            compiled = compile_plan(plan, stream.schema, stream.time_attribute)
            members = (compiled,)
        for member in members:
            if member.start_offsets is not None and stream.source.kind != "kafka":
                raise PlanError(f"stream {stream.name!r}: start_offsets cut Kafka streams only")
            if member.window is not None and member.window.noise:
                # a private window: calibrate its mechanisms now (OpenDP; a Gaussian takes
                # about half a second), not in its first micro-batch, and fail here if they
                # cannot be
                from pep.runtime.windows.noise import mechanism_of
                for quantity in member.window.noise:
                    mechanism_of(quantity)
        if self._warmer is not None and (topic := topic_of(deliver)) is not None:
            self._warmer.add(topic)
        if any(m.kind == "hash" for member in members for _, m in member.masks):
            self.mask_keys.key_for(stream.owner)  # made (or found unusable) now, not mid-batch
        with self._lock:
            if self._closed:
                raise RuntimeError("the stream runtime has been stopped")
            if handle_id in self._handle_streams:
                raise ValueError(f"handle {handle_id!r} is already attached")
            executor = self._executors.get(stream.name)
            if executor is not None and executor.definition != stream:
                # the owner changed the stream (lateness, added attributes) and this attach
                # comes before `redefine` was told: the same change, now
                self._redefine(executor, stream)
            carried: list[tuple[str, CompiledPlan | CompiledUnion, Deliver]] = []
            if executor is not None and not executor.active and executor not in self._held:
                # its query failed: a new attach starts a fresh query (on the same checkpoint,
                # so the failed batch is tried again) and moves the old handles onto it (their
                # windows restart), rather than attaching to a dead one
                carried = executor.handles.attached()
                self._retire(executor, idle=False)
                executor = None
            if executor is None:
                executor = self._new_executor(stream)
                for old_id, old_plan, old_deliver in carried:
                    executor.handles.add_handle(old_id, old_plan, old_deliver)
                executor.handles.add_handle(handle_id, compiled, deliver)
                if self._restoring:
                    # started once every restored handle of the stream is attached, after the
                    # replay it owes them (`end_restore`)
                    self._held.append(executor)
                else:
                    executor.start()
                self._executors[stream.name] = executor
            else:
                executor.handles.add_handle(handle_id, compiled, deliver)
            self._handle_streams[handle_id] = stream.name
        if isinstance(executor, SharedStreamExecutor):
            executor.wait_started()

    def _new_executor(self, stream: StreamDefinition) -> Executor:
        """The stream's own query, or with `shared_query` set its place on the shared one
        (`pep/runtime/shared/`: ingest streams)."""
        settings = self.settings
        # delivery through plan topics writes from a stream's own query (`pep/runtime/delivery`)
        if settings.shared_query and can_share(stream) and self._topics is None:
            if self._shared is None:
                self._shared = SharedQuery(self.spark, self.work_dir, TriggerBounds(
                    settings.shared_trigger_min, settings.shared_trigger_max),
                    settings.max_files_per_trigger)
                self._shared_late = LateBatches(settings.shared_trigger_max, SHARED_LIMIT,
                                                held=self._shared.held)
            return SharedStreamExecutor(self.spark, self._shared, stream, self.work_dir,
                                        settings.max_files_per_trigger,
                                        self._lateness(stream), self._closed_by_deliver,
                                        settings.tuple_pane_min, self.mask_keys.key_for)
        return StreamExecutor(self.spark, stream, self.work_dir, self.trigger_interval,
                              self.max_files_per_trigger, self._lateness(stream),
                              self._closed_by_deliver, settings.tuple_pane_min,
                              self.mask_keys.key_for, topics=self._topics,
                              realtime=float(getattr(settings.delivery, "realtime", 0.0) or 0.0))

    @contextmanager
    def restoring(self) -> Iterator[None]:
        """While the gateway restores its handles after a start: a stream's query starts once
        all of them are attached, and a Kafka stream's restored handles are first given again
        the rows their readers may not have read (`pep.runtime.query.kafka_replay`)."""
        self.begin_restore()
        try:
            yield
        finally:
            self.end_restore()

    def begin_restore(self) -> None:
        with self._lock:
            self._restoring = True

    def end_restore(self) -> None:
        """Start the queries held while restoring. One that fails to start is reported as
        failed (`health`, its readers' `stalled` notices); the next attach to its stream
        starts a fresh one carrying its handles, as for a query that failed later."""
        with self._lock:
            self._restoring = False
            held, self._held = self._held, []
        for executor in held:
            try:
                executor.start(replay=True)
            except Exception as exc:  # noqa: BLE001 - the other streams start all the same
                executor.failed(exc)
                log.error("stream %s: its query did not start after the restore: %s",
                          executor.definition.name, described(exc))

    def _lateness(self, stream: StreamDefinition) -> float:
        return stream.lateness if stream.lateness is not None else self.time_window_lateness

    def redefine(self, stream: StreamDefinition) -> bool:
        """The owner changed the stream: its lateness applies from the next micro-batch; added
        attributes restart its query on the same checkpoint (`StreamExecutor.restart`: handles,
        windows and the read position carry over, nothing ingested is lost). A stream not
        running gets its checkpoint adopted, so its next start continues as it would have.
        Raises ValueError for any other change. True when a running query was changed."""
        with self._lock:
            executor = self._executors.get(stream.name)
            if executor is None or not executor.active:
                previous = executor.definition if executor is not None else None
                if previous is not None:
                    StreamCheckpoint.for_stream(self.work_dir, stream).adopt(previous)
                return False
            if executor.definition == stream:
                return False
            self._redefine(executor, stream)
            return True

    def _redefine(self, executor: Executor, stream: StreamDefinition) -> None:
        old = executor.definition
        if (old.name, old.source, old.time_attribute) != \
                (stream.name, stream.source, stream.time_attribute):
            raise ValueError(f"stream {stream.name!r} is running with a different definition;"
                             " detach its handles before redefining it")
        if stream.schema != old.schema:
            executor.restart(stream)  # raises ValueError unless attributes were only added
        else:
            executor.redefine(stream)
        executor.handles.lateness = self._lateness(stream)
        log.info("stream %s redefined (%d attributes, lateness %.1f s)", stream.name,
                 len(stream.schema.fields), executor.handles.lateness)

    def drop_stream(self, name: str) -> bool:
        """The stream is being deleted: stop its query whatever is still attached (its handles
        were revoked and detached first) and wait for queries being stopped in the background,
        so that nothing of this runtime writes under the stream's checkpoint or archive
        afterwards. True when a query was running."""
        with self._lock:
            executor = self._executors.pop(name, None)
            if executor in self._held:
                self._held.remove(executor)
            for handle_id, stream in list(self._handle_streams.items()):
                if stream == name:
                    del self._handle_streams[handle_id]
            stoppers = list(self._stoppers)
            self._stall_warned.discard(name)
        if executor is not None:
            executor.stop(idle=False)
        for t in stoppers:
            t.join(timeout=30)
        return executor is not None

    def detach(self, handle_id: str) -> None:
        """Stop serving the handle (idempotent); the stream's query stops with its last handle."""
        with self._lock:
            stream = self._handle_streams.pop(handle_id, None)
            executor = self._executors.get(stream) if stream is not None else None
        if executor is None or stream is None:
            return
        executor.handles.remove_handle(handle_id)  # outside our lock: it may wait for a delivery
        with self._lock:
            last = (not executor.handles.has_handles() and self._executors.get(stream) is executor)
            if last:
                del self._executors[stream]
        if last:
            self._retire(executor, idle=True)

    def _retire(self, executor: Executor, idle: bool) -> None:
        with self._lock:
            if executor in self._held:  # never started: it must not start later
                self._held.remove(executor)
        if executor.in_batch_thread():
            # a query cannot wait for its own micro-batch to finish: stop it from another thread
            t = threading.Thread(target=executor.stop, args=(idle,), name="xsg-query-stop",
                                 daemon=True)
            with self._lock:
                self._stoppers = [s for s in self._stoppers if s.is_alive()] + [t]
            t.start()
        else:
            executor.stop(idle)

    def _closed_by_deliver(self, handle_id: str) -> None:
        self.detach(handle_id)

    def process_available(self, stream_name: str, timeout: float = 120.0) -> None:
        """Process every record the stream's source holds now and deliver its rows to the
        handles attached, before returning (`xsg policy test` runs a stream case so: records
        written, then this, then the rows compared). Nothing to do for a stream not running."""
        with self._lock:
            executor = self._executors.get(stream_name)
        if executor is not None:
            executor.process_available(timeout)

    def handles(self) -> dict[str, str]:
        with self._lock:
            return dict(self._handle_streams)

    def stats(self) -> dict[str, Any]:
        """Per running stream: counters, and whether input waits (`input_waiting`), since when,
        the time of the last completed micro-batch (`last_batch_at`) and `stalled` (input has
        waited longer than the stall bound without a completed batch)."""
        with self._lock:
            executors = dict(self._executors)
        return {name: ex.stats(self.settings.stall_seconds) for name, ex in executors.items()}

    def health(self) -> dict[str, Any]:
        """Per running stream: {"state": running|stalled|failed|idle, "last_batch_at",
        "last_error"} (epoch seconds or None)."""
        with self._lock:
            executors = dict(self._executors)
        out = {}
        for name, ex in executors.items():
            h = ex.health(self.settings.stall_seconds)
            out[name] = {"state": h["state"], "last_batch_at": h["last_batch_at"],
                         "last_error": h["last_error"]}
        return out

    def query_id(self, stream_name: str) -> str | None:
        with self._lock:
            ex = self._executors.get(stream_name)
        return ex.query_id if ex is not None else None

    # ----- the janitor: stall and lateness warnings, retention ---------------------------------
    def _tick(self) -> None:
        self.check_stalls()
        self.check_lateness()
        now = time.monotonic()
        if now - self._last_sweep >= 60.0:
            self._last_sweep = now
            self.sweep()

    def check_stalls(self) -> list[str]:
        """Log a warning once per stall; returns the streams stalled now."""
        with self._lock:
            executors = dict(self._executors)
        stalled = []
        for name, ex in executors.items():
            h = ex.health(self.settings.stall_seconds)
            if h["stalled"]:
                stalled.append(name)
                if name not in self._stall_warned:
                    self._stall_warned.add(name)
                    since = h["waiting_since"]
                    log.warning("stream %s is stalled: input has waited %.0f s without a "
                                "completed micro-batch (last batch at %s)", name,
                                time.time() - since if since else float("nan"),
                                time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                              time.gmtime(h["last_batch_at"]))
                                if h["last_batch_at"] else "never")
            else:
                self._stall_warned.discard(name)
        return stalled

    def check_lateness(self) -> int:
        """Log the micro-batches of the session's queries (this runtime's and the joins') that
        took longer than the trigger interval since the last check (`lateness.py`), and those
        of the shared query longer than its trigger's longest interval (each stream they
        carried named); returns how many."""
        with self._lock:
            # a real-time batch lasts its `delivery_realtime` seconds by design: not late
            names = {ex.query_name: name for name, ex in self._executors.items()
                     if ex.query_name is not None and isinstance(ex, StreamExecutor)
                     and ex.lifecycle.mode != "realtime"}
            shared, shared_late = self._shared, self._shared_late

        def describe(batch: LateBatch) -> list[str]:
            if batch.query in names:
                return [f"stream {names[batch.query]}"]
            return [f"join query {batch.query}"] if batch.query.startswith("xsg-join-") else []
        try:
            queries = list(self.spark.streams.active)
        except Exception:  # noqa: BLE001 - the session is stopping
            return 0
        logged = self._late.log(queries, describe)
        if shared is not None and shared_late is not None:
            name = shared.query_name
            logged += shared_late.log(
                [q for q in queries if name is not None and q.name == name],
                lambda batch: [f"stream {s}" for s in shared.streams_of(batch.batch_id)])
        return logged

    def sweep(self) -> tuple[int, int]:
        """Apply the retention settings to the archived ingest files of every stream: each
        stream's own age bound (`retention_for`) or the default, then the byte bound over the
        whole archive."""
        root = self.work_dir / "archive"
        if self.retention_for is None:
            return self.retention.sweep(root)
        removed = freed = 0
        try:
            streams = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
        except OSError:
            streams = []
        for directory in streams:
            try:
                own = self.retention_for(directory.name)
            except Exception:  # noqa: BLE001 - a lookup failing keeps the default
                own = None
            age = own if own is not None else self.retention.max_age
            r, f = Retention(age, None).sweep(directory)
            removed, freed = removed + r, freed + f
        r, f = Retention(None, self.retention.max_bytes).sweep(root)
        return removed + r, freed + f

    def stop(self) -> None:
        """Stop every query and wait for it; the runtime accepts no attach afterwards. Streams
        with handles attached resume where they stopped at the next start."""
        with self._lock:
            self._closed = True
            self._held.clear()
            executors = list(self._executors.values())
            self._executors.clear()
            self._handle_streams.clear()
            stoppers = list(self._stoppers)
        self._janitor.stop()
        if self._shared is not None:
            self._shared.stop()  # first: its streams then leave it without starting it again
        for ex in executors:
            ex.stop(idle=False)
        for t in stoppers:
            t.join(timeout=30)
        if self._warmer is not None:
            self._warmer.close()
        if self._topics is not None:
            self._topics[1].close()  # what the driver produced is on the brokers
