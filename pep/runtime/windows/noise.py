"""Noise for differentially private windows, from OpenDP's mechanisms (no Spark here).

A private window (`pep.core.privacy`) releases, per window row, a few noisy quantities: counts
of non-null values and sums of values that Spark clamped into the policy's bounds before
aggregating (`pep/runtime/plans/clamp.py`). This module adds the noise, per emitted window on the
driver, before the row is encoded (`windows.PaneWindows._output` calls `release`): the exact
aggregates never reach a `RowBatch`, a handle's buffer, a log line, the audit trail or a metric.

Every sample comes from OpenDP's samplers, which draw from exact discrete distributions with
a cryptographic source of randomness and are safe against the floating-point attacks on naive
Laplace samplers (Mironov 2012); Python's `random` and numpy's generators are never used.
- delta = 0: `make_laplace`. On integers (counts, sums of long attributes) it is the discrete
  Laplace (geometric) mechanism; on doubles, OpenDP's Laplace, which samples a discrete Laplace
  on a fine grid.
- delta > 0: `make_gaussian` (the discrete Gaussian on integers), calibrated through
  zero-concentrated DP and converted to (epsilon, delta) with `make_zCDP_to_approxDP` and
  `make_fix_delta`.
The scale of each quantity is found by `dp.binary_search_param` against OpenDP's own privacy
map, so the map, not our arithmetic, certifies that a quantity costs at most its share of the
window's epsilon (and delta); the release is one vector measurement per quantity per batch
(independent noise per window row, each row a distinct window or key).

OpenDP puts these constructors behind its "contrib" feature flag (code not yet vetted by its
own review process); enabling it is what every OpenDP program that uses them does.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import opendp.prelude as dp
import pyarrow as pa

from pep.core.privacy import PrivacySpec, Quantity
from pep.runtime.windows.pane_partials import Part

dp.enable_features("contrib")


@dataclass(frozen=True)
class Mechanism:
    """A calibrated mechanism: its scale, what OpenDP's map says it costs at the quantity's
    sensitivity, and the vector measurement that draws the noise."""

    scale: float
    epsilon: float
    delta: float
    sample: Callable[[list[Any]], list[Any]]


def _spaces(integer: bool) -> tuple[Any, Any, str]:
    kind = "i64" if integer else "f64"
    atom = dp.atom_domain(T=kind) if integer else dp.atom_domain(T=kind, nan=False)
    return atom, dp.absolute_distance(T=kind), kind


@functools.lru_cache(maxsize=1024)
def mechanism(integer: bool, sensitivity: float, epsilon: float, delta: float) -> Mechanism:
    """The mechanism of one noisy quantity (cached: calibrating a Gaussian takes ~0.5 s)."""
    atom, metric, kind = _spaces(integer)
    d_in: Any = int(sensitivity) if integer else float(sensitivity)
    if delta == 0:
        def make(scale: float) -> Any:
            return dp.m.make_laplace(atom, metric, scale=scale)
        scale = dp.binary_search_param(make, d_in=d_in, d_out=epsilon)
        spent_e, spent_d = float(make(scale).map(d_in)), 0.0
        vector = dp.m.make_laplace(dp.vector_domain(atom), dp.l1_distance(T=kind), scale=scale)
    else:
        def make(scale: float) -> Any:
            return dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(
                dp.m.make_gaussian(atom, metric, scale=scale)), delta)
        scale = dp.binary_search_param(make, d_in=d_in, d_out=(epsilon, delta))
        spent_e, spent_d = (float(v) for v in make(scale).map(d_in))
        vector = dp.m.make_gaussian(dp.vector_domain(atom), dp.l2_distance(T=kind),
                                    scale=scale)
    if spent_e > epsilon or spent_d > delta:  # binary_search_param promises otherwise
        raise RuntimeError("OpenDP calibrated a mechanism over its privacy share")
    return Mechanism(float(scale), spent_e, spent_d, vector)


def mechanism_of(q: Quantity) -> Mechanism:
    return mechanism(q.integer, q.sensitivity, q.epsilon, q.delta)


def noisy(q: Quantity, exact: np.ndarray) -> np.ndarray:
    """The quantity's exact values (one per window row) with independent noise each."""
    if not len(exact):
        return np.empty(0, np.int64 if q.integer else np.float64)
    mech = mechanism_of(q)
    if q.integer:
        return np.array(mech.sample([int(v) for v in exact.tolist()]), dtype=np.int64)
    return np.array(mech.sample([float(v) for v in exact.tolist()]), dtype=np.float64)


def release(window: Any, emitted: Any, order: np.ndarray) -> list[tuple[str, pa.Array, bool]]:
    """The aggregate columns of a private window's emitted rows (`windows.Emitted`, in output
    `order`), as `PaneWindows._output` encodes them: every count and sum noisy, every avg the
    noisy sum over the noisy count (null when that count is under 1), clamped into the bounds.
    A noisy sum is released even where the exact count is 0: masking it by the exact count
    would tell which windows held no value."""
    spec: PrivacySpec = window.privacy
    slot = {a: j for j, (a, _) in enumerate(window.attributes)}
    types = dict(window.attributes)
    released: dict[tuple[str, str], np.ndarray] = {}
    for q in window.noise:
        j = slot[q.attribute]
        exact = emitted.values[f"{Part.COUNT if q.kind == 'count' else Part.SUM}{j}"][order]
        released[(q.kind, q.attribute)] = noisy(q, exact)
    columns: list[tuple[str, pa.Array, bool]] = []
    for attr, function, name in window.aggregates:
        if function == "count":
            columns.append((name, pa.array(released[("count", attr)], pa.int64()), False))
        elif function == "sum":
            total = released[("sum", attr)]
            columns.append((name, pa.array(total, pa.int64() if types[attr] == "long"
                                           else pa.float64()), False))
        elif function == "avg":
            total = released[("sum", attr)].astype(np.float64)
            count = released[("count", attr)].astype(np.float64)
            bound = spec.bound(attr)
            assert bound is not None  # compile checked it
            with np.errstate(invalid="ignore", divide="ignore"):
                avg = np.clip(total / np.maximum(count, 1.0), float(bound.lower),
                              float(bound.upper))
            columns.append((name, pa.array(avg, pa.float64(), mask=count < 1), False))
        else:  # compile refuses these under privacy; never release an exact one
            raise ValueError(f"{function} has no differentially private release")
    return columns


__all__ = ["Mechanism", "mechanism", "mechanism_of", "noisy", "release"]
