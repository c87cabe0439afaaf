"""What a plan outputs: its output names, their types, and which attribute each is a value of.

Shared by the join (`pep.core.join`: which outputs a join condition may name, and the NR analysis
of it) and the renderings (`pep.core.explain`: a join's SQL-like text and JSON), so neither needs
the other for it. A plain plan outputs its projection; a windowed one window_start, window_end,
its group-by keys and its aggregates.
"""
from __future__ import annotations

from pep.core.masks import parse_mask
from pep.core.plan import ExecutionPlan, JoinPlan, StreamSchema

# Aggregates whose every value is a value of the attribute aggregated (so a filter on the
# attribute bounds them)
ORDER_PRESERVING = frozenset({"min", "max", "firstval", "lastval"})


# -- what a side shows ----------------------------------------------------------------------------

def _aggregate_type(function: str, attribute_type: str) -> str:
    if function == "count":
        return "long"
    if function == "avg":
        return "double"
    return attribute_type


def side_outputs(plan: ExecutionPlan, schema: StreamSchema) -> dict[str, str]:
    """The side's output attributes and their types, in output order: the projection of a plain
    side; window_start, window_end, group-by keys and aggregates of a windowed one."""
    masks = dict(plan.masks)

    def type_of(name: str) -> str:
        field = schema.lookup(name)
        kind = field.type if field is not None else "double"
        if field is not None and field.name in masks:  # a hashed value is text
            return parse_mask(masks[field.name]).output_type(kind)
        return kind

    w = plan.window
    if w is None:
        return {a: type_of(a) for a in plan.projection}
    bound = "timestamp" if w.time_attribute is None or type_of(w.time_attribute) == "timestamp" \
        else "double"
    out = {"window_start": bound, "window_end": bound}
    for key in w.keys:
        out[key] = type_of(key)
    for agg in w.aggregates:
        out[agg.output_name] = _aggregate_type(agg.function, type_of(agg.attribute))
    return out


def output_names(plan: ExecutionPlan) -> tuple[str, ...]:
    """The side's output names (no schema needed)."""
    w = plan.window
    if w is None:
        return tuple(plan.projection)
    return ("window_start", "window_end", *w.keys, *(a.output_name for a in w.aggregates))


def output_source(plan: ExecutionPlan, name: str) -> str | None:
    """The attribute whose every value an output is (so the side's filter constrains it). A
    masked attribute's outputs are masked values, which the filter's comparisons on the raw
    value do not bound: None (never an NR claimed from them)."""
    source = _output_source(plan, name)
    return None if source in dict(plan.masks) else source


def _output_source(plan: ExecutionPlan, name: str) -> str | None:
    w = plan.window
    if w is None:
        return name if name in plan.projection else None
    if name in w.keys:
        return name
    for agg in w.aggregates:
        if agg.output_name == name and agg.function in ORDER_PRESERVING:
            return agg.attribute
    return None


JOINED_LABEL = "label"  # a joined row's label (no side's output: those are `<stream>.<name>`)


def join_output(plan: JoinPlan) -> tuple[str, ...]:
    """A result row's attribute names: both sides' outputs, `<stream>.<output>`, then `label`
    when the join labels its rows (`pep.core.join.joined_label`)."""
    return (tuple(plan.output_name("left", n) for n in output_names(plan.left))
            + tuple(plan.output_name("right", n) for n in output_names(plan.right))
            + ((JOINED_LABEL,) if plan.label is not None else ()))


__all__ = ["ORDER_PRESERVING", "JOINED_LABEL", "side_outputs", "output_names", "output_source",
           "join_output"]
