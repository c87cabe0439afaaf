"""A micro-batch's plan sets are built once per version of the handle registry and stay equal
to what a fresh pass over the attached plans gives, through any order of attaches and detaches
(plain, windowed, union and never-passing plans)."""
from __future__ import annotations

import random

from pep.core.plan import (
    Aggregate,
    ExecutionPlan,
    Field,
    Predicate,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
    UnionPlan,
    WindowSpec,
)
from pep.runtime.plans.compile import compile_plan, compile_union
from pep.runtime.query.executor import StreamExecutor

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("temp", "double"), Field("hum", "long")))


def _plans() -> list:
    out = []
    for i in range(6):
        out.append(ExecutionPlan("s", ((Predicate("temp", ">", float(i)),),), ("temp",)))
    out.append(ExecutionPlan("s", (), ("temp",)))  # passes nothing
    out.append(ExecutionPlan("s", ((Predicate("hum", "<", 3),),), (),
                             WindowSpec("tuple", 10, 10, (Aggregate("temp", "avg"),))))
    out.append(ExecutionPlan("s", ((Predicate("hum", ">", 1),),), (),
                             WindowSpec("time", 5, 5, (Aggregate("temp", "max"),), "ts")))
    return out


def _fresh(ex: StreamExecutor) -> tuple[list[int], list[int], list[int], bool, list]:
    with ex.registry._lock:
        used = [s for s in ex.registry._plans.values() if s.used]
    return ([s.id for s in used],
            [s.id for s in used if s.rows and not s.compiled.passes_nothing],
            [s.id for s in used if not s.rows],
            any(s.windows is not None for s in used),
            [s.compiled for s in used if s.compiled.anchors])


def test_plan_sets_follow_attaches_and_detaches(tmp_path):
    sd = StreamDefinition("s", "owner", SCHEMA, SourceSpec("ingest", (("path", str(tmp_path)),)),
                          time_attribute="ts")
    ex = StreamExecutor(None, sd, tmp_path, 0.25, 2, 0.0, lambda h: None)  # no query started
    plans = _plans()
    compiled = [compile_plan(p, SCHEMA, "ts") for p in plans]
    union = compile_union(UnionPlan("s", (plans[0], plans[3])), SCHEMA, "ts")
    rnd = random.Random(7)
    attached: list[str] = []
    built = 0
    last = None
    for step in range(300):
        if attached and rnd.random() < 0.45:
            ex.handles.remove_handle(attached.pop(rnd.randrange(len(attached))))
        else:
            hid = f"h{step}"
            ex.handles.add_handle(hid, union if rnd.random() < 0.15 else rnd.choice(compiled),
                                  lambda rows: True)
            attached.append(hid)
        sets = ex.registry.plan_sets()
        assert ex.registry.plan_sets() is sets  # the same version: not built again
        built += sets is not last
        last = sets
        ids, plain, windowed, keeps, anchored = _fresh(ex)
        assert [s.id for s in sets.plans] == ids
        assert [s.id for s in sets.plain] == plain
        assert [s.id for s in sets.windowed] == windowed
        assert sets.keeps_windows == keeps
        assert sets.anchored == anchored
        assert ex.registry.current() == (sets.plans, sets.version)
    assert built < 300  # a handle on a plan already attached makes no new version
