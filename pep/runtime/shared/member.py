"""One stream served by the shared query: what the stream runtime asks of a stream's query
(`StreamExecutor`'s answers), with the per-stream parts made as a query of its own makes them
and the query itself the shared one's.

The parts (`PlanRegistry`, `PlanTable`, `RowsJob`, `PanesJob`, `ResultRouter`,
`MicroBatchRunner` with its route worker, `QueryFigures`) are the per-stream query's, so a
stream's plans, windows, watermarks, unions, anchors and figures are its own exactly as there;
only the micro-batch comes from the shared query (`query.py`) and its jobs run in the shared
job (`branch.py`). Whether a stream's next first handle starts at its end, or resumes where it
stopped, is its own `StreamCheckpoint` state, as for a query of its own: a first start moves
the files present to the archive (`start_position.archive_present`), never delivered.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from pep.core import punctuations
from pep.core.plan import StreamDefinition
from pep.runtime.query.figures import QueryFigures
from pep.runtime.query.panes_job import PanesJob
from pep.runtime.query.plan_table import PlanTable
from pep.runtime.query.registry import PlanRegistry
from pep.runtime.query.router import ResultRouter
from pep.runtime.query.rows_job import RowsJob
from pep.runtime.query.runner import MicroBatchRunner
from pep.runtime.query.settings import DEFAULT_TUPLE_PANE_MIN, StreamLayout
from pep.runtime.query.start_position import archive_present, source_files
from pep.runtime.query.stream_handles import StreamHandles
from pep.runtime.shared.branch import StreamParts
from pep.runtime.shared.query import SharedQuery
from pep.runtime.sources.checkpoints import StreamCheckpoint, archive_dir
from pep.runtime.sources.shared_files import shareable_dir


def can_share(definition: StreamDefinition) -> bool:
    """An `ingest` stream whose local directory a glob can name, without security punctuations:
    the shared query can read it. Every other stream (Kafka, an owner's files, sockets,
    generators, a punctuated stream: its shield is its own query's, `query/shield.py`) keeps a
    query of its own, and so do joins (their own queries, `joins/`)."""
    return shareable_dir(definition) is not None and not punctuations.enabled(definition)


START_WAIT = 120.0  # seconds a first handle's request waits for the shared query to read it


class SharedStreamExecutor:
    """A stream on the shared query. `on_handle_closed(handle_id)`: a handle's delivery refused
    or failed (the runtime detaches it); `mask_key(owner)`: the owner's key of hash masks."""

    def __init__(self, spark: SparkSession, shared: SharedQuery, definition: StreamDefinition,
                 work_dir: Path, max_files: int, lateness: float,
                 on_handle_closed: Callable[[str], None],
                 tuple_pane_min: int = DEFAULT_TUPLE_PANE_MIN,
                 mask_key: Callable[[str], bytes] | None = None) -> None:
        directory = shareable_dir(definition)
        if directory is None:
            raise ValueError(f"stream {definition.name!r} cannot be read by the shared query")
        layout = StreamLayout.of(definition)
        self._shared = shared
        self._work_dir = Path(work_dir)
        self._directory = directory
        self._layout = layout
        self.figures = QueryFigures()
        self.registry = PlanRegistry(tuple_pane_min)
        self.table = PlanTable(spark, layout, mask_key)
        self.rows = RowsJob(layout)
        self.panes = PanesJob(layout)
        self.router = ResultRouter(layout, self.registry, self.figures, lateness)
        self.handles = StreamHandles(self.registry, self.router, self.figures)
        self.runner = MicroBatchRunner(spark, layout, self.registry, self.table, self.rows,
                                       self.panes, self.router, self.figures, on_handle_closed)
        self._memo: dict[str, Any] = {}
        self._parts = self._make_parts()
        self._checkpoint: StreamCheckpoint | None = None
        self._max_files = max_files
        self._skip: set[str] = set()
        self._active = False
        self.started_at: float | None = None
        self.skipped_to_end = False

    def _make_parts(self) -> StreamParts:
        return StreamParts(self._layout, self.registry, self.table, self.rows, self.panes,
                           self.router, self.runner, self.figures, self._memo)

    # ----- what the shared query reads (`query.Member`) ----------------------------------------
    @property
    def definition(self) -> StreamDefinition:
        return self._layout.definition

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def parts(self) -> StreamParts:
        return self._parts

    @property
    def archive(self) -> Path:
        return archive_dir(self._work_dir, self.definition)

    # ----- the stream's definition ------------------------------------------------------------
    def _check(self, definition: StreamDefinition) -> None:
        if not can_share(definition):  # punctuations turned on: never served without a shield
            raise ValueError(f"stream {definition.name!r} is served by the shared query; "
                             "detach its handles before this change")

    def redefine(self, definition: StreamDefinition) -> None:
        self._check(definition)
        if definition.schema != self._layout.schema:
            raise ValueError(f"stream {definition.name!r}: a new schema restarts the query")
        self._relayout(StreamLayout.of(definition), restarted=False)

    def restart(self, definition: StreamDefinition) -> None:
        """Attributes added: the parts are built again for the new schema. No query stops: each
        batch reads the stream's files with the schema of its definition then."""
        self._check(definition)
        old = self.definition
        n = len(old.schema.fields)
        if (definition.name, definition.source) != (old.name, old.source) \
                or definition.schema.fields[:n] != old.schema.fields:
            raise ValueError(f"stream {old.name!r}: a query restarts only for added attributes")
        with self._shared.between_batches():
            self.runner.drain()
            if self._checkpoint is not None:
                # the stream's state now the new definition's (a restart of the gateway then
                # resumes it, rather than taking it for another source and skipping to its end)
                checkpoint = StreamCheckpoint.for_stream(self._work_dir, definition)
                checkpoint.adopt(old)
                self._checkpoint = checkpoint
            self._relayout(StreamLayout.of(definition), restarted=True)

    def _relayout(self, layout: StreamLayout, restarted: bool) -> None:
        self._layout = layout
        self.table.redefine(layout, restarted)
        self.rows.redefine(layout, restarted)
        self.panes.redefine(layout)
        self.router.redefine(layout)
        self.runner.redefine(layout)
        if restarted:
            self._memo.clear()
        self._parts = self._make_parts()

    # ----- on and off the shared query --------------------------------------------------------
    def start(self, replay: bool = False) -> None:
        """Join the shared query: at the stream's end (the files present are archived, never
        delivered) unless it stopped with handles attached, when it goes on where it stopped."""
        definition = self.definition
        checkpoint = StreamCheckpoint.for_stream(self._work_dir, definition)
        if checkpoint.prepare(self._shared.checkpoint_dir):
            names = [e.name for e in source_files(definition)]
            if 0 < len(names) <= self._max_files:
                # as a query of its own: the files present are dropped from the batches
                # that list them (the oldest first: its next ones)
                self._skip = set(names)
                self.skipped_to_end = True
            elif names:
                archive_present(definition, names, self.archive)
                self.skipped_to_end = True
        checkpoint.mark_running()
        self._checkpoint = checkpoint
        self.router.resume(0, -1)
        self.started_at = time.time()
        self._active = True
        self._shared.join(self)

    def wait_started(self) -> None:
        """As a query of its own starts: the request that starts the stream returns once the
        shared query reads its directory (called outside the runtime's lock: the query starts
        again between two of its batches, whose deliveries may need that lock)."""
        self._shared.wait_applied(START_WAIT)

    def deliverable(self, paths: list[str]) -> list[str]:
        """The stream's files of a batch less those present when its first handle came."""
        if not self._skip:
            return paths
        kept = [p for p in paths if os.path.basename(p) not in self._skip]
        self._skip.difference_update(os.path.basename(p) for p in paths)
        return kept

    def stop(self, idle: bool = False) -> None:
        """Leave the shared query. `idle`: the last handle left (the next first handle starts
        at the stream's end); otherwise it resumes where it stopped."""
        self._active = False
        self._shared.leave(self)
        if not self.in_batch_thread():
            # as a query of its own stops: once this returns, its directory is read no more
            # (a stop from a batch or its delivery cannot wait for the next batch boundary)
            self._shared.wait_applied(START_WAIT)
        try:
            self.runner.drain()
        except Exception:  # noqa: BLE001 - its failure is in its figures already
            pass
        self.runner.close()
        if self._checkpoint is not None:
            if idle:
                self._checkpoint.mark_idle()
            else:
                self._checkpoint.release()

    def failed(self, exc: BaseException) -> None:
        self.figures.failed(exc)

    @property
    def active(self) -> bool:
        return self._active and self._shared.active_or_starting()

    @property
    def query_id(self) -> str | None:
        return self._shared.query_id

    @property
    def query_name(self) -> str | None:
        return self._shared.query_name

    def in_batch_thread(self) -> bool:
        return self._shared.in_batch_thread() or self.runner.in_worker()

    def process_available(self, timeout: float = 120.0) -> None:
        self._shared.process_available(timeout)
        self.runner.drain(timeout)

    def wait_delivered(self, timeout: float = 120.0) -> None:
        self.runner.drain(timeout)

    # ----- figures ----------------------------------------------------------------------------
    def stats(self, stall_after: float | None = None) -> dict[str, Any]:
        out = self.handles.counters(self.query_id)
        out.update(self.health(stall_after))
        out["active"] = self.active
        out["skipped_to_end"] = self.skipped_to_end
        shared = self._shared.health()
        out["shared_query"] = {"streams": shared["members"], "busy": shared["busy"],
                               "interval": shared["interval"]}
        return out

    def health(self, stall_after: float | None = None, now: float | None = None
               ) -> dict[str, Any]:
        """As a query of its own reports it: input waiting is a file in the stream's directory
        newer than the start of the shared query's last completed batch (it lists every
        member's directory before a batch: a file written while that batch ran is not in it,
        and one in a batch still under way has not been delivered)."""
        now = time.time() if now is None else now
        last = self._shared.last_batch_at
        listed = self._shared.listed_at or self.started_at or 0.0
        since: float | None = None
        for entry in source_files(self.definition):
            try:
                mtime = entry.stat().st_mtime
            except OSError:
                continue
            if mtime > listed and (since is None or mtime < since):
                since = mtime
        waiting = since is not None
        progress = last or self.started_at or now
        stalled = bool(stall_after is not None and since is not None
                       and now - since > stall_after and now - progress > stall_after)
        error = self.figures.last_error or (None if self._shared.active_or_starting()
                                            else self._shared.last_error)
        if not self.active:
            state = "failed" if error else "idle"
        elif stalled:
            state = "stalled"
        elif waiting or (stall_after is not None and now - progress <= stall_after):
            state = "running"
        else:
            state = "idle"
        return {"state": state, "last_batch_at": last, "input_waiting": waiting,
                "waiting_since": since, "stalled": stalled, "last_error": error}


__all__ = ["SharedStreamExecutor", "can_share"]
