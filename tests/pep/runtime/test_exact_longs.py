"""64-bit integers and microsecond timestamps compare exactly on Spark (issue 21, part 3).

Random filters with = != < <= > >= IN and NOT IN over long values near 2^53 and 2^63 (and
-2^63), timestamps a microsecond apart in the year 9999 (where a double of epoch seconds merges
neighbours), and doubles (double semantics), go the gateway's way (condition text, binding, the
NR/PR analysis's merged filter, compilation) into one micro-batch of the shared executor; the
rows each plan receives must be exactly those Python's integers and fractions select. Every path
that filters is exercised: the compiled few-plans Column, the plan table (rows job), the panes
job (a tuple window aggregated in Spark), and a join side's filter Column.
"""
from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from pep.core.analysis import analyse_filter
from pep.core.conditions import parse_condition
from pep.core.exact import iso_from_micros, micros_from_iso
from pep.core.plan import (
    Aggregate,
    ExecutionPlan,
    Field,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
    WindowSpec,
)
from pep.runtime.plans.compile import compile_plan

SCHEMA = StreamSchema((Field("k", "long"), Field("n", "long"), Field("t", "timestamp"),
                       Field("x", "double")))
SPARK_SCHEMA = "k long, n long, t timestamp, x double, _xsg_seq long, _xsg_file string"
P53, P63 = 2 ** 53, 2 ** 63
FAR = micros_from_iso("9999-12-31T23:59:59.999990Z")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
OPS = ("<", "<=", ">", ">=", "=", "!=")
PY = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
      ">=": lambda a, b: a >= b, "=": lambda a, b: a == b, "!=": lambda a, b: a != b}

N_VALUES = ([P53 + d for d in range(-3, 4)] + [-P53 + d for d in (-1, 0, 1)]
            + [P63 - 1, P63 - 2, -P63, -P63 + 1, 0, None])
T_VALUES = [FAR + d for d in range(-3, 4)] + [0, None]


def _rows() -> list[dict]:
    out = []
    for i in range(max(len(N_VALUES), len(T_VALUES)) * 2):
        n = N_VALUES[i % len(N_VALUES)]
        t = T_VALUES[(i * 3) % len(T_VALUES)]
        x = None if i % 9 == 4 else float(P53 + (i % 5))  # 2^53 + 1 is no double: rounds
        out.append({"k": i, "n": n, "t": t, "x": x})
    return out


ROWS = _rows()

n_literals = st.one_of(
    st.builds(lambda c, d: str(c + d), st.sampled_from((P53, -P53, P63 - 1, -P63, P63)),
              st.integers(-3, 3)),
    st.builds(lambda c, d: f"{c + d}.5", st.sampled_from((P53, -P53, P63 - 2, -P63 + 1)),
              st.integers(-3, 3)),
    st.sampled_from(["1e30", "-1e30", "9007199254740993.0"]))
t_literals = st.builds(lambda d, extra: "'" + iso_from_micros(FAR + d)[:-1] + extra + "Z'",
                       st.integers(-3, 3), st.sampled_from(["", "", "5"]))
x_literals = st.builds(lambda d: str(P53 + d), st.integers(-2, 4))


def _comparison(attr: str, literals) -> st.SearchStrategy:
    return st.builds(lambda op, lit: (attr, op, (lit,)), st.sampled_from(OPS), literals)


def _membership(attr: str, literals) -> st.SearchStrategy:
    return st.builds(lambda neg, lits: (attr, "NOT IN" if neg else "IN", tuple(lits)),
                     st.booleans(), st.lists(literals, min_size=1, max_size=3))


item = st.one_of(_comparison("n", n_literals), _comparison("n", n_literals),
                 _membership("n", n_literals), _comparison("t", t_literals),
                 _membership("t", t_literals), _comparison("x", x_literals))
# a filter: OR of ANDs of items
filters = st.lists(st.lists(item, min_size=1, max_size=3), min_size=1, max_size=2)


def text_of(dnf) -> str:
    def one(attr, op, lits):
        if op in ("IN", "NOT IN"):
            return f"{attr} {op} ({', '.join(lits)})"
        return f"{attr} {op} {lits[0]}"
    return " OR ".join("(" + " AND ".join(one(*i) for i in conj) + ")" for conj in dnf)


def exact_value(attr: str, literal: str) -> Fraction:
    if attr == "t":
        return Fraction(micros_from_iso(literal.strip("'")))
    if attr == "x":
        return Fraction(float(literal))  # double semantics: the constant is a double
    return Fraction(Decimal(literal))


def row_value(attr: str, row: dict):
    v = row[attr]
    if v is None:
        return None
    return Fraction(v)


def python_filter(dnf) -> set[int]:
    """Rows (by k) the filter selects, with Python's exact arithmetic; a missing value fails."""
    def holds(attr, op, lits, row):
        v = row_value(attr, row)
        if v is None:
            return False
        values = [exact_value(attr, lit) for lit in lits]
        if op == "IN":
            return v in values
        if op == "NOT IN":
            return v not in values
        return PY[op](v, values[0])
    return {r["k"] for r in ROWS if any(all(holds(*i, r) for i in conj) for conj in dnf)}


def plan_of(dnf, projection=("k",), window=None) -> ExecutionPlan:
    expr = parse_condition(text_of(dnf), SCHEMA)
    analysis = analyse_filter(expr, None, SCHEMA)
    return ExecutionPlan("exact", analysis.filter_dnf, projection, window)


@pytest.fixture(scope="module")
def frame(spark):
    data = [(r["k"], r["n"], None if r["t"] is None else EPOCH + timedelta(microseconds=r["t"]),
             r["x"], 100 + r["k"], None) for r in ROWS]
    return spark.createDataFrame(data, SPARK_SCHEMA).cache()


def run_plans(spark, frame, plans: list[ExecutionPlan], tuple_pane_min: int = 8
              ) -> list[set[int]]:
    """One micro-batch of a fresh executor with these plans; each plan's delivered k values
    (a window plan's from its windows of one tuple: `max_k`)."""
    from pep.runtime.query.executor import StreamExecutor
    work = Path(tempfile.mkdtemp(prefix="xsg-exact-"))
    sd = StreamDefinition("exact", "o", SCHEMA, SourceSpec("ingest", (("path", str(work)),)),
                          time_attribute="t")
    ex = StreamExecutor(spark, sd, work / "work", 0.25, 2, 0.0, lambda h: None, tuple_pane_min)
    got: list[list] = [[] for _ in plans]
    for i, plan in enumerate(plans):
        ex.handles.add_handle(f"h{i}", compile_plan(plan, SCHEMA, "t"),
                              lambda batch, i=i: got[i].extend(json.loads(t) for t in batch.rows)
                              or True)
    ex.lifecycle.on_batch(frame, 0)
    ex.wait_delivered()
    out = []
    for plan, rows in zip(plans, got, strict=True):
        keys = [r["max_k"] if plan.window is not None else r["k"] for r in rows]
        assert len(keys) == len(set(keys))  # each tuple once
        out.append(set(keys))
    return out


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(filters, min_size=10, max_size=10))
@example([[[("n", "=", (str(P53 + 1),))]], [[("n", "IN", (str(P53 + 1), str(-P53 - 1)))]],
          [[("n", ">", ("9007199254740992.5",)), ("n", "<", (str(P53 + 2),))]],
          [[("n", "NOT IN", (str(P53),)), ("n", ">=", (str(P53 - 1),))]],
          [[("t", "=", ("'" + iso_from_micros(FAR + 1) + "'",))]],
          [[("t", "<", ("'" + iso_from_micros(FAR + 1)[:-1] + "5Z'",))]],
          [[("n", "<", ("1e30",))]], [[("n", "=", (str(P63),))]],
          [[("x", "=", (str(P53 + 1),))]], [[("n", "!=", ("2.5",))]]])
def test_rows_through_the_runtime_equal_pythons_filter(spark, frame, cases):
    want = [python_filter(dnf) for dnf in cases]
    plans = [plan_of(dnf) for dnf in cases]
    # the compiled few-plans Column (at most 8 plain plans, whole-stage code generation)
    assert run_plans(spark, frame, plans[:4]) == want[:4]
    # the plan table: more plans than that, and a window aggregated in Spark (panes job)
    windowed = [plan_of(dnf, (), WindowSpec("tuple", 1, 1, (Aggregate("k", "max"),)))
                for dnf in cases[:2]]
    got = run_plans(spark, frame, plans + windowed, tuple_pane_min=1)
    assert got == want + want[:2]
    # a join's side filter (plain Column expressions, pep/runtime/joins/runtime.py)
    from pep.runtime.joins.frames import filter_column
    sd = StreamDefinition("exact", "o", SCHEMA, SourceSpec("ingest", (("path", "/none"),)), "t")
    for plan, expected in zip(plans[:2], want[:2], strict=True):
        column = filter_column(plan.filter_dnf, sd)
        rows = frame if column is None else frame.filter(column)
        assert {r["k"] for r in rows.select("k").collect()} == expected


def test_the_report_a_pinned_account_gets_no_neighbour(spark, frame):
    """`n = 9007199254740993` delivered the row of 9007199254740992 too, when longs compared as
    doubles; on both paths it delivers exactly that account's rows."""
    dnf = [[("n", "=", ("9007199254740993",))]]
    want = {r["k"] for r in ROWS if r["n"] == P53 + 1}
    assert want and all(r["n"] != P53 for r in ROWS if r["k"] in want)
    assert run_plans(spark, frame, [plan_of(dnf)]) == [want]
    # nine distinct plans (their start positions lie before the batch): the plan table
    table = [ExecutionPlan("exact", plan_of(dnf).filter_dnf, ("k",), start_after=j)
             for j in range(9)]
    assert run_plans(spark, frame, table) == [want] * 9
