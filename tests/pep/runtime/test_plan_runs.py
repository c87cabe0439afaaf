"""Each plan's run of (plan, row) pairs in a routed batch (`router.plan_runs`)."""
from __future__ import annotations

import numpy as np

from pep.runtime.query.router import plan_runs


def test_each_plans_run_is_its_bounds():
    assert plan_runs(np.array([3, 3, 5, 9, 9, 9])) == {3: (0, 2), 5: (2, 3), 9: (3, 6)}


def test_a_batch_whose_every_pair_the_shield_hid_has_no_run():
    """CI once: a punctuated stream's batch hidden from every plan raised in the router
    (zip of no start with one end), the batch's routing failed and its readers were told
    `stalled` (tests/e2e/test_punctuations.py)."""
    assert plan_runs(np.empty(0, np.int64)) == {}
