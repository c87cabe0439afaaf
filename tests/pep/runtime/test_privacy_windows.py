"""Differentially private windows on real Spark: every value is clamped into the policy's
bounds by the panes job before it is summed (a private plan never takes the rows path, where
tuples reach the driver raw), an exact plan on the same stream at the same time is untouched,
and every aggregate comes out noisy.

The epsilon here is large (100 per window), so that the noise is small enough to tell a
clamped sum from an unclamped one: each tolerance below is many noise scales wide (a false
failure is rarer than one in a million) and far narrower than the gap clamping makes.
"""
from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from pep.core.plan import (
    Aggregate,
    ExecutionPlan,
    Field,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
    WindowSpec,
)
from pep.core.privacy import Bound, Budget, PrivacySpec
from tests.pep.runtime.support import Collector, wait_until, write_jsonl

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("temp", "double"), Field("hum", "long"),
                       Field("station", "string")))
T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
SPEC = PrivacySpec(100.0, 0.0, (Bound("temp", 0.0, 10.0), Bound("hum", 0, 5)),
                   (Budget(1e6, 60),))
AGGS = (Aggregate("temp", "sum"), Aggregate("temp", "count"), Aggregate("hum", "sum"),
        Aggregate("hum", "avg"))


def records(n: int) -> list[dict]:
    out = []
    for i in range(n):
        out.append({"ts": (T0 + timedelta(seconds=1.5 * i)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                    "temp": None if i % 7 == 3 else [100.0, -3.0, 4.5, 2000.0, 7.25][i % 5],
                    "hum": [80, 2, -40, 4][i % 4], "station": "ab"[i % 2], "_xsg_seq": i})
    return out


def clamp(v, lo, hi):
    return None if v is None else min(max(v, lo), hi)


def test_private_windows_are_clamped_in_spark_and_noisy(runtime, tmp_path):
    sd = StreamDefinition("obs", "nea", SCHEMA,
                          SourceSpec("ingest", (("path", str(tmp_path / "obs")),)),
                          time_attribute="ts")
    private = ExecutionPlan("obs", None, (), WindowSpec("tuple", 3, 3, AGGS, privacy=SPEC))
    exact = ExecutionPlan("obs", None, (), WindowSpec("tuple", 3, 3, AGGS))
    keyed = ExecutionPlan("obs", None, (), WindowSpec(
        "time", 10, 10, (Aggregate("temp", "sum"),), "ts", keys=("station",), privacy=SPEC))
    per_key = ExecutionPlan("obs", None, (), WindowSpec(
        "tuple", 2, 2, (Aggregate("temp", "sum"),), keys=("station",), privacy=SPEC))
    sinks = {"private": Collector(), "exact": Collector(), "keyed": Collector(),
             "per_key": Collector()}
    runtime.attach_handle("private", sd, private, sinks["private"])
    runtime.attach_handle("exact", sd, exact, sinks["exact"])
    runtime.attach_handle("keyed", sd, keyed, sinks["keyed"])
    runtime.attach_handle("per_key", sd, per_key, sinks["per_key"])
    data = records(60)
    for n in range(2):
        write_jsonl(tmp_path / "obs", f"part-{n}.json", data[n * 30:(n + 1) * 30])
        time.sleep(0.1)
    assert wait_until(lambda: len(sinks["private"].rows) >= 20
                      and len(sinks["exact"].rows) >= 20 and len(sinks["keyed"].rows) >= 8
                      and len(sinks["per_key"].rows) >= 30,
                      120), {k: len(v.rows) for k, v in sinks.items()}

    # the exact plan on the same stream sees the values as they are
    for k, row in enumerate(sinks["exact"].rows[:20]):
        window = data[3 * k:3 * k + 3]
        temps = [r["temp"] for r in window if r["temp"] is not None]
        assert row["sum_temp"] == (sum(temps) if temps else None)
        assert row["sum_hum"] == sum(r["hum"] for r in window)

    # the private one sees them clamped (temp to [0, 10], hum to [0, 5]) and noisy
    exactly_equal = 0
    for k, row in enumerate(sinks["private"].rows[:20]):
        window = data[3 * k:3 * k + 3]
        temps = [clamp(r["temp"], 0.0, 10.0) for r in window if r["temp"] is not None]
        hums = [clamp(r["hum"], 0, 5) for r in window]
        assert abs(row["sum_temp"] - sum(temps)) < 8  # Laplace scale 0.4
        assert row["count_temp"] == len(temps)  # discrete Laplace scale 0.04: ~never moves
        assert isinstance(row["sum_hum"], int) and abs(row["sum_hum"] - sum(hums)) <= 5
        assert 0 <= row["avg_hum"] <= 5
        exactly_equal += row["sum_temp"] == sum(temps)
        unclamped = sum(r["temp"] for r in window if r["temp"] is not None)
        if abs(unclamped - sum(temps)) > 60:
            assert abs(row["sum_temp"] - unclamped) > 50
    assert exactly_equal == 0  # noise on every sum of doubles

    # keyed time windows (clamped in the panes job's aggregation): one row per station
    by_window: dict = {}
    for r in data:
        t = datetime.fromisoformat(r["ts"].replace("Z", "+00:00")).timestamp()
        start = int(t // 10 * 10)
        if r["temp"] is not None:
            by_window.setdefault((start, r["station"]), []).append(clamp(r["temp"], 0.0, 10.0))
    for row in sinks["keyed"].rows:
        start = datetime.fromisoformat(row["window_start"].replace("Z", "+00:00")).timestamp()
        want = sum(by_window.get((int(start), row["station"]), []))
        assert abs(row["sum_temp"] - want) < 8

    # keyed tuple windows (narrow panes, which would travel as rows if exact): per station
    for row in sinks["per_key"].rows:
        mine = [r for r in data if r["station"] == row["station"]]
        window = mine[row["window_start"]:row["window_end"] + 1]
        want = sum(clamp(r["temp"], 0.0, 10.0) for r in window if r["temp"] is not None)
        assert abs(row["sum_temp"] - want) < 8
