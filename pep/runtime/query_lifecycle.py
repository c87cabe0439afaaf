"""The lifecycle of one stream's shared query: start (at the end of its source for a first
handle: files present are archived or skipped, never delivered), restart with added attributes,
stop between two batches; and the query's figures and health (stalls, input waiting).
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from typing import Any
from pathlib import Path

from pyspark.sql import DataFrame

from common.numbers import NumberError, parse_int
from pep.core.plan import StreamDefinition
from pep.runtime.checkpoints import StreamCheckpoint, archive_dir, await_kafka_offsets
from pep.runtime.executor_state import Paused
from pep.runtime.jvm_steps import foreach_batch, stopped_batch
from pep.runtime.progress import query_progress
from pep.runtime.route_worker import RoutingFailed
from pep.runtime.routing import ResultRouting
from pep.runtime.sources import build_source, local_dir

log = logging.getLogger(__name__)

PROGRESS_GRACE = 10.0  # seconds a stopped query's progress is still counted
STOP_HOLD = 60.0  # the longest a batch started during a stop waits for the query to stop


class QueryLifecycle(ResultRouting):
    """Starting, restarting and stopping the stream's query; its figures and health."""

    def start(self) -> None:
        self._checkpoint = StreamCheckpoint.for_stream(self.work_dir, self.definition)
        self._codegen = None  # a new query clones a new session
        skip = self._checkpoint.prepare()
        # a new checkpoint numbers its batches from 0 again; a resumed one continues, and the
        # batch its last query delivered but may not have committed is not delivered twice
        self._completed_batch = -1 if skip else max(self._completed_batch,
                                                    self._checkpoint.delivered_batch())
        self._batch_base = self._checkpoint.batch_base()
        kind = self.definition.source.kind
        if kind == "kafka" and self.replay_pending:
            # handles restored at the gateway's start: what their readers may not have read
            # comes again, before the query's first batch (`executor.StreamExecutor.replay`)
            self.replay_pending = False
            try:
                self.replay(fresh=skip)
            finally:
                self._codegen = None  # the replay ran in the gateway's session, not the query's
        archive = (str(archive_dir(self.work_dir, self.definition)) if kind == "ingest"
                   else None)
        if skip and kind in ("ingest", "files"):
            names = [e.name for e in self._source_files()] if self._source_path() else None
            if names is not None and 0 < len(names) <= self._files_per_trigger():
                # the query's first batch lists these files (the oldest first, so all of them)
                # and maybe newer ones: it drops the tuples of these
                self._skip_names = frozenset(names)
                self.skipped_to_end = True
            elif names and kind == "ingest" and archive is not None:
                self._archive_present(names, Path(archive))
            elif names != []:
                self._skip_to_end(archive)
        source = build_source(self.spark, self.definition, self.max_files_per_trigger, archive)
        millis = max(1, int(round(self.trigger_interval * 1000)))
        self.started_at = time.time()
        name = f"xsg-{uuid.uuid4().hex[:12]}"
        if self._rows_from_progress:
            query_progress(self.spark).register(name, self._count_rows_read)
        self._query_name = name
        self._query = (foreach_batch(source.writeStream.queryName(name), self._on_batch)
                       .option("checkpointLocation", str(self._checkpoint.location))
                       .trigger(processingTime=f"{millis} milliseconds")
                       .start())
        self._checkpoint.mark_running()
        if kind == "kafka":
            # a new query starts at the latest offsets, fixed at its first trigger: every record
            # produced after the handle's request was answered reaches the handle
            await_kafka_offsets(self._checkpoint.location, 1, self._query)
        # Built while the query lists its source and plans its first batch (a few tenths of a
        # second), so that batch finds it ready instead of the request waiting for it first.
        try:
            self._prepare_plans()
        except Exception as exc:  # the query runs already: its first batch builds it (or fails)
            log.warning("stream %s: plan table not prepared: %s", self.definition.name, exc)

    def _source_path(self) -> str | None:
        path = self.definition.source.option("path")
        return local_dir(path) if path else None

    def _source_files(self) -> list[os.DirEntry[str]]:
        path = self._source_path()
        if not path:
            return []
        try:
            with os.scandir(path) as it:
                return [e for e in it if e.name[:1] not in (".", "_") and e.is_file()]
        except OSError:
            return []

    def _files_per_trigger(self) -> int:
        own = self.definition.source.option("maxFilesPerTrigger")
        try:
            return parse_int(str(own), "maxFilesPerTrigger", low=1, high=1_000_000)
        except NumberError:  # unset (or refused at registration)
            return self.max_files_per_trigger

    def _archive_present(self, names: list[str], archive: Path) -> None:
        """An `ingest` stream's directory is the gateway's own: files present when a first
        handle starts the query (more than its first batch would list) are moved to the
        archive, where retention removes them, instead of a Spark query that marks them
        processed (measured 0.3-0.5 s of the request that starts the stream)."""
        started = time.perf_counter()
        source = Path(self._source_path() or "")
        target = archive / "not-delivered"
        target.mkdir(parents=True, exist_ok=True)
        moved = 0
        for name in names:
            try:
                os.replace(source / name, target / name)
                moved += 1
            except FileNotFoundError:
                continue
        self.skipped_to_end = True
        log.info("stream %s: started at the end of its source, %d files archived (%.3f s)",
                 self.definition.name, moved, time.perf_counter() - started)

    def _skip_to_end(self, archive: str | None) -> None:
        """Mark every file now in the source directory as processed, without reading one: a
        one-batch query (availableNow) whose foreachBatch does nothing commits them to the
        checkpoint; the real query then continues after them. Tuples ingested before a
        stream's first handle are not delivered."""
        assert self._checkpoint is not None
        frame = build_source(self.spark, self.definition, None, archive)
        started = time.perf_counter()
        for attempt in (1, 2):
            query = (frame.writeStream.queryName(f"xsg-skip-{uuid.uuid4().hex[:12]}")
                     .foreachBatch(lambda df, batch_id: None)
                     .option("checkpointLocation", str(self._checkpoint.location))
                     .trigger(availableNow=True).start())
            try:
                query.awaitTermination(120)
                if query.exception() is None:
                    break
                raise RuntimeError(str(query.exception()))
            except Exception as exc:  # noqa: BLE001
                query.stop()
                if attempt == 2:
                    raise
                log.warning("stream %s: skipping to the end failed (%s); starting a new "
                            "checkpoint", self.definition.name, exc)
                shutil.rmtree(self._checkpoint.location, ignore_errors=True)
        self.skipped_to_end = True
        log.info("stream %s: started at the end of its source (%.2f s)", self.definition.name,
                 time.perf_counter() - started)

    def restart(self, definition: StreamDefinition) -> None:
        """Stop the query and start it again on its checkpoint with `definition`, whose schema
        adds attributes after the existing ones (`pep.streams.definition.extend_schema`): the
        source is read with the new columns; attached plans (their attribute indices stay
        valid), their windows and the stream's figures carry over; the new query continues
        where the old one committed, so a record ingested meanwhile is read once, by it."""
        old = self.definition
        n = len(old.schema.fields)
        if (definition.name, definition.source) != (old.name, old.source) \
                or definition.schema.fields[:n] != old.schema.fields:
            raise ValueError(f"stream {old.name!r}: a query restarts only for added attributes")
        # Stop between two batches: a batch stopped half-way would be run again by the new
        # query after some of its rows were delivered. The batch under way ends first; one
        # starting meanwhile fails before it delivers anything (so it is not committed, and the
        # new query runs it); one that ended but whose commit the stop cut off is run again and
        # skipped (`_completed_batch`).
        self._pausing = True
        try:
            deadline = time.monotonic() + 120.0
            while self._batch_thread is not None and time.monotonic() < deadline:
                time.sleep(0.02)
            self.stop(idle=False)
        finally:
            self._pausing = False
        self.definition = definition
        self._schema = definition.schema
        self._field_names = list(definition.schema.names)
        self._index = {name: i + 1 for i, name in enumerate(self._field_names)}
        self._types = {f.name: f.type for f in definition.schema.fields}
        self._anchors = self._anchors.with_schema(definition.schema)
        with self._table_lock:
            self._table = None
        self._shape, self._few, self._grouped, self._sets = None, None, None, None
        StreamCheckpoint.for_stream(self.work_dir, definition).adopt(old)
        self._stopped = False
        self.start()

    def _held_for_stop(self) -> Exception:
        """What a micro-batch that started while the query is being stopped between two
        batches fails with, once the stop has begun: `stopped_batch`, which Spark takes for
        the stop itself (the batch is not committed, nothing is logged: a restart or the
        gateway's stop is one INFO line, not a query "terminated with error"). The stop waits
        for no such batch (`stop`, `restart`); if none comes within STOP_HOLD seconds,
        `Paused`: the query fails, and says so."""
        query = self._query
        deadline = time.monotonic() + STOP_HOLD
        while query is not None and time.monotonic() < deadline:
            try:
                if not query.isActive:  # stop() has begun: the query's state is TERMINATED
                    return stopped_batch(self.spark, f"stream {self.definition.name}: query "
                                         "stopped between two micro-batches")
            except Exception:  # noqa: BLE001 - no answer from the JVM: fail as Paused
                break
            time.sleep(0.01)
        return Paused()

    @property
    def query_name(self) -> str | None:
        """The name of the query now or last started (a new one at each start)."""
        return self._query_name

    @property
    def query_id(self) -> str | None:
        return str(self._query.id) if self._query is not None else None

    @property
    def active(self) -> bool:
        return self._query is not None and self._query.isActive

    def process_available(self, timeout: float = 120.0) -> None:
        """Return once every record the source holds now has been processed and its rows
        delivered: Spark's `processAllAvailable`, then the route worker drained (raises the
        query's failure, or `RoutingFailed`)."""
        if self._query is not None:
            self._query.processAllAvailable()
        self._router.drain(timeout)

    def wait_delivered(self, timeout: float = 120.0) -> None:
        """Return once the micro-batches run so far are delivered (`route_worker.py`); raises
        `RoutingFailed` if delivering the last one failed."""
        self._router.drain(timeout)

    def in_batch_thread(self) -> bool:
        """In the query's micro-batch, or delivering one (`route_worker.py`): such a thread
        cannot wait for its own batch to end."""
        return self._batch_thread == threading.get_ident() or self._router.in_worker()

    def stop(self, idle: bool = False) -> None:
        """Stop the query. `idle`: its last handle left (the next start begins at the stream's
        end); otherwise (gateway stopping, a replaced query) it resumes where it stopped: then
        the batch under way ends first (one starting meanwhile fails before it delivers, so is
        not committed), and the last batch delivered in full is written down for the next
        query, which skips it if this stop cut off its commit."""
        pause = not idle and not self._pausing and self._query is not None \
            and not self.in_batch_thread()
        if pause:
            self._pausing = True
            deadline = time.monotonic() + 30.0
            while self._batch_thread is not None and time.monotonic() < deadline:
                time.sleep(0.02)
        try:
            self._stopped = True
            if self._query is not None:
                try:
                    self._query.stop()
                except Exception:  # noqa: BLE001 - stopping must not fail the caller
                    log.exception("stopping the query of stream %s failed",
                                  self.definition.name)
            # the batch in flight is delivered before the last delivered batch is written down
            try:
                self._router.drain()
            except RoutingFailed as exc:
                log.warning("stream %s: %s", self.definition.name, exc)
            self._router.close()
            if self._rows_from_progress and self._query_name is not None:
                # its last batches' progress may still be on Spark's listener bus
                forget = threading.Timer(PROGRESS_GRACE, query_progress(self.spark).unregister,
                                         args=(self._query_name,))
                forget.daemon = True
                forget.start()
            if self._checkpoint is not None:
                try:
                    if idle:
                        self._checkpoint.mark_idle()
                    else:
                        self._checkpoint.release(self._completed_batch)
                except OSError:
                    log.exception("stream %s: checkpoint state not written",
                                  self.definition.name)
        finally:
            if pause:
                self._pausing = False

    # ----- figures ---------------------------------------------------------------------------
    def _count_rows_read(self, rows: int) -> None:
        """A batch's input rows as Spark reported them (`progress.py`; Kafka streams)."""
        self.stats_counters["rows_in"] += rows

    def stats(self, stall_after: float | None = None) -> dict[str, Any]:
        with self._lock:
            out = dict(self.stats_counters)
            out.update(handles=len(self._handles), plans=len(self._plans),
                       query_id=self.query_id,
                       late_rows=sum(s.windows.late for s in self._plans.values()
                                     if s.windows is not None)
                       + self.stats_counters["late_rows"],
                       window_panes=sum(s.windows.stored_panes for s in self._plans.values()
                                        if s.windows is not None))
        out.update(self.health(stall_after))
        out["active"] = self.active
        out["skipped_to_end"] = self.skipped_to_end
        return out

    def input_waiting(self, now: float | None = None) -> tuple[bool, float | None]:
        """(input is waiting, since when it arrived): new files in the source directory that
        no batch has listed yet (arrived when written), or the query's own status saying that
        data is available (arrived no later than when that was first seen after the last
        completed batch). Never the time of the last batch: after a stream was idle for longer
        than the stall bound, that would report its next append as having waited all the idle
        time, and raise a stall while its batch is under way (issue 42)."""
        now = time.time() if now is None else now
        since: float | None = None
        listed = self.last_batch_started_at or self.started_at or 0.0
        for entry in self._source_files():
            try:
                mtime = entry.stat().st_mtime
            except OSError:
                continue
            if mtime > listed and (since is None or mtime < since):
                since = mtime
        available = False
        if self._query is not None:
            try:
                available = bool(self._query.status.get("isDataAvailable"))
            except Exception:  # noqa: BLE001 - a stopped query has no status
                available = False
        if available:
            # Spark's status says so from the trigger that found the data until the next
            # trigger; it has no arrival time, so the first look after the last completed
            # batch stands for it (the health checks look every second or so)
            seen = self._available_seen
            if seen is None or seen[0] != self.last_batch_at:
                seen = self._available_seen = (self.last_batch_at, now)
            since = seen[1] if since is None else min(since, seen[1])
        else:
            self._available_seen = None
        return since is not None, since

    def health(self, stall_after: float | None = None, now: float | None = None
               ) -> dict[str, Any]:
        now = time.time() if now is None else now
        waiting, since = self.input_waiting(now)
        progress = self.last_batch_at or self.started_at or now
        stalled = bool(stall_after is not None and waiting and since is not None
                       and now - since > stall_after and now - progress > stall_after)
        if not self.active:
            state = "failed" if self.stats_counters["last_error"] else "idle"
        elif stalled:
            state = "stalled"
        elif waiting or (stall_after is not None and now - progress <= stall_after):
            state = "running"
        else:
            state = "idle"
        return {"state": state, "last_batch_at": self.last_batch_at, "input_waiting": waiting,
                "waiting_since": since, "stalled": stalled,
                "last_error": self.stats_counters["last_error"]}

    def _on_batch(self, batch: DataFrame, batch_id: int) -> None:
        """The query's foreachBatch (`executor.StreamExecutor`)."""
        raise NotImplementedError

    def replay(self, fresh: bool) -> None:
        """A restored Kafka stream's rows again (`executor.StreamExecutor`)."""
        raise NotImplementedError


__all__ = ["QueryLifecycle"]
