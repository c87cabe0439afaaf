"""One seeded access-control workload, written out for both xsg's XACML PDP and py-abac 0.4.1.

The PDP benchmark and the differential test need policy sets that mean exactly the same thing in
both systems, so the workload is first built as a small neutral model (`PolicySpec`, `Query`) and
only then rendered: as XACML 3.0 policies and requests (XML and JSON Profile) and as py-abac policy
JSON and request dicts. The model also has its own reference semantics (`expected_decision`), a
third opinion that keeps a bug shared by both renderings from passing unnoticed.

What is expressible in both, and how it is mapped:

* Targets. A policy names one or two resource ids and zero, one or two action ids (no action id
  means every action). XACML: the policy's `<Target>` holds string-equal Matches on resource-id and
  action-id, so that an index on targets can skip the policy. py-abac: `targets.resource_id` /
  `targets.action_id` lists (fnmatch patterns: ids here never contain `*?[`), `"*"` for any.
* Subject conditions, in disjunctive normal form over three attributes: integer `level` greater
  than k, string `department` equal to d, `role` bag containing r. XACML: the rule's `<Condition>`,
  each atom written as `any-of(f, literal, bag)` (`integer-less-than(k, level)` for level > k).
  py-abac: `rules.subject`, a dict for one AND clause or a list of dicts for an OR, with `Gt`,
  `Equals` and `AnyIn`.
* Missing attributes. py-abac treats a missing attribute as an unsatisfied condition. `any-of`
  over an empty bag is false in XACML, so the policy is NotApplicable there too; the designators
  use MustBePresent="false" and no Indeterminate can arise.
* Combining. The XACML root combines with deny-overrides; each policy holds one rule, so its
  rule-combining algorithm does not matter. py-abac's PDP defaults to `DENY_OVERRIDES`: it keeps
  the policies that fit (targets match and rules hold), answers False if none fits, False if any
  fitting policy denies, True otherwise. Policy priority is unused (every priority is 0).
  So Permit <=> py-abac True. py-abac's `is_allowed` returns False for both Deny and
  NotApplicable; `pyabac_decision` tells them apart with py-abac's own `Policy.fits`, which is
  exactly the "policy applies" test its PDP uses.
"""
from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

PERMIT = "Permit"
DENY = "Deny"
NOT_APPLICABLE = "NotApplicable"

XACML_NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
XS_STRING = "http://www.w3.org/2001/XMLSchema#string"
XS_INTEGER = "http://www.w3.org/2001/XMLSchema#integer"
FN = "urn:oasis:names:tc:xacml:1.0:function:"
FN3 = "urn:oasis:names:tc:xacml:3.0:function:"

CAT_SUBJECT = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
CAT_RESOURCE = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
CAT_ACTION = "urn:oasis:names:tc:xacml:3.0:attribute-category:action"
SUBJECT_ID = "urn:oasis:names:tc:xacml:1.0:subject:subject-id"
RESOURCE_ID = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"
ACTION_ID = "urn:oasis:names:tc:xacml:1.0:action:action-id"
ROLE_ID = "urn:oasis:names:tc:xacml:2.0:subject:role"
LEVEL_ID = "urn:xsg:bench:subject:level"
DEPARTMENT_ID = "urn:xsg:bench:subject:department"

RULE_DENY_OVERRIDES = "urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides"

ACTIONS = ("read", "write", "subscribe", "delete")
DEPARTMENTS = ("ops", "research", "sales", "legal", "hr")
ROLES = ("analyst", "admin", "auditor", "operator", "guest")

# The atom operators of the neutral condition model.
LEVEL_GT = "level>"
DEPARTMENT_EQ = "department=="
ROLE_HAS = "role∋"


@dataclass(frozen=True)
class Atom:
    """One test on a subject attribute: level > k, department == d, or role bag contains r."""

    op: str
    value: int | str


@dataclass(frozen=True)
class PolicySpec:
    """A policy in neutral form. `condition` is an OR of AND clauses (each clause non-empty)."""

    policy_id: str
    resources: tuple[str, ...]
    actions: tuple[str, ...]  # empty: applies to every action
    effect: str  # PERMIT or DENY
    condition: tuple[tuple[Atom, ...], ...]


@dataclass(frozen=True)
class Subject:
    subject_id: str
    level: int | None
    department: str | None
    roles: tuple[str, ...]


@dataclass(frozen=True)
class Query:
    subject: Subject
    resource: str
    action: str


@dataclass
class Workload:
    policies: list[PolicySpec]
    queries: list[Query]
    seed: int

    def xacml_policies(self) -> list[tuple[str, bytes]]:
        """(source name, XACML 3.0 policy XML) for every policy."""
        return [(f"{p.policy_id}.xml", policy_xml(p)) for p in self.policies]

    def pyabac_policies(self) -> list[dict]:
        return [pyabac_policy_json(p) for p in self.policies]

    def expected(self) -> list[str]:
        return [expected_decision(self.policies, q) for q in self.queries]


# ---------------------------------------------------------------------------------------------
# Generation


def _random_condition(rng: random.Random) -> tuple[tuple[Atom, ...], ...]:
    def level() -> Atom:
        return Atom(LEVEL_GT, rng.randint(0, 7))

    def dept() -> Atom:
        return Atom(DEPARTMENT_EQ, rng.choice(DEPARTMENTS))

    def role() -> Atom:
        return Atom(ROLE_HAS, rng.choice(ROLES))

    shape = rng.random()
    if shape < 0.25:
        return ((level(),),)
    if shape < 0.45:
        return ((dept(),),)
    if shape < 0.65:
        return ((role(),),)
    if shape < 0.85:
        return ((level(), dept()),)
    return ((role(),), (level(), dept()))


def _random_subject(rng: random.Random, index: int) -> Subject:
    level = None if rng.random() < 0.1 else rng.randint(0, 9)
    department = None if rng.random() < 0.1 else rng.choice(DEPARTMENTS)
    roles = tuple(sorted(rng.sample(ROLES, rng.choice((0, 1, 1, 2, 2, 3)))))
    return Subject(f"user-{index}", level, department, roles)


def generate(n_policies: int, n_queries: int, seed: int = 20260522) -> Workload:
    """A reproducible workload: same arguments, same policies and queries, byte for byte.

    About four policies share each resource, so a request usually has a few applicable policies
    (the case where combining matters) while most of the set is irrelevant to it (the case where a
    target index pays). Queries mostly aim at a resource/action some policy names, plus a few at
    unknown resources; the mix yields Permit, Deny and NotApplicable in useful shares.
    """
    rng = random.Random(seed)
    n_resources = max(2, n_policies // 4)
    resources = [f"res-{i}" for i in range(n_resources)]
    policies: list[PolicySpec] = []
    for i in range(n_policies):
        res = (rng.choice(resources),) if rng.random() < 0.85 else tuple(rng.sample(resources, 2))
        r = rng.random()
        if r < 0.15:
            actions: tuple[str, ...] = ()
        elif r < 0.85:
            actions = (rng.choice(ACTIONS),)
        else:
            actions = tuple(rng.sample(ACTIONS, 2))
        effect = DENY if rng.random() < 0.25 else PERMIT
        policies.append(PolicySpec(f"policy-{i}", res, actions, effect, _random_condition(rng)))

    subjects = [_random_subject(rng, i) for i in range(max(10, n_queries // 5))]
    queries: list[Query] = []
    for _ in range(n_queries):
        subject = rng.choice(subjects)
        if rng.random() < 0.05:
            queries.append(Query(subject, f"unknown-{rng.randint(0, 99)}", rng.choice(ACTIONS)))
            continue
        p = rng.choice(policies)
        resource = rng.choice(p.resources)
        action = rng.choice(p.actions) if p.actions and rng.random() < 0.9 else rng.choice(ACTIONS)
        queries.append(Query(subject, resource, action))
    return Workload(policies, queries, seed)


# ---------------------------------------------------------------------------------------------
# Reference semantics of the neutral model


def _atom_holds(atom: Atom, s: Subject) -> bool:
    if atom.op == LEVEL_GT:
        return s.level is not None and s.level > atom.value
    if atom.op == DEPARTMENT_EQ:
        return s.department == atom.value
    if atom.op == ROLE_HAS:
        return atom.value in s.roles
    raise ValueError(f"unknown atom operator {atom.op!r}")


def applies(p: PolicySpec, q: Query) -> bool:
    return (q.resource in p.resources
            and (not p.actions or q.action in p.actions)
            and any(all(_atom_holds(a, q.subject) for a in clause) for clause in p.condition))


def expected_decision(policies: Iterable[PolicySpec], q: Query) -> str:
    """Deny-overrides over the applicable policies; NotApplicable if none applies."""
    effects = {p.effect for p in policies if applies(p, q)}
    if DENY in effects:
        return DENY
    return PERMIT if PERMIT in effects else NOT_APPLICABLE


# ---------------------------------------------------------------------------------------------
# XACML 3.0 rendering


def _match(attribute_id: str, category: str, value: str) -> str:
    return (f'<Match MatchId="{FN}string-equal">'
            f'<AttributeValue DataType="{XS_STRING}">{escape(value)}</AttributeValue>'
            f'<AttributeDesignator Category="{category}" AttributeId="{attribute_id}" '
            f'DataType="{XS_STRING}" MustBePresent="false"/></Match>')


def _any_of(values: Sequence[str], attribute_id: str, category: str) -> str:
    """An AnyOf matching when the attribute equals any of the values (one AllOf per value)."""
    return "<AnyOf>" + "".join(
        f"<AllOf>{_match(attribute_id, category, v)}</AllOf>" for v in values) + "</AnyOf>"


def _atom_xml(atom: Atom) -> str:
    if atom.op == LEVEL_GT:
        fn, dt, attr = FN + "integer-less-than", XS_INTEGER, LEVEL_ID  # k < level  <=>  level > k
    elif atom.op == DEPARTMENT_EQ:
        fn, dt, attr = FN + "string-equal", XS_STRING, DEPARTMENT_ID
    elif atom.op == ROLE_HAS:
        fn, dt, attr = FN + "string-equal", XS_STRING, ROLE_ID
    else:
        raise ValueError(f"unknown atom operator {atom.op!r}")
    return (f'<Apply FunctionId="{FN3}any-of"><Function FunctionId="{fn}"/>'
            f'<AttributeValue DataType="{dt}">{escape(str(atom.value))}</AttributeValue>'
            f'<AttributeDesignator Category="{CAT_SUBJECT}" AttributeId="{attr}" '
            f'DataType="{dt}" MustBePresent="false"/></Apply>')


def _junction(fn: str, parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f'<Apply FunctionId="{FN}{fn}">{"".join(parts)}</Apply>'


def policy_xml(p: PolicySpec) -> bytes:
    target = _any_of(p.resources, RESOURCE_ID, CAT_RESOURCE)
    if p.actions:
        target += _any_of(p.actions, ACTION_ID, CAT_ACTION)
    condition = _junction("or", [_junction("and", [_atom_xml(a) for a in clause])
                                 for clause in p.condition])
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<Policy xmlns="{XACML_NS}" PolicyId={quoteattr(p.policy_id)} Version="1.0" '
            f'RuleCombiningAlgId="{RULE_DENY_OVERRIDES}">'
            f'<Target>{target}</Target>'
            f'<Rule RuleId={quoteattr(p.policy_id + ":rule")} Effect="{p.effect}">'
            f'<Condition>{condition}</Condition></Rule></Policy>').encode()


def _subject_attributes(s: Subject) -> list[tuple[str, str, list[str]]]:
    """(attribute id, datatype, values) of the subject; absent attributes are left out."""
    attrs = [(SUBJECT_ID, XS_STRING, [s.subject_id])]
    if s.level is not None:
        attrs.append((LEVEL_ID, XS_INTEGER, [str(s.level)]))
    if s.department is not None:
        attrs.append((DEPARTMENT_ID, XS_STRING, [s.department]))
    if s.roles:
        attrs.append((ROLE_ID, XS_STRING, list(s.roles)))
    return attrs


def _categories(q: Query) -> list[tuple[str, list[tuple[str, str, list[str]]]]]:
    return [
        (CAT_SUBJECT, _subject_attributes(q.subject)),
        (CAT_RESOURCE, [(RESOURCE_ID, XS_STRING, [q.resource])]),
        (CAT_ACTION, [(ACTION_ID, XS_STRING, [q.action])]),
    ]


def request_xml(q: Query) -> bytes:
    parts = [f'<?xml version="1.0" encoding="UTF-8"?>\n<Request xmlns="{XACML_NS}" '
             'ReturnPolicyIdList="false" CombinedDecision="false">']
    for category, attrs in _categories(q):
        parts.append(f'<Attributes Category="{category}">')
        for attr_id, dt, values in attrs:
            parts.append(f'<Attribute AttributeId="{attr_id}" IncludeInResult="false">')
            parts.extend(f'<AttributeValue DataType="{dt}">{escape(v)}</AttributeValue>'
                         for v in values)
            parts.append("</Attribute>")
        parts.append("</Attributes>")
    parts.append("</Request>")
    return "".join(parts).encode()


def request_json(q: Query) -> bytes:
    """The same request in the XACML JSON Profile (integers as JSON numbers)."""
    categories = []
    for category, attrs in _categories(q):
        categories.append({"CategoryId": category, "Attribute": [
            {"AttributeId": attr_id, "DataType": dt,
             "Value": [int(v) if dt == XS_INTEGER else v for v in values]}
            for attr_id, dt, values in attrs]})
    return json.dumps({"Request": {"Category": categories}}).encode()


# ---------------------------------------------------------------------------------------------
# py-abac rendering

_PYABAC_ATOMS = {
    LEVEL_GT: lambda v: ("$.level", {"condition": "Gt", "value": v}),
    DEPARTMENT_EQ: lambda v: ("$.department", {"condition": "Equals", "value": v}),
    ROLE_HAS: lambda v: ("$.roles", {"condition": "AnyIn", "values": [v]}),
}


def pyabac_policy_json(p: PolicySpec) -> dict:
    clauses = []
    for clause in p.condition:
        rendered = dict(_PYABAC_ATOMS[a.op](a.value) for a in clause)
        if len(rendered) != len(clause):
            raise ValueError(f"{p.policy_id}: py-abac cannot test one attribute twice in a clause")
        clauses.append(rendered)
    return {
        "uid": p.policy_id,
        "description": "",
        "effect": "allow" if p.effect == PERMIT else "deny",
        "targets": {
            "subject_id": "*",
            "resource_id": list(p.resources),
            "action_id": list(p.actions) if p.actions else "*",
        },
        "rules": {"subject": clauses[0] if len(clauses) == 1 else clauses},
        "priority": 0,
    }


def pyabac_request(q: Query) -> dict:
    s = q.subject
    attributes: dict = {}
    if s.level is not None:
        attributes["level"] = s.level
    if s.department is not None:
        attributes["department"] = s.department
    if s.roles:
        attributes["roles"] = list(s.roles)
    return {
        "subject": {"id": s.subject_id, "attributes": attributes},
        "resource": {"id": q.resource, "attributes": {}},
        "action": {"id": q.action, "attributes": {}},
        "context": {},
    }


def build_pyabac(policies_json: Iterable[dict]):
    """A py-abac PDP over a MemoryStorage, with its default algorithm (DENY_OVERRIDES).

    Returns (pdp, storage). py_abac is imported here so that the XACML side of this module works
    without it.
    """
    from py_abac import PDP, EvaluationAlgorithm, Policy
    from py_abac.storage.memory import MemoryStorage

    storage = MemoryStorage()
    for doc in policies_json:
        storage.add(Policy.from_json(doc))
    return PDP(storage, EvaluationAlgorithm.DENY_OVERRIDES), storage


def pyabac_decision(pdp, storage, request_dict: dict) -> str:
    """py-abac's decision as Permit / Deny / NotApplicable.

    The boolean comes from the PDP itself; when it is False, the policies that fit (by py-abac's
    own `Policy.fits`) decide between Deny (some fit) and NotApplicable (none fits). The two
    views are cross-checked, so a misreading of py-abac's algorithm shows up as an error.
    """
    from py_abac import Request
    from py_abac.context import EvaluationContext

    request = Request.from_json(request_dict)
    allowed = pdp.is_allowed(request)
    ctx = EvaluationContext(request)
    fitting = [p for p in storage.get_for_target(ctx.subject_id, ctx.resource_id, ctx.action_id)
               if p.fits(ctx)]
    if not fitting:
        decision = NOT_APPLICABLE
    elif any(not p.is_allowed for p in fitting):
        decision = DENY
    else:
        decision = PERMIT
    if allowed != (decision == PERMIT):
        raise AssertionError(f"py-abac is_allowed={allowed} but fitting policies say {decision}")
    return decision


def decision_counts(decisions: Iterable[str]) -> dict[str, int]:
    counts = {PERMIT: 0, DENY: 0, NOT_APPLICABLE: 0}
    for d in decisions:
        counts[d] = counts.get(d, 0) + 1
    return counts
