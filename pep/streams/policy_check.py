"""A policy is checked against the schemas of the streams it targets when it is written.

An obligation that names an attribute a stream lacks (a typo in a map, a filter or a window)
cannot be fulfilled, so every request it applies to is denied, and a live handle it now covers is
revoked. Better to refuse the policy: `check_policy` finds the streams the policy's target can
apply to (`pdp.policy_resource_scope`), and runs the static values of its stream obligations
through the same code that will read them at decision time (`pep.core.obligations`), against
each registered stream's schema.

- A registered stream whose schema the obligations do not fit: the policy is refused (400), with
  the obligation's message (which attribute, which stream) and its line.
- A targeted stream that is not registered yet: accepted, with a warning.
- A policy whose target does not pin its streams (it can apply to any): accepted; a warning
  names the registered streams on which its obligations could not be fulfilled.
- An obligation value computed at decision time (an AttributeDesignator, an Apply) cannot be
  checked in advance: a warning says so. Placeholders (`{subject:...}`) are checked for syntax
  only: what they stand for is known at decision time.
- A window obligation whose owner chose the label scope `all` (`pep.core.obligations`): a
  warning that quotes its label bound and says that a withheld window tells its reader a tuple
  above the bound was there. So does one whose scope is computed at decision time (it may be
  `all`).
- A stream event the policy reads (`urn:xsg:event:<stream>:...`) of a stream its target never
  applies to: a warning, since a decision sees only the events of the stream it is about
  (`pep.streams.events`), so the policy would never see that event open. (An owner's policy may
  not read such an event at all: `pep.streams.ownership` refuses it before this check.)
- A derived stream (`derivation(name)`, issue 48): before its schema, each stream obligation is
  checked against the grant the stream derives from (`pep.core.derived.check_obligation`): one
  that asks for more than that grant gives is refused (403, `WiderThanGrant`, naming what is
  wider: a hidden attribute, a finer mask or window); one that can never show a row, a warning.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from lxml import etree

from common.xmlsafe import UnsafeDocumentError, parse_xml
from pdp import (
    XACML_NS,
    AttributeAssignment,
    Obligation,
    PolicyLoadError,
    PolicySource,
    policy_resource_scope,
)
from pep.core.derived import Derivation, WiderThanGrant, check_obligation, check_obligations
from pep.core.obligations import (
    FILTER_IDS,
    MAP_IDS,
    MASK_IDS,
    WINDOW_IDS,
    WINDOW_LABEL_SCOPE,
    ObligationError,
    policy_graph,
    presence_leaks,
)
from pep.core.plan import StreamDefinition, StreamSchema
from pep.streams.event_scope import event_references

STREAM_OBLIGATIONS = FILTER_IDS | MAP_IDS | WINDOW_IDS | MASK_IDS
StreamLookup = Callable[[str], "StreamDefinition | None"]
DerivationLookup = Callable[[str], "Derivation | None"]


def _local(tag: object) -> str:
    return str(tag).rsplit("}", 1)[-1]


def _stream_obligations(root: etree._Element
                        ) -> tuple[list[tuple[Obligation, int | None]], list[str]]:
    """The stream obligations with static values, each with its line; warnings for the rest."""
    found: list[tuple[Obligation, int | None]] = []
    warnings: list[str] = []
    for element in root.iter(f"{{{XACML_NS}}}ObligationExpression"):
        obligation_id = element.get("ObligationId", "")
        if obligation_id not in STREAM_OBLIGATIONS:
            continue
        assignments = []
        computed = False
        for expression in element.iter(f"{{{XACML_NS}}}AttributeAssignmentExpression"):
            children = [c for c in expression if isinstance(c.tag, str)]
            if len(children) != 1 or _local(children[0].tag) != "AttributeValue":
                warnings.append(f"obligation {obligation_id} (line {expression.sourceline}): "
                                f"{expression.get('AttributeId')} is computed at decision time; "
                                "this obligation could not be checked against the stream schemas")
                if (expression.get("AttributeId") or "").lower().endswith(
                        ":" + WINDOW_LABEL_SCOPE):
                    warnings.append(f"obligation {obligation_id} (line {expression.sourceline}): "
                                    f"its {WINDOW_LABEL_SCOPE} may be 'all' when decided: "
                                    + LEAK_TAIL)
                computed = True
                continue
            value = children[0]
            assignments.append(AttributeAssignment(expression.get("AttributeId", ""),
                                                   value.get("DataType", ""),
                                                   "".join(value.itertext())))
        if not computed:
            obligation = Obligation(obligation_id, tuple(assignments))
            found.append((obligation, element.sourceline))
            warnings.extend(_leak_warning(obligation_id, element.sourceline, bound)
                            for bound in presence_leaks(obligation))
    return found, warnings


LEAK_TAIL = ("every tuple enters the window, and a window is withheld when the bound does not "
             "dominate the least upper bound of its tuples' labels, so a reader who gets no "
             "window learns that a tuple above it was there: this choice leaks the presence of "
             "higher tuples. Without the scope (or with 'dominated') only the tuples the bound "
             "dominates enter the window, and nothing above the bound changes what a reader "
             "gets.")


def _leak_warning(obligation_id: str, line: int | None, bound: str) -> str:
    return (f"obligation {obligation_id} (line {line}): {WINDOW_LABEL_SCOPE} 'all' with "
            f"label bound `{bound}`: " + LEAK_TAIL)  # the predicate as written, unescaped


def _placeholder(category: str, attribute: str) -> list[str]:
    # Only the shape is checked now; "0" reads as a number, a timestamp, a boolean or a string.
    # Six times: a WITHIN_POLYGON bag needs at least three (lat, lon) vertices, and a
    # placeholder that must stand for one value accepts the same value repeated.
    return ["0"] * 6


def _label_samples(stream: StreamDefinition) -> list[Callable[[str, str], list[str]]]:
    """Placeholder stand-ins for a stream with label attributes: a label ("0" is none), the
    lowest of each lattice, tried when "0" does not fit."""
    lattices = dict.fromkeys(f.lattice for f in stream.schema.fields if f.lattice is not None)
    def sample(text: str) -> Callable[[str, str], list[str]]:
        return lambda category, attribute: [text] * 6

    return [sample(lattice.levels[0]) for lattice in lattices]


def _failure(obligations: list[tuple[Obligation, int | None]],
             stream: StreamDefinition) -> tuple[str, int | None] | None:
    for obligation, line in obligations:
        first: ObligationError | None = None
        for resolver in [_placeholder, *_label_samples(stream)]:
            try:
                policy_graph([obligation], stream.name, stream.schema, resolver=resolver)
            except ObligationError as exc:
                first = first or exc
                continue
            first = None
            break
        if first is not None:
            return first.message, line
    return None


def derived_warnings(data: bytes, derivation: Derivation) -> list[str]:
    """Warnings of a policy's stream obligations about a derived stream; WiderThanGrant for one
    that asks for more than the deriving grant gives (`pep.core.derived`). Obligations computed
    at decision time are not judged (the schema check warns of them)."""
    try:
        root = parse_xml(data)
    except UnsafeDocumentError:
        return []
    obligations, _ = _stream_obligations(root)
    return check_obligations(obligations, derivation, _placeholder)


# the sharing rule's field each stream obligation is compiled from (`pep.core.rules.xacml`)
RULE_FIELDS = {**{i: "/filter" for i in FILTER_IDS}, **{i: "/attributes" for i in MAP_IDS},
               **{i: "/mask" for i in MASK_IDS}, **{i: "/window" for i in WINDOW_IDS}}


def derived_rule_warnings(compiled: bytes, derivation: Derivation) -> list[str]:
    """`derived_warnings` of a sharing rule's compiled policy, each obligation named by the
    rule's field it comes from (a refusal carries it as `field`)."""
    obligations, _ = _stream_obligations(parse_xml(compiled))
    warnings: list[str] = []
    for ob, _line in obligations:
        field = RULE_FIELDS.get(ob.id, "/")
        try:
            warnings += check_obligation(ob, derivation, _placeholder, label=field)
        except WiderThanGrant as exc:
            exc.details["field"] = field
            raise
    return warnings


def check_policy(data: bytes, lookup: StreamLookup,
                 all_streams: Callable[[], list[StreamDefinition]],
                 source: str = "request body",
                 derivation: DerivationLookup | None = None) -> list[str]:
    """Warnings for a policy that fits the streams it targets; PolicyLoadError when it does not.
    `lookup(name)` finds a registered stream; `all_streams()` lists them; `derivation(name)`
    says what a derived stream derives from (None: it is not derived)."""
    try:
        root = parse_xml(data)
    except UnsafeDocumentError:
        return []  # the policy parser reports it, with where, when the policy is loaded
    obligations, warnings = _stream_obligations(root)
    references = event_references(data) or []
    if not obligations and not references:
        return warnings
    scope = policy_resource_scope(PolicySource(source, data))
    if scope is not None:
        seen: set[str] = set()
        for reference in references:
            if reference.stream not in scope and reference.attribute not in seen:
                seen.add(reference.attribute)
                warnings.append(
                    f"line {reference.line}: the policy reads {reference.attribute!r}, an event "
                    f"of stream {reference.stream!r}, but applies only to requests about "
                    f"{', '.join(repr(s) for s in sorted(scope)) or 'no stream'}; a decision "
                    "sees only the events of the stream it is about, so this event never "
                    "appears to it")
    if not obligations:
        return warnings
    if scope is None:
        return warnings + _unpinned(obligations, all_streams())
    for name in sorted(scope):
        stream = lookup(name)
        if stream is None or stream.name != name:
            warnings.append(f"stream {name!r} is not registered yet: this policy's obligations "
                            "were not checked against its schema")
            continue
        derived = derivation(name) if derivation is not None else None
        if derived is not None:
            warnings += check_obligations(obligations, derived, _placeholder)
        failure = _failure(obligations, stream)
        if failure is not None:
            message, line = failure
            raise PolicyLoadError(f"the policy's obligations cannot be fulfilled on stream "
                                  f"{name!r}: {message}", source, "ObligationExpression", line)
    return warnings


def _unpinned(obligations: list[tuple[Obligation, int | None]],
              streams: list[StreamDefinition]) -> list[str]:
    out = []
    for stream in streams:
        failure = _failure(obligations, stream)
        if failure is not None:
            out.append(f"the policy's target does not pin its streams; on stream "
                       f"{stream.name!r} its obligations cannot be fulfilled: {failure[0]}")
    return out


def policies_naming(stream: StreamDefinition, attributes: Iterable[str],
                    policies: Iterable[tuple[str, bytes, frozenset[str] | None]]
                    ) -> dict[str, list[tuple[str, int | None]]]:
    """Which of `policies` ((id, document, resource scope), None: any stream) name which of the
    stream's `attributes` in a stream obligation: {policy id: [(attribute, line), ...]}.

    A policy names an attribute when its obligations, which fit the stream's schema, no longer
    fit it without that attribute: the same check that refuses a policy naming an attribute a
    stream lacks (`check_policy`), run the other way round for a schema change. Values computed
    at decision time cannot be checked and are not counted."""
    wanted = [f for a in attributes if (f := stream.schema.lookup(a)) is not None]
    found: dict[str, list[tuple[str, int | None]]] = {}
    if not wanted:
        return found
    for policy_id, data, scope in policies:
        if scope is not None and stream.name not in scope:
            continue
        try:
            obligations, _ = _stream_obligations(parse_xml(data))
        except UnsafeDocumentError:
            continue
        if not obligations or _failure(obligations, stream) is not None:
            continue  # it does not fit the stream as it is: nothing it names can be told
        for attribute in wanted:
            low = attribute.name.lower()
            without = replace(stream, schema=StreamSchema(tuple(
                f for f in stream.schema.fields if f.name.lower() != low)))
            failure = _failure(obligations, without)
            if failure is not None:
                found.setdefault(policy_id, []).append((attribute.name, failure[1]))
    return found


__all__ = ["check_policy", "derived_warnings", "derived_rule_warnings", "policies_naming"]
