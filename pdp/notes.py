"""What the policy compiler notes about each rule, policy and policy set besides its compiled
form: the parts of its Target one by one, the attributes its Condition reads, its line.

A decision never reads these: it runs the compiled closures (`pdp.evaluation`). They are there
for the two tools that look inside a decision or a policy set without changing how either is
made: the explanation of a decision (`pdp.why`, which evaluates each Match of a target on its
own, with the same compiled closure) and the linter of policy sets (`pep.core.lint`, which
compares targets Match by Match). Noting them costs the compiler a few tuples per element, and a
decision nothing.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lxml import etree

from pdp.datatypes import canonical_datatype_id
from pdp.request import normalize_category
from pdp.urns import XACML_NS

if TYPE_CHECKING:  # for annotations only
    from pdp.evaluation import AnyValue, Matcher

AttributeKey = tuple[str, str, str]  # (category, attribute id, data type), as a request's bags


@dataclass(frozen=True)
class MatchNote:
    """One <Match>: its compiled test and what it compares (the policy's literal, as parsed
    and as written, against the attribute a designator names)."""

    test: Matcher  # the Match alone, compiled: test(ctx) -> bool, or raises
    function: str  # the MatchId
    value: AnyValue  # the literal, parsed (what equality compares)
    text: str  # the literal as written
    category: str
    attribute_id: str
    datatype: str
    issuer: str | None
    must_be_present: bool
    line: int | None

    @property
    def key(self) -> AttributeKey:
        return (self.category, self.attribute_id, self.datatype)


# A Target: per AnyOf, per AllOf, its Matches (an empty tuple: the empty Target, which matches
# every request).
TargetNote = tuple[tuple[tuple[MatchNote, ...], ...], ...]


@dataclass(frozen=True)
class DesignatorNote:
    """An attribute an expression reads (an AttributeDesignator)."""

    category: str
    attribute_id: str
    datatype: str
    issuer: str | None
    must_be_present: bool

    @property
    def key(self) -> AttributeKey:
        return (self.category, self.attribute_id, self.datatype)


NO_CONDITION, ALWAYS_FALSE, COMPUTED = "none", "always-false", "computed"


@dataclass(frozen=True)
class Notes:
    """A rule's, policy's or policy set's notes. `condition` is `none` (no Condition, or one
    that is always true), `always-false` or `computed`; `reads` the attributes it reads."""

    line: int | None
    target: TargetNote = ()
    condition: str = NO_CONDITION
    reads: tuple[DesignatorNote, ...] = ()
    algorithm: str | None = None  # the combining algorithm's id (policies and policy sets)


def designator_note(elem: etree._Element) -> DesignatorNote | None:
    """The attribute an <AttributeDesignator> names (None for one the compiler would refuse)."""
    category, attribute, datatype = (elem.get("Category"), elem.get("AttributeId"),
                                     elem.get("DataType"))
    if not category or not attribute or not datatype:
        return None
    return DesignatorNote(normalize_category(category), attribute,
                          canonical_datatype_id(datatype), elem.get("Issuer"),
                          (elem.get("MustBePresent") or "").strip() in ("true", "1"))


def designators_in(elem: etree._Element, variables: dict[str, etree._Element]
                   ) -> tuple[DesignatorNote, ...]:
    """Every attribute an expression reads, through the VariableDefinitions it references
    (each once, in document order)."""
    found: dict[DesignatorNote, None] = {}
    seen: set[str] = set()

    def walk(node: etree._Element) -> Iterator[DesignatorNote]:
        for child in node.iter(f"{{{XACML_NS}}}AttributeDesignator",
                               f"{{{XACML_NS}}}VariableReference"):
            if etree.QName(child).localname == "VariableReference":
                vid = child.get("VariableId") or ""
                if vid in variables and vid not in seen:
                    seen.add(vid)
                    yield from walk(variables[vid])
                continue
            note = designator_note(child)
            if note is not None:
                yield note

    for note in walk(elem):
        found.setdefault(note, None)
    return tuple(found)


__all__ = ["MatchNote", "TargetNote", "DesignatorNote", "Notes", "designator_note",
           "designators_in", "NO_CONDITION", "ALWAYS_FALSE", "COMPUTED", "AttributeKey"]
