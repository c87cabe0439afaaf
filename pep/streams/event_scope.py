"""Which streams' events a policy document reads, so that an owner's policy reads only its own.

A stream event's state is one owner's information: whether something is happening on its stream
and, with a key, values of its data (the ships in an emergency). The gateway hands it to
decisions as environment attributes `urn:xsg:event:<stream>:<event>[:since|:keys]`
(`pep.streams.events`). An owner's policy is confined to the owner's streams by its Target
(`pep.streams.ownership`), but a Target says where a policy applies, not what it reads: its
Condition, its Obligation and Advice expressions (which a decision returns to the caller), its
VariableDefinitions and its Rule Targets could all name another stream's event. So a policy is
scanned for every place it can name one:

- every AttributeDesignator in the document, wherever it stands (Target Match, Condition,
  VariableDefinition, Obligation/AdviceExpression's AttributeAssignmentExpression), in any
  category: only the environment carries the gateway's values, but a name is refused before
  anyone needs to know that;
- every `{category:attribute}` placeholder in any AttributeValue's text (a stream obligation's
  filter may read `{environment:urn:xsg:event:<stream>:<event>:keys}`).

AttributeSelector (XPath over a request's Content) cannot name an environment attribute, and
the policy parser refuses it anyway. A value computed at decision time (an Apply that builds a
placeholder's text) is not visible here; the decision itself stops it: a decision about a
stream sees only that stream's events (`StreamEvents.environment`), and a policy confined to
the owner's streams never applies to a decision about another stream.

The comparison is on the id as the parser reads it (stripped) and its prefix in any letter case:
an id that only looks like another stream's event is refused too (deny when in doubt).
"""
from __future__ import annotations

from dataclasses import dataclass

from common.xmlsafe import UnsafeDocumentError, parse_xml
from pep.core.conditions import placeholders_in
from pep.streams.events import PREFIX

ENVIRONMENT_PLACEHOLDER = "environment"


@dataclass(frozen=True)
class EventReference:
    """One place a policy names a stream event: the attribute, the stream and the line."""

    attribute: str
    stream: str
    line: int | None
    where: str  # "AttributeDesignator" or "placeholder"


def _local(tag: object) -> str:
    return str(tag).rsplit("}", 1)[-1]


def event_stream(attribute_id: str) -> str | None:
    """The stream an event attribute id belongs to; None when it is not an event attribute.
    `urn:xsg:event:` alone (or followed by nothing) gives "" (no stream: never the caller's)."""
    attribute_id = attribute_id.strip()
    if not attribute_id.lower().startswith(PREFIX):
        return None
    return attribute_id[len(PREFIX):].split(":", 1)[0]


def event_references(data: bytes) -> list[EventReference] | None:
    """Every place the document names a stream event's attribute, in document order; None when
    the document does not parse safely (the policy parser then refuses it, saying where)."""
    try:
        root = parse_xml(data)
    except UnsafeDocumentError:
        return None
    found: list[EventReference] = []
    for element in root.iter():
        if not isinstance(element.tag, str):
            continue
        name = _local(element.tag)
        if name == "AttributeDesignator":
            attribute = (element.get("AttributeId") or "").strip()
            stream = event_stream(attribute)
            if stream is not None:
                found.append(EventReference(attribute, stream, element.sourceline, name))
        elif name == "AttributeValue":
            text = "".join(element.itertext())
            if "{" not in text:
                continue
            for _category, attribute in placeholders_in(text):
                stream = event_stream(attribute)
                if stream is not None:
                    found.append(EventReference(attribute, stream, element.sourceline,
                                                "placeholder"))
    return found


def foreign_event(data: bytes, streams: frozenset[str] | set[str]) -> EventReference | None:
    """The first event reference of a stream outside `streams`; None when every one is inside
    (or the document does not parse: its loading refuses it)."""
    references = event_references(data)
    for reference in references or ():
        if reference.stream not in streams:
            return reference
    return None


__all__ = ["EventReference", "event_references", "event_stream", "foreign_event"]
