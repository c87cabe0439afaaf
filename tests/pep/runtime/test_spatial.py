"""Spatial predicates on real Spark (issue 14): DISTANCE, WITHIN_POLYGON and DISTANCE_TO to a
moving anchor, evaluated as data in the shared job, every delivered row checked against the
pure-Python reference semantics (`pep.core.conditions.evaluate`) over the same tuples."""
from __future__ import annotations

import math
import time

from pep.core import geo
from pep.core.conditions import evaluate, spatial_from_predicate
from pep.core.plan import (
    ExecutionPlan,
    Field,
    Predicate,
    SourceSpec,
    SpatialPredicate,
    StreamDefinition,
    StreamSchema,
)
from tests.pep.runtime.support import Collector, wait_until, write_jsonl

SCHEMA = StreamSchema((Field("mmsi", "long"), Field("name", "string"), Field("lat", "double"),
                       Field("lon", "double"), Field("speed", "double")))
ANCHOR = 7
PORT = (1.26, 103.84)
BOUNDS = (1.15, 103.6, 1.15, 104.05, 1.30, 104.05, 1.38, 103.8, 1.30, 103.6)  # a pentagon


def stream(tmp_path, name="ships"):
    return StreamDefinition(name, "nea", SCHEMA,
                            SourceSpec("ingest", (("path", str(tmp_path / name)),)))


def make_records(n: int) -> list[dict]:
    """Ten ships criss-crossing the port; ship 7 (the anchor) sails east across all of them;
    a few tuples have no valid position (missing, NaN is not JSON, out of range)."""
    out = []
    for i in range(n):
        ship = i % 10
        step = i // 10
        lat = 1.0 + 0.05 * ship + 0.013 * step * math.sin(ship + 1)
        lon = 103.3 + 0.09 * step * (1 if ship % 2 else -0.4) + 0.07 * ship
        if ship == ANCHOR:
            lat, lon = 1.25, 103.2 + 0.11 * step
        rec = {"mmsi": ship, "name": f"s{ship}", "lat": round(lat, 6), "lon": round(lon, 6),
               "speed": float(i % 17), "_xsg_seq": i + 1}
        if i in (23, 57):
            rec["lat"] = None
        if i == 71:  # the anchor reports no valid position once: unknown until its next report
            rec.update(mmsi=ANCHOR, lat=95.0)
        out.append(rec)
    return out


def anchor_lookup(records: list[dict], upto: int):
    """The anchor's latest report strictly before position `upto` (None: none or invalid)."""
    def lookup(key, value, lat, lon):
        for r in reversed(records[:upto]):
            if r[key] == value:
                return (r[lat], r[lon]) if geo.valid_position(r[lat], r[lon]) else None
        return None
    return lookup


def expected(records: list[dict], plan: ExecutionPlan) -> list[dict]:
    out = []
    for i, r in enumerate(records):
        lookup = anchor_lookup(records, i)
        if any(all(_holds(p, r, lookup) for p in conj) for conj in plan.filter_dnf):
            out.append({a: r[a] for a in plan.projection})
    return out


def _holds(p, r, lookup) -> bool:
    if isinstance(p, SpatialPredicate):
        return evaluate(spatial_from_predicate(p), r, anchor=lookup)
    v = r[p.attribute]
    return v is not None and {"<": v < p.value, ">": v > p.value, "<=": v <= p.value,
                              ">=": v >= p.value, "=": v == p.value, "!=": v != p.value}[p.op]


def near_boundary(records, plan) -> list:
    """Tuples within rounding reach of a circle's edge (Spark's sin/cos may differ in the last
    bit from Python's): the data must have none, or the comparison would be luck."""
    bad = []
    for r in records:
        if not geo.valid_position(r["lat"], r["lon"]):
            continue
        for conj in plan.filter_dnf:
            for p in conj:
                if isinstance(p, SpatialPredicate) and p.function == "distance":
                    d = geo.haversine(r["lat"], r["lon"], *p.points)
                    if abs(d - p.value) < 0.01:
                        bad.append((r, p))
    return bad


PLANS = {
    "near-port": ExecutionPlan("ships", ((SpatialPredicate("distance", "lat", "lon", "<=", 25_000.0,
                                                            PORT),),), ("mmsi", "lat", "lon")),
    "far-and-fast": ExecutionPlan("ships", ((SpatialPredicate("distance", "lat", "lon", ">",
                                                               40_000.0, PORT),
                                             Predicate("speed", ">", 8.0)),), ("mmsi", "speed")),
    "in-port": ExecutionPlan("ships", ((SpatialPredicate("polygon", "lat", "lon", "=", 0.0,
                                                          BOUNDS),),), ("mmsi", "name", "lat")),
    "outside": ExecutionPlan("ships", ((SpatialPredicate("polygon", "lat", "lon", "!=", 0.0,
                                                          BOUNDS),),), ("mmsi", "lon")),
    "captain": ExecutionPlan("ships", ((SpatialPredicate("distance_to", "lat", "lon", "<=",
                                                          30_000.0, (), "mmsi", ANCHOR),),),
                             ("mmsi", "lat", "lon")),
    "captain-far": ExecutionPlan("ships", ((SpatialPredicate("distance_to", "lat", "lon", ">",
                                                              30_000.0, (), "mmsi", ANCHOR),
                                            Predicate("mmsi", "!=", 3)),), ("mmsi",)),
}


def test_spatial_rows_match_the_reference_semantics(runtime, tmp_path):
    sd = stream(tmp_path)
    sinks = {h: Collector() for h in PLANS}
    for h, p in PLANS.items():
        runtime.attach_handle(h, sd, p, sinks[h])
    records = make_records(200)
    for n in range(8):  # several files and micro-batches: the anchor's state crosses batches
        write_jsonl(tmp_path / "ships", f"part-{n}.json", records[n * 25:(n + 1) * 25])
        time.sleep(0.3 if n % 2 else 0.05)
    want = {h: expected(records, p) for h, p in PLANS.items()}
    for h, p in PLANS.items():
        assert not near_boundary(records, p), h
    # the data exercises every side of every predicate
    for h in PLANS:
        assert 5 < len(want[h]) < len(records) - 5, (h, len(want[h]))
    assert {r["mmsi"] for r in want["captain"]} > {ANCHOR}  # others near the moving anchor
    assert wait_until(lambda: all(len(sinks[h].rows) >= len(want[h]) for h in PLANS), 60), \
        {h: (len(sinks[h].rows), len(want[h])) for h in PLANS}
    time.sleep(0.6)  # nothing more may arrive
    for h in PLANS:
        got = sorted(sinks[h].rows, key=repr)
        assert got == sorted(want[h], key=repr), h
    stats = runtime.stats()["ships"]
    assert stats["rows_in"] == 200


def test_no_distance_to_without_a_known_anchor_and_the_plan_does_not_grow(runtime, spark, tmp_path):
    """An anchor that never reports leaves DISTANCE_TO false both ways (deny when in doubt); and
    attaching spatial plans with other constants changes the plan table, not Spark's plan."""
    sd = stream(tmp_path, "quiet")
    never = Collector()
    never_far = Collector()
    everything = Collector()
    runtime.attach_handle("never", sd, ExecutionPlan("quiet", ((SpatialPredicate(
        "distance_to", "lat", "lon", "<=", 1e7, (), "mmsi", 99),),), ("mmsi",)), never)
    runtime.attach_handle("never-far", sd, ExecutionPlan("quiet", ((SpatialPredicate(
        "distance_to", "lat", "lon", ">", 0.0, (), "mmsi", 99),),), ("mmsi",)), never_far)
    runtime.attach_handle("all", sd, ExecutionPlan("quiet", None, ("mmsi",)), everything)
    write_jsonl(tmp_path / "quiet", "a.json", make_records(40))
    assert wait_until(lambda: len(everything.rows) >= 40, 60)
    time.sleep(0.6)
    assert never.rows == [] and never_far.rows == []



def test_spatial_constants_are_data_and_the_plan_does_not_grow(spark, tmp_path):
    import re

    from pep.runtime.base.columns import PIDS_COLUMN
    from pep.runtime.plans.compile import compile_plan
    from pep.runtime.query.executor import StreamExecutor
    ex = StreamExecutor(spark, stream(tmp_path, "static"), tmp_path, 0.25, 2, 0.0, lambda h: None)
    batch = spark.createDataFrame(
        [(i, f"s{i}", 1.0 + 0.01 * i, 103.5 + 0.02 * i, 1.0, i + 1, None) for i in range(30)],
        "mmsi long, name string, lat double, lon double, speed double, _xsg_seq long, "
        "_xsg_file string")

    def run(n: int, base: float):
        ex.registry._plans.clear()
        ex.registry._plan_ids.clear()
        ex.registry._version += 1
        plans = []
        for i in range(n):
            plans += [
                ExecutionPlan("static", ((SpatialPredicate("distance", "lat", "lon", "<=",
                                                           base + i, (1.0 + i / 100, 103.5)),),),
                              ("mmsi",)),
                ExecutionPlan("static", ((SpatialPredicate(
                    "polygon", "lat", "lon", "=", 0.0,
                    (1.0, 103.0, 1.0, base / 1e4 + i / 10, 1.2345 + i / 1e3, 103.6)),),),
                              ("mmsi",)),
                ExecutionPlan("static", ((SpatialPredicate("distance_to", "lat", "lon", ">", base,
                                                           (), "mmsi", 987654 + i),),), ("mmsi",))]
        for i, p in enumerate(plans):
            ex.handles.add_handle(f"h{i}", compile_plan(p, SCHEMA), lambda rows: True)
        ex.table.anchors.update(batch, [s.compiled for s in ex.registry.current()[0]])
        states, version = ex.registry.current()
        shape = ex.table.shape_of(states, version)
        _, scalar = ex.table.plan_table(states, version, shape)
        frame = ex.rows.rows_frame(batch, scalar, shape)
        text = frame._jdf.queryExecution().executedPlan().toString()
        ids = {s.compiled.key: s.id for s in states}
        return frame.toArrow().to_pylist(), re.sub(r"#\d+L?|plan_id=\d+|\[id=#?\d+\]|x_\d+", "#",
                                                   text), [ids[compile_plan(p, SCHEMA).key]
                                                           for p in plans[:2]]

    _, plan_1, _ = run(1, 1234.5)
    rows, plan_20, (near_id, poly_id) = run(20, 4321.5)
    assert plan_1 == plan_20
    assert all(c not in plan_20 for c in ("4321", "987654", "1.2345", "1234.5"))
    # the first two plans, evaluated in Spark, agree with Python
    got = {r["mmsi"]: r[PIDS_COLUMN] for r in rows}
    for i in range(30):
        row = {"lat": 1.0 + 0.01 * i, "lon": 103.5 + 0.02 * i}
        near = geo.haversine(row["lat"], row["lon"], 1.0, 103.5) <= 4321.5
        inside = geo.in_polygon(row["lat"], row["lon"], (1.0, 103.0, 1.0, 0.43215, 1.2345, 103.6))
        assert (near_id in got.get(i, [])) == near, i
        assert (poly_id in got.get(i, [])) == inside, i
