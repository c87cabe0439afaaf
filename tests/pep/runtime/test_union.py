"""A union of grants on real Spark (pep/runtime/query/union.py): random unions of plain grants, each
a filter and a projection, plus windowed grants, against a brute-force "some grant admits it"
oracle: every tuple some plain member passes comes once, in stream order, with exactly the
attributes of the members it passes; every windowed member's windows come tagged with its index.
All unions run in one shared query beside an ordinary handle whose plan is also a member."""
from __future__ import annotations

import json
import random
import time

import pytest

from pep.core.plan import Aggregate, ExecutionPlan, Predicate, UnionPlan, WindowSpec
from pep.core.rows import RowBatch
from pep.runtime.query.union import tag_rows
from tests.pep.runtime.support import Collector, wait_until, write_jsonl
from tests.pep.runtime.test_shared_query import (
    SCHEMA,
    assert_rows_equal,
    expected_rows,
    expected_tuple_windows,
    make_records,
    passes,
    stream,
)

NAMES = SCHEMA.names


def random_filter(rng: random.Random):
    """A random DNF over temp, hum and station (None: everything passes)."""
    if rng.random() < 0.1:
        return None
    conjuncts = []
    for _ in range(rng.randint(1, 2)):
        conj = []
        for _ in range(rng.randint(1, 2)):
            kind = rng.choice(("temp", "hum", "station"))
            if kind == "temp":
                conj.append(Predicate("temp", rng.choice(("<", ">=")), float(rng.randint(16, 32))))
            elif kind == "hum":
                conj.append(Predicate("hum", rng.choice(("<=", ">", "!=")), rng.randint(0, 90)))
            else:
                conj.append(Predicate("station", rng.choice(("=", "!=")),
                                      rng.choice(("s1", "s2", "s3"))))
        conjuncts.append(tuple(conj))
    return tuple(conjuncts)


def random_plain(rng: random.Random) -> ExecutionPlan:
    projection = tuple(n for n in NAMES if rng.random() < 0.5) or ("ts",)
    return ExecutionPlan("obs", random_filter(rng), projection)


def oracle(records: list[dict], plans: tuple[ExecutionPlan, ...]) -> list[dict]:
    """Each tuple once if some plain grant admits it, with every admitting grant's attributes."""
    out = []
    for r in records:
        shown = set()
        for p in plans:
            if p.window is None and passes(r, p.filter_dnf):
                shown.update(p.projection)
        if shown:
            out.append({n: r[n] for n in NAMES if n in shown})
    return out


WINDOWED = ExecutionPlan("obs", ((Predicate("ok", "=", True),),), (), WindowSpec(
    "tuple", 4, 3, (Aggregate("temp", "avg"), Aggregate("hum", "count"))))


@pytest.mark.timeout(120)
def test_unions_of_grants_match_a_some_grant_admits_it_oracle(runtime, tmp_path):
    rng = random.Random(2711)
    sd = stream(tmp_path)
    unions = []
    for i in range(6):
        members = tuple(random_plain(rng) for _ in range(rng.randint(2, 4)))
        if i % 3 == 0:
            members += (WINDOWED,)
        unions.append(UnionPlan("obs", members))
    shared = unions[1].plans[0]  # an ordinary handle whose plan is also a union's member
    sinks = {f"u{i}": Collector() for i in range(len(unions))}
    sinks["plain"] = Collector()
    for i, u in enumerate(unions):
        runtime.attach_handle(f"u{i}", sd, u, sinks[f"u{i}"])
    runtime.attach_handle("plain", sd, shared, sinks["plain"])
    records = make_records(90)
    for n in range(3):
        write_jsonl(tmp_path / "obs", f"part-{n}.json", records[n * 30:(n + 1) * 30])
        time.sleep(0.3)
    want = {}
    for i, u in enumerate(unions):
        rows = oracle(records, u.plans)
        windows = [dict(grant=len(u.plans) - 1, **w) for w in
                   expected_tuple_windows(records, WINDOWED)] if WINDOWED in u.plans else []
        want[f"u{i}"] = (rows, windows)
    want["plain"] = (expected_rows(records, shared), [])
    assert all(want[h][0] for h in want) and any(want[h][1] for h in want)
    assert any(len({frozenset(r) for r in want[h][0]}) > 1 for h in want)  # merged shapes

    def done(h):
        return len(sinks[h].rows) >= len(want[h][0]) + len(want[h][1])
    assert wait_until(lambda: all(done(h) for h in sinks), 60), \
        {h: (len(sinks[h].rows), len(want[h][0]) + len(want[h][1])) for h in sinks}
    time.sleep(0.6)  # nothing more may arrive
    for h, (rows, windows) in want.items():
        got_rows = [r for r in sinks[h].rows if "grant" not in r]
        got_windows = [r for r in sinks[h].rows if "grant" in r]
        assert_rows_equal(got_rows, rows)
        assert_rows_equal(got_windows, windows)
    stats = runtime.stats()["obs"]
    members = {p.key() for u in unions for p in u.plans} | {shared.key()}
    assert stats["plans"] == len(members)  # members shared, once each
    for i in range(len(unions)):
        runtime.detach(f"u{i}")
    assert runtime.stats()["obs"]["plans"] == 1  # the ordinary handle's plan stays
    runtime.detach("plain")


def test_window_rows_of_a_union_are_tagged_with_their_grant():
    batch = RowBatch.of([{"window_start": 0, "avg_temp": 1.5}, {}])
    tagged = tag_rows(batch, 2)
    assert [json.loads(t) for t in tagged.rows] == [
        {"grant": 2, "window_start": 0, "avg_temp": 1.5}, {"grant": 2}]
    assert tagged.nbytes == sum(len(t) for t in tagged.rows)
