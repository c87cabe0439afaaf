"""The Spark side of windows, exactly: the shared micro-batch job (panes in Spark, windows on the
driver) against a brute-force recomputation, for several plans sharing one stream (tuple and
time windows, group-by keys, min_count, start positions, nulls, every attribute type), with the
stream split into two micro-batches at every position."""
from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import pytest

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
from pep.core.rows import RowBatch
from pep.runtime.plans.compile import compile_plan

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("temp", "double"), Field("hum", "long"),
                       Field("station", "string"), Field("ok", "boolean")))
SPARK_SCHEMA = ("ts timestamp, temp double, hum long, station string, ok boolean, "
                "_xsg_seq long, _xsg_file string")
T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
ISO = "%Y-%m-%dT%H:%M:%S.%fZ"
FUNCS = ("avg", "max", "min", "sum", "count", "firstval", "lastval")


def records(n):
    out = []
    for i in range(n):
        out.append({
            # two tuples share each second now and then: ties in event time
            "ts": T0 + timedelta(seconds=(i * 3) // 2, microseconds=0 if i % 5 else 250_000),
            "temp": None if i % 7 == 3 else round(10 + (i * 13) % 17 + 0.5 * (i % 3), 2),
            "hum": None if i % 6 == 4 else (i * 29) % 50 - 10,
            "station": None if i == 11 else ["s1", "s2", "s3"][(i * 7) % 3],
            "ok": None if i == 5 else i % 3 != 0,
            "_xsg_seq": 100 + i,
        })
    return out


PLANS = {
    "plain": ExecutionPlan("x", ((Predicate("temp", ">", 14),),), ("ts", "temp", "station")),
    "plain-late": ExecutionPlan("x", None, ("hum", "ok"), start_after=108),
    "tuple": ExecutionPlan("x", ((Predicate("ok", "=", True),),), (), WindowSpec(
        "tuple", 4, 3, tuple(Aggregate("temp", f) for f in FUNCS)
        + (Aggregate("hum", "sum"), Aggregate("station", "max"), Aggregate("ts", "lastval")))),
    "tuple-keyed": ExecutionPlan("x", None, (), WindowSpec(
        "tuple", 3, 1, (Aggregate("hum", "sum"), Aggregate("temp", "firstval"),
                        Aggregate("ok", "min")), keys=("station",))),
    "tuple-wide-step": ExecutionPlan("x", None, (), WindowSpec(
        "tuple", 4, 2, (Aggregate("hum", "avg"), Aggregate("hum", "lastval"))),
        start_after=103),
    "time": ExecutionPlan("x", ((Predicate("hum", ">=", 0),), (Predicate("temp", "<", 20),)), (),
                          WindowSpec("time", 6, 3, tuple(Aggregate("temp", f) for f in FUNCS)
                                     + (Aggregate("ts", "firstval"), Aggregate("station", "min")),
                                     "ts")),
    "time-keyed": ExecutionPlan("x", None, (), WindowSpec(
        "time", 8, 4, (Aggregate("hum", "count"), Aggregate("hum", "max"),
                       Aggregate("temp", "lastval")), "ts", min_count=2, keys=("station",))),
}


def holds(rec, pred):
    v = rec[pred.attribute]
    if v is None:
        return False
    c = pred.value
    return {"<": v < c, "<=": v <= c, ">": v > c, ">=": v >= c, "=": v == c, "!=": v != c}[pred.op]


def passes(rec, plan):
    if plan.start_after is not None and rec["_xsg_seq"] <= plan.start_after:
        return False
    if plan.filter_dnf is None:
        return True
    return any(all(holds(rec, p) for p in conj) for conj in plan.filter_dnf)


def out_value(v):
    if isinstance(v, datetime):
        return v.strftime(ISO)
    return v


def aggregate(values, fn):
    present = [v for v in values if v is not None]
    if fn == "count":
        return len(present)
    if not present:
        return None
    if fn == "avg":
        return sum(present) / len(present)
    if fn == "sum":
        return sum(present)
    if fn in ("min", "max"):
        return out_value((min if fn == "min" else max)(present))
    return out_value(present[0] if fn == "firstval" else present[-1])


def window_row(chunk, w, start, end, key):
    row = {"window_start": start, "window_end": end}
    for k in w.keys:
        row[k] = key
    for a in w.aggregates:
        row[a.output_name] = aggregate([r[a.attribute] for r in chunk], a.function)
    row["_last"] = max(r["_xsg_seq"] for r in chunk)
    return row


def expected(recs, plan):
    rows = [r for r in recs if passes(r, plan)]
    w = plan.window
    if w is None:
        return [{a: out_value(r[a]) for a in plan.projection} for r in rows]
    key_of = (lambda r: r[w.keys[0]]) if w.keys else (lambda r: None)
    keys = sorted({key_of(r) for r in rows}, key=json.dumps)
    out = []
    if w.kind == "tuple":
        for key in keys:
            part = [r for r in rows if key_of(r) == key]
            k = 0
            while k * w.step + w.size <= len(part):
                chunk = part[k * w.step:k * w.step + w.size]
                if len(chunk) >= w.min_count:
                    out.append(window_row(chunk, w, k * w.step, k * w.step + w.size - 1, key))
                k += 1
        return out
    watermark = max(r["ts"] for r in recs).timestamp()
    for k in range(0, 200):
        start = T0.timestamp() // w.step * w.step + (k - 5) * w.step
        end = start + w.size
        if end > watermark:
            break
        for key in keys:
            chunk = [r for r in rows if start <= r["ts"].timestamp() < end and key_of(r) == key]
            chunk.sort(key=lambda r: r["ts"])  # stable: stream order among equal times
            if chunk and len(chunk) >= w.min_count:
                row = window_row(chunk, w, datetime.fromtimestamp(start, UTC)
                                 .strftime(ISO), datetime.fromtimestamp(end, UTC)
                                 .strftime(ISO), key)
                out.append(row)
    return out


def same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-12,
                                                                abs_tol=1e-9)
    return a == b and type(a) is type(b)


def sort_key(plan):
    w = plan.window
    if w is None:
        return None
    k = w.keys[0] if w.keys else None
    if w.kind == "tuple":
        return lambda r: (json.dumps(r.get(k)), r["window_start"])
    return lambda r: (r["window_start"], json.dumps(r.get(k)))


def run(spark, tmp_path, batches, names=None, tuple_pane_min=None):
    """Feed `batches` through one executor's micro-batch function; tuple_pane_min 1: every
    keyless tuple window is aggregated per pane in Spark (else narrow panes travel as rows)."""
    from pep.runtime.query.executor import StreamExecutor
    from pep.runtime.query.settings import DEFAULT_TUPLE_PANE_MIN
    sd = StreamDefinition("x", "o", SCHEMA, SourceSpec("ingest", (("path", str(tmp_path)),)),
                          time_attribute="ts")
    ex = StreamExecutor(spark, sd, tmp_path / "work", 0.25, 2, 0.0, lambda h: None,
                        tuple_pane_min or DEFAULT_TUPLE_PANE_MIN)
    names = list(PLANS) if names is None else names
    got: dict[str, list[RowBatch]] = {name: [] for name in names}
    for name in names:
        plan = PLANS[name]
        ex.handles.add_handle(name, compile_plan(plan, SCHEMA, "ts"),
                              lambda batch, name=name: got[name].append(batch) or True)
    for i, recs in enumerate(batches):
        frame = spark.createDataFrame([tuple(r[c] for c in
                                             ("ts", "temp", "hum", "station", "ok", "_xsg_seq"))
                                       + (None,) for r in recs], SPARK_SCHEMA)
        ex.lifecycle.on_batch(frame, i)
        ex.wait_delivered()
    return ex, got


def check(got, recs):
    for name, batches in got.items():
        plan = PLANS[name]
        rows = [json.loads(t) for b in batches for t in b.rows]
        want = expected(recs, plan)
        lasts = [w.pop("_last") for w in want] if plan.window is not None else []
        if plan.window is not None:
            rows.sort(key=sort_key(plan))
        assert len(rows) == len(want), (name, len(rows), len(want))
        for g, e in zip(rows, want, strict=True):
            assert list(g) == list(e), (name, g, e)
            assert all(same(g[k], e[k]) for k in e), (name, g, e)
        # the stream position behind each batch: the highest of the tuples it came from
        for b in batches:
            assert b.last_position is not None and b.nbytes == sum(len(t.encode()) for t in b.rows)
        if plan.window is None and batches:
            assert batches[-1].last_position == max(r["_xsg_seq"] for r in recs
                                                    if passes(r, plan))
        elif batches:
            assert max(b.last_position for b in batches) == max(lasts)


@pytest.mark.parametrize("tuple_pane_min", [None, 1])
def test_one_batch_matches_brute_force(spark, tmp_path, tuple_pane_min):
    recs = records(40)
    ex, got = run(spark, tmp_path, [recs], tuple_pane_min=tuple_pane_min)
    plans, _ = ex.registry.current()
    rows = {s.compiled.key: s.rows for s in plans}
    assert rows[PLANS["tuple-wide-step"].key()] == (tuple_pane_min is None)
    check(got, recs)
    assert [n for n in PLANS if not got[n]] == []  # every plan produced something
    stats = ex.stats()
    assert stats["rows_in"] == 40 and stats["max_position"] == 139
    assert stats["driver_rows"] > 0 and stats["driver_bytes"] > 0


def test_two_batches_split_at_every_position(spark, tmp_path):
    recs = records(12)
    for cut in range(len(recs) + 1):
        # tuple windows' tuples as rows, and (every third cut) as panes aggregated in Spark
        pane_min = 1 if cut % 3 == 0 else None
        _, got = run(spark, tmp_path / f"c{cut}", [recs[:cut], recs[cut:]],
                     tuple_pane_min=pane_min)
        check(got, recs)
        assert [n for n in PLANS if not got[n]] == []


def test_one_tuple_panes_come_back_as_values(spark, tmp_path):
    """Tuple windows whose panes are single tuples (step or gcd 1, or keyed) need no
    aggregation in Spark: each tuple's values come back once per plan."""
    recs = records(30)
    names = ["plain", "tuple", "tuple-keyed"]
    for cut in (0, 7, 30):
        ex, got = run(spark, tmp_path / f"c{cut}", [recs[:cut], recs[cut:]], names,
                      tuple_pane_min=1)
        plans, version = ex.registry.current()
        assert ex.table.shape_of(plans, version).raw
        check(got, recs)
        assert all(got[n] for n in names)
