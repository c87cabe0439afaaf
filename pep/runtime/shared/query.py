"""One Structured Streaming query for the ingest streams of a gateway process: one Spark job per
micro-batch for every stream that brought tuples.

Each stream's query costs Spark's driver ~0.1 s of JVM time per micro-batch whatever it
carries (listing its directory, the offset and commit logs, planning and scheduling a job), so
busy streams add up where handles on one stream do not (docs/scale-out.md). The shared query
pays that once per trigger: its file source lists every member stream's directory
(`sources/shared_files.py`) and gives each line with its file. Its foreachBatch (`on_batch`)
runs one Spark job for every stream the batch holds:

- streams whose plans are row plans the grouped matcher tests (the bulk) go through the one
  Python stage (`stage.py`): a `mapInArrow` over the batch itself that parses each stream's
  lines with its schema and matches them against its plans on the workers; its function is
  built once per change of those streams' plans, so the driver builds and analyses no
  DataFrame per stream and batch (`branch.stage_plan`);
- the others (window plans, masks, spatial or label comparisons, anchors; a stream some of
  whose files in the batch are not delivered) keep their own jobs over their own files read
  with their own schema (`branch.plan_branch`, the per-stream parts unchanged).

Every result is packed into one common schema (`base/arrow_ipc.py`) and the union collected in
that one job. A stream whose lines the stage does not read exactly as Spark's JSON reader does
(no ingest writes such lines: a file dropped in by other means) is read again by Spark's reader
in its own jobs, one job more in that batch. Each stream's results then go to its own route
worker, one batch behind, as on its own query.

What stays per stream: everything the parts own (plans, windows and their watermarks, the
anchors, unions, figures), the route worker, the archive of its committed files, and whether
its next first handle starts at its end (`StreamCheckpoint`'s state). What is shared: the file
source's checkpoint, which keeps the files it has seen by path, so a stream joining or leaving
(the query is started again with the new set of directories, a fraction of a second after the
last change) moves no other stream's position.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession, functions as F, types as T
from pyspark.sql.streaming.query import StreamingQuery

from common.errors import described
from pep.core.plan import StreamDefinition
from pep.runtime.base import arrow_ipc
from pep.runtime.base.arrow_ipc import (
    IPC_COLUMN,
    PACKED_SCHEMA,
    TAG_COLUMN,
    packed_blobs,
    packer,
    summary_packer,
    unpack_blobs,
)
from pep.runtime.base.columns import SEQ_COLUMN
from pep.runtime.base.jvm_steps import JvmSteps, foreach_batch, stopped_batch
from pep.runtime.query.route_worker import RoutingFailed
from pep.runtime.query.runner import Route
from pep.runtime.shared import stage
from pep.runtime.shared.branch import (
    FIGURES,
    Branch,
    StagePlan,
    StreamParts,
    needs_again,
    plan_branch,
    stage_finish,
    stage_plan,
    stage_rows,
)
from pep.runtime.shared.stage import LINE_COLUMN, PATH_COLUMN, StageStream, stage_function
from pep.runtime.shared.trigger import TriggerBounds
from pep.runtime.sources.shared_files import archive_files, batch_files, batch_frame, glob_path

log = logging.getLogger(__name__)

# the packers and the stage run on the workers: their code travels with them (as the grouped
# matcher's does, `query/rows_job.py`), so a worker runs the driver's, xsg installed there or not
_pickle_by_value: Callable[[ModuleType], None] = cloudpickle.register_pickle_by_value
_pickle_by_value(arrow_ipc)
_pickle_by_value(stage)

PACKED = T.StructType([T.StructField(TAG_COLUMN, T.StringType()),
                       T.StructField(IPC_COLUMN, T.BinaryType())])

OPEN_COST = 64 * 1024  # bytes a file counts for in the shared query's read tasks (see _collect)
SETTLE = 0.2  # seconds a change of members waits for more before the query starts again
RETRY = 2.0  # seconds before a failed query is started again while it has members
STOP_HOLD = 10.0
NOTES_KEPT = 256  # batches whose pause and streams are kept (Spark reports the last 100)


class Member(Protocol):
    """What the shared query needs of a stream on it (`member.py`)."""

    @property
    def definition(self) -> StreamDefinition: ...

    @property
    def directory(self) -> str: ...

    @property
    def parts(self) -> StreamParts: ...

    @property
    def archive(self) -> Path: ...

    def deliverable(self, paths: list[str]) -> list[str]: ...


class SharedQuery:
    """The shared query of one runtime: its members (by ingest directory), the Structured
    Streaming query over their directories, started again when they change, and its batches.
    `max_files`: files one micro-batch lists at most per member stream (as a query of its own
    would list of its directory; over all of them, the oldest first)."""

    def __init__(self, spark: SparkSession, work_dir: Path, bounds: TriggerBounds,
                 max_files: int) -> None:
        self._spark = spark
        self._root = Path(work_dir) / "shared-query"
        self._checkpoint = self._root / "checkpoint"
        self.bounds = bounds
        self._max_files = max_files
        self._lock = threading.RLock()
        self._members: dict[str, Member] = {}
        self._query: StreamingQuery | None = None
        self._glob: str | None = None
        self._pausing = False
        self._closed = False
        self._batch_lock = threading.Lock()
        self._batch_thread: int | None = None
        self._wake = threading.Event()
        self._changed = threading.Condition(self._lock)
        self._dirty = False
        self._applied = threading.Event()
        self._applied.set()
        # the last batch whose results were handed to the route workers (kept across a stop:
        # a batch the stop cut off before its commit is run again, and skipped)
        self._done = self._read_done()
        self._to_archive: dict[int, list[tuple[Path, list[str]]]] = {}
        self._first_batch = True  # the first this process runs (`_archive_committed`)
        self._codegen: str | None = None
        self._steps = JvmSteps()  # the stage's UDF, built once per change of its streams
        self._stage_streams: tuple[StageStream, ...] = ()
        self.last_batch_at: float | None = None
        # when the last completed batch began: Spark had listed its files (`member.health`)
        self.listed_at: float | None = None
        self.started_at: float | None = None
        self.last_error: str | None = None
        self.last_busy = 0
        self.jobs_run = 0  # micro-batches that collected their streams' results (one job each)
        self.stage_builds = 0  # the stage's function built (its streams' plans changed)
        self.staged = 0  # streams' shares of batches matched in the stage
        self.read_again = 0  # ... then read again by Spark's reader (`stage.parse_lines`)
        self.last_interval = bounds.low
        self.last_streams: tuple[str, ...] = ()  # the streams that brought tuples to it
        # per recent batch: seconds held by the adaptive trigger, its streams (`lateness.py`)
        self._notes: dict[int, tuple[float, tuple[str, ...]]] = {}
        self._control = threading.Thread(target=self._run_control, name="xsg-shared-query",
                                         daemon=True)
        self._control.start()

    # ----- members ----------------------------------------------------------------------------
    def join(self, member: Member) -> None:
        """The stream is served from now on (its query starts again with its directory, in a
        moment)."""
        with self._lock:
            self._members[member.directory] = member
            self._request()

    def leave(self, member: Member) -> None:
        """The stream is no longer served: its files of batches not yet committed stay where
        they are (nothing of this query writes under its archive afterwards)."""
        with self._lock:
            if self._members.get(member.directory) is member:
                del self._members[member.directory]
                if not self._closed:
                    self._request()
            for batch_id, moves in self._to_archive.items():
                self._to_archive[batch_id] = [m for m in moves if m[0] != member.archive]

    @contextmanager
    def between_batches(self, timeout: float = 60.0) -> Iterator[None]:
        """Hold the next micro-batch while a member's parts change (its schema grew): the batch
        under way ends first. Raises TimeoutError if it does not end within `timeout` seconds."""
        if self.in_batch_thread():
            raise RuntimeError("a micro-batch cannot wait for its own end")
        if not self._batch_lock.acquire(timeout=timeout):
            raise TimeoutError(f"the shared stream query's micro-batch did not end within "
                               f"{timeout:.0f} s")
        try:
            yield
        finally:
            self._batch_lock.release()

    @property
    def checkpoint_dir(self) -> Path:
        """Spark's checkpoint of the query: every member stream's position."""
        return self._checkpoint

    def members(self) -> int:
        with self._lock:
            return len(self._members)

    def _request(self) -> None:
        self._dirty = True
        self._applied.clear()
        self._changed.notify_all()

    def wait_applied(self, timeout: float = 120.0) -> None:
        """Until the query reads the directories of the members joined so far (at once once
        it is stopped)."""
        if not self._closed:
            self._applied.wait(timeout)

    # ----- the query --------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        query = self._query
        try:
            return query is not None and query.isActive
        except Exception:  # noqa: BLE001 - the session is stopping
            return False

    def active_or_starting(self) -> bool:
        """Running, or being started again for a change of members (not failed, not stopped)."""
        if self._closed:
            return False
        return self.active or not self._applied.is_set()

    @property
    def query_id(self) -> str | None:
        query = self._query
        return str(query.id) if query is not None else None

    @property
    def query_name(self) -> str | None:
        query = self._query
        return str(query.name) if query is not None else None

    def in_batch_thread(self) -> bool:
        return self._batch_thread == threading.get_ident()

    def process_available(self, timeout: float = 120.0) -> None:
        """Every file the members' directories hold now is read and handed to their route
        workers (then drained by the member)."""
        self.wait_applied(timeout)
        query = self._query
        if query is not None and query.isActive:
            query.processAllAvailable()

    def _run_control(self) -> None:
        """Starts the query again when its members changed (after SETTLE seconds of no other
        change) or when it failed while it has members."""
        while True:
            with self._lock:
                while not self._dirty and not self._closed:
                    if not self._changed.wait(RETRY):
                        if self._members and not self.active and self._query is not None:
                            self._dirty = True  # failed: tried again with the same members
                if self._closed:
                    return
            time.sleep(SETTLE)
            with self._lock:
                self._dirty = False
                dirs = sorted(self._members)
            try:
                self._apply(dirs)
            except Exception as exc:  # noqa: BLE001 - tried again at the next change
                self.last_error = described(exc)
                log.error("the shared stream query did not start: %s", described(exc))
            with self._lock:
                if not self._dirty:
                    self._applied.set()

    def _apply(self, dirs: list[str]) -> None:
        glob = glob_path(dirs) if dirs else None
        if glob == self._glob and self.active:
            return
        self._stop_query()
        if glob is None or self._closed:
            self._glob = None
            return
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        # each line with its file: the stage tells the streams apart by its directory
        source = (self._spark.readStream.format("text")
                  .option("maxFilesPerTrigger", str(self._max_files * len(dirs)))
                  .option("ignoreMissingFiles", "true").load(glob)
                  .select(F.col("value").alias(LINE_COLUMN),
                          F.col("_metadata.file_path").alias(PATH_COLUMN)))
        millis = max(1, int(round(self.bounds.low * 1000)))
        self._codegen = None  # a new query clones a new session
        self.started_at = time.time()
        self._query = (foreach_batch(source.writeStream.queryName(
            f"xsg-shared-{uuid.uuid4().hex[:12]}"), self.on_batch)
            .option("checkpointLocation", str(self._checkpoint))
            .trigger(processingTime=f"{millis} milliseconds").start())
        self._glob = glob
        log.info("shared stream query reads %d streams", len(dirs))

    def _stop_query(self) -> None:
        """Between two batches: the batch under way ends first; one starting meanwhile fails
        uncommitted (`on_batch`) and the next query runs it."""
        query = self._query
        if query is None:
            return
        self._pausing = True
        self._wake.set()
        try:
            with self._batch_lock:
                pass
            try:
                query.stop()
            except Exception as exc:  # noqa: BLE001 - stopping must not fail the caller
                log.error("stopping the shared stream query failed: %s", described(exc))
        finally:
            self._pausing = False
            self._wake.clear()

    def stop(self) -> None:
        """Stop the query (the gateway stopping): the members' positions stay in its checkpoint."""
        with self._lock:
            self._closed = True
            self._changed.notify_all()
        self._control.join(timeout=30)
        self._stop_query()
        self._query = None
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            (self._root / "delivered").write_text(str(self._done), encoding="ascii")
        except OSError as exc:
            log.error("shared stream query: its last batch delivered was not written: %s",
                      described(exc))

    def _read_done(self) -> int:
        try:
            return int((self._root / "delivered").read_text(encoding="ascii"))
        except (OSError, ValueError):
            return -1

    # ----- a micro-batch ----------------------------------------------------------------------
    def on_batch(self, batch: DataFrame, batch_id: int) -> None:
        """The foreachBatch: every member's share of the batch in one Spark job. A batch that
        starts, or fails, while the query is being stopped between two batches fails as
        stopped (`_held_for_stop`): never committed, the next query runs it again (a batch whose
        results were handed over is then skipped: `_done`)."""
        query = self._query
        if self._pausing:
            raise self._held_for_stop(query)
        busy, held = 0, False
        with self._batch_lock:
            held = self._pausing
            started = time.perf_counter()
            if not held:
                self._batch_thread = threading.get_ident()
                begun_at = time.time()
                try:
                    busy = self._run(batch, batch_id)
                except Exception as exc:
                    if not self._pausing:
                        self.last_error = described(exc)
                        log.error("shared stream query: micro-batch %s failed: %s", batch_id,
                                  described(exc))
                        raise
                    held = True  # cancelled by the stop
                finally:
                    self._batch_thread = None
                    self.last_batch_at = time.time()
                    self.listed_at = begun_at
            work = time.perf_counter() - started
        if held:
            raise self._held_for_stop(query)
        self.last_busy = busy
        self.last_interval = self.bounds.interval(work, busy)
        pause = self.bounds.pause(work, busy)
        self._note(batch_id, pause)
        if pause > 0:
            self._wake.wait(pause)

    def _note(self, batch_id: int, pause: float) -> None:
        self._notes[batch_id] = (pause, self.last_streams)
        while len(self._notes) > NOTES_KEPT:
            del self._notes[min(self._notes)]

    def held(self, batch_id: int) -> float:
        """Seconds the adaptive trigger held the batch before it returned (in the batch's
        duration as Spark reports it, not its work)."""
        note = self._notes.get(batch_id)
        return note[0] if note is not None else 0.0

    def streams_of(self, batch_id: int) -> tuple[str, ...]:
        """The streams that brought tuples to a recent batch (none: not known any more)."""
        note = self._notes.get(batch_id)
        return note[1] if note is not None else ()

    def _held_for_stop(self, query: StreamingQuery | None) -> Exception:
        deadline = time.monotonic() + STOP_HOLD
        while query is not None and time.monotonic() < deadline:
            try:
                if not query.isActive:
                    return stopped_batch(self._spark, "shared stream query stopped between two "
                                         "micro-batches")
            except Exception:  # noqa: BLE001 - a query gone already: say it came while stopping
                break
            time.sleep(0.01)
        return RuntimeError("shared stream query: a micro-batch came while it was stopping")

    def _run(self, batch: DataFrame, batch_id: int) -> int:
        """The batch's work; returns how many streams brought tuples."""
        begun = time.perf_counter()
        self.last_streams = ()
        self._archive_committed(batch_id)
        with self._lock:
            members = dict(self._members)
        for member in members.values():
            member.parts.runner.began()
        if batch_id <= self._done:
            with self._lock:  # its files move once the batch after it runs, as if delivered now
                self._to_archive.setdefault(batch_id, self._member_files(batch_id))
            return 0  # run again after a restart: handed over in full before the stop
        files = batch_files(self._checkpoint, batch_id)
        by_member: dict[str, list[str]] = {}
        for path in files:
            directory = os.path.dirname(path)
            if directory in members and os.path.exists(path):
                by_member.setdefault(directory, []).append(path)
        session = batch.sparkSession
        staged = self._stage_plans(members) if by_member else {}
        # per stream of the batch: its plan for the stage, or its own jobs (a branch), or none
        work: list[tuple[Member, list[str], StagePlan | None, Branch | None]] = []
        for directory, paths in by_member.items():
            member = members[directory]
            keep = member.deliverable(paths)
            plan = staged.get(directory)
            if not keep or (plan is not None and len(keep) == len(paths)):
                work.append((member, keep, plan if keep else None, None))
                continue
            # its own jobs over the files it keeps: a stream the stage does not serve, or one
            # with files of the batch not delivered (its first handle came after them; the
            # stage reads every line of the batch, and its rows of that stream are left)
            frame = batch_frame(session, member.definition, keep)
            work.append((member, keep, None, plan_branch(member.parts, frame)))
        planned = time.perf_counter()
        use_stage = any(plan is not None for _, _, plan, _ in work)
        results = self._collect(session, batch if use_stage else None,
                                [b for _, _, _, b in work])
        again = [i for i, (_, _, plan, _) in enumerate(work)
                 if plan is not None and needs_again(plan, results)]
        self.staged += sum(1 for w in work if w[2] is not None)
        self.read_again += len(again)
        if again:
            # some line the stage does not read as Spark does: those streams' files of the
            # batch read by Spark's reader, their own jobs (one job more, this batch only)
            for i in again:
                member, keep, _, _ = work[i]
                frame = batch_frame(session, member.definition, keep)
                work[i] = (member, keep, None, plan_branch(member.parts, frame))
                log.info("stream %s: micro-batch %s read again by Spark's reader (a line in "
                         "a form the shared stage does not parse)", member.definition.name,
                         batch_id)
            more = self._collect(session, None, [work[i][3] if i in again else None
                                                 for i in range(len(work))])
            results.update(more)  # tagged by their places in `work`: the stage's were not
        spark_s = time.perf_counter() - planned
        archive: list[tuple[Path, list[str]]] = []
        for i, (member, _, plan, branch) in enumerate(work):
            route: Route | None = None
            if plan is not None:
                route = stage_finish(member.parts, plan, stage_rows(plan, results))
            elif branch is not None:
                own = {tag: unpack_blobs(results[f"{i}/{tag}"]) for tag, _, _ in branch.frames
                       if f"{i}/{tag}" in results}
                route = branch.finish(own)
            try:
                member.parts.runner.route_later(batch_id, route, spark_s)
            except RoutingFailed as exc:
                # its batch before this one failed to route: that stream's, not the others'
                member.parts.figures.failed(exc)
                log.warning("stream %s: %s", member.definition.name, str(exc))  # no data
            archive.append((member.archive, by_member[member.directory]))
        with self._lock:
            # not for a stream that left meanwhile (deleted: nothing may write under its archive)
            archive = [a for a in archive
                       if any(m.archive == a[0] for m in self._members.values())]
            self._to_archive[batch_id] = archive
        self._done = batch_id
        self.last_streams = tuple(members[d].definition.name for d in by_member)
        log.debug("shared batch %s: %d files of %d streams (%d in the stage), plan %.3f s, "
                  "job %.3f s, handed over %.3f s", batch_id, len(files), len(by_member),
                  sum(1 for w in work if w[2] is not None), planned - begun, spark_s,
                  time.perf_counter() - planned - spark_s)
        return len(by_member)

    def _stage_plans(self, members: dict[str, Member]) -> dict[str, StagePlan]:
        """Every member's plan for the stage (by directory), the streams whose plans the stage
        can run; the stage's function covers all of them, busy or not, so that it is built
        again only when their plans change, not when another set of them is busy."""
        plans: dict[str, StagePlan] = {}
        for k, directory in enumerate(sorted(members)):
            plan = stage_plan(members[directory].parts, directory, f"s{k}")
            if plan is not None:
                plans[directory] = plan
        streams = tuple(p.stream for p in plans.values())
        known = self._stage_streams
        if len(streams) != len(known) or any(a is not b for a, b in zip(streams, known,
                                                                           strict=True)):
            self._stage_streams = streams
        return plans

    def _collect(self, session: Any, batch: DataFrame | None,
                 branches: list[Branch | None]) -> dict[str, list[bytes]]:
        """The stage over `batch` (when given) and every branch's frames, packed and collected
        in one job: their IPC streams by tag, read by whoever needs them (`arrow_ipc`)."""
        packed: list[DataFrame] = []
        if batch is not None:
            streams = self._stage_streams

            def build() -> Callable[..., Any]:
                self.stage_builds += 1
                return stage_function(streams)
            packed.append(self._steps.map_in_arrow(batch, "stage", streams, build, PACKED,
                                                   [LINE_COLUMN, PATH_COLUMN]))
        plan_table = False
        for i, branch in enumerate(branches):
            if branch is None:
                continue
            plan_table = plan_table or branch.plan_table
            for tag, frame, before in branch.frames:
                pack = (summary_packer(f"{i}/{tag}", SEQ_COLUMN) if tag == FIGURES
                        else packer(f"{i}/{tag}", before))
                packed.append(frame.mapInArrow(pack, PACKED_SCHEMA))
        if not packed:
            return {}
        if self._codegen is None and not session._jsparkSession.equals(
                self._spark._jsparkSession):
            # the query's own session (its first batch; the next batches are planned in it):
            # a batch's many small files read by as few tasks as the cores, not one task per
            # ~32 files (Spark counts each file as OPEN_COST bytes more, 4 MiB by default); each
            # task of the stage costs a Python worker's round (~20-50 ms here)
            session.conf.set("spark.sql.files.openCostInBytes", str(OPEN_COST))
        # as on a stream's own query: generated code off while the plan table is read (its
        # lambdas fall back to interpretation, copying the table per row inside it)
        codegen = "false" if plan_table else "true"
        if codegen != self._codegen:
            if not session._jsparkSession.equals(self._spark._jsparkSession):
                session.conf.set("spark.sql.codegen.wholeStage", codegen)
            self._codegen = codegen
        union = functools.reduce(DataFrame.unionAll, packed)
        self.jobs_run += 1
        return packed_blobs(self._steps.to_arrow(union, PACKED))

    def _archive_committed(self, batch_id: int) -> None:
        """Batches before `batch_id` are committed (Spark runs a batch once the one before it
        committed): their files move to their streams' archives. The first batch this process
        runs also moves those of the batch before it, committed before the gateway stopped
        (their move was due at a batch that did not come there)."""
        with self._lock:
            if self._first_batch:
                self._first_batch = False
                if batch_id > 0 and batch_id - 1 not in self._to_archive:
                    self._to_archive[batch_id - 1] = self._member_files(batch_id - 1)
            moves = [self._to_archive.pop(b) for b in sorted(self._to_archive) if b < batch_id]
            for batch_moves in moves:
                for archive, paths in batch_moves:
                    archive_files(paths, archive)

    def _member_files(self, batch_id: int) -> list[tuple[Path, list[str]]]:
        """A logged batch's files of the streams served now, by their archives (none when
        its logs are gone: its files then stay where they are)."""
        try:
            files = batch_files(self._checkpoint, batch_id)
        except (OSError, ValueError):
            return []
        by_dir: dict[str, list[str]] = {}
        for path in files:
            directory = os.path.dirname(path)
            if directory in self._members:
                by_dir.setdefault(directory, []).append(path)
        return [(self._members[d].archive, paths) for d, paths in by_dir.items()]

    def health(self) -> dict[str, Any]:
        return {"active": self.active, "last_batch_at": self.last_batch_at,
                "started_at": self.started_at, "last_error": self.last_error,
                "members": self.members(), "busy": self.last_busy,
                "interval": self.last_interval}


__all__ = ["Member", "SharedQuery"]
