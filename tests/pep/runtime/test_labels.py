"""Security labels on Spark (pep/runtime/labels.py): random lattices, random labelled tuples and
random dominance filters, in the shared query's plan table and in the few-plans Columns, against
a brute-force reading with pep.core.labels."""
from __future__ import annotations

import random
import time

import pytest

from pep.core.labels import LABEL_MASKS, Lattice, holds
from pep.core.plan import (ExecutionPlan, Field, Predicate, SourceSpec, StreamDefinition,
                           StreamSchema)
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
    sd = StreamDefinition(name, "nea", schema, SourceSpec("ingest", (("path", str(tmp_path / name)),)))
    plans = []
    ops = sorted(LABEL_MASKS)
    for _ in range(plans_per_stream):
        conjuncts = tuple(tuple(Predicate("level", rng.choice(ops), random_label(rng, lattice))
                                for _ in range(rng.randint(1, 2)))
                          for _ in range(rng.randint(1, 2)))
        plans.append(ExecutionPlan(name, conjuncts, ("n", "level")))
    sinks = [Collector() for _ in plans]
    for i, (p, sink) in enumerate(zip(plans, sinks)):
        runtime.attach(f"h{i}", sd, p, sink)
    records = [{"n": i, "level": str(random_label(rng, lattice)) if i % 17 else None,
                "_xsg_seq": i} for i in range(120)]
    records[5]["level"] = "NOT-A-LABEL:{x}"  # a files source could hold one: no code, no match
    for k in range(3):
        write_jsonl(tmp_path / name, f"part-{k}.json", records[k * 40:(k + 1) * 40])
        time.sleep(0.2)
    clean = [r if r["level"] != "NOT-A-LABEL:{x}" else {**r, "level": None} for r in records]
    want = [oracle(clean, p, lattice) for p in plans]
    assert any(0 < len(w) < len(records) for w in want)
    assert wait_until(lambda: all(len(s.rows) >= len(w) for s, w in zip(sinks, want)), 60), \
        [(len(s.rows), len(w)) for s, w in zip(sinks, want)]
    time.sleep(0.5)
    for sink, w in zip(sinks, want):
        assert sink.rows == w
    for i in range(len(plans)):
        runtime.detach(f"h{i}")
