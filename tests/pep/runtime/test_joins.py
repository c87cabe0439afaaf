"""The join runtime (pep/runtime/joins/runtime.py) on Spark: a time-windowed side joined on its
window outputs, checked against brute force; identical joins share one query; detach stops it.

Left: `st(t, station, rainrate)`, its side filtered (rainrate > 1) and windowed (10 s tumbling
windows per station, at least 2 tuples, avg / firstval / count of rainrate). Right: `sh(ts, area,
mmsi)` with its time as epoch seconds (a number). They meet when station = area and the window's
end is within 3 s of the ship's time.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from datetime import UTC, datetime

import pytest

from pep.core.plan import (
    Aggregate,
    ExecutionPlan,
    Field,
    JoinPlan,
    Predicate,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
    WindowSpec,
)
from tests.pep.runtime.support import wait_until, write_jsonl

T0 = 1_740_000_000  # a multiple of 10: windows are aligned to the epoch
LATENESS = 2.0
WITHIN = 3.0


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def definitions(tmp_path):
    left = StreamDefinition("st", "t", StreamSchema((Field("t", "timestamp"),
                                                      Field("station", "string"),
                                                      Field("rainrate", "double"))),
                            SourceSpec("ingest", (("path", str(tmp_path / "st")),)), "t")
    right = StreamDefinition("sh", "t", StreamSchema((Field("ts", "double"),
                                                       Field("area", "string"),
                                                       Field("mmsi", "long"))),
                             SourceSpec("ingest", (("path", str(tmp_path / "sh")),)), "ts")
    return left, right


def plan() -> JoinPlan:
    window = WindowSpec("time", 10, 10, (Aggregate("rainrate", "avg"),
                                         Aggregate("rainrate", "firstval"),
                                         Aggregate("rainrate", "count")), "t", 2, ("station",))
    left = ExecutionPlan("st", ((Predicate("rainrate", ">", 1.0),),), ("station", "rainrate"),
                         window)
    right = ExecutionPlan("sh", ((Predicate("mmsi", "!=", 7),),), ("ts", "area", "mmsi"))
    return JoinPlan(left, right, (("station", "area"),), WITHIN, "window_end", "ts")


def data(n: int = 40):
    left = [{"t": iso(T0 + i), "station": "AB"[i % 2], "rainrate": float(i * 5 % 7),
             "_xsg_seq": i + 1} for i in range(n)]
    right = [{"ts": T0 + i + 0.5, "area": "ABC"[i % 3], "mmsi": i % 9, "_xsg_seq": i + 1}
             for i in range(n)]
    return left, right


def expected(left, right) -> Counter:
    """Each side's plan first (filter, then 10 s windows per station of >= 2 tuples, emitted
    once the watermark, the lower side's latest time minus the lateness, passes their end), then
    the join."""
    def secs(text):
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    watermark = min(max(secs(r["t"]) for r in left), max(r["ts"] for r in right)) - LATENESS
    groups: dict[tuple, list] = {}
    for r in left:
        if r["rainrate"] > 1:
            start = math.floor(secs(r["t"]) / 10) * 10
            groups.setdefault((start, r["station"]), []).append(r)
    windows = []
    for (start, station), rows in groups.items():
        if len(rows) >= 2 and start + 10 <= watermark:
            values = [r["rainrate"] for r in rows]
            windows.append({"st.window_start": iso(start), "st.window_end": iso(start + 10),
                            "st.station": station, "st.avg_rainrate": sum(values) / len(values),
                            "st.firstval_rainrate": values[0], "st.count_rainrate": len(values)})
    out = Counter()
    for w in windows:
        end = secs(w["st.window_end"])
        for r in right:
            if r["mmsi"] != 7 and r["area"] == w["st.station"] and abs(end - r["ts"]) <= WITHIN:
                out[_key({**w, "sh.ts": r["ts"], "sh.area": r["area"], "sh.mmsi": r["mmsi"]})] += 1
    return out


def _key(row: dict) -> tuple:
    return tuple(sorted((k, round(v, 9) if isinstance(v, float) else v) for k, v in row.items()))


@pytest.fixture
def joins(spark, tmp_path):
    from pep.runtime.joins.runtime import JoinRuntime
    rt = JoinRuntime(spark, tmp_path / "work", trigger_interval=0.25, lateness=LATENESS)
    yield rt
    rt.stop()


def test_a_windowed_side_joins_on_its_window_outputs(joins, tmp_path):
    left_def, right_def = definitions(tmp_path)
    left, right = data()
    write_jsonl(tmp_path / "st", "0.json", left)
    write_jsonl(tmp_path / "sh", "0.json", right)
    got: list[dict] = []
    shared: list[dict] = []

    def deliver(batch) -> bool:
        got.extend(json.loads(text) for text in batch.rows)
        return True

    def deliver_shared(batch) -> bool:
        shared.extend(json.loads(text) for text in batch.rows)
        return True
    joins.attach_join("a", (left_def, right_def), plan(), deliver)
    joins.attach_join("b", (left_def, right_def), plan(), deliver_shared)  # same plan: same query
    assert len(joins.stats()) == 1 and set(joins.handles()) == {"a", "b"}
    want = expected(left, right)
    assert sum(want.values()) >= 10
    assert wait_until(lambda: len(got) >= sum(want.values()), timeout=150), (len(got), want)
    assert Counter(_key(r) for r in got) == want
    assert shared == got
    stats = next(iter(joins.stats().values()))
    assert stats["handles"] == 2 and stats["late_rows"] == 0 and stats["last_error"] is None
    joins.detach("a")
    joins.detach("a")  # idempotent
    assert len(joins.stats()) == 1
    joins.detach("b")  # the last handle: the query stops
    assert joins.stats() == {} and joins.handles() == {}


def test_a_sides_spatial_filter_matches_the_reference_semantics(spark):
    """DISTANCE and WITHIN_POLYGON (inside and outside) in a join side's filter, on Spark,
    against pep.core.conditions' evaluation; DISTANCE_TO is refused by the join runtime."""
    import random

    from pep.core.plan import SpatialPredicate
    from pep.runtime.joins.frames import JoinPlanError, filter_column

    schema = StreamSchema((Field("id", "long"), Field("lat", "double"), Field("lon", "double")))
    definition = StreamDefinition("pos", "t", schema, SourceSpec("ingest"))
    polygon = (1.0, 103.0, 1.0, 104.0, 2.0, 104.0, 2.0, 103.5)
    rng = random.Random(7)
    rows = [(i, round(rng.uniform(0.5, 2.5), 4), round(rng.uniform(102.5, 104.5), 4))
            for i in range(400)] + [(400, None, 103.5), (401, 95.0, 103.5), (402, 1.0, 103.5)]
    frame = spark.createDataFrame(rows, "id long, lat double, lon double")
    from pep.core.conditions import spatial_holds

    for dnf in [
            ((SpatialPredicate("polygon", "lat", "lon", "=", 0.0, polygon),),),
            ((SpatialPredicate("polygon", "lat", "lon", "!=", 0.0, polygon),),),
            ((SpatialPredicate("distance", "lat", "lon", "<=", 60000.0, (1.5, 103.5)),
              SpatialPredicate("polygon", "lat", "lon", "=", 0.0, polygon)),
             (Predicate("lat", ">", 2.4),))]:
        got = {r["id"] for r in frame.where(filter_column(dnf, definition)).collect()}
        want = {i for i, lat, lon in rows
                if any(all((spatial_holds(p, {"lat": lat, "lon": lon}) is True)
                           if isinstance(p, SpatialPredicate)
                           else (lat is not None and lat > p.value) for p in conj)
                       for conj in dnf)}
        assert got == want and 0 < len(got) < len(rows), dnf
    with pytest.raises(JoinPlanError, match="DISTANCE_TO"):
        filter_column(((SpatialPredicate("distance_to", "lat", "lon", "<=", 1.0, (), "id", 7),),),
                      definition)
