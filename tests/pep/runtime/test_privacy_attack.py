"""The eXACML+ paper's Example 2 against exact and against differentially private windows.

A policy allows sums over tuple windows of 3 tuples advancing by 2. Windows of 3, 4 and 5
tuples over the same tuples (asked one after another by one identity, or at once by several)
give S4 - S3 = a[2k+3] and S5 - S4 = a[2k+4]: the whole stream from its fourth tuple. xsg's
one-window rule already keeps one identity's successive windows off the same tuples; here the
windows are aligned on purpose, the worst case (several identities at once). Without noise the
attack rebuilds every value exactly; with the policy's noise (epsilon 0.5 per window, values in
[0, 10]: Laplace of scale 20 on every sum) no value comes out within the noise. Windows go
through the driver's path of the runtime (pane partials -> PaneWindows -> noise -> JSON).
"""
from __future__ import annotations

from pep.core.plan import Aggregate, ExecutionPlan, WindowSpec
from pep.core.privacy import Bound, Budget, PrivacySpec
from pep.core.schemas import WEATHER_SCHEMA
from pep.runtime.plans.compile import compile_plan
from pep.runtime.windows.window_reference import TupleWindows

N = 400
VALUES = [float((7 * i + i // 5) % 11) for i in range(N)]  # integers 0..10
SPEC = PrivacySpec(0.5, 0.0, (Bound("rainrate", 0.0, 10.0),), (Budget(1e6, 86400),))


def sums(size: int, privacy: PrivacySpec | None) -> list[float]:
    plan = ExecutionPlan("weather", None, (), WindowSpec(
        "tuple", size, 2, (Aggregate("rainrate", "sum"),), privacy=privacy))
    windows = TupleWindows(compile_plan(plan, WEATHER_SCHEMA).window)
    rows = [{"rainrate": v} for v in VALUES]
    out = []
    for start in range(0, N, 37):  # several micro-batches
        out += [w["sum_rainrate"] for w in windows.add(rows[start:start + 37])]
    return out


def attack(s3: list[float], s4: list[float], s5: list[float]) -> dict[int, float]:
    rebuilt = {}
    for k in range(min(len(s3), len(s4), len(s5))):
        rebuilt[2 * k + 3] = s4[k] - s3[k]
        rebuilt[2 * k + 4] = s5[k] - s4[k]
    return rebuilt


def test_exact_windows_of_3_4_and_5_rebuild_the_stream():
    rebuilt = attack(sums(3, None), sums(4, None), sums(5, None))
    assert len(rebuilt) > 350
    assert all(abs(v - VALUES[i]) < 1e-9 for i, v in rebuilt.items())


def test_private_windows_of_3_4_and_5_rebuild_nothing():
    """Each rebuilt value is the truth plus the difference of two Laplace(20) draws: within
    0.5 of it with probability 1/80, so about 5 of 396 by chance; 40 or more happens with
    probability far under one in a million (binomial tail). Their mean error is about 30."""
    rebuilt = attack(sums(3, SPEC), sums(4, SPEC), sums(5, SPEC))
    errors = [abs(v - VALUES[i]) for i, v in rebuilt.items()]
    assert len(errors) > 350
    assert sum(e < 0.5 for e in errors) < 40
    assert sum(errors) / len(errors) > 15
    # two runs averaged (twice the privacy loss, which the budget counts): still nothing
    again = attack(sums(3, SPEC), sums(4, SPEC), sums(5, SPEC))
    mean = {i: (v + again[i]) / 2 for i, v in rebuilt.items()}
    assert sum(abs(v - VALUES[i]) < 0.5 for i, v in mean.items()) < 40
