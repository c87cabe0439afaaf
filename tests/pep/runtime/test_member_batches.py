"""Routing a projection's rows to its plans in a fixed number of numpy calls gives each plan what
encoding its own rows would give: the same texts in stream order, their size, its top
position."""
from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa

from pep.runtime.query.router import _member_batches
from pep.runtime.windows.pane_partials import NO_SEQ


def table(n: int, rng: random.Random) -> tuple[pa.Table, np.ndarray]:
    arrow = pa.table({"a": pa.array([rng.choice([None, rng.randint(-9, 9)]) for _ in range(n)],
                                    pa.int64()),
                      "b": pa.array([rng.choice(["x", "é", "ÿz"]) for _ in range(n)])})
    seqs = np.array([rng.choice([NO_SEQ, rng.randint(0, 1000)]) for _ in range(n)], np.int64)
    return arrow, seqs


def test_each_plan_gets_what_its_own_rows_encode_to():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 30)
        arrow, seqs = table(n, rng)
        plans = [sorted(rng.sample(range(n), rng.randint(1, n))) for _ in range(rng.randint(1, 6))]
        row_ids = np.array([r for rows in plans for r in rows], np.int64)
        ends = np.cumsum([len(rows) for rows in plans]).tolist()
        spans = list(zip([0] + ends[:-1], ends, strict=True))
        got = _member_batches(arrow, ("A", "B"), ("a", "b"), spans, row_ids, seqs)
        assert len(got) == len(plans)
        for rows, batch in zip(plans, got, strict=True):
            expected = [json.dumps({"A": arrow.column("a")[r].as_py(),
                                    "B": arrow.column("b")[r].as_py()},
                                   separators=(",", ":"), ensure_ascii=False) for r in rows]
            assert [json.loads(t) for t in batch.rows] == [json.loads(t) for t in expected]
            assert batch.nbytes == sum(len(t.encode()) for t in batch.rows)
            top = max(int(seqs[r]) for r in rows)
            assert batch.last_position == (None if top == NO_SEQ else top)
