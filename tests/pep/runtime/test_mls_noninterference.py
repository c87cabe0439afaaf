"""Multilevel labels are non-interfering for the shipped policies (issue 41, item 4), tried from
the low reader's side: whatever tuples above its session are ingested - in the same window as
its own tuples, in the next one, far in the future, far in the past, without a time, within its
tuples' ingests or in ingests of their own - a reader gets exactly what it gets without them,
ingest by ingest: the same rows and windows, with the same values, at the same time.

The plans are the real ones: `policies/mls/` decided by the real PDP for a reader at a random
session of the position lattice, with the attacker's own queries (finer windows over what it
may read, a coarser one over the policy's), merged by pep.core. What a plan delivers is computed
from the tuples its filter passes (the filter Spark's shared query applies, checked against the
lattice on Spark in test_labels.py) by the runtime's own driver code for windows
(`pep.runtime.windows.pane_windows`, fed as routing feeds it: a batch's partials, then the plan's
own watermark). A brute force of the MLS DSMS paper's answer (windows over the tuples the session
dominates) checks that this reference computes windows at all. The same over HTTP on Spark:
tests/e2e/test_mls_labels.py.

The other shape stays available as the owner's explicit choice (stream-window-label-scope-id
`all`: every tuple enters the window, a window whose lub is above the session is withheld). It
leaks the presence of higher tuples, and the last tests show that it does."""
from __future__ import annotations

import functools
import json
import math
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from common.auth import Identity
from pdp.engine import PolicyEngine, PolicySource
from pep.core.access import decide_and_plan
from pep.core.conditions.evaluation import evaluate
from pep.core.conditions.syntax import Comparison
from pep.core.labels import Label, lub
from pep.core.plan import ExecutionPlan, StreamSchema
from pep.runtime.plans.compile import compile_plan
from pep.runtime.windows.pane_windows import PaneWindows
from pep.runtime.windows.window_reference import TupleWindows, partials_from_rows
from pep.streams.definition import parse_schema

POLICIES = Path(__file__).resolve().parents[3] / "policies"
STREAMS = {s["name"]: s for s in json.loads((POLICIES / "streams.json").read_text())}
POSITION = parse_schema(STREAMS["position"]["schema"])
VITALS = parse_schema(STREAMS["vitals"]["schema"])
LATTICE = POSITION.lookup("level").lattice
XML = "application/xacml+xml"
SHIPPED = (POLICIES / "mls" / "position-policy.xml").read_bytes()
T0 = 1_714_550_400.0  # a multiple of 60
FAR = 10 ** 8  # seconds: about three years either way
ISO = "%Y-%m-%dT%H:%M:%S.%fZ"

EVERY = [str(Label(LATTICE, level, bits)) for level in range(len(LATTICE.levels))
         for bits in range(1 << len(LATTICE.categories))]


def dominated(text: str, session: str) -> bool:
    return LATTICE.parse(text).dominated_by(LATTICE.parse(session))


def below(session: str) -> list[str]:
    return [x for x in EVERY if dominated(x, session)]


def above(session: str) -> list[str]:
    """Labels the session does not dominate: higher, or incomparable."""
    return [x for x in EVERY if not dominated(x, session)]


SESSIONS = [s for s in EVERY if above(s)]  # every label but the top


# -- the policies: the shipped one, its window in other shapes, and the explicit opt-in -----------

WINDOW = re.compile(rb'(<ObligationExpression ObligationId="exacml:obligation:stream-window".*?)'
                    rb'(</ObligationExpression>)', re.S)


def assignment(suffix: str, value: str, integer: bool = False) -> bytes:
    kind = "integer" if integer else "string"
    return (f'<AttributeAssignmentExpression AttributeId="exacml:obligation:{suffix}">'
            f'<AttributeValue DataType="http://www.w3.org/2001/XMLSchema#{kind}">{value}'
            '</AttributeValue></AttributeAssignmentExpression>').encode()


def reshaped(kind: str, size: int, step: int, min_count: int | None = None,
             scope: str | None = None) -> bytes:
    """The shipped policy with its window of another type, size and step (and minimum count,
    and label scope when given)."""
    def window(m: re.Match) -> bytes:
        body = m.group(1)
        for suffix, value in (("type", kind), ("size", str(size)), ("step", str(step))):
            body = re.sub(rb'(stream-window-' + suffix.encode() + rb'-id">\s*<AttributeValue '
                          rb'[^>]*>)[^<]*', lambda x, value=value: x.group(1) + value.encode(),
                          body)
        if min_count is not None:
            body += assignment("stream-window-min-count-id", str(min_count), True)
        if scope is not None:
            body += assignment("stream-window-label-scope-id", scope)
        return body + m.group(2)
    out, n = WINDOW.subn(window, SHIPPED)
    assert n == 1
    return out


def opted_in() -> bytes:
    """The shipped policy with the owner's explicit choice of the leaky shape."""
    return reshaped("time", 60, 60, scope="all")


ENGINES = {
    "shipped": SHIPPED,
    "tuple-3-2": reshaped("tuple", 3, 2),
    "time-10-5-min1": reshaped("time", 10, 5, 1),
    "shipped-dominated": reshaped("time", 60, 60, scope="dominated"),  # the default, written out
}


@functools.cache
def engine(name: str) -> PolicyEngine:
    document = opted_in() if name == "opted-in" else ENGINES[name]
    return PolicyEngine.compile([PolicySource(name, document)])


def analyst(session: str) -> Identity:
    return Identity("ana", ("analyst",), attributes=(("clearance", (session,)),))


# What the low reader asks: (policy, request, its own query). The read grant with its own windows
# (the paper's Q2) and the aggregate grant with a coarser window are the attacker's best shots.
QUERIES = {
    "read": ("shipped", "analyst-request.xml", None),
    "read-time-window": ("shipped", "analyst-request.xml",
                         {"window": {"type": "time", "size": 10, "step": 5,
                                     "aggregates": ["sid:count", "level:lub"]}}),
    "read-tuple-window": ("shipped", "analyst-request.xml",
                          {"window": {"type": "tuple", "size": 2, "step": 1,
                                      "aggregates": ["level:lub", "sid:count"]}}),
    "aggregate": ("shipped", "analyst-count-request.xml", None),
    "aggregate-coarser": ("shipped", "analyst-count-request.xml",
                          {"window": {"type": "time", "size": 120, "step": 60,
                                      "aggregates": ["sid:count"]}}),
    "aggregate-dominated": ("shipped-dominated", "analyst-count-request.xml", None),
    "aggregate-tuple": ("tuple-3-2", "analyst-count-request.xml", None),
    "aggregate-sliding": ("time-10-5-min1", "analyst-count-request.xml", None),
}


@functools.cache
def plan_for(query: str, session: str) -> ExecutionPlan:
    policy, request, own = QUERIES[query] if query in QUERIES else \
        ("opted-in", "analyst-count-request.xml", None)
    body = (POLICIES / "mls" / request).read_bytes()
    return decide_and_plan(engine(policy), body, XML, analyst(session), {"position": POSITION}.get,
                           user_query=None if own is None else json.dumps(own).encode(),
                           user_query_type=None if own is None else "application/json",
                           time_attribute_lookup=lambda s: "ts").plan


# -- what a plan delivers, ingest by ingest ------------------------------------------------------

def passes(plan: ExecutionPlan, row: dict) -> bool:
    if plan.filter_dnf is None:
        return True
    return any(all(evaluate(Comparison(p.attribute, p.op, p.value), row) for p in conj)
               for conj in plan.filter_dnf)


def deliveries(plan: ExecutionPlan, schema: StreamSchema, batches: list[list[dict]],
               lateness: float) -> list[list[dict]]:
    """Per ingest, what the plan delivers: its rows, or the windows that ingest completes."""
    compiled = compile_plan(plan, schema, "ts")
    w = compiled.window
    if w is None:
        return [[{a: r[a] for a in compiled.projection} for r in batch if passes(plan, r)]
                for batch in batches]
    lattices = dict(w.lattices)

    def values(r: dict) -> dict:  # what Spark hands the driver: a label as its code
        return {a: lattices[a].parse(r[a]).code if a in lattices and r[a] is not None
                else r[a] for a, _ in w.attributes}

    out = []
    if w.kind == "tuple":
        tuples = TupleWindows(w)
        for batch in batches:
            out.append(tuples.add([values(r) for r in batch if passes(plan, r)]))
        return out
    state = PaneWindows(w)
    width = state.layout.width
    for batch in batches:
        mine = [r for r in batch if passes(plan, r) and r["ts"] is not None]
        times = [r["ts"] for r in mine]
        partials = partials_from_rows(state.layout, [values(r) for r in mine],
                                      [math.floor(t / width) for t in times], None, times,
                                      [r["seq"] for r in mine])
        watermark = state.advance(max(times) if times else None, lateness)  # as routing does
        out.append([json.loads(t) for t in state.add(partials, watermark).texts])
    return out


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime(ISO)


def paper_windows(batches: list[list[dict]], session: str, lateness: float) -> list[list[dict]]:
    """The MLS DSMS paper's answer for the shipped `aggregate`, by brute force: tumbling 60 s
    windows over the tuples the session dominates (their count and lub), at least 3 of them,
    each emitted by the ingest whose latest dominated time (minus lateness) passes its end; a
    tuple for a window already emitted is late and dropped."""
    closed, top = -math.inf, None
    bags: dict[float, list[dict]] = {}
    out = []
    for batch in batches:
        mine = [r for r in batch if dominated(r["level"], session) and r["ts"] is not None]
        for r in mine:
            start = math.floor(r["ts"] / 60) * 60.0
            if start + 60 > closed:
                bags.setdefault(start, []).append(r)
            top = r["ts"] if top is None else max(top, r["ts"])
        rows = []
        if top is not None and top - lateness > closed:
            mark = top - lateness
            for start in sorted(bags):
                inside = bags[start]
                if closed < start + 60 <= mark and len(inside) >= 3:
                    rows.append({"window_start": iso(start), "window_end": iso(start + 60),
                                 "count_sid": len(inside),
                                 "lub_level": str(lub(LATTICE.parse(r["level"])
                                                      for r in inside))})
            closed = mark
            bags = {s: v for s, v in bags.items() if s + 60 > closed}
        out.append(rows)
    return out


# -- runs with and without the tuples above the session ------------------------------------------

def numbered(batches: list[list[dict]]) -> list[list[dict]]:
    n = 0
    out = []
    for batch in batches:
        copy = []
        for r in batch:
            n += 1
            copy.append({**r, "seq": n})
        out.append(copy)
    return out


def with_high(low: list[list[dict]], high: list[tuple[dict, int, bool]]
              ) -> tuple[list[list[dict]], list[int | None]]:
    """The low ingests with `high` ((tuple, slot, own ingest)) put among them: into a low
    ingest (at a position the slot picks) or, with `own ingest`, into an ingest of their own
    before the one the slot picks (or after the last). Also, per ingest, the index of the low
    ingest it carries (None: high tuples only)."""
    n = len(low)
    merged = [list(b) for b in low]
    own: dict[int, list[dict]] = {}
    for rec, slot, alone in high:
        if alone:
            own.setdefault(slot % (n + 1), []).append(rec)
        else:
            target = merged[slot % n]
            target.insert((slot // 7) % (len(target) + 1), rec)
    batches, index = [], []
    for i in range(n + 1):
        if i in own:
            batches.append(own[i])
            index.append(None)
        if i < n:
            batches.append(merged[i])
            index.append(i)
    return numbered(batches), index


def position(sid: int, level: str, ts: float | None) -> dict:
    return {"sid": sid, "lat": 1.5, "lon": 103.8, "level": level, "ts": ts}


def placed(where: str, anchor: float | None, x: int) -> float | None:
    """A high tuple's time relative to a low tuple's (`anchor`)."""
    base = T0 if anchor is None else anchor
    return {"same": math.floor(base / 60) * 60 + x % 60,  # the same 60 s window
            "near": base + (x % 11) - 5,  # within seconds of it (the sliding windows' panes)
            "next": math.floor(base / 60) * 60 + 60 + x % 60,
            "future": T0 + FAR + x,
            "past": T0 - FAR - x,
            "none": None}[where]


@st.composite
def scenarios(draw):
    session = draw(st.sampled_from(SESSIONS))
    low_labels = below(session)
    low_tuple = st.builds(
        lambda sid, s, frac, label, no_time: position(
            sid, label, None if no_time else T0 + s + frac),
        st.integers(1, 3), st.integers(0, 300), st.sampled_from([0.0, 0.25, 0.999]),
        st.sampled_from(low_labels), st.integers(0, 15).map(lambda v: v == 0))
    low = draw(st.lists(st.lists(low_tuple, min_size=1, max_size=6), min_size=1, max_size=4))
    times = [r["ts"] for b in low for r in b]
    high = []
    for _ in range(draw(st.integers(1, 6))):
        where = draw(st.sampled_from(["same", "near", "next", "future", "past", "none"]))
        anchor = draw(st.sampled_from(times))
        ts = placed(where, anchor, draw(st.integers(0, 10 ** 6)))
        high.append((position(draw(st.integers(1, 3)), draw(st.sampled_from(above(session))),
                               ts), draw(st.integers(0, 10 ** 4)), draw(st.booleans())))
    return session, low, high


def compare(query: str, session: str, low: list[list[dict]], high: list, lateness: float
            ) -> list[list[dict]]:
    """What the plan delivers without the high tuples, after checking that it delivers exactly
    that with them: the same, ingest by ingest, and nothing in an ingest of high tuples only."""
    plan = plan_for(query, session)
    quiet = deliveries(plan, POSITION, numbered(low), lateness)
    batches, index = with_high(low, high)
    busy = deliveries(plan, POSITION, batches, lateness)
    for i, rows in zip(index, busy, strict=True):
        if i is None:
            assert rows == [], (query, session, "an ingest of high tuples only delivered", rows)
        else:
            assert rows == quiet[i], (query, session, i)
    return quiet


# Hand-picked: low tuples in three minutes, each high tuple placement at least once.
LOW = [[position(1, "C", T0 + 1), position(2, "U", T0 + 5), position(1, "C:{nuclear}", T0 + 30),
        position(3, "U", T0 + 44)],
       [position(2, "C", T0 + 61), position(1, "U", T0 + 70), position(3, "C", T0 + 75),
        position(2, "C:{nuclear}", T0 + 119)],
       [position(1, "U", T0 + 121), position(2, "U", T0 + 130), position(3, "C", T0 + 150),
        position(1, "U", T0 + 185)]]
HIGH = [(position(1, "S", T0 + 10), 0, False),  # the same window as the reader's tuples
        (position(1, "C:{army}", T0 + 65), 0, False),  # the next one, ahead of the reader
        (position(2, "TS", T0 + FAR), 1, False),  # far in the future
        (position(3, "S:{nuclear}", T0 - FAR), 2, False),  # far in the past
        (position(2, "TS:{nuclear,crypto,army}", T0 + 140), 2, True),  # an ingest of its own
        (position(3, "C:{crypto}", None), 1, True)]


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_the_hand_picked_high_tuples_change_nothing_a_low_reader_gets(query):
    for lateness in (0.0, 3.0):
        quiet = compare(query, "C:{nuclear}", LOW, HIGH, lateness)
        assert any(quiet), query  # something to compare
        if query == "aggregate":
            assert quiet == paper_windows(numbered(LOW), "C:{nuclear}", lateness)
            assert [len(r) for r in quiet] == [0, 1, 2]  # three minutes closed


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@example(scenario=("C:{nuclear}", LOW, HIGH), lateness=0.0)
@given(scenario=scenarios(), lateness=st.sampled_from([0.0, 3.0]))
def test_high_tuples_never_change_what_a_low_reader_gets(scenario, lateness):
    session, low, high = scenario
    for query in QUERIES:
        quiet = compare(query, session, low, high, lateness)
        if query == "aggregate":
            assert quiet == paper_windows(numbered(low), session, lateness)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(clearance=st.integers(0, 2), data=st.data())
def test_vitals_medics_read_the_same_whatever_is_above_them(clearance, data):
    """The other shipped MLS policy (integer levels, no windows): rows only, filtered."""
    path = POLICIES / "mls" / "vitals-policy.xml"
    pdp = PolicyEngine.compile([PolicySource(str(path), path.read_bytes())])
    body = (POLICIES / "mls" / "medic-request.xml").read_bytes()
    who = Identity("medic-1", ("medic", f"clearance:{clearance}"),
                   attributes=(("clearance", (clearance,)),))
    plan = decide_and_plan(pdp, body, XML, who, {"vitals": VITALS}.get).plan

    def vitals(levels: st.SearchStrategy[int]) -> st.SearchStrategy[dict]:
        return st.builds(lambda sid, level: {"sid": sid, "wt": 70.0, "bp": 120.0, "pr": 60.0,
                                             "level": level}, st.integers(1, 5), levels)
    low = data.draw(st.lists(st.lists(vitals(st.integers(0, clearance)), min_size=1,
                                      max_size=4), min_size=1, max_size=3))
    high = data.draw(st.lists(st.tuples(vitals(st.integers(clearance + 1, 3)),
                                        st.integers(0, 100), st.booleans()), min_size=1,
                              max_size=4))
    quiet = deliveries(plan, VITALS, numbered(low), 0.0)
    batches, index = with_high(low, high)
    busy = deliveries(plan, VITALS, batches, 0.0)
    assert [rows for i, rows in zip(index, busy, strict=True) if i is not None] == quiet
    assert all(rows == [] for i, rows in zip(index, busy, strict=True) if i is None)


# -- the owner's explicit choice of the other shape ------------------------------------------------

def test_the_opt_in_windows_every_tuple_and_withholds_what_the_session_does_not_dominate():
    plan = plan_for("opted-in", "C:{nuclear}")
    assert plan.filter_dnf is None and plan.window.label_bounds == (("level", "C:{nuclear}"),)
    quiet = deliveries(plan, POSITION, numbered(LOW), 0.0)
    assert quiet == paper_windows(numbered(LOW), "C:{nuclear}", 0.0)  # no high tuple: the same
    # a tuple above the session in the first minute: that window is withheld, and its absence
    # is what the reader learns (the documented leak)
    batches, _ = with_high(LOW, [(position(1, "S", T0 + 10), 0, False)])
    busy = deliveries(plan, POSITION, batches, 0.0)
    assert [len(r) for r in quiet] == [0, 1, 2] and [len(r) for r in busy] == [0, 0, 2]
    # one far in the future closes every window at once, before the reader's tuples fill them
    batches, _ = with_high(LOW, [(position(1, "TS", T0 + FAR), 0, False)])
    assert deliveries(plan, POSITION, batches, 0.0) != quiet
