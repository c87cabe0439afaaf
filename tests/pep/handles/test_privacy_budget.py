"""Privacy budgets: the ledger (SQLite, rolling periods, restarts), admission of a request, and
a handle that pays for every window and ends when its budget is spent (a recording runtime
stands in for Spark: windows are pushed as a micro-batch would deliver them)."""
from __future__ import annotations

import json
import time

import pytest

from pep.core.plan import Aggregate, ExecutionPlan, WindowSpec
from pep.core.privacy import Bound, Budget, PrivacySpec, units
from pep.core.rows import RowBatch
from pep.handles.one_window import WindowRegistry
from pep.handles.privacy_budget import PrivacyBudgetExceeded, PrivacyGuard, PrivacyLedger
from pep.handles.records import HandleState, HandleStore, StoredRequest, new_handle_id
from pep.handles.service import HandleService
from pep.streams.catalog import StreamCatalog
from tests.pep.conftest import RecordingRuntime

REQ = StoredRequest(b"<Request/>", "application/xacml+xml")


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def dp_plan(kind="tuple", size=3, step=2, epsilon=0.25, budgets=(Budget(1.0, 3600),),
            keys=()):
    spec = PrivacySpec(epsilon, 0.0, (Bound("rainrate", 0.0, 50.0),), tuple(budgets))
    return ExecutionPlan("weather", None, (), WindowSpec(
        kind, size, step, (Aggregate("rainrate", "sum"),),
        "samplingtime" if kind == "time" else None, 1, tuple(keys), spec))


def windows(starts, keys=None) -> RowBatch:
    rows = []
    for i, s in enumerate(starts):
        row = {"window_start": s, "window_end": s + 2}
        if keys:
            row["station"] = keys[i]
        row["sum_rainrate"] = 1.5
        rows.append(row)
    return RowBatch.of(rows)


@pytest.fixture
def env(tmp_path, storage):
    """Handle services paying from a ledger, on each database."""
    clock = Clock()
    catalog = StreamCatalog(storage.database("streams"), tmp_path / "d")
    catalog.register("weather", "nea", [{"name": "samplingtime", "type": "timestamp"},
                                        {"name": "station", "type": "string"},
                                        {"name": "rainrate", "type": "double"}],
                     None, "samplingtime")
    made = []

    def service(runtime=None):
        ledger = PrivacyLedger(storage.database("privacy"), clock=clock)
        store = HandleStore(storage.database("handles"))
        svc = HandleService(store, catalog.get, runtime or RecordingRuntime(),
                            WindowRegistry(new_handle_id=new_handle_id), max_rows=100,
                            privacy=PrivacyGuard(ledger))
        made.append((store, ledger))
        return svc

    yield service, clock, tmp_path
    for store, ledger in made:
        store.close()
        ledger.close()
    catalog.close()


def test_the_ledger_counts_a_rolling_period_and_survives_a_restart(storage):
    clock = Clock()
    budget = (Budget(1.0, 100),)
    ledger = PrivacyLedger(storage.database("privacy"), clock=clock)
    assert ledger.spend("lta", "weather", units(0.3), 5, budget)[0] == 3  # 0.9 of 1.0
    clock.t += 60
    assert ledger.spend("lta", "weather", units(0.3), 5, budget)[0] == 0
    assert ledger.spend("other", "weather", units(0.3), 1, budget)[0] == 1  # its own budget
    assert ledger.spend("lta", "ais", units(0.3), 1, budget)[0] == 1  # per stream
    (state,) = ledger.states("lta", "weather", budget)
    assert state.spent == units(0.9) and state.refills_at(units(0.3)) == clock.t - 60 + 100
    ledger.close()
    again = PrivacyLedger(storage.database("privacy"), clock=clock)  # a restart
    assert again.states("lta", "weather", budget)[0].spent == units(0.9)
    clock.t += 41  # the first spends leave the period
    assert again.spend("lta", "weather", units(0.3), 5, budget)[0] == 3
    again.close()


def test_long_periods_are_kept_in_buckets_that_never_forget_a_spend_early(storage):
    clock = Clock(1_800_000_000.5)
    day = (Budget(1.0, 86_400),)  # buckets of 84 s
    ledger = PrivacyLedger(storage.database("privacy"), clock=clock)
    for _ in range(3):
        assert ledger.spend("lta", "weather", units(0.25), 1, day)[0] == 1
        clock.t += 1_000
    spent_at = 1_800_000_000.5
    (state,) = ledger.states("lta", "weather", day)
    assert state.spent == units(0.75) and len(state.spends) == 3
    first_free = state.refills_at(units(0.5))
    assert spent_at + 86_400 <= first_free <= spent_at + 86_400 + 84
    ledger.close()
    again = PrivacyLedger(storage.database("privacy"), clock=clock)  # read back from the store
    assert again.states("lta", "weather", day)[0].spends == state.spends
    clock.t = first_free - 1
    assert again.states("lta", "weather", day)[0].spent == units(0.75)
    clock.t = first_free
    assert again.states("lta", "weather", day)[0].spent == units(0.5)
    again.close()


def test_a_tuple_window_is_admitted_while_one_window_is_affordable(env):
    service, clock, _ = env
    svc = service()
    guard = svc.privacy
    guard.ledger.spend("lta", "weather", units(0.25), 3, (Budget(1.0, 3600),))
    guard.admit("lta", dp_plan())  # 0.25 left: one window
    guard.ledger.spend("lta", "weather", units(0.25), 1, (Budget(1.0, 3600),))
    with pytest.raises(PrivacyBudgetExceeded) as exc:
        guard.admit("lta", dp_plan())
    assert "0 of 1 per 3600 s left on stream 'weather'" in exc.value.message
    assert "refills enough from" in exc.value.message
    figures = exc.value.details
    assert figures["budget"]["remaining"] == 0 and figures["needed"] == 0.25
    assert figures["refills_at"].endswith("Z")


def test_a_time_window_must_afford_a_period_of_its_windows(env):
    service, *_ = env
    guard = service().privacy
    # one window a minute, 0.01 each: 60 (+1) an hour = 0.61 of 1 per hour
    guard.admit("lta", dp_plan("time", 60, 60, 0.01))
    with pytest.raises(PrivacyBudgetExceeded, match="more than the whole budget") as exc:
        guard.admit("lta", dp_plan("time", 60, 10, 0.01))  # 361 an hour = 3.61
    assert exc.value.details["needed"] == pytest.approx(3.61)
    guard.ledger.spend("lta", "weather", units(0.5), 1, (Budget(1.0, 3600),))
    with pytest.raises(PrivacyBudgetExceeded, match="0.5 of 1 per 3600 s left"):
        guard.admit("lta", dp_plan("time", 60, 60, 0.01))
    status = guard.status("lta", dp_plan("time", 60, 60, 0.01))
    assert status["windows_per_period"] == [61] and status["admitted"] is False
    assert status["budgets"][0]["remaining"] == 0.5


def read_all(buffer):
    return buffer.read(0, timeout=0, limit=10_000)


def test_a_handle_pays_every_window_and_ends_when_the_budget_is_spent(env):
    service, clock, _ = env
    runtime = RecordingRuntime()
    svc = service(runtime)
    record, _ = svc.open("lta", ("consumer",), False, dp_plan(epsilon=0.25), {"p"}, REQ)
    buffer = svc.buffer(record.id)
    assert runtime.push(record.id, windows([0, 2]))  # 0.5 spent
    # 0.5 left: two windows paid and delivered, the third refused: the runtime detaches it
    assert not runtime.push(record.id, windows([4, 6, 8]))
    deadline = time.monotonic() + 5
    while svc.get(record.id).live and time.monotonic() < deadline:
        time.sleep(0.01)
    final = svc.get(record.id)
    assert final.state is HandleState.ENDED
    assert final.reason.startswith("privacy budget spent: 1 per 3600 s on stream 'weather'")
    assert "refills from" in final.reason
    events = read_all(buffer)
    rows = [json.loads(e.data)["window_start"] for e in events if e.kind == "row"]
    assert rows == [0, 2, 4, 6]  # the paid windows, still readable before the end
    assert events[-1].kind == "ended" and "privacy budget spent" in events[-1].data
    assert not runtime.push(record.id, windows([10]))  # nothing after
    assert svc.privacy.ledger.states("lta", "weather", (Budget(1.0, 3600),))[0].remaining == 0
    # a new request is refused with the figures, across a restart too
    with pytest.raises(PrivacyBudgetExceeded):
        svc.open("lta", ("consumer",), False, dp_plan(epsilon=0.25), {"p"}, REQ)
    restarted = service()
    with pytest.raises(PrivacyBudgetExceeded):
        restarted.open("lta", ("consumer",), False, dp_plan(epsilon=0.25), {"p"}, REQ)
    clock.t += 3601  # the period passed: the budget refilled
    again, new = restarted.open("lta", ("consumer",), False, dp_plan(epsilon=0.25), {"p"}, REQ)
    assert new and again.live


def test_a_refused_request_leaves_the_window_slot_free(env):
    service, *_ = env
    svc = service()
    svc.privacy.ledger.spend("lta", "weather", units(1.0), 1, (Budget(1.0, 3600),))
    with pytest.raises(PrivacyBudgetExceeded):
        svc.open("lta", ("consumer",), False, dp_plan(), {"p"}, REQ)
    exact = ExecutionPlan("weather", None, (), WindowSpec(
        "tuple", 3, 2, (Aggregate("rainrate", "sum"),)))
    record, new = svc.open("lta", ("consumer",), False, exact, {"p"}, REQ)
    assert new and record.live  # no 409 from a window the refusal never held


def test_keyed_time_windows_pay_once_per_window(env):
    service, *_ = env
    runtime = RecordingRuntime()
    svc = service(runtime)
    plan = dp_plan("time", 60, 60, 0.01, keys=("station",))
    record, _ = svc.open("lta", ("consumer",), False, plan, {"p"}, REQ)
    assert runtime.push(record.id, windows([0, 0, 0, 60, 60], keys=list("ABCAB")))
    (state,) = svc.privacy.ledger.states("lta", "weather", plan.window.privacy.budgets)
    assert state.spent == 2 * units(0.01)  # two windows, five key rows


def test_without_privacy_nothing_is_paid(env):
    service, *_ = env
    runtime = RecordingRuntime()
    svc = service(runtime)
    exact = ExecutionPlan("weather", None, (), WindowSpec(
        "tuple", 3, 2, (Aggregate("rainrate", "max"),)))
    record, _ = svc.open("lta", ("consumer",), False, exact, {"p"}, REQ)
    assert runtime.attached[record.id][2] == svc.buffer(record.id).put  # the buffer itself
    for _ in range(50):
        assert runtime.push(record.id, windows([0, 2, 4]))
    assert svc.get(record.id).live
    assert svc.privacy.ledger.states("lta", "weather", (Budget(1.0, 3600),))[0].spent == 0
