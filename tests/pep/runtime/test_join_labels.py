"""Security labels in joins on Spark (pep/runtime/joins/runtime.py): a windowed side's `lub` and
label bound, and a joined row's `label`, over random lattices against brute force (pep.core.labels).

The static cases run the join's very expressions (`side_frame`, `joined_frame`) over static
DataFrames of the sources' shape: quick, so several random lattices, labels, bounds and sessions
each. One case runs a real streaming join (JoinRuntime) over files, with its watermarks."""
from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from dataclasses import replace

import pytest

from pep.core.graph import QueryGraph, Source
from pep.core.join import JoinSide, build_join
from pep.core.labels import Label, Lattice, lub
from pep.core.merge import merge
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
from pep.core.userquery import JoinQuery, UserQuery
from tests.pep.runtime.support import Collector, wait_until, write_jsonl

T0 = 1_740_000_000  # a multiple of 10
WITHIN = 4.0


def random_lattice(rng: random.Random) -> Lattice:
    levels = tuple(f"L{i}" for i in range(rng.randint(2, 4)))
    return Lattice(levels, tuple(f"c{i}" for i in range(rng.randint(0, 5))))


def random_label(rng: random.Random, lattice: Lattice) -> Label:
    return lattice.parse({"level": rng.choice(lattice.levels),
                          "categories": [c for c in lattice.categories if rng.random() < 0.35]})


def definitions(tmp_path, left_lattice: Lattice, right_lattice: Lattice):
    left = StreamDefinition("la", "o", StreamSchema((
        Field("t", "double"), Field("k", "string"), Field("x", "long"),
        Field("level", "label", left_lattice))),
        SourceSpec("ingest", (("path", str(tmp_path / "la")),)), "t")
    right = StreamDefinition("rb", "o", StreamSchema((
        Field("ts", "double"), Field("area", "string"), Field("cls", "label", right_lattice))),
        SourceSpec("ingest", (("path", str(tmp_path / "rb")),)), "ts")
    return left, right


def left_plan(bound: Label | None, show_lub: bool, size: int = 10, step: int = 5
              ) -> ExecutionPlan:
    aggregates = (Aggregate("x", "count"),) + ((Aggregate("level", "lub"),) if show_lub else ())
    return ExecutionPlan("la", None, ("k", "x", "level"), WindowSpec(
        "time", size, step, aggregates, "t", 1, ("k",),
        label_bounds=(("level", str(bound)),) if bound is not None else ()))


def right_plan(session: Label | None) -> ExecutionPlan:
    dnf = ((Predicate("cls", "<=", session),),) if session is not None else None
    return ExecutionPlan("rb", dnf, ("ts", "area", "cls"))


def records(rng: random.Random, left_lattice: Lattice, right_lattice: Lattice, n: int = 60):
    left = [{"t": T0 + i * 0.5, "k": "AB"[rng.random() < 0.5], "x": i,
             "level": None if rng.random() < 0.08 else str(random_label(rng, left_lattice)),
             "_xsg_seq": i + 1} for i in range(n)]
    for i in range(0, n, 11):  # quiet stretches, so that some windows pass a low bound
        for r in left[i:i + 6]:
            r["level"] = left_lattice.levels[0] if r["level"] is not None else None
    right = [{"ts": T0 + i * 0.7 + 0.25, "area": "ABC"[i % 3],
              "cls": None if rng.random() < 0.08 else str(random_label(rng, right_lattice)),
              "_xsg_seq": i + 1} for i in range(n)]
    return left, right


def frame(spark, definition: StreamDefinition, rows: list[dict]):
    types = {"double": "double", "string": "string", "long": "long", "label": "string"}
    ddl = ", ".join(f"`{f.name}` {types[f.type]}" for f in definition.schema.fields)
    return spark.createDataFrame([tuple(r[f.name] for f in definition.schema.fields)
                                  + (r["_xsg_seq"],) for r in rows], f"{ddl}, _xsg_seq long")


def brute_windows(rows, lattice: Lattice, plan: ExecutionPlan) -> list[dict]:
    """Every window of the side (a batch closes them all), its lub; dropped when some bound
    does not dominate it (a window without any label passes)."""
    w = plan.window
    groups: dict[tuple, list] = {}
    for r in rows:
        first = math.floor((r["t"] - w.size) / w.step) + 1
        for k in range(first, math.floor(r["t"] / w.step) + 1):
            if k * w.step <= r["t"] < k * w.step + w.size:
                groups.setdefault((k * w.step, r["k"]), []).append(r)
    out = []
    for (start, key), inside in sorted(groups.items()):
        top = lub(lattice.parse(r["level"]) for r in inside if r["level"] is not None)
        if any(top is not None and not top.dominated_by(lattice.parse(b))
               for _, b in w.label_bounds):
            continue
        row = {"la.window_start": float(start), "la.window_end": float(start + w.size),
               "la.k": key, "la.count_x": len(inside)}
        if any(a.function == "lub" for a in w.aggregates):
            row["la.lub_level"] = None if top is None else str(top)
        out.append((row, top))
    return out


def brute_join(windows, right_rows, lattice: Lattice, session: Label | None, labelled: bool
               ) -> Counter:
    out: Counter = Counter()
    for row, top in windows:
        for r in right_rows:
            if r["cls"] is None and session is not None:
                continue  # a comparison over a missing label is false
            if session is not None and not lattice.parse(r["cls"]).dominated_by(session):
                continue
            if row["la.k"] != r["area"] or abs(row["la.window_end"] - r["ts"]) > WITHIN:
                continue
            joined = {**row, "rb.ts": r["ts"], "rb.area": r["area"], "rb.cls": r["cls"]}
            if labelled:
                labels = [x for x in (top, None if r["cls"] is None else lattice.parse(r["cls"]))
                          if x is not None]
                joined["label"] = None if not labels else str(lub(labels))
            out[_key(joined)] += 1
    return out


def _key(row: dict) -> tuple:
    return tuple(sorted(row.items()))


def collect(df, outputs) -> list[dict]:
    return [{o.name: r[o.internal] for o in outputs}
            for r in df.select(*[o.internal for o in outputs]).collect()]


@pytest.mark.timeout(240)
def test_side_windows_are_dropped_exactly_when_the_bound_does_not_dominate_their_lub(
        spark, tmp_path):
    from pep.runtime.joins.frames import side_frame
    for seed in range(3):
        rng = random.Random(2700 + seed)
        lattice = random_lattice(rng)
        left_def, _ = definitions(tmp_path, lattice, lattice)
        rows, _ = records(rng, lattice, lattice)
        bound = random_label(rng, lattice)
        for plan, shown in ((left_plan(bound, True), True), (left_plan(bound, False), False)):
            df, outputs = side_frame(spark, left_def, plan, "window_end", "l", 0.0, 10,
                                     source=frame(spark, left_def, rows))
            got = sorted(collect(df, outputs), key=_key)
            want = sorted((row for row, _ in brute_windows(rows, lattice, plan)), key=_key)
            assert got == want, (seed, str(bound), shown)
            if plan.window.label_bounds:
                everything = brute_windows(rows, lattice, left_plan(None, True))
                kept = {(r["la.window_start"], r["la.k"]) for r in got}
                for row, top in everything:  # dropped exactly when the bound misses the lub
                    dominated = top is None or top.dominated_by(bound)
                    assert ((row["la.window_start"], row["la.k"]) in kept) == dominated


@pytest.mark.timeout(240)
def test_a_joined_rows_label_is_the_lub_of_its_sides_and_never_above_the_session(
        spark, tmp_path):
    from pep.runtime.joins.frames import joined_frame
    checked = 0
    for seed in range(4):
        rng = random.Random(9100 + seed)
        lattice = random_lattice(rng)
        left_def, right_def = definitions(tmp_path, lattice, lattice)
        lrows, rrows = records(rng, lattice, lattice)
        session = random_label(rng, lattice)
        if seed == 0:
            session = lattice.top  # everything passes: many rows
        lplan, rplan = left_plan(session, True), right_plan(session)
        plan = JoinPlan(lplan, rplan, (("k", "area"),), WITHIN, "window_end", "ts",
                        ("lub_level", "cls"))
        df, outputs = joined_frame(spark, left_def, right_def, plan, lateness=0.0,
                                   sources=(frame(spark, left_def, lrows),
                                            frame(spark, right_def, rrows)))
        got = collect(df, outputs)
        want = brute_join(brute_windows(lrows, lattice, lplan), rrows, lattice, session, True)
        assert Counter(_key(r) for r in got) == want, (seed, str(session))
        for r in got:  # nothing above the session reaches the reader
            assert r["label"] is None or lattice.parse(r["label"]).dominated_by(session)
            assert r["la.lub_level"] is None or \
                lattice.parse(r["la.lub_level"]).dominated_by(session)
        checked += len(got)
    assert checked >= 20


def side(definition: StreamDefinition, plan: ExecutionPlan) -> JoinSide:
    """A side whose policy shows everything, with `plan` as its merged plan."""
    policy = QueryGraph(Source(definition.name))
    merged = merge(policy, None, definition.schema, time_attribute=definition.time_attribute)
    return JoinSide(definition.name, definition.schema, replace(merged, plan=plan), policy,
                    None, definition.time_attribute)


def test_the_join_labels_its_rows_only_over_one_lattice(tmp_path):
    lattice = Lattice(("U", "C", "S"), ("a", "b"))
    left_def, right_def = definitions(tmp_path, lattice, lattice)
    query = JoinQuery(stream="rb", on=(("k", "area"),), within=WITHIN, side=UserQuery())
    result = build_join(side(left_def, left_plan(lattice.parse("C:{a}"), True)),
                        side(right_def, right_plan(lattice.parse("C:{a}"))), query)
    assert result.plan.label == ("lub_level", "cls")
    assert result.output[-1] == "label" and result.plan_json["output"][-1] == "label"
    assert result.plan_json["join"]["label"] == {"left": "lub_level", "right": "cls",
                                                 "output": "label"}
    assert "LUB(" in result.sql
    # other categories (or their order): no common lattice, no joined label
    for other in (Lattice(("U", "C", "S"), ("b", "a")), Lattice(("U", "C"), ("a", "b"))):
        _, right_other = definitions(tmp_path, lattice, other)
        result = build_join(side(left_def, left_plan(lattice.parse("C:{a}"), True)),
                            side(right_other, right_plan(None)), query)
        assert result.plan.label is None and "label" not in result.output
    # the lub not shown: a bound alone labels nothing, and the join still runs
    result = build_join(side(left_def, left_plan(lattice.parse("C"), False)),
                        side(right_def, right_plan(None)), query)
    assert result.plan.label is None
    assert result.plan.left.window.label_bounds == (("level", "C"),)


@pytest.mark.timeout(300)
def test_a_streaming_join_of_labelled_sides_matches_brute_force(spark, tmp_path):
    from pep.runtime.joins.runtime import JoinRuntime
    rng = random.Random(31)
    lattice = Lattice(("U", "C", "S", "TS"), ("nuclear", "crypto", "army"))
    left_def, right_def = definitions(tmp_path, lattice, lattice)
    lrows, rrows = records(rng, lattice, lattice, 80)
    session = lattice.parse("S:{nuclear,crypto}")
    clean = ["U", "C", "C:{nuclear}", "S:{crypto}", "S:{nuclear,crypto}", "U:{crypto}"]
    above = ["TS", "S:{army}", "C:{army}"]
    low = clean[:3]  # windows of low labels, so that a joined label rises above some
    for i, r in enumerate(lrows):  # the second ten seconds carry labels above the session
        r["level"] = rng.choice(low + above if 20 <= i < 40 else low)
    for r in rrows:
        r["cls"] = rng.choice(clean + above[:1])
    lplan, rplan = left_plan(session, True, 10, 10), right_plan(session)
    plan = JoinPlan(lplan, rplan, (("k", "area"),), WITHIN, "window_end", "ts",
                    ("lub_level", "cls"))
    rt = JoinRuntime(spark, tmp_path / "work", trigger_interval=0.25, lateness=0.0)
    try:
        sink = Collector()
        rt.attach_join("h", (left_def, right_def), plan, sink)
        for k in range(2):
            write_jsonl(tmp_path / "la", f"{k}.json", lrows[k * 40:(k + 1) * 40])
            write_jsonl(tmp_path / "rb", f"{k}.json", rrows[k * 40:(k + 1) * 40])
            time.sleep(0.3)
        # windows close once the watermark (the lower side's latest time) passes their end
        watermark = min(max(r["t"] for r in lrows), max(r["ts"] for r in rrows))
        windows = [(row, top) for row, top in brute_windows(lrows, lattice, lplan)
                   if row["la.window_end"] <= watermark]
        want = brute_join(windows, rrows, lattice, session, True)
        assert sum(want.values()) >= 5
        assert len(windows) < len(brute_windows(lrows, lattice, left_plan(None, True, 10, 10)))
        assert wait_until(lambda: len(sink.rows) >= sum(want.values()), 90), \
            (len(sink.rows), sum(want.values()))
        time.sleep(1.0)
        got = Counter(_key(r) for r in sink.rows)
        assert got == want
        assert all(r["label"] is None or lattice.parse(r["label"]).dominated_by(session)
                   for r in sink.rows)
        assert any(r["label"] != r["la.lub_level"] for r in sink.rows)
        rt.detach("h")
    finally:
        rt.stop()
    json.dumps(sink.rows)  # rows are plain JSON


def test_a_labelled_join_plan_survives_its_json_and_unlabelled_keys_are_unchanged():
    from pep.core.plan import any_plan_from_json
    lattice = Lattice(("U", "S"), ("a",))
    plain = JoinPlan(left_plan(lattice.parse("S"), True), right_plan(None), (("k", "area"),),
                     WITHIN, "window_end", "ts")
    labelled = replace(plain, label=("lub_level", "cls"))
    assert any_plan_from_json(labelled.canonical_json()) == labelled
    assert any_plan_from_json(plain.canonical_json()) == plain
    assert "label" not in json.loads(plain.canonical_json())["join"]
    assert labelled.key() != plain.key()
