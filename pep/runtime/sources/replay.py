"""What a Kafka stream's query read in each micro-batch, from its checkpoint, and which of those
batches a restart can read again (issue 41, item 3).

Spark writes a micro-batch's end offsets to `<checkpoint>/offsets/<batch>` before it runs it,
and the offsets the query started from to `<checkpoint>/sources/0/0`; micro-batch b read
[end of b - 1, end of b) of every partition. A batch that Spark committed (`commits/<batch>`)
is not run again at a restart, and the rows it gave the handles died with the process if their
readers had not read them. Kafka keeps the records, and a replayable plan's rows of a batch
depend on that batch's records alone (`pep.core.plan.replayable`), in the batch's own order:
so the restart reads those ranges again (`query/kafka_replay.py`) and hands each handle the
same rows under the same ids (`pep.handles.buffer`, positioned buffers). Only batches whose
every record the topic still holds are read again (retention may have removed older ones), and
only those whose start Spark's log still names (it keeps the last 100 by default).

No Spark here: files, offsets and numpy.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

log = logging.getLogger(__name__)

Offsets = dict[int, int]  # partition -> offset


@dataclass(frozen=True)
class BatchRange:
    """The records micro-batch `batch` read: per partition [start, end)."""

    batch: int
    start: Offsets
    end: Offsets


def _read_offsets(path: Path, topic: str) -> Offsets | None:
    """The topic's offsets in one of Spark's offset files ("v1", then JSON lines; the last one
    holds {topic: {partition: offset}}); None when the file is not there or not readable."""
    try:
        text = path.read_bytes().lstrip(b"\x00").decode("utf-8")
    except OSError:
        return None
    for line in reversed(text.splitlines()[1:]):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get(topic), dict):
            try:
                return {int(p): int(o) for p, o in doc[topic].items()}
            except (TypeError, ValueError):
                return None
    return None


def _batch_ids(directory: Path) -> list[int]:
    try:
        return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    except OSError:
        return []


def last_committed(location: Path) -> int:
    """The last micro-batch Spark committed in this checkpoint (-1: none)."""
    ids = _batch_ids(Path(location) / "commits")
    return ids[-1] if ids else -1


def planned_batches(location: Path) -> list[int]:
    """The micro-batches whose offsets Spark wrote (planned; the last may not have run)."""
    return _batch_ids(Path(location) / "offsets")


def batch_start(location: Path, topic: str, batch: int) -> Offsets | None:
    """Where micro-batch `batch` starts reading (the end of the one before, or the query's
    starting offsets for batch 0); None when the checkpoint does not say."""
    location = Path(location)
    if batch > 0:
        return _read_offsets(location / "offsets" / str(batch - 1), topic)
    return _read_offsets(location / "sources" / "0" / "0", topic)


def batch_ranges(location: Path, topic: str, upto: int) -> list[BatchRange]:
    """The ranges of the consecutive micro-batches ending with `upto` whose start and end the
    checkpoint still names (the oldest first; [] when `upto`'s are not known)."""
    location = Path(location)
    ranges: list[BatchRange] = []
    end = _read_offsets(location / "offsets" / str(upto), topic)
    batch = upto
    while end is not None and batch >= 0:
        start = (_read_offsets(location / "offsets" / str(batch - 1), topic) if batch > 0
                 else _read_offsets(location / "sources" / "0" / "0", topic))
        if start is None:
            break
        ranges.append(BatchRange(batch, start, end))
        batch, end = batch - 1, start
    ranges.reverse()
    return ranges


def still_held(ranges: list[BatchRange], earliest: Offsets) -> list[BatchRange]:
    """The newest consecutive ranges whose every record the topic still holds (`earliest`: the
    partitions' first offsets now)."""
    kept: list[BatchRange] = []
    for r in reversed(ranges):
        if any(o < earliest.get(p, 0) and r.end.get(p, o) > o for p, o in r.start.items()):
            break
        kept.append(r)
    kept.reverse()
    return kept


def covers(cut: tuple[int, ...], start: Offsets) -> bool:
    """A handle cut at `cut` has no record before `start` (every one of its records is read
    from `start` on): per partition, its first offset is at or after the start."""
    return all((cut[p] if p < len(cut) else 0) >= o for p, o in start.items())


def batch_of(partitions: np.ndarray, offsets: np.ndarray, ranges: list[BatchRange]
             ) -> np.ndarray:
    """Each record's micro-batch among `ranges` (consecutive, oldest first); -1 for a record
    in none of them."""
    out = np.full(len(partitions), -1, dtype=np.int64)
    if not ranges or not len(partitions):
        return out
    for p in np.unique(partitions):
        mine = partitions == p
        ends = np.array([r.end.get(int(p), r.start.get(int(p), 0)) for r in ranges],
                        dtype=np.int64)
        first = ranges[0].start.get(int(p), 0)
        at = np.searchsorted(ends, offsets[mine], side="right")
        inside = (offsets[mine] >= first) & (at < len(ranges))
        ids = np.array([r.batch for r in ranges], dtype=np.int64)
        out[np.flatnonzero(mine)[inside]] = ids[at[inside]]
    return out


def split_by_batch(table: pa.Table, batches: np.ndarray, ranges: list[BatchRange]
                   ) -> list[tuple[int, pa.Table]]:
    """The rows of `table` (in its order) per micro-batch of `ranges`, oldest first (a batch
    without a row: an empty table)."""
    out = []
    for r in ranges:
        take = np.flatnonzero(batches == r.batch)
        out.append((r.batch, table.take(pa.array(take, pa.int64()))))
    return out


def offsets_json(topic: str, offsets: Offsets) -> str:
    """Offsets as Spark's Kafka source takes them (`startingOffsets`, `endingOffsets`)."""
    return json.dumps({topic: {str(p): int(o) for p, o in sorted(offsets.items())}})


__all__ = ["BatchRange", "Offsets", "batch_ranges", "batch_of", "batch_start", "covers",
           "last_committed",
           "offsets_json", "planned_batches", "split_by_batch", "still_held"]
