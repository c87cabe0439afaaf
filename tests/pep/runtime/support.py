"""Helpers shared by the runtime tests: a recording deliver callback, atomic file writes,
polling."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path


class Collector:
    """A deliver callback that records what it got (and can close itself): the RowBatches as
    they came, and their rows decoded from JSON."""

    def __init__(self, close_after: int | None = None) -> None:
        self.rows: list[dict] = []
        self.batches: list = []
        self.calls = 0
        self.close_after = close_after

    def __call__(self, batch) -> bool:
        self.calls += 1
        self.batches.append(batch)
        texts = batch.rows if hasattr(batch, "rows") else [json.dumps(r) for r in batch]
        self.rows.extend(json.loads(t) for t in texts)
        return self.close_after is None or self.calls < self.close_after


def write_jsonl(directory: Path, name: str, records: list[dict]) -> None:
    """Write a file atomically (temp name, then rename), as the gateway's ingest does."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, directory / name)


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


# -- a test that runs in both modes (the `query_mode` fixture, tests/conftest.py) ---------------

def query_checkpoint(work: Path, stream: str, mode: str) -> Path:
    """Spark's checkpoint that keeps an ingest stream's position: its own query's, or the
    shared query's (`pep/runtime/shared/`)."""
    if mode == "shared":
        return work / "shared-query" / "checkpoint"
    return work / "checkpoints" / stream / "query"


def stop_gate(runtime, stream: str, mode: str):
    """What lets a stream's micro-batches in and holds them while its query stops (`_pausing`,
    `_query`): its own query's life cycle, or the shared query."""
    return runtime._shared if mode == "shared" else runtime._executors[stream].lifecycle


def query_run(spark, runtime, stream: str) -> str:
    """The run id of the Structured Streaming query serving the stream (a new one each time
    the query starts again on its checkpoint)."""
    return str(spark.streams.get(runtime.query_id(stream)).runId)


def files_in_one_clock_tick(monkeypatch, stamp_ns: int = 1_700_000_000_123_000_000) -> None:
    """Every ingest file written from now on gets the same modification time, as files
    written within one tick of the kernel's clock (or after it was set back) do: set when its
    data is on disk (`os.fsync` of the ingest's `.incoming-*` file), where the kernel sets it.
    Spark's file source orders files by that time, then in listing order (ext4: hash order)."""
    real = os.fsync

    def fsync(fd: int) -> None:
        real(fd)
        try:
            name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return
        if name.startswith(".incoming-"):
            os.utime(fd, ns=(stamp_ns, stamp_ns))
    monkeypatch.setattr(os, "fsync", fsync)
