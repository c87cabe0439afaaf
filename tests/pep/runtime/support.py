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
