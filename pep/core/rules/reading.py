"""Reading a XACML policy back as grants: who, which actions, which view, when.

`read_policy` understands the policies that are written the way `pep.core.rules.xacml` writes
them and the way the examples under `policies/` are written by hand: a Policy confined to its
streams by the top-level Target (resource-id string-equal), rules whose Target names subjects,
roles or subject attributes (one AnyOf, alternatives) and actions (one AnyOf), whose Condition
is a validity interval on current-dateTime and/or open stream events, and whose obligations are
the eXACML+ stream-filter, -map and -window with literal values. Anything else (PolicySets,
references, variables, advice, policy-level obligations, other functions or categories,
computed obligation values, Deny rules under an algorithm other than first-applicable, ...)
gives None: the policy is "custom XACML", and nothing is guessed.

`rule_from_xacml` is the decompiler: the sharing rule a document is, when it is exactly one
Permit rule on one stream (what the compiler produces, or a hand-edited policy still of that
shape), else None. Compiling what it returns gives a policy that decides like the document.
"""
from __future__ import annotations

from dataclasses import dataclass

from lxml import etree

from common.xmlsafe import UnsafeDocumentError, parse_xml
from pep.core.masks import MaskError, parse_mask
from pep.core.obligations import (
    FILTER_CONDITION,
    FILTER_IDS,
    GRANT_OPTION_IDS,
    MAP_ATTRIBUTE,
    MAP_IDS,
    MASK_ATTRIBUTE,
    MASK_IDS,
    PREFIXES,
    WINDOW_ATTR,
    WINDOW_IDS,
    WINDOW_KEY,
    WINDOW_MIN_COUNT,
    WINDOW_PREFILTER,
    WINDOW_SIZE,
    WINDOW_STEP,
    WINDOW_TYPE,
    parse_window_kind,
    parse_window_number,
)
from pep.core.rules.model import (
    AttributeMatch,
    RuleError,
    RuleWindow,
    SharingRule,
    Validity,
    Who,
    parse_instant,
    rule_from_json,
    rule_to_json,
)
from pep.core.rules.xacml import (
    ACTION,
    ACTION_ID,
    AND,
    BOOLEAN,
    BOOLEAN_IS_IN,
    CURRENT_DATETIME,
    DATETIME,
    DATETIME_GE,
    DATETIME_LT,
    DATETIME_ONE,
    DOUBLE,
    ENVIRONMENT,
    EQUAL,
    INTEGER,
    NS,
    RESOURCE,
    RESOURCE_ID,
    ROLE,
    STRING,
    SUBJECT,
    SUBJECT_ID,
)

RULE_ALGS = "rule-combining-algorithm:"
# Algorithms under which a policy of Permit rules is read rule by rule. Deny rules are read only
# under first-applicable, where their order says what they do.
PERMIT_ALGS = {"first-applicable", "deny-overrides", "ordered-deny-overrides", "permit-overrides",
               "ordered-permit-overrides", "deny-unless-permit"}


class Unreadable(Exception):
    """This part of the policy is not one of the shapes read here."""


@dataclass(frozen=True)
class GrantReading:
    """One rule of a policy, read."""

    effect: str  # "Permit" | "Deny"
    who: Who  # anyone=True: the rule's Target does not name its subjects
    actions: tuple[str, ...]  # (): any action
    filters: tuple[str, ...] = ()  # several: all apply
    maps: tuple[tuple[str, ...], ...] = ()  # several: intersected
    windows: tuple[RuleWindow, ...] = ()
    valid: Validity | None = None
    events: tuple[str, ...] = ()
    description: str | None = None
    masks: tuple[tuple[str, str], ...] = ()  # (attributes, canonical mask spec); all apply
    grant_option: bool = False  # the stream-grant-option obligation

    @property
    def attributes(self) -> tuple[str, ...] | None:
        """The attributes shown, None for every attribute."""
        if not self.maps:
            return None
        shown = [n for n in self.maps[0] if all(n.lower() in {m.lower() for m in other}
                                                for other in self.maps[1:])]
        return tuple(shown)


@dataclass(frozen=True)
class PolicyReading:
    id: str
    version: str
    streams: tuple[str, ...]
    combining: str  # the algorithm's short name (first-applicable, deny-overrides, ...)
    grants: tuple[GrantReading, ...]
    description: str | None = None


_PREFIX = f"{{{NS}}}"
_PREFIX_LENGTH = len(_PREFIX)


def _local(element: etree._Element) -> str | None:
    tag = element.tag
    if tag.__class__ is not str or not tag.startswith(_PREFIX):
        return None
    return tag[_PREFIX_LENGTH:]


def _children(element: etree._Element) -> list[etree._Element]:
    """Element children; a child outside the XACML namespace makes the element unreadable."""
    out = []
    for child in element:
        if not isinstance(child.tag, str):
            continue  # comments, processing instructions
        if _local(child) is None:
            raise Unreadable("an element outside the XACML namespace")
        out.append(child)
    return out


def _attr(element: etree._Element, name: str) -> str:
    return (element.get(name) or "").strip()


def _text(element: etree._Element) -> str:
    return "".join(element.itertext())


def _designator(element: etree._Element) -> tuple[str, str, str]:
    """(category, attribute id, data type) of a designator that is False/empty when absent."""
    if _local(element) != "AttributeDesignator" or _children(element):
        raise Unreadable("not an attribute designator")
    if _attr(element, "MustBePresent") not in ("", "false", "0") or element.get("Issuer"):
        raise Unreadable("a designator that must be present or has an issuer")
    return _attr(element, "Category"), _attr(element, "AttributeId"), _attr(element, "DataType")


def _value(element: etree._Element) -> tuple[str, str]:
    if _local(element) != "AttributeValue" or _children(element):
        raise Unreadable("not a literal value")
    if set(element.attrib) != {"DataType"}:
        raise Unreadable("a value with other attributes")
    return _attr(element, "DataType"), _text(element)


def _match(all_of: etree._Element) -> tuple[str, str, str, str]:
    """The single Match of an AllOf: (category, attribute id, data type, literal)."""
    matches = _children(all_of)
    if len(matches) != 1 or _local(matches[0]) != "Match":
        raise Unreadable("an AllOf of several matches")
    parts = _children(matches[0])
    if len(parts) != 2:
        raise Unreadable("a match of other parts")
    datatype, literal = _value(parts[0])
    category, attribute_id, designated = _designator(parts[1])
    if designated != datatype or _attr(matches[0], "MatchId") != EQUAL.get(datatype):
        raise Unreadable("a match that is not an equality")
    return category, attribute_id, datatype, literal


def _typed(datatype: str, literal: str) -> str | int | float | bool:
    text = literal.strip()
    try:
        if datatype == INTEGER:
            return int(text)
        if datatype == DOUBLE:
            return float(text)
        if datatype == BOOLEAN:
            if text in ("true", "1"):
                return True
            if text in ("false", "0"):
                return False
            raise Unreadable("a boolean literal")
    except ValueError:
        raise Unreadable("a numeric literal") from None
    return literal


def _any_of(any_of: etree._Element) -> tuple[str, list[tuple[str, str, str, str]]]:
    all_ofs = _children(any_of)
    if not all_ofs or any(_local(a) != "AllOf" for a in all_ofs):
        raise Unreadable("an AnyOf of other parts")
    matches = [_match(a) for a in all_ofs]
    categories = {m[0] for m in matches}
    if len(categories) != 1:
        raise Unreadable("an AnyOf over several categories")
    return categories.pop(), matches


def _streams(target: etree._Element) -> tuple[str, ...]:
    any_ofs = _children(target)
    if len(any_ofs) != 1 or _local(any_ofs[0]) != "AnyOf":
        raise Unreadable("the policy's Target is not one AnyOf of streams")
    category, matches = _any_of(any_ofs[0])
    if category != RESOURCE or any(m[1] != RESOURCE_ID or m[2] != STRING for m in matches):
        raise Unreadable("the policy's Target is not about stream names")
    return tuple(dict.fromkeys(m[3] for m in matches))


def _rule_target(target: etree._Element | None) -> tuple[Who, tuple[str, ...]]:
    who: Who | None = None
    actions: tuple[str, ...] | None = None
    for any_of in (_children(target) if target is not None else []):
        if _local(any_of) != "AnyOf":
            raise Unreadable("a Target that is not AnyOfs")
        category, matches = _any_of(any_of)
        if category == ACTION and actions is None:
            if any(m[1] != ACTION_ID or m[2] != STRING for m in matches):
                raise Unreadable("an action match on another attribute")
            actions = tuple(m[3] for m in matches)
        elif category == SUBJECT and who is None:
            who = _who(matches)
        else:
            raise Unreadable("a Target AnyOf that is neither who nor actions")
    return (who or Who(anyone=True)), (actions or ())


def _who(matches: list[tuple[str, str, str, str]]) -> Who:
    subjects: list[str] = []
    roles: list[str] = []
    attributes: list[AttributeMatch] = []
    for _, attribute_id, datatype, literal in matches:
        if attribute_id == SUBJECT_ID and datatype == STRING:
            subjects.append(literal)
        elif attribute_id == ROLE and datatype == STRING:
            roles.append(literal)
        else:
            attributes.append(AttributeMatch(attribute_id, _typed(datatype, literal)))
    return Who(tuple(subjects), tuple(roles), tuple(attributes))


def _condition(condition: etree._Element | None, streams: tuple[str, ...]
               ) -> tuple[Validity | None, tuple[str, ...]]:
    if condition is None:
        return None, ()
    parts = _children(condition)
    if len(parts) != 1 or _local(parts[0]) != "Apply":
        raise Unreadable("a Condition of another shape")
    applies = [parts[0]]
    if _attr(parts[0], "FunctionId") == AND:
        applies = _children(parts[0])
        if len(applies) < 2:
            raise Unreadable("an and of fewer than two parts")
    start = end = None
    events: list[str] = []
    for apply in applies:
        if _local(apply) != "Apply":
            raise Unreadable("a Condition part that is not a function")
        function = _attr(apply, "FunctionId")
        args = _children(apply)
        if function == BOOLEAN_IS_IN and len(args) == 2:
            if _value(args[0]) != (BOOLEAN, "true"):
                raise Unreadable("boolean-is-in of another value")
            category, attribute_id, datatype = _designator(args[1])
            event = _event_name(attribute_id, streams)
            if category != ENVIRONMENT or datatype != BOOLEAN or event is None or event in events:
                raise Unreadable("boolean-is-in over another attribute")
            events.append(event)
        elif function in (DATETIME_GE, DATETIME_LT) and len(args) == 2:
            one = args[0]
            inner = _children(one)
            if _local(one) != "Apply" or _attr(one, "FunctionId") != DATETIME_ONE \
                    or len(inner) != 1:
                raise Unreadable("a time comparison of another shape")
            if _designator(inner[0]) != (ENVIRONMENT, CURRENT_DATETIME, DATETIME):
                raise Unreadable("a time comparison on another attribute")
            datatype, literal = _value(args[1])
            if datatype != DATETIME:
                raise Unreadable("a time comparison with another type")
            try:
                instant = parse_instant(literal, "")
            except RuleError:
                raise Unreadable("a time bound of another form") from None
            if function == DATETIME_GE and start is None:
                start = instant
            elif function == DATETIME_LT and end is None:
                end = instant
            else:
                raise Unreadable("two bounds on the same side")
        else:
            raise Unreadable(f"a Condition function this reading does not know ({function})")
    return (Validity(start, end) if start or end else None), tuple(events)


def _event_name(attribute_id: str, streams: tuple[str, ...]) -> str | None:
    for stream in streams:
        prefix = f"urn:xsg:event:{stream}:"
        if attribute_id.startswith(prefix) and ":" not in attribute_id[len(prefix):]:
            return attribute_id[len(prefix):]
    return None


def _assignments(obligation: etree._Element, allowed: tuple[str, ...]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {name: [] for name in allowed}
    for assignment in _children(obligation):
        if _local(assignment) != "AttributeAssignmentExpression" or \
                set(assignment.attrib) - {"AttributeId"}:
            raise Unreadable("an obligation part of another shape")
        attribute_id = _attr(assignment, "AttributeId")
        suffix = next((attribute_id[len(p):] for p in PREFIXES
                       if attribute_id.lower().startswith(p)), None)
        if suffix not in found:
            raise Unreadable("an obligation attribute the PEP does not know")
        values = _children(assignment)
        if len(values) != 1:
            raise Unreadable("a computed obligation value")
        _, text = _value(values[0])
        found[suffix].append(text.strip())
    return found


def _window(found: dict[str, list[str]]) -> RuleWindow:
    for name in (WINDOW_TYPE, WINDOW_SIZE, WINDOW_STEP):
        if len(found[name]) != 1:
            raise Unreadable("a window without exactly one type, size and step")
    if not found[WINDOW_ATTR] or len(found[WINDOW_MIN_COUNT]) > 1:
        raise Unreadable("a window without aggregates")
    try:
        kind = parse_window_kind(found[WINDOW_TYPE][0])
        size = parse_window_number(found[WINDOW_SIZE][0], "size")
        step = parse_window_number(found[WINDOW_STEP][0], "step")
        min_count = parse_window_number(found[WINDOW_MIN_COUNT][0], "minimum count") \
            if found[WINDOW_MIN_COUNT] else None
    except ValueError:
        raise Unreadable("a window value the PEP refuses") from None
    return RuleWindow(kind, size, step, tuple(found[WINDOW_ATTR]), min_count,
                      tuple(found[WINDOW_KEY]), tuple(found[WINDOW_PREFILTER]))


def _mask(text: str) -> tuple[str, str]:
    """`attributes:mask` as (attributes, canonical spec); the attributes are checked against
    the stream when the policy is written."""
    names, sep, spec = text.partition(":")
    names = ",".join(n.strip() for n in names.split(","))
    if not sep or not all(names.split(",")):
        raise Unreadable("a mask without its attribute")
    try:
        return names, parse_mask(spec).spec
    except MaskError:
        raise Unreadable("a mask the PEP refuses") from None


@dataclass(frozen=True)
class _Obligations:
    """A rule's stream obligations, read."""

    filters: tuple[str, ...]
    maps: tuple[tuple[str, ...], ...]
    windows: tuple[RuleWindow, ...]
    masks: tuple[tuple[str, str], ...]
    grant_option: bool


def _obligations(expressions: etree._Element | None, effect: str) -> _Obligations:
    filters: list[str] = []
    maps: list[tuple[str, ...]] = []
    windows: list[RuleWindow] = []
    masks: list[tuple[str, str]] = []
    option = False
    for obligation in (_children(expressions) if expressions is not None else []):
        if _local(obligation) != "ObligationExpression" or effect != "Permit" or \
                _attr(obligation, "FulfillOn") != "Permit":
            raise Unreadable("an obligation of another kind")
        obligation_id = _attr(obligation, "ObligationId")
        if obligation_id in FILTER_IDS:
            values = _assignments(obligation, (FILTER_CONDITION,))[FILTER_CONDITION]
            if not values:
                raise Unreadable("a filter without a condition")
            filters.extend(values)
        elif obligation_id in MAP_IDS:
            values = _assignments(obligation, (MAP_ATTRIBUTE,))[MAP_ATTRIBUTE]
            if not values:
                raise Unreadable("a map without attributes")
            maps.append(tuple(dict.fromkeys(values)))
        elif obligation_id in WINDOW_IDS:
            windows.append(_window(_assignments(obligation, (
                WINDOW_TYPE, WINDOW_SIZE, WINDOW_STEP, WINDOW_ATTR, WINDOW_MIN_COUNT,
                WINDOW_PREFILTER, WINDOW_KEY))))
        elif obligation_id in MASK_IDS:
            values = _assignments(obligation, (MASK_ATTRIBUTE,))[MASK_ATTRIBUTE]
            if not values:
                raise Unreadable("a mask obligation without masks")
            masks.extend(_mask(v) for v in values)
        elif obligation_id in GRANT_OPTION_IDS:
            if _children(obligation) or option:
                raise Unreadable("a grant option with attributes, or twice")
            option = True
        else:
            raise Unreadable(f"obligation {obligation_id!r}")
    return _Obligations(tuple(filters), tuple(maps), tuple(windows), tuple(masks), option)


def _grant(rule: etree._Element, streams: tuple[str, ...]) -> GrantReading:
    effect = _attr(rule, "Effect")
    if effect not in ("Permit", "Deny"):
        raise Unreadable("a rule effect")
    parts: dict[str, etree._Element] = {}
    for child in _children(rule):
        name = _local(child) or ""
        if name not in ("Description", "Target", "Condition", "ObligationExpressions") \
                or name in parts:
            raise Unreadable(f"a rule's {name}")
        parts[name] = child
    who, actions = _rule_target(parts.get("Target"))
    valid, events = _condition(parts.get("Condition"), streams)
    found = _obligations(parts.get("ObligationExpressions"), effect)
    description = _text(parts["Description"]).strip() if "Description" in parts else None
    return GrantReading(effect, who, actions, found.filters, found.maps, found.windows, valid,
                        events, description or None, found.masks, found.grant_option)


def read_document(root: etree._Element) -> PolicyReading | None:
    """A parsed policy document read as grants; None when it is custom XACML."""
    try:
        if _local(root) != "Policy":
            return None
        algorithm = _attr(root, "RuleCombiningAlgId")
        combining = algorithm.split(RULE_ALGS, 1)[1] if RULE_ALGS in algorithm else algorithm
        parts = _children(root)
        names = [_local(p) for p in parts]
        description = None
        streams: tuple[str, ...] | None = None
        grants: list[GrantReading] = []
        for part, name in zip(parts, names, strict=True):
            if name == "Description" and description is None and not grants and streams is None:
                description = _text(part).strip() or None
            elif name == "Target" and streams is None and not grants:
                streams = _streams(part)
            elif name == "Rule" and streams is not None:
                grants.append(_grant(part, streams))
            else:
                return None
        if streams is None or not grants:
            return None
        if combining != "first-applicable" and (combining not in PERMIT_ALGS or any(
                g.effect == "Deny" for g in grants)):
            return None
        return PolicyReading(_attr(root, "PolicyId"), _attr(root, "Version"), streams,
                             combining, tuple(grants), description)
    except Unreadable:
        return None


def read_policy(data: bytes) -> PolicyReading | None:
    """`read_document` of a XACML document's bytes; None for custom or unparsable XACML."""
    try:
        return read_document(parse_xml(data))
    except UnsafeDocumentError:
        return None


def rule_from_reading(reading: PolicyReading) -> SharingRule | None:
    """The sharing rule a reading is, when it is one Permit rule on one stream."""
    if len(reading.streams) != 1 or len(reading.grants) != 1:
        return None
    grant = reading.grants[0]
    if grant.effect != "Permit" or len(grant.filters) > 1 or len(grant.maps) > 1 \
            or len(grant.windows) > 1:
        return None
    description = reading.description or grant.description
    candidate = SharingRule(
        id=reading.id, stream=reading.streams[0], who=grant.who, actions=grant.actions,
        filter=grant.filters[0] if grant.filters else None,
        attributes=grant.maps[0] if grant.maps else (),
        window=grant.windows[0] if grant.windows else None, valid=grant.valid,
        events=grant.events, description=description, version=reading.version,
        masks=grant.masks, grant_option=grant.grant_option)
    try:
        checked = rule_from_json(rule_to_json(candidate))
    except RuleError:
        return None
    # a rule says exactly what the policy says, or it is not that policy's rule
    if checked != candidate or rule_to_json(checked) != rule_to_json(candidate):
        return None
    return checked


def rule_from_xacml(data: bytes) -> SharingRule | None:
    """The decompiler: the sharing rule a XACML document is, or None (its form is "xacml" or
    "custom": `pep.core.rules.summary.describe_policy`)."""
    reading = read_policy(data)
    return rule_from_reading(reading) if reading is not None else None


__all__ = ["read_policy", "read_document", "rule_from_xacml", "rule_from_reading",
           "PolicyReading", "GrantReading"]
