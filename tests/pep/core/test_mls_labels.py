"""Multilevel labels in decisions (pep/core/labels.py, the session level of pep/core/access.py)
with the real PDP and policies/mls/position-policy.xml, and the lattice's algebra against brute
force over random lattices."""
from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdp.auth import Identity
from pdp.engine import PolicyEngine, PolicySource
from pep.core.access import decide_and_plan
from pep.core.errors import AccessDenied, InvalidInput, NoResult, NotPermitted
from pep.core.labels import (LABEL_MASKS, LABEL_NEGATED, Label, LabelError, Lattice, glb,
                             holds, lub, satisfiable)
from pep.core.plan import Field, Predicate, StreamSchema, plan_from_json
from pep.streams.definition import parse_schema

POLICIES = Path(__file__).resolve().parents[3] / "policies"
XML = "application/xacml+xml"
SCHEMA = parse_schema(next(s for s in json.loads((POLICIES / "streams.json").read_text())
                           if s["name"] == "position")["schema"])
LATTICE = SCHEMA.lookup("level").lattice


def analyst(clearance="S:{nuclear,crypto}"):
    return Identity("ana", ("analyst",), attributes=(("clearance", (clearance,)),)
                    if clearance else ())


@pytest.fixture(scope="module")
def engine():
    path = POLICIES / "mls" / "position-policy.xml"
    return PolicyEngine.compile([PolicySource(str(path), path.read_bytes())])


def plan(engine, name, who=None, query=None):
    body = (POLICIES / "mls" / name).read_bytes()
    return decide_and_plan(engine, body, XML, who or analyst(), {"position": SCHEMA}.get,
                           user_query=None if query is None else json.dumps(query).encode(),
                           user_query_type=None if query is None else "application/json",
                           time_attribute_lookup=lambda s: "ts")


def test_an_analyst_reads_at_its_clearance_or_a_session_below_it(engine):
    p = plan(engine, "analyst-request.xml").plan
    assert p.filter_dnf == ((Predicate("level", "<=", LATTICE.parse("S:{nuclear,crypto}")),),)
    stored = plan_from_json(p.canonical_json())  # a label is stored as its text, same key
    assert '"value":"S:{nuclear,crypto}"' in stored.canonical_json() and stored.key() == p.key()
    g = plan(engine, "analyst-session-request.xml")
    assert g.plan.filter_dnf == ((Predicate("level", "<=", LATTICE.parse("C:{nuclear}")),),)
    assert "`level` DOMINATED_BY 'C:{nuclear}'" in g.sql
    assert g.plan_json["filter"] == [[{"attribute": "level", "op": "<=",
                                       "label": "C:{nuclear}"}]]


def test_no_read_up_and_no_session_without_a_clearance(engine):
    with pytest.raises(NotPermitted, match="not dominated by your clearance"):
        plan(engine, "analyst-read-up-request.xml")
    with pytest.raises(NotPermitted, match="no clearance"):
        plan(engine, "analyst-session-request.xml", who=analyst(None))
    with pytest.raises(AccessDenied, match="session"):  # nothing to bind {subject:session} to
        plan(engine, "analyst-request.xml", who=analyst(None))
    # an incomparable session (another category) is no session below the clearance either
    body = (POLICIES / "mls" / "analyst-session-request.xml").read_bytes() \
        .replace(b"C:{nuclear}", b"C:{army}")
    with pytest.raises(NotPermitted, match="not dominated"):
        decide_and_plan(engine, body, XML, analyst(), {"position": SCHEMA}.get)
    with pytest.raises(InvalidInput, match="unknown level"):
        decide_and_plan(engine, body.replace(b"C:{army}", b"Q"), XML, analyst(),
                        {"position": SCHEMA}.get)
    other = StreamSchema((Field("x", "long"),))
    with pytest.raises(InvalidInput, match="no security labels"):
        decide_and_plan(engine, body.replace(b">position<", b">plain<"), XML, analyst(),
                        {"plain": other}.get)


def test_consumers_own_dominance_filters_get_exact_nr_and_pr(engine):
    g = plan(engine, "analyst-request.xml", query={"filter": "level DOMINATED_BY 'C'"})
    assert g.warnings == []
    with pytest.raises(NoResult, match="DOMINATES 'S:\\{army\\}'"):
        plan(engine, "analyst-request.xml", query={"filter": "level DOMINATES 'S:{army}'"})
    g = plan(engine, "analyst-request.xml", query={"filter": "level DOMINATES 'C'"})
    (pr,) = g.warnings
    assert pr.kind == "PR" and "NOT level DOMINATED_BY 'S:{nuclear,crypto}'" in pr.message


def test_the_count_windows_carry_the_sessions_bound(engine):
    g = plan(engine, "analyst-count-request.xml")
    w = g.plan.window
    assert w.label_bounds == (("level", "S:{nuclear,crypto}"),)
    assert [a.output_name for a in w.aggregates] == ["count_sid", "lub_level"]
    assert g.plan.filter_dnf is None  # nothing filtered before the window
    assert "DOMINATED_BY 'S:{nuclear,crypto}'" in g.sql
    low = plan(engine, "analyst-count-request.xml", who=analyst("C"))
    assert low.plan.window.label_bounds == (("level", "C"),)


# -- the lattice against brute force ----------------------------------------------------------

def lattices():
    return st.builds(lambda n, m: Lattice(tuple(f"L{i}" for i in range(n)),
                                          tuple(f"c{i}" for i in range(m))),
                     st.integers(1, 4), st.integers(0, 4))


def every_label(lattice):
    for level, bits in itertools.product(range(len(lattice.levels)),
                                         range(1 << len(lattice.categories))):
        yield Label(lattice, level, bits)


@settings(max_examples=200, deadline=None)
@given(lattices(), st.data())
def test_satisfiability_is_exact_on_small_lattices(lattice, data):
    labels = list(every_label(lattice))
    preds = data.draw(st.lists(st.tuples(st.sampled_from(sorted(LABEL_MASKS)),
                                         st.sampled_from(labels)), max_size=4))
    brute = any(all(holds(v, op, c) for op, c in preds) for v in labels)
    assert satisfiable(lattice, preds) == brute
    for op, c in preds:  # negation is the complement
        for v in labels:
            assert holds(v, op, c) != holds(v, LABEL_NEGATED[op], c)


@settings(max_examples=100, deadline=None)
@given(lattices(), st.data())
def test_lub_and_glb_are_the_bounds(lattice, data):
    labels = list(every_label(lattice))
    some = data.draw(st.lists(st.sampled_from(labels), min_size=1, max_size=4))
    top, bottom = lub(some), glb(some)
    assert all(x.dominated_by(top) and bottom.dominated_by(x) for x in some)
    uppers = [v for v in labels if all(x.dominated_by(v) for x in some)]
    assert all(top.dominated_by(v) for v in uppers)
    assert lattice.parse(str(top)) == top and lattice.label(top.code) == top


def test_label_texts_are_validated_and_canonical():
    assert str(LATTICE.parse("S:{crypto, nuclear}")) == "S:{nuclear,crypto}"
    assert str(LATTICE.parse({"level": "TS", "categories": ["army"]})) == "TS:{army}"
    assert str(LATTICE.parse("U:{}")) == "U"
    for bad in ("X", "S:{spy}", "S:{nuclear,}", "", "S:nuclear", 3, None, {"level": "S", "x": 1}):
        with pytest.raises(LabelError):
            LATTICE.parse(bad)
    rng = random.Random(7)
    for _ in range(50):  # a code is a label and back
        label = Label(LATTICE, rng.randrange(4), rng.randrange(8))
        assert LATTICE.label(label.code) == label
