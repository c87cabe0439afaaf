"""Readable renderings of a merged query: Spark-SQL-like text (as eXACML+ Figure 4(b)) and JSON.

The text is for people (the consumer, an operator debugging a policy); it is never executed.
Conditions reach Spark as data (pep.core.plan.Predicate), not as SQL. Identifiers and literals are
quoted anyway, so what is shown is unambiguous and could not be misread as more SQL.
"""
from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Literal, NotRequired, Required, TypedDict

from pep.core.conditions import And, Comparison, Const, Expr, Not, Or, Spatial
from pep.core.exact import iso_from_micros, timestamp_micros
from pep.core.graph import (
    Filter,
    Join,
    Map,
    Mask,
    Node,
    QueryGraph,
    Source,
    Union_,
    WindowAggregate,
)
from pep.core.labels import Label, comparison_text
from pep.core.masks import describe, mask_sql, masks_json, parse_mask, split_variable
from pep.core.outputs import JOINED_LABEL, join_output, output_names
from pep.core.plan import (
    AnyPredicate,
    Conjunct,
    ExecutionPlan,
    FieldType,
    JoinPlan,
    Scalar,
    SpatialPredicate,
    StreamSchema,
    UnionPlan,
)
from pep.core.privacy import PrivacySpecJson, spec_to_json

# -- the JSON forms ------------------------------------------------------------------------------

class ComparisonJson(TypedDict):
    """A plan's comparison: on the attribute's value, or on its masked value (`mask`)."""

    attribute: str
    op: str
    value: Scalar
    mask: NotRequired[str]


class LabelComparisonJson(TypedDict):
    """A comparison on a label attribute, its constant the label's text."""

    attribute: str
    op: str
    label: str


class AnchorJson(TypedDict):
    attribute: str | None
    value: Scalar | Label | None


class SpatialJson(TypedDict):
    """A spatial predicate: a polygon's vertices, or the metres from a point or an anchor."""

    function: str
    attributes: list[str]
    op: str
    polygon: NotRequired[list[list[float]]]
    metres: NotRequired[float]
    point: NotRequired[list[float]]
    anchor: NotRequired[AnchorJson]


PredicateJson = ComparisonJson | LabelComparisonJson | SpatialJson


class AggregateJson(TypedDict):
    attribute: str
    function: str
    output: str


class LabelBoundJson(TypedDict):
    attribute: str
    dominated_by: str


class WindowJson(TypedDict):
    type: str
    size: int
    step: int
    aggregates: list[AggregateJson]
    time_attribute: str | None
    keys: list[str]
    min_count: int
    privacy: NotRequired[PrivacySpecJson]
    label_bounds: NotRequired[list[LabelBoundJson]]


class PlanJson(TypedDict):
    """One stream's plan (`plan_to_json`): its filter in DNF (None: every tuple), what it
    outputs, its window."""

    stream: str
    key: str
    filter: list[list[PredicateJson]] | None
    projection: list[str]
    window: WindowJson | None
    output: list[str]
    start_after: NotRequired[int]
    masks: NotRequired[dict[str, str]]


class UnionPlanJson(TypedDict):
    stream: str
    key: str
    union: list[PlanJson]
    output: list[str]


class JoinPairJson(TypedDict):
    left: str
    right: str


class JoinLabelJson(TypedDict):
    left: str
    right: str
    output: str


class JoinJson(TypedDict):
    left: PlanJson
    right: PlanJson
    on: list[JoinPairJson]
    within: float
    time: JoinPairJson
    label: NotRequired[JoinLabelJson]


class JoinPlanJson(TypedDict):
    join: JoinJson
    streams: list[str]
    key: str
    output: list[str]


AnyPlanJson = PlanJson | JoinPlanJson | UnionPlanJson


class OperatorJson(TypedDict, total=False):
    """One operator of a query graph: `op` names it (source, filter, map, mask, window, join,
    union), which says which of the other keys it has; `input` (or a join's `left` and
    `right`, a union's `inputs`) nests what it reads, where the graph is not a pipeline."""

    op: Required[str]
    stream: str
    condition: str
    attributes: list[str]
    masks: dict[str, str]
    type: str
    size: int
    step: int
    aggregates: list[str]
    keys: list[str]
    min_count: int
    input: OperatorJson
    left: OperatorJson
    right: OperatorJson
    inputs: list[OperatorJson]


class JoinSinkJson(TypedDict):
    """A join's graph: its condition and time bound, each side's merged graph."""

    op: Literal["join"]
    on: list[JoinPairJson]
    within: float
    time: JoinPairJson
    left: GraphJson
    right: GraphJson


class GraphJson(TypedDict, total=False):
    """A query graph: a pipeline's `operators` from the source to the sink, or the `sink` with
    its inputs nested (a join's: both sides' graphs); a union of grants is `union`, its members
    each naming the `rules` they stand for."""

    operators: list[OperatorJson]
    sink: OperatorJson | JoinSinkJson
    union: list[GraphJson]
    rules: list[str]


# -- SQL-like text ---------------------------------------------------------------------------------

SPARK_FUNCTIONS = {"avg": "avg", "max": "max", "min": "min", "sum": "sum", "count": "count",
                   "firstval": "first_value", "lastval": "last_value", "lub": "xsg_label_lub"}


def quote_identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# Characters a reader cannot see, or that reorder or break what is around them, are shown as
# \uXXXX escapes (Spark SQL's own escape): controls (C0, DEL, C1), line and paragraph separators,
# bidirectional marks, embeddings, overrides and isolates, non-characters, and lone surrogates
# (which no encoding can write, so the text could not even be sent otherwise).
_SHOWN_ESCAPED = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e"
                            "\u2066-\u2069\ud800-\udfff\ufeff\ufffe\uffff]")
_SIMPLE_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def quote_string(value: str) -> str:
    out = []
    for ch in value:
        if ch in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[ch])
        elif _SHOWN_ESCAPED.match(ch):
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "'" + "".join(out) + "'"


def sql_literal(value: object, field_type: str | None = None) -> str:
    """A constant as the text writes it (`field_type`: its attribute's, when known)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if field_type == "timestamp" and isinstance(value, str):
        try:  # the gateway's text of a microsecond, as bound conditions hold it
            text = iso_from_micros(timestamp_micros(value))
        except ValueError:
            return quote_string(value)
        return "TIMESTAMP " + quote_string(text[:-1].replace("T", " ").rstrip("0").rstrip(".")
                                           + "Z")
    if isinstance(value, str):
        return quote_string(value)
    if field_type == "timestamp" and isinstance(value, (int, float)) and math.isfinite(value):
        # epoch seconds: plans stored before timestamps were held as text
        try:
            moment = datetime.fromtimestamp(value, tz=UTC)
        except (OverflowError, OSError, ValueError):
            # outside years 1 to 9999 (conditions refuse such constants; a plan restored from
            # elsewhere may still hold one): shown as the number of epoch seconds it is
            return repr(float(value))
        text = moment.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
        return "TIMESTAMP " + quote_string(text.rstrip("0").rstrip(".") + "Z")
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _types(schema: StreamSchema | None) -> dict[str, FieldType]:
    return {f.name: f.type for f in schema.fields} if schema is not None else {}


def _spatial_sql(p: SpatialPredicate, types: dict[str, FieldType]) -> str:
    """A spatial predicate in the text (xsg's own functions: Spark has none of them; the
    runtime evaluates them as data, see pep/runtime/plans/spatial.py)."""
    coords = f"{quote_identifier(p.latitude)}, {quote_identifier(p.longitude)}"
    if p.function == "polygon":
        vertices = ", ".join(sql_literal(v) for v in p.points)
        text = f"WITHIN_POLYGON({coords}, ARRAY({vertices}))"
        return f"NOT {text}" if p.op == "!=" else text
    if p.function == "distance_to":
        key = sql_literal(p.key_value, types.get(p.key or ""))
        head = f"DISTANCE_TO({coords}, {quote_identifier(p.key or '')}, {key})"
    else:
        head = f"DISTANCE({coords}, {sql_literal(p.points[0])}, {sql_literal(p.points[1])})"
    op = "<>" if p.op == "!=" else p.op
    return f"{head} {op} {sql_literal(p.value)}"


def _predicate_sql(p: AnyPredicate, types: dict[str, FieldType]) -> str:
    if isinstance(p, SpatialPredicate):
        return _spatial_sql(p, types)
    return _comparison_sql(p.attribute, p.op, p.value, p.mask, types)


def _comparison_sql(attribute: str, op: str, value: object, mask_spec: str | None,
                    types: dict[str, FieldType]) -> str:
    """`attribute op value`, on the masked value when `mask_spec` says so (or the attribute
    is a merged graph's masked value)."""
    if types.get(attribute) == "label" or isinstance(value, Label):
        # xsg's dominance on a lattice (pep/core/labels.py), data in Spark like any comparison
        return comparison_text(quote_identifier(attribute), op, value)
    op = "<>" if op == "!=" else op
    mask = parse_mask(mask_spec) if mask_spec else None
    split = split_variable(attribute)
    if split is not None:  # a merged graph's comparison on a masked value
        attribute, mask = split
    if mask is not None:
        raw: FieldType = types.get(attribute, "double")
        column = mask_sql(quote_identifier(attribute), mask, raw)
        return f"{column} {op} {sql_literal(value, mask.output_type(raw))}"
    return f"{quote_identifier(attribute)} {op} {sql_literal(value, types.get(attribute))}"


def _column_sql(name: str, masks: dict[str, str], types: dict[str, FieldType]) -> str:
    """A projected attribute: itself, or its masked value under its own name."""
    if name not in masks:
        return quote_identifier(name)
    mask = parse_mask(masks[name])
    return f"{mask_sql(quote_identifier(name), mask, types.get(name, 'double'))} AS " \
           f"{quote_identifier(name)}"


def filter_sql(dnf: tuple[Conjunct, ...] | None, schema: StreamSchema | None = None
               ) -> str | None:
    """The WHERE condition of a DNF filter; None when every tuple passes."""
    if dnf is None:
        return None
    if not dnf:
        return "false"
    types = _types(schema)
    parts = []
    for conj in dnf:
        inner = " AND ".join(_predicate_sql(p, types) for p in conj) or "true"
        parts.append(f"({inner})" if len(dnf) > 1 and len(conj) > 1 else inner)
    return " OR ".join(parts)


def expr_sql(expr: Expr, schema: StreamSchema | None = None) -> str:
    types = _types(schema)
    if isinstance(expr, Comparison):
        return _comparison_sql(expr.attribute, expr.op, expr.value, None, types)
    if isinstance(expr, Spatial):
        return _spatial_sql(expr.to_predicate(), types)
    if isinstance(expr, Const):
        return "true" if expr.value else "false"
    if isinstance(expr, Not):
        return f"NOT ({expr_sql(expr.item, schema)})"
    if not isinstance(expr, (And, Or)):  # set membership and boxes are bound away before
        raise TypeError(f"expr_sql takes a bound condition, not {type(expr).__name__}")
    joiner = " AND " if isinstance(expr, And) else " OR "
    return joiner.join(f"({expr_sql(i, schema)})" if isinstance(i, (And, Or)) else
                       expr_sql(i, schema) for i in expr.items)


def render_sql(plan: ExecutionPlan | UnionPlan, schema: StreamSchema | None = None) -> str:
    """The plan as one Spark-SQL-like statement (tuple windows appear as a WINDOW clause comment);
    a union as one statement per grant."""
    if isinstance(plan, UnionPlan):
        parts = [f"-- union of {len(plan.plans)} grants on stream "
                 f"{quote_identifier(plan.stream)}, plan {plan.key()[:16]}: a tuple passing "
                 "several plain grants is delivered once, with the attributes of each; every "
                 "windowed grant has its own windows (rows carry `grant`)"]
        for i, member in enumerate(plan.plans):
            parts.append(f"-- grant {i}\n" + render_sql(member, schema))
        return "\n".join(parts)
    lines = [
        f"-- authorised view of stream {quote_identifier(plan.stream)}, plan {plan.key()[:16]}"
    ]
    if schema is not None:
        cols = ", ".join(f"{quote_identifier(f.name)} {f.type}" for f in schema.fields)
        lines.append(f"-- input: {quote_identifier(plan.stream)} ({cols})")
    where = filter_sql(plan.filter_dnf, schema)
    masks = dict(plan.masks)
    if masks:
        lines.append("-- masked after the filter, before anything else: "
                     + describe(plan.masks))
    types = _types(schema)
    projection = ", ".join(_column_sql(a, masks, types) for a in plan.projection) \
        or "NULL AS `nothing`"
    inner = [f"SELECT {projection}", f"FROM {quote_identifier(plan.stream)}"]
    if where is not None:
        inner.append(f"WHERE {where}")
    w = plan.window
    if w is None:
        lines.extend(inner)
        return "\n".join(lines) + ";"
    aggs = ", ".join(f"{SPARK_FUNCTIONS[a.function]}({quote_identifier(a.attribute)}) AS "
                     f"{quote_identifier(a.output_name)}" for a in w.aggregates) or "NULL"
    body = "\n".join("  " + line for line in inner)
    keys = ", ".join(quote_identifier(k) for k in w.keys)
    key_cols = f"{keys}, " if keys else ""
    having = f"HAVING count(*) >= {w.min_count}" if w.min_count > 1 else None
    if w.kind == "time":
        time_attr = quote_identifier(w.time_attribute or "timestamp")
        # the time the windows read: masked as the plan masks it (it places the tuples)
        extra = "" if w.time_attribute in plan.projection else \
            f", {_column_sql(w.time_attribute or 'timestamp', masks, types)}"
        lines.append(f"SELECT window.start AS `window_start`, window.end AS `window_end`, "
                     f"{key_cols}{aggs}")
        lines.append(f"FROM (\n  SELECT {projection}{extra}\n" +
                     "\n".join("  " + line for line in inner[1:]) + "\n) AS `authorised`")
        lines.append(f"GROUP BY window({time_attr}, '{w.size} seconds', '{w.step} seconds')"
                     + (f", {keys}" if keys else ""))
    else:
        per_key = f", per {keys}" if keys else ""
        lines.append(f"-- WINDOW TUPLES (SIZE {w.size} ADVANCE {w.step}): one row every {w.step} "
                     f"tuples{per_key}, over the last {w.size}, in arrival order")
        lines.append(f"SELECT {key_cols}{aggs}")
        lines.append(f"FROM (\n{body}\n) AS `authorised`")
        if keys:
            lines.append(f"GROUP BY {keys}")
    if having:
        lines.append(having)
    if w.privacy is not None:
        p = w.privacy
        bounds = ", ".join(f"{quote_identifier(b.attribute)} to [{b.lower}, {b.upper}]"
                           for b in p.bounds) or "none"
        lines.append(f"-- DIFFERENTIALLY PRIVATE: each window released with {p.mechanism} noise, "
                     f"epsilon {p.epsilon:g}" + (f", delta {p.delta:g}" if p.delta else "")
                     + f" per window; values clamped first ({bounds}); budgets: "
                     + "; ".join(b.text() for b in p.budgets))
    for attribute, label in w.label_bounds:
        lines.append(f"-- label scope 'all' (the owner's choice): every tuple enters the window, "
                     f"and a window is delivered only where the least upper bound of its tuples' "
                     f"{quote_identifier(attribute)} is DOMINATED_BY {quote_string(label)}")
    return "\n".join(lines) + ";"


def predicate_json(p: AnyPredicate) -> PredicateJson:
    """One plan predicate as JSON (a spatial one names its function and geometry)."""
    if isinstance(p, SpatialPredicate):
        out: SpatialJson = {"function": p.function, "attributes": [p.latitude, p.longitude],
                            "op": p.op}
        if p.function == "polygon":
            out["polygon"] = [[p.points[k], p.points[k + 1]] for k in range(0, len(p.points), 2)]
        else:
            out["metres"] = p.value
            if p.function == "distance":
                out["point"] = list(p.points)
            else:
                out["anchor"] = {"attribute": p.key, "value": p.key_value}
        return out
    if isinstance(p.value, Label):
        return {"attribute": p.attribute, "op": p.op, "label": str(p.value)}
    comparison: ComparisonJson = {"attribute": p.attribute, "op": p.op, "value": p.value}
    if p.mask:
        comparison["mask"] = p.mask  # compared on the masked value
    return comparison


def plan_to_json(plan: ExecutionPlan | JoinPlan | UnionPlan) -> AnyPlanJson:
    if isinstance(plan, JoinPlan):
        return join_plan_to_json(plan)
    if isinstance(plan, UnionPlan):
        members = [execution_plan_json(p) for p in plan.plans]
        return {"stream": plan.stream, "key": plan.key(), "union": members,
                "output": list(dict.fromkeys(
                    name for m, p in zip(members, plan.plans, strict=True) if p.window is None
                    for name in m["output"]))}
    return execution_plan_json(plan)


def execution_plan_json(plan: ExecutionPlan) -> PlanJson:
    """One stream's plan as JSON (`plan_to_json` of an `ExecutionPlan`)."""
    w = plan.window
    window: WindowJson | None = None
    if w is not None:
        window = {
            "type": w.kind, "size": w.size, "step": w.step,
            "aggregates": [{"attribute": a.attribute, "function": a.function,
                            "output": a.output_name} for a in w.aggregates],
            "time_attribute": w.time_attribute,
            "keys": list(w.keys),
            "min_count": w.min_count,
        }
        if w.privacy:
            window["privacy"] = spec_to_json(w.privacy, w.aggregates)
        if w.label_bounds:
            window["label_bounds"] = [{"attribute": a, "dominated_by": label}
                                      for a, label in w.label_bounds]
    out: PlanJson = {
        "stream": plan.stream,
        "key": plan.key(),
        "filter": None if plan.filter_dnf is None else [
            [predicate_json(p) for p in conj]
            for conj in plan.filter_dnf],
        "projection": list(plan.projection),
        "window": window,
        "output": ([*w.keys, *(a.output_name for a in w.aggregates)] if w is not None
                   else list(plan.projection)),
    }
    if plan.start_after is not None:
        out["start_after"] = plan.start_after
    if plan.masks:
        out["masks"] = masks_json(plan.masks)
    return out


def graph_to_json(graph: QueryGraph, schema: StreamSchema | None = None) -> GraphJson:
    """Operators from source to sink (joins and unions as nested inputs)."""
    def node_json(node: Node) -> OperatorJson:
        if isinstance(node, Source):
            return {"op": "source", "stream": node.stream}
        if isinstance(node, Filter):
            return {"op": "filter", "condition": expr_sql(node.condition, schema),
                    "input": node_json(node.input)}
        if isinstance(node, Map):
            return {"op": "map", "attributes": list(node.attributes),
                    "input": node_json(node.input)}
        if isinstance(node, Mask):
            return {"op": "mask", "masks": masks_json(node.masks), "input": node_json(node.input)}
        if isinstance(node, WindowAggregate):
            w = node.spec
            keys = w.keys if node.ask is None else node.ask.keys
            return {"op": "window", "type": w.kind, "size": w.size, "step": w.step,
                    "aggregates": [f"{a.attribute}:{a.function}" for a in w.aggregates],
                    "keys": list(keys or ()), "min_count": w.min_count,
                    "input": node_json(node.input)}
        if isinstance(node, Join):
            return {"op": "join", "condition": expr_sql(node.condition, schema),
                    "left": node_json(node.left), "right": node_json(node.right)}
        if isinstance(node, Union_):
            return {"op": "union", "inputs": [node_json(i) for i in node.inputs]}
        raise TypeError(f"unknown graph node {node!r}")

    try:
        _, ops = graph.pipeline()
    except ValueError:
        return {"sink": node_json(graph.sink)}
    chain: list[OperatorJson] = [{"op": "source", "stream": graph.source.stream}]
    for op in ops:
        item = node_json(op)
        item.pop("input", None)
        chain.append(item)
    return {"operators": chain}


# -- joins ----------------------------------------------------------------------------------------

def seconds_text(value: float) -> str:
    """A number of seconds as written in messages and in the text (no '.0' on whole ones)."""
    return str(int(value)) if float(value).is_integer() else repr(value)


# -- renderings -----------------------------------------------------------------------------------

def join_plan_to_json(plan: JoinPlan) -> JoinPlanJson:
    """The join as JSON: both side plans (as a single stream's), the condition, the output."""
    join: JoinJson = {
        "left": execution_plan_json(plan.left),
        "right": execution_plan_json(plan.right),
        "on": [{"left": a, "right": b} for a, b in plan.on],
        "within": plan.within,
        "time": {"left": plan.left_time, "right": plan.right_time},
    }
    if plan.label is not None:
        join["label"] = {"left": plan.label[0], "right": plan.label[1], "output": JOINED_LABEL}
    return {
        "join": join,
        "streams": list(plan.streams),
        "key": plan.key(),
        "output": list(join_output(plan)),
    }


def _time_interval(seconds: float) -> str:
    return f"INTERVAL '{seconds_text(seconds)}' SECOND"


def render_join_sql(plan: JoinPlan, left_schema: StreamSchema | None = None,
                    right_schema: StreamSchema | None = None) -> str:
    """The join as Spark-SQL-like text (never executed): each side its own authorised view."""
    ls, rs = plan.left.stream, plan.right.stream
    lq, rq = quote_identifier(ls), quote_identifier(rs)
    lines = [f"-- authorised join of {lq} and {rq}, plan {plan.key()[:16]}",
             "-- each side is that stream's own authorised view (its policy's filter, map and "
             "window applied first)"]

    def body(side_plan: ExecutionPlan, schema: StreamSchema | None) -> str:
        text = render_sql(side_plan, schema).rstrip(";")
        return "\n".join("  " + line for line in text.splitlines())

    lines.append(f"WITH {lq} AS (\n{body(plan.left, left_schema)}\n), {rq} AS (\n"
                 f"{body(plan.right, right_schema)}\n)")
    cols = [f"{lq}.{quote_identifier(n)} AS {quote_identifier(f'{ls}.{n}')}"
            for n in output_names(plan.left)]
    cols += [f"{rq}.{quote_identifier(n)} AS {quote_identifier(f'{rs}.{n}')}"
             for n in output_names(plan.right)]
    if plan.label is not None:
        cols.append(f"LUB({lq}.{quote_identifier(plan.label[0])}, "
                    f"{rq}.{quote_identifier(plan.label[1])}) AS {JOINED_LABEL}")
    lines.append("SELECT " + ",\n       ".join(cols))
    lines.append(f"FROM {lq} JOIN {rq}")
    conditions = [f"{lq}.{quote_identifier(a)} = {rq}.{quote_identifier(b)}" for a, b in plan.on]
    lt, rt = f"{lq}.{quote_identifier(plan.left_time)}", f"{rq}.{quote_identifier(plan.right_time)}"
    if plan.within == 0:
        conditions.append(f"{lt} = {rt}")
    else:
        iv = _time_interval(plan.within)
        conditions.append(f"{lt} BETWEEN {rt} - {iv} AND {rt} + {iv}")
    lines.append("  ON " + "\n AND ".join(conditions) + ";")
    return "\n".join(lines)


def join_graph_json(plan: JoinPlan, left: tuple[QueryGraph, StreamSchema],
                    right: tuple[QueryGraph, StreamSchema]) -> GraphJson:
    """The join's query graph: each side's merged graph (with its schema) under the join."""
    return {"sink": {"op": "join",
                     "on": [{"left": f"{plan.left.stream}.{a}", "right": f"{plan.right.stream}.{b}"}
                            for a, b in plan.on],
                     "within": plan.within,
                     "time": {"left": plan.left_time, "right": plan.right_time},
                     "left": graph_to_json(*left),
                     "right": graph_to_json(*right)}}
