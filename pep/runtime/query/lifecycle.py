"""The life cycle of one stream's shared query: start (at the end of its source for a first
handle: `start_position.py`; after the replay a restored Kafka stream's handles are owed), stop
between two batches (for a restart with added attributes, or the gateway stopping), and the
gate every micro-batch passes before it runs (`on_batch`, the query's foreachBatch); the query's
health (stalls, input waiting). A Kafka stream's real-time mode is a part of its own
(`realtime_mode.RealTimeMode`): it chooses the mode at each start and restarts the query through
this class's `QueryControl` side (`layout`, `running`, `restart`).
"""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, functions as F
from pyspark.sql.streaming.query import StreamingQuery

from common.errors import described
from pep.core.plan import StreamDefinition
from pep.runtime.base.columns import FILE_COLUMN
from pep.runtime.base.jvm_steps import foreach_batch, stopped_batch
from pep.runtime.query.figures import QueryFigures
from pep.runtime.query.kafka_replay import KafkaReplay
from pep.runtime.query.progress import query_progress
from pep.runtime.query.realtime_mode import RealTimeMode
from pep.runtime.query.route_worker import RoutingFailed
from pep.runtime.query.router import ResultRouter
from pep.runtime.query.runner import MicroBatchRunner
from pep.runtime.query.settings import QuerySettings, StreamLayout
from pep.runtime.query.start_position import (
    archive_present,
    files_per_trigger,
    skip_to_end,
    source_files,
    source_path,
)
from pep.runtime.sources.checkpoints import StreamCheckpoint, archive_dir, await_kafka_offsets
from pep.runtime.sources.frames import build_source

log = logging.getLogger(__name__)

PROGRESS_GRACE = 10.0  # seconds a stopped query's progress is still counted
STOP_HOLD = 60.0  # the longest a batch started during a stop waits for the query to stop


class Paused(Exception):
    """A micro-batch refused while the query is being restarted (`StreamExecutor.restart`)."""


class QueryLifecycle:
    """Starting and stopping the stream's query, and letting its micro-batches run.

    Owns the query, its checkpoint and the hand-shake between a stop and the batch under way
    (`_pausing`, `_stopped`, `_batch_thread`); hands each batch it lets in to the runner, and
    tells the router where a started query's deliveries resume. `prepare_plans()`: build the
    plan table while the query plans its first batch."""

    def __init__(self, settings: QuerySettings, layout: StreamLayout, runner: MicroBatchRunner,
                 router: ResultRouter, replay: KafkaReplay, figures: QueryFigures,
                 prepare_plans: Callable[[], None],
                 realtime: RealTimeMode | None = None) -> None:
        """`realtime`: a Kafka stream's query may run in real-time mode while its plans
        qualify (`pep.runtime.query.realtime_mode`)."""
        self._settings = settings
        self._layout = layout
        self._runner = runner
        self._router = router
        self._replay = replay
        self._figures = figures
        self._prepare_plans = prepare_plans
        self._query: StreamingQuery | None = None
        self._checkpoint: StreamCheckpoint | None = None
        self._query_name: str | None = None
        self._stopped = False
        self._pausing = False  # a stop between two batches is waiting for the batch under way
        self._batch_thread: int | None = None
        # the files present when the stream's first handle attached: not delivered
        self._skip_names: frozenset[str] | None = None
        self.skipped_to_end = False
        self.started_at: float | None = None
        self.last_batch_started_at: float | None = None
        self.last_batch_at: float | None = None
        # (last_batch_at, when) Spark's status first said that data is available after that
        # batch: the time the input is known to have arrived (`input_waiting`)
        self._available_seen: tuple[float | None, float] | None = None
        # ((the checkpoint's metadata file, its inode, its mtime), its query id)
        self._epoch: tuple[tuple[Path, int, int], str] | None = None
        self._realtime = realtime if layout.kafka else None
        self._ended = False  # stopped from outside: no change of mode starts it again

    def _progressed(self, rows: int) -> None:
        """A real-time batch ended (committed): no foreachBatch tells the figures and the
        health checks that the query moves."""
        self._figures.rows_read(rows)
        self.last_batch_at = time.time()

    def redefine(self, layout: StreamLayout) -> None:
        """The stream's definition changed (the next start reads the new one)."""
        self._layout = layout

    # ----- starting ---------------------------------------------------------------------------
    def start(self, replay: bool = False) -> None:
        """Start the query on the stream's checkpoint. `replay`: handles were restored at the
        gateway's start; a Kafka stream's are first given again what their readers may not
        have read (`KafkaReplay`)."""
        settings, definition = self._settings, self._layout.definition
        self._checkpoint = StreamCheckpoint.for_stream(settings.work_dir, definition)
        self._runner.new_session()  # a new query clones a new session
        skip = self._checkpoint.prepare()
        # a new checkpoint numbers its batches from 0 again; a resumed one continues, and the
        # batch its last query delivered but may not have committed is not delivered twice
        completed = -1 if skip else max(self._router.completed_batch,
                                        self._checkpoint.delivered_batch())
        self._router.resume(self._checkpoint.batch_base(), completed)
        kind = definition.source.kind
        if kind == "kafka" and replay:
            # handles restored at the gateway's start: what their readers may not have read
            # comes again, before the query's first batch
            try:
                self._replay.replay(self._checkpoint.location, fresh=skip)
            finally:
                self._runner.new_session()  # the replay ran in the gateway's session
        archive = (str(archive_dir(settings.work_dir, definition)) if kind == "ingest"
                   else None)
        if skip and kind in ("ingest", "files"):
            names = ([e.name for e in source_files(definition)] if source_path(definition)
                     else None)
            if names is not None and 0 < len(names) <= files_per_trigger(
                    definition, settings.max_files_per_trigger):
                # the query's first batch lists these files (the oldest first, so all of them)
                # and maybe newer ones: it drops the tuples of these
                self._skip_names = frozenset(names)
                self.skipped_to_end = True
            elif names and kind == "ingest" and archive is not None:
                archive_present(definition, names, Path(archive))
                self.skipped_to_end = True
            elif names != []:
                skip_to_end(settings.spark, definition, self._checkpoint.location, archive)
                self.skipped_to_end = True
        millis = max(1, int(round(settings.trigger_interval * 1000)))
        self.started_at = time.time()
        name = f"xsg-{uuid.uuid4().hex[:12]}"
        self._query_name = name
        chosen = self._realtime.choose(self._layout) if self._realtime is not None else None
        if chosen is not None and self._realtime is not None:
            self._query = self._realtime.start(chosen, self._layout, name,
                                               self._checkpoint.location,
                                               self._router.completed_batch, self._progressed)
        else:
            if self._layout.kafka:
                # no stream positions: the rows read come from Spark's progress reports, not
                # from an observation in every batch (pep/runtime/query/progress.py)
                query_progress(settings.spark).register(name, self._figures.rows_read)
            source = build_source(settings.spark, definition, settings.max_files_per_trigger,
                                  archive, settings.max_offsets_per_trigger)
            self._query = (foreach_batch(source.writeStream.queryName(name), self.on_batch)
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
        except Exception as exc:  # noqa: BLE001 - the query runs already: its first batch builds it (or fails)
            log.warning("stream %s: plan table not prepared: %s", definition.name,
                        described(exc))

    # ----- real-time mode (pep/runtime/query/realtime_mode.py) -----------------------------
    @property
    def mode(self) -> str:
        """"realtime" while the query runs in real-time mode (until it has stopped), else
        "micro-batch"."""
        return self._realtime.mode if self._realtime is not None else "micro-batch"

    @property
    def realtime_plans(self) -> tuple[int, ...]:
        """The ids of the plans the running real-time query serves (none: micro-batches)."""
        return self._realtime.plan_ids if self._realtime is not None else ()

    @property
    def layout(self) -> StreamLayout:
        return self._layout

    @property
    def running(self) -> bool:
        """The query was started and not stopped (`RealTimeMode`'s `QueryControl`)."""
        return self._query is not None and not self._stopped and not self._ended

    def restart(self) -> None:
        """Stop the query between two batches and start it again: its mode is chosen at the
        start (`RealTimeMode`'s `QueryControl`)."""
        try:
            self.stop_between_batches()
            if self._ended:
                return
            self._stopped = False
            self.start()
        except Exception as exc:  # noqa: BLE001 - said by its kinds
            self._figures.failed(exc)
            log.error("stream %s: the query did not start again: %s", self._layout.name,
                      described(exc))

    def plans_changed(self) -> None:
        """A handle came or went: with real-time mode allowed, the query starts again when its
        mode must change or the plans of its real-time query changed (`RealTimeMode`)."""
        if self._realtime is not None:
            self._realtime.plans_changed(self)

    def start_again(self, previous: StreamDefinition) -> None:
        """Start the query stopped by `stop_between_batches` again, on the checkpoint of
        `previous`, the definition it ran with (adopted by the new one's)."""
        StreamCheckpoint.for_stream(self._settings.work_dir, self._layout.definition
                                    ).adopt(previous)
        self._stopped = False
        self.start()

    # ----- what plan topics' keys need (pep/runtime/delivery) --------------------------------
    def checkpoint_id(self) -> str:
        """The identity of the query's checkpoint (Spark's query id, kept across restarts from
        it; a new checkpoint numbers its batches anew): the epoch of plan topics' keys. Cached
        by the metadata file itself (its inode and modification time), not by the path: a
        checkpoint deleted and created again at the same path (a Kafka query dropped when its
        last handle left, a source changed) has a new id, and batches numbered from 0 again
        under the old one would be skipped by the edges as repeats."""
        checkpoint = self._checkpoint
        if checkpoint is None:
            return "0"
        metadata = checkpoint.location / "metadata"
        try:
            stat = metadata.stat()
        except OSError:
            return "0"  # not written before the query's first trigger
        which = (metadata, stat.st_ino, stat.st_mtime_ns)
        if self._epoch is None or self._epoch[0] != which:
            try:
                text = metadata.read_text(encoding="utf-8")
                ident = str(json.loads(text.splitlines()[0])["id"]).replace("-", "")[:12]
            except (OSError, ValueError, KeyError, IndexError):
                return "0"
            self._epoch = (which, ident)
        return self._epoch[1]

    @property
    def stopping(self) -> bool:
        """A stop is under way (a batch waiting for the brokers gives up)."""
        return self._pausing or self._stopped

    # ----- the micro-batch's gate -------------------------------------------------------------
    def on_batch(self, batch: DataFrame, batch_id: int) -> None:
        """The query's foreachBatch: lets the batch run (`MicroBatchRunner.run`) unless a stop
        is under way or the batch was delivered in full before a restart."""
        self._batch_thread = threading.get_ident()  # before the check: a stop waits for it
        if self._pausing:
            # never committed: the query is being stopped between two batches (a restart, the
            # gateway stopping) and the next query runs this batch
            self._batch_thread = None
            raise self._held_for_stop()
        started = time.perf_counter()
        self.last_batch_started_at = time.time()
        self._runner.began()
        try:
            if self._stopped:
                return
            if batch_id <= self._router.completed_batch:
                return  # run again after a restart: delivered in full before the stop
            if self._skip_names is not None:
                # the files present when the stream's first handle attached are not delivered
                names = sorted(self._skip_names)
                self._skip_names = None
                batch = batch.where(~F.element_at(F.split(F.col(FILE_COLUMN), "/"), -1)
                                    .isin(*names))
            self._runner.run(batch, batch_id)
        except Exception as exc:
            if self._stopped:
                return  # the job was cancelled by stop(); nothing is delivered any more
            self._figures.failed(exc)
            log.error("stream %s: micro-batch %s failed: %s", self._layout.name, batch_id,
                      described(exc))
            raise
        finally:
            self._batch_thread = None
            self._figures.batch_took(round((time.perf_counter() - started) * 1000, 1))
            if not self._stopped:
                self.last_batch_at = time.time()

    def _held_for_stop(self) -> Exception:
        """What a micro-batch that started while the query is being stopped between two
        batches fails with, once the stop has begun: `stopped_batch`, which Spark takes for
        the stop itself (the batch is not committed, nothing is logged: a restart or the
        gateway's stop is one INFO line, not a query "terminated with error"). The stop waits
        for no such batch (`stop`, `stop_between_batches`); if none comes within STOP_HOLD
        seconds, `Paused`: the query fails, and says so."""
        query = self._query
        deadline = time.monotonic() + STOP_HOLD
        while query is not None and time.monotonic() < deadline:
            try:
                if not query.isActive:  # stop() has begun: the query's state is TERMINATED
                    return stopped_batch(self._settings.spark,
                                         f"stream {self._layout.name}: query stopped between "
                                         "two micro-batches")
            except Exception:  # noqa: BLE001 - no answer from the JVM: fail as Paused
                break
            time.sleep(0.01)
        return Paused()

    def in_batch_thread(self) -> bool:
        """In the query's micro-batch, or delivering one (`query/route_worker.py`): such a thread
        cannot wait for its own batch to end."""
        return self._batch_thread == threading.get_ident() or self._runner.in_worker()

    # ----- stopping ---------------------------------------------------------------------------
    def stop_between_batches(self) -> None:
        """Stop the query between two batches, to start it again (`StreamExecutor.restart`):
        a batch stopped half-way would be run again by the new query after some of its rows
        were delivered. The batch under way ends first; one starting meanwhile fails before it
        delivers anything (so it is not committed, and the new query runs it); one that ended
        but whose commit the stop cut off is run again and skipped (the router's completed
        batch)."""
        self._pausing = True
        try:
            deadline = time.monotonic() + 120.0
            while self._batch_thread is not None and time.monotonic() < deadline:
                time.sleep(0.02)
            self._stop(idle=False)
        finally:
            self._pausing = False

    def stop(self, idle: bool = False) -> None:
        """Stop the query. `idle`: its last handle left (the next start begins at the stream's
        end); otherwise (gateway stopping, a replaced query) it resumes where it stopped: then
        the batch under way ends first (one starting meanwhile fails before it delivers, so is
        not committed), and the last batch delivered in full is written down for the next
        query, which skips it if this stop cut off its commit."""
        self._ended = True
        if self._realtime is None:
            self._stop(idle)
            return
        self._realtime.ended = True
        with self._realtime.lock:
            self._stop(idle)

    def _stop(self, idle: bool = False) -> None:
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
                except Exception as exc:  # noqa: BLE001 - stopping must not fail the caller
                    log.error("stopping the query of stream %s failed: %s", self._layout.name,
                              described(exc))
            if self._realtime is not None and not idle and not self._ended:
                # what the real-time query wrote is not written again by the next query
                self._realtime.after_stop(self._layout)
            elif self._realtime is not None:
                self._realtime.forget()  # no next query on this checkpoint in this process
            # the batch in flight is delivered before the last delivered batch is written down
            try:
                self._runner.drain()
            except RoutingFailed as exc:
                log.warning("stream %s: %s", self._layout.name, str(exc))  # ours: no data
            self._runner.close()
            if self._layout.kafka and self._query_name is not None:
                # its last batches' progress may still be on Spark's listener bus
                forget = threading.Timer(PROGRESS_GRACE,
                                         query_progress(self._settings.spark).unregister,
                                         args=(self._query_name,))
                forget.daemon = True
                forget.start()
            if self._checkpoint is not None:
                try:
                    if idle:
                        self._checkpoint.mark_idle()
                    else:
                        self._checkpoint.release(self._router.completed_batch)
                except OSError as exc:
                    log.error("stream %s: checkpoint state not written: %s", self._layout.name,
                              described(exc))
        finally:
            if pause:
                self._pausing = False

    # ----- the running query ------------------------------------------------------------------
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
        self._runner.drain(timeout)

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
        for entry in source_files(self._layout.definition):
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
        error = self._figures.last_error
        if not self.active:
            state = "failed" if error else "idle"
        elif stalled:
            state = "stalled"
        elif waiting or (stall_after is not None and now - progress <= stall_after):
            state = "running"
        else:
            state = "idle"
        return {"state": state, "last_batch_at": self.last_batch_at, "input_waiting": waiting,
                "waiting_since": since, "stalled": stalled, "last_error": error}


__all__ = ["QueryLifecycle", "Paused", "PROGRESS_GRACE", "STOP_HOLD"]
