"""A union of grants on the driver: the plain members' rows merged per tuple, window rows tagged.

A union handle's members are ordinary plans of the stream's shared query (rows of the plan
table, shared with any identical plan of another handle), so Spark evaluates them exactly as it
evaluates every plan: the rows job returns each tuple once, with the ids of the plans it passed.
Here, per micro-batch and union, with numpy and Arrow over whole columns (no Python per tuple):

- each row gets a bit mask of the union's plain members it passed (`member_masks`);
- rows are grouped by mask; each distinct mask is one projection, the attributes of every
  member in it (schema order), encoded once for its rows (`merged_rows`);
- the texts are put back in stream order.

A windowed member's windows are its own (computed as any window plan's); its rows reach the
union's handles with `"grant": i` first in each object (`tag_rows`), i being the member's index.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pep.core.rows import RowBatch

Encode = Callable[[pa.Table], "tuple[list[str], np.ndarray]"]


def member_masks(num_rows: int, row_ids: np.ndarray, bounds: dict[int, tuple[int, int]],
                 members: Sequence[tuple[int, int]]) -> np.ndarray:
    """Per row of the batch, the bits of the members (bit, plan id) whose filter it passed.
    `row_ids[lo:hi]` are the rows of the plan whose `bounds` are (lo, hi)."""
    mask = np.zeros(num_rows, dtype=np.uint64)
    for bit, plan_id in members:
        span = bounds.get(plan_id)
        if span is not None:
            mask[row_ids[span[0]:span[1]]] |= np.uint64(1 << bit)
    return mask


def merged_rows(arrow: pa.Table, mask: np.ndarray, projections: dict[int, tuple[str, ...]],
                order: Sequence[str], encode: Encode, seqs: np.ndarray,
                no_seq: int, hidden: Mapping[int, frozenset[str]] | None = None
                ) -> RowBatch | None:
    """The rows any member passed, each once, with the attributes of every member it passed
    (`projections`: bit -> that member's projection), in stream order (the table's).
    `hidden`: rows (of the table) whose attributes security punctuations hide: null in them,
    replaced before encoding."""
    rows = np.nonzero(mask)[0]
    if not len(rows):
        return None
    masks = mask[rows]
    kinds: dict[frozenset[str], int] = {frozenset(): 0}
    if hidden:
        hid = np.fromiter((kinds.setdefault(hidden.get(r, frozenset()), len(kinds))
                           for r in rows.tolist()), np.int64, len(rows))
    else:
        hid = np.zeros(len(rows), np.int64)
    names_of = {i: names for names, i in kinds.items()}
    texts = np.empty(len(rows), dtype=object)
    sizes = np.zeros(len(rows), dtype=np.int64)
    rank = {name: i for i, name in enumerate(order)}
    pairs = np.unique(np.stack([masks.astype(np.uint64), hid.astype(np.uint64)], axis=1), axis=0)
    for value, kind in pairs.tolist():
        where = np.nonzero((masks == np.uint64(value)) & (hid == kind))[0]
        wanted: set[str] = set()
        for bit, projection in projections.items():
            if int(value) >> bit & 1:
                wanted.update(projection)
        columns = sorted(wanted, key=lambda n: rank.get(n, len(rank)))
        table = arrow.select(columns).take(pa.array(rows[where]))
        gone = names_of[int(kind)]
        if gone:
            table = pa.table([pa.nulls(len(table), table.column(n).type) if n in gone
                              else table.column(n) for n in columns], names=columns)
        encoded, lengths = encode(table)
        texts[where] = encoded
        sizes[where] = lengths
    top = int(seqs[rows].max())
    return RowBatch(tuple(texts.tolist()), int(sizes.sum()), None if top == no_seq else top)


def tag_rows(batch: RowBatch, index: int) -> RowBatch:
    """A windowed member's rows with `"grant": index` first in each JSON object."""
    if not len(batch):
        return batch
    head = f'{{"grant":{int(index)}'
    texts = pa.array(batch.rows, pa.string())
    body = pc.utf8_slice_codeunits(texts, 1)
    sep = pc.if_else(pc.equal(body, "}"), "", ",")
    tagged = pc.binary_join_element_wise(head, sep, body, "")
    return RowBatch(tuple(tagged.to_pylist()), int(pc.sum(pc.binary_length(tagged)).as_py()),
                    batch.last_position)


__all__ = ["member_masks", "merged_rows", "tag_rows"]
