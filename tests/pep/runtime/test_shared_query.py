"""The shared per-stream query on real Spark: every delivered row and window checked against a
pure-Python recomputation, plan sharing, attach/detach without restarts, and plan-size
invariance."""
from __future__ import annotations

import math
import re
import time
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
from tests.pep.runtime.support import Collector, wait_until, write_jsonl

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("temp", "double"), Field("hum", "long"),
                       Field("station", "string"), Field("ok", "boolean")))
HOSTILE = "' OR 1=1 --"
T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
FUNCS = ("avg", "max", "min", "sum", "count", "firstval", "lastval")


def stream(tmp_path, name="obs"):
    return StreamDefinition(name, "nea", SCHEMA,
                            SourceSpec("ingest", (("path", str(tmp_path / name)),)),
                            time_attribute="ts")


def make_records(n):
    """Deterministic records with nulls, string ties and a hostile-looking station name."""
    out = []
    for i in range(n):
        ts = T0 + timedelta(seconds=1.5 * i)
        out.append({
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),  # as the ingest writes it
            "temp": None if i % 11 == 5 else round(15 + (i * 7) % 19 + 0.25 * (i % 4), 2),
            "hum": None if i % 13 == 7 else (i * 17) % 90,
            "station": HOSTILE if i == 33 else ["s1", "s2", "s3"][(i * 5) % 3],
            "ok": i % 4 != 0,
            "_xsg_seq": i,
        })
    return out


def holds(rec, pred):
    v = rec[pred.attribute]
    if v is None:
        return False
    c = pred.value
    if pred.attribute == "ts":
        v = datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
        c = datetime.fromisoformat(c.replace("Z", "+00:00")).timestamp()
    return {"<": v < c, "<=": v <= c, ">": v > c, ">=": v >= c, "=": v == c, "!=": v != c}[pred.op]


def passes(rec, dnf):
    if dnf is None:
        return True
    return any(all(holds(rec, p) for p in conj) for conj in dnf)


def aggregate(values, fn):
    present = [v for v in values if v is not None]
    if fn == "count":
        return len(present)
    if not present:
        return None
    return {"avg": lambda: sum(present) / len(present), "max": lambda: max(present),
            "min": lambda: min(present), "sum": lambda: sum(present),
            "firstval": lambda: present[0], "lastval": lambda: present[-1]}[fn]()


def epoch(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def assert_rows_equal(got, expected):
    assert len(got) == len(expected), (len(got), len(expected))
    for g, e in zip(got, expected, strict=True):
        assert g.keys() == e.keys()
        for k in e:
            assert same(g[k], e[k]), (k, g, e)


PLAN_FILTER = ExecutionPlan("obs", ((Predicate("temp", ">", 20), Predicate("station", "!=", "s1")),
                                    (Predicate("hum", "<=", 40),)), ("ts", "temp", "station"))
PLAN_TUPLE = ExecutionPlan("obs", ((Predicate("ok", "=", True),),), (),
                           WindowSpec("tuple", 4, 3, tuple(Aggregate("temp", f) for f in FUNCS)
                                      + (Aggregate("hum", "count"), Aggregate("station", "max"))))
PLAN_TIME = ExecutionPlan("obs", ((Predicate("station", "=", "s2"),),
                                  (Predicate("ts", ">=", "2024-05-01T12:01:30Z"),)), (),
                          WindowSpec("time", 10, 5, tuple(Aggregate("hum", f) for f in FUNCS)
                                     + (Aggregate("temp", "max"), Aggregate("ts", "lastval")),
                                     "ts"))
PLAN_NOTHING = ExecutionPlan("obs", (), ("temp",))
PLAN_HOSTILE = ExecutionPlan("obs", ((Predicate("station", "=", HOSTILE),),), ("station", "hum"))
PLAN_HOSTILE_NE = ExecutionPlan("obs", ((Predicate("station", ">", HOSTILE),
                                         Predicate("hum", ">", 80)),), ("hum",))


def expected_rows(records, plan):
    return [{a: r[a] for a in plan.projection} for r in records if passes(r, plan.filter_dnf)]


def expected_tuple_windows(records, plan):
    w = plan.window
    rows = [r for r in records if passes(r, plan.filter_dnf)]
    out, k = [], 0
    while k * w.step + w.size <= len(rows):
        chunk = rows[k * w.step:k * w.step + w.size]
        row = {"window_start": k * w.step, "window_end": k * w.step + w.size - 1}
        for a in w.aggregates:
            row[a.output_name] = aggregate([r[a.attribute] for r in chunk], a.function)
        out.append(row)
        k += 1
    return out


def expected_time_windows(records, plan):
    w = plan.window
    rows = [r for r in records if passes(r, plan.filter_dnf)]
    watermark = max(epoch(r["ts"]) for r in records)
    times = [epoch(r["ts"]) for r in rows]
    out = []
    first = math.floor(min(times) / w.step) - w.size
    for k in range(first, math.floor(watermark / w.step) + 1):
        start, end = k * w.step, k * w.step + w.size
        inside = [r for r, t in zip(rows, times, strict=True) if start <= t < end]
        if not inside or end > watermark:
            continue
        row = {"window_start": start, "window_end": end}
        for a in w.aggregates:
            row[a.output_name] = aggregate([r[a.attribute] for r in inside], a.function)
        out.append(row)
    return out


@pytest.mark.parametrize("fillers", [0, 10])
def test_every_delivered_row_and_window_matches_brute_force(runtime, tmp_path, fillers):
    """With 10 more plain plans, the row plans are past FEW_PLANS: the GroupedMatcher routes
    them (and the tuple window's rows), the plan table only the time window."""
    sd = stream(tmp_path)
    plans = {"filter": PLAN_FILTER, "filter-twin": PLAN_FILTER, "tuple": PLAN_TUPLE,
             "time": PLAN_TIME, "nothing": PLAN_NOTHING, "hostile": PLAN_HOSTILE,
             "hostile-ne": PLAN_HOSTILE_NE}
    for i in range(fillers):
        plans[f"filler{i}"] = ExecutionPlan("obs", ((Predicate("temp", ">=", 15.0 + i),
                                                     Predicate("hum", "!=", i)),
                                                    (Predicate("station", "=", f"s{i % 3}"),
                                                     Predicate("ok", "=", bool(i % 2)))),
                                            ("hum", "station", "ts"))
    sinks = {h: Collector() for h in plans}
    started = time.perf_counter()
    for h, p in plans.items():
        runtime.attach_handle(h, sd, p, sinks[h])
    attach_all = time.perf_counter() - started
    qid = runtime.query_id("obs")

    records = make_records(120)
    for n in range(6):  # 6 files over several micro-batches (max 2 files per trigger)
        write_jsonl(tmp_path / "obs", f"part-{n}.json", records[n * 20:(n + 1) * 20])
        time.sleep(0.3 if n % 2 else 0.05)

    want = {h: expected_rows(records, p) for h, p in plans.items() if p.window is None}
    want["tuple"] = expected_tuple_windows(records, PLAN_TUPLE)
    want["time"] = expected_time_windows(records, PLAN_TIME)
    assert want["filter"] and want["tuple"] and len(want["time"]) > 5
    assert want["hostile"] == [{"station": HOSTILE, "hum": records[33]["hum"]}]
    assert want["nothing"] == []

    assert wait_until(lambda: all(len(sinks[h].rows) >= len(want[h]) for h in plans), 60), \
        {h: (len(sinks[h].rows), len(want[h])) for h in plans}
    time.sleep(0.6)  # nothing more may arrive
    for h in ("filter", "filter-twin", "hostile", "hostile-ne", "nothing",
              *(f"filler{i}" for i in range(fillers))):
        assert_rows_equal(sinks[h].rows, want[h])
    assert_rows_equal(sinks["tuple"].rows, want["tuple"])
    got_time = [dict(r, window_start=epoch(r["window_start"]), window_end=epoch(r["window_end"]),
                     lastval_ts=epoch(r["lastval_ts"])) for r in sinks["time"].rows]
    want_time = [dict(r, lastval_ts=epoch(r["lastval_ts"])) for r in want["time"]]
    assert_rows_equal(got_time, want_time)

    stats = runtime.stats()["obs"]
    # the stream's figures: observed on the batch (fillers 0), counted by the grouped
    # matcher's tasks (fillers 10)
    assert stats["rows_in"] == 120 and stats["batches"] >= 3 and stats["max_position"] == 119
    assert stats["handles"] == 7 + fillers and stats["plans"] == 6 + fillers  # twin: shared
    assert stats["query_id"] == qid
    assert attach_all < 10


def test_attach_detach_share_one_query_and_last_detach_stops_it(runtime, spark, tmp_path):
    sd = stream(tmp_path, "shared")
    a, b, c = Collector(), Collector(), Collector(close_after=1)
    plan = ExecutionPlan("shared", None, ("hum",))
    runtime.attach_handle("a", sd, plan, a)
    qid = runtime.query_id("shared")
    started = time.perf_counter()
    runtime.attach_handle(
        "b", sd, ExecutionPlan("shared", ((Predicate("hum", ">", 50),),), ("hum",)), b
    )
    runtime.attach_handle("c", sd, plan, c)
    assert time.perf_counter() - started < 0.3 * 2  # attaching to a running query is cheap
    assert runtime.query_id("shared") == qid
    assert runtime.stats()["shared"]["plans"] == 2 and runtime.stats()["shared"]["handles"] == 3

    records = make_records(40)
    write_jsonl(tmp_path / "shared", "one.json", records[:20])
    assert wait_until(lambda: len(a.rows) >= 20 and c.calls >= 1)
    # c said False: it is detached and never called again
    assert wait_until(lambda: "c" not in runtime.handles())
    assert c.calls == 1
    runtime.detach("a")
    assert runtime.query_id("shared") == qid  # b still attached: no restart
    write_jsonl(tmp_path / "shared", "two.json", records[20:])
    expected_b = [{"hum": r["hum"]} for r in records if r["hum"] is not None and r["hum"] > 50]
    assert wait_until(lambda: len(b.rows) >= len(expected_b))
    assert b.rows == expected_b
    assert len(a.rows) == 20 and c.calls == 1  # nothing after detach
    assert runtime.query_id("shared") == qid
    # the stream query runs without whole-stage code generation in its own session only
    assert spark.conf.get("spark.sql.codegen.wholeStage") == "true"

    runtime.detach("b")
    assert runtime.query_id("shared") is None and runtime.handles() == {}
    assert qid not in {str(q.id) for q in spark.streams.active}


def test_physical_plan_does_not_grow_with_handles_and_constants_are_data(spark, tmp_path):
    from pep.runtime.base.columns import PIDS_COLUMN
    from pep.runtime.plans.compile import compile_plan
    from pep.runtime.query.executor import StreamExecutor
    sd = stream(tmp_path, "static")
    ex = StreamExecutor(spark, sd, tmp_path, 0.25, 2, 0.0, lambda h: None)
    batch = spark.createDataFrame(
        [(datetime.fromtimestamp(i, UTC), i * 1.5, i,
          HOSTILE if i == 7 else f"s{i % 3}", i % 2 == 0, i, None) for i in range(30)],
        "ts timestamp, temp double, hum long, station string, ok boolean, _xsg_seq long, "
        "_xsg_file string")

    def run(n_handles):
        ex.registry._plans.clear()
        ex.registry._plan_ids.clear()
        ex.registry._version += 1
        plans = [ExecutionPlan("static", ((Predicate("station", "=", HOSTILE),),), ("hum",))]
        plans += [ExecutionPlan("static", ((Predicate("temp", ">", float(i)),
                                            Predicate("station", "!=", f"s{i % 3}")),), ("hum",))
                  for i in range(n_handles - 1)]
        plans += [ExecutionPlan("static", ((Predicate("temp", ">", float(i)),),), (),
                                WindowSpec("tuple" if i % 2 else "time", 4 + i, 2,
                                           (Aggregate("temp", "max"), Aggregate("hum", "sum")),
                                           "ts", keys=("station",) if i % 3 == 0 else ()))
                  for i in range(n_handles + 3)]  # both kinds, with and without keys
        for i, p in enumerate(plans):
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
        ids = {s.compiled.key: s.id for s in states}
        return rows.toArrow().to_pylist(), texts, ids[compile_plan(plans[0], SCHEMA).key]

    one, plan_1, hostile_id = run(1)
    fifty, plan_50, hostile_id_50 = run(50)
    assert plan_1 == plan_50
    assert all(HOSTILE not in t and "1=1" not in t for t in plan_50)
    assert [r["hum"] for r in one if hostile_id in r[PIDS_COLUMN]] == [7]
    assert [r["hum"] for r in fifty if hostile_id_50 in r[PIDS_COLUMN]] == [7]
    # the 49 ordinary plans, evaluated in Spark, agree with Python (a row comes back only
    # when some plan passes it)
    rows = {r["hum"]: r[PIDS_COLUMN] for r in fifty}
    for hum in range(30):
        temp, station = hum * 1.5, HOSTILE if hum == 7 else f"s{hum % 3}"
        for i in range(49):
            expected = temp > i and station != f"s{i % 3}"
            assert (hostile_id_50 + 1 + i in rows.get(hum, [])) == expected


def test_a_few_plans_compiled_agree_with_the_plan_table(spark, tmp_path):
    """The compiled matcher of a few plain plans gives every row the plan ids the plan table
    gives it: nulls, NaN, a hostile string, booleans, timestamps, OR of ANDs, start positions."""
    from dataclasses import replace

    from pep.runtime.base.columns import PIDS_COLUMN
    from pep.runtime.plans.compile import compile_plan
    from pep.runtime.plans.plan_expressions import few_plans_column
    from pep.runtime.query.executor import StreamExecutor
    sd = stream(tmp_path, "few")
    ex = StreamExecutor(spark, sd, tmp_path, 0.25, 2, 0.0, lambda h: None)
    batch = spark.createDataFrame(
        [(None if i == 3 else T0 + timedelta(seconds=i),
          float("nan") if i == 5 else (None if i == 6 else i * 1.5), i,
          HOSTILE if i == 7 else (None if i == 8 else f"s{i % 3}"), i % 2 == 0,
          None if i == 9 else i, None) for i in range(30)],
        "ts timestamp, temp double, hum long, station string, ok boolean, _xsg_seq long, "
        "_xsg_file string")
    plans = [
        ExecutionPlan("few", ((Predicate("station", "=", HOSTILE),),), ("hum",)),
        ExecutionPlan("few", ((Predicate("temp", ">", 10.0), Predicate("station", "!=", "s1")),
                              (Predicate("hum", "<=", 2),)), ("hum", "temp")),
        ExecutionPlan("few", ((Predicate("ok", "=", True),),), ("hum",)),
        ExecutionPlan("few", ((Predicate("ts", ">=", (T0 + timedelta(seconds=20)).isoformat()),),),
                      ("hum",)),
        ExecutionPlan("few", ((Predicate("temp", "<", 1e300),),), ("hum",)),
        replace(ExecutionPlan("few", None, ("hum",)), start_after=15),
        ExecutionPlan("few", ((Predicate("station", ">", "s0"),),), ("station",)),
    ]
    for i, p in enumerate(plans):
        ex.handles.add_handle(f"h{i}", compile_plan(p, SCHEMA, "ts"), lambda rows: True)
    states, version = ex.registry.current()
    shape = ex.table.shape_of(states, version)
    _, scalar = ex.table.plan_table(states, version, shape)
    few = few_plans_column([(s.id, s.compiled) for s in states], sd.schema)
    generic = ex.rows.rows_frame(batch, scalar, shape).toArrow().to_pylist()
    compiled = ex.rows.rows_frame(batch, scalar, shape, few).toArrow().to_pylist()
    assert len(generic) > 10
    assert [(r["hum"], sorted(r[PIDS_COLUMN])) for r in compiled] == \
        [(r["hum"], sorted(r[PIDS_COLUMN])) for r in generic]


def test_many_plans_grouped_by_shape_agree_with_the_plan_table(spark, tmp_path):
    """Past FEW_PLANS, the GroupedMatcher (the values the filters read from one compiled job,
    the tests as array kernels per shape) passes every row to exactly the plans the plan table
    passes it to: nulls, NaN, a hostile string, booleans, timestamps, longs, OR of ANDs, start
    positions, shapes shared by plans with other constants and operators."""
    from dataclasses import replace

    import pyarrow as pa
    import pyarrow.compute as pc

    from pep.runtime.base.columns import BITS_COLUMN, PIDS_COLUMN
    from pep.runtime.plans.compile import compile_plan
    from pep.runtime.plans.matcher import GroupedMatcher
    from pep.runtime.plans.plan_expressions import FEW_PLANS
    from pep.runtime.query.executor import StreamExecutor
    from pep.runtime.query.rows_job import split_figures
    sd = stream(tmp_path, "many")
    ex = StreamExecutor(spark, sd, tmp_path, 0.25, 2, 0.0, lambda h: None)
    batch = spark.createDataFrame(
        [(None if i == 3 else T0 + timedelta(seconds=i),
          float("nan") if i == 5 else (None if i == 6 else i * 1.5), i,
          HOSTILE if i == 7 else (None if i == 8 else f"s{i % 3}"), i % 2 == 0,
          None if i == 9 else i, None) for i in range(30)],
        "ts timestamp, temp double, hum long, station string, ok boolean, _xsg_seq long, "
        "_xsg_file string")
    plans = [ExecutionPlan("many", ((Predicate("station", "=", HOSTILE),),), ("hum",)),
             replace(ExecutionPlan("many", None, ("hum",)), start_after=15)]
    for i in range(6):
        plans += [
            ExecutionPlan("many", ((Predicate("temp", ">" if i % 2 else ">=", 3.0 * i),
                                    Predicate("station", "!=", f"s{i % 3}")),
                                   (Predicate("hum", "<=", i),)), ("hum", "temp")),
            ExecutionPlan("many", ((Predicate("ok", "=", i % 2 == 0),),), ("hum",)),
            ExecutionPlan("many", ((Predicate("ts", "<" if i % 2 else ">=",
                                              (T0 + timedelta(seconds=4 * i)).isoformat()),),),
                          ("hum",)),
            replace(ExecutionPlan("many", ((Predicate("temp", "<", 1e300 if i else 7.5),
                                            Predicate("temp", "!=", 3.0 * i)),), ("hum",)),
                    start_after=i * 3 if i % 2 else None),
            ExecutionPlan("many", ((Predicate("station", ">" if i % 2 else "<=", f"s{i % 3}"),),),
                          ("station",)),
            ExecutionPlan("many", ((Predicate("hum", "=", 2 * i),),), ("hum",)),
        ]
    for i, p in enumerate(plans):
        ex.handles.add_handle(f"h{i}", compile_plan(p, SCHEMA, "ts"), lambda rows: True)
    states, version = ex.registry.current()
    assert len(states) > FEW_PLANS
    shape = ex.table.shape_of(states, version)
    grouped = ex.rows.matcher(ex.registry.plan_sets(), shape)
    assert isinstance(grouped, GroupedMatcher) and len(grouped.groups) < len(states)
    _, scalar = ex.table.plan_table(states, version, shape)
    generic = ex.rows.rows_frame(batch, scalar, shape).toArrow().to_pylist()
    expected = sorted((r["hum"], pid) for r in generic for pid in r[PIDS_COLUMN])
    arrow = ex.rows.values_frame(batch, shape, grouped).toArrow()
    assert arrow.num_rows == 30  # every tuple once, whatever passes
    pids, rows = grouped.match(arrow, arrow.column("_xsg_seq").combine_chunks())
    hums = arrow.column("hum").to_pylist()
    assert len(expected) > 100
    assert (
        sorted((hums[r], int(p)) for p, r in zip(pids.tolist(), rows.tolist(), strict=True))
        == expected
    )
    # each plan's pairs together, in stream order
    runs = [int(p) for i, p in enumerate(pids) if i == 0 or p != pids[i - 1]]
    assert len(runs) == len(set(runs))
    assert all(b < d for a, b, c, d in zip(pids, rows, pids[1:], rows[1:], strict=False) if a == c)
    # the executor asks no plan table of Spark when every plan is a grouped row plan
    assert "_xsg_plans" not in ex.rows.values_frame(batch, shape, grouped).columns

    # on the workers (mapInArrow, several partitions and Arrow batches of 4 tuples): only the
    # tuples some plan admits come back, with rows_frame's columns and types, each with exactly
    # the plan table's plan ids; the values only the filters read do not
    generic_frame = ex.rows.rows_frame(batch, scalar, shape)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "4")
    try:
        admitted = ex.rows.admitted_frame(batch.repartition(3), shape, grouped)
        assert [(f.name, f.dataType.simpleString()) for f in admitted.schema][:-3] == \
            [(f.name, f.dataType.simpleString()) for f in generic_frame.schema][:-1]
        out, figures = split_figures(admitted.toArrow())
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    # the tasks counted what they read: every tuple, the highest position 29 (tuple 9 has none)
    assert figures == {"rows": 30, "seq": 29}
    assert out.schema.field("hum").type == pa.int64() and out.schema.field("temp").type == \
        pa.float64()
    assert not [c for c in out.column_names if c.startswith("_xsg_m")]
    assert out.num_rows == len(generic) == 30  # here every tuple passes some plan
    out = out.take(pc.sort_indices(out, sort_keys=[("_xsg_seq", "ascending")]))
    pids, rows = grouped.pairs(out.column(BITS_COLUMN).combine_chunks())
    runs = [int(p) for i, p in enumerate(pids) if i == 0 or p != pids[i - 1]]
    assert len(runs) == len(set(runs))  # plan-major, rows ascending: what the routing takes
    assert all(b < d for a, b, c, d in zip(pids, rows, pids[1:], rows[1:], strict=False) if a == c)
    ids_of = [[] for _ in range(out.num_rows)]
    for p, r in zip(pids.tolist(), rows.tolist(), strict=True):
        ids_of[r].append(p)
    got = sorted((r["hum"], r["_xsg_seq"], r["temp"] if r["temp"] == r["temp"] else "NaN",
                  sorted(ids_of[i])) for i, r in enumerate(out.to_pylist()))
    want = sorted((r["hum"], r["_xsg_seq"], r["temp"] if r["temp"] == r["temp"] else "NaN",
                   sorted(r[PIDS_COLUMN])) for r in generic)
    assert got == want
    # tuples no plan admits stay on the workers
    only = GroupedMatcher.build([(7 + i, compile_plan(ExecutionPlan(
        "many", ((Predicate("hum", "=", 2 * i),),), ("hum",)), SCHEMA, "ts")) for i in range(6)])
    assert only is not None
    few, figures = split_figures(ex.rows.admitted_frame(batch.repartition(3), shape, only)
                                 .toArrow())
    assert figures == {"rows": 30, "seq": 29}
    pids, rows = only.pairs(few.column(BITS_COLUMN).combine_chunks())
    hums = few.column("hum").to_pylist()
    assert sorted((hums[r], int(p)) for p, r in zip(pids, rows, strict=True)) == [(2 * i, 7 + i)
                                                                      for i in range(6)]
    assert few.num_rows == 6
