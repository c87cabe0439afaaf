"""The policy's masks merged with a consumer's (`plan_masks`, called from `pep.core.merge`): a
coarser mask the consumer asks for replaces the policy's, a finer one is refused; the consumer's
filter, keys and aggregates read masked values, which the NR/PR analysis sees as derived
variables with what a comparison on one implies about the raw value (`MaskPlan`); the plan's
filter, notes, window aggregates and applied masks that follow."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from pep.core.analysis import MASKED, NEVER, Constant, MergeWarning, RawBound
from pep.core.conditions import And, Comparison, Expr, Not, Or, spatial_parts
from pep.core.exact import (
    INT64_MAX,
    INT64_MIN,
    MAX_MICROS,
    MIN_MICROS,
    ceil_exact,
    floor_exact,
    is_integral,
    is_number,
    iso_from_micros,
    micros_from_iso,
)
from pep.core.graph import QueryGraph
from pep.core.masks.order import at_least_as_coarse, masks_of
from pep.core.masks.vocabulary import STEP_KINDS, Mask, MaskRefused, parse_mask
from pep.core.plan import Aggregate, AnyPredicate, Conjunct, FieldType, Predicate, StreamSchema

Alternatives = list[list[RawBound]]
"""An OR of ANDs of bounds on a raw attribute (`MaskPlan.implied`)."""


def variable(attribute: str, mask: Mask) -> str:
    """The analysis' name of an attribute's masked value (a derived variable)."""
    return f"{MASKED}{attribute}{MASKED}{mask.spec}"


def split_variable(name: str) -> tuple[str, Mask] | None:
    if not name.startswith(MASKED) or name == NEVER:
        return None
    attribute, _, spec = name[1:].partition(MASKED)
    return attribute, parse_mask(spec)


@dataclass
class MaskPlan:
    """The masks a merged request applies (the policy's, or coarser ones the consumer asked
    for) and how the merge uses them: the consumer's filter reads masked values."""

    schema: StreamSchema
    masks: dict[str, Mask]
    inexact: set[str] = field(default_factory=set)

    @property
    def variable_kinds(self) -> dict[str, str]:
        """What the analysis compares each derived variable as: one per masked value (its
        masked type; `null` for a null mask, which no comparison satisfies), and the
        never-satisfied NEVER (`pep.core.analysis.Checker`)."""
        kinds = {variable(n, m): "null" if m.kind == "null" else m.output_type(self._type(n))
                 for n, m in self.masks.items()}
        kinds[NEVER] = "null"
        return kinds

    def _type(self, name: str) -> FieldType:
        field = self.schema.lookup(name)
        if field is None:  # masks are kept by the schema's names (`plan_masks`)
            raise KeyError(f"no attribute {name!r} in the stream's schema")
        return field.type

    def user_condition(self, expr: Expr) -> Expr:
        """The consumer's condition on masked values: each comparison on a masked attribute
        becomes one on its masked value (a derived variable)."""
        if isinstance(expr, Comparison):
            mask = self.masks.get(expr.attribute)
            if mask is None:
                return expr
            return Comparison(variable(expr.attribute, mask), expr.op, expr.value,
                              expr.position)
        if isinstance(expr, (And, Or)):
            return type(expr)(tuple(self.user_condition(i) for i in expr.items))
        if isinstance(expr, Not):
            return Not(self.user_condition(expr.item))
        return expr

    def implied(self, name: str, op: str, value: Constant) -> Alternatives | None:
        """What a comparison on a masked value says of the raw value, as alternatives (an OR
        of ANDs) of comparisons on the raw attribute; exact for masks on integers and
        timestamps and for bands, a superset for rounded doubles, nothing for text masks
        (then the variable is noted as inexact). [[NEVER]]: the comparison never holds."""
        split = split_variable(name)
        if split is None:
            return None
        attribute, mask = split
        if mask.kind == "null":
            return None  # its variable is of kind null: no comparison holds
        ftype = self._type(attribute)
        if mask.kind == "bands":
            return _bands_implied(attribute, mask, ftype, op, value)
        if mask.kind in STEP_KINDS and ftype == "long":
            return _integer_step_implied(attribute, int(mask.step_value), op, value,
                                         INT64_MIN, INT64_MAX, int)
        if mask.kind == "truncate":
            return _integer_step_implied(attribute, mask.unit_micros, op,
                                         micros_from_iso(value), MIN_MICROS, MAX_MICROS,
                                         iso_from_micros)
        self.inexact.add(name)
        present = _present(attribute, ftype)
        if mask.kind in STEP_KINDS:
            # doubles: the runtime never rounds up (m <= x, exactly), and x < m + step up to
            # rounding: the upper bounds are loose
            step = float(mask.step_value)
            v = float(value)
            if op in (">", ">="):
                return [[(attribute, op, v)]]
            if op in ("<", "<="):
                return [[(attribute, "<", v + 2 * step)]]
            if op == "=":
                if not _on_grid(v, mask):
                    return _NEVER
                return [[(attribute, ">=", v), (attribute, "<", v + 2 * step)]]
        return [[present]]


def _on_grid(value: float, mask: Mask) -> bool:
    """Whether a double is a value the runtime gives for some multiple k of the step: k * num
    / den in doubles (num / den the step's exact fraction; the product exact below 2^53)."""
    num, den = mask.fraction.numerator, mask.fraction.denominator
    if value != value or value in (float("inf"), float("-inf")):
        return False
    guess = round(value * den / num)
    # beyond 2^53 the product rounds: not decided, so taken as on the grid (never a false NR)
    return any(abs(k * num) >= 2 ** 53 or (k * num) / den == value
               for k in (guess - 1, guess, guess + 1))


def _present(attribute: str, ftype: str) -> RawBound:
    """A comparison every present value of the type meets (a masked value is present only
    when the raw value is)."""
    return {"double": (attribute, ">", float("-inf")), "long": (attribute, ">=", INT64_MIN),
            "string": (attribute, ">=", ""),
            "timestamp": (attribute, ">=", iso_from_micros(MIN_MICROS)),
            }.get(ftype, (attribute, "!=", None))


_NEVER: Alternatives = [[(NEVER, "=", 0)]]


def _integer_step_implied(attribute: str, step: int, op: str, value: Constant, low: int,
                          high: int, shown: Callable[[int], Constant]) -> Alternatives:
    """m = x - (x mod step) compared with an integer constant, as bounds on x (exact)."""
    if not is_number(value) or not is_integral(value):
        c = value
        # a constant between two values of the masked domain: exact integer form
        if op in (">", ">="):
            c_int, op = floor_exact(c), ">"
        elif op in ("<", "<="):
            c_int, op = ceil_exact(c), "<"
        elif op == "=":
            return _NEVER
        else:
            return [[(attribute, ">=", shown(low))]]
    else:
        c_int = int(value)

    def floor_to(n: int) -> int:
        return n - n % step

    def ceil_to(n: int) -> int:
        return -((-n) // step) * step

    def bound(o: str, n: int) -> RawBound:
        return (attribute, o, shown(max(low, min(high, n))))

    if op == ">=":
        start = ceil_to(c_int)
        return _NEVER if start > high else [[bound(">=", start)]]
    if op == ">":
        start = ceil_to(c_int + 1)
        return _NEVER if start > high else [[bound(">=", start)]]
    if op == "<=":
        end = floor_to(c_int) + step - 1
        return _NEVER if end < low else [[bound("<=", end)]]
    if op == "<":
        end = floor_to(c_int - 1) + step - 1
        return _NEVER if end < low else [[bound("<=", end)]]
    if op == "=":
        if c_int % step:
            return _NEVER
        return [[bound(">=", c_int), bound("<=", c_int + step - 1)]]
    # !=
    if c_int % step:
        return [[bound(">=", low)]]
    out: Alternatives = []
    if c_int - 1 >= low:
        out.append([bound("<=", c_int - 1)])
    if c_int + step <= high:
        out.append([bound(">=", c_int + step)])
    return out or _NEVER


def _bands_implied(attribute: str, mask: Mask, ftype: str, op: str, value: Constant
                   ) -> Alternatives:
    """The band's lower edge compared with a constant, as bounds on x (exact: x is compared
    with the edges, no arithmetic)."""
    edges: list[int] | list[float] = ([int(e) for e in mask.edges] if ftype == "long"
                                      else [float(e) for e in mask.edges])
    c = value

    def edge(e: float) -> Constant:
        return e

    first: list[RawBound] = [(attribute, ">=", edge(edges[0]))]

    def below(e: float) -> list[RawBound]:
        return [(attribute, "<", edge(e))]

    if op in (">=", ">"):
        above = [e for e in edges if (e >= c if op == ">=" else e > c)]
        return _NEVER if not above else [[(attribute, ">=", edge(above[0]))]]
    if op in ("<=", "<"):
        held = [e for e in edges if (e <= c if op == "<=" else e < c)]
        if not held:
            return _NEVER
        rest = [e for e in edges if e > held[-1]]
        return [first + (below(rest[0]) if rest else [])]
    if op == "=":
        if c not in edges:
            return _NEVER
        i = edges.index(c)
        return [[(attribute, ">=", edge(c))] + (below(edges[i + 1]) if i + 1 < len(edges)
                                                 else [])]
    # != : present (at or above the first edge), and outside c's band
    if c not in edges:
        return [first]
    i = edges.index(c)
    out: Alternatives = []
    if i > 0:
        out.append(first + below(c))
    if i + 1 < len(edges):
        out.append([(attribute, ">=", edge(edges[i + 1]))])
    return out or _NEVER


def policy_masks(policy: QueryGraph) -> dict[str, Mask]:
    """The masks of a policy graph (`pep.core.graph.Mask`), attribute -> mask."""
    node = policy.mask
    return masks_of(node.masks) if node is not None else {}


def plan_masks(policy: QueryGraph, user: QueryGraph | None, schema: StreamSchema
               ) -> MaskPlan | None:
    """The masks a request gets: the policy's, each replaced by the consumer's own where that
    is at least as coarse; a finer (or incomparable) one is refused naming the attribute, and
    so is a spatial predicate of the consumer's over masked coordinates. None: no mask."""
    masks = policy_masks(policy)
    asked = user.mask if user is not None else None
    if asked is not None:
        shown = set(policy.map.attributes) if policy.map is not None else set(schema.names)
        for name, mask in masks_of(asked.masks).items():
            if name not in shown:
                raise MaskRefused(f"your query masks attribute {name!r}, which the policy does "
                                  "not expose", name)
            have = masks.get(name)
            if not at_least_as_coarse(mask, have):
                policy_spec = have.spec if have is not None else "none"
                raise MaskRefused(
                    f"your query asks for attribute {name!r} as {mask.spec!r}, which is not "
                    f"coarser than the policy's mask {policy_spec!r}; ask for the policy's mask "
                    "or a coarser one (a multiple of its step, a subset of its band edges, a "
                    "larger unit, a shorter prefix or suffix, null)", name)
            masks[name] = mask
    if not masks:
        return None
    uf = user.filter if user is not None else None
    if uf is not None:
        for s in spatial_parts(uf.condition):
            hit = [a for a in (s.latitude, s.longitude) if a in masks]
            if hit:
                raise MaskRefused(
                    f"your query's {s} reads {', '.join(hit)}, which the policy shows only "
                    f"masked ({', '.join(masks[a].spec for a in hit)}); a spatial predicate "
                    "over masked coordinates is not supported (it would read the raw position)",
                    hit[0])
    return MaskPlan(schema, {n: masks[n] for n in schema.names if n in masks})


def plan_dnf(dnf: tuple[Conjunct, ...] | None, plan: MaskPlan) -> tuple[Conjunct, ...] | None:
    """The merged filter with masked variables back as predicates on masked values."""
    if not dnf:
        return dnf
    out = []
    for conj in dnf:
        preds: list[AnyPredicate] = []
        for p in conj:
            if isinstance(p, Predicate):
                split = split_variable(p.attribute)
                if split is not None:
                    p = Predicate(split[0], p.op, p.value, split[1].spec)
            preds.append(p)
        out.append(tuple(preds))
    return tuple(out)


def filter_notes(dnf: tuple[Conjunct, ...] | None, plan: MaskPlan) -> list[MergeWarning]:
    """An INFO warning when the consumer's filter on masked values could not be analysed
    exactly (the analysis then never reports NR falsely, but may miss one)."""
    undecided = sorted({split[0] for conj in dnf or () for p in conj
                        if isinstance(p, Predicate) and p.attribute.startswith(MASKED)
                        and p.attribute in plan.inexact
                        and (split := split_variable(p.attribute)) is not None})
    if not undecided:
        return []
    shown = ", ".join(f"{a} ({plan.masks[a].spec})" for a in undecided)
    return [MergeWarning("INFO", "filter",
                         f"your filter compares masked values of {shown}; the analysis cannot "
                         "decide exactly which masked values the policy's filter lets through, so "
                         "it may not warn of a result that stays empty (it never reports one "
                         "falsely)",
                         tuple(undecided))]


def window_masks(plan: MaskPlan, kind: str, size: int, step: int,
                 aggregates: Iterable[Aggregate], time_attribute: str | None,
                 functions_for_type: Mapping[str, Iterable[str]]
                 ) -> tuple[tuple[Aggregate, ...], list[MergeWarning]]:
    """The aggregates a window may compute over masked values (those whose function fits the
    masked type), with INFO warnings for the ones withheld; refuses a time window over a time
    attribute whose mask it cannot honour."""
    warnings: list[MergeWarning] = []
    if kind == "time" and time_attribute is not None and time_attribute in plan.masks:
        mask = plan.masks[time_attribute]
        unit: Fraction | None = None
        if mask.kind == "truncate":
            unit = Fraction(mask.unit_micros, 1_000_000)
        elif mask.kind in STEP_KINDS:
            unit = mask.fraction
        if unit is None:
            raise MaskRefused(
                f"the policy shows the time attribute {time_attribute!r} only as "
                f"{mask.spec!r}: a time window over it would reveal its time", time_attribute)
        if Fraction(size) % unit or Fraction(step) % unit:
            raise MaskRefused(
                f"the policy shows the time attribute {time_attribute!r} only as {mask.spec!r}: "
                f"a time window over it needs a size and a step that are whole multiples of "
                f"{_seconds(unit)} s (asked: size {size}, step {step})", time_attribute)
    kept = []
    for agg in aggregates:
        agg_mask = plan.masks.get(agg.attribute)
        if agg_mask is not None:
            ftype = agg_mask.output_type(plan._type(agg.attribute))
            if agg.function not in functions_for_type.get(ftype, ()):
                warnings.append(MergeWarning(
                    "INFO", "window", f"{agg.function}({agg.attribute}) is withheld: the policy "
                    f"shows {agg.attribute!r} as {agg_mask.spec!r}, a {ftype} value",
                    (f"{agg.function}({agg.attribute})",)))
                continue
        kept.append(agg)
    return tuple(kept), warnings


def _seconds(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(float(value))


def output_masks(plan: MaskPlan, names: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """The masks of the attributes a plan outputs (projected, aggregated, grouped by), in
    schema order."""
    wanted = set(names)
    return tuple((n, m.spec) for n, m in plan.masks.items() if n in wanted)
