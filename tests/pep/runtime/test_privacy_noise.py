"""The noise of differentially private windows follows its mechanism (no Spark: the driver's
share of the runtime's path, pane partials -> `PaneWindows` -> `noise.release` -> JSON).

Each test draws many windows through the same code the runtime runs after Spark's panes job,
and compares the released values with the mechanism's distribution around the true value by
the Dvoretzky-Kiefer-Wolfowitz inequality (Massart's constant): for n samples of any
distribution, P(sup |F_n - F| > t) <= 2 exp(-2 n t^2). With t chosen so that this is 1e-6, a
correct mechanism fails a test less than once in a million runs, whatever the distribution
(continuous or discrete); a wrong scale (twice the noise, or half) or a shifted centre is far
beyond t at these sample sizes.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pep.core.plan import Aggregate, ExecutionPlan, WindowSpec
from pep.core.privacy import Bound, Budget, PrivacySpec
from pep.core.schemas import WEATHER_SCHEMA
from pep.runtime.plans.compile import compile_plan
from pep.runtime.windows.noise import mechanism_of
from pep.runtime.windows.pane_partials import NO_SEQ, empty_partials
from pep.runtime.windows.pane_windows import PaneWindows

N = 20_000
FAILURE = 1e-6
T_DKW = math.sqrt(math.log(2 / FAILURE) / (2 * N))
# A wrong distribution must be told apart: each one tested below lies at least 0.09 (sup of the
# CDFs' difference) from the mechanism's, and the empirical CDF lies within T_DKW of the true one
# but for a chance of FAILURE, so its distance to the wrong one exceeds 0.09 - T_DKW (about 0.07)
# just as surely. (5 x T_DKW = 0.095 was above the Gaussian case's 0.097 less the noise: flaky.)
REJECT = 2 * T_DKW


def private_window(aggregates, epsilon=1.0, delta=0.0, size=1, step=1,
                   bounds=(Bound("rainrate", 0.0, 50.0),)):
    spec = PrivacySpec(epsilon, delta, tuple(bounds), (Budget(1e6, 60),))
    plan = ExecutionPlan("weather", None, (), WindowSpec(
        "tuple", size, step, tuple(Aggregate("rainrate", f) for f in aggregates),
        privacy=spec))
    return compile_plan(plan, WEATHER_SCHEMA).window


def release_many(window, value: float | None, n: int = N) -> list[dict]:
    """n windows of one tuple each (size 1), all holding `value`, as Spark's panes job would
    hand them to the driver (pane partials), through PaneWindows: the released rows."""
    state = PaneWindows(window)
    cols = empty_partials(state.layout)
    parts = {name: np.zeros(n, dtype=col.dtype) for name, col in cols.items()}
    parts["key"] = np.full(n, "", dtype=object)
    parts["pane"] = np.arange(n, dtype=np.int64)
    parts["rows"] = np.ones(n, dtype=np.int64)
    parts["mseq"] = np.full(n, NO_SEQ, dtype=np.int64)
    present = value is not None
    parts["c0"] = np.full(n, 1 if present else 0, dtype=np.int64)
    if "s0" in parts:
        parts["s0"] = np.full(n, value if present else 0.0, dtype=np.float64)
    out = state.add(parts)
    assert len(out) == n
    return [json.loads(t) for t in out.texts]


def dkw(samples: np.ndarray, cdf, points: np.ndarray) -> float:
    """sup |F_n - F| evaluated at `points` (the sample values, or a discrete support)."""
    ordered = np.sort(samples)
    empirical = np.searchsorted(ordered, points, side="right") / len(samples)
    return float(np.max(np.abs(empirical - cdf(points))))


def laplace_cdf(mu: float, b: float):
    def cdf(x: np.ndarray) -> np.ndarray:
        z = (x - mu) / b
        return np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0)), 1 - 0.5 * np.exp(-np.maximum(z, 0)))
    return cdf


def discrete_laplace_cdf(mu: int, b: float):
    a = math.exp(-1 / b)

    def cdf(k: np.ndarray) -> np.ndarray:
        d = np.floor(k) - mu
        return np.where(d < 0, a ** (-d) / (1 + a), 1 - a ** (d + 1) / (1 + a))
    return cdf


def discrete_gaussian_cdf(mu: int, sigma: float):
    span = int(60 * sigma) + 10
    support = np.arange(-span, span + 1)
    mass = np.exp(-support.astype(float) ** 2 / (2 * sigma ** 2))
    cum = np.cumsum(mass / mass.sum())

    def cdf(k: np.ndarray) -> np.ndarray:
        at = np.clip(np.floor(k).astype(int) - mu + span, -1, len(cum) - 1)
        return np.where(at < 0, 0.0, cum[np.maximum(at, 0)])
    return cdf


def test_noisy_sums_follow_the_laplace_mechanism_around_the_true_sum():
    window = private_window(("sum",), epsilon=0.5)
    q = window.noise[0]
    assert (q.kind, q.sensitivity, q.epsilon) == ("sum", 50.0, 0.5)
    scale = mechanism_of(q).scale
    assert scale == pytest.approx(50.0 / 0.5, rel=1e-6)  # OpenDP's calibration: 100
    sums = np.array([r["sum_rainrate"] for r in release_many(window, 12.5)])
    assert dkw(sums, laplace_cdf(12.5, scale), sums) < T_DKW
    # the test can fail: the same samples are far from twice or half the noise, or shifted
    assert dkw(sums, laplace_cdf(12.5, 2 * scale), sums) > REJECT
    assert dkw(sums, laplace_cdf(12.5, scale / 2), sums) > REJECT
    assert dkw(sums, laplace_cdf(12.5 + scale / 4, scale), sums) > REJECT


def test_noisy_counts_follow_the_discrete_laplace_mechanism():
    window = private_window(("count", "sum"), epsilon=1.0)  # two quantities: 0.5 each
    count_q = next(q for q in window.noise if q.kind == "count")
    assert (count_q.sensitivity, count_q.epsilon, count_q.integer) == (1.0, 0.5, True)
    scale = mechanism_of(count_q).scale
    assert scale == pytest.approx(2.0, rel=1e-6)
    rows = release_many(window, 30.0)
    counts = np.array([r["count_rainrate"] for r in rows])
    assert counts.dtype.kind == "i"  # integer noise on an integer count
    support = np.arange(counts.min() - 1, counts.max() + 1)
    assert dkw(counts, discrete_laplace_cdf(1, scale), support) < T_DKW
    assert dkw(counts, discrete_laplace_cdf(1, 2 * scale), support) > REJECT
    assert dkw(counts, discrete_laplace_cdf(3, scale), support) > REJECT


def test_with_delta_counts_follow_the_discrete_gaussian():
    window = private_window(("count",), epsilon=1.0, delta=1e-6)
    q = window.noise[0]
    mech = mechanism_of(q)
    assert mech.epsilon <= 1.0 and mech.delta <= 1e-6  # OpenDP's map certifies the share
    counts = np.array([r["count_rainrate"] for r in release_many(window, 3.0)])
    support = np.arange(counts.min() - 1, counts.max() + 1)
    assert dkw(counts, discrete_gaussian_cdf(1, mech.scale), support) < T_DKW
    assert dkw(counts, discrete_gaussian_cdf(1, 1.5 * mech.scale), support) > REJECT


def test_avg_is_the_noisy_sum_over_the_noisy_count_within_the_bounds():
    window = private_window(("avg",), epsilon=2.0)
    rows = release_many(window, 10.0, n=2_000)
    avgs = [r["avg_rainrate"] for r in rows]
    present = [a for a in avgs if a is not None]
    assert present and all(0.0 <= a <= 50.0 for a in present)
    assert len(set(present)) > 100  # noisy, not the exact 10.0 over and over
    # null only where the noisy count is under 1 (about half the time for a true count of 1
    # and a Laplace scale of 1 on the count): never decided by the exact count
    assert 0.2 < avgs.count(None) / len(avgs) < 0.6


def test_a_window_without_values_still_releases_a_noisy_sum():
    """Masking the sum by the exact count (null where no value) would tell which windows held
    nothing; the released sum is noise around 0 there."""
    window = private_window(("sum", "count"), epsilon=1.0)
    rows = release_many(window, None, n=500)
    assert all(r["sum_rainrate"] is not None for r in rows)
    assert len({r["count_rainrate"] for r in rows}) > 3


def test_no_exact_aggregate_is_ever_encoded():
    window = private_window(("sum", "count", "avg"), epsilon=1.0, size=4, step=2)
    state = PaneWindows(window)
    layout = state.layout
    assert layout.width == 2
    n = 200
    cols = empty_partials(layout)
    parts = {name: np.zeros(n, dtype=col.dtype) for name, col in cols.items()}
    parts.update(key=np.full(n, "", dtype=object), pane=np.arange(n, dtype=np.int64),
                 rows=np.full(n, 2, dtype=np.int64), mseq=np.full(n, NO_SEQ, dtype=np.int64),
                 c0=np.full(n, 2, dtype=np.int64), s0=np.full(n, 7.25, dtype=np.float64))
    rows = [json.loads(t) for t in state.add(parts).texts]
    assert len(rows) == n - 1
    assert not any(r["sum_rainrate"] == 29.0 or r["count_rainrate"] == 4
                   and r["avg_rainrate"] == 7.25 for r in rows)
    assert sum(r["count_rainrate"] == 4 for r in rows) < len(rows)  # counts are noisy too
