"""Tuples a consumer's policy hides move no time (issue 21, part 1), on real Spark.

A stream's tuples go through the shared per-stream micro-batch job (`QueryLifecycle.on_batch`,
the same code path as the running query, fed with static batches); some of them are hidden by
the consumer's policy (another station, a higher level, no station or level at all) and carry
any timestamps: far in the future, far in the past, among the visible ones, none. For every
kind of plan (plain rows, time windows tumbling and sliding with keys, a time-window plan that
attaches to the running stream, tuple windows as rows and as panes aggregated in Spark, keyed
tuple windows) the consumer's output with the hidden tuples, placed in the visible tuples'
micro-batches or in micro-batches of their own, is exactly the output without them, batch by
batch, and both equal a brute-force recomputation of the runtime's semantics from the visible
tuples alone (pep/runtime/README.md, "Semantics"). An owner's plan on the same stream, which
sees everything, is checked against the same brute force over all tuples: the hidden tuples are
really there, and do move the owner's time.

Stream events (`pep/streams/events.py`) are the owner's declassification: an event's condition
reads every tuple of its stream, whatever a consumer's policy hides (README, "Stream events").
What must hold, and is checked here, is that nothing else moves them: tuples that do not meet the
condition change nothing, and no tuple's timestamp does.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

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
from pep.runtime.plans.compile import compile_plan

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("temp", "double"),
                       Field("station", "string"), Field("level", "long")))
SPARK_SCHEMA = ("ts timestamp, temp double, station string, level long, _xsg_seq long, "
                "_xsg_file string")
T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)  # a multiple of 60 s since the epoch
ISO = "%Y-%m-%dT%H:%M:%S.%fZ"
FUNCS = ("avg", "sum", "min", "max", "count", "firstval", "lastval")
POLICY = ((Predicate("station", "=", "A"), Predicate("level", "<=", 1)),)

CONSUMER = {
    "plain": ExecutionPlan("x", POLICY, ("ts", "temp", "level")),
    "time": ExecutionPlan("x", POLICY, (), WindowSpec(
        "time", 10, 10, tuple(Aggregate("temp", f) for f in FUNCS), "ts")),
    "time-sliding-keyed": ExecutionPlan("x", POLICY, (), WindowSpec(
        "time", 6, 2, (Aggregate("temp", "sum"), Aggregate("temp", "lastval"),
                       Aggregate("ts", "firstval")), "ts", min_count=2, keys=("level",))),
    "tuple-rows": ExecutionPlan("x", POLICY, (), WindowSpec(
        "tuple", 3, 1, (Aggregate("temp", "sum"), Aggregate("temp", "firstval"),
                        Aggregate("ts", "lastval")))),
    "tuple-panes": ExecutionPlan("x", POLICY, (), WindowSpec(
        "tuple", 4, 2, (Aggregate("temp", "max"), Aggregate("temp", "count"),
                        Aggregate("temp", "lastval")))),
    "tuple-keyed": ExecutionPlan("x", POLICY, (), WindowSpec(
        "tuple", 2, 2, (Aggregate("temp", "min"),), keys=("level",))),
}
# attached after the first visible micro-batch: its first windows may miss earlier tuples
LATE = {"time-late": ExecutionPlan("x", POLICY, (), WindowSpec(
    "time", 10, 5, (Aggregate("temp", "count"), Aggregate("temp", "avg")), "ts"))}
OWNER = {"owner-time": ExecutionPlan("x", None, (), WindowSpec(
    "time", 10, 10, tuple(Aggregate("temp", f) for f in FUNCS), "ts"))}
PLANS = {**CONSUMER, **LATE, **OWNER}
FAR = 10 ** 8  # seconds: about three years either way


# ---------------------------------------------------------------------------------------------
# The brute force: the runtime's semantics, tuple by tuple, from one plan's own tuples
# ---------------------------------------------------------------------------------------------

def passes(rec: dict, plan: ExecutionPlan) -> bool:
    if plan.filter_dnf is None:
        return True
    ops = {"=": lambda a, b: a == b, "<=": lambda a, b: a <= b}
    return any(all(rec[p.attribute] is not None and ops[p.op](rec[p.attribute], p.value)
                   for p in conj) for conj in plan.filter_dnf)


def seconds(ts: datetime) -> float:
    delta = ts - datetime(1970, 1, 1, tzinfo=UTC)
    micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    return micros / 1_000_000.0  # as Spark computes it: unix_micros / 1e6


def out(v):
    return v.strftime(ISO) if isinstance(v, datetime) else v


def aggregate(recs: list[dict], attr: str, fn: str, order) -> object:
    present = sorted(((order(r), r[attr]) for r in recs if r[attr] is not None),
                     key=lambda x: x[0])
    values = [v for _, v in present]
    if fn == "count":
        return len(values)
    if not values:
        return None
    if fn == "avg":
        return float(sum(values)) / len(values)
    if fn == "sum":
        return float(sum(values))
    if fn in ("min", "max"):
        return out((min if fn == "min" else max)(values))
    return out(values[0] if fn == "firstval" else values[-1])


def key_text(value) -> str:
    return json.dumps(value)


def brute(batches: list[list[dict]], plan: ExecutionPlan, lateness: float,
          first_batch: int = 0, late_start: bool = False) -> dict[int, list[dict]]:
    """Per micro-batch index, the rows the plan gets (batches before `first_batch`: not yet
    attached). Everything here is computed from the tuples that pass the plan's filter."""
    w = plan.window
    got: dict[int, list[dict]] = {}
    if w is None:
        for b, batch in enumerate(batches[first_batch:], first_batch):
            rows = [{a: out(r[a]) for a in plan.projection} for r in batch if passes(r, plan)]
            if rows:
                got[b] = rows
        return got
    key_of = (lambda r: r[w.keys[0]]) if w.keys else (lambda r: None)
    if w.kind == "tuple":
        seen: dict[object, list[dict]] = {}
        done: dict[object, int] = {}
        for b, batch in enumerate(batches[first_batch:], first_batch):
            for r in batch:
                if passes(r, plan):
                    seen.setdefault(key_of(r), []).append(r)
            rows = []
            for key in sorted(seen, key=key_text):
                part = seen[key]
                k = done.get(key, 0)
                while k * w.step + w.size <= len(part):
                    chunk = part[k * w.step:k * w.step + w.size]
                    row = {"window_start": k * w.step, "window_end": k * w.step + w.size - 1}
                    row.update({name: key for name in w.keys})
                    for a in w.aggregates:
                        row[a.output_name] = aggregate(chunk, a.attribute, a.function,
                                                       lambda r: r["_xsg_seq"])
                    rows.append(row)
                    k += 1
                done[key] = k
            if rows:
                got[b] = rows
        return got
    pane = math.gcd(w.size, w.step)
    closed, top, not_before = -math.inf, None, None
    bags: dict[tuple[int, object], list[dict]] = {}
    for b, batch in enumerate(batches[first_batch:], first_batch):
        mine = [r for r in batch if passes(r, plan) and r["ts"] is not None]
        if late_start and mine:
            not_before = math.floor(min(seconds(r["ts"]) for r in mine) / pane) * pane
            late_start = False
        for r in mine:
            t = seconds(r["ts"])
            k = math.floor(t / w.step)
            while k * w.step + w.size > t:
                start = k * w.step
                if start + w.size > closed and (not_before is None or start > not_before):
                    bags.setdefault((start, key_of(r)), []).append(r)
                k -= 1
            top = t if top is None else max(top, t)
        rows = []
        if top is not None and top - lateness > closed:
            mark = top - lateness
            for start, key in sorted(bags, key=lambda sk: (sk[0], key_text(sk[1]))):
                end = start + w.size
                chunk = bags[(start, key)]
                if closed < end <= mark and len(chunk) >= w.min_count:
                    row = {"window_start": out(datetime.fromtimestamp(start, UTC)),
                           "window_end": out(datetime.fromtimestamp(end, UTC))}
                    row.update({name: key for name in w.keys})
                    for a in w.aggregates:
                        row[a.output_name] = aggregate(
                            chunk, a.attribute, a.function,
                            lambda r: (seconds(r["ts"]), r["_xsg_seq"]))
                    rows.append(row)
            closed = mark
            bags = {sk: v for sk, v in bags.items() if sk[0] + w.size > closed}
        if rows:
            got[b] = rows
    return got


# ---------------------------------------------------------------------------------------------
# Running the shared micro-batch job
# ---------------------------------------------------------------------------------------------

@dataclass
class Stream:
    """One run's micro-batches (tuples in stream order, `_xsg_seq` numbered densely as the
    ingest numbers them) and, per batch, the index of the visible batch it carries (None for a
    batch of hidden tuples only)."""
    batches: list[list[dict]]
    visible_index: list[int | None]


def run(spark, tmp_path, stream: Stream, lateness: float) -> dict[str, dict[int, list[str]]]:
    """Every plan's deliveries, per index of the visible batch they came with."""
    from pep.runtime.query.executor import StreamExecutor
    sd = StreamDefinition("x", "o", SCHEMA, SourceSpec("ingest", (("path", str(tmp_path)),)),
                          time_attribute="ts")
    ex = StreamExecutor(spark, sd, tmp_path / "work", 0.25, 2, lateness, lambda h: None,
                        tuple_pane_min=2)  # tuple windows of panes >= 2 tuples go to Spark
    got: dict[str, dict[int, list[str]]] = {name: {} for name in PLANS}
    current = [0]  # the visible batch's index; -1 - i for the run's batch i of hidden tuples

    def collector(name: str):
        def deliver(batch) -> bool:  # (an exception here would only detach the handle)
            got[name].setdefault(current[0], []).extend(batch.rows)
            return True
        return deliver

    def attach(plans: dict[str, ExecutionPlan]) -> None:
        for name, plan in plans.items():
            ex.handles.add_handle(name, compile_plan(plan, SCHEMA, "ts"), collector(name))
    attach(CONSUMER)
    attach(OWNER)
    for i, (recs, visible) in enumerate(zip(stream.batches, stream.visible_index, strict=True)):
        current[0] = visible if visible is not None else -1 - i
        frame = spark.createDataFrame(
            [tuple(r[c] for c in ("ts", "temp", "station", "level", "_xsg_seq")) + (None,)
             for r in recs], SPARK_SCHEMA)
        ex.lifecycle.on_batch(frame, i)
        ex.wait_delivered()
        if visible == 0:
            attach(LATE)
    for name in PLANS:  # nothing reaches a consumer in a batch of tuples it cannot see
        if name not in OWNER:
            assert all(k >= 0 for k in got[name]), (name, sorted(got[name]))
    return got


def decoded(got: dict[int, list[str]]) -> dict[int, list[dict]]:
    return {k: [json.loads(t) for t in v] for k, v in got.items()}


def numbered(batches: list[list[dict]]) -> list[list[dict]]:
    n = 0
    out_batches = []
    for batch in batches:
        copy = []
        for r in batch:
            n += 1
            copy.append({**r, "_xsg_seq": n})
        out_batches.append(copy)
    return out_batches


def streams(visible: list[list[dict]], hidden: list[tuple[dict, int, bool]]
            ) -> tuple[Stream, Stream]:
    """(without, with): `hidden` is (tuple, slot, own batch); a slot picks the visible batch
    (and the position in it) or, with `own batch`, where a batch of hidden tuples goes."""
    n = len(visible)
    merged = [list(b) for b in visible]
    before: dict[int, list[dict]] = {}
    for rec, slot, own in hidden:
        if own:
            before.setdefault(slot % (n + 1), []).append(rec)
        else:
            target = merged[slot % n]
            target.insert((slot // 7) % (len(target) + 1), rec)
    batches, index = [], []
    for i in range(n + 1):
        if i in before:
            batches.append(before[i])
            index.append(None)
        if i < n:
            batches.append(merged[i])
            index.append(i)
    return (Stream(numbered(visible), list(range(n))), Stream(numbered(batches), index))


def ts_at(offset: float | None) -> datetime | None:
    return None if offset is None else T0 + timedelta(seconds=offset)


visible_tuple = st.builds(
    lambda s, micros, temp, level, no_time: {
        "ts": None if no_time else ts_at(s + micros / 1e6), "temp": temp,
        "station": "A", "level": level},
    st.integers(0, 40), st.sampled_from([0, 250_000, 999_999]),
    st.one_of(st.none(), st.integers(-5, 20).map(float)), st.sampled_from([0, 1]),
    st.integers(0, 11).map(lambda x: x == 0))
hidden_time = st.one_of(
    st.none(),
    st.integers(-10, 60).map(float),                       # among the visible tuples
    st.integers(0, 10 ** 6).map(lambda x: float(FAR + x)),  # far in the future
    st.integers(0, 10 ** 6).map(lambda x: float(-FAR - x)),  # far in the past
)
hidden_tuple = st.builds(
    lambda why, t, temp: {"ts": ts_at(t), "temp": temp,
                          "station": {"station": "B", "level": "A", "none": None}[why],
                          "level": {"station": 0, "level": 2, "none": None}[why]},
    st.sampled_from(["station", "level", "none"]), hidden_time,
    st.one_of(st.none(), st.integers(-100, 100).map(float)))
hidden_list = st.lists(st.tuples(hidden_tuple, st.integers(0, 10 ** 4), st.booleans()),
                       min_size=1, max_size=6)
visible_batches = st.lists(st.lists(visible_tuple, min_size=1, max_size=6), min_size=2,
                           max_size=3)


def _v(offset: float, temp: float | None = 1.0, level: int = 0) -> dict:
    return {"ts": ts_at(offset), "temp": temp, "station": "A", "level": level}


def _h(offset: float | None, why: str = "station") -> dict:
    return {"ts": ts_at(offset), "temp": 50.0, "station": "B" if why == "station" else "A",
            "level": 0 if why == "station" else 2}


# hand-picked cases first: far-future and far-past hidden tuples, in the visible tuples'
# batches and in their own, ahead of visible tuples that arrive out of order
VISIBLE = [[_v(1), _v(4, 2.0), _v(12, 3.0, 1)], [_v(9, 4.0), _v(15, None), _v(21, 5.0)],
           [_v(14, 6.0), _v(33, 7.0, 1), _v(35, 8.0)]]


@pytest.mark.timeout(600)
@settings(max_examples=3, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@example(visible=VISIBLE, hidden=[(_h(FAR), 0, False), (_h(-FAR, "level"), 8, False)],
         lateness=0.0)
@example(visible=VISIBLE, hidden=[(_h(FAR + 3), 1, True), (_h(25, "level"), 2, True),
                                  (_h(None), 3, True)], lateness=3.0)
@given(visible=visible_batches, hidden=hidden_list, lateness=st.sampled_from([0.0, 3.0]))
def test_hidden_tuples_change_nothing_in_a_consumers_output(spark, tmp_path_factory, visible,
                                                            hidden, lateness):
    without, with_hidden = streams(visible, hidden)
    base = tmp_path_factory.mktemp("hidden")
    got_without = run(spark, base / "without", without, lateness)
    got_with = run(spark, base / "with", with_hidden, lateness)
    if visible == VISIBLE:  # the hand-picked cases give every plan something to compare
        assert all(got_without[name] for name in PLANS), got_without
    for name, plan in {**CONSUMER, **LATE}.items():
        assert got_with[name] == got_without[name], name  # the same JSON texts, batch by batch
        first = 1 if name in LATE else 0
        want = brute(without.batches, plan, lateness, first, late_start=name in LATE)
        assert decoded(got_without[name]) == want, name
    # the owner's plan sees every tuple: its own time moves with the hidden ones
    owner = OWNER["owner-time"]
    by_run_index = {}
    for i, v in enumerate(with_hidden.visible_index):
        by_run_index[i] = v if v is not None else -1 - i
    want = brute(with_hidden.batches, owner, lateness)
    assert decoded(got_with["owner-time"]) == {by_run_index[i]: rows for i, rows in want.items()}


def test_a_late_plan_waits_for_its_own_first_tuple_not_the_streams(spark, tmp_path):
    """A time-window plan attached after the stream's query ran a micro-batch skips the windows
    that may hold tuples from before it attached; which those are comes from its own first
    tuple, not from the stream's latest time: a hidden far-future tuple before it attached
    hides none of its windows (it hid them all when the stream's time decided)."""
    later = [[_v(1), _v(3), _v(14), _v(16), _v(26)], [_v(31)]]
    got = run(spark, tmp_path / "a", Stream(numbered([[_v(0)], *later]), [0, 1, 2]), 0.0)
    got_hidden = run(spark, tmp_path / "b",
                     Stream(numbered([[_v(0), _h(FAR)], *later]), [0, 1, 2]), 0.0)
    assert got["time-late"] == got_hidden["time-late"]
    rows = [r["window_start"][:19] for rs in decoded(got["time-late"]).values() for r in rs]
    # first tuple at T0+1: windows starting at or before it are skipped; [T0+5, T0+15) onwards
    assert rows == ["2024-05-01T12:00:05", "2024-05-01T12:00:10", "2024-05-01T12:00:15",
                    "2024-05-01T12:00:20"], rows


def test_event_state_moves_only_with_tuples_that_meet_its_condition(spark, tmp_path):
    """The owner's event reads every tuple of the stream (its condition is the owner's
    declassification), but only through its condition: tuples that do not meet it change
    nothing, and neither does any tuple's timestamp (holds run on the gateway's clock)."""
    from pep.runtime.query.executor import StreamExecutor
    from pep.streams.events import StreamEvents

    sd = StreamDefinition("x", "o", SCHEMA, SourceSpec("ingest", (("path", str(tmp_path)),)),
                          time_attribute="ts")

    def states(batches: list[list[dict]], where: str) -> list[tuple]:
        clock = [1000.0]
        events = StreamEvents(tmp_path / f"{where}.db", lambda name: sd, clock=lambda: clock[0])
        try:
            definition = events.define("x", "hot", "temp > 30", hold=5, key="station",
                                       owner="o")
            ex = StreamExecutor(spark, sd, tmp_path / where, 0.25, 2, 0.0, lambda h: None)
            ex.handles.add_handle(definition.runtime_id,
                                  compile_plan(events.plan(definition), SCHEMA, "ts"),
                                  lambda rows: events.observe(definition, rows))
            seen = []
            for i, recs in enumerate(numbered(batches)):
                frame = spark.createDataFrame(
                    [tuple(r[c] for c in ("ts", "temp", "station", "level", "_xsg_seq"))
                     + (None,) for r in recs], SPARK_SCHEMA)
                ex.lifecycle.on_batch(frame, i)
                ex.wait_delivered()
                events.tick()
                seen.append((events.version, events.environment(sd.name)))
                clock[0] += 4.0
            return seen
        finally:
            events.close()

    def rec(offset, temp, station="B"):
        return {"ts": ts_at(offset), "temp": temp, "station": station, "level": 3}
    base = [[rec(0, 10.0)], [rec(1, 35.0, "S1")], [rec(2, 12.0)], [], [rec(3, 31.0, "S2")], []]
    cold = [[rec(FAR, 10.0), rec(-FAR, None)], [rec(None, 30.0)], [rec(FAR, -1.0)], [], [], []]
    # tuples that do not meet `temp > 30` added
    noisy = [a + b for a, b in zip(base, cold, strict=True)]
    shifted = [[{**r, "ts": ts_at(FAR)} for r in batch] for batch in base]  # other timestamps
    want = states(base, "base")
    assert [env != [] for _, env in want] == [False, True, True, False, True, True]
    assert states(noisy, "noisy") == want
    assert states(shifted, "shifted") == want


# ---------------------------------------------------------------------------------------------
# Joins: each side's watermark is taken after its policy filter (pep/runtime/joins/runtime.py)
# ---------------------------------------------------------------------------------------------

J0 = 1_740_000_000  # a multiple of 10: windows are aligned to the epoch
J_LATENESS = 5.0
J_WITHIN = 3.0
LEFT_SCHEMA = StreamSchema((Field("t", "timestamp"), Field("station", "string"),
                            Field("rainrate", "double")))
RIGHT_SCHEMA = StreamSchema((Field("ts", "double"), Field("area", "string"), Field("mmsi", "long")))


def join_plan():
    from pep.core.plan import JoinPlan
    window = WindowSpec("time", 10, 10, (Aggregate("rainrate", "avg"),
                                         Aggregate("rainrate", "count")), "t", 2, ("station",))
    left = ExecutionPlan("st", ((Predicate("rainrate", ">", 1.0),),), ("station", "rainrate"),
                         window)
    right = ExecutionPlan("sh", ((Predicate("mmsi", "!=", 7),),), ("ts", "area", "mmsi"))
    return JoinPlan(left, right, (("station", "area"),), J_WITHIN, "window_end", "ts")


def run_join(spark, directory, batches: list[tuple[list[dict], list[dict]]]) -> list[tuple]:
    """The join's rows over `batches` (one left file and one right file per micro-batch, read
    one file per side and batch, in order), by the join runtime's own query (`joined_frame`)."""
    import os

    from pyspark.sql import functions as F

    from pep.runtime.joins.frames import joined_frame
    from tests.pep.runtime.support import write_jsonl

    left = StreamDefinition("st", "t", LEFT_SCHEMA, SourceSpec(
        "files", (("path", str(directory / "st")), ("format", "json"))), "t")
    right = StreamDefinition("sh", "t", RIGHT_SCHEMA, SourceSpec(
        "files", (("path", str(directory / "sh")), ("format", "json"))), "ts")
    for i, (lrecs, rrecs) in enumerate(batches):
        for side, recs in (("st", lrecs), ("sh", rrecs)):
            write_jsonl(directory / side, f"{i:03d}.json", recs)
            os.utime(directory / side / f"{i:03d}.json", (1_600_000_000 + i,) * 2)
    frame, outputs = joined_frame(spark, left, right, join_plan(), J_LATENESS, max_files=1)
    rows: list[tuple] = []

    def collect(batch, batch_id):
        rows.extend(tuple(r) for r in batch.select(
            *[F.col(o.internal).alias(o.name) for o in outputs]).collect())
    query = (frame.writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(directory / "checkpoint"))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(240), "the join query did not finish"
        assert query.exception() is None
    finally:
        query.stop()
    return sorted(rows, key=repr)


def brute_join(batches: list[tuple[list[dict], list[dict]]]) -> list[tuple]:
    """From the authorised rows only: 10 s windows per station of >= 2 tuples of rainrate > 1
    that the final watermark (the lower side's latest authorised time minus the lateness) has
    passed, each with the authorised ship reports within 3 s of its end in its area."""
    lefts = [r for lb, _ in batches for r in lb
             if r["rainrate"] is not None and r["rainrate"] > 1 and r["t"] is not None]
    rights = [r for _, rb in batches for r in rb
              if r["mmsi"] is not None and r["mmsi"] != 7 and r["ts"] is not None]
    mark = min(max(r["t"] for r in lefts), max(r["ts"] for r in rights)) - J_LATENESS
    groups: dict[tuple, list[float]] = {}
    for r in lefts:
        groups.setdefault((math.floor(r["t"] / 10) * 10, r["station"]), []).append(r["rainrate"])
    out_rows = []
    for (start, station), values in groups.items():
        if len(values) < 2 or start + 10 > mark:
            continue
        for r in rights:
            if r["area"] == station and abs(start + 10 - r["ts"]) <= J_WITHIN:
                out_rows.append((
                    datetime.fromtimestamp(start, UTC).replace(tzinfo=None),
                    datetime.fromtimestamp(start + 10, UTC).replace(tzinfo=None),
                    station, sum(values) / len(values), len(values), r["ts"], r["area"],
                    r["mmsi"]))
    return sorted(out_rows, key=repr)


def join_files(batches):
    """Records as the files hold them (the left time as ISO text)."""
    return [([{**r, "t": None if r["t"] is None else out(datetime.fromtimestamp(
        r["t"], UTC))} for r in lb], rb) for lb, rb in batches]


# the visible reports, in time order, batch by batch; the last pair moves both sides' time
# far enough for the earlier windows to close
J_VISIBLE = [
    ([{"t": J0 + s, "station": "AB"[s % 2], "rainrate": 2.0 + s % 3} for s in range(0, 8)],
     [{"ts": J0 + s + 0.5, "area": "AB"[s % 2], "mmsi": s} for s in range(0, 8)]),
    ([{"t": J0 + s, "station": "AB"[s % 2], "rainrate": 2.0 + s % 5} for s in range(8, 16)],
     [{"ts": J0 + s + 0.5, "area": "AB"[s % 2], "mmsi": s % 7 or 1} for s in range(8, 16)]),
    ([{"t": J0 + s, "station": "AB"[s % 2], "rainrate": 3.0} for s in range(16, 24)],
     [{"ts": J0 + s + 0.5, "area": "AB"[s % 2], "mmsi": s % 7 or 1} for s in range(16, 24)]),
    ([{"t": J0 + 60.0, "station": "C", "rainrate": 5.0}],
     [{"ts": J0 + 60.0, "area": "C", "mmsi": 1}]),
    ([{"t": J0 + 61.0, "station": "C", "rainrate": 5.0}],
     [{"ts": J0 + 61.0, "area": "C", "mmsi": 1}]),
]
hidden_left = st.builds(lambda t, rate: {"t": t, "station": "AB"[int(abs(t or 0)) % 2],
                                         "rainrate": rate},
                        st.one_of(st.none(), st.sampled_from([J0 + FAR, J0 - FAR, J0 + 12.25])),
                        st.sampled_from([None, 1.0, -3.0]))
hidden_right = st.builds(lambda t, mmsi: {"ts": t, "area": "AB"[int(abs(t or 0)) % 2],
                                          "mmsi": mmsi},
                         st.one_of(st.none(), st.sampled_from([J0 + FAR, J0 - FAR, J0 + 9.5])),
                         st.sampled_from([None, 7]))


def join_batches(hidden: list[tuple[str, dict, int, bool]]):
    """The visible batches with the hidden reports placed in them (`own` False) or in pairs of
    files of their own before the slot's batch (`own` True)."""
    n = len(J_VISIBLE)
    merged = [(list(lb), list(rb)) for lb, rb in J_VISIBLE]
    before: dict[int, tuple[list, list]] = {}
    for side, rec, slot, own in hidden:
        where = before.setdefault(slot % n, ([], [])) if own else merged[slot % n]
        target = where[0] if side == "left" else where[1]
        target.insert((slot // 5) % (len(target) + 1), rec)
    out_batches = []
    for i in range(n):
        if i in before:
            out_batches.append(before[i])
        out_batches.append(merged[i])
    return out_batches


@pytest.mark.timeout(600)
@settings(max_examples=1, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@example(hidden=[("left", {"t": J0 + FAR, "station": "A", "rainrate": 1.0}, 0, False),
                 ("right", {"ts": J0 + FAR, "area": "A", "mmsi": 7}, 5, False),
                 ("left", {"t": J0 - FAR, "station": "B", "rainrate": None}, 1, True),
                 ("right", {"ts": J0 + FAR, "area": "B", "mmsi": None}, 2, True)])
@given(hidden=st.lists(st.one_of(
    st.tuples(st.just("left"), hidden_left, st.integers(0, 99), st.booleans()),
    st.tuples(st.just("right"), hidden_right, st.integers(0, 99), st.booleans())),
    min_size=2, max_size=5))
def test_hidden_tuples_change_nothing_in_a_join(spark, tmp_path_factory, hidden):
    base = tmp_path_factory.mktemp("join")
    if not _JOIN_WITHOUT:  # the same for every example: run once
        without = run_join(spark, base / "without", join_files(J_VISIBLE))
        assert without == brute_join(J_VISIBLE)
        assert len(without) >= 4  # windows of both stations met ship reports
        _JOIN_WITHOUT.append(without)
    assert run_join(spark, base / "with", join_files(join_batches(hidden))) == _JOIN_WITHOUT[0]


_JOIN_WITHOUT: list[list[tuple]] = []


def test_numeric_times_that_are_no_time_move_nothing(spark, tmp_path):
    """A numeric time attribute holding NaN, an infinity or a value beyond 2^53 seconds is no
    time: such a tuple joins no window and moves no plan's clock, whether a policy hides it or
    not, and the micro-batch does not fail on it (ANSI floor() overflows on such values)."""
    from pep.runtime.query.executor import StreamExecutor

    schema = StreamSchema((Field("tn", "double"), Field("temp", "double"),
                           Field("station", "string")))
    sd = StreamDefinition("n", "o", schema, SourceSpec("ingest", (("path", str(tmp_path)),)),
                          time_attribute="tn")
    plans = {
        "own": ExecutionPlan("n", ((Predicate("station", "=", "A"),),), (), WindowSpec(
            "time", 10, 5, (Aggregate("temp", "sum"), Aggregate("tn", "lastval")), "tn")),
        "all": ExecutionPlan("n", None, (), WindowSpec(
            "time", 10, 10, (Aggregate("temp", "count"),), "tn")),
    }

    def go(where: str, batches: list[list[tuple]]) -> dict[str, list[str]]:
        ex = StreamExecutor(spark, sd, tmp_path / where, 0.25, 2, 0.0, lambda h: None)
        got: dict[str, list[str]] = {name: [] for name in plans}
        for name, plan in plans.items():
            ex.handles.add_handle(name, compile_plan(plan, schema, "tn"),
                                  lambda batch, name=name: got[name].extend(batch.rows) or True)
        seq = 0
        for i, batch in enumerate(batches):
            rows = []
            for rec in batch:
                seq += 1
                rows.append(rec + (seq, None))
            ex.lifecycle.on_batch(spark.createDataFrame(
                rows, "tn double, temp double, station string, _xsg_seq long, _xsg_file string"),
                i)
            ex.wait_delivered()
        return got
    plain = [[(1000.0, 1.0, "A"), (1004.5, 2.0, "A")], [(1012.0, 3.0, "A")],
             [(1031.0, 4.0, "A")]]
    odd = [(float("nan"), 9.0, "A"), (float("inf"), 9.0, "B"), (-float("inf"), 9.0, "A"),
           (1e300, 9.0, "A"), (-2.0 ** 60, 9.0, "B")]
    noisy = [plain[0] + odd[:3], odd[3:] + plain[1], plain[2]]
    want = go("plain", plain)
    assert want["own"] and want["all"]
    assert go("noisy", noisy) == want
