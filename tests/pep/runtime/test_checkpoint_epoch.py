"""The epoch of plan topics' keys (`QueryLifecycle.checkpoint_id`, `m:<epoch>:<batch>:<i>`) is
the query's checkpoint's id. A checkpoint deleted and created again at the same path (a Kafka
query dropped when its last handle left, a source changed) is a new one whose batches are
numbered from 0 again: keyed under the old epoch, an edge would skip them as repeats of batches
it read (issue 45). The metadata file is written as Spark writes it (`{"id": ...}`)."""
from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

from pep.runtime.query.lifecycle import QueryLifecycle
from pep.runtime.sources.checkpoints import StreamCheckpoint


def _new_checkpoint(location: Path) -> str:
    """A checkpoint's `metadata` as Spark writes it at a query's start; its id."""
    ident = str(uuid.uuid4())
    location.mkdir(parents=True, exist_ok=True)
    (location / "metadata").write_text(json.dumps({"id": ident}) + "\n", encoding="utf-8")
    return ident.replace("-", "")[:12]


def test_the_epoch_follows_a_checkpoint_created_again_at_the_same_path(tmp_path: Path) -> None:
    nothing: Any = None
    lifecycle = QueryLifecycle(nothing, nothing, nothing, nothing, nothing, nothing,
                               lambda: None)
    assert lifecycle.checkpoint_id() == "0"  # no checkpoint yet
    checkpoint = StreamCheckpoint(tmp_path / "s", nothing, False)
    lifecycle._checkpoint = checkpoint  # as `start` sets it
    assert lifecycle.checkpoint_id() == "0"  # before the query's first trigger
    first = _new_checkpoint(checkpoint.location)
    assert lifecycle.checkpoint_id() == first
    assert lifecycle.checkpoint_id() == first  # cached: the same file
    shutil.rmtree(checkpoint.location)
    second = _new_checkpoint(checkpoint.location)
    assert second != first
    assert lifecycle.checkpoint_id() == second
