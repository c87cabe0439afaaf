"""Windows on a stream with security punctuations (issue 48), on real Spark, against a
brute force.

The stream's micro-batches go through the shared per-stream job (`QueryLifecycle.on_batch`, the
running query's code path, fed with static batches), its punctuations in the stream's log as
the ingest writes them. Each consumer's windows (time windows tumbling and sliding with keys,
tuple windows as rows and as panes aggregated in Spark, keyed tuple windows; refine and defer)
must be exactly what the brute force of `test_hidden_time` computes from the tuples that count
for that consumer alone (`pep.core.punctuations.visible_tuples`: the tuple's segment shows it
every attribute the window reads), batch by batch: a tuple a segment hides is in no window of
the consumer, numbers none of its tuple windows' tuples and moves none of its time windows'
clocks, and a micro-batch all of whose tuples are hidden delivers nothing."""
from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from pep.core.plan import ExecutionPlan, SourceSpec, StreamDefinition
from pep.core.punctuations import (
    DEFER,
    LOG_NAME,
    REFINE,
    log_line,
    parse_punctuation,
    visible_tuples,
)
from pep.runtime.plans.compile import compile_plan
from tests.pep.runtime.test_hidden_time import CONSUMER, SCHEMA, SPARK_SCHEMA, brute, decoded, ts_at

ROLES = ("doctor", "nurse")
# consumer -> (the plan of test_hidden_time, roles, mode)
CONSUMERS = {
    "time-doctor": ("time", ("doctor",), REFINE),
    "time-nurse-defer": ("time", ("nurse",), DEFER),
    "time-sliding-keyed-nurse": ("time-sliding-keyed", ("nurse",), REFINE),
    "tuple-rows-nurse": ("tuple-rows", ("nurse",), REFINE),  # one-tuple panes: the rows path
    "tuple-panes-doctor": ("tuple-panes", ("doctor",), REFINE),  # panes aggregated in Spark
    "tuple-keyed-both": ("tuple-keyed", ("doctor", "nurse"), REFINE),
    "tuple-panes-nurse-defer": ("tuple-panes", ("nurse",), DEFER),
}
LATENESS = 0.0


def plan_of(name: str) -> ExecutionPlan:
    base, roles, mode = CONSUMERS[name]
    return replace(CONSUMER[base], punctuation_roles=roles, punctuation_defer=mode == DEFER)


def policy(rng: random.Random, ts: int) -> list[dict]:
    """One policy: one or two punctuations of one ts, of every kind."""
    out = []
    for sn in range(1, rng.randint(1, 2) + 1):
        doc: dict = {"srp": rng.sample(ROLES, rng.choice([1, 2, 2])), "ts": ts, "sn": sn,
                     "sign": rng.choice("+++-")}
        pick = rng.random()
        if pick < 0.3:
            doc["ddp"] = {"attributes": rng.sample(["ts", "temp", "level"], 1)}
        elif pick < 0.6:
            doc["ddp"] = {"tuples": [rng.choice([
                {"attribute": "level", "op": "=", "value": rng.randint(0, 1)},
                {"attribute": "temp", "op": ">", "value": float(rng.randint(0, 10))}])]}
        if rng.random() < 0.05:
            doc["immutable"] = True
        out.append({"$punctuation": doc})
    return out


def history(seed: int, batches: int, size: int) -> list[list[dict]]:
    """Micro-batches of records (punctuations and tuples, in stream order); the tuples all
    pass the plans' filter (station A, level <= 1), numbered as the ingest numbers them."""
    rng = random.Random(seed)
    out: list[list[dict]] = []
    ts, seq, clock = 1, 0, 0.0
    for _ in range(batches):
        batch: list[dict] = []
        for _ in range(size):
            if rng.random() < 0.3:
                ts += rng.choice([1, 1, 1, 0])
                batch += policy(rng, ts)
            seq += 1
            clock += rng.choice([0.5, 1.0, 2.0, 3.0, -1.0])  # sometimes out of order
            batch.append({"ts": None if rng.random() < 0.05 else ts_at(clock),
                          "temp": None if rng.random() < 0.1 else float(rng.randint(-5, 20)),
                          "station": "A", "level": rng.randint(0, 1), "_xsg_seq": seq})
        out.append(batch)
    return out


def punctuation_doc(record: dict) -> dict:
    return json.loads(json.dumps(record["$punctuation"]))


def run(spark, tmp_path, batches: list[list[dict]]) -> dict[str, dict[int, list[str]]]:
    """Every consumer's deliveries per micro-batch; each batch's punctuations are in the log
    (at the position of the tuple they precede) before the batch runs, as the ingest does."""
    from pep.runtime.query.executor import StreamExecutor
    data = tmp_path / "data"
    data.mkdir()
    sd = StreamDefinition("x", "o", SCHEMA, SourceSpec(
        "ingest", (("path", str(data)), ("punctuations", "on"))), time_attribute="ts")
    ex = StreamExecutor(spark, sd, tmp_path / "work", 0.25, 2, LATENESS, lambda h: None,
                        tuple_pane_min=2)  # tuple windows of panes >= 2 tuples go to Spark
    got: dict[str, dict[int, list[str]]] = {name: {} for name in CONSUMERS}
    current = [0]

    def collector(name: str):
        def deliver(batch) -> bool:
            assert batch.rows  # never an empty batch: no timing of hidden tuples
            got[name].setdefault(current[0], []).extend(batch.rows)
            return True
        return deliver

    for name in CONSUMERS:
        ex.handles.add_handle(name, compile_plan(plan_of(name), SCHEMA, "ts"), collector(name))
    try:
        for i, records in enumerate(batches):
            lines, pending = [], []
            tuples = []
            for r in records:
                if "$punctuation" in r:
                    pending.append(parse_punctuation(punctuation_doc(r), SCHEMA))
                    continue
                lines += [log_line(r["_xsg_seq"], sp) for sp in pending]
                pending = []
                tuples.append(r)
            assert not pending  # (every history's batch ends with a tuple)
            with open(data / LOG_NAME, "a") as f:
                f.write("".join(line + "\n" for line in lines))
            current[0] = i
            frame = spark.createDataFrame(
                [tuple(r[c] for c in ("ts", "temp", "station", "level", "_xsg_seq")) + (None,)
                 for r in tuples], SPARK_SCHEMA)
            ex.lifecycle.on_batch(frame, i)
            ex.wait_delivered()
    finally:
        ex.stop()
    return got


def expected(batches: list[list[dict]], name: str) -> dict[int, list[dict]]:
    """The brute force: the tuples that count for the consumer (its segment shows it every
    attribute the window reads), in their micro-batches, into `test_hidden_time.brute`."""
    base, roles, mode = CONSUMERS[name]
    compiled = compile_plan(plan_of(name), SCHEMA, "ts")
    assert compiled.punctuations is not None
    reads = compiled.punctuations[2]
    records = [r for b in batches for r in b]
    kept = {r["_xsg_seq"] for r in visible_tuples(
        [r if "$punctuation" not in r else {"$punctuation": punctuation_doc(r)}
         for r in records], frozenset(roles), mode, reads, SCHEMA)}
    mine = [[r for r in b if "$punctuation" not in r and r["_xsg_seq"] in kept]
            for b in batches]
    return brute(mine, CONSUMER[base], LATENESS)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", [42, 54])
def test_each_consumers_windows_hold_exactly_the_tuples_its_segments_let_count(
        spark, tmp_path, seed):
    batches = history(seed, 5, 12)
    got = run(spark, tmp_path, batches)
    for name in CONSUMERS:
        assert decoded(got[name]) == expected(batches, name), name
    # the punctuations hide something from each consumer, and not the same
    for name, (base, _, _) in CONSUMERS.items():
        whole = brute([[r for r in b if "$punctuation" not in r] for b in batches],
                      CONSUMER[base], LATENESS)
        assert expected(batches, name) != whole, name
        assert sum(len(rows) for rows in got[name].values()) >= 2, name  # something to see
    assert len({json.dumps(expected(batches, n), sort_keys=True) for n in CONSUMERS}) == \
        len(CONSUMERS)


def test_what_a_window_plan_reads_is_what_its_tuples_need_visible():
    """Its filter's attributes, its aggregates', its keys and its time, by schema names."""
    from pep.core.plan import Aggregate, Predicate, WindowSpec
    plan = ExecutionPlan("x", ((Predicate("station", "=", "A"),),), (), WindowSpec(
        "time", 10, 10, (Aggregate("TEMP", "avg"), Aggregate("temp", "max")), "ts",
        keys=("level",)), punctuation_roles=("nurse",))
    compiled = compile_plan(plan, SCHEMA)
    assert compiled.punctuations is not None
    assert compiled.punctuations[2] == ("station", "temp", "level", "ts")
