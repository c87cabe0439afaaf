"""Window state against a brute-force recomputation (pure Python, no Spark)."""
import random

from hypothesis import given, settings, strategies as st

from pep.core.plan import Aggregate, ExecutionPlan, Field, StreamSchema, WindowSpec
from pep.runtime.compile import compile_plan
from pep.runtime.windows import TimeWindows, TupleWindows

SCHEMA = StreamSchema((Field("t", "double"), Field("v", "double")))
FUNCS = ("avg", "max", "min", "sum", "count", "firstval", "lastval")


def spec(kind, size, step):
    aggs = tuple(Aggregate("v", f) for f in FUNCS)
    return compile_plan(ExecutionPlan("s", None, (), WindowSpec(kind, size, step, aggs, "t")),
                        SCHEMA).window


def brute(values):
    present = [v for v in values if v is not None]
    out = {"count_v": len(present)}
    for f in FUNCS:
        if f == "count":
            continue
        out[f"{f}_v"] = None if not present else {
            "avg": sum(present) / len(present) if present else None, "max": max(present),
            "min": min(present), "sum": sum(present), "firstval": present[0],
            "lastval": present[-1]}[f]
    return out


def chunks(items, cuts):
    cuts = sorted(set(c for c in cuts if 0 < c < len(items)))
    bounds = [0] + cuts + [len(items)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-50, 50)), max_size=40),
       st.integers(1, 6), st.integers(1, 6), st.lists(st.integers(0, 40), max_size=5))
def test_tuple_windows_match_brute_force_across_batches(values, size, step, cuts):
    rows = [{"t": float(i), "v": v} for i, v in enumerate(values)]
    state = TupleWindows(spec("tuple", size, step))
    got = [w for batch in chunks(rows, cuts) for w in state.add(batch)]
    expected = []
    k = 0
    while k * step + size <= len(rows):
        window = rows[k * step:k * step + size]
        expected.append({"window_start": k * step, "window_end": k * step + size - 1,
                         **brute([r["v"] for r in window])})
        k += 1
    assert got == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 60, allow_nan=False), st.integers(-9, 9)), max_size=40),
       st.integers(1, 12), st.integers(1, 12), st.lists(st.integers(0, 40), max_size=5))
def test_time_windows_match_brute_force_when_batches_arrive_in_time_order(points, size, step, cuts):
    points = sorted(points, key=lambda p: p[0])
    rows = [{"t": t, "v": v} for t, v in points]
    state = TimeWindows(spec("time", size, step))
    got = []
    for batch in chunks(rows, cuts):
        state.add(batch, [r["t"] for r in batch])
        got.extend(state.advance(max((r["t"] for r in rows[:rows.index(batch[-1]) + 1]),
                                     default=None) if batch else None))
    watermark = max((r["t"] for r in rows), default=None)
    expected = []
    if watermark is not None:
        for k in range(-13, int(60 // step) + 2):
            start, end = k * step, k * step + size
            inside = [r["v"] for r in rows if start <= r["t"] < end]
            if inside and end <= watermark:
                expected.append({"window_start": start, "window_end": end, **brute(inside)})
    assert got == expected
    assert state.late == 0


def test_late_tuples_are_dropped_and_counted_and_partial_windows_suppressed():
    state = TimeWindows(spec("time", 10, 10))
    state.add([{"t": 3.0, "v": 1}], [3.0])
    assert state.advance(12.0) == [{"window_start": 0, "window_end": 10, **brute([1])}]
    state.add([{"t": 4.0, "v": 5}, {"t": 15.0, "v": 2}], [4.0, 15.0])
    assert state.late == 1
    assert state.advance(20.0) == [{"window_start": 10, "window_end": 20, **brute([2])}]
    joined_late = TimeWindows(spec("time", 10, 5), not_before=12.0)
    joined_late.add([{"t": 13.0, "v": 1}, {"t": 16.0, "v": 2}], [13.0, 16.0])
    assert joined_late.advance(30.0) == [{"window_start": 15, "window_end": 25, **brute([2])}]


def test_tuple_window_state_stays_small():
    state = TupleWindows(spec("tuple", 5, 2))
    for _ in range(200):
        state.add([{"t": 0.0, "v": random.random()} for _ in range(7)])
        assert len(state.open) <= 3


def test_time_windows_with_too_few_tuples_are_not_emitted():
    aggs = tuple(Aggregate("v", f) for f in FUNCS)
    three = compile_plan(ExecutionPlan("s", None, (), WindowSpec("time", 10, 10, aggs, "t", 3)),
                         SCHEMA).window
    state = TimeWindows(three)
    # window [0, 10) holds one tuple (shown raw if emitted), window [10, 20) holds three
    state.add([{"t": 1.0, "v": 7.0}, {"t": 11.0, "v": None}, {"t": 12.0, "v": 2.0},
               {"t": 13.0, "v": 4.0}], [1.0, 11.0, 12.0, 13.0])
    assert state.advance(25.0) == [{"window_start": 10, "window_end": 20,
                                    **brute([None, 2.0, 4.0])}]
