"""Joins of streams with security punctuations (issue 48; the paper's SCJoin, section 5.4), on
real Spark, against a brute force.

Two ingest streams, each with its own punctuations changing every few tuples, joined by the
join runtime's own streaming query (`joins/frames.joined_frame`, each side reading its feed
directory, micro-batch after micro-batch). For each consumer, the joined rows must be exactly
what a brute force computes: a pair joins only when each tuple is visible to the consumer under
its own stream's segment, with every attribute the side's filter, the join's key and its time
read; the attributes a side's segment hides are null in the joined row."""
from __future__ import annotations

import json
import os
import random

import pytest

from pep.core.plan import (
    ExecutionPlan,
    Field,
    JoinPlan,
    Predicate,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
)
from pep.core.punctuations import (
    LOG_NAME,
    REFINE,
    ShieldState,
    log_line,
    parse_punctuation,
    shielded_plan,
    visible_attributes,
)
from tests.pep.runtime.support import write_jsonl

LEFT = StreamSchema((Field("t", "double"), Field("ward", "string"), Field("hr", "double"),
                     Field("temp", "double")))
RIGHT = StreamSchema((Field("ts", "double"), Field("ward", "string"), Field("nurse", "long"),
                      Field("note", "string")))
WARDS = ["icu", "er"]
ROLES = ["doctor", "nurse"]
WITHIN = 2.0
CONSUMERS = {"nurse": ("nurse",), "doctor": ("doctor",), "both": ("doctor", "nurse")}


def plan(roles: tuple[str, ...], left: StreamDefinition, right: StreamDefinition) -> JoinPlan:
    joined = JoinPlan(
        ExecutionPlan("vitals", ((Predicate("hr", ">", 60.0),),), ("t", "ward", "hr", "temp")),
        ExecutionPlan("rounds", None, ("ts", "ward", "nurse", "note")),
        (("ward", "ward"),), WITHIN, "t", "ts")
    shielded = shielded_plan(joined, [left, right], roles)
    assert isinstance(shielded, JoinPlan)
    return shielded


def punctuations(rng: random.Random, ts: int, attributes: list[str]) -> list[dict]:
    out = []
    for sn in range(1, rng.randint(1, 2) + 1):
        doc: dict = {"srp": rng.sample(ROLES, rng.choice([1, 1, 2])), "ts": ts, "sn": sn,
                     "sign": rng.choice("++-")}
        pick = rng.random()
        if pick < 0.35:
            doc["ddp"] = {"attributes": rng.sample(attributes, 1)}
        elif pick < 0.6:
            doc["ddp"] = {"tuples": [{"attribute": "ward", "op": "=", "value": rng.choice(WARDS)}]}
        out.append({"$punctuation": doc})
    return out


def history(seed: int, side: str, batches: int, size: int) -> list[list[dict]]:
    rng = random.Random(seed)
    out, ts, seq = [], 1, 0
    for b in range(batches):
        batch: list[dict] = []
        for k in range(size):
            if rng.random() < 0.35:
                ts += 1
                batch += punctuations(rng, ts, ["hr", "temp"] if side == "left"
                                      else ["nurse", "note"])
            seq += 1
            t = float(b * size + k) + rng.choice([0.0, 0.5])
            if side == "left":
                batch.append({"t": t, "ward": rng.choice(WARDS),
                              "hr": float(rng.randint(50, 120)), "temp": 37.0, "_xsg_seq": seq})
            else:
                batch.append({"ts": t + 0.25, "ward": rng.choice(WARDS),
                              "nurse": rng.randint(1, 9), "note": f"n{seq}", "_xsg_seq": seq})
        out.append(batch)
    return out


def visible(records: list[dict], schema: StreamSchema, roles: frozenset[str],
            shown: tuple[str, ...], reads: tuple[str, ...], passes) -> list[dict]:
    """A side's tuples the consumer may join, by brute force: hidden attributes null."""
    state = ShieldState()
    out = []
    for r in records:
        if "$punctuation" in r:
            state.add(parse_punctuation(r["$punctuation"], schema))
            continue
        policy = state.policy()
        matched = frozenset(c for c in policy.conditions
                            if all(x.holds(r.get(x.attribute)) for x in c))
        seen = visible_attributes(policy, roles, REFINE, shown, matched, reads)
        if seen and passes(r):
            out.append({a: (r[a] if a in seen else None) for a in shown})
    return out


def brute(lefts: list[list[dict]], rights: list[list[dict]], roles: tuple[str, ...]
          ) -> list[tuple]:
    who = frozenset(roles)
    ls = visible([r for b in lefts for r in b], LEFT, who, ("t", "ward", "hr", "temp"),
                 ("hr", "ward", "t"), lambda r: r["hr"] > 60.0)
    rs = visible([r for b in rights for r in b], RIGHT, who, ("ts", "ward", "nurse", "note"),
                 ("ward", "ts"), lambda r: True)
    return sorted(((lr["t"], lr["ward"], lr["hr"], lr["temp"], rr["ts"], rr["ward"],
                    rr["nurse"], rr["note"]) for lr in ls for rr in rs
                   if lr["ward"] == rr["ward"] and abs(lr["t"] - rr["ts"]) <= WITHIN), key=repr)


def write_log(directory, batches: list[list[dict]], schema: StreamSchema) -> None:
    """The stream's punctuations into its log, each at the position of the tuple it precedes
    (as the ingest writes them, before the tuples' files)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines, pending = [], []
    for r in (r for b in batches for r in b):
        if "$punctuation" in r:
            pending.append(parse_punctuation(r["$punctuation"], schema))
            continue
        lines += [log_line(r["_xsg_seq"], sp) for sp in pending]
        pending = []
    (directory / LOG_NAME).write_text("".join(line + "\n" for line in lines))


def write_feed(feed, batches: list[list[dict]]) -> None:
    """Each batch's tuples into a file of the join's feed, in order."""
    for i, records in enumerate(batches):
        write_jsonl(feed, f"{i:03d}.json", [r for r in records if "$punctuation" not in r])
        os.utime(feed / f"{i:03d}.json", (1_600_000_000 + i,) * 2)


def run_join(spark, base, left: StreamDefinition, right: StreamDefinition, joined: JoinPlan,
             feeds) -> list[tuple]:
    from pyspark.sql import functions as F

    from pep.runtime.joins.frames import joined_frame
    frame, outputs = joined_frame(spark, left, right, joined, 1000.0, max_files=1, feeds=feeds)
    rows: list[tuple] = []

    def collect(batch, batch_id):
        rows.extend(tuple(r) for r in batch.select(
            *[F.col(o.internal).alias(o.name) for o in outputs]).collect())
    query = (frame.writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(base / "checkpoint"))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(240), "the join query did not finish"
        assert query.exception() is None
    finally:
        query.stop()
    return sorted(rows, key=repr)


@pytest.mark.timeout(600)
def test_a_join_respects_both_sides_segments(spark, tmp_path):
    lefts, rights = history(1, "left", 3, 8), history(2, "right", 3, 8)
    left = StreamDefinition("vitals", "o", LEFT, SourceSpec(
        "ingest", (("path", str(tmp_path / "vitals")), ("punctuations", "on"))), "t")
    right = StreamDefinition("rounds", "o", RIGHT, SourceSpec(
        "ingest", (("path", str(tmp_path / "rounds")), ("punctuations", "on"))), "ts")
    write_log(tmp_path / "vitals", lefts, LEFT)
    write_log(tmp_path / "rounds", rights, RIGHT)
    wanted = {name: brute(lefts, rights, roles) for name, roles in CONSUMERS.items()}
    for name, roles in CONSUMERS.items():
        base = tmp_path / name
        feeds = (base / "feed-vitals", base / "feed-rounds")
        write_feed(feeds[0], lefts)
        write_feed(feeds[1], rights)
        got = run_join(spark, base, left, right, plan(roles, left, right), feeds)
        assert got == wanted[name], name
    # the consumers differ, each gets something, and each loses pairs to the punctuations
    assert len({json.dumps(rows) for rows in wanted.values()}) == len(CONSUMERS)
    assert all(len(rows) >= 3 for rows in wanted.values()), {n: len(r) for n, r in wanted.items()}
    unshielded = sum(1 for lr in (r for b in lefts for r in b if "$punctuation" not in r)
                     if lr["hr"] > 60.0
                     for rr in (r for b in rights for r in b if "$punctuation" not in r)
                     if lr["ward"] == rr["ward"] and abs(lr["t"] - rr["ts"]) <= WITHIN)
    assert all(len(rows) < unshielded for rows in wanted.values())
    # some joined row shows an attribute a segment hides as null
    assert any(None in row for rows in wanted.values() for row in rows)


def test_a_side_shield_drops_hidden_tuples_and_nulls_hidden_attributes(tmp_path):
    """The side's shield on Arrow batches (no Spark): a plain side keeps a tuple with a hidden
    attribute it does not read (null), a windowed side drops it when its window reads it."""
    import pyarrow as pa

    from pep.runtime.joins.shield import SideShield
    log = tmp_path / LOG_NAME
    log.write_text("".join(log_line(at, parse_punctuation(doc, LEFT)) + "\n" for at, doc in [
        (1, {"srp": ["doctor"], "ts": 1}),
        (3, {"srp": ["nurse"], "sign": "-", "ddp": {"attributes": ["hr"]}, "ts": 2}),
        (5, {"srp": ["nurse"], "ts": 3})]))
    batch = pa.RecordBatch.from_pylist([
        {"t": float(i), "ward": "icu", "hr": 70.0 + i, "temp": 37.0, "_xsg_seq": i}
        for i in range(7)] + [{"t": 9.0, "ward": "icu", "hr": 1.0, "temp": 1.0,
                               "_xsg_seq": None}])
    types = tuple((f.name, f.type) for f in LEFT.fields)

    def shielded(shown, reads, windowed):
        shield = SideShield(str(log), types, frozenset({"nurse"}), REFINE, shown, reads,
                            windowed)
        return shield.apply(batch, *shield.segments()).to_pylist()

    plain = shielded(("t", "ward", "hr", "temp"), ("ward", "t"), False)
    assert [(r["_xsg_seq"], r["hr"]) for r in plain] == [
        (0, 70.0), (3, None), (4, None), (5, 75.0), (6, 76.0)]
    windowed = shielded((), ("hr", "t"), True)
    assert [r["_xsg_seq"] for r in windowed] == [0, 5, 6]
    # a side whose join key is the hidden attribute joins none of those tuples
    assert [r["_xsg_seq"] for r in shielded(("t", "hr"), ("hr", "t"), False)] == [0, 5, 6]


@pytest.mark.timeout(600)
def test_a_join_through_the_catalogue_and_the_join_runtime(spark, tmp_path):
    """The same, end to end in the runtime: both streams registered with punctuations on, the
    records (punctuations among them) appended through the catalogue's ingest after the join
    opened (its feeds), the join run by `JoinRuntime`: the nurse's rows are the brute force's."""
    from pep.runtime.joins.runtime import JoinRuntime
    from pep.streams.catalog import StreamCatalog
    from tests.pep.runtime.support import wait_until
    catalog = StreamCatalog(tmp_path / "streams.db", tmp_path / "data")
    for name, schema, time_attribute in (("vitals", LEFT, "t"), ("rounds", RIGHT, "ts")):
        catalog.register(name, "hospital", [{"name": f.name, "type": f.type}
                                            for f in schema.fields],
                         {"kind": "ingest", "punctuations": "on"}, time_attribute=time_attribute)
    left, right = catalog.get("vitals"), catalog.get("rounds")
    lefts, rights = history(1, "left", 3, 8), history(2, "right", 3, 8)
    want = brute(lefts, rights, ("nurse",))
    joins = JoinRuntime(spark, tmp_path / "work", trigger_interval=0.25, lateness=1000.0,
                        feeds=catalog)
    got: list[tuple] = []
    names = ["vitals.t", "vitals.ward", "vitals.hr", "vitals.temp", "rounds.ts", "rounds.ward",
             "rounds.nurse", "rounds.note"]

    def deliver(batch) -> bool:
        got.extend(tuple(json.loads(text)[n] for n in names) for text in batch.rows)
        return True
    try:
        joins.attach_join("h", (left, right), plan(("nurse",), left, right), deliver)
        for name, batches in (("vitals", lefts), ("rounds", rights)):
            for records in batches:
                body = "\n".join(json.dumps({k: v for k, v in r.items() if k != "_xsg_seq"})
                                 for r in records)
                catalog.append_records(name, body.encode())
        assert wait_until(lambda: len(got) >= len(want), timeout=150), (len(got), len(want))
        import time
        time.sleep(1.0)  # nothing more comes
        assert sorted(got, key=repr) == want
    finally:
        joins.stop()
        catalog.close()
