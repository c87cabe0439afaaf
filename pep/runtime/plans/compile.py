"""Turn an ExecutionPlan into data: predicate rows for the shared Spark job, and a routing recipe.

Nothing here builds Spark expressions or SQL text. A plan's filter becomes nested lists of
(attribute index, operator mask, kind, numeric constant, string constant) tuples that travel to
Spark as the contents of a one-row table, so attaching a handle never changes the physical plan
and a constant can never be read as code.

Comparison encoding: the generic predicate computes, per tuple, which of "less", "equal",
"greater" holds between the attribute and the constant (bits 1, 2, 4); an operator is the set of
outcomes it accepts. A null attribute yields no outcome, so every operator is false on it.
Each attribute is compared in its own family, exactly: doubles as doubles (NUMERIC_KIND, a float
constant), longs, timestamps (epoch microseconds) and booleans (0/1) as 64-bit integers
(INTEGER_KIND, an int constant: no rounding through a double, so `n = 2^53 + 1` never matches
2^53), strings as strings. A long or timestamp constant that is not a value of the attribute's
domain (2.5, beyond 64 bits, a fraction of a microsecond) is rewritten into the equivalent
integer comparison (`pep.core.exact.integer_comparison`), so every row's constant is an integer
of the domain.

Spatial predicates (`pep.core.plan.SpatialPredicate`) use the same encoding: the distance in
metres is compared with the constant (kinds DISTANCE_KIND and ANCHOR_KIND), and a polygon's
outcome is "equal" inside and "less" outside (POLYGON_KIND; WITHIN_POLYGON's mask is "equal",
NOT WITHIN_POLYGON's "less or greater"). Their rows carry two more fields: the longitude's
attribute index and the geometry (the point, the flat vertex list, or for DISTANCE_TO the
`AnchorSpec` whose positions the executor supplies per micro-batch, see
pep/runtime/plans/spatial.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from pep.core import geo
from pep.core.exact import (
    INT64_MAX,
    INT64_MIN,
    MAX_MICROS,
    MIN_MICROS,
    ExactNumber,
    exact_decimal,
    in_timestamp_range,
    integer_comparison,
    is_number,
    micros_from_iso,
)
from pep.core.labels import LABEL_MASKS, LabelError, Lattice
from pep.core.masks import Mask, MaskError, check_fits, parse_mask
from pep.core.plan import (
    AGGREGATE_FUNCTIONS,
    Aggregate,
    AnyPredicate,
    ExecutionPlan,
    Field,
    Predicate,
    SpatialPredicate,
    StreamSchema,
    UnionPlan,
)
from pep.core.privacy import PrivacySpec, Quantity, is_finite_spec, quantities
from pep.core.punctuations import filter_attributes

LESS, EQUAL, GREATER = 1, 2, 4
OPERATOR_MASKS: dict[str, int] = {
    "<": LESS,
    "<=": LESS | EQUAL,
    ">": GREATER,
    ">=": GREATER | EQUAL,
    "=": EQUAL,
    "!=": LESS | GREATER,
}
NUMERIC_KIND, STRING_KIND, DISTANCE_KIND, POLYGON_KIND, ANCHOR_KIND, INTEGER_KIND = 0, 1, 2, 3, 4, 5
# A comparison on a masked value (a consumer's filter on a masked attribute): its kind with this
# bit set (8 double, 9 string, 13 64-bit integer), compared in the masked value's family; the
# plan's mask for the attribute says how the value is masked (pep/runtime/privacy/masks.py).
MASKED_KIND = 8
HIDDEN = "_xsg_lub_"  # a lub computed for a window's label bound, not shown
# A label comparison (`pep.core.labels`): the value's code against the constant's, its outcome
# one of BELOW 1, EQUAL 2, ABOVE 4, INCOMPARABLE 8, the mask the op's (labels.LABEL_MASKS).
LABEL_KIND = 6


def base_kind(kind: int) -> int:
    """The comparison family of a kind, masked or not."""
    return kind & 7
NUMERIC_TYPES = ("double", "long", "boolean", "timestamp")


@dataclass(frozen=True)
class AnchorSpec:
    """A DISTANCE_TO anchor of a stream: the tuples whose key attribute (index, 1-based)
    equals the constant (a number, or text for string keys), and where their position is."""

    key_index: int
    key_kind: int  # NUMERIC_KIND (a float), INTEGER_KIND (an int) or STRING_KIND
    key_number: float | int | None
    key_text: str | None
    lat_index: int
    lon_index: int


# (attribute index 1-based, operator mask, kind, numeric constant, string constant); the numeric
# constant is a float for NUMERIC_KIND and a 64-bit int for INTEGER_KIND. Spatial rows add
# (longitude index, geometry): a point (lat, lon), a flat vertex list, or an AnchorSpec.
PredicateRow = tuple[Any, ...]


class PlanError(ValueError):
    """A plan the runtime cannot execute; the message names the offending part."""


# Value families: how an attribute's values travel between Spark and the driver's windows.
# "d": doubles; "l": 64-bit integers (long as is, timestamp as epoch microseconds, boolean 0/1);
# "s": strings.
FAMILIES: dict[str, str] = {"double": "d", "long": "l", "timestamp": "l", "boolean": "l",
                            "string": "s", "label": "l"}  # a label: its code (privacy/labels.py)


@dataclass(frozen=True)
class CompiledWindow:
    kind: str  # "tuple" | "time"
    size: int
    step: int
    aggregates: tuple[tuple[str, str, str], ...]  # (attribute, function, output name), unique names
    time_attribute: str | None
    time_is_timestamp: bool
    min_count: int = 1
    keys: tuple[str, ...] = ()  # group-by attributes (canonical names)
    # the aggregated attributes, each once, in first-use order, with their schema types
    attributes: tuple[tuple[str, str], ...] = ()
    key_types: tuple[str, ...] = ()
    # differential privacy: the plan's parameters and the noisy quantities one window row
    # releases (pep.core.privacy); None: exact windows
    privacy: PrivacySpec | None = None
    noise: tuple[Quantity, ...] = ()
    # label attributes' lattices (to print a `lub`), and the bounds a window's least upper
    # bound must be dominated by to be delivered: (attribute, code); their lub aggregates,
    # when the plan does not show them, have output names starting with HIDDEN
    lattices: tuple[tuple[str, Lattice], ...] = ()
    label_bounds: tuple[tuple[str, int], ...] = ()

    @property
    def pane(self) -> int:
        """Pane width (tuples or seconds): every window is a whole number of panes."""
        return math.gcd(self.size, self.step)


@dataclass(frozen=True)
class CompiledPlan:
    """What the executor needs of one distinct plan: its conjunct rows and how to shape output."""

    key: str
    conjuncts: tuple[tuple[PredicateRow, ...], ...]  # empty tuple: nothing passes
    projection: tuple[str, ...]
    window: CompiledWindow | None
    start_after: int | None = None
    projection_types: tuple[str, ...] = ()  # the types the consumer sees (a hash is a string)
    # (attribute index 1-based, mask) of every attribute the plan masks: its outputs' and
    # those its filter compares masked; empty: nothing is masked
    masks: tuple[tuple[int, Mask], ...] = ()
    # a Kafka stream's cut: per partition, the first offset given to the plan (a partition
    # beyond the tuple gives every record); None: no cut
    start_offsets: tuple[int, ...] | None = None
    # a stream with security punctuations: the consumer's roles, `refine` or `defer`, and the
    # attributes its filter reads (a window plan: every attribute it reads, `window_reads`)
    # (`pep.core.punctuations`); None: the stream has none
    punctuations: tuple[frozenset[str], str, tuple[str, ...]] | None = None

    @property
    def passes_nothing(self) -> bool:
        return not self.conjuncts

    @property
    def anchors(self) -> tuple[AnchorSpec, ...]:
        """The DISTANCE_TO anchors the filter uses (each once)."""
        return tuple(dict.fromkeys(row[6] for conj in self.conjuncts for row in conj
                                   if len(row) > 5 and isinstance(row[6], AnchorSpec)))


def timestamp_micros(value: object, where: str) -> int | Fraction:
    """Epoch microseconds of a timestamp constant, exactly (an int, or a Fraction for a text
    naming a fraction of a microsecond): ISO-8601 text (naive means UTC; the gateway's own
    `...ffffffZ` is what bound conditions hold), or a number of epoch seconds (plans stored
    before conditions held texts), rounded to the microsecond as they were meant."""
    if isinstance(value, bool):
        raise PlanError(f"{where}: a boolean is not a timestamp")
    if isinstance(value, str):
        try:
            micros: int | Fraction = micros_from_iso(value)
        except (ValueError, OverflowError):
            raise PlanError(f"{where}: {value!r} is not an ISO-8601 timestamp") from None
    elif isinstance(value, (int, float, Decimal, Fraction)):  # a number (a boolean: above)
        number = Fraction(value)
        micros = round(number * 1_000_000)
    else:
        raise PlanError(f"{where}: {value!r} is not a timestamp")
    if not in_timestamp_range(micros):
        raise PlanError(f"{where}: {value!r} is outside years 1 to 9999")
    return micros


def _integer_constant(pred: Predicate, ftype: str, where: str) -> tuple[str, int]:
    """(operator, 64-bit integer constant) equivalent to the predicate on a long, timestamp or
    boolean attribute, exactly."""
    value = pred.value
    if ftype == "timestamp":
        return integer_comparison(pred.op, timestamp_micros(value, where), MIN_MICROS, MAX_MICROS)
    if ftype == "boolean":
        if isinstance(value, bool):
            return pred.op, int(value)
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return pred.op, int(value.strip().lower() == "true")
        if is_number(value) and value in (0, 1):
            return pred.op, int(value)
        raise PlanError(f"{where}: {value!r} is not a boolean")
    return integer_comparison(pred.op, _exact_number(pred, ftype, where), INT64_MIN, INT64_MAX)


def _exact_number(pred: Predicate, ftype: str, where: str) -> ExactNumber:
    value: object = pred.value
    if isinstance(value, bool):
        raise PlanError(f"{where}: a boolean constant cannot be compared with a {ftype} attribute")
    if isinstance(value, str):
        try:
            value = exact_decimal(value)
        except ValueError:
            value = None
    if not isinstance(value, (int, float, Decimal, Fraction)):  # not a number (`is_number`)
        raise PlanError(f"{where}: {pred.value!r} is not a number, but attribute "
                        f"{pred.attribute!r} is {ftype}")
    if isinstance(value, float) and not math.isfinite(value):
        raise PlanError(f"{where}: {value!r} is not a valid constant")
    return value


def _double_constant(pred: Predicate, where: str) -> float:
    number = float(_exact_number(pred, "double", where))
    if not math.isfinite(number):
        raise PlanError(f"{where}: {pred.value!r} is not a finite double")
    return number


def compile_spatial(pred: SpatialPredicate, schema: StreamSchema, where: str) -> PredicateRow:
    """A spatial predicate as a row: checked again here, as a plan may come from storage."""
    def index(name: str | None, what: str, numeric: bool = True) -> int:
        field = schema.lookup(name or "")
        if field is None:
            raise PlanError(f"{where}: {what} {name!r} is not in the stream's schema")
        if numeric and field.type not in ("double", "long"):
            raise PlanError(f"{where}: {what} {field.name!r} is {field.type}, not a number")
        return schema.fields.index(field) + 1

    mask = OPERATOR_MASKS.get(pred.op)
    if mask is None:
        raise PlanError(f"{where}: unknown operator {pred.op!r}")
    lat, lon = index(pred.latitude, "latitude"), index(pred.longitude, "longitude")
    points = tuple(float(v) for v in pred.points)
    if not all(math.isfinite(v) for v in points):
        raise PlanError(f"{where}: the geometry has a number that is not finite")
    if pred.function == "polygon":
        if pred.op not in ("=", "!=") or len(points) % 2 or not \
                3 <= len(points) // 2 <= geo.MAX_POLYGON_VERTICES:
            raise PlanError(f"{where}: a polygon needs 3 to {geo.MAX_POLYGON_VERTICES} (lat, lon) "
                            "vertices and the operator = (inside) or != (outside)")
        if not all(geo.valid_position(points[k], points[k + 1]) for k in range(0, len(points), 2)):
            raise PlanError(f"{where}: a polygon vertex is outside the latitude/longitude ranges")
        return (lat, mask, POLYGON_KIND, 0.0, None, lon, points)
    radius = float(pred.value)
    if not math.isfinite(radius) or radius < 0:
        raise PlanError(f"{where}: the distance must be a finite number of metres >= 0")
    if pred.function == "distance":
        if len(points) != 2 or not geo.valid_position(*points):
            raise PlanError(f"{where}: DISTANCE needs a point (lat, lon) within the ranges")
        return (lat, mask, DISTANCE_KIND, radius, None, lon, points)
    if pred.function != "distance_to":
        raise PlanError(f"{where}: unknown spatial function {pred.function!r}")
    key = index(pred.key, "anchor key attribute", numeric=False)
    # a stored plan's key_value may be missing (None): refused below as any constant that is
    # no value of the key attribute
    anchor = Predicate(schema.fields[key - 1].name, "=",
                       pred.key_value)  # type: ignore[arg-type]  # None: see above
    key_row = compile_predicate(anchor, schema, where)
    if key_row[1] != EQUAL:
        raise PlanError(f"{where}: the anchor's key value {pred.key_value!r} is not a value of "
                        f"attribute {schema.fields[key - 1].name!r}")
    spec = AnchorSpec(key, key_row[2], key_row[3], key_row[4], lat, lon)
    return (lat, mask, ANCHOR_KIND, radius, None, lon, spec)


def row_attributes(row: PredicateRow) -> tuple[int, ...]:
    """The attribute indices (1-based) a predicate row reads."""
    if len(row) == 5:
        return (row[0],)
    if isinstance(row[6], AnchorSpec):
        return (row[0], row[5], row[6].key_index)
    return (row[0], row[5])


def _masked(pred: Predicate, schema: StreamSchema, where: str) -> PredicateRow:
    """A comparison on a masked value: compiled as one on an attribute of the masked type,
    its kind marked (MASKED_KIND)."""
    field = schema.lookup(pred.attribute)
    if field is None:
        raise PlanError(f"{where}: attribute {pred.attribute!r} is not in the stream's schema")
    try:
        mask = parse_mask(pred.mask)
        check_fits(mask, field.name, field.type)
    except MaskError as exc:
        raise PlanError(f"{where}: {exc}") from None
    view = StreamSchema(tuple(Field(f.name, mask.output_type(f.type))
                              if f.name == field.name else f for f in schema.fields))
    row = compile_predicate(Predicate(field.name, pred.op, pred.value), view, where)
    return (row[0], row[1], row[2] | MASKED_KIND, row[3], row[4])


def compile_predicate(pred: AnyPredicate, schema: StreamSchema, where: str) -> PredicateRow:
    if isinstance(pred, SpatialPredicate):
        return compile_spatial(pred, schema, where)
    if pred.mask is not None:
        return _masked(pred, schema, where)
    field = schema.lookup(pred.attribute)
    if field is None:
        raise PlanError(f"{where}: attribute {pred.attribute!r} is not in the stream's schema")
    if field.type == "label":
        return _label_row(pred, field, schema.fields.index(field) + 1, where)
    mask = OPERATOR_MASKS.get(pred.op)
    if mask is None:
        raise PlanError(f"{where}: unknown operator {pred.op!r}")
    index = schema.fields.index(field) + 1
    if field.type == "string":
        if isinstance(pred.value, bool):
            text = "true" if pred.value else "false"
        elif isinstance(pred.value, (int, float, str)):
            text = str(pred.value)
        else:
            raise PlanError(f"{where}: {pred.value!r} is not a string constant")
        return (index, mask, STRING_KIND, None, text)
    if FAMILIES[field.type] == "l":
        op, constant = _integer_constant(pred, field.type, where)
        return (index, OPERATOR_MASKS[op], INTEGER_KIND, constant, None)
    return (index, mask, NUMERIC_KIND, _double_constant(pred, where), None)


def _label_row(pred: Predicate, field: Field, index: int, where: str) -> PredicateRow:
    """A label comparison: the constant's code as the 64-bit constant, the op's outcomes."""
    mask = LABEL_MASKS.get(pred.op)
    if mask is None or field.lattice is None:
        raise PlanError(f"{where}: {pred.op!r} does not compare labels")
    try:
        label = field.lattice.parse(str(pred.value))
    except LabelError as exc:
        raise PlanError(f"{where}: {exc}") from None
    return (index, mask, LABEL_KIND, label.code, None)


def _canonical(schema: StreamSchema, name: str, where: str) -> str:
    field = schema.lookup(name)
    if field is None:
        raise PlanError(f"{where}: attribute {name!r} is not in the stream's schema")
    return field.name


def compile_plan(plan: ExecutionPlan, schema: StreamSchema, stream_time_attribute: str | None = None
                 ) -> CompiledPlan:
    """Check a plan against the stream's schema and reduce it to data; raises PlanError."""
    if plan.filter_dnf is None:
        conjuncts: tuple[tuple[PredicateRow, ...], ...] = ((),)  # one empty conjunct: always true
    else:
        conjuncts = tuple(
            tuple(compile_predicate(p, schema, f"filter conjunct {ci + 1}, predicate {pi + 1}")
                  for pi, p in enumerate(conj))
            for ci, conj in enumerate(plan.filter_dnf))
    projection = tuple(dict.fromkeys(_canonical(schema, a, "projection")
                                     for a in plan.projection))
    masks = plan_masks(plan, schema)
    view = _view(schema, masks)
    window = None
    if plan.window is not None:
        window = _compile_window(plan, view, stream_time_attribute)
    elif not projection:
        raise PlanError("projection: a plan without a window must project at least one attribute")
    start_after = plan.start_after
    if start_after is not None and (isinstance(start_after, bool)
                                    or not isinstance(start_after, int)):
        raise PlanError(f"start_after: {start_after!r} is not a stream position (an integer)")
    offsets = plan.start_offsets
    if offsets is not None and not all(isinstance(o, int) and not isinstance(o, bool)
                                       and 0 <= o < 1 << 63 for o in offsets):
        raise PlanError(f"start_offsets: {offsets!r} are not Kafka offsets (integers >= 0)")
    types = tuple(view.field(a).type for a in projection)
    index = {f.name: i + 1 for i, f in enumerate(schema.fields)}
    return CompiledPlan(plan.key(), conjuncts, projection, window, start_after, types,
                        tuple((index[n], m) for n, m in masks.items()),
                        None if offsets is None else tuple(offsets),
                        None if plan.punctuation_roles is None else
                        (frozenset(plan.punctuation_roles),
                         "defer" if plan.punctuation_defer else "refine",
                         filter_attributes(plan) if window is None else
                         window_reads(plan, window)))


def window_reads(plan: ExecutionPlan, window: CompiledWindow) -> tuple[str, ...]:
    """The attributes a window plan reads, by their schema names: its filter's, its
    aggregates', its group-by keys, its time and its label bounds'. A tuple of which a security
    punctuation hides any of them counts in none of the consumer's windows
    (`pep.core.punctuations.counts_in_window`)."""
    names = [*filter_attributes(plan), *(a for a, _ in window.attributes), *window.keys,
             *(a for a, _ in window.label_bounds)]
    if window.kind == "time" and window.time_attribute:
        names.append(window.time_attribute)
    return tuple(dict.fromkeys(names))


def plan_masks(plan: ExecutionPlan, schema: StreamSchema) -> dict[str, Mask]:
    """The plan's masks and those its filter compares on, one per attribute, checked."""
    found: dict[str, Mask] = {}
    pairs = list(plan.masks) + [(p.attribute, p.mask) for conj in plan.filter_dnf or ()
                                for p in conj if isinstance(p, Predicate) and p.mask]
    for name, spec in pairs:
        where = f"mask of {name!r}"
        canonical = _canonical(schema, name, where)
        try:
            mask = parse_mask(spec)
            check_fits(mask, canonical, schema.field(canonical).type)
        except MaskError as exc:
            raise PlanError(f"{where}: {exc}") from None
        if canonical in found and found[canonical] != mask:
            raise PlanError(f"{where}: the plan masks it both as {found[canonical].spec!r} and "
                            f"as {mask.spec!r}")
        found[canonical] = mask
    return {n: found[n] for n in schema.names if n in found}


def _view(schema: StreamSchema, masks: dict[str, Mask]) -> StreamSchema:
    """The schema as the plan's outputs are typed (a hashed attribute is a string)."""
    if not masks:
        return schema
    return StreamSchema(tuple(Field(f.name, masks[f.name].output_type(f.type))
                              if f.name in masks else f for f in schema.fields))


@dataclass(frozen=True)
class CompiledUnion:
    """A union of grants (`pep.core.plan.UnionPlan`): its members compiled, in the plan's order
    (a windowed member's rows carry its index as `grant`). The executor runs every member as a
    plan of its own (shared with other handles' identical plans) and merges the plain members'
    rows per tuple (`pep.runtime.query.union`)."""

    key: str
    members: tuple[CompiledPlan, ...]


def compile_union(plan: UnionPlan, schema: StreamSchema, stream_time_attribute: str | None = None
                  ) -> CompiledUnion:
    if not plan.plans:
        raise PlanError("union: no member plan")
    members = []
    for i, member in enumerate(plan.plans):
        if member.stream != plan.stream:
            raise PlanError(f"union member {i} is for stream {member.stream!r}, not "
                            f"{plan.stream!r}")
        try:
            members.append(compile_plan(member, schema, stream_time_attribute))
        except PlanError as exc:
            raise PlanError(f"union member {i}: {exc}") from None
    return CompiledUnion(plan.key(), tuple(members))


def _compile_window(plan: ExecutionPlan, schema: StreamSchema, stream_time: str | None
                    ) -> CompiledWindow:
    w = plan.window
    assert w is not None
    if w.kind not in ("tuple", "time"):
        raise PlanError(f"window: unknown kind {w.kind!r}")
    if not isinstance(w.size, int) or not isinstance(w.step, int) or w.size < 1 or w.step < 1:
        raise PlanError(f"window: size and step must be positive integers (got {w.size}, {w.step})")
    if not w.aggregates:
        raise PlanError("window: at least one aggregate is required")
    aggs: dict[str, tuple[str, str, str]] = {}
    for a in w.aggregates:
        if a.function not in AGGREGATE_FUNCTIONS:
            raise PlanError(f"window: unknown aggregate function {a.function!r}")
        name = _canonical(schema, a.attribute, f"window aggregate {a.output_name}")
        ftype = schema.field(name).type
        if a.function in ("avg", "sum") and ftype not in ("double", "long"):
            raise PlanError(f"window aggregate {a.output_name}: {a.function} needs a numeric "
                            f"attribute, {name!r} is {ftype}")
        if (a.function == "lub") != (ftype == "label") and a.function != "count":
            raise PlanError(f"window aggregate {a.output_name}: lub is the aggregate of label "
                            f"attributes (and their only one but count); {name!r} is {ftype}")
        aggs.setdefault(a.output_name, (name, a.function, a.output_name))
    bounds = []
    for attribute, text in w.label_bounds:
        name = _canonical(schema, attribute, "window label bound")
        lattice = schema.field(name).lattice
        if lattice is None:
            raise PlanError(f"window label bound: {name!r} is no label attribute")
        try:
            bounds.append((name, lattice.parse(text).code))
        except LabelError as exc:
            raise PlanError(f"window label bound on {name!r}: {exc}") from None
        if not any(a == name and f == "lub" for a, f, _ in aggs.values()):
            aggs.setdefault(HIDDEN + name, (name, "lub", HIDDEN + name))
    min_count = w.min_count
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 0:
        raise PlanError(f"window: min_count must be a non-negative integer (got {min_count!r})")
    keys = tuple(dict.fromkeys(_canonical(schema, k, "window key") for k in w.keys))
    time_attr = None
    is_ts = False
    if w.kind == "time":
        wanted = w.time_attribute or stream_time
        if not wanted:
            raise PlanError("window: a time window needs a time attribute (plan or stream)")
        time_attr = _canonical(schema, wanted, "window time attribute")
        ftype = schema.field(time_attr).type
        if ftype not in ("timestamp", "double", "long"):
            raise PlanError(f"window time attribute {time_attr!r} is {ftype}, "
                            "not a timestamp or epoch-seconds number")
        is_ts = ftype == "timestamp"
    attributes = tuple(dict.fromkeys(a for a, _, _ in aggs.values()))
    privacy, noise = _privacy(w.privacy, w.aggregates, schema)
    if privacy is not None and bounds:
        # a private window is released with noise and without its exact lub; whether it is
        # delivered must not hang on an exact function of its tuples either
        raise PlanError("a differentially private window cannot carry label bounds")
    found = {a: schema.lookup(a) for a in attributes}
    lattices = tuple((a, f.lattice) for a, f in found.items()
                     if f is not None and f.lattice is not None)
    return CompiledWindow(w.kind, w.size, w.step, tuple(aggs.values()), time_attr, is_ts,
                          max(1, min_count), keys,
                          tuple((a, schema.field(a).type) for a in attributes),
                          tuple(schema.field(k).type for k in keys),
                          privacy, noise, lattices, tuple(bounds))


def _privacy(spec: PrivacySpec | None, aggregates: tuple[Aggregate, ...], schema: StreamSchema
             ) -> tuple[PrivacySpec | None, tuple[Quantity, ...]]:
    """A private window's parameters checked again (a plan may come from storage): bounds on
    numeric attributes of the schema, every sum and avg bounded, only count/sum/avg."""
    if spec is None:
        return None, ()
    if not is_finite_spec(spec):
        raise PlanError("window privacy: epsilon, delta, bounds or budgets out of range")
    bounds = []
    for b in spec.bounds:
        field = schema.lookup(b.attribute)
        if field is None or field.type not in ("double", "long"):
            raise PlanError(f"window privacy: bounds on {b.attribute!r}, which is not a numeric "
                            "attribute of the stream")
        bounds.append(type(b)(field.name, b.lower, b.upper))
    spec = PrivacySpec(spec.epsilon, spec.delta, tuple(bounds), spec.budgets)
    names = [type(a)(_canonical(schema, a.attribute, "window aggregate"), a.function)
             for a in aggregates]
    try:
        noise = quantities(names, spec, {f.name: f.type for f in schema.fields})
    except ValueError as exc:
        raise PlanError(f"window privacy: {exc}") from None
    return spec, noise
