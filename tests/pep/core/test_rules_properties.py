"""Sharing rules, property by property, over generated rules (hypothesis):

- decompiling what the compiler made gives back the same rule;
- the compiled policy passes what a hand-written one must: the PDP's parser, the owner
  confinement proof of `pdp.policy_scope`, the obligation vocabulary on the stream's schema;
- a generated request is decided the same by the PDP on the compiled policy and by a direct
  reading of the rule (`expected`, a small evaluator written here), obligations included.
"""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings, strategies as st
from lxml import etree

from pdp import (
    Decision,
    PolicyEngine,
    PolicySource,
    confined_resource_ids,
    inspect_policy,
    parse_request,
)
from pep.core.obligations import policy_graph
from pep.core.plan import Field, SourceSpec, StreamDefinition, StreamSchema
from pep.core.rules import (
    AttributeMatch,
    RuleWindow,
    SharingRule,
    Validity,
    Who,
    check_rule,
    describe_policy,
    rule_from_json,
    rule_from_xacml,
    rule_to_json,
    rule_to_xacml,
)
from pep.core.rules.xacml import (
    ACTION,
    ACTION_ID,
    BOOLEAN,
    CURRENT_DATETIME,
    DATETIME,
    ENVIRONMENT,
    NS,
    RESOURCE,
    RESOURCE_ID,
    ROLE,
    STRING,
    SUBJECT,
    SUBJECT_ID,
    datatype_of,
    event_attribute,
    lexical,
)
from pep.streams.policy_check import check_policy

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("rainrate", "double"),
                       Field("level", "long"), Field("station", "string"),
                       Field("wet", "boolean")))
STREAMS = ("weather", "ships")
DEFINITIONS = {name: StreamDefinition(name, "nea", SCHEMA, SourceSpec("ingest"), "ts")
               for name in STREAMS}
NUMERIC = ("rainrate", "level")
FUNCTIONS = {"ts": ("max", "min", "count", "firstval", "lastval"),
             "rainrate": ("avg", "max", "min", "sum", "count", "firstval", "lastval"),
             "level": ("avg", "max", "min", "sum", "count", "firstval", "lastval"),
             "station": ("max", "min", "count", "firstval", "lastval"),
             "wet": ("count", "firstval", "lastval")}
BASE = datetime(2026, 11, 23, tzinfo=UTC)
MASKS = [("rainrate", "round:0.5"), ("level", "round:10"), ("level", "bands:0,10"),
         ("station", "prefix:2"), ("station", "hash"), ("ts", "truncate:minute"),
         ("wet", "null")]

# -- generated rules -------------------------------------------------------------------------------

names = st.sampled_from(["lta", "other", "nea", "Lta", "a b", "x&y<z\"'", "é-ü"])
roles = st.sampled_from(["consumer", "transport", "r&d", "owner"])
attribute_ids = st.sampled_from(["clearance", "department", "urn:example:team"])
attribute_values = st.one_of(st.integers(-3, 3), st.booleans(), st.sampled_from([0.5, 1.0, -2.25]),
                             st.sampled_from(["roads", "rail", "1", "true", " spaced "]))
actions = st.sampled_from(["read", "subscribe", "aggregate", "read-emergency"])
events = st.sampled_from(["storm", "flood", "Emergency_1"])


def _unique(strategy, max_size=3):
    return st.lists(strategy, unique=True, max_size=max_size).map(tuple)


@st.composite
def whos(draw) -> Who:
    if draw(st.integers(0, 5)) == 0:
        return Who(anyone=True)
    matches = draw(st.lists(st.tuples(attribute_ids, attribute_values), max_size=3,
                            unique_by=lambda m: (m[0], type(m[1]), m[1])))
    who = Who(draw(_unique(names)), draw(_unique(roles)),
              tuple(AttributeMatch(i, v) for i, v in matches))
    if not (who.subjects or who.roles or who.attributes):
        who = Who(subjects=(draw(names),))
    return who


@st.composite
def comparisons(draw) -> str:
    attribute = draw(st.sampled_from(["rainrate", "level", "station", "wet", "RainRate"]))
    low = attribute.lower()
    if low in NUMERIC or low == "rainrate":
        op = draw(st.sampled_from(["<", "<=", ">", ">=", "=", "!="]))
        value = draw(st.one_of(st.integers(-50, 50).map(str), st.just("{subject:clearance}"),
                               st.floats(-100, 100, allow_nan=False).map(lambda f: f"{f:.2f}")))
        if low == "level" and "." in value:
            value = value.split(".")[0]
        return f"{attribute} {op} {value}"
    if low == "station":
        return draw(st.sampled_from(["station = 'S1'", "station != 'a&b<c'",
                                     "station IN ('S1', 'S2')", "station IN {subject:team}"]))
    return draw(st.sampled_from(["wet = true", "wet != false"]))


@st.composite
def filters(draw) -> str | None:
    if draw(st.booleans()):
        return None
    parts = draw(st.lists(comparisons(), min_size=1, max_size=3))
    glue = draw(st.sampled_from([" AND ", " OR "]))
    text = glue.join(parts)
    return f"NOT ({text})" if draw(st.integers(0, 4)) == 0 else text


@st.composite
def windows(draw) -> RuleWindow | None:
    if draw(st.booleans()):
        return None
    kind = draw(st.sampled_from(["tuple", "time"]))
    size = draw(st.integers(1, 1000))
    step = draw(st.integers(1, 2000))
    pairs = [f"{a}:{f}" for a, fs in FUNCTIONS.items() for f in fs]
    aggregates = draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=4, unique=True))
    min_count = draw(st.one_of(st.none(), st.integers(1, size if kind == "tuple" else 50)))
    attributes = st.sampled_from(SCHEMA.names)
    return RuleWindow(kind, size, step, tuple(aggregates), min_count,
                      draw(_unique(attributes, 2)), draw(_unique(attributes, 2)))


@st.composite
def validities(draw) -> Validity | None:
    if draw(st.booleans()):
        return None
    start = draw(st.one_of(st.none(), st.integers(-5, 5)))
    end = draw(st.one_of(st.none(), st.integers(-5, 5)))
    if start is not None and end is not None and start >= end:
        start, end = end - 1, start + 1
    if start is None and end is None:
        start = 0

    def at(days):
        return None if days is None else (BASE + timedelta(days=days)).strftime(
            "%Y-%m-%dT%H:%M:%SZ")

    return Validity(at(start), at(end))


@st.composite
def rules(draw) -> SharingRule:
    stream = draw(st.sampled_from(STREAMS))
    description = draw(st.one_of(st.none(), st.text(
        st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30)))
    if description is not None and not description.strip():
        description = None
    rule = SharingRule(
        id=draw(st.sampled_from(["urn:xsg:rule:t", "urn:example:p&q", "r1"])), stream=stream,
        who=draw(whos()), actions=draw(st.one_of(st.just(()), _unique(actions, 3).filter(bool))),
        filter=draw(filters()),
        attributes=draw(_unique(st.sampled_from(SCHEMA.names), 5)),
        window=draw(windows()), valid=draw(validities()), events=draw(_unique(events, 2)),
        masks=tuple(draw(st.lists(st.sampled_from(MASKS), max_size=3,
                                  unique_by=lambda m: m[0]))),
        description=description.strip() if description else None,
        version=draw(st.sampled_from(["1.0", "2", "1.2.3"])))
    # what the JSON form reads back is the rule the compiler sees
    return rule_from_json(rule_to_json(rule))


def same(a: SharingRule, b: SharingRule | None) -> bool:
    """Equal, with the types of attribute values too (Python has True == 1)."""
    return b is not None and a == b and json.dumps(rule_to_json(a)) == json.dumps(rule_to_json(b))


# -- 1. round trip and the checks every policy passes ---------------------------------------------

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules())
def test_decompiling_the_compiled_rule_gives_the_rule_back(rule):
    document = rule_to_xacml(rule)
    assert same(rule, rule_from_xacml(document))
    assert describe_policy(document)["form"] == "rule"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules())
def test_the_compiled_policy_passes_the_checks_of_a_hand_written_one(rule):
    document = rule_to_xacml(rule)
    info = inspect_policy(PolicySource("compiled", document))  # raises PolicyLoadError
    assert info.id == rule.id and info.version == rule.version and not info.is_policy_set
    # the owner-confinement proof: NotApplicable to every other stream
    assert confined_resource_ids(document) == frozenset({rule.stream})
    check_rule(rule, DEFINITIONS[rule.stream])
    # the obligations fit the schema, as the PAP checks a written policy
    assert check_policy(document, DEFINITIONS.get, lambda: list(DEFINITIONS.values())) == []


# -- 2. decisions: the PDP on the compiled policy against a direct reading of the rule ------------

@st.composite
def requests(draw):
    subject = draw(names)
    caller_roles = draw(_unique(roles))
    attributes = {}
    for attribute_id in draw(_unique(attribute_ids, 2)):
        values = draw(st.lists(attribute_values, min_size=1, max_size=2))
        # an identity attribute's values have one type (common.auth)
        kind = type(values[0])
        attributes[attribute_id] = [v for v in values if type(v) is kind]
    return {"subject": subject, "roles": caller_roles, "attributes": attributes,
            "stream": draw(st.sampled_from(STREAMS)), "action": draw(actions),
            "now": BASE + timedelta(days=draw(st.integers(-6, 6)), hours=12),
            "open": draw(_unique(events, 3))}


def _same_value(a, b) -> bool:
    return type(a) is type(b) and a == b


def expected(rule: SharingRule, req: dict) -> dict | None:
    """What the rule grants this request, read directly: None when it does not apply."""
    if req["stream"] != rule.stream:
        return None
    if rule.actions and req["action"] not in rule.actions:
        return None
    who = rule.who
    if not who.anyone and not (
            req["subject"] in who.subjects or set(req["roles"]) & set(who.roles)
            or any(any(_same_value(m.value, v) for v in req["attributes"].get(m.id, []))
                   for m in who.attributes)):
        return None
    now = req["now"].strftime("%Y-%m-%dT%H:%M:%SZ")
    if rule.valid is not None and (rule.valid.start and now < rule.valid.start
                                   or rule.valid.end and now >= rule.valid.end):
        return None
    if any(e not in req["open"] for e in rule.events):
        return None
    view: dict = {}
    if rule.filter is not None:
        view["filter"] = [rule.filter]
    if rule.attributes:
        view["map"] = sorted(rule.attributes)
    if rule.masks:
        view["mask"] = sorted(f"{names}:{spec}" for names, spec in rule.masks)
    if rule.window is not None:
        w = rule.window
        view["window"] = {"type": [w.type], "size": [str(w.size)], "step": [str(w.step)],
                          "attr": sorted(w.aggregates), "key": sorted(w.group_by),
                          "filter-attribute": sorted(w.filterable),
                          "min-count": [str(w.min_count)] if w.min_count is not None else []}
    return view


def _request_xml(req: dict) -> bytes:
    root = etree.Element(f"{{{NS}}}Request", ReturnPolicyIdList="false",
                         CombinedDecision="false", nsmap={None: NS})

    def category(name):
        return etree.SubElement(root, f"{{{NS}}}Attributes", Category=name)

    def attribute(parent, attribute_id, datatype, values):
        a = etree.SubElement(parent, f"{{{NS}}}Attribute", AttributeId=attribute_id,
                             IncludeInResult="false")
        for value in values:
            etree.SubElement(a, f"{{{NS}}}AttributeValue", DataType=datatype).text = value

    subject = category(SUBJECT)
    attribute(subject, SUBJECT_ID, STRING, [req["subject"]])
    if req["roles"]:
        attribute(subject, ROLE, STRING, list(req["roles"]))
    for attribute_id, values in req["attributes"].items():
        attribute(subject, attribute_id, datatype_of(values[0]), [lexical(v) for v in values])
    attribute(category(RESOURCE), RESOURCE_ID, STRING, [req["stream"]])
    attribute(category(ACTION), ACTION_ID, STRING, [req["action"]])
    environment = category(ENVIRONMENT)
    attribute(environment, CURRENT_DATETIME, DATETIME, [req["now"].strftime("%Y-%m-%dT%H:%M:%SZ")])
    for event in req["open"]:
        attribute(environment, event_attribute(req["stream"], event), BOOLEAN, ["true"])
    return etree.tostring(root)


def _view(obligations) -> dict:
    """The decided obligations in the shape of `expected`."""
    view: dict = {}
    for ob in obligations:
        kind = ob.id.rsplit("-", 1)[-1]
        values: dict[str, list[str]] = {}
        for a in ob.assignments:
            suffix = a.attribute_id.split("obligation:stream-", 1)[1]
            name = suffix.split("-", 1)[1].removesuffix("-id")
            values.setdefault(name, []).append(a.value)
        if kind == "filter":
            view["filter"] = values["condition"]
        elif kind == "map":
            view["map"] = sorted(values["attribute"])
        elif kind == "mask":
            view["mask"] = sorted(values["attribute"])
        else:
            view["window"] = {k: sorted(values.get(k, [])) for k in
                              ("type", "size", "step", "attr", "key", "filter-attribute",
                               "min-count")}
    return view


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules(), st.lists(requests(), min_size=1, max_size=8))
def test_the_pdp_decides_the_compiled_rule_as_the_rule_reads(rule, reqs):
    engine = PolicyEngine.compile([PolicySource("compiled", rule_to_xacml(rule))])
    for req in reqs:
        # half of the requests are aimed at the rule
        response = engine.decide(parse_request(_request_xml(req), "application/xacml+xml"))
        result = response.results[0]
        want = expected(rule, req)
        if want is None:
            assert result.decision is Decision.NOT_APPLICABLE, (req, result)
            continue
        assert result.decision is Decision.PERMIT, (req, result)
        assert _view(result.obligations) == want
        # and the PEP understands them on the stream's schema
        policy_graph(result.obligations, rule.stream, SCHEMA,
                     resolver=lambda category, attribute: ["1"] * 6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules(), requests())
def test_requests_aimed_at_the_rule_are_permitted_as_it_reads(rule, req):
    """The same property on requests built to meet the rule (random ones mostly miss it)."""
    req = dict(req, stream=rule.stream, open=tuple(rule.events) + tuple(req["open"]))
    if rule.actions:
        req["action"] = rule.actions[0]
    if not rule.who.anyone:
        if rule.who.subjects:
            req["subject"] = rule.who.subjects[0]
        elif rule.who.roles:
            req["roles"] = (rule.who.roles[0],)
        else:
            m = rule.who.attributes[0]
            req["attributes"] = {m.id: [m.value]}
    if rule.valid is not None:
        start = rule.valid.start or rule.valid.end
        moment = datetime.strptime(start, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        req["now"] = moment if rule.valid.start else moment - timedelta(seconds=1)
    engine = PolicyEngine.compile([PolicySource("compiled", rule_to_xacml(rule))])
    result = engine.decide(parse_request(_request_xml(req), "application/xacml+xml")).results[0]
    want = expected(rule, req)
    assert want is not None
    assert result.decision is Decision.PERMIT, result
    assert _view(result.obligations) == want
