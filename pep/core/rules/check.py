"""A sharing rule checked against the stream it is about, field by field.

The compiled policy is checked again, like any policy, when it is written (the obligation
vocabulary against the stream's schema: `pep.streams.policy_check`); this check comes first so
that a mistake is reported at the rule's own field (`/window/aggregates/1`) rather than at a
line of XACML the owner never wrote. Placeholders (`{subject:clearance}`) are checked for their
syntax and the attribute they are compared with; what they stand for is known at decision time.
"""
from __future__ import annotations

from collections.abc import Collection

from pep.core.conditions import ConditionError, parse_condition
from pep.core.masks import MaskError, parse_assignment
from pep.core.obligations import parse_aggregate
from pep.core.plan import StreamDefinition, StreamSchema
from pep.core.rules.model import RuleError, SharingRule


def _placeholder(category: str, attribute: str) -> list[str]:
    # as pep.streams.policy_check: "0" reads as every type, six times for a polygon's bag
    return ["0"] * 6


def _attribute(schema: StreamSchema, stream: str, name: str, path: str) -> str:
    field = schema.lookup(name)
    if field is None:
        raise RuleError(path, f"stream {stream!r} has no attribute {name!r}; it has: "
                              f"{', '.join(schema.names)}")
    return field.name


def check_rule(rule: SharingRule, stream: StreamDefinition,
               events: Collection[str] | None = None) -> list[str]:
    """Warnings for a rule that fits `stream`; RuleError (naming the field) when it does not.
    `events`: the names of the stream's defined events, when known."""
    schema = stream.schema
    if rule.stream != stream.name:
        raise RuleError("/stream", f"stream names are matched exactly: {rule.stream!r} is "
                                   f"registered as {stream.name!r}")
    if rule.filter is not None:
        try:
            parse_condition(rule.filter, schema, resolver=_placeholder)
        except ConditionError as exc:
            raise RuleError("/filter", exc.message) from None
    for i, name in enumerate(rule.attributes):
        _attribute(schema, stream.name, name, f"/attributes/{i}")
    for names, spec in rule.masks:
        try:
            parse_assignment(f"{names}:{spec}", schema)
        except MaskError as exc:
            raise RuleError(f"/mask/{names.replace('~', '~0').replace('/', '~1')}",
                            str(exc)) from None
    if rule.window is not None:
        w = rule.window
        if w.type == "time" and not stream.time_attribute:
            raise RuleError("/window/type", f"stream {stream.name!r} has no time attribute, so "
                                            "it has no time windows; use a tuple window")
        for i, text in enumerate(w.aggregates):
            try:
                parse_aggregate(text, schema)
            except ValueError as exc:
                raise RuleError(f"/window/aggregates/{i}", str(exc)) from None
        for i, name in enumerate(w.group_by):
            _attribute(schema, stream.name, name, f"/window/group_by/{i}")
        for i, name in enumerate(w.filterable):
            _attribute(schema, stream.name, name, f"/window/filterable/{i}")
    warnings = []
    if events is not None:
        for name in rule.events:
            if name not in events:
                warnings.append(f"/events: stream {stream.name!r} has no event {name!r} yet: "
                                "the rule grants nothing until the owner defines it and it "
                                "opens")
    return warnings


__all__ = ["check_rule"]
