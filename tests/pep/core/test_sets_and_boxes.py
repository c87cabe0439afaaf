"""Set membership and bounding boxes in conditions (issue 14): written for people, bound into
plain comparisons, so the analysis, the runtime and the SQL text treat them like any filter."""
from __future__ import annotations

import re

import pytest

from common.auth import Identity
from pdp import PolicyEngine, PolicySource
from pep.core.access import caller_resolver, decide_and_plan
from pep.core.analysis import analyse_filter
from pep.core.conditions import MAX_SET_SIZE, ConditionError, evaluate, parse_condition, to_text
from pep.core.graph import AIS_SCHEMA

SHIP = {"mmsi": 22, "shipname": "a", "shiptype": "cargo", "lat": 1.3, "lon": 103.8,
        "speed": 4.0, "course": 10.0, "ts": 0.0}


@pytest.mark.parametrize("condition, matches", [
    ("mmsi IN (11, 22, 33)", True),
    ("mmsi IN (11, 33)", False),
    ("mmsi NOT IN (11, 33)", True),
    ("shiptype IN ('tanker', 'cargo') AND speed < 5", True),
    ("NOT shiptype IN ('cargo')", False),
    ("WITHIN_BOX(lat, lon, 1.1, 103.6, 1.5, 104.1)", True),
    ("WITHIN_BOX(lat, lon, 1.4, 103.6, 1.5, 104.1)", False),
    ("WITHIN_BOX(lat, lon, 1.0, 103.9, 1.5, 103.7)", False),  # across 180: lon >= 103.9 or <= 103.7
    ("WITHIN_BOX(lat, lon, 1.0, 103.7, 1.5, -170)", True),
])
def test_sets_and_boxes_mean_what_they_say(condition, matches):
    expr = parse_condition(condition, AIS_SCHEMA)
    assert evaluate(expr, SHIP) is matches
    again = parse_condition(to_text(expr), AIS_SCHEMA)  # plain comparisons again
    assert to_text(again) == to_text(expr)


def test_a_bag_placeholder_stands_for_the_callers_set():
    company = Identity("co", attributes=(("urn:t:ship-list", (11, 22)),))
    expr = parse_condition("mmsi IN {subject:ship-list}", AIS_SCHEMA,
                           resolver=caller_resolver(company, "ais"))
    assert to_text(expr) == "mmsi = 11 OR mmsi = 22"
    nobody = Identity("none", attributes=(("urn:t:ship-list", ()),))
    assert to_text(parse_condition("mmsi IN {subject:ship-list}", AIS_SCHEMA,
                                   resolver=caller_resolver(nobody, "ais"))) == "false"
    assert to_text(parse_condition("mmsi NOT IN {subject:ship-list}", AIS_SCHEMA,
                                   resolver=caller_resolver(nobody, "ais"))) == "true"
    with pytest.raises(ConditionError, match="not a valid long"):
        parse_condition("mmsi IN {subject:names}", AIS_SCHEMA,
                        resolver=lambda c, a: ["x"])


def test_the_analysis_sees_through_sets():
    policy = parse_condition("mmsi IN (1, 2)", AIS_SCHEMA)
    nr = analyse_filter(policy, parse_condition("mmsi = 3", AIS_SCHEMA), AIS_SCHEMA)
    assert any(w.kind == "NR" for w in nr.warnings)
    ok = analyse_filter(policy, parse_condition("mmsi IN (2, 3)", AIS_SCHEMA), AIS_SCHEMA)
    assert not any(w.kind == "NR" for w in ok.warnings)


@pytest.mark.parametrize("condition, fragment", [
    ("mmsi IN ()", "expected a value"),
    ("mmsi IN (1, 2", "expected ',' or ')'"),
    ("mmsi IN 1", "expected '(' or a placeholder"),
    ("mmsi IN (1, shipname)", "expected a value"),
    ("mmsi IN ('a')", "type mismatch"),
    ("nope IN (1)", "unknown attribute"),
    ("WITHIN_BOX(lat, lon, 1, 2, 3)", "takes"),
    ("WITHIN_BOX(lat, 'x', 1, 2, 3, 4)", "takes two attributes"),
    ("WITHIN_BOX(shipname, lon, 1, 2, 3, 4)", "numeric coordinates"),
    ("WITHIN_BOX(lat, lon, 10, 2, 3, 4)", "south <= north"),
    ("WITHIN_BOX(lat, lon, 1, 200, 3, 4)", "within -180 and 180"),
])
def test_malformed_sets_and_boxes_say_what_is_wrong(condition, fragment):
    with pytest.raises(ConditionError, match=re.escape(fragment)):
        parse_condition(condition, AIS_SCHEMA)


def test_sets_are_bounded():
    big = "mmsi IN (" + ", ".join(str(i) for i in range(MAX_SET_SIZE + 1)) + ")"
    with pytest.raises(ConditionError, match="at most"):
        parse_condition(big, AIS_SCHEMA)
    with pytest.raises(ConditionError, match="at most"):
        parse_condition("mmsi IN {subject:s}", AIS_SCHEMA,
                        resolver=lambda c, a: [str(i) for i in range(MAX_SET_SIZE + 1)])


def test_a_ship_company_sees_its_own_ships_end_to_end():
    """ASSIST Table 2, row 4: SID in ShipList(self)."""
    s = "http://www.w3.org/2001/XMLSchema#string"
    policy = PolicySource("p", f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="p" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target/><Rule RuleId="r" Effect="Permit"><ObligationExpressions>
        <ObligationExpression ObligationId="exacml:obligation:stream-filter" FulfillOn="Permit">
          <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-filter-condition-id">
            <AttributeValue DataType="{s}">mmsi IN {{subject:ship-list}}</AttributeValue>
          </AttributeAssignmentExpression></ObligationExpression>
      </ObligationExpressions></Rule></Policy>""".encode())
    body = b"""{"Request": {"Resource": {"Attribute": [{"AttributeId":
        "urn:oasis:names:tc:xacml:1.0:resource:resource-id", "Value": "ais"}]}}}"""
    company = Identity("co", attributes=(("urn:xsg:ship-list", (563001, 563002)),))
    grant = decide_and_plan(PolicyEngine.compile([policy]), body, "application/xacml+json",
                            company, {"ais": AIS_SCHEMA}.get)
    assert sorted(c[0].value for c in grant.plan.filter_dnf) == [563001, 563002]
