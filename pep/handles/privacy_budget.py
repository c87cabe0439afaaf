"""Consumers' privacy budgets: the ledger of what each emitted private window spent, and the
guard that makes every delivery pay before it reaches a handle's buffer.

The ledger (`PrivacyLedger`: its store, `privacy.db` under the data directory or the PostgreSQL
database) holds what each
consumer paid on each stream, per second: epsilon (in integer billionths, rounded up; budgets
are rounded down, so rounding never grants a window too many), windows and delta; a spend is
dated at the end of its second, so it counts a little longer than its period, never shorter. A
budget `epsilon/seconds` holds when the consumer's spends on that stream in the last `seconds` (a
rolling period: at any moment, over every handle it had, has or will have) add up to at most
`epsilon`; older spends no longer count, which is how a budget refills. The ledger survives
restarts; nothing else is kept about a consumer's privacy.

The guard (`PrivacyGuard`):
- `admit(subject, plan)` at a request (a new handle): refused (`PrivacyBudgetExceeded`, 403)
  with the figures (budget, spent, remaining, needed, when it refills) when the remaining budget
  cannot pay what the handle needs: for a time window, every window it can emit in one period
  (one every `step` seconds of event time), so an admitted handle can keep its rate; for a
  tuple window, whose rate is the stream's, one window. A rate no budget can ever pay (a time
  window whose period's windows cost more than the whole budget) is refused as such.
- `deliverer(...)` wraps a private handle's delivery: each batch of windows is paid for (one
  transaction) before any of its rows is put into the buffer. What the remaining budget cannot
  pay is never put: the windows it can pay are delivered, then the handle ends (`ended`, reason
  `privacy budget spent: ...`, the rows already delivered still readable before it) and nothing
  is delivered after. Whatever the stream's rate, no consumer spends more than its budgets.
- What a window costs: its epsilon (`pep.core.privacy`). Rows of one time window (its keys'
  rows, emitted together) are paid once, parallel composition; every row of a tuple window is
  paid (a keyed tuple window's keys emit their windows at different times).
"""
from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple, NotRequired, TypedDict

from common.db import Database, Row, open_database, opening, upsert_sql
from common.migrations import Schema, Step, migrate
from pep.core.errors import NotPermitted
from pep.core.plan import AnyPlan, ExecutionPlan, WindowSpec
from pep.core.privacy import (
    MAX_PERIOD,
    Budget,
    PrivacySpec,
    budget_units,
    from_units,
    units,
    windows_per_period,
)
from pep.core.refs import handle_ref
from pep.core.rows import RowBatch

log = logging.getLogger(__name__)

# the ledger's versioned schema (`common.migrations`)
SCHEMA = Schema("privacy", (
    Step("what each consumer spent on each stream, per second",
         sqlite=("""CREATE TABLE IF NOT EXISTS spends (
    subject TEXT NOT NULL, stream TEXT NOT NULL, second INTEGER NOT NULL,
    units INTEGER NOT NULL, windows INTEGER NOT NULL, delta REAL NOT NULL,
    PRIMARY KEY (subject, stream, second))""",),
         postgresql=("""CREATE TABLE spends (
    subject TEXT NOT NULL, stream TEXT NOT NULL, second BIGINT NOT NULL,
    units BIGINT NOT NULL, windows BIGINT NOT NULL, delta DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (subject, stream, second))""",)),
))
_SPEND = upsert_sql("spends", ("subject", "stream", "second", "units", "windows", "delta"),
                    ("subject", "stream", "second"), add=("units", "windows", "delta"))
BUCKETS = 1024  # a budget's rolling period is kept in memory in at most this many buckets


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="seconds") \
        .replace("+00:00", "Z")


# A read of the ledger's table: (sql, parameters) -> its rows (the database's, or a transaction's).
ReadRows = Callable[[str, Sequence[object]], list[Row]]


class BudgetStateJson(TypedDict):
    """One budget as a consumer is shown it (explain, a refusal's figures): epsilon, spent and
    remaining in epsilon; with a window's cost, how many it can still afford and when enough
    refills for one."""

    epsilon: float
    period_seconds: int
    spent: float
    remaining: float
    windows_affordable: NotRequired[int]
    refills_at: NotRequired[str]
    next_refill_at: NotRequired[str]


class PrivacyStatus(TypedDict):
    """The consumer's budgets on a private window's stream, as explain shows them."""

    stream: str
    epsilon_per_window: float
    budgets: list[BudgetStateJson]
    windows_per_period: NotRequired[list[int | None]]
    admitted: bool
    rule: NotRequired[str]


@dataclass(frozen=True)
class BudgetState:
    """One budget of one consumer on one stream, now."""

    budget: Budget
    spent: int  # units spent in the rolling period
    spends: tuple[tuple[float, int], ...]  # (time, units) of those spends, oldest first

    @property
    def limit(self) -> int:
        return budget_units(self.budget.epsilon)

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.spent)

    def refills_at(self, needed: int) -> float | None:
        """When at least `needed` units will be free (None: never, or now)."""
        if needed > self.limit:
            return None
        free = self.remaining
        if free >= needed:
            return None
        for at, spent in self.spends:
            free += spent
            if free >= needed:
                return at + self.budget.period
        return None

    def to_json(self, per_window: int | None = None) -> BudgetStateJson:
        out: BudgetStateJson = {"epsilon": self.budget.epsilon,
                                "period_seconds": self.budget.period,
                                "spent": from_units(self.spent),
                                "remaining": from_units(self.remaining)}
        if per_window:
            out["windows_affordable"] = self.remaining // per_window
            refill = self.refills_at(per_window)
            if refill is not None:
                out["refills_at"] = iso(refill)
        if self.spends:
            out["next_refill_at"] = iso(self.spends[0][0] + self.budget.period)
        return out


class _Rolling:
    """One budget's spends of one consumer on one stream, in memory: buckets of
    `period / BUCKETS` seconds (at least one), each dated at its end, so a spend counts a
    little longer than its period, never shorter; and their running sum."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.width = max(1, budget.period // BUCKETS)
        self.buckets: deque[list[int]] = deque()  # [end time, units], oldest first
        self.total = 0

    def end_of(self, t: float) -> int:
        return -(-int(math.ceil(t)) // self.width) * self.width

    def add(self, t: float, spent: int) -> None:
        end = self.end_of(t)
        if self.buckets and self.buckets[-1][0] >= end:
            self.buckets[-1][1] += spent
        else:
            self.buckets.append([end, spent])
        self.total += spent

    def state(self, now: float) -> BudgetState:
        while self.buckets and self.buckets[0][0] <= now - self.budget.period:
            self.total -= self.buckets.popleft()[1]
        return BudgetState(self.budget, self.total,
                           tuple((float(e), int(u)) for e, u in self.buckets))


class PrivacyLedger:
    """What every consumer spent on every stream, persisted (see the module docstring).

    Every paying delivery is written to the store (one row per consumer, stream and second, the
    spends of a second added up, dated at the second's end) before its rows are delivered.
    Budgets are checked against running sums in memory (`_Rolling`), loaded from the database
    the first time a consumer's budget on a stream is asked about, so a delivery costs one
    small write whatever the period's length.

    `shared`: other gateway processes write the same ledger (`pep.cluster`: a stream moves
    between processes, and its consumers' spends with it), so no sum in memory can be trusted:
    a spend checks the budgets against the database's sums inside its own transaction, which
    holds the consumer's lock on that stream (PostgreSQL: an advisory lock) until it commits,
    and `states` reads the spends afresh."""

    def __init__(self, where: Database | str | Path,
                 clock: Callable[[], float] = time.time, shared: bool = False) -> None:
        self.shared = shared
        with opening("privacy ledger", str(where)):
            self._db = open_database(where, "privacy")
        try:
            with opening("privacy ledger", self._db.describe()):
                migrate(self._db, SCHEMA)
        except BaseException:
            self._db.close()
            raise
        self.clock = clock
        self._rolling: dict[tuple[str, str, Budget], _Rolling] = {}
        self._lock = threading.Lock()
        self._writes = 0
        self.prune()

    def close(self) -> None:
        self._db.close()

    def prune(self) -> int:
        """Forget spends older than the longest period a budget may have."""
        return self._db.execute("DELETE FROM spends WHERE second <= ?",
                                (int(self.clock()) - MAX_PERIOD,))

    def _window(self, subject: str, stream: str, budget: Budget, now: float) -> _Rolling:
        key = (subject, stream, budget)
        rolling = self._rolling.get(key)
        if rolling is None:
            rolling = _Rolling(budget)
            for second, spent in self._db.fetchall(
                    "SELECT second, units FROM spends WHERE subject = ? AND stream = ? AND "
                    "second > ? ORDER BY second",
                    (subject, stream, math.floor(now) - budget.period - rolling.width)):
                rolling.add(float(second), int(spent))
            self._rolling[key] = rolling
        return rolling

    def _read(self, read: ReadRows, subject: str, stream: str,
              budget: Budget, now: float) -> _Rolling:
        """A budget's spends as the database holds them now (`shared`)."""
        rolling = _Rolling(budget)
        for second, spent in read(
                "SELECT second, units FROM spends WHERE subject = ? AND stream = ? AND "
                "second > ? ORDER BY second",
                (subject, stream, math.floor(now) - budget.period - rolling.width)):
            rolling.add(float(second), int(spent))
        return rolling

    def states(self, subject: str, stream: str, budgets: tuple[Budget, ...],
               now: float | None = None) -> list[BudgetState]:
        now = self.clock() if now is None else now
        if self.shared:
            return [self._read(self._db.fetchall, subject, stream, b, now).state(now)
                    for b in budgets]
        with self._lock:
            return [self._window(subject, stream, b, now).state(now) for b in budgets]

    def spend(self, subject: str, stream: str, per_window: int, windows: int,
              budgets: tuple[Budget, ...], delta: float = 0.0, ref: str | None = None,
              now: float | None = None) -> tuple[int, list[BudgetState]]:
        """Pay for up to `windows` windows of `per_window` units each, as many as every budget
        allows, written to the database before this returns: (windows paid, the states before
        paying). `ref` (the handle's ref) is for callers' messages; it is not stored."""
        now = self.clock() if now is None else now
        if self.shared:
            return self._spend_shared(subject, stream, per_window, windows, budgets, delta, now)
        with self._lock:
            rolling = [self._window(subject, stream, b, now) for b in budgets]
            states = [r.state(now) for r in rolling]
            paid = min([windows] + [s.remaining // per_window for s in states])
            if paid > 0:
                second = int(math.ceil(now))
                self._db.execute(_SPEND, (subject, stream, second, per_window * paid, paid,
                                          delta * paid))
                for r in rolling:
                    r.add(second, per_window * paid)
                self._writes += 1
                if self._writes % 10_000 == 0:
                    self.prune()
        return paid, states


    def _spend_shared(self, subject: str, stream: str, per_window: int, windows: int,
                      budgets: tuple[Budget, ...], delta: float, now: float
                      ) -> tuple[int, list[BudgetState]]:
        """`spend` against the database's sums, in one transaction under the consumer's lock
        on the stream (the class docstring)."""
        with self._db.transaction() as cur:
            if self._db.dialect.name == "postgresql":
                cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 7))",
                            (f"{subject}\x1f{stream}",))

            def read(sql: str, params: Sequence[object]) -> list[Row]:
                rows: list[Row] = cur.execute(sql, params).fetchall()
                return rows

            # each budget's spent units, as `_Rolling` counts them (a second's bucket counts
            # while its end is inside the period), summed by the database
            states = []
            for b in budgets:
                width = max(1, b.period // BUCKETS)
                since = math.floor((now - b.period) / width) * width
                spent = cur.execute("SELECT COALESCE(SUM(units), 0) FROM spends WHERE"
                                    " subject = ? AND stream = ? AND second > ?",
                                    (subject, stream, since)).fetchone()[0]
                states.append(BudgetState(b, int(spent), ()))
            paid = min([windows] + [s.remaining // per_window for s in states])
            if paid < windows:  # the end's reason says when they refill: every spend is needed
                states = [self._read(read, subject, stream, b, now).state(now) for b in budgets]
            if paid > 0:
                cur.execute(_SPEND, (subject, stream, int(math.ceil(now)), per_window * paid,
                                     paid, delta * paid))
        return paid, states


class PrivacyBudgetExceeded(NotPermitted):
    """A private window's request that the consumer's remaining budget cannot pay (403)."""


class PrivateWindow(NamedTuple):
    """A differentially private window: the plan's window and its privacy."""

    window: WindowSpec
    privacy: PrivacySpec


def private_window(plan: AnyPlan) -> PrivateWindow | None:
    """The window of a single-stream plan, when it is differentially private. A union of grants
    never holds a private one (`pep.core.union` refuses it), nor does a join (refused when
    planned; `HandleService` checks a stored one's sides again)."""
    if not isinstance(plan, ExecutionPlan):  # a JoinPlan or a UnionPlan has no window
        return None
    window = plan.window
    if window is None or window.privacy is None:
        return None
    return PrivateWindow(window, window.privacy)


class PrivacyGuard:
    """Admission at request time and payment at every delivery (see the module docstring)."""

    def __init__(self, ledger: PrivacyLedger) -> None:
        self.ledger = ledger

    # -- at a request -------------------------------------------------------------------------
    def needs(self, private: PrivateWindow, budget: Budget) -> int:
        """Units a new handle must find free in one budget: a period of a time window's
        windows, or one tuple window."""
        window = private.window
        per_window = units(private.privacy.epsilon)
        rate = windows_per_period(window.kind, window.step, budget.period)
        return per_window * (rate if rate is not None else 1)

    def admit(self, subject: str, plan: AnyPlan) -> None:
        private = private_window(plan)
        if private is None:
            return
        window, privacy = private
        states = self.ledger.states(subject, plan.stream, privacy.budgets)
        for state in states:
            needed = self.needs(private, state.budget)
            if needed <= state.remaining:
                continue
            figures: dict[str, object] = {
                "stream": plan.stream, "budget": state.to_json(units(privacy.epsilon)),
                "needed": from_units(needed), "epsilon_per_window": privacy.epsilon}
            rate = windows_per_period(window.kind, window.step, state.budget.period)
            what = (f"{rate} windows of epsilon {privacy.epsilon:g} per "
                    f"{state.budget.period} s (one every {window.step} s)" if rate is not None
                    else f"one window of epsilon {privacy.epsilon:g}")
            if needed > state.limit:
                raise PrivacyBudgetExceeded(
                    f"privacy budget: this window spends {what}, more than the whole budget of "
                    f"{state.budget.text()} on stream {plan.stream!r}; ask for a larger step or "
                    "a smaller epsilon", **figures)
            refill = state.refills_at(needed)
            when = f"; it refills enough from {iso(refill)}" if refill is not None else ""
            if refill is not None:
                figures["refills_at"] = iso(refill)
            raise PrivacyBudgetExceeded(
                f"privacy budget: you have {from_units(state.remaining):g} of "
                f"{state.budget.text()} left on stream {plan.stream!r} (spent "
                f"{from_units(state.spent):g}), and this window needs {what}{when}", **figures)

    def status(self, subject: str, plan: AnyPlan) -> PrivacyStatus | None:
        """The consumer's budgets on the plan's stream, as explain shows them."""
        private = private_window(plan)
        if private is None:
            return None
        window, privacy = private
        per_window = units(privacy.epsilon)
        states = self.ledger.states(subject, plan.stream, privacy.budgets)
        budgets = [s.to_json(per_window) for s in states]
        rates = [windows_per_period(window.kind, window.step, s.budget.period) for s in states]
        out: PrivacyStatus
        if window.kind == "time":
            out = {"stream": plan.stream, "epsilon_per_window": privacy.epsilon,
                   "budgets": budgets, "windows_per_period": rates,
                   "admitted": all(self.needs(private, s.budget) <= s.remaining
                                   for s in states)}
        else:
            out = {"stream": plan.stream, "epsilon_per_window": privacy.epsilon,
                   "budgets": budgets,
                   "admitted": all(per_window <= s.remaining for s in states)}
            out["rule"] = ("a tuple window's rate is its stream's: each window is paid when it "
                           "is emitted, and the handle ends when the budget is spent")
        return out

    # -- at every delivery --------------------------------------------------------------------
    def deliverer(self, handle_id: str, subject: str, plan: AnyPlan,
                  put: Callable[[RowBatch], bool], end: Callable[[str], None]
                  ) -> Callable[[RowBatch | Iterable[Mapping[str, object]]], bool]:
        """`put` wrapped: every batch is paid for first; what cannot be paid is not put, the
        handle is ended through `end(reason)` (called once, from another thread: it must not
        wait for this delivery) and every later delivery is refused. `plan` holds a private
        window (`private_window`)."""
        private = private_window(plan)
        assert private is not None
        window, spec = private
        per_window = units(spec.epsilon)
        grouped = window.kind == "time" and bool(window.keys)
        ref = handle_ref(handle_id)
        spent = [False]

        def deliver(rows: RowBatch | Iterable[Mapping[str, object]]) -> bool:
            if spent[0]:
                return False
            batch = rows if isinstance(rows, RowBatch) else RowBatch.of(rows)
            starts = _units_of(batch, grouped)
            if not starts:
                return put(batch)
            paid, states = self.ledger.spend(subject, plan.stream, per_window, len(starts),
                                             spec.budgets, spec.delta, ref)
            if paid == len(starts):
                return put(batch)
            spent[0] = True
            if paid:  # the windows paid for, and not a row more
                put(RowBatch.of_texts(batch.rows[:starts[paid]], batch.last_position))
            end(_spent_reason(plan.stream, spec.epsilon, states, per_window, paid))
            return False  # this handle takes nothing more

        return deliver


def _units_of(batch: RowBatch, grouped: bool) -> list[int]:
    """The row index where each paid unit starts: every row, or (keyed time windows: rows of
    one window come together) every change of window_start."""
    if not grouped:
        return list(range(len(batch.rows)))
    starts, last = [], object()
    for i, text in enumerate(batch.rows):
        start = json.loads(text).get("window_start")
        if start != last:
            starts.append(i)
            last = start
    return starts


def _spent_reason(stream: str, epsilon: float, states: list[BudgetState], per_window: int,
                  paid: int) -> str:
    short = [s for s in states if s.remaining // per_window <= paid] or states
    parts = []
    for s in short:
        refill = s.refills_at(per_window + per_window * paid)
        if refill is None and per_window <= s.limit:  # only this delivery's spend frees it
            refill = time.time() + s.budget.period
        parts.append(f"{s.budget.text()} on stream {stream!r}"
                     + (f", refills from {iso(refill)}" if refill is not None else ""))
    return (f"privacy budget spent: {'; '.join(parts)} (each window costs epsilon "
            f"{epsilon:g})")


__all__ = ["PrivacyLedger", "PrivacyGuard", "PrivacyBudgetExceeded", "BudgetState",
           "BudgetStateJson", "PrivacyStatus", "PrivateWindow", "private_window"]
