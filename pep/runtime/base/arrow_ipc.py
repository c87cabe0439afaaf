"""Results of different schemas in one Spark job: each travels as Arrow IPC bytes.

The shared query (`pep/runtime/shared/`) evaluates the plans of several streams in one job:
each stream's jobs are DataFrames of their own schema (its projected attributes, plan ids or
bitmaps, pane partials), which Spark cannot union as they are. Each is packed on the workers
(`DataFrame.mapInArrow` with `packer(tag)`) into rows of one common schema, `PACKED_SCHEMA`:
its tag and an Arrow IPC stream of what the task computed, in Spark's own Arrow types. The
union of those is collected once (`toArrow`), and `unpack` gives each tag its table back, the
tasks' pieces in the order Spark returned them (the order a `toArrow` of that DataFrame alone
gives). No Spark import: the packer runs on the workers, and travels there by value.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

TAG_COLUMN = "tag"
IPC_COLUMN = "ipc"
PACKED_SCHEMA = f"{TAG_COLUMN} string, {IPC_COLUMN} binary"

Packer = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def packer(tag: str, before: Packer | None = None) -> Packer:
    """A `mapInArrow` function: a task's record batches as one row (`tag`, their IPC stream),
    after `before` (another `mapInArrow` function, run in the same Python stage). A task with
    no batch yields nothing."""
    def pack(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        sink: pa.BufferOutputStream | None = None
        writer: pa.RecordBatchStreamWriter | None = None
        for batch in (before(batches) if before is not None else batches):
            if writer is None:
                sink = pa.BufferOutputStream()
                writer = pa.ipc.new_stream(sink, batch.schema)
            writer.write_batch(batch)
        if writer is None or sink is None:
            return
        writer.close()
        yield pa.RecordBatch.from_arrays(
            [pa.array([tag], pa.string()), pa.array([sink.getvalue().to_pybytes()],
                                                    pa.binary())],
            names=[TAG_COLUMN, IPC_COLUMN])
    return pack


def summary_packer(tag: str, column: str) -> Packer:
    """A `mapInArrow` function over a frame of `column` (64-bit integers): a task's count of
    rows and the largest value among them (null: none), packed as one row of `tag`. A
    stream's figures without an aggregate (which would be a shuffle, and a job of its own)."""
    def summarise(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows, top = 0, None
        for batch in batches:
            rows += batch.num_rows
            values = batch.column(batch.schema.get_field_index(column))
            if values.null_count < len(values):
                best = pc.max(values).as_py()
                top = best if top is None else max(top, best)
        summary = pa.record_batch([pa.array([rows], pa.int64()), pa.array([top], pa.int64())],
                                  names=["rows", "seq"])
        yield from packer(tag)(iter([summary]))
    return summarise


def unpack(packed: pa.Table) -> dict[str, pa.Table]:
    """The collected union of packed frames, as one table per tag (tags whose tasks computed
    nothing are absent)."""
    return {tag: unpack_blobs(blobs) for tag, blobs in packed_blobs(packed).items()}


def packed_blobs(packed: pa.Table) -> dict[str, list[bytes]]:
    """The collected union's IPC streams by tag, not read yet (`unpack_blobs` reads a tag's):
    whoever needs a tag's table reads it, on its own thread."""
    pieces: dict[str, list[bytes]] = {}
    for tag, blob in zip(packed.column(TAG_COLUMN).to_pylist(),
                         packed.column(IPC_COLUMN).to_pylist(), strict=True):
        pieces.setdefault(str(tag), []).append(blob)
    return pieces


def unpack_blobs(blobs: list[bytes]) -> pa.Table:
    """One tag's IPC streams (the tasks' pieces, in the order Spark returned them) as one
    table."""
    tables = []
    for blob in blobs:
        with pa.ipc.open_stream(pa.py_buffer(blob)) as reader:
            tables.append(reader.read_all())
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


__all__ = ["IPC_COLUMN", "PACKED_SCHEMA", "Packer", "TAG_COLUMN", "packed_blobs", "packer",
           "summary_packer", "unpack", "unpack_blobs"]
