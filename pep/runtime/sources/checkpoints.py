"""Where each stream's query keeps its progress, and how long ingested files are kept.

Layout under the runtime's work directory:
  checkpoints/<stream>/state.json   the source it belongs to (a fingerprint) and whether its
                                    query stopped with handles attached ("running": the next
                                    start continues where it stopped) or without ("idle": the
                                    next first handle starts at the stream's current end)
  checkpoints/<stream>/query/       Spark's checkpoint location (offsets, commits, source log)
  archive/<stream>/...              ingested files the query has committed (Spark's file source
                                    moves them there: `cleanSource=archive`), until retention
                                    removes them
Sources that Spark cannot resume (generator, socket) get a fresh checkpoint per start, removed
when the query stops.

Retention (`Retention`) removes archived files older than `max_age` seconds, then the oldest
while the archive holds more than `max_bytes`. Only the archive is touched: a file in the
ingest directory has not been committed (or is the last committed batch, which Spark archives
when the next batch starts), so nothing the query still needs is ever removed.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import described
from pep.core.plan import StreamDefinition
from pep.runtime.sources.replay import planned_batches

if TYPE_CHECKING:  # the module loads no Spark itself
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

RESUMABLE_KINDS = ("ingest", "files", "kafka")
DEFAULT_RETENTION_SECONDS = 3600.0
DEFAULT_RETENTION_BYTES = 1 << 30


def fingerprint(definition: StreamDefinition) -> str:
    """What a checkpoint is valid for: the stream's source and schema."""
    doc = {"source": [definition.source.kind, sorted(definition.source.options)],
           "schema": [[f.name, f.type] for f in definition.schema.fields]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


@dataclass
class StreamCheckpoint:
    """One stream's checkpoint directory and its state file."""

    root: Path  # checkpoints/<stream>
    definition: StreamDefinition
    temporary: bool

    @classmethod
    def for_stream(cls, work_dir: Path, definition: StreamDefinition) -> StreamCheckpoint:
        base = Path(work_dir) / "checkpoints" / definition.name
        if definition.source.kind not in RESUMABLE_KINDS:
            return cls(base / f"tmp-{uuid.uuid4().hex}", definition, True)
        return cls(base, definition, False)

    @property
    def location(self) -> Path:
        return self.root / "query"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    def _read(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self.state_file.read_text())
            return state
        except (OSError, ValueError):
            return {}

    def _write(self, **fields: object) -> None:
        doc = self._read()
        doc.update(fields)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".state-{uuid.uuid4().hex}.tmp"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.state_file)

    def prepare(self, query_dir: Path | None = None) -> bool:
        """Make the directory ready for a start; True when the query must first skip to the
        stream's current end (no usable checkpoint, or the last handle had left). `query_dir`:
        the Spark checkpoint that holds the stream's position when it is not `location` (the
        shared query's, `pep/runtime/shared/`)."""
        if self.temporary:
            self.location.mkdir(parents=True, exist_ok=True)
            return False
        state = self._read()
        fp = fingerprint(self.definition)
        if state.get("fingerprint") != fp:
            if self.root.exists():
                log.info("stream %s: its source changed; starting a new checkpoint",
                         self.definition.name)
                shutil.rmtree(self.location, ignore_errors=True)
            self._write(fingerprint=fp, state="new")
            return True
        running = state.get("state") == "running"
        if self.definition.source.kind == "kafka":
            # a query that stopped with handles (or was killed) resumes, even before its first
            # micro-batch: its starting offsets are in sources/; a first handle starts at the
            # latest offsets, whatever an old checkpoint says
            if running and (self.location / "sources").is_dir():
                offsets = self.location / "offsets"
                if offsets.is_dir() and not planned_batches(self.location):
                    # stopped while writing its first batch's offsets: only a temporary file,
                    # which Spark refuses to start batch 0 on; the starting offsets stay
                    shutil.rmtree(offsets, ignore_errors=True)
                return False
            self._drop_kafka_query()
            return True
        if not ((query_dir or self.location) / "offsets").is_dir():
            return True
        return not running



    def adopt(self, previous: StreamDefinition) -> bool:
        """The stream's definition changed in a way its checkpoint survives (attributes added):
        if the checkpoint belongs to `previous`, make it this definition's, keeping its state
        (a restarted query then continues where the old one stopped). True when adopted."""
        if self.temporary or self._read().get("fingerprint") != fingerprint(previous):
            return False
        self._write(fingerprint=fingerprint(self.definition))
        return True

    def mark_running(self) -> None:
        if not self.temporary:
            self._write(state="running", since=time.time())

    def mark_idle(self) -> None:
        """The last handle left: the next first handle starts at the stream's current end."""
        if self.temporary:
            shutil.rmtree(self.root, ignore_errors=True)
        elif self.definition.source.kind == "kafka":
            # a fresh Kafka query starts at the latest offsets (unless told otherwise)
            self._drop_kafka_query()
            self._write(state="idle", since=time.time())
        else:
            self._write(state="idle", since=time.time())

    def batch_base(self) -> int:
        """What a Kafka stream's micro-batch ids are counted from: Spark numbers a new query's
        batches from 0, and a positioned handle's event ids (`pep.handles.buffer`) come from
        them, so each new query of the stream counts on from where the last one stopped."""
        value = self._read().get("batch_base", 0)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def _drop_kafka_query(self) -> None:
        """Remove a Kafka query's checkpoint; the next one's batches count on after its, and
        the batch its last stop had delivered is forgotten (the next query numbers its own
        batches from 0: a batch of it under that number is no re-run to skip)."""
        planned = planned_batches(self.location)  # ascending
        shutil.rmtree(self.location, ignore_errors=True)
        self._write(batch_base=self.batch_base() + (planned[-1] + 1 if planned else 0),
                    delivered_batch=-1)

    def release(self, delivered_batch: int = -1) -> None:
        """The query stopped with handles attached (gateway stopping): keep it resumable.
        `delivered_batch`: the last batch whose every row was delivered; the stop may have cut
        off its commit, and the next query runs it again under the same id: it is skipped."""
        if self.temporary:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            self._write(delivered_batch=int(delivered_batch))

    def delivered_batch(self) -> int:
        """The last batch delivered in full before the query stopped (-1: none known). Only
        meaningful when the query resumes this checkpoint (`prepare` returned False)."""
        value = self._read().get("delivered_batch", -1)
        return value if isinstance(value, int) and not isinstance(value, bool) else -1


def await_kafka_offsets(location: Path, kafka_sources: int, query: StreamingQuery,
                        timeout: float = 30.0
                        ) -> bool:
    """Wait until a query's Kafka sources have fixed the offsets they start from (Spark writes
    them to `<checkpoint>/sources/<i>/0` at the query's first trigger; a file source writes
    nothing there before its first files), so that every record produced after this is read.
    Bounded: a query that cannot reach its broker goes on trying; False then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for _ in Path(location).glob("sources/*/0")) >= kafka_sources:
            return True
        if query is None or not query.isActive:
            return False
        time.sleep(0.02)
    return False


def archive_dir(work_dir: Path, definition: StreamDefinition) -> Path:
    return Path(work_dir) / "archive" / definition.name


@dataclass
class Retention:
    """Archived ingest files older than `max_age` seconds go, then the oldest beyond
    `max_bytes` (None: no such bound)."""

    max_age: float | None = DEFAULT_RETENTION_SECONDS
    max_bytes: int | None = DEFAULT_RETENTION_BYTES

    def sweep(self, root: Path, now: float | None = None) -> tuple[int, int]:
        """Apply the bounds to every file under `root`; returns (files removed, bytes freed)."""
        if not root.is_dir():
            return 0, 0
        now = time.time() if now is None else now
        files = []
        for dirpath, _, names in os.walk(root):
            for name in names:
                path = os.path.join(dirpath, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                files.append((st.st_mtime, st.st_size, path))
        files.sort()
        total = sum(f[1] for f in files)
        removed = freed = 0
        for mtime, size, path in files:
            too_old = self.max_age is not None and now - mtime > self.max_age
            too_big = self.max_bytes is not None and total > self.max_bytes
            if not (too_old or too_big):
                break  # sorted by age: the rest are younger and fit
            try:
                os.remove(path)
            except OSError:
                continue
            removed += 1
            freed += size
            total -= size
        if removed:
            _prune_empty_dirs(root)
        return removed, freed


def _prune_empty_dirs(root: Path) -> None:
    for dirpath, _, _ in os.walk(root, topdown=False):
        if dirpath != str(root):
            try:
                os.rmdir(dirpath)  # only succeeds when empty
            except OSError:
                pass


class Janitor(threading.Thread):
    """Runs `tick()` every `interval` seconds until stopped (retention sweeps, stall checks)."""

    def __init__(self, tick: Callable[[], None], interval: float) -> None:
        super().__init__(name="xsg-runtime-janitor", daemon=True)
        self._tick = tick
        self.interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 - a janitor must keep going
                log.error("runtime janitor tick failed: %s", described(exc))

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=10)


__all__ = ["StreamCheckpoint", "Retention", "Janitor", "archive_dir", "await_kafka_offsets",
           "fingerprint",
           "DEFAULT_RETENTION_SECONDS", "DEFAULT_RETENTION_BYTES"]
