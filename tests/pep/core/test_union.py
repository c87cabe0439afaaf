"""The union of grants (pep/core/union.py; ASSIST Definitions 2-4): rule-attributed obligations
from the real PDP, the captain of Table 2 (rows 5 and 6), and a property test of the plans
against a brute-force "some applicable grant admits it" reading of the rules themselves."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from common.auth import Identity
from pdp.engine import PolicyEngine, PolicySource
from pep.core.access import decide_and_plan
from pep.core.conditions import evaluate, parse_condition
from pep.core.errors import NoResult, NotPermitted, Refusal, Unprocessable
from pep.core.plan import (
    ExecutionPlan,
    Field,
    StreamSchema,
    UnionPlan,
    any_plan_from_json,
    member_plans,
)
from pep.core.schemas import AIS_SCHEMA

from .test_access import STR

POLICIES = Path(__file__).resolve().parents[3] / "policies"
XML, JSON = "application/xacml+xml", "application/xacml+json"
EMERGENCY = [("urn:xsg:event:ais:emergency", "http://www.w3.org/2001/XMLSchema#boolean",
              ["true"]),
             ("urn:xsg:event:ais:emergency:since", "http://www.w3.org/2001/XMLSchema#dateTime",
              ["2026-01-01T00:00:00Z"]),
             ("urn:xsg:event:ais:emergency:keys", STR, ["244000011"])]
CAPTAIN = Identity("captain", ("ship-captain",), attributes=(("ship-mmsi", (244000007,)),))


@pytest.fixture(scope="module")
def ais_engine():
    path = POLICIES / "ais" / "port-authority-policy.xml"
    return PolicyEngine.compile([PolicySource(str(path), path.read_bytes())])


def captain(engine, mode, query=None, emergency=True):
    body = (POLICIES / "ais" / "ship-captain-request.xml").read_bytes()
    return decide_and_plan(engine, body, XML, CAPTAIN, {"ais": AIS_SCHEMA}.get,
                           user_query=None if query is None else json.dumps(query).encode(),
                           user_query_type=None if query is None else "application/json",
                           environment=lambda s: EMERGENCY if emergency else [],
                           combining=lambda s: mode)


def test_the_captain_gets_the_union_of_rows_5_and_6(ais_engine):
    grant = captain(ais_engine, "union")
    plan = grant.plan
    assert isinstance(plan, UnionPlan) and len(plan.plans) == 2
    near, emergency = sorted(plan.plans, key=lambda p: len(p.projection))
    assert near.projection == ("mmsi", "lat", "lon")
    assert emergency.projection == AIS_SCHEMA.names
    assert "distance_to" in json.dumps(grant.plan_json) and "244000011" in grant.sql
    assert "union of 2 grants" in grant.sql
    assert grant.plan_json["union"][0]["key"] == plan.plans[0].key()
    assert any_plan_from_json(plan.canonical_json()) == plan
    assert plan.key() == captain(ais_engine, "union").plan.key()  # stable
    # no PR on the map: the emergency grant shows every attribute
    assert not [w for w in grant.warnings if w.operator == "map"]
    # intersection: one plan, both filters, the smaller map
    both = captain(ais_engine, "intersection").plan
    assert isinstance(both, ExecutionPlan) and both.projection == ("mmsi", "lat", "lon")
    assert {p.__class__.__name__ for conj in both.filter_dnf for p in conj} == {
        "SpatialPredicate", "Predicate"}
    # no emergency: row 5 alone, the same plan in either mode
    assert captain(ais_engine, "union", emergency=False).plan == \
        captain(ais_engine, "intersection", emergency=False).plan


def test_a_query_asking_for_what_one_grant_hides_gets_the_other(ais_engine):
    grant = captain(ais_engine, "union", {"map": ["mmsi", "shipname", "speed"]})
    assert isinstance(grant.plan, ExecutionPlan)  # row 6 only: row 5 hides shipname
    assert grant.plan.projection == ("mmsi", "shipname", "speed")
    (info,) = [w for w in grant.warnings if w.operator == "union"]
    assert "captain-sees-nearby-positions" in info.message and "shipname" in info.message
    with pytest.raises(NotPermitted, match="shipname"):  # no emergency: nothing shows it
        captain(ais_engine, "union", {"map": ["mmsi", "shipname"]}, emergency=False)


def test_union_nr_only_when_no_grant_can_deliver(ais_engine):
    # another ship than the one in emergency, far from everything: row 5 may still match
    grant = captain(ais_engine, "union", {"filter": "mmsi = 244000001"})
    assert isinstance(grant.plan, ExecutionPlan)  # row 6 can never match: left out
    assert any("can never match" in w.message for w in grant.warnings)
    with pytest.raises(NoResult):
        captain(ais_engine, "union", {"filter": "mmsi = 244000001 AND mmsi = 244000002"})


def test_a_union_side_of_a_join_is_refused(ais_engine):
    body = (POLICIES / "ais" / "ship-captain-request.xml").read_bytes()
    routes = StreamSchema((Field("ts", "timestamp"), Field("mmsi", "long")))
    query = {"join": {"stream": "routes", "on": [["mmsi", "mmsi"]], "within": 5}}
    with pytest.raises(Unprocessable, match="union"):
        decide_and_plan(ais_engine, body, XML, CAPTAIN, {"ais": AIS_SCHEMA, "routes": routes}.get,
                        user_query=json.dumps(query).encode(), user_query_type="application/json",
                        environment=lambda s: EMERGENCY, combining=lambda s: "union",
                        time_attribute_lookup=lambda s: "ts")


# -- a property: the plans against the rules themselves -------------------------------------------

SCHEMA = StreamSchema((Field("a", "long"), Field("b", "long"), Field("c", "long")))
NAMES = SCHEMA.names
conditions = st.builds(lambda attr, op, v: f"{attr} {op} {v}", st.sampled_from(NAMES),
                       st.sampled_from(["<", "<=", ">", ">=", "=", "!="]), st.integers(0, 4))
grants = st.tuples(st.none() | conditions,
                   st.none() | st.sets(st.sampled_from(NAMES), min_size=1).map(sorted))
tuples_ = st.lists(st.fixed_dictionaries({n: st.none() | st.integers(0, 4) for n in NAMES}),
                   min_size=1, max_size=30)


def policy(rules) -> PolicySource:
    def obligations(filter_text, shown):
        out = ""
        if filter_text is not None:
            out += ('<ObligationExpression ObligationId="exacml:obligation:stream-filter" '
                    'FulfillOn="Permit"><AttributeAssignmentExpression AttributeId="exacml:'
                    f'obligation:stream-filter-condition-id"><AttributeValue DataType="{STR}">'
                    f'{filter_text.replace("<", "&lt;")}</AttributeValue>'
                    '</AttributeAssignmentExpression></ObligationExpression>')
        if shown is not None:
            out += ('<ObligationExpression ObligationId="exacml:obligation:stream-map" '
                    'FulfillOn="Permit">' + "".join(
                        '<AttributeAssignmentExpression AttributeId="exacml:obligation:stream-'
                        f'map-attribute-id"><AttributeValue DataType="{STR}">{n}</AttributeValue>'
                        '</AttributeAssignmentExpression>' for n in shown)
                    + '</ObligationExpression>')
        return out
    body = "".join(f'<Rule RuleId="r{i}" Effect="Permit"><ObligationExpressions>'
                   f'{obligations(*rule)}</ObligationExpressions></Rule>'
                   for i, rule in enumerate(rules))
    xml = ('<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="p" '
           'Version="1" RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-'
           f'algorithm:deny-overrides"><Target/>{body}</Policy>')
    return PolicySource("p", xml.encode())


def delivered(plan, rows) -> list[dict]:
    """What a plan gives, read as the runtime does: a tuple passing some member, once, with the
    attributes of every member it passes."""
    out = []
    for row in rows:
        shown = set()
        for member in member_plans(plan):
            dnf = member.filter_dnf
            if dnf is None or any(all(_holds(p, row) for p in conj) for conj in dnf):
                shown.update(member.projection)
        if shown:
            out.append({n: row[n] for n in NAMES if n in shown})
    return out


def _holds(p, row) -> bool:
    v = row[p.attribute]
    return v is not None and {"<": v < p.value, "<=": v <= p.value, ">": v > p.value,
                              ">=": v >= p.value, "=": v == p.value, "!=": v != p.value}[p.op]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(grants, min_size=1, max_size=4), st.none() | conditions,
       st.none() | st.sets(st.sampled_from(NAMES), min_size=1).map(sorted), tuples_)
def test_union_plans_deliver_what_some_applicable_grant_admits(rules, user_filter, user_map,
                                                               rows):
    engine = PolicyEngine.compile([policy(rules)])
    query = {k: v for k, v in (("filter", user_filter), ("map", user_map)) if v is not None}
    body = json.dumps({"Request": {"Resource": {"Attribute": [{
        "AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id", "Value": "s"}],
        **({"Content": query} if query else {})}, "Action": {"Attribute": [{
            "AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
            "Value": "read"}]}}}).encode()
    # the oracle: a grant applies when it shows every attribute the query reads or filters on
    touched = set(user_map or ()) | ({user_filter.split()[0]} if user_filter else set())
    applicable = [(f, m) for f, m in rules if touched <= set(m or NAMES)]
    expected = []
    for row in rows:
        shown = set()
        user_ok = user_filter is None or evaluate(parse_condition(user_filter, SCHEMA), row)
        for f, m in applicable:
            if user_ok and (f is None or evaluate(parse_condition(f, SCHEMA), row)):
                shown |= set(m or NAMES) & set(user_map or NAMES)
        if shown:
            expected.append({n: row[n] for n in NAMES if n in shown})
    try:
        grant = decide_and_plan(engine, body, JSON, Identity("x"), {"s": SCHEMA}.get,
                                refuse_nr=False, combining=lambda s: "union")
    except Refusal:
        assert not applicable
        return
    assert applicable
    assert delivered(grant.plan, rows) == expected
    # the analysis agrees: NR exactly when no tuple could ever come
    if any(w.kind == "NR" for w in grant.warnings):
        assert expected == []
