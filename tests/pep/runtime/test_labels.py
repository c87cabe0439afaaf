"""Security labels on Spark (pep/runtime/privacy/labels.py): random lattices, random labelled tuples
and random dominance filters, in the shared query's plan table and in the few-plans Columns, against
a brute-force reading with pep.core.labels."""
from __future__ import annotations

import random
import time

import pytest

from pep.core.labels import LABEL_MASKS, Lattice, holds, lub
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


def random_lattice(rng: random.Random) -> Lattice:
    levels = tuple(f"L{i}" for i in range(rng.randint(1, 5)))
    categories = tuple(f"c{i}" for i in range(rng.randint(0, 6)))
    return Lattice(levels, categories)


def random_label(rng: random.Random, lattice: Lattice):
    return lattice.parse({"level": rng.choice(lattice.levels),
                          "categories": [c for c in lattice.categories if rng.random() < 0.4]})


def oracle(records, plan, lattice):
    out = []
    for r in records:
        if r["level"] is None:
            continue
        value = lattice.parse(r["level"])
        if any(all(holds(value, p.op, lattice.parse(str(p.value))) for p in conj)
               for conj in plan.filter_dnf):
            out.append({"n": r["n"], "level": r["level"]})
    return out


@pytest.mark.parametrize("plans_per_stream", [3, 12])  # the few-plans Columns; the plan table
@pytest.mark.timeout(120)
def test_dominance_filters_on_spark_match_the_lattice(runtime, tmp_path, plans_per_stream):
    rng = random.Random(4242 + plans_per_stream)
    lattice = random_lattice(rng)
    while len(lattice.categories) < 2 or len(lattice.levels) < 2:
        lattice = random_lattice(rng)
    schema = StreamSchema((Field("n", "long"), Field("level", "label", lattice)))
    name = f"mls{plans_per_stream}"
    sd = StreamDefinition(name, "nea", schema,
                          SourceSpec("ingest", (("path", str(tmp_path / name)),)))
    plans = []
    ops = sorted(LABEL_MASKS)
    for _ in range(plans_per_stream):
        conjuncts = tuple(tuple(Predicate("level", rng.choice(ops), random_label(rng, lattice))
                                for _ in range(rng.randint(1, 2)))
                          for _ in range(rng.randint(1, 2)))
        plans.append(ExecutionPlan(name, conjuncts, ("n", "level")))
    sinks = [Collector() for _ in plans]
    for i, (p, sink) in enumerate(zip(plans, sinks, strict=True)):
        runtime.attach_handle(f"h{i}", sd, p, sink)
    records = [{"n": i, "level": str(random_label(rng, lattice)) if i % 17 else None,
                "_xsg_seq": i} for i in range(120)]
    records[5]["level"] = "NOT-A-LABEL:{x}"  # a files source could hold one: no code, no match
    for k in range(3):
        write_jsonl(tmp_path / name, f"part-{k}.json", records[k * 40:(k + 1) * 40])
        time.sleep(0.2)
    clean = [r if r["level"] != "NOT-A-LABEL:{x}" else {**r, "level": None} for r in records]
    want = [oracle(clean, p, lattice) for p in plans]
    assert any(0 < len(w) < len(records) for w in want)
    assert wait_until(
        lambda: all(len(s.rows) >= len(w) for s, w in zip(sinks, want, strict=True)), 60
    ), [(len(s.rows), len(w)) for s, w in zip(sinks, want, strict=True)]
    time.sleep(0.5)
    for sink, w in zip(sinks, want, strict=True):
        assert sink.rows == w
    for i in range(len(plans)):
        runtime.detach(f"h{i}")


def windows_oracle(records, lattice, size, step, bound):
    """Tuple windows of `size`/`step` over every tuple: count of labels, their lub, delivered
    only when `bound` dominates the lub (a window without any label passes)."""
    out, k = [], 0
    while k * step + size <= len(records):
        chunk = records[k * step:k * step + size]
        present = [lattice.parse(r["level"]) for r in chunk if r["level"] is not None]
        top = lub(present)
        if top is None or top.dominated_by(bound):
            out.append({"window_start": k * step, "window_end": k * step + size - 1,
                        "count_level": len(present), "lub_level": None if top is None
                        else str(top)})
        k += 1
    return out


def time_oracle(records, lattice, size, step, bound):
    """Time windows [kP, kP+S) of event time `t` (seconds), emitted once the largest event
    time passed their end, only when the bound dominates their tuples' lub (computed for the
    bound, never shown)."""
    watermark = max(r["t"] for r in records)
    out = []
    first = int(min(r["t"] for r in records) // step) - size // step
    for k in range(first, int(watermark // step) + 1):
        start, end = k * step, k * step + size
        inside = [r for r in records if start <= r["t"] < end]
        if not inside or end > watermark:
            continue
        present = [lattice.parse(r["level"]) for r in inside if r["level"] is not None]
        top = lub(present)
        if top is None or top.dominated_by(bound):
            out.append({"window_start": start, "window_end": end, "count_n": len(inside)})
    return out


@pytest.mark.timeout(120)
def test_window_lubs_and_label_bounds_on_spark_match_the_lattice(runtime, tmp_path):
    rng = random.Random(99)
    lattice = Lattice(("U", "C", "S", "TS"), ("nuclear", "crypto", "army"))
    schema = StreamSchema((Field("n", "long"), Field("t", "double"),
                           Field("level", "label", lattice)))
    sd = StreamDefinition("mlsw", "nea", schema,
                          SourceSpec("ingest", (("path", str(tmp_path / "mlsw")),)),
                          time_attribute="t")
    bound = lattice.parse("S:{nuclear,crypto}")
    records = [{"n": i, "t": float(i), "level": str(random_label(rng, lattice)) if i % 13 else
                None, "_xsg_seq": i} for i in range(90)]
    for i in range(0, 90, 7):  # a few quiet stretches, so that some windows pass the bound
        for r in records[i:i + 3]:
            if r["level"] is not None:
                r["level"] = "C:{nuclear}"
    tuple_plan = ExecutionPlan("mlsw", None, (), WindowSpec(
        "tuple", 5, 5, (Aggregate("level", "count"), Aggregate("level", "lub")),
        label_bounds=(("level", str(bound)),)))
    time_plan = ExecutionPlan("mlsw", None, (), WindowSpec(
        "time", 6, 3, (Aggregate("n", "count"),), "t", label_bounds=(("level", str(bound)),)))
    sinks = {"tuple": Collector(), "time": Collector()}
    runtime.attach_handle("tw", sd, tuple_plan, sinks["tuple"])
    runtime.attach_handle("ti", sd, time_plan, sinks["time"])
    for k in range(3):
        write_jsonl(tmp_path / "mlsw", f"part-{k}.json", records[k * 30:(k + 1) * 30])
        time.sleep(0.2)
    want = {"tuple": windows_oracle(records, lattice, 5, 5, bound),
            "time": time_oracle(records, lattice, 6, 3, bound)}
    everything = windows_oracle(records, lattice, 5, 5, lattice.top)
    assert 0 < len(want["tuple"]) < len(everything)  # the bound drops some windows
    assert any(w["lub_level"] not in (None, "C:{nuclear}") for w in want["tuple"])
    assert wait_until(lambda: all(len(sinks[h].rows) >= len(want[h]) for h in want), 60), \
        {h: (len(sinks[h].rows), len(want[h])) for h in want}
    time.sleep(0.5)
    assert sinks["tuple"].rows == want["tuple"]
    assert [{**r, "window_start": float(r["window_start"]), "window_end": float(r["window_end"])}
            for r in sinks["time"].rows] == \
        [{**r, "window_start": float(r["window_start"]), "window_end": float(r["window_end"])}
         for r in want["time"]]
    assert all(set(r) == {"window_start", "window_end", "count_n"} for r in sinks["time"].rows)
    runtime.detach("tw")
    runtime.detach("ti")
