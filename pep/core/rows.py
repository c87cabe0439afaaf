"""Result rows as they travel from the runtime to the handles: encoded once, shared by all.

Per micro-batch, each distinct plan's output becomes one `RowBatch`: its rows already encoded as
JSON text (one object per row, in stream order). Every handle with that plan receives the same
object, and a handle's buffer keeps the texts as they are, so a row is encoded once however many
handles read it, and readers write the texts out without touching them.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal


@dataclass(frozen=True)
class RowBatch:
    """One plan's rows of one micro-batch, as JSON texts.

    `last_position` is the highest stream position (`_xsg_seq`) among the tuples these rows were
    computed from, when the source has positions: what a handle has seen of the stream.
    `batch`: the micro-batch of the stream's query they come from (Kafka streams: a positioned
    buffer names its rows by it, `pep.handles.buffer`). `resumed_from`: set on the first
    delivery to a handle after a restart (it may have no row): the handle's rows of micro-
    batches from this one on follow; those of earlier ones that its readers had not read died
    with the process (0: none did)."""

    rows: tuple[str, ...]
    nbytes: int
    last_position: int | None = None
    batch: int | None = None
    resumed_from: int | None = None

    @classmethod
    def of_texts(cls, texts: Sequence[str], last_position: int | None = None) -> RowBatch:
        texts = tuple(texts)
        size = sum(len(t) if t.isascii() else len(t.encode("utf-8")) for t in texts)
        return cls(texts, size, last_position)

    @classmethod
    def of(cls, rows: Iterable[Mapping[str, object]], last_position: int | None = None
           ) -> RowBatch:
        """Encode plain rows (dicts) with `row_json`."""
        return cls.of_texts([row_json(r) for r in rows], last_position)

    def __len__(self) -> int:
        return len(self.rows)


def _json_default(value: object) -> object:
    """What `json.dumps` writes for a value it has no form of: a result row's value as the
    runtime delivers it (datetimes, decimals, numpy and pandas scalars, collections)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if hasattr(value, "item"):  # numpy / pandas scalars
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def row_json(row: Mapping[str, object]) -> str:
    """A result row as compact JSON; NaN and infinities (e.g. avg of nothing) become null."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in row.items()}
    return json.dumps(clean, separators=(",", ":"), default=_json_default, allow_nan=False)


__all__ = ["RowBatch", "row_json"]
