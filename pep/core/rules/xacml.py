"""A sharing rule compiled to one standard XACML 3.0 Policy, as an owner would write it by hand.

The shape (`pep.core.rules.reading` reads it back, and any policy of the same shape):

    <Policy PolicyId=id Version=version RuleCombiningAlgId=first-applicable>
      <Description>description</Description>
      <Target>  one AnyOf: resource-id string-equal the stream (MustBePresent="false"): the
                owner-confinement proof of `pdp.policy_scope`, so that a stream owner may store it
      <Rule RuleId="<id>:grant" Effect="Permit">
        <Target>  an AnyOf of the `who` alternatives (subject-id, role, or an access-subject
                  attribute, each `<type>-equal`), an AnyOf of the actions (action-id)
        <Condition>  and(current-dateTime >= from, current-dateTime < until,
                         boolean-is-in(true, urn:xsg:event:<stream>:<event>) ...)
        <ObligationExpressions>  exacml:obligation:stream-filter, -map, -mask, -window with
                                 the eXACML+ attribute ids (pep.core.obligations), and
                                 exacml:obligation:stream-grant-option (no attribute) when
                                 the rule gives the grant option

No catch-all Deny rule: under the root's deny-overrides a Deny in one owner's rule would
override another rule's Permit on the same stream; a caller no rule names is NotApplicable,
which the gateway denies anyway.
"""
from __future__ import annotations

import re

from lxml import etree

from pdp import (
    ACCESS_SUBJECT as SUBJECT,
    ACTION,
    ACTION_ID,
    CURRENT_DATETIME,
    ENVIRONMENT,
    FUNCTION_PREFIX as FN,
    RESOURCE,
    RESOURCE_ID,
    STRING,
    SUBJECT_ID,
    SUBJECT_ROLE as ROLE,
    XACML_NS as NS,
)
from pep.core.obligations import (
    FILTER_CONDITION,
    GRANT_OPTION_ID,
    MAP_ATTRIBUTE,
    MASK_ATTRIBUTE,
    WINDOW_ATTR,
    WINDOW_KEY,
    WINDOW_MIN_COUNT,
    WINDOW_PREFILTER,
    WINDOW_SIZE,
    WINDOW_STEP,
    WINDOW_TYPE,
)
from pep.core.rules.model import AttributeMatch, SharingRule

FIRST_APPLICABLE = "urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable"
XS = "http://www.w3.org/2001/XMLSchema#"
INTEGER = XS + "integer"
DOUBLE = XS + "double"
BOOLEAN = XS + "boolean"
DATETIME = XS + "dateTime"
EQUAL = {STRING: FN + "string-equal", INTEGER: FN + "integer-equal", DOUBLE: FN + "double-equal",
         BOOLEAN: FN + "boolean-equal"}
AND = FN + "and"
DATETIME_ONE = FN + "dateTime-one-and-only"
DATETIME_GE = FN + "dateTime-greater-than-or-equal"
DATETIME_LT = FN + "dateTime-less-than"
BOOLEAN_IS_IN = FN + "boolean-is-in"
FILTER_ID = "exacml:obligation:stream-filter"
MAP_ID = "exacml:obligation:stream-map"
WINDOW_ID = "exacml:obligation:stream-window"
MASK_ID = "exacml:obligation:stream-mask"
PREFIX = "exacml:obligation:"


def event_attribute(stream: str, event: str) -> str:
    """The environment attribute the gateway sets while a stream event is open."""
    return f"urn:xsg:event:{stream}:{event}"


def datatype_of(value: object) -> str:
    if isinstance(value, bool):
        return BOOLEAN
    if isinstance(value, int):
        return INTEGER
    if isinstance(value, float):
        return DOUBLE
    return STRING


def lexical(value: object) -> str:
    """The XSD lexical form of a typed value, as the gateway writes the caller's attributes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _el(parent: etree._Element | None, tag: str, **attributes: str) -> etree._Element:
    name = f"{{{NS}}}{tag}"
    if parent is None:  # the root: XACML is the default namespace (no `ns0:` prefixes)
        return etree.Element(name, attributes, nsmap={None: NS})
    return etree.SubElement(parent, name, attributes)


def _value(parent: etree._Element, datatype: str, text: str) -> etree._Element:
    value = _el(parent, "AttributeValue", DataType=datatype)
    value.text = text
    return value


def _designator(parent: etree._Element, category: str, attribute_id: str,
                datatype: str) -> etree._Element:
    return _el(parent, "AttributeDesignator", Category=category, AttributeId=attribute_id,
               DataType=datatype, MustBePresent="false")


def _match_all_of(any_of: etree._Element, category: str, attribute_id: str, datatype: str,
                  text: str) -> None:
    match = _el(_el(any_of, "AllOf"), "Match", MatchId=EQUAL[datatype])
    _value(match, datatype, text)
    _designator(match, category, attribute_id, datatype)


def _who(target: etree._Element, rule: SharingRule) -> None:
    if rule.who.anyone:
        return
    any_of = _el(target, "AnyOf")
    for subject in rule.who.subjects:
        _match_all_of(any_of, SUBJECT, SUBJECT_ID, STRING, subject)
    for role in rule.who.roles:
        _match_all_of(any_of, SUBJECT, ROLE, STRING, role)
    for match in rule.who.attributes:
        _attribute(any_of, match)


def _attribute(any_of: etree._Element, match: AttributeMatch) -> None:
    datatype = datatype_of(match.value)
    _match_all_of(any_of, SUBJECT, match.id, datatype, lexical(match.value))


def _condition(rule_element: etree._Element, rule: SharingRule) -> None:
    parts: list[tuple[str, str, str | None]] = []  # (function, datatype or event, literal)
    if rule.valid is not None and rule.valid.start is not None:
        parts.append((DATETIME_GE, DATETIME, rule.valid.start))
    if rule.valid is not None and rule.valid.end is not None:
        parts.append((DATETIME_LT, DATETIME, rule.valid.end))
    for event in rule.events:
        parts.append((BOOLEAN_IS_IN, event, None))
    if not parts:
        return
    condition = _el(rule_element, "Condition")
    parent = _el(condition, "Apply", FunctionId=AND) if len(parts) > 1 else condition
    for function, what, literal in parts:
        apply = _el(parent, "Apply", FunctionId=function)
        if function == BOOLEAN_IS_IN:
            _value(apply, BOOLEAN, "true")
            _designator(apply, ENVIRONMENT, event_attribute(rule.stream, what), BOOLEAN)
        else:
            one = _el(apply, "Apply", FunctionId=DATETIME_ONE)
            _designator(one, ENVIRONMENT, CURRENT_DATETIME, DATETIME)
            _value(apply, DATETIME, literal or "")


def _assign(obligation: etree._Element, suffix: str, datatype: str, text: str) -> None:
    assignment = _el(obligation, "AttributeAssignmentExpression", AttributeId=PREFIX + suffix)
    _value(assignment, datatype, text)


def _obligations(rule_element: etree._Element, rule: SharingRule) -> None:
    if rule.filter is None and not rule.attributes and rule.window is None and not rule.masks \
            and not rule.grant_option:
        return
    expressions = _el(rule_element, "ObligationExpressions")
    if rule.filter is not None:
        ob = _el(expressions, "ObligationExpression", ObligationId=FILTER_ID, FulfillOn="Permit")
        _assign(ob, FILTER_CONDITION, STRING, rule.filter)
    if rule.attributes:
        ob = _el(expressions, "ObligationExpression", ObligationId=MAP_ID, FulfillOn="Permit")
        for name in rule.attributes:
            _assign(ob, MAP_ATTRIBUTE, STRING, name)
    if rule.masks:
        ob = _el(expressions, "ObligationExpression", ObligationId=MASK_ID, FulfillOn="Permit")
        for names, spec in rule.masks:
            _assign(ob, MASK_ATTRIBUTE, STRING, f"{names}:{spec}")
    if rule.window is not None:
        w = rule.window
        ob = _el(expressions, "ObligationExpression", ObligationId=WINDOW_ID, FulfillOn="Permit")
        _assign(ob, WINDOW_TYPE, STRING, w.type)
        _assign(ob, WINDOW_SIZE, INTEGER, str(w.size))
        _assign(ob, WINDOW_STEP, INTEGER, str(w.step))
        for aggregate in w.aggregates:
            _assign(ob, WINDOW_ATTR, STRING, aggregate)
        if w.min_count is not None:
            _assign(ob, WINDOW_MIN_COUNT, INTEGER, str(w.min_count))
        for key in w.group_by:
            _assign(ob, WINDOW_KEY, STRING, key)
        for name in w.filterable:
            _assign(ob, WINDOW_PREFILTER, STRING, name)
    if rule.grant_option:
        _el(expressions, "ObligationExpression", ObligationId=GRANT_OPTION_ID,
            FulfillOn="Permit")


def rule_to_xacml(rule: SharingRule) -> bytes:
    """The XACML 3.0 Policy document of a rule (UTF-8, indented)."""
    policy = _el(None, "Policy", PolicyId=rule.id, Version=rule.version,
                 RuleCombiningAlgId=FIRST_APPLICABLE)
    if rule.description:
        _el(policy, "Description").text = rule.description
    target = _el(policy, "Target")
    _match_all_of(_el(target, "AnyOf"), RESOURCE, RESOURCE_ID, STRING, rule.stream)
    grant = _el(policy, "Rule", RuleId=f"{rule.id}:grant", Effect="Permit")
    rule_target = _el(grant, "Target")
    _who(rule_target, rule)
    if rule.actions:
        any_of = _el(rule_target, "AnyOf")
        for action in rule.actions:
            _match_all_of(any_of, ACTION, ACTION_ID, STRING, action)
    _condition(grant, rule)
    _obligations(grant, rule)
    document = etree.ElementTree(policy)
    etree.indent(document, space="  ")
    text = etree.tostring(document, xml_declaration=True, encoding="UTF-8").decode("utf-8")
    return "\n".join(_wrap(line) for line in text.split("\n")).encode("utf-8") + b"\n"


# A start tag and its attributes (values never hold a raw `"`: lxml writes `&quot;`).
_START_TAG = re.compile(r'^(\s*<[\w:]+)((?: [\w:]+="[^"]*")+)(/?>.*)$')
_ATTRIBUTE = re.compile(r' [\w:]+="[^"]*"')
WIDTH = 100


def _wrap(line: str) -> str:
    """A long start tag with one attribute per line, aligned, as the examples are written."""
    match = _START_TAG.match(line)
    if len(line) <= WIDTH or match is None:
        return line
    head, attributes, tail = match.groups()
    parts: list[str] = _ATTRIBUTE.findall(attributes)
    if len(parts) < 2:
        return line
    indent = " " * (len(head) + 1)
    return head + parts[0] + "".join("\n" + indent + p[1:] for p in parts[1:]) + tail


__all__ = ["rule_to_xacml", "event_attribute", "datatype_of", "lexical", "NS",
           "FIRST_APPLICABLE",
           # the vocabulary of the shape, which `pep.core.rules.reading` reads back
           "SUBJECT", "ROLE", "SUBJECT_ID", "ACTION", "ACTION_ID", "RESOURCE", "RESOURCE_ID",
           "ENVIRONMENT", "CURRENT_DATETIME", "STRING", "INTEGER", "DOUBLE", "BOOLEAN",
           "DATETIME", "EQUAL", "AND", "DATETIME_ONE", "DATETIME_GE", "DATETIME_LT",
           "BOOLEAN_IS_IN"]
