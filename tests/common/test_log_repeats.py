"""Repeated warnings are written once, then summed up per period (`common.log_repeats`, issue 42:
477 of 752 log lines in ten minutes were the same "falling behind" warning)."""
from __future__ import annotations

import logging
import re
import threading
import time

import pytest

from common.log_repeats import RepeatSummary, repeating

LABEL = "stream weather is falling behind"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(message: str = "stream weather is falling behind: micro-batch 7 took 0.4 s",
           label: str | None = LABEL, value: float | None = None,
           level: int = logging.WARNING) -> logging.LogRecord:
    rec = logging.LogRecord("pep.runtime.lateness", level, __file__, 1, message, None, None)
    if label is not None:
        rec.__dict__.update(repeating(label, value))
    return rec


@pytest.fixture
def summed():
    clock, out = Clock(), []
    return RepeatSummary(out.append, period=60.0, clock=clock, timers=False), clock, out


def test_a_flood_is_one_line_then_one_summary_per_period_with_the_count_and_the_worst(summed):
    summary, clock, out = summed
    let_through = []
    for i in range(37):
        let_through.append(summary.filter(record(value=[0.4, 2.1, 0.3][i % 3])))
        clock.now += 1.5
    assert let_through == [True] + [False] * 36  # the first in full, the rest held back
    summary.due()
    assert out == []  # 55.5 s: the period is not over
    clock.now = 1060.0
    summary.due()
    assert [r.getMessage() for r in out] == [f"{LABEL}: 37 times in the last 60 s, worst 2.1 s"]
    assert out[0].levelno == logging.WARNING and out[0].name == "pep.runtime.lateness"
    assert not hasattr(out[0], "xsg_repeat")  # a summary is not held back in turn

    # it goes on: every record of the next period is held back and counted
    for _ in range(5):
        clock.now += 2.0
        assert summary.filter(record(value=0.5)) is False
    clock.now = 1120.0
    summary.due()
    assert out[-1].getMessage() == f"{LABEL}: 5 times in the last 60 s, worst 0.5 s"

    # a quiet period ends it silently; the next record is written in full again
    clock.now = 1180.0
    summary.due()
    assert len(out) == 2
    assert summary.filter(record()) is True


def test_a_single_occurrence_is_written_once_and_never_summed_up(summed):
    summary, clock, out = summed
    assert summary.filter(record()) is True
    clock.now += 61
    summary.due()
    assert out == []
    assert summary.filter(record()) is True


def test_labels_are_counted_apart_and_unlabelled_records_pass(summed):
    summary, clock, out = summed
    other = "stream ais is falling behind"
    assert summary.filter(record(label=LABEL)) and summary.filter(record(label=other))
    assert not summary.filter(record(label=LABEL, value=1.0))
    assert all(summary.filter(record(label=None)) for _ in range(10))  # not marked: untouched
    clock.now += 60
    summary.due()
    assert [r.getMessage() for r in out] == [f"{LABEL}: 2 times in the last 60 s, worst 1.0 s"]


def test_flush_writes_what_is_held_back_without_waiting(summed):
    summary, clock, out = summed
    for _ in range(3):
        summary.filter(record(level=logging.ERROR))
    clock.now += 12
    summary.flush()
    assert [(r.levelno, r.getMessage()) for r in out] == [
        (logging.ERROR, f"{LABEL}: 3 times in the last 12 s")]  # no values: no worst


def test_a_timer_ends_the_period_when_no_record_follows():
    out, done = [], threading.Event()

    def emit(rec: logging.LogRecord) -> None:
        out.append(rec)
        done.set()
    summary = RepeatSummary(emit, period=0.2)
    try:
        for _ in range(4):
            summary.filter(record(value=0.3))
        assert done.wait(5)
        assert re.fullmatch(rf"{LABEL}: 4 times in the last \d+\.\d s, worst 0\.3 s",
                            out[0].getMessage()), out[0].getMessage()
        time.sleep(0.5)  # a quiet period: no more lines
        assert len(out) == 1
    finally:
        summary.close()


def test_the_period_must_be_positive():
    with pytest.raises(ValueError):
        RepeatSummary(lambda r: None, period=0)
