"""Differentially private windows: the owner's parameters, how policies and queries combine
them, and what one emitted window costs. Pure Python: the mechanisms run on OpenDP in
`pep/runtime/noise.py`, the values are clamped in Spark by `pep/runtime/privacy.py`, and the
consumers' budgets are kept by `pep/handles/privacy_budget.py`.

An owner makes a window differentially private by adding, to its
`exacml:obligation:stream-window` obligation (prefix `exacml:obligation:` or
`pCloud:obligation:`, as every window attribute):

- `stream-window-dp-epsilon-id` (exactly one): the privacy loss epsilon of ONE emitted window,
  a decimal in (0, 100]. Every window is released with noise calibrated to it.
- `stream-window-dp-delta-id` (at most one, default 0): delta in [0, 0.001]. 0 means pure
  epsilon-DP with Laplace noise (OpenDP's discrete Laplace, i.e. geometric, for counts and sums
  of integers; its Laplace for sums of doubles); above 0, Gaussian noise (OpenDP's discrete
  Gaussian for counts and sums of integers, its Gaussian for doubles), calibrated through
  zero-concentrated DP so that each window is (epsilon, delta)-DP.
- `stream-window-dp-bounds-id` (repeated): `attribute:lower:upper`, the clamping bounds of a
  numeric attribute. Every value is clamped into them in Spark before it is aggregated, so one
  tuple moves a sum by at most max(|lower|, |upper|). A sum or avg needs its attribute's
  bounds (without them the policy is refused); integers for a long attribute.
- `stream-window-dp-budget-id` (at least one, repeated): `epsilon/seconds`, e.g. `1/86400`:
  the most a consumer may spend on the stream in any rolling period of that many seconds,
  over all its handles. Several budgets all apply.

What is protected, and what one window costs (README, "Differentially private windows"): the
unit is one tuple added to or removed from a window. A window releases some noisy quantities:
per aggregated attribute a count of its non-null values (for `count` and `avg`) and a sum of
its clamped values (for `sum` and `avg`); `avg` is the noisy sum over the noisy count (each
reused when the window also releases it). The window's epsilon (and delta) is split evenly
between its quantities (sequential composition), so one emitted window costs exactly epsilon.
With group-by keys a tuple is in one key's row of a window, so all rows of one time window cost
epsilon together (parallel composition); rows of keyed tuple windows are charged each.
`min`, `max`, `firstval` and `lastval` show single values and have no release here: they are
withheld from a private window, and a query asking for them is refused naming them.

Several applicable policies: the strictest wins (the smallest epsilon and delta, the
intersection of each attribute's bounds, every budget). A consumer may ask for a smaller
epsilon or delta (more noise), never a larger one.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Literal, NotRequired, Protocol, TypedDict

from common.numbers import NumberError, parse_float, parse_int
from pep.core.jsontypes import JsonObject


class NamedAggregate(Protocol):
    """An aggregate as a window names it (`pep.core.plan.Aggregate`, whose plan holds this
    module's privacy)."""

    @property
    def attribute(self) -> str: ...

    @property
    def function(self) -> str: ...


AttributeTypes = Callable[[str], "tuple[str, str] | None"]
"""An attribute's name as written -> (its canonical name, its type), None when unknown."""

DP_EPSILON = "stream-window-dp-epsilon-id"
DP_DELTA = "stream-window-dp-delta-id"
DP_BOUNDS = "stream-window-dp-bounds-id"
DP_BUDGET = "stream-window-dp-budget-id"
DP_ATTRIBUTES = (DP_EPSILON, DP_DELTA, DP_BOUNDS, DP_BUDGET)

MIN_EPSILON = 1e-6
MAX_EPSILON = 100.0
MAX_DELTA = 1e-3  # above it a mechanism may leak a whole tuple with a probability worth fearing
MAX_PERIOD = 366 * 86_400  # seconds; the ledger keeps spends this long
MAX_BOUND = 1e15  # clamping bounds, in absolute value
MAX_LONG_BOUND = 2 ** 53  # long bounds travel as doubles to Spark: exact up to here
UNITS = 10 ** 9  # the ledger counts epsilon in billionths, as integers

DP_FUNCTIONS = frozenset({"count", "sum", "avg"})  # what a private window can release
NOT_PRIVATE = {"min": "shows one tuple's value (the smallest)",
               "max": "shows one tuple's value (the largest)",
               "firstval": "shows one tuple's value (the first)",
               "lastval": "shows one tuple's value (the last)"}


@dataclass(frozen=True)
class Bound:
    """Clamping bounds of one numeric attribute (ints for a long attribute)."""

    attribute: str
    lower: float
    upper: float

    @property
    def sensitivity(self) -> float:
        """How far one tuple added or removed moves a sum of clamped values."""
        return max(abs(self.lower), abs(self.upper))


@dataclass(frozen=True)
class Budget:
    """At most `epsilon` spent by one consumer on one stream in any `period` seconds."""

    epsilon: float
    period: int

    def text(self) -> str:
        return f"{_number(self.epsilon)} per {self.period} s"


@dataclass(frozen=True)
class PrivacySpec:
    """A window's differential privacy: epsilon and delta per emitted window, clamping bounds
    (schema order), and the consumers' budgets."""

    epsilon: float
    delta: float = 0.0
    bounds: tuple[Bound, ...] = ()
    budgets: tuple[Budget, ...] = ()

    def bound(self, attribute: str) -> Bound | None:
        for b in self.bounds:
            if b.attribute == attribute:
                return b
        return None

    @property
    def mechanism(self) -> Literal["laplace", "gaussian"]:
        return "laplace" if self.delta == 0 else "gaussian"


@dataclass(frozen=True)
class PrivacyAsk:
    """What a consumer's query asks of a private window: less privacy loss, never more."""

    epsilon: float | None = None
    delta: float | None = None


@dataclass(frozen=True)
class Quantity:
    """One noisy number a window releases (per key row): the count of an attribute's non-null
    values, or the sum of its clamped values."""

    kind: Literal["count", "sum"]
    attribute: str
    sensitivity: float
    integer: bool  # counts, and sums of long attributes: integer noise
    epsilon: float  # this quantity's share of the window's epsilon
    delta: float

    @property
    def name(self) -> str:
        return f"{self.kind}({self.attribute})"


# -- parsing the obligation's values ---------------------------------------------------------------

def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(value)


def parse_epsilon(text: str, what: str = "epsilon") -> float:
    try:
        value = parse_float(text, what, low=0.0, high=MAX_EPSILON)
    except NumberError as exc:
        raise ValueError(exc.message) from None
    if value < MIN_EPSILON:
        raise ValueError(f"{what} must be at least {MIN_EPSILON:g}, not {text.strip()!r}")
    return value


def parse_delta(text: str) -> float:
    try:
        return parse_float(text, "delta", low=0.0, high=MAX_DELTA)
    except NumberError as exc:
        raise ValueError(exc.message) from None


def parse_bound(text: str, attribute_type: AttributeTypes) -> Bound:
    """`attribute:lower:upper`; `attribute_type(name)` gives (canonical name, type) or None."""
    parts = text.strip().split(":")
    if len(parts) != 3:
        raise ValueError(f"bounds {text.strip()!r} must be written attribute:lower:upper")
    found = attribute_type(parts[0].strip())
    if found is None:
        raise ValueError(f"bounds {text.strip()!r} name unknown attribute {parts[0].strip()!r}")
    name, ftype = found
    lower: float
    upper: float
    if ftype == "long":
        try:
            lower, upper = (parse_int(p, f"bound of {name}", low=-MAX_LONG_BOUND,
                                      high=MAX_LONG_BOUND) for p in parts[1:])
        except NumberError as exc:
            raise ValueError(f"{exc.message} (a long attribute's bounds are integers)") from None
    elif ftype == "double":
        try:
            lower, upper = (parse_float(p, f"bound of {name}", low=-MAX_BOUND, high=MAX_BOUND)
                            for p in parts[1:])
        except NumberError as exc:
            raise ValueError(exc.message) from None
    else:
        raise ValueError(f"bounds {text.strip()!r}: {name!r} is {ftype}; only numeric "
                         "attributes are clamped")
    if lower > upper:
        raise ValueError(f"bounds {text.strip()!r}: the lower bound is above the upper")
    if lower == upper == 0:
        raise ValueError(f"bounds {text.strip()!r} hold no value but 0")
    return Bound(name, lower, upper)


def parse_budget(text: str) -> Budget:
    """`epsilon/seconds`."""
    eps, sep, period = text.strip().partition("/")
    if not sep:
        raise ValueError(f"budget {text.strip()!r} must be written epsilon/seconds "
                         "(e.g. 1/86400)")
    epsilon = parse_epsilon(eps, "budget epsilon")
    try:
        seconds = parse_int(period, "budget period", low=1, high=MAX_PERIOD)
    except NumberError as exc:
        raise ValueError(f"{exc.message} seconds") from None
    return Budget(epsilon, seconds)


def parse_spec(found: Mapping[str, list[str]], attribute_type: AttributeTypes
               ) -> PrivacySpec | None:
    """The DP part of one window obligation (None without any DP attribute); ValueError says
    what is wrong."""
    if not any(found.get(name) for name in DP_ATTRIBUTES):
        return None
    if len(found.get(DP_EPSILON, [])) != 1:
        raise ValueError(f"a differentially private window needs exactly one {DP_EPSILON}, "
                         f"found {len(found.get(DP_EPSILON, []))}")
    if len(found.get(DP_DELTA, [])) > 1:
        raise ValueError(f"more than one {DP_DELTA}")
    if not found.get(DP_BUDGET):
        raise ValueError(f"a differentially private window needs a {DP_BUDGET} "
                         "(epsilon/seconds): without one, windows would compose without limit")
    epsilon = parse_epsilon(found[DP_EPSILON][0])
    delta = parse_delta(found[DP_DELTA][0]) if found.get(DP_DELTA) else 0.0
    bounds: dict[str, Bound] = {}
    for text in found.get(DP_BOUNDS, []):
        b = parse_bound(text, attribute_type)
        if b.attribute in bounds:
            raise ValueError(f"attribute {b.attribute!r} has bounds twice")
        bounds[b.attribute] = b
    budgets = tuple(sorted(set(parse_budget(t) for t in found[DP_BUDGET]),
                           key=lambda b: (b.period, b.epsilon)))
    for budget in budgets:
        if budget.epsilon < epsilon:
            raise ValueError(f"budget {budget.text()} cannot pay for one window of epsilon "
                             f"{_number(epsilon)}")
    return PrivacySpec(epsilon, delta, tuple(bounds.values()), budgets)


def check_aggregates(spec: PrivacySpec, aggregates: Iterable[NamedAggregate]) -> None:
    """Every sum and avg of a private window needs its attribute's bounds."""
    for a in aggregates:
        if a.function in ("sum", "avg") and spec.bound(a.attribute) is None:
            raise ValueError(f"{a.function}({a.attribute}) under differential privacy needs "
                             f"clamping bounds: add {DP_BOUNDS} {a.attribute}:lower:upper")


# -- combining -------------------------------------------------------------------------------------

def strictest(specs: Sequence[PrivacySpec], order: Sequence[str] = ()) -> PrivacySpec:
    """Several policies' private windows at once: the smallest epsilon and delta, each
    attribute's bounds intersected, every budget. ValueError when bounds do not meet."""
    bounds: dict[str, Bound] = {}
    for spec in specs:
        for b in spec.bounds:
            have = bounds.get(b.attribute)
            if have is None:
                bounds[b.attribute] = b
                continue
            lower, upper = max(have.lower, b.lower), min(have.upper, b.upper)
            if lower > upper:
                raise ValueError(f"applicable policies clamp {b.attribute!r} to ranges that do "
                                 f"not meet ([{have.lower}, {have.upper}] and "
                                 f"[{b.lower}, {b.upper}])")
            bounds[b.attribute] = Bound(b.attribute, lower, upper)
    position = {name: i for i, name in enumerate(order)}
    ordered = tuple(sorted(bounds.values(), key=lambda b: (position.get(b.attribute, 1 << 30),
                                                           b.attribute)))
    budgets = tuple(sorted({b for s in specs for b in s.budgets},
                           key=lambda b: (b.period, b.epsilon)))
    return PrivacySpec(min(s.epsilon for s in specs), min(s.delta for s in specs), ordered,
                       budgets)


class AskTooMuch(ValueError):
    """A consumer's epsilon or delta above the policy's; `parameter` names which."""

    def __init__(self, message: str, parameter: str) -> None:
        super().__init__(message)
        self.parameter = parameter


def apply_ask(spec: PrivacySpec, ask: PrivacyAsk | None) -> PrivacySpec:
    """The consumer's own epsilon/delta, if any, within the policy's; AskTooMuch when it asks
    for more privacy loss than the policy allows."""
    if ask is None:
        return spec
    epsilon, delta = spec.epsilon, spec.delta
    if ask.epsilon is not None:
        if ask.epsilon > spec.epsilon:
            raise AskTooMuch(f"your query asks for epsilon {_number(ask.epsilon)} per window; "
                             f"the policy allows at most {_number(spec.epsilon)} (a larger "
                             "epsilon means less noise, more privacy loss)", "epsilon")
        epsilon = ask.epsilon
    if ask.delta is not None:
        if ask.delta > spec.delta:
            raise AskTooMuch(f"your query asks for delta {_number(ask.delta)} per window; the "
                             f"policy allows at most {_number(spec.delta)}", "delta")
        delta = ask.delta
    return replace(spec, epsilon=epsilon, delta=delta)


# -- what a window releases and costs ---------------------------------------------------------

def quantities(aggregates: Iterable[NamedAggregate], spec: PrivacySpec,
               types: Mapping[str, str]) -> tuple[Quantity, ...]:
    """The noisy numbers one window row releases for these aggregates, each with its share of
    the window's epsilon and delta (split evenly: sequential composition). `types` maps an
    attribute to its schema type."""
    wanted: list[tuple[str, str]] = []
    for a in aggregates:
        if a.function not in DP_FUNCTIONS:
            raise ValueError(f"{a.function}({a.attribute}) {NOT_PRIVATE.get(a.function, '')}; "
                             "it has no differentially private release")
        for kind in (("count",) if a.function == "count" else
                     ("sum",) if a.function == "sum" else ("count", "sum")):
            if (kind, a.attribute) not in wanted:
                wanted.append((kind, a.attribute))
    if not wanted:
        return ()
    share_e, share_d = spec.epsilon / len(wanted), spec.delta / len(wanted)
    out = []
    for kind, attribute in wanted:
        if kind == "count":
            out.append(Quantity("count", attribute, 1.0, True, share_e, share_d))
            continue
        bound = spec.bound(attribute)
        if bound is None:
            raise ValueError(f"sum of {attribute!r} under differential privacy needs clamping "
                             "bounds")
        out.append(Quantity("sum", attribute, float(bound.sensitivity),
                            types.get(attribute) == "long", share_e, share_d))
    return tuple(out)


def laplace_scale(q: Quantity) -> float:
    """The Laplace scale that makes a quantity `q.epsilon`-DP (OpenDP's calibration may round it
    up by a hair: `pep.runtime.noise` finds the exact one)."""
    return q.sensitivity / q.epsilon


def windows_per_period(kind: str, step: int, period: int) -> int | None:
    """The most windows a time window emits in any `period` seconds of the clock: one ends
    every `step` seconds of event time, ceil(period / step) in a period, plus one because a
    window is emitted some time after its end (when the watermark passes it) and that delay
    varies from window to window (by less than a step while event time follows the clock).
    None for tuple windows, whose rate is the stream's."""
    if kind != "time":
        return None
    return -(-period // step) + 1


def units(epsilon: float) -> int:
    """Epsilon in the ledger's integer units, rounded up (what a window costs)."""
    return max(1, int((Decimal(repr(float(epsilon))) * UNITS).to_integral_value(ROUND_CEILING)))


def budget_units(epsilon: float) -> int:
    """A budget in the ledger's units, rounded down (what may be spent)."""
    return int((Decimal(repr(float(epsilon))) * UNITS).to_integral_value(ROUND_FLOOR))


def from_units(value: int) -> float:
    return value / UNITS


# -- JSON ------------------------------------------------------------------------------------------

class BoundJson(TypedDict):
    attribute: str
    lower: float
    upper: float


class BudgetJson(TypedDict):
    epsilon: float
    period_seconds: int


class QuantityJson(TypedDict):
    quantity: str
    sensitivity: float
    epsilon: float
    delta: float
    noise: str
    laplace_scale: NotRequired[float]


class PrivacySpecJson(TypedDict):
    """A private window's parameters as explain and the handle list show them."""

    epsilon_per_window: float
    delta_per_window: float
    mechanism: Literal["laplace", "gaussian"]
    bounds: list[BoundJson]
    budgets: list[BudgetJson]
    unit: str
    quantities: NotRequired[list[QuantityJson]]
    avg: NotRequired[str]


def spec_to_json(spec: PrivacySpec, aggregates: Sequence[NamedAggregate] = ()
                 ) -> PrivacySpecJson:
    """The parameters as explain and the handle list show them: per window, per noisy
    quantity, the budgets."""
    out: PrivacySpecJson = {
        "epsilon_per_window": spec.epsilon, "delta_per_window": spec.delta,
        "mechanism": spec.mechanism,
        "bounds": [{"attribute": b.attribute, "lower": b.lower, "upper": b.upper}
                   for b in spec.bounds],
        "budgets": [{"epsilon": b.epsilon, "period_seconds": b.period} for b in spec.budgets],
        "unit": "one tuple added to or removed from a window",
    }
    try:
        qs = quantities(aggregates, spec, {})
    except ValueError:
        qs = ()
    if qs:
        discrete, continuous = (("discrete Laplace (geometric)", "Laplace")
                                if spec.mechanism == "laplace"
                                else ("discrete Gaussian", "Gaussian"))
        out["quantities"] = [_quantity_json(q, spec, discrete, continuous) for q in qs]
        if any(a.function == "avg" for a in aggregates):
            out["avg"] = "noisy sum / noisy count, clamped into the attribute's bounds"
    return out


def _quantity_json(q: Quantity, spec: PrivacySpec, discrete: str, continuous: str
                   ) -> QuantityJson:
    out: QuantityJson = {
        "quantity": q.name, "sensitivity": q.sensitivity, "epsilon": q.epsilon,
        "delta": q.delta,
        "noise": discrete if q.kind == "count"
        else f"{continuous} ({discrete} for a long attribute)",
    }
    if spec.mechanism == "laplace":
        out["laplace_scale"] = laplace_scale(q)
    return out


def spec_from_json(d: JsonObject | None) -> PrivacySpec | None:
    """A plan's stored privacy (its canonical JSON) back as a PrivacySpec."""
    if d is None:
        return None
    return PrivacySpec(
        epsilon=float(d["epsilon"]), delta=float(d.get("delta", 0.0)),
        bounds=tuple(Bound(b["attribute"], b["lower"], b["upper"])
                     for b in d.get("bounds") or ()),
        budgets=tuple(Budget(float(b["epsilon"]), int(b["period"]))
                      for b in d.get("budgets") or ()))


def is_finite_spec(spec: PrivacySpec) -> bool:
    """A stored spec still within the limits (a plan may come from storage)."""
    return (MIN_EPSILON <= spec.epsilon <= MAX_EPSILON and 0 <= spec.delta <= MAX_DELTA
            and all(math.isfinite(b.lower) and math.isfinite(b.upper) and b.lower <= b.upper
                    for b in spec.bounds)
            and bool(spec.budgets)
            and all(MIN_EPSILON <= b.epsilon and 1 <= b.period <= MAX_PERIOD
                    for b in spec.budgets))


__all__ = ["PrivacySpec", "PrivacySpecJson", "AttributeTypes", "PrivacyAsk", "AskTooMuch", "Bound",
           "Budget", "Quantity", "DP_ATTRIBUTES", "DP_EPSILON", "DP_DELTA", "DP_BOUNDS",
           "DP_BUDGET", "DP_FUNCTIONS", "NOT_PRIVATE", "parse_spec", "check_aggregates",
           "strictest", "apply_ask", "quantities", "laplace_scale", "windows_per_period", "units",
           "budget_units", "from_units", "spec_to_json", "spec_from_json", "is_finite_spec"]
