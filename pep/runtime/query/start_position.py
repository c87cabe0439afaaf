"""Where a stream's first handle starts: at the end of its source. The files present when the
query starts on a new checkpoint are never delivered: dropped from its first batch when that
batch lists them all, moved to the archive (an `ingest` stream's own directory), or marked
processed by a one-batch query that reads none of them (`skip_to_end`).
"""
from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path

from pyspark.sql import SparkSession

from common.errors import described
from common.numbers import NumberError, parse_int
from pep.core.plan import StreamDefinition
from pep.runtime.sources.frames import build_source, local_dir

log = logging.getLogger(__name__)


def source_path(definition: StreamDefinition) -> str | None:
    """The local directory a file source reads (None: not a file source)."""
    path = definition.source.option("path")
    return local_dir(path) if path else None


def source_files(definition: StreamDefinition) -> list[os.DirEntry[str]]:
    """The files now in the source's directory (none for other sources)."""
    path = source_path(definition)
    if not path:
        return []
    try:
        with os.scandir(path) as it:
            return [e for e in it if e.name[:1] not in (".", "_") and e.is_file()]
    except OSError:
        return []


def files_per_trigger(definition: StreamDefinition, default: int) -> int:
    """How many files a micro-batch lists: the stream's own `maxFilesPerTrigger`, else
    `default` (the runtime's)."""
    own = definition.source.option("maxFilesPerTrigger")
    try:
        return parse_int(str(own), "maxFilesPerTrigger", low=1, high=1_000_000)
    except NumberError:  # unset (or refused at registration)
        return default


def archive_present(definition: StreamDefinition, names: list[str], archive: Path) -> None:
    """An `ingest` stream's directory is the gateway's own: files present when a first handle
    starts the query (more than its first batch would list) are moved to the archive, where
    retention removes them, instead of a Spark query that marks them processed (measured
    0.3-0.5 s of the request that starts the stream)."""
    started = time.perf_counter()
    source = Path(source_path(definition) or "")
    target = archive / "not-delivered"
    target.mkdir(parents=True, exist_ok=True)
    moved = 0
    for name in names:
        try:
            os.replace(source / name, target / name)
            moved += 1
        except FileNotFoundError:
            continue
    log.info("stream %s: started at the end of its source, %d files archived (%.3f s)",
             definition.name, moved, time.perf_counter() - started)


def skip_to_end(spark: SparkSession, definition: StreamDefinition, checkpoint: Path,
                archive: str | None) -> None:
    """Mark every file now in the source directory as processed, without reading one: a
    one-batch query (availableNow) whose foreachBatch does nothing commits them to the
    checkpoint at `checkpoint`; the real query then continues after them. Tuples ingested
    before a stream's first handle are not delivered."""
    frame = build_source(spark, definition, None, archive)
    started = time.perf_counter()
    for attempt in (1, 2):
        query = (frame.writeStream.queryName(f"xsg-skip-{uuid.uuid4().hex[:12]}")
                 .foreachBatch(lambda df, batch_id: None)
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(120)
            failure = query.exception()
            if failure is None:
                break
            raise failure
        except Exception as exc:  # noqa: BLE001 - tried again, then raised by its kinds
            query.stop()
            if attempt == 2:
                # its kinds, not its text: Spark's message can quote a row (common/errors.py)
                raise RuntimeError(f"stream {definition.name}: skipping to the end failed: "
                                   f"{described(exc)}") from None
            log.warning("stream %s: skipping to the end failed (%s); starting a new "
                        "checkpoint", definition.name, described(exc))
            shutil.rmtree(checkpoint, ignore_errors=True)
    log.info("stream %s: started at the end of its source (%.2f s)", definition.name,
             time.perf_counter() - started)


__all__ = ["source_path", "source_files", "files_per_trigger", "archive_present",
           "skip_to_end"]
