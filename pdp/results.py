"""The outcome of a decision, as seen by everyone outside the PDP.

These dataclasses are the contract between the PDP and its callers (the HTTP API, the PEP, the
CLI). They carry XACML meaning but no XML: attribute-assignment values are kept both as their
XACML lexical form and as the datatype URI, so that the PEP can read an obligation without
knowing how the PDP represents values internally.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Decision(str, Enum):
    PERMIT = "Permit"
    DENY = "Deny"
    NOT_APPLICABLE = "NotApplicable"
    INDETERMINATE = "Indeterminate"


STATUS_OK = "urn:oasis:names:tc:xacml:1.0:status:ok"
STATUS_MISSING_ATTRIBUTE = "urn:oasis:names:tc:xacml:1.0:status:missing-attribute"
STATUS_SYNTAX_ERROR = "urn:oasis:names:tc:xacml:1.0:status:syntax-error"
STATUS_PROCESSING_ERROR = "urn:oasis:names:tc:xacml:1.0:status:processing-error"


@dataclass(frozen=True)
class MissingAttributeDetail:
    category: str
    attribute_id: str
    datatype: str
    issuer: str | None = None


@dataclass(frozen=True)
class Status:
    code: str = STATUS_OK
    message: str | None = None
    # Nested status codes (XACML allows a chain); the outermost is `code`.
    subcodes: tuple[str, ...] = ()
    missing_attributes: tuple[MissingAttributeDetail, ...] = ()


@dataclass(frozen=True)
class AttributeAssignment:
    attribute_id: str
    datatype: str
    value: str  # XACML lexical form of the value
    category: str | None = None
    issuer: str | None = None


@dataclass(frozen=True)
class Obligation:
    """An obligation (or advice) returned with a decision, its expressions already evaluated."""

    id: str
    assignments: tuple[AttributeAssignment, ...] = ()

    def values(self, attribute_id_suffix: str) -> list[str]:
        """Values of assignments whose AttributeId ends with the suffix (prefix-agnostic lookup)."""
        return [a.value for a in self.assignments if a.attribute_id.endswith(attribute_id_suffix)]


@dataclass(frozen=True)
class ResultAttribute:
    attribute_id: str
    datatype: str
    values: tuple[str, ...]
    issuer: str | None = None


@dataclass(frozen=True)
class ResultCategory:
    """A request category echoed back because its attributes had IncludeInResult=true."""

    category: str
    attributes: tuple[ResultAttribute, ...]
    id: str | None = None  # xml:id of the request's Attributes element, if any


@dataclass(frozen=True)
class PolicyIdentifier:
    id: str
    version: str
    is_policy_set: bool


@dataclass(frozen=True)
class RuleGrant:
    """The obligations one rule contributed to a decision: its own and those of every policy
    (set) around it that applied. A Permit's `obligations` are the concatenation of its grants';
    a PEP that gives the union of what each rule grants (ASSIST's Secure Read) plans each grant
    on its own."""

    rule_id: str
    obligations: tuple[Obligation, ...] = ()


@dataclass(frozen=True)
class Result:
    decision: Decision
    status: Status = field(default_factory=Status)
    obligations: tuple[Obligation, ...] = ()
    advice: tuple[Obligation, ...] = ()
    attributes: tuple[ResultCategory, ...] = ()
    policy_identifiers: tuple[PolicyIdentifier, ...] | None = None  # None: not requested
    # Not part of XACML's result (never rendered) nor of its equality: the obligations by rule.
    grants: tuple[RuleGrant, ...] = field(default=(), compare=False, repr=False)

    def rule_grants(self) -> tuple[RuleGrant, ...]:
        """The grants behind this result; a result built without them (decided elsewhere, or a
        Permit no rule gave, as permit-unless-deny's) is one grant of all its obligations."""
        if self.grants:
            return self.grants
        return (RuleGrant("", self.obligations),)


@dataclass(frozen=True)
class Response:
    results: tuple[Result, ...]
