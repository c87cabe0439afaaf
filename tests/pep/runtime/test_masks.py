"""Masks in the shared per-stream query (issue 24): masks are data of the plan table, so plans
with other steps, edges, lengths or keys change no physical plan, the owner's key is in no plan
text, and each plan's rows (filtered on its masked values) and keyed windows come out as a
reference computed here says (exact decimals, Python's hmac, slices)."""
from __future__ import annotations

import hashlib
import hmac
import re
from datetime import UTC, datetime
from decimal import ROUND_FLOOR, Decimal

from pep.core.plan import (
    Aggregate,
    ExecutionPlan,
    Field,
    Predicate,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
    WindowSpec,
)

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("x", "double"), Field("n", "long"),
                       Field("s", "string")))
KEY = bytes(range(100, 132))


def floor_to(x: float, step: str) -> float:
    s = Decimal(step)
    return float((Decimal(repr(x)) / s).to_integral_value(rounding=ROUND_FLOOR) * s)


def plans(count: int) -> list[ExecutionPlan]:
    """`count` masked row plans with different parameters, and keyed windows."""
    out = [ExecutionPlan("m", ((Predicate("x", ">=", 5.0, "round:2.5"),),), ("x", "n", "s"),
                         masks=(("x", "round:2.5"), ("n", "hash"), ("s", "prefix:2")))]
    for i in range(count - 1):
        out.append(ExecutionPlan(
            "m", ((Predicate("n", "=", 1000 + 10 * (i % 3), "round:10"),),),
            ("x", "n", "s", "ts"),
            masks=(("x", f"bands:0,{1 + i},{20 + i}"), ("n", "round:10"),
                   ("s", f"suffix:{1 + i % 4}"), ("ts", "truncate:minute"))))
    out.append(ExecutionPlan("m", None, ("x", "n"), WindowSpec(
        "tuple", 16, 16, (Aggregate("x", "sum"),), None, 1, ("n",)),
        masks=(("x", "round:1"), ("n", "hash"))))
    out.append(ExecutionPlan("m", None, ("x",), WindowSpec(
        "time", 60, 60, (Aggregate("x", "max"), Aggregate("s", "min")), "ts", 1, ("s",)),
        masks=(("x", "round:1"), ("s", "prefix:1"))))
    return out


def test_masks_are_data_of_the_plan_table_and_rows_match_a_reference(spark, tmp_path):
    from pep.runtime.base.columns import PIDS_COLUMN
    from pep.runtime.plans.compile import compile_plan
    from pep.runtime.query.executor import StreamExecutor
    definition = StreamDefinition("m", "nea", SCHEMA, SourceSpec("ingest", (
        ("path", str(tmp_path / "m")),)), "ts")
    ex = StreamExecutor(spark, definition, tmp_path, 0.25, 2, 0.0, lambda h: None,
                        mask_key=lambda owner: KEY)
    values = [(datetime.fromtimestamp(1_700_000_000 + 7 * i, UTC), 0.7 * i,
               1000 + i % 25, f"name-{i}", i, None) for i in range(40)]
    batch = spark.createDataFrame(values, "ts timestamp, x double, n long, s string, "
                                          "_xsg_seq long, _xsg_file string")

    def run(count: int):
        ex.registry._plans.clear()
        ex.registry._plan_ids.clear()
        ex.registry._version += 1
        chosen = plans(count)
        for i, p in enumerate(chosen):
            ex.handles.add_handle(f"h{i}", compile_plan(p, SCHEMA, "ts"), lambda rows: True)
        states, version = ex.registry.current()
        shape = ex.table.shape_of(states, version)
        _, scalar = ex.table.plan_table(states, version, shape)
        rows = ex.rows.rows_frame(batch, scalar, shape)
        panes = ex.panes.panes_frame(batch, scalar, shape)
        texts = []
        for frame in (rows, panes):
            text = frame._jdf.queryExecution().executedPlan().toString()
            texts.append(re.sub(r"#\d+L?|plan_id=\d+|\[id=#?\d+\]", "#", text))
        index = {compile_plan(p, SCHEMA, "ts").key: i for i, p in enumerate(chosen)}
        ids = {s.id: index[s.compiled.key] for s in states}
        return rows, texts, ids, panes

    _, texts_2, _, _ = run(2)
    rows_20, texts_20, ids, panes = run(20)
    rows_20, panes = rows_20.toArrow().to_pylist(), panes.toArrow().to_pylist()
    first = next(i for i, n in ids.items() if n == 0)
    assert texts_2 == texts_20  # 2 or 20 plans, other parameters: the same physical plans
    for text in texts_20:
        assert KEY.hex() not in text.lower() and "100, 101, 102" not in text
    # the first plan: x >= 5 on its masked value (round:2.5), hashed n, a prefix of s
    got = [{k: r[k] for k in ("x", "_xsg_h_n", "s")} for r in rows_20
           if r[PIDS_COLUMN] == [first]]
    want = [{"x": floor_to(0.7 * i, "2.5"),
             "_xsg_h_n": hmac.new(KEY, str(1000 + i % 25).encode(), hashlib.sha256).hexdigest(),
             "s": f"name-{i}"[:2]} for i in range(40) if floor_to(0.7 * i, "2.5") >= 5]
    assert got == want
    # the other row plans: their own masks, never another plan's
    middle = [r for r in rows_20 if len(r[PIDS_COLUMN]) == 1
              and 0 < ids[r[PIDS_COLUMN][0]] < 20]
    assert len(middle) > 20
    for r in middle:
        i = ids[r[PIDS_COLUMN][0]] - 1
        assert r["ts"].second == 0 and r["n"] % 10 == 0 and r["_xsg_h_n"] is None
        assert len(r["s"]) == 1 + i % 4 and r["x"] in (0.0, float(1 + i), float(20 + i))
    # the time window groups by the masked s (its first letter: one key) and maxes rounded x
    window = [p for p in panes if ids[p["pid"]] == 21]
    assert window and {p["key"] for p in window} == {'"n"'}
    assert all(float(p[c]).is_integer() for p in window for c in p if c.endswith("_x")
               and p[c] is not None)
