"""Differentially private windows in the pure core: the obligation's attributes, the merge of
several policies and of the consumer's query, what a window costs, and the plan's JSON."""
from __future__ import annotations

import pytest

from pep.core.explain import plan_to_json, render_sql
from pep.core.graph import WEATHER_SCHEMA
from pep.core.merge import QueryInvalid, QueryRefused, merge
from pep.core.obligations import ObligationError, policy_graph
from pep.core.plan import plan_from_json
from pep.core.privacy import (
    Bound,
    Budget,
    PrivacySpec,
    budget_units,
    quantities,
    units,
    windows_per_period,
)
from pep.core.userquery import UserQueryError, parse_user_query, user_graph
from tests.pep.core.helpers import ob

WINDOW = "exacml:obligation:stream-window"
TYPES = {f.name: f.type for f in WEATHER_SCHEMA.fields}


def dp_window(*extra: tuple[str, str], epsilon: str = "0.5", budget: str = "10/86400",
              kind: str = "tuple", size: str = "3", step: str = "2",
              attrs: tuple[str, ...] = ("rainrate:sum", "rainrate:avg", "rainrate:count"),
              bounds: tuple[str, ...] = ("rainrate:0:50",)):
    pairs = [("stream-window-type-id", kind), ("stream-window-size-id", size),
             ("stream-window-step-id", step)]
    pairs += [("stream-window-attr-id", a) for a in attrs]
    if epsilon is not None:
        pairs.append(("stream-window-dp-epsilon-id", epsilon))
    if budget is not None:
        pairs.append(("stream-window-dp-budget-id", budget))
    pairs += [("stream-window-dp-bounds-id", b) for b in bounds]
    pairs += list(extra)
    return ob(WINDOW, *pairs, prefix="exacml:obligation:")


def graph(*obligations):
    return policy_graph(obligations, "weather", WEATHER_SCHEMA)


def test_a_private_window_carries_its_parameters_into_the_plan():
    g = graph(dp_window(("stream-window-dp-delta-id", "1e-6"),
                        ("stream-window-dp-budget-id", "0.5/3600")))
    spec = g.window.spec.privacy
    assert spec == PrivacySpec(0.5, 1e-6, (Bound("rainrate", 0.0, 50.0),),
                               (Budget(0.5, 3600), Budget(10.0, 86400)))
    plan = merge(g, None, WEATHER_SCHEMA).plan
    assert plan.window.privacy == spec
    again = plan_from_json(plan.canonical_json())
    assert again == plan and again.key() == plan.key()
    shown = plan_to_json(plan)["window"]["privacy"]
    assert shown["epsilon_per_window"] == 0.5 and shown["mechanism"] == "gaussian"
    assert [q["quantity"] for q in shown["quantities"]] == ["count(rainrate)", "sum(rainrate)"]
    assert "DIFFERENTIALLY PRIVATE" in render_sql(plan, WEATHER_SCHEMA)


def test_a_window_without_privacy_keeps_its_plan_key():
    exact = graph(dp_window(epsilon=None, budget=None, bounds=()))
    plan = merge(exact, None, WEATHER_SCHEMA).plan
    assert plan.window.privacy is None
    assert "privacy" not in plan.canonical_json()
    assert "privacy" not in plan_to_json(plan)["window"]


@pytest.mark.parametrize("extra, words", [
    ((("stream-window-dp-epsilon-id", "0"),), "at least"),
    ((("stream-window-dp-epsilon-id", "-1"),), "epsilon"),
    ((("stream-window-dp-epsilon-id", "nan"),), "epsilon"),
    ((("stream-window-dp-epsilon-id", "1e3"),), "epsilon"),
    ((("stream-window-dp-epsilon-id", "1"), ("stream-window-dp-epsilon-id", "1")),
     "exactly one"),
    ((("stream-window-dp-delta-id", "0.5"),), "delta"),
    ((("stream-window-dp-delta-id", "1e-6"), ("stream-window-dp-delta-id", "0")),
     "more than one"),
    ((("stream-window-dp-bounds-id", "rainrate:10"),), "attribute:lower:upper"),
    ((("stream-window-dp-bounds-id", "nosuch:0:1"),), "unknown attribute"),
    ((("stream-window-dp-bounds-id", "samplingtime:0:1"),), "numeric"),
    ((("stream-window-dp-bounds-id", "windspeed:5:1"),), "above the upper"),
    ((("stream-window-dp-bounds-id", "rainrate:0:9"),), "twice"),
    ((("stream-window-dp-budget-id", "1"),), "epsilon/seconds"),
    ((("stream-window-dp-budget-id", "1/0"),), "budget period"),
    ((("stream-window-dp-budget-id", "0.1/60"),), "cannot pay for one window"),
    ((("stream-window-dp-frobnicate-id", "1"),), "does not understand"),
])
def test_bad_privacy_attributes_deny(extra, words):
    own = any(name == "stream-window-dp-epsilon-id" for name, _ in extra)
    with pytest.raises(ObligationError) as exc:
        graph(dp_window(*extra, epsilon=None if own else "0.5"))
    assert words in exc.value.message


def test_a_private_window_needs_epsilon_budget_and_bounds_for_sums():
    with pytest.raises(ObligationError, match="exactly one stream-window-dp-epsilon-id"):
        graph(dp_window(epsilon=None))
    with pytest.raises(ObligationError, match="needs a stream-window-dp-budget-id"):
        graph(dp_window(budget=None))
    with pytest.raises(ObligationError, match="needs clamping bounds"):
        graph(dp_window(bounds=()))
    # a count needs no bounds
    assert graph(dp_window(bounds=(), attrs=("rainrate:count",))).window.spec.privacy.bounds == ()


def test_several_policies_take_the_strictest():
    a = dp_window(epsilon="0.5", budget="10/86400", bounds=("rainrate:0:50",))
    b = dp_window(epsilon="0.2", budget="1/3600", bounds=("rainrate:5:80",))
    spec = graph(a, b).window.spec.privacy
    assert spec.epsilon == 0.2
    assert spec.bounds == (Bound("rainrate", 5.0, 50.0),)
    assert spec.budgets == (Budget(1.0, 3600), Budget(10.0, 86400))
    # a private and an exact window: private
    exact = dp_window(epsilon=None, budget=None, bounds=())
    assert graph(exact, a).window.spec.privacy.epsilon == 0.5
    with pytest.raises(ObligationError, match="do not meet"):
        graph(a, dp_window(bounds=("rainrate:60:70",)))


def user(text: str):
    return user_graph(parse_user_query(text), "weather", WEATHER_SCHEMA)


def test_a_consumer_may_ask_for_less_privacy_loss_never_more():
    policy = graph(dp_window())
    plan = merge(policy, user('{"window": {"type": "tuple", "size": 3, "step": 2, '
                              '"epsilon": 0.1}}'), WEATHER_SCHEMA).plan
    assert plan.window.privacy.epsilon == 0.1
    with pytest.raises(QueryRefused, match="at most 0.5"):
        merge(policy, user('{"window": {"type": "tuple", "size": 3, "step": 2, '
                           '"epsilon": 2}}'), WEATHER_SCHEMA)
    with pytest.raises(QueryRefused, match="delta"):
        merge(policy, user('{"window": {"type": "tuple", "size": 3, "step": 2, '
                           '"delta": 1e-9}}'), WEATHER_SCHEMA)
    xml = ("<UserQuery><Aggregation><WindowType>tuple</WindowType><WindowSize>4</WindowSize>"
           "<WindowStep>2</WindowStep><Epsilon>0.25</Epsilon></Aggregation></UserQuery>")
    assert merge(policy, user(xml), WEATHER_SCHEMA).plan.window.privacy.epsilon == 0.25
    with pytest.raises(UserQueryError):
        parse_user_query('{"window": {"type": "tuple", "size": 3, "step": 2, "epsilon": "x"}}')
    with pytest.raises(UserQueryError):
        parse_user_query('{"window": {"type": "tuple", "size": 3, "step": 2, "epsilon": 0}}')


def test_epsilon_under_an_exact_window_is_invalid():
    exact = graph(dp_window(epsilon=None, budget=None, bounds=()))
    with pytest.raises(QueryInvalid, match="not differentially private"):
        merge(exact, user('{"window": {"type": "tuple", "size": 3, "step": 2, '
                          '"epsilon": 0.1}}'), WEATHER_SCHEMA)


def test_min_and_max_are_withheld_from_a_private_window_and_refused_when_asked():
    policy = graph(dp_window(attrs=("rainrate:avg", "rainrate:max", "windspeed:min")))
    result = merge(policy, None, WEATHER_SCHEMA)
    assert [a.function for a in result.plan.window.aggregates] == ["avg"]
    assert any("max(rainrate)" in w.message for w in result.warnings)
    with pytest.raises(QueryRefused, match=r"max\(rainrate\)") as exc:
        merge(policy, user('{"window": {"type": "tuple", "size": 3, "step": 2, '
                           '"aggregates": ["rainrate:max"]}}'), WEATHER_SCHEMA)
    assert exc.value.attribute == "rainrate"
    only_max = graph(dp_window(attrs=("rainrate:max",)))
    assert merge(only_max, None, WEATHER_SCHEMA).nr


def test_what_a_window_costs():
    spec = PrivacySpec(0.6, 0.0, (Bound("rainrate", -10.0, 50.0),), (Budget(6.0, 60),))
    from pep.core.plan import Aggregate
    qs = quantities([Aggregate("rainrate", "avg"), Aggregate("rainrate", "sum"),
                     Aggregate("rainrate", "count")], spec, TYPES)
    assert [(q.kind, q.sensitivity) for q in qs] == [("count", 1.0), ("sum", 50.0)]
    assert sum(q.epsilon for q in qs) == pytest.approx(0.6)  # sequential composition
    assert windows_per_period("time", 60, 3600) == 61  # one more: emission times vary
    assert windows_per_period("time", 7, 60) == 10
    assert windows_per_period("tuple", 2, 3600) is None
    # ten windows of 0.1 fit a budget of 1, whatever the floating point says
    assert 10 * units(0.1) == budget_units(1.0)
    assert 3 * units(0.3) <= budget_units(0.9)


def test_the_readmes_worked_example_on_the_weather_stream():
    """Hourly averages of the rain rate, epsilon 1 per window, bounds [0, 50], 25 per day."""
    from pep.core.privacy import laplace_scale
    g = graph(dp_window(epsilon="1", budget="25/86400", kind="time", size="3600",
                        step="3600", attrs=("rainrate:avg",)))
    plan = merge(g, None, WEATHER_SCHEMA).plan
    qs = quantities(plan.window.aggregates, plan.window.privacy, TYPES)
    assert [(q.name, q.epsilon, laplace_scale(q)) for q in qs] == [
        ("count(rainrate)", 0.5, 2.0), ("sum(rainrate)", 0.5, 100.0)]
    assert windows_per_period("time", 3600, 86400) * units(1) <= budget_units(25)
    assert windows_per_period("time", 1800, 86400) == 49
