"""Window state against a brute-force recomputation (pure Python, no Spark)."""
import json
import math
import random
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings, strategies as st

from pep.core.plan import Aggregate, ExecutionPlan, Field, Field as _F, StreamSchema, WindowSpec
from pep.runtime.plans.compile import compile_plan
from pep.runtime.windows.pane_windows import PaneWindows
from pep.runtime.windows.window_reference import TimeWindows, TupleWindows, partials_from_rows

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
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


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
# ---------------------------------------------------------------------------------------------
# Panes: every attribute type, nulls, group-by keys, min_count, batches split anywhere
# ---------------------------------------------------------------------------------------------

WIDE = StreamSchema((_F("t", "double"), _F("d", "double"), _F("n", "long"), _F("s", "string"),
                     _F("b", "boolean"), _F("ts", "timestamp"), _F("k", "string")))
WIDE_AGGS = (tuple(Aggregate("d", f) for f in FUNCS)
             + tuple(Aggregate("n", f) for f in ("sum", "min", "max", "avg", "firstval"))
             + (Aggregate("s", "min"), Aggregate("s", "max"), Aggregate("s", "lastval"),
                Aggregate("b", "max"), Aggregate("b", "firstval"), Aggregate("ts", "lastval"),
                Aggregate("ts", "min")))
T0 = datetime(2024, 5, 1, tzinfo=UTC)


def wide_spec(kind, size, step, keys=(), min_count=1):
    return compile_plan(ExecutionPlan("s", None, (), WindowSpec(kind, size, step, WIDE_AGGS, "t",
                                                                min_count, keys)),
                        WIDE, "t").window


def wide_rows(draw_values):
    rows = []
    for i, (d, n, s, b, k, dt) in enumerate(draw_values):
        rows.append({"t": float(dt), "d": d, "n": n, "s": s, "b": b,
                     "ts": None if n is None else
                     (T0 + timedelta(microseconds=n * 1000 + i)).strftime(ISO),
                     "k": k})
    return rows


ISO = "%Y-%m-%dT%H:%M:%S.%fZ"


def agg_value(values, fn, ftype):
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
        return (min if fn == "min" else max)(present)
    return present[0] if fn == "firstval" else present[-1]


def brute_windows(rows, spec, key_attr=None):
    """Tuple windows per key value (brute force), sorted by (key, start)."""
    groups = {}
    for r in rows:
        groups.setdefault(r[key_attr] if key_attr else None, []).append(r)
    out = []
    for key in sorted(groups, key=lambda k: json.dumps(k)):
        part = groups[key]
        k = 0
        while k * spec.step + spec.size <= len(part):
            chunk = part[k * spec.step:k * spec.step + spec.size]
            if len(chunk) >= spec.min_count:
                out.append(window_row(chunk, spec, k * spec.step, k * spec.step + spec.size - 1,
                                      key_attr, key))
            k += 1
    return out


def window_row(chunk, spec, start, end, key_attr, key):
    row = {"window_start": start, "window_end": end}
    if key_attr:
        row[key_attr] = key
    types = dict(spec.attributes)
    for attr, fn, name in spec.aggregates:
        row[name] = agg_value([r[attr] for r in chunk], fn, types[attr])
    return row


def assert_same_rows(got, expected):
    assert len(got) == len(expected), (len(got), len(expected))
    for g, e in zip(got, expected, strict=True):
        assert list(g) == list(e), (g, e)  # same keys in the same order
        for name in e:
            a, b = g[name], e[name]
            if isinstance(a, float) or isinstance(b, float):
                assert a is not None and b is not None and math.isclose(a, b, rel_tol=1e-12,
                                                                        abs_tol=1e-9), (name, g, e)
            else:
                assert a == b and type(a) is type(b), (name, g, e)


def key_text(value):
    return json.dumps(value)


VALUES = st.tuples(st.one_of(st.none(), st.floats(-1e3, 1e3, allow_nan=False)),
                   st.one_of(st.none(), st.integers(-10 ** 6, 10 ** 6)),
                   st.one_of(st.none(), st.sampled_from(["a", "b\"q", "é", "", "zz"])),
                   st.one_of(st.none(), st.booleans()),
                   st.sampled_from(["x", "y", "z"]),
                   st.integers(0, 90))


@settings(max_examples=80, deadline=None)
@given(st.lists(VALUES, max_size=45), st.integers(1, 7), st.integers(1, 7), st.booleans(),
       st.integers(0, 9), st.lists(st.integers(0, 45), max_size=6))
def test_tuple_window_panes_match_brute_force(values, size, step, keyed, min_count, cuts):
    rows = wide_rows(values)
    spec = wide_spec("tuple", size, step, ("k",) if keyed else (), min_count)
    state = TupleWindows(spec)
    got = []
    for batch in chunks(rows, cuts):
        got.extend(state.add(batch, [key_text(r["k"]) for r in batch] if keyed else None))
    got.sort(key=lambda r: (json.dumps(r.get("k")), r["window_start"]))
    assert_same_rows(got, brute_windows(rows, spec, "k" if keyed else None))
    assert len(state.open) <= len({r["k"] for r in rows}) * -(-size // step)


def brute_time_windows(rows, spec, watermark, key_attr=None, not_before=None):
    out = []
    if watermark is None:
        return out
    keys = sorted({r[key_attr] if key_attr else None for r in rows}, key=json.dumps)
    for k in range(-20, 200):
        start, end = k * spec.step, k * spec.step + spec.size
        if end > watermark or (not_before is not None and start <= not_before):
            continue
        for key in keys:
            inside = [r for r in rows if start <= r["t"] < end
                      and (not key_attr or r[key_attr] == key)]
            inside.sort(key=lambda r: r["t"])  # stable: stream order among equal times
            if inside and len(inside) >= spec.min_count:
                out.append(window_row(inside, spec, start, end, key_attr, key))
    return out


@settings(max_examples=80, deadline=None)
@given(st.lists(VALUES, max_size=45), st.integers(1, 12), st.integers(1, 12), st.booleans(),
       st.integers(0, 4), st.lists(st.integers(0, 45), max_size=6))
def test_time_window_panes_match_brute_force_in_time_order(values, size, step, keyed,
                                                            min_count, cuts):
    rows = wide_rows(values)
    rows.sort(key=lambda r: r["t"])  # ties keep stream order
    spec = wide_spec("time", size, step, ("k",) if keyed else (), min_count)
    state = TimeWindows(spec)
    got = []
    seen = None
    for batch in chunks(rows, cuts):
        state.add(batch, [r["t"] for r in batch],
                  [key_text(r["k"]) for r in batch] if keyed else None)
        seen = max([r["t"] for r in batch] + ([seen] if seen is not None else []),
                   default=None)
        got.extend(state.advance(seen))
    got.sort(key=lambda r: (r["window_start"], json.dumps(r.get("k"))))
    assert_same_rows(got, brute_time_windows(rows, spec, seen, "k" if keyed else None))
    assert state.late == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(VALUES, min_size=1, max_size=30), st.integers(1, 12), st.integers(1, 12),
       st.booleans())
def test_time_windows_out_of_order_within_open_windows(values, size, step, keyed):
    """Tuples may arrive out of event-time order: the watermark only moves between batches,
    so all of a batch counts; late tuples (all their windows closed) are dropped and counted."""
    rows = wide_rows(values)
    spec = wide_spec("time", size, step, ("k",) if keyed else ())
    half = len(rows) // 2
    first, second = rows[:half], rows[half:]
    state = TimeWindows(spec)
    state.add(first, [r["t"] for r in first], [key_text(r["k"]) for r in first] if keyed else None)
    wm1 = max((r["t"] for r in first), default=None)
    got = state.advance(wm1)
    state.add(second, [r["t"] for r in second],
              [key_text(r["k"]) for r in second] if keyed else None)
    wm2 = max([r["t"] for r in rows])
    got += state.advance(wm2)
    closed = -math.inf if wm1 is None else wm1

    def late(r):
        k_last = math.floor(r["t"] / step)
        in_window = r["t"] < k_last * step + size
        return in_window and k_last * step + size <= closed
    kept = first + [r for r in second if not late(r)]
    kept_sorted = sorted(kept, key=lambda r: r["t"])
    expected = [w for w in brute_time_windows(kept_sorted, spec, wm2, "k" if keyed else None)
                if w["window_end"] > closed or w["window_end"] <= (wm1 if wm1 is not None
                                                                   else -math.inf)]
    # windows closed by the first watermark were emitted from the first half only
    first_sorted = sorted(first, key=lambda r: r["t"])
    expected = ([w for w in brute_time_windows(first_sorted, spec, wm1, "k" if keyed else None)]
                + [w for w in expected if w["window_end"] > closed])

    def key(r):
        return (r["window_start"], json.dumps(r.get("k")))

    assert_same_rows(sorted(got, key=key), sorted(expected, key=key))
    assert state.late == sum(1 for r in second if late(r))


def test_batches_split_at_every_position_give_the_same_windows():
    rnd = random.Random(7)
    values = [(rnd.choice([None, rnd.uniform(-5, 5)]), rnd.choice([None, rnd.randint(-9, 9)]),
               rnd.choice([None, "a", "b"]), rnd.choice([None, True, False]),
               rnd.choice("xy"), i // 3) for i in range(40)]
    rows = wide_rows(values)
    for kind, size, step, keyed in (("tuple", 6, 2, False), ("tuple", 5, 1, True),
                                    ("tuple", 3, 5, False), ("time", 4, 2, True),
                                    ("time", 3, 1, False)):
        spec = wide_spec(kind, size, step, ("k",) if keyed else ())
        whole = None
        for cut in range(len(rows) + 1):
            got = []
            if kind == "tuple":
                state = TupleWindows(spec)
                for batch in (rows[:cut], rows[cut:]):
                    got += state.add(batch, [key_text(r["k"]) for r in batch] if keyed else None)
            else:
                state = TimeWindows(spec)
                seen = None
                for batch in (rows[:cut], rows[cut:]):
                    state.add(batch, [r["t"] for r in batch],
                              [key_text(r["k"]) for r in batch] if keyed else None)
                    seen = max([r["t"] for r in batch] + ([seen] if seen is not None else []),
                               default=None)
                    got += state.advance(seen)
            got.sort(key=lambda r: (json.dumps(r.get("k")), r["window_start"]))
            if whole is None:
                whole = got
                assert whole
            assert_same_rows(got, whole)


def test_long_sums_beyond_64_bits_stay_exact():
    spec = compile_plan(ExecutionPlan("s", None, (), WindowSpec(
        "tuple", 3, 1, (Aggregate("n", "sum"), Aggregate("n", "avg")))), WIDE).window
    state = PaneWindows(spec)
    big = 2 ** 62
    rows = [{"n": big}, {"n": big}, {"n": big}, {"n": -big}]
    parts = partials_from_rows(state.layout, rows, range(4))
    out = [json.loads(t) for t in state.add(parts).texts]
    assert [w["sum_n"] for w in out] == [3 * big, big]
    assert out[0]["avg_n"] == float(big)
