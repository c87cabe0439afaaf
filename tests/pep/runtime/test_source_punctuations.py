"""Security punctuations in a `files` stream's JSON lines (`pep/runtime/query/source_shield.py`):
records that reach Spark without passing through the gateway. A file's punctuations govern the
lines after them in that file; each file starts with no punctuation. Compared with the
brute-force oracle (`pep.core.punctuations.oracle`) run over each file on its own, for the
consumers of the ingest test, across a restart of the runtime; a punctuation line is never a
tuple, one that cannot be read hides its file's tuples until a newer policy, and a punctuation
cannot widen the policy. (Kafka: `tests/kafka/test_kafka_punctuations.py`.)"""
from __future__ import annotations

import json
import time

import pytest

from pep.core.plan import ExecutionPlan
from pep.streams.catalog import StreamCatalog
from tests.pep.runtime.support import Collector, wait_until, write_jsonl
from tests.pep.runtime.test_punctuations import (
    CONSUMERS,
    SCHEMA,
    _gt,
    expected,
    history,
    plan_of,
    runtime_for,
)

FIELDS = [{"name": f.name, "type": f.type} for f in SCHEMA.fields]


@pytest.fixture
def catalog(tmp_path):
    c = StreamCatalog(tmp_path / "streams.db", tmp_path / "data")
    (tmp_path / "src").mkdir()
    c.register("vitals", "hospital", FIELDS, {"kind": "files", "path": str(tmp_path / "src"),
                                              "punctuations": "on"}, trusted=True)
    yield c
    c.close()


def by_patient(rows: list[dict]) -> list[dict]:
    """Rows in a stable order (files of one batch have no order among them)."""
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def _attach(rt, definition, names=CONSUMERS) -> dict[str, Collector]:
    got = {h: Collector() for h in names}
    for handle, collector in got.items():
        rt.attach_handle(handle, definition, plan_of(handle), collector)
    return got


def _settle(got, want) -> None:
    wait_until(lambda: all(len(got[h].rows) >= len(want[h]) for h in got), timeout=90)
    time.sleep(1.0)  # nothing more comes


def test_each_file_s_punctuations_give_each_consumer_exactly_its_segments_across_a_restart(
        spark, tmp_path, catalog):
    definition = catalog.get("vitals")
    src = tmp_path / "src"
    files = {"a.json": history(60, 30, 0, 10), "b.json": history(61, 30, 100, 10),
             "c.json": history(62, 30, 200, 5)}
    later = {"d.json": history(63, 30, 300, 1), "e.json": history(64, 30, 400, 50)}
    work = tmp_path / "work"
    rt = runtime_for(spark, work)
    try:
        got = _attach(rt, definition)
        time.sleep(1.0)  # the first handle starts the stream at its end: the files come after
        for name, records in files.items():
            write_jsonl(src, name, records)
        want = {h: by_patient([r for recs in files.values() for r in expected(recs, h)])
                for h in CONSUMERS}
        _settle(got, want)
        for handle in CONSUMERS:
            assert by_patient(got[handle].rows) == want[handle], handle
        assert rt.stats()["vitals"]["punctuation_segments"] > 3
    finally:
        rt.stop()
    for name, records in later.items():  # written while the gateway is down
        write_jsonl(src, name, records)
    rt = runtime_for(spark, work)
    try:
        again = _attach(rt, definition)
        rest = {h: by_patient([r for recs in later.values() for r in expected(recs, h)])
                for h in CONSUMERS}
        _settle(again, rest)
        for handle in CONSUMERS:
            assert by_patient(again[handle].rows) == rest[handle], handle
        # the consumers differ: a shield that let everything through would fail here
        assert len({json.dumps(rest[h]) for h in CONSUMERS}) == len(CONSUMERS)
    finally:
        rt.stop()


def test_a_punctuation_line_is_never_a_tuple_and_one_unreadable_hides_what_follows(
        spark, tmp_path, catalog):
    """The `$punctuation` lines never come back as rows (of nulls); a line that names one but
    cannot be read (here: an unknown role list, another key beside it) denies the file's
    tuples after it until a newer policy starts; the next file starts afresh."""
    definition = catalog.get("vitals")
    rt = runtime_for(spark, tmp_path / "work")
    try:
        got = _attach(rt, definition, ["nurse"])
        time.sleep(1.0)
        t = [{"patient": i, "hr": 80.0, "temp": 37.0, "ward": "er"} for i in range(12)]
        first = [
            t[0], {"$punctuation": {"srp": ["nurse"], "ts": 1}}, t[1],
            {"$punctuation": {"srp": "nurse", "ts": 2}}, t[2], t[3],  # srp not a list
            {"$punctuation": {"srp": ["nurse"], "ts": 1, "sn": 2}}, t[4],  # not newer
            {"$punctuation": {"srp": ["nurse"], "ts": 3}}, t[5],  # newer: readable again
            {"$punctuation": {"srp": ["nurse"], "ts": 4}, "patient": 99}, t[6],  # other key
            {"$punctuation": {"srp": ["nurse"], "ts": 5}}, t[7]]
        write_jsonl(tmp_path / "src", "a.json", first)
        write_jsonl(tmp_path / "src", "b.json", [t[8], t[9]])
        assert wait_until(lambda: len(got["nurse"].rows) >= 6, timeout=90)
        time.sleep(1.0)
        patients = sorted(r["patient"] for r in got["nurse"].rows)
        assert patients == [0, 1, 5, 7, 8, 9]
        oracle = expected(first, "nurse") + expected([t[8], t[9]], "nurse")
        assert by_patient(got["nurse"].rows) == by_patient(oracle)
        assert all(r["hr"] is not None for r in got["nurse"].rows)
        assert rt.stats()["vitals"]["punctuations_unreadable"] == 2
    finally:
        rt.stop()


def test_a_files_punctuation_cannot_widen_the_policy(spark, tmp_path, catalog):
    """The XACML plan shows hr above 70 and the patient only; a punctuation naming the
    consumer's role for every attribute gives it nothing more."""
    definition = catalog.get("vitals")
    rt = runtime_for(spark, tmp_path / "work")
    try:
        got = Collector()
        plan = ExecutionPlan("vitals", ((_gt("hr", 70.0),),), ("patient",),
                             punctuation_roles=("nurse",))
        rt.attach_handle("h", definition, plan, got)
        time.sleep(1.0)
        write_jsonl(tmp_path / "src", "a.json", [
            {"$punctuation": {"srp": ["nurse"], "ts": 1}},
            {"patient": 1, "hr": 60.0, "temp": 37.0, "ward": "er"},
            {"patient": 2, "hr": 80.0, "temp": 38.0, "ward": "er"},
            {"$punctuation": {"srp": ["doctor"], "ts": 2}},
            {"patient": 3, "hr": 90.0, "temp": 39.0, "ward": "er"},
            {"$punctuation": {"srp": ["nurse"], "sign": "-", "ts": 3,
                              "ddp": {"attributes": ["temp"]}}},
            {"patient": 4, "hr": 95.0, "temp": 39.0, "ward": "er"}])
        assert wait_until(lambda: len(got.rows) >= 2, timeout=90)
        time.sleep(1.0)
        assert got.rows == [{"patient": 2}, {"patient": 4}]
    finally:
        rt.stop()


@pytest.mark.timeout(600)
def test_windows_on_a_files_stream_hold_exactly_the_tuples_its_segments_let_count(
        spark, tmp_path):
    """The windows test of the ingest streams (`test_punctuated_windows`), each micro-batch a
    file whose punctuations are lines of it, fed through the stream's per-batch job as the
    files source shapes them: every consumer's windows equal the brute force over the tuples
    its segments let count, each file starting with no punctuation; the punctuation lines are
    in no window."""
    from pyspark.sql import functions as F

    from pep.core.plan import SourceSpec, StreamDefinition
    from pep.core.punctuations import visible_tuples
    from pep.runtime.plans.compile import compile_plan
    from pep.runtime.query.executor import StreamExecutor
    from pep.runtime.sources.frames import _punctuated_records
    from tests.pep.runtime import test_punctuated_windows as w
    from tests.pep.runtime.test_hidden_time import CONSUMER, ISO, SCHEMA, brute, decoded

    batches = w.history(77, 5, 12)
    sd = StreamDefinition("x", "o", SCHEMA, SourceSpec("files", (
        ("format", "json"), ("path", str(tmp_path)), ("punctuations", "on"))),
        time_attribute="ts")
    ex = StreamExecutor(spark, sd, tmp_path / "work", 0.25, 2, w.LATENESS, lambda h: None,
                        tuple_pane_min=2)
    got: dict[str, dict[int, list[str]]] = {name: {} for name in w.CONSUMERS}
    current = [0]

    def collector(name: str):
        def deliver(batch) -> bool:
            assert batch.rows
            got[name].setdefault(current[0], []).extend(batch.rows)
            return True
        return deliver

    def line(r: dict) -> str:
        if "$punctuation" in r:
            return json.dumps(r)
        return json.dumps({k: (v.strftime(ISO) if k == "ts" and v is not None else v)
                           for k, v in r.items() if k != "_xsg_seq"})
    for name in w.CONSUMERS:
        ex.handles.add_handle(name, compile_plan(w.plan_of(name), SCHEMA, "ts"), collector(name))
    try:
        for i, records in enumerate(batches):
            current[0] = i
            df = spark.createDataFrame([(line(r), n, f"file:/src/f{i}.json")
                                        for n, r in enumerate(records)],
                                       "t string, n long, _xsg_file string")
            ex.lifecycle.on_batch(_punctuated_records(df, sd, F.col("t"), F.col("n")), i)
            ex.wait_delivered()
    finally:
        ex.stop()
    for name, (base, roles, mode) in w.CONSUMERS.items():
        compiled = compile_plan(w.plan_of(name), SCHEMA, "ts")
        assert compiled.punctuations is not None
        kept = [{r["_xsg_seq"] for r in visible_tuples(b, frozenset(roles), mode,
                                                       compiled.punctuations[2], SCHEMA)}
                for b in batches]  # each file on its own
        mine = [[r for r in b if "$punctuation" not in r and r["_xsg_seq"] in kept[i]]
                for i, b in enumerate(batches)]
        assert decoded(got[name]) == brute(mine, CONSUMER[base], w.LATENESS), name
        whole = brute([[r for r in b if "$punctuation" not in r] for b in batches],
                      CONSUMER[base], w.LATENESS)
        assert brute(mine, CONSUMER[base], w.LATENESS) != whole, name
        assert sum(len(rows) for rows in got[name].values()) >= 2, name  # something to see


def test_a_kafka_batch_run_again_after_a_crash_gets_the_same_segments(spark, tmp_path):
    """The segments a Kafka micro-batch gets depend on its offsets alone: run again after a
    crash (a new shield reading the stream's log, the batch after it learnt its punctuations
    but before Spark committed it), it gets the same ones, in each partition the policy in
    force at the end of the batch before carried in."""
    from pyspark.sql import functions as F

    from pep.core.plan import SourceSpec, StreamDefinition
    from pep.runtime.base.columns import KAFKA_FILE_FORMAT, LANE_BITS
    from pep.runtime.query.settings import StreamLayout
    from pep.runtime.query.shield import verdict_key
    from pep.runtime.query.source_shield import SourceShield
    from pep.runtime.sources.frames import _punctuated_records

    sd = StreamDefinition("vitals", "o", SCHEMA, SourceSpec("kafka", (
        ("bootstrap.servers", "127.0.0.1:9"), ("punctuations", "on"), ("subscribe", "t"))))
    parts = [history(80, 24, 0, 10), history(81, 24, 100, 10)]
    cut = [len(p) // 2 for p in parts]  # batch 0: the first half of each partition

    def frame(batch: int):
        rows = []
        for p, records in enumerate(parts):
            span = range(0, cut[p]) if batch == 0 else range(cut[p], len(records))
            rows += [(json.dumps(records[o]), (p << LANE_BITS) + o,
                      KAFKA_FILE_FORMAT % ("t", p, o)) for o in span]
        df = spark.createDataFrame(rows, "t string, n long, _xsg_file string")
        return _punctuated_records(df, sd, F.col("t"), F.col("n"))

    def segments(shield, batch: int):
        tuples, guard = shield.shielded(frame(batch))
        assert tuples.where(F.col("patient").isNull()).count() == 0  # no punctuation row
        return guard.starts.tolist(), [verdict_key(p) for p in guard.policies]

    work = tmp_path / "work"
    first = SourceShield(spark, StreamLayout.of(sd), work)
    segments(first, 0)
    before = segments(first, 1)
    # the process dies after batch 1 learnt its punctuations, before Spark committed it
    again = SourceShield(spark, StreamLayout.of(sd), work)
    assert segments(again, 1) == before
    # and they are the brute force's: each partition's punctuations before each tuple
    from pep.core.punctuations import PUNCTUATION_KEY, ShieldState, parse_punctuation
    for p, records in enumerate(parts):
        state = ShieldState()
        for o, r in enumerate(records):
            if PUNCTUATION_KEY in r:
                state.add(parse_punctuation(r[PUNCTUATION_KEY], SCHEMA))
            elif o >= cut[p]:
                starts, kinds = before
                at = (p << LANE_BITS) + o
                k = max(i for i, s in enumerate(starts) if s <= at)
                assert kinds[k] == verdict_key(state.policy()), (p, o)
