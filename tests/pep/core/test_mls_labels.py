"""Multilevel labels in decisions (pep/core/labels.py, the session level of pep/core/access.py)
with the real PDP and policies/mls/position-policy.xml, and the lattice's algebra against brute
force over random lattices."""
from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from common.auth import Identity
from pdp.engine import PolicyEngine, PolicySource
from pep.core.access import decide_and_plan
from pep.core.errors import AccessDenied, InvalidInput, NoResult, NotPermitted
from pep.core.labels import (
    LABEL_MASKS,
    LABEL_NEGATED,
    Label,
    LabelError,
    Lattice,
    glb,
    holds,
    lub,
    satisfiable,
)
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


def test_the_count_windows_aggregate_only_what_the_session_dominates(engine):
    """The window's label bound is a filter before the window (the MLS DSMS paper's shape),
    not a bound on the window's lub: nothing above the session enters a window."""
    g = plan(engine, "analyst-count-request.xml")
    w = g.plan.window
    assert w.label_bounds == ()  # no window is withheld for what it holds
    assert [a.output_name for a in w.aggregates] == ["count_sid", "lub_level"]
    assert g.plan.filter_dnf == ((Predicate("level", "<=", LATTICE.parse("S:{nuclear,crypto}")),),)
    assert "WHERE `level` DOMINATED_BY 'S:{nuclear,crypto}'" in g.sql
    low = plan(engine, "analyst-count-request.xml", who=analyst("C"))
    assert low.plan.filter_dnf == ((Predicate("level", "<=", LATTICE.parse("C")),),)
    assert low.plan.window.label_bounds == ()


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


# -- a window's label bound: a filter before the window unless the owner writes scope `all` -------

STRING = "http://www.w3.org/2001/XMLSchema#string"


def obligation(kind: str, values: list[tuple[str, str]]):
    from pdp import AttributeAssignment, Obligation
    return Obligation(f"exacml:obligation:{kind}", tuple(
        AttributeAssignment(f"exacml:obligation:{k}", STRING, v) for k, v in values))


def window_obligation(bounds, scope, kind, size, step):
    values = [("stream-window-type-id", kind), ("stream-window-size-id", str(size)),
              ("stream-window-step-id", str(step)), ("stream-window-attr-id", "sid:count"),
              ("stream-window-attr-id", "level:lub")]
    values += [("stream-window-label-bound-id", f"level DOMINATED_BY {b}") for b in bounds]
    if scope is not None:
        values.append(("stream-window-label-scope-id", scope))
    return obligation("stream-window", values)


EVERY = [str(x) for x in every_label(LATTICE)]
SESSION = "{subject:session}"


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from([f"'{x}'" for x in EVERY] + [SESSION]),
                                   min_size=1, max_size=2),
                          st.sampled_from([None, "dominated", "Dominated", " DOMINATED ", "all",
                                           "ALL"]),
                          st.sampled_from([("time", 60, 60), ("time", 10, 5),
                                           ("tuple", 3, 2)])),
                min_size=1, max_size=3).filter(lambda ws: len({w[2][0] for w in ws}) == 1),
       st.sampled_from(EVERY), st.booleans())
def test_only_an_explicit_all_lets_tuples_above_a_bound_into_a_window(windows, session,
                                                                        filtered):
    """Over random window obligations (one or several, merged; with or without a filter of the
    policy's own): unless an obligation says `all`, its label bounds are a filter before the
    window, a tuple passing it only when every bound dominates its label, and no window is
    withheld for what it holds. With `all` its bounds are the window's, and filter nothing."""
    from pep.core.conditions.evaluation import evaluate
    from pep.core.obligations import policy_graph

    def resolve(category, attribute):  # the one placeholder these policies read
        return [session] if attribute == "session" else []

    def label(bound: str) -> Label:
        return LATTICE.parse(session if bound == SESSION else bound.strip("'"))
    obligations = [window_obligation(*w[:2], *w[2]) for w in windows]
    if filtered:
        obligations.append(obligation("stream-filter", [("stream-filter-condition-id",
                                                         "sid > 2")]))
    graph = policy_graph(obligations, "position", SCHEMA, resolver=resolve)
    chosen = [scope is not None and scope.strip().lower() == "all" for _, scope, _ in windows]
    withheld = {("level", str(label(b)))
                for (bounds, _, _), all_ in zip(windows, chosen, strict=True) if all_
                for b in bounds}
    entering = [label(b) for (bounds, _, _), all_ in zip(windows, chosen, strict=True) if not all_
                for b in bounds]
    assert set(graph.window.spec.label_bounds) == withheld
    assert len(graph.window.spec.label_bounds) == len(withheld)
    condition = graph.filter.condition if graph.filter is not None else None
    assert (condition is None) == (not entering and not filtered)
    for text in EVERY:
        passes = condition is None or evaluate(condition, {"sid": 5, "level": text})
        assert passes == all(LATTICE.parse(text).dominated_by(b) for b in entering), text


@pytest.mark.parametrize("scope, bounds, error", [
    ("some", ["'C'"], "'some' must be 'dominated'"),
    ("", ["'C'"], "must be 'dominated'"),
    ("all", [], "has none"),
    ("dominated", [], "has none"),
])
def test_a_label_scope_the_pep_cannot_follow_means_deny(scope, bounds, error):
    from pep.core.obligations import ObligationError, policy_graph
    with pytest.raises(ObligationError, match=error):
        policy_graph([window_obligation(bounds, scope, "time", 60, 60)], "position", SCHEMA)
    two = window_obligation(["'C'"], "all", "time", 60, 60)
    two = replace(two, assignments=two.assignments + two.assignments[-1:])
    with pytest.raises(ObligationError, match="more than one"):
        policy_graph([two], "position", SCHEMA)
