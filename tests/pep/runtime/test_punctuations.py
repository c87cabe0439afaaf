"""Security punctuations enforced by the shared query (`pep/runtime/query/shield.py`), compared
with a brute-force oracle (`pep.core.punctuations.oracle`) over the same records: a stream whose
punctuations change the allowed roles every few tuples, ingested through the catalogue as an
owner does, delivers to each consumer exactly the tuples and attributes its segments allow,
across a restart of the runtime (the shield's state is the stream's log), in stream order
whatever the micro-batches' files."""
from __future__ import annotations

import json
import random
import time

import pytest

from pep.core.plan import ExecutionPlan, Field, StreamSchema
from pep.core.punctuations import DEFER, REFINE, oracle
from pep.streams.catalog import StreamCatalog
from tests.pep.runtime.support import Collector, files_in_one_clock_tick, wait_until

SCHEMA = StreamSchema((Field("patient", "long"), Field("hr", "double"),
                       Field("temp", "double"), Field("ward", "string")))
ROLES = ["doctor", "nurse", "guest"]
WARDS = ["icu", "er", "lab"]


def punctuation(rng: random.Random, ts: int) -> list[dict]:
    """One policy: one to three punctuations of the same ts, of every kind."""
    out = []
    for sn in range(1, rng.randint(1, 3) + 1):
        doc: dict = {"srp": rng.sample(ROLES, rng.randint(1, 2)), "ts": ts, "sn": sn,
                     "sign": rng.choice("++-")}
        if rng.random() < 0.4:
            doc["ddp"] = {"attributes": rng.sample(["hr", "temp", "ward"], rng.randint(1, 2))}
        elif rng.random() < 0.4:
            doc["ddp"] = {"tuples": [{"attribute": "ward", "op": "=", "value": rng.choice(WARDS)}]}
        if rng.random() < 0.08:
            doc["immutable"] = True
        out.append({"$punctuation": doc})
    return out


def history(seed: int, tuples: int, first_patient: int, ts0: int) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = []
    ts = ts0
    for i in range(tuples):
        if rng.random() < 0.3:  # a new policy every few tuples
            ts += rng.choice([1, 1, 1, 0, -1])  # sometimes late (discarded) or added to
            out += punctuation(rng, ts)
        out.append({"patient": first_patient + i, "hr": float(rng.randint(50, 150)),
                    "temp": round(rng.uniform(35, 41), 1), "ward": rng.choice(WARDS + [None])})
    return out


CONSUMERS = {  # handle -> (roles, mode, projection, the XACML plan's filter: hr > 70)
    "doctor": (("doctor",), REFINE, ("patient", "hr", "temp", "ward"), None),
    "nurse": (("nurse",), REFINE, ("patient", "hr", "ward"), None),
    "guest": (("guest",), REFINE, ("patient", "temp"), None),
    "both": (("doctor", "nurse"), REFINE, ("patient", "hr"), None),
    "nurse-hr70": (("nurse",), REFINE, ("patient", "hr", "ward"), 70.0),
    "nurse-defer": (("nurse",), DEFER, ("patient", "hr", "temp", "ward"), None),
    # past eight plans the rows job runs the grouped matcher (`plans/matcher.py`)
    "guest-defer": (("guest",), DEFER, ("patient", "ward"), None),
    "doctor-ward": (("doctor",), REFINE, ("patient", "ward"), None),
    "guest-hr90": (("guest",), REFINE, ("patient", "temp"), 90.0),
}


def plan_of(handle: str) -> ExecutionPlan:
    roles, mode, projection, above = CONSUMERS[handle]
    dnf = None if above is None else ((_gt("hr", above),),)
    return ExecutionPlan("vitals", dnf, projection, punctuation_roles=roles,
                         punctuation_defer=mode == DEFER)


def _gt(attribute, value):
    from pep.core.plan import Predicate
    return Predicate(attribute, ">", value)


def expected(records: list[dict], handle: str) -> list[dict]:
    roles, mode, projection, above = CONSUMERS[handle]
    passes = None if above is None else (lambda r: r["hr"] is not None and r["hr"] > above)
    # a row whose hr a punctuation hides never passes a filter on hr
    return oracle(records, frozenset(roles), mode, projection, SCHEMA, passes,
                  () if above is None else ("hr",))


def append(catalog: StreamCatalog, records: list[dict], pieces: int) -> None:
    """The records in `pieces` ingests, each cut anywhere (a punctuation may end one)."""
    cuts = sorted(random.Random(len(records)).sample(range(1, len(records)), pieces - 1))
    for lo, hi in zip([0] + cuts, cuts + [len(records)], strict=True):
        body = "\n".join(json.dumps(r) for r in records[lo:hi]).encode()
        catalog.append_records("vitals", body)


def runtime_for(spark, work, files: int = 2):
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    return StreamRuntime(spark, work, settings=RuntimeSettings(
        trigger_interval=0.2, max_files_per_trigger=files))


@pytest.fixture
def catalog(tmp_path):
    c = StreamCatalog(tmp_path / "streams.db", tmp_path / "data")
    c.register("vitals", "hospital", [{"name": f.name, "type": f.type} for f in SCHEMA.fields],
               {"kind": "ingest", "punctuations": "on"})
    yield c
    c.close()


def _attach(rt, definition) -> dict[str, Collector]:
    got = {h: Collector() for h in CONSUMERS}
    for handle, collector in got.items():
        rt.attach_handle(handle, definition, plan_of(handle), collector)
    return got


def _settle(got: dict[str, Collector], want: dict[str, list[dict]], when: str) -> None:
    """Each consumer's rows, once they are all in (and a little after: nothing more comes),
    equal to the oracle's in order; a failure says whether rows did not come in time or came
    wrong, with the whole lists."""
    came = wait_until(lambda: all(len(got[h].rows) >= len(want[h]) for h in got), timeout=60)
    time.sleep(0.8)
    wrong = [h for h in got if got[h].rows != want[h]]
    if came and not wrong:
        return
    lines = [f"{when}: " + ("the rows came, not as the oracle's" if came else
                            "timed out after 60 s waiting for the oracle's rows")]
    for h in wrong:
        g, w = got[h].rows, want[h]
        at = next((i for i, (a, b) in enumerate(zip(g, w, strict=False)) if a != b),
                  min(len(g), len(w)))
        lines.append(f"{h}: {len(g)} rows, the oracle {len(w)}, first difference at {at}"
                     f"\n  got  {[r['patient'] for r in g]}\n  want {[r['patient'] for r in w]}"
                     f"\n  got rows  {g}\n  want rows {w}")
    pytest.fail("\n".join(lines))


def test_each_consumer_gets_exactly_what_its_segments_allow_across_a_restart(
        spark, tmp_path, catalog, monkeypatch):
    """Every ingest file written in one tick of the clock (`files_in_one_clock_tick`), as a
    burst of appends is on a kernel with coarse file times: Spark's file source would take
    them in listing order and deliver later tuples first (the ingest times each file after the
    one before, `pep/streams/ingest.py`). Two files per micro-batch, one after the restart:
    what each consumer gets does not depend on where the micro-batches cut the stream."""
    files_in_one_clock_tick(monkeypatch)
    definition = catalog.get("vitals")
    before = history(48, 40, 0, 10)
    after = history(49, 40, 1000, 20)
    work = tmp_path / "work"
    rt = runtime_for(spark, work)
    try:
        got = _attach(rt, definition)
        append(catalog, before, 4)
        want = {h: expected(before, h) for h in CONSUMERS}
        _settle(got, want, "before the restart")
    finally:
        rt.stop()  # the gateway stops with the handles live
    # ingested while the gateway is down: its punctuations are in the stream's log
    append(catalog, after, 3)
    rt = runtime_for(spark, work, files=1)  # other micro-batches, the same rows
    try:
        again = _attach(rt, definition)
        assert not rt.stats()["vitals"]["skipped_to_end"]
        whole = {h: expected(before + after, h) for h in CONSUMERS}
        rest = {h: whole[h][len(want[h]):] for h in CONSUMERS}
        _settle(again, rest, "after the restart")
        for handle in CONSUMERS:
            # a micro-batch whose tuples a segment all hides delivers nothing, not an empty
            # batch: no timing of hidden tuples through the handle
            assert all(b.rows for b in got[handle].batches + again[handle].batches), handle
        # the consumers differ: the test would see a shield that let everything through
        assert len({json.dumps(whole[h]) for h in CONSUMERS}) == len(CONSUMERS)
        assert rt.stats()["vitals"]["punctuation_segments"] > 10
    finally:
        rt.stop()


def test_a_punctuation_cannot_widen_the_policy(spark, tmp_path, catalog):
    """The XACML plan shows hr above 70 and the patient only; a punctuation naming the
    consumer's role for every attribute gives it nothing more."""
    definition = catalog.get("vitals")
    rt = runtime_for(spark, tmp_path / "work")
    try:
        got = Collector()
        plan = ExecutionPlan("vitals", ((_gt("hr", 70.0),),), ("patient",),
                             punctuation_roles=("nurse",))
        rt.attach_handle("h", definition, plan, got)
        records = [{"$punctuation": {"srp": ["nurse"], "ts": 1}},
                   {"patient": 1, "hr": 60.0, "temp": 37.0, "ward": "er"},
                   {"patient": 2, "hr": 80.0, "temp": 38.0, "ward": "er"},
                   {"$punctuation": {"srp": ["doctor"], "ts": 2}},
                   {"patient": 3, "hr": 90.0, "temp": 39.0, "ward": "er"},
                   {"$punctuation": {"srp": ["nurse"], "sign": "-", "ts": 3,
                                     "ddp": {"attributes": ["temp"]}}},
                   {"patient": 4, "hr": 95.0, "temp": 39.0, "ward": "er"}]
        catalog.append_records("vitals", "\n".join(json.dumps(r) for r in records).encode())
        assert wait_until(lambda: len(got.rows) >= 2)
        time.sleep(0.8)
        assert got.rows == [{"patient": 2}, {"patient": 4}]
    finally:
        rt.stop()


def test_a_log_out_of_order_shows_nothing_from_there_on(tmp_path):
    """The shield trusts the log's order (the ingest writes it under the stream's lock); a
    position going back means the log cannot be trusted: no tuple from there on passes."""
    import numpy as np

    from pep.core.plan import SourceSpec, StreamDefinition
    from pep.core.punctuations import LOG_NAME, log_line, parse_punctuation
    from pep.runtime.plans.compile import compile_plan
    from pep.runtime.query.registry import PlanState
    from pep.runtime.query.settings import StreamLayout
    from pep.runtime.query.shield import PunctuationShield
    definition = StreamDefinition("vitals", "o", SCHEMA, SourceSpec(
        "ingest", (("path", str(tmp_path)), ("punctuations", "on"))))
    lines = [(1, {"srp": ["nurse"], "ts": 1}), (5, {"srp": ["nurse"], "ts": 2}),
             (3, {"srp": ["nurse"], "ts": 3}), (9, {"srp": ["nurse"], "ts": 4})]
    (tmp_path / LOG_NAME).write_text("".join(
        log_line(at, parse_punctuation(doc, SCHEMA)) + "\n" for at, doc in lines))
    shield = PunctuationShield(StreamLayout.of(definition))
    state = PlanState(0, compile_plan(plan_of("nurse"), SCHEMA), True)
    seqs = np.arange(0, 12, dtype=np.int64)  # row i at position i
    plan_ids, rows, hidden = shield.prepare(None).apply(  # no tuple DDP: no Spark job
        np.zeros(12, np.int64), np.arange(12), seqs, {0: state})
    assert rows.tolist() == [0, 1, 2, 3, 4] and not hidden


def test_segments_behind_the_routed_batches_are_dropped_and_a_row_before_them_denied(tmp_path):
    import numpy as np

    from pep.core.plan import SourceSpec, StreamDefinition
    from pep.core.punctuations import LOG_NAME, log_line, parse_punctuation
    from pep.runtime.plans.compile import compile_plan
    from pep.runtime.query.registry import PlanState
    from pep.runtime.query.settings import StreamLayout
    from pep.runtime.query.shield import PRUNE_AT, PunctuationShield
    definition = StreamDefinition("vitals", "o", SCHEMA, SourceSpec(
        "ingest", (("path", str(tmp_path)), ("punctuations", "on"))))
    n = PRUNE_AT + 10  # segment k starts at 10 k + 1; odd ones for nurses, even for doctors
    (tmp_path / LOG_NAME).write_text("".join(log_line(10 * k + 1, parse_punctuation(
        {"srp": ["nurse" if k % 2 else "doctor"], "ts": k + 1}, SCHEMA)) + "\n"
        for k in range(n)))
    shield = PunctuationShield(StreamLayout.of(definition))
    state = PlanState(0, compile_plan(plan_of("nurse"), SCHEMA), True)
    seqs = np.array([5, 15, 25, 10 * (n - 1) + 5], dtype=np.int64)

    def visible():
        _, rows, _ = shield.prepare(None).apply(np.zeros(4, np.int64), np.arange(4), seqs,
                                                {0: state})
        return rows.tolist()

    assert visible() == ([1, 3] if (n - 1) % 2 else [1])
    shield.moved(10 * (n - 2))  # the routed batches are past all but the last two segments
    assert shield.pruned and len(shield.starts) == 3
    assert visible() == ([3] if (n - 1) % 2 else [])  # the old rows: denied, never "no policy"


def test_a_union_of_grants_merges_only_what_the_segments_show(spark, tmp_path, catalog):
    """A union of two grants for a nurse (hr above 70 with the patient; the patient and the
    ward): each tuple once, with the attributes of the members it passes under its segment,
    those a segment hides null, a member whose filtered attribute is hidden not passed; equal
    to the oracle's rows of each member merged per tuple."""
    from pep.core.plan import UnionPlan
    from pep.core.punctuations import shielded_plan
    definition = catalog.get("vitals")
    hr70 = ExecutionPlan("vitals", ((_gt("hr", 70.0),),), ("patient", "hr"))
    wards = ExecutionPlan("vitals", None, ("patient", "ward"))
    union = shielded_plan(UnionPlan("vitals", (hr70, wards)), [definition], ["nurse"])
    assert isinstance(union, UnionPlan)
    assert all(p.punctuation_roles == ("nurse",) for p in union.plans)
    records = history(53, 60, 0, 10)
    merged: dict[int, dict] = {}
    order = [f.name for f in SCHEMA.fields]
    for projection, passes, reads in (
            (hr70.projection, lambda r: r["hr"] is not None and r["hr"] > 70.0, ("hr",)),
            (wards.projection, None, ())):
        for row in oracle(records, frozenset({"nurse"}), REFINE, projection, SCHEMA, passes,
                          reads):
            merged.setdefault(row["patient"], {}).update(row)
    want = [{a: merged[p][a] for a in order if a in merged[p]} for p in sorted(merged)]
    rt = runtime_for(spark, tmp_path / "work")
    try:
        got = Collector()
        rt.attach_handle("u", definition, union, got)
        append(catalog, records, 3)
        assert wait_until(lambda: len(got.rows) >= len(want), timeout=60)
        time.sleep(0.8)
        assert got.rows == want
    finally:
        rt.stop()
    # the punctuations took something: rows, and attributes nulled in rows that remain
    plain = [r for r in records if "$punctuation" not in r]
    assert len(want) < len(plain)
    source = {r["patient"]: r for r in plain}
    assert any(v is None and source[r["patient"]][a] is not None
               for r in want for a, v in r.items())
