"""Which resources a policy document can possibly apply to, proven from its top-level Target.

Delegating policy administration (a stream owner writes the policies of its own streams) is only
safe when a delegate's policy cannot reach anything else: under the root combining algorithm a
Permit or a Deny in one owner's policy would otherwise decide requests for another owner's
stream. `confined_resource_ids` gives the set S of resource ids a document is confined to, or
None when confinement cannot be proven. This module knows nothing of streams: the caller decides
what the ids in S must be (for the gateway: streams that the caller owns).

Why the rule is sound (XACML 3.0 core, section 7.7 and tables 2-4, 7 and 8): a Target is the AND
of its AnyOfs and is "No match" as soon as one AnyOf is "No match"; an AnyOf is the OR of its
AllOfs and is "No match" when every AllOf is; an AllOf is the AND of its Matches and is "No
match" as soon as one Match is False, whatever the others give (even Indeterminate). A Match
with string-equal, a string literal and a designator on the resource-id is False for every
request none of whose resource-id values equals the literal: string-equal on two strings cannot
fail, and the designator must not say MustBePresent="true", since an absent attribute would then
give Indeterminate instead of False. So if one AnyOf has such a Match in every AllOf, a request
whose resource-ids are all outside the union S of those literals makes the Target "No match",
and a Policy or PolicySet whose Target is "No match" is NotApplicable, whatever its rules,
children, obligations or advice. NotApplicable contributes nothing to any combining algorithm.
Any one such AnyOf is a proof on its own; S is the union of the literals of every confining
Match of every such AnyOf (and of every resource-id Match of an AllOf that has several), which is
larger than needed but lets the caller check every literal that does the confining. It is not
the intersection: a request may carry several resource-id values, and one with the values {A, B}
gets past an AnyOf on A and another on B.

What confinement means: the document applies only to requests in which at least one
resource-id value is in S. The gateway's stream requests carry exactly one resource-id, so for
them this is "the stream requested is in S".

Everything the rule cannot see through is refused (None): no Target or an empty one, any other
MatchId (string-equal-ignore-case, regexp, ...), other data types, shorthand or other categories,
an attribute other than the resource-id, MustBePresent="true", structured values, and any
PolicyIdReference or PolicySetIdReference anywhere in the document (a reference lets a document
depend on, and pin, policies that are not its author's).
"""
from __future__ import annotations

from lxml import etree

from common.xmlsafe import UnsafeDocumentError, parse_xml
from pdp.urns import RESOURCE as RESOURCE_CATEGORY, RESOURCE_ID, STRING, STRING_EQUAL, XACML_NS

_TOP_LEVEL = {"Policy", "PolicySet"}
_REFERENCES = {"PolicyIdReference", "PolicySetIdReference"}


def _local(elem: etree._Element) -> str | None:
    """The element's name inside the XACML 3.0 namespace; None for anything else."""
    tag = elem.tag
    if not isinstance(tag, str):
        return None
    prefix = f"{{{XACML_NS}}}"
    return tag[len(prefix):] if tag.startswith(prefix) else None


def _elements(elem: etree._Element) -> list[etree._Element]:
    return [c for c in elem if isinstance(c.tag, str)]


def _attr(elem: etree._Element, name: str) -> str | None:
    # Stripped, as the policy parser reads these attributes.
    value = elem.get(name)
    return None if value is None else value.strip()


def _resource_literal(match: etree._Element) -> str | None:
    """The literal of `string-equal(literal, resource-id)`; None when `match` is anything else."""
    if _attr(match, "MatchId") != STRING_EQUAL:
        return None
    children = _elements(match)
    names = [_local(c) for c in children]
    if sorted(n or "" for n in names) != ["AttributeDesignator", "AttributeValue"]:
        return None
    value = children[names.index("AttributeValue")]
    designator = children[names.index("AttributeDesignator")]
    if _attr(value, "DataType") != STRING or _elements(value):
        return None
    if (_attr(designator, "Category") != RESOURCE_CATEGORY
            or _attr(designator, "AttributeId") != RESOURCE_ID
            or _attr(designator, "DataType") != STRING
            or _attr(designator, "MustBePresent") not in ("false", "0")):
        return None
    # Verbatim, as the string data type takes its lexical value (the parser does the same).
    return value.text or ""


def _any_of_scope(any_of: etree._Element) -> frozenset[str] | None:
    """The ids an AnyOf confines requests to, if every one of its AllOfs tests the resource-id."""
    all_ofs = _elements(any_of)
    if not all_ofs or any(_local(a) != "AllOf" for a in all_ofs):
        return None
    ids: set[str] = set()
    for all_of in all_ofs:
        literals = {literal for literal in (_resource_literal(m) for m in _elements(all_of)
                                            if _local(m) == "Match") if literal is not None}
        if not literals:
            return None
        ids |= literals
    return frozenset(ids)


def confined_resource_ids(data: bytes) -> frozenset[str] | None:
    """The resource ids this Policy or PolicySet document can only ever apply to, or None.

    A non-None answer S is a proof that the document is NotApplicable to every request none of
    whose resource-id values (category resource, data type string) is in S; see the module
    docstring for the rule and why it is sound. S may be empty: the document then applies to
    nothing. Malformed or unsafe documents give None; this function never raises on bad input.
    """
    try:
        root = parse_xml(data)
    except UnsafeDocumentError:
        return None
    if _local(root) not in _TOP_LEVEL:
        return None
    if any(_local(e) in _REFERENCES for e in root.iter()):
        return None
    targets = [c for c in _elements(root) if _local(c) == "Target"]
    if len(targets) != 1:
        return None
    scopes = []
    for any_of in _elements(targets[0]):
        if _local(any_of) != "AnyOf":
            return None
        scope = _any_of_scope(any_of)
        if scope is not None:
            scopes.append(scope)
    if not scopes:
        return None
    return frozenset().union(*scopes)
