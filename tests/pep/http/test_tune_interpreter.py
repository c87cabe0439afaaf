"""`xsg serve` tunes the interpreter once started: the collector's thresholds and the switch
interval (`pep.http.serving`)."""
from __future__ import annotations

import gc
import sys

from pep.http.serving import GC_THRESHOLDS, SWITCH_INTERVAL, tune_interpreter


def test_tune_interpreter_sets_the_thresholds_and_the_switch_interval():
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    try:
        tune_interpreter(freeze=False)
        assert gc.get_threshold() == GC_THRESHOLDS
        assert abs(sys.getswitchinterval() - SWITCH_INTERVAL) < 1e-9
        assert SWITCH_INTERVAL < 0.005  # shorter than Python's own
    finally:
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)
