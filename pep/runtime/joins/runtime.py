"""Joins of two streams on Spark: one Structured Streaming query per distinct `JoinPlan`.

Each join runs as a stream-stream inner join of its own, beside the shared per-stream queries
(which it does not touch): each side is that stream's source (for an `ingest` stream, a feed of
the batches written since the join started, `StreamCatalog.open_feed`: nothing from before is
replayed, and the stream's own query archiving its committed files takes nothing away from the
join; other kinds read their source as the stream's query does) with the side plan applied in the
DataFrame API (its start position, its filter with every constant a literal (`F.lit`), never SQL
text; its projection; its time window as a Spark window aggregation), a watermark on each side's
time column, then the join on the equalities and the time bound. Handles with the same plan key
share one query; the query stops with its last handle.

State is bounded by the watermarks (pep/runtime/README.md, "Joins"): each side's watermark is
the latest time among its authorised rows minus `lateness` seconds; the query's watermark is the
lower of the two; Spark drops a buffered row once no row of the other side that is not yet late
can still be within `within` seconds of it, and a side's open windows once the watermark passes
their end. So the join holds about (`within` + `lateness` + a micro-batch) seconds of each side,
and a windowed side one window's partial aggregates per key.

The frame itself (sides, watermarks, the join, labels) is built by `joins/frames.py`.

Output: one dict per joined pair, both sides' outputs named `<stream>.<output>` (and `label`);
timestamps as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (as the shared runtime delivers them); delivered as
one `RowBatch` per micro-batch, shared by the plan's handles.
"""
from __future__ import annotations

import logging
import math
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from common.errors import described
from pep.core.plan import JoinPlan, StreamDefinition
from pep.core.rows import RowBatch
from pep.runtime.base.delivery import Deliver, deliver_to
from pep.runtime.base.jvm_steps import foreach_batch
from pep.runtime.joins.frames import TIME, JoinOutput, JoinPlanError, joined_frame
from pep.runtime.privacy.mask_keys import MaskKeys
from pep.runtime.sources.checkpoints import await_kafka_offsets

log = logging.getLogger(__name__)


# -- the runtime ----------------------------------------------------------------------------------

@dataclass
class _Handle:
    id: str
    deliver: Deliver
    lock: threading.RLock = field(default_factory=threading.RLock)
    active: bool = True
    delivered_rows: int = 0


class FeedSource(Protocol):
    """Where an `ingest` stream's batches can be copied for a join (`StreamCatalog`)."""

    def open_feed(self, name: str, directory: Path) -> None: ...

    def close_feed(self, name: str, directory: Path) -> None: ...


@dataclass(frozen=True)
class JoinSettings:
    """What every join query of a runtime is made with."""

    spark: SparkSession
    work_dir: Path
    trigger_interval: float
    max_files_per_trigger: int
    lateness: float  # seconds a side's rows may come behind its latest time
    feeds: FeedSource | None  # the catalogue's feeds of `ingest` streams (None: none)
    mask_key: Callable[[str], bytes]  # an owner's key of hash masks


class _JoinQuery:
    """One running join and the handles it serves. `on_handle_closed(handle_id)`: a handle
    whose delivery refused or failed (the runtime detaches it)."""

    def __init__(self, settings: JoinSettings, plan: JoinPlan,
                 streams: tuple[StreamDefinition, StreamDefinition],
                 on_handle_closed: Callable[[str], None]) -> None:
        self.settings = settings
        self._on_handle_closed = on_handle_closed
        self.plan = plan
        self.streams = streams
        self.handles: dict[str, _Handle] = {}
        self.lock = threading.RLock()
        self.query: StreamingQuery | None = None
        self.checkpoint: Path | None = None
        self.feeds: list[tuple[str, Path]] = []  # (stream, directory) opened for this query
        self.outputs: list[JoinOutput] = []
        self.stopped = False
        self.batch_thread: int | None = None
        self.counters: dict[str, Any] = {"batches": 0, "rows": 0, "rows_delivered": 0,
                                         "last_batch_ms": None, "last_error": None}

    def start(self) -> None:
        rt = self.settings
        qid = uuid.uuid4().hex
        feeds: list[Path | None] = []
        for side, definition in zip(("left", "right"), self.streams, strict=True):
            if rt.feeds is None or definition.source.kind != "ingest":
                feeds.append(None)
                continue
            directory = rt.work_dir / "feeds" / qid / side
            rt.feeds.open_feed(definition.name, directory)
            self.feeds.append((definition.name, directory))
            feeds.append(directory)
        try:
            frame, self.outputs = joined_frame(rt.spark, self.streams[0], self.streams[1],
                                               self.plan, rt.lateness, rt.max_files_per_trigger,
                                               (feeds[0], feeds[1]), rt.mask_key)
            self.checkpoint = rt.work_dir / "checkpoints" / qid
            self.checkpoint.mkdir(parents=True, exist_ok=True)
            millis = max(1, int(round(rt.trigger_interval * 1000)))
            self.query = (foreach_batch(frame.writeStream.queryName(f"xsg-join-{qid[:12]}"),
                                        self._on_batch)
                          .option("checkpointLocation", str(self.checkpoint))
                          .trigger(processingTime=f"{millis} milliseconds")
                          .start())
            kafka = sum(1 for d in self.streams if d.source.kind == "kafka")
            if kafka:  # a Kafka side starts at the latest offsets, fixed at the first trigger
                await_kafka_offsets(self.checkpoint, kafka, self.query)
        except BaseException:
            self._close_feeds()
            raise

    def _close_feeds(self) -> None:
        feeds, self.feeds = self.feeds, []
        for name, directory in feeds:
            assert self.settings.feeds is not None  # the feeds opened were its
            self.settings.feeds.close_feed(name, directory)
            shutil.rmtree(directory.parent, ignore_errors=True)

    @property
    def active(self) -> bool:
        return self.query is not None and self.query.isActive

    def _on_batch(self, batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        self.batch_thread = threading.get_ident()
        try:
            with self.lock:
                if self.stopped:
                    return
                handles = [h for h in self.handles.values() if h.active]
            if not handles:
                return
            columns = list(dict.fromkeys([o.internal for o in self.outputs]
                                         + [f"l{TIME}", f"r{TIME}"]))
            arrow = batch.select(*columns).toArrow()
            self.counters["batches"] += 1
            if arrow.num_rows == 0:
                return
            rows = self._rows(arrow)
            self.counters["rows"] += len(rows)
            closed = self._deliver(handles, RowBatch.of(rows))
            for handle_id in closed:
                self._on_handle_closed(handle_id)
        except Exception as exc:
            if self.stopped:
                return
            self.counters["last_error"] = described(exc)
            log.error("join %s: micro-batch %s failed: %s", self.plan.key()[:12], batch_id,
                      described(exc))
            raise
        finally:
            self.batch_thread = None
            self.counters["last_batch_ms"] = round((time.perf_counter() - started) * 1000, 1)

    def _rows(self, arrow: pa.Table) -> list[dict[str, Any]]:
        """Ordered by (left time, right time); columns renamed; timestamps as ISO text."""
        arrow = arrow.take(pc.sort_indices(arrow, sort_keys=[(f"l{TIME}", "ascending"),
                                                             (f"r{TIME}", "ascending")]))
        names, columns = [], []
        for o in self.outputs:
            column = arrow.column(o.internal)
            if pa.types.is_timestamp(column.type):
                column = _iso_text(column)
            names.append(o.name)
            columns.append(column)
        rows: list[dict[str, Any]] = pa.Table.from_arrays(columns, names=names).to_pylist()
        return rows

    def _deliver(self, handles: list[_Handle], batch: RowBatch) -> list[str]:
        return deliver_to(handles, batch, self.counters)

    def in_batch_thread(self) -> bool:
        return self.batch_thread == threading.get_ident()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            handles = list(self.handles.values())
        for h in handles:
            with h.lock:
                h.active = False
        deadline = time.monotonic() + 3.0
        while (self.batch_thread is not None and not self.in_batch_thread()
               and time.monotonic() < deadline):
            time.sleep(0.02)
        if self.query is not None:
            try:
                self.query.stop()
            except Exception as exc:  # noqa: BLE001 - it may have failed already: report, don't raise
                log.warning("stopping join %s: %s", self.plan.key()[:12], described(exc))
        if self.checkpoint is not None:
            shutil.rmtree(self.checkpoint, ignore_errors=True)
        self._close_feeds()

    def stats(self) -> dict[str, Any]:
        out = dict(self.counters)
        with self.lock:
            out["handles"] = sum(1 for h in self.handles.values() if h.active)
        out.update(streams=list(self.plan.streams), active=self.active,
                   query_id=str(self.query.id) if self.query is not None else None)
        progress = self.query.lastProgress if self.query is not None else None
        if progress:
            operators = progress.get("stateOperators") or []
            out["state_rows"] = sum(op.get("numRowsTotal", 0) for op in operators)
            out["late_rows"] = sum(op.get("numRowsDroppedByWatermark", 0) for op in operators)
            out["watermark"] = (progress.get("eventTime") or {}).get("watermark")
        return out


def _iso_text(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Timestamps as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (the shared runtime's and the ingest's form)."""
    text = column.cast(pa.timestamp("us")).cast(pa.string())
    text = pc.utf8_replace_slice(text, start=10, stop=11, replacement="T")
    return pc.binary_join_element_wise(text, "Z", "")


class JoinRuntime:
    """Runs `JoinPlan`s: attach_join / detach / handles / stats / stop, like the stream runtime.

    `attach_join(handle_id, (left, right), plan, deliver)`: `deliver(batch)` is called from the
    join's micro-batch thread with a `RowBatch`, never after `detach()` of the handle returned;
    returning False (or raising) detaches the handle. Handles with the same `plan.key()` share
    one query (the rows are computed once)."""

    def __init__(self, spark: SparkSession | None, work_dir: Path,
                 trigger_interval: float = 0.25, max_files_per_trigger: int = 50,
                 lateness: float = 10.0, feeds: FeedSource | None = None,
                 mask_keys: MaskKeys | None = None) -> None:
        if not math.isfinite(lateness) or lateness < 0:
            raise ValueError("lateness must be a finite number of seconds, at least 0")
        work_dir = Path(work_dir)
        # the owners' hash-mask keys: the stream runtime's, so both hash alike
        keys = mask_keys if mask_keys is not None else MaskKeys(work_dir / "mask-keys")
        self.settings = JoinSettings(
            spark if spark is not None else SparkSession.builder.getOrCreate(), work_dir,
            trigger_interval, max_files_per_trigger, lateness, feeds, keys.key_for)
        self._lock = threading.RLock()
        self._queries: dict[str, _JoinQuery] = {}
        self._handle_keys: dict[str, str] = {}
        self._stoppers: list[threading.Thread] = []
        self._closed = False

    def attach_join(self, handle_id: str, streams: tuple[StreamDefinition, StreamDefinition],
                    plan: JoinPlan, deliver: Deliver) -> None:
        if not isinstance(plan, JoinPlan):
            raise JoinPlanError("the join runtime runs JoinPlans only")
        key = plan.key()
        with self._lock:
            if self._closed:
                raise RuntimeError("the join runtime has been stopped")
            if handle_id in self._handle_keys:
                raise ValueError(f"handle {handle_id!r} is already attached")
            query = self._queries.get(key)
            carried: list[_Handle] = []
            if query is not None and not query.active:
                # its query failed: start a fresh one and move the surviving handles onto it
                carried = [h for h in query.handles.values() if h.active]
                del self._queries[key]
                self._retire(query)
                query = None
            if query is None:
                query = _JoinQuery(self.settings, plan, (streams[0], streams[1]),
                                   self._closed_by_deliver)
                for h in carried:
                    query.handles[h.id] = _Handle(h.id, h.deliver)
                query.handles[handle_id] = _Handle(handle_id, deliver)
                query.start()  # raises on a bad plan or source: nothing is registered
                self._queries[key] = query
            else:
                with query.lock:
                    query.handles[handle_id] = _Handle(handle_id, deliver)
            self._handle_keys[handle_id] = key

    def detach(self, handle_id: str) -> None:
        """Stop serving the handle (idempotent); the join's query stops with its last handle."""
        with self._lock:
            key = self._handle_keys.pop(handle_id, None)
            query = self._queries.get(key) if key is not None else None
        if query is None or key is None:
            return
        with query.lock:
            handle = query.handles.get(handle_id)
        if handle is not None:
            with handle.lock:  # waits for a delivery to it in progress
                handle.active = False
        with query.lock:
            query.handles.pop(handle_id, None)
            last = not query.handles
        if last:
            with self._lock:
                if self._queries.get(key) is query:
                    del self._queries[key]
            self._retire(query)

    def _retire(self, query: _JoinQuery) -> None:
        if query.in_batch_thread():
            t = threading.Thread(target=query.stop, name="xsg-join-stop", daemon=True)
            with self._lock:
                self._stoppers = [s for s in self._stoppers if s.is_alive()] + [t]
            t.start()
        else:
            query.stop()

    def _closed_by_deliver(self, handle_id: str) -> None:
        self.detach(handle_id)

    def handles(self) -> dict[str, str]:
        """handle id -> the key of the join it reads."""
        with self._lock:
            return dict(self._handle_keys)

    def stats(self) -> dict[str, Any]:
        """Per running join (by the first 16 hex digits of its key): handles, batches, rows,
        state rows and late rows (from Spark's progress), watermark, errors."""
        with self._lock:
            queries = dict(self._queries)
        return {key[:16]: q.stats() for key, q in queries.items()}

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            queries = list(self._queries.values())
            self._queries.clear()
            self._handle_keys.clear()
            stoppers = list(self._stoppers)
        for q in queries:
            q.stop()
        for t in stoppers:
            t.join(timeout=30)


__all__ = ["JoinRuntime", "JoinSettings", "JoinPlanError", "FeedSource"]
