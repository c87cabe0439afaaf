"""Grants for a join only (pep/core/joingrant.py; ASSIST Definition 3, Table 2 row 3), with the
real PDP: the example policies of policies/ais and policies/joins, and inline variants."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.auth import Identity
from pdp.engine import PolicyEngine, PolicySource
from pep.config import DEMO_PORT
from pep.core.access import decide_and_plan
from pep.core.conditions import ConditionError, qualified_conjuncts
from pep.core.errors import AccessDenied, NotPermitted
from pep.core.plan import Field, JoinPlan, Predicate, SpatialPredicate, StreamSchema
from pep.core.schemas import AIS_SCHEMA

from .test_access import STR, obligation

POLICIES = Path(__file__).resolve().parents[3] / "policies"
XML, JSON = "application/xacml+xml", "application/xacml+json"
ROUTES = StreamSchema(tuple(Field(f["name"], f["type"]) for f in next(
    s for s in json.loads((POLICIES / "streams.json").read_text()) if s["name"] == "routes")
    ["schema"]))
SCHEMAS = {"ais": AIS_SCHEMA, "routes": ROUTES}
TIMES = {"ais": "ts", "routes": "ts"}
PORT = tuple((k, tuple(v) if isinstance(v, list) else (v,)) for k, v in DEMO_PORT.items())
MPA = Identity("mpa", ("port-authority",), attributes=PORT)
JOIN_REQUEST = (POLICIES / "joins" / "port-authority-join-request.xml").read_bytes()
ALONE = JOIN_REQUEST.replace(b">ais</AttributeValue>", b">routes</AttributeValue>") \
    .replace(b"<Content>", b"<!--").replace(b"</Content>", b"-->")


@pytest.fixture(scope="module")
def engine():
    return PolicyEngine.compile([PolicySource(str(p), p.read_bytes()) for p in (
        POLICIES / "ais" / "port-authority-policy.xml", POLICIES / "joins" / "routes-policy.xml")])


def plan(engine, body, who=MPA, media=XML, **kw):
    return decide_and_plan(engine, body, media, who, SCHEMAS.get,
                           time_attribute_lookup=TIMES.get, **kw)


def test_routes_alone_is_refused_and_only_the_join_is_granted(engine):
    with pytest.raises(AccessDenied, match="decision is Deny"):
        plan(engine, ALONE)
    grant = plan(engine, JOIN_REQUEST)
    p = grant.plan
    assert isinstance(p, JoinPlan) and p.streams == ("ais", "routes")
    assert p.on == (("mmsi", "mmsi"),) and p.within == 60.0  # the request's 60 >= the grant's 30
    polygon = SpatialPredicate("polygon", "lat", "lon", "=", 0.0, tuple(DEMO_PORT["port-bounds"]))
    assert all(polygon in conj for conj in p.left.filter_dnf)  # the grant's AIS condition
    assert "consignee" not in p.right.projection
    assert "urn:xsg:example:joins:routes-policy" in grant.policy_ids


def test_a_request_claiming_to_be_a_join_side_gains_nothing(engine):
    """`urn:xsg:resource:join-with` is the gateway's: the request's own is dropped."""
    forged = ALONE.replace(b"</Attributes>\n  <Attributes Category=\"urn:oasis:names:tc:xacml:3.0:"
                           b"attribute-category:action\">",
                           b'<Attribute AttributeId="urn:xsg:resource:join-with" IncludeInResult='
                           b'"false"><AttributeValue DataType="' + STR.encode() + b'">ais'
                           b'</AttributeValue></Attribute></Attributes>\n  <Attributes Category='
                           b'"urn:oasis:names:tc:xacml:3.0:attribute-category:action">', 1)
    assert b"join-with" in forged
    with pytest.raises(AccessDenied):
        plan(engine, forged)


def test_the_grants_minimum_time_bound_raises_a_smaller_one_with_pr(engine):
    body = JOIN_REQUEST.replace(b"<Within>60</Within>", b"<Within>10</Within>")
    grant = plan(engine, body)
    assert grant.plan.within == 30.0
    (pr,) = [w for w in grant.warnings if w.operator == "join"]
    assert pr.kind == "PR" and "raised to 30 s" in pr.message
    without = plan(engine, JOIN_REQUEST.replace(b"<Within>60</Within>", b""))
    assert without.plan.within == 30.0  # none asked: the grant's


def test_a_join_with_another_stream_gets_no_routes():
    """A stream the caller may read joined with routes: routes is refused, naming it."""
    engine = PolicyEngine.compile([PolicySource(str(p), p.read_bytes()) for p in (
        POLICIES / "ais" / "port-authority-policy.xml", POLICIES / "joins" / "routes-policy.xml")]
        + [side_policy("urn:t:ships", "ships", join_only=None, obligations=maps(
            "mmsi", "lat", "lon", "ts"))])
    schemas = {**SCHEMAS, "ships": AIS_SCHEMA}
    body = JOIN_REQUEST.replace(b">ais</AttributeValue>", b">ships</AttributeValue>") \
        .replace(b'<Stream name="ais"/>', b"").replace(b"<Attribute>shipname</Attribute>", b"")
    with pytest.raises(AccessDenied) as refused:
        decide_and_plan(engine, body, XML, MPA, schemas.get, time_attribute_lookup=lambda s: "ts")
    assert "stream 'routes' (the second stream of the join with 'ships')" in \
        refused.value.message


def test_the_equality_is_added_when_the_consumer_did_not_ask_for_it(engine):
    """The grant's condition holds on every joined row, whatever the consumer joins on."""
    body = JOIN_REQUEST.replace(b'<On left="mmsi" right="mmsi"/>',
                                b'<On left="ts" right="ts"/>')
    p = plan(engine, body).plan
    assert p.on == (("ts", "ts"), ("mmsi", "mmsi"))


SIDES = StreamSchema((Field("ts", "timestamp"), Field("k", "long"), Field("v", "double"),
                      Field("secret", "double")))


def side_policy(policy_id: str, stream: str, *, join_only: str | None, obligations: str) -> \
        PolicySource:
    join_match = "" if join_only is None else (
        f'<AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">'
        f'<AttributeValue DataType="{STR}">{join_only}</AttributeValue><AttributeDesignator '
        f'Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource" AttributeId='
        f'"urn:xsg:resource:join-with" DataType="{STR}" MustBePresent="false"/></Match></AllOf>'
        f'</AnyOf>')
    xml = (f'<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="{policy_id}"'
           f' Version="1.0" RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-'
           f'algorithm:deny-overrides"><Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:'
           f'xacml:1.0:function:string-equal"><AttributeValue DataType="{STR}">{stream}'
           f'</AttributeValue><AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:'
           f'attribute-category:resource" AttributeId="urn:oasis:names:tc:xacml:1.0:resource:'
           f'resource-id" DataType="{STR}" MustBePresent="false"/></Match></AllOf></AnyOf>'
           f'</Target><Rule RuleId="{policy_id}:r" Effect="Permit"><Target>{join_match}</Target>'
           f'<ObligationExpressions>{obligations}</ObligationExpressions></Rule></Policy>')
    return PolicySource(policy_id, xml.encode())


def join_ob(*pairs):
    return obligation("exacml:obligation:stream-join", *pairs)


def maps(*names):
    return obligation("exacml:obligation:stream-map",
                      *(("stream-map-attribute-id", n) for n in names))


def join_body(left="a", right="b", on=(("k", "k"),), within=5):
    return json.dumps({"Request": {
        "Resource": {"Attribute": [{"AttributeId":
                                    "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
                                    "Value": left}],
                     "Content": {"join": {"stream": right, "on": [list(p) for p in on],
                                          "within": within}}},
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                  "Value": "read"}]}}}).encode()


def run_sides(*sources, body=None):
    engine = PolicyEngine.compile(list(sources))
    schemas = {"a": SIDES, "b": SIDES}
    return decide_and_plan(engine, body or join_body(), JSON, Identity("x"), schemas.get,
                           time_attribute_lookup=lambda s: "ts")


A_PLAIN = side_policy("urn:t:a", "a", join_only=None, obligations=maps("ts", "k", "v"))


def test_a_filter_on_the_other_stream_may_read_only_what_that_stream_shows():
    shown = side_policy("urn:t:b", "b", join_only="a", obligations=join_ob(
        ("stream-join-stream-id", "a"), ("stream-join-condition-id", "a.k = b.k AND a.v > 2")))
    p = run_sides(A_PLAIN, shown).plan
    assert Predicate("v", ">", 2.0) in p.left.filter_dnf[0]
    hidden = side_policy("urn:t:b", "b", join_only="a", obligations=join_ob(
        ("stream-join-stream-id", "a"), ("stream-join-condition-id", "a.secret > 2")))
    with pytest.raises(AccessDenied, match="secret"):
        run_sides(A_PLAIN, hidden)
    own = side_policy("urn:t:b", "b", join_only="a", obligations=join_ob(
        ("stream-join-stream-id", "a"), ("stream-join-condition-id", "b.secret > 2")))
    p = run_sides(A_PLAIN, own).plan  # its own stream: any attribute, as a filter may
    assert Predicate("secret", ">", 2.0) in p.right.filter_dnf[0]


@pytest.mark.parametrize("pairs, named", [
    ((("stream-join-stream-id", "c"),), "not with 'a'"),
    ((("stream-join-stream-id", "a"), ("stream-join-condition-id", "a.k = c.k")), "'c'"),
    ((("stream-join-stream-id", "a"), ("stream-join-condition-id", "a.k > b.k")), "equality"),
    ((("stream-join-stream-id", "a"), ("stream-join-condition-id", "k = 1")), "qualified"),
    ((("stream-join-stream-id", "a"), ("stream-join-within-id", "-1")), "within"),
    ((("stream-join-stream-id", "a"), ("stream-join-nonsense-id", "1")), "nonsense"),
    ((), "exactly one"),
])
def test_a_join_grant_that_cannot_be_fulfilled_denies(pairs, named):
    bad = side_policy("urn:t:b", "b", join_only="a", obligations=join_ob(*pairs))
    with pytest.raises(AccessDenied, match=named):
        run_sides(A_PLAIN, bad)


def test_a_join_obligation_in_a_decision_about_the_stream_alone_denies():
    """A grant whose obligation says `join` is a grant for a join, whatever its target."""
    loose = side_policy("urn:t:b", "b", join_only=None, obligations=join_ob(
        ("stream-join-stream-id", "a")))
    engine = PolicyEngine.compile([loose])
    alone = json.dumps({"Request": {"Resource": {"Attribute": [{
        "AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id", "Value": "b"}]},
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                  "Value": "read"}]}}}).encode()
    with pytest.raises(AccessDenied, match="only in a join with 'a'"):
        decide_and_plan(engine, alone, JSON, Identity("x"), {"b": SIDES}.get)


def test_a_hidden_attribute_in_the_grants_equality_is_refused_naming_it():
    b_shows = side_policy("urn:t:b", "b", join_only="a", obligations=maps("ts", "k") + join_ob(
        ("stream-join-stream-id", "a"), ("stream-join-condition-id", "a.v = b.v")))
    with pytest.raises(NotPermitted) as refused:
        run_sides(A_PLAIN, b_shows)
    assert refused.value.details.get("attribute") == "v"


def test_qualified_conjuncts_split_a_condition_over_two_streams():
    parts = qualified_conjuncts("ais.mmsi = routes.mmsi AND WITHIN_POLYGON(ais.lat, ais.lon, "
                                "[1, 2, 3, 4, 5, 6]) AND (routes.next_leg = 'a.b' OR "
                                "routes.free_load > 1.5)")
    assert parts[0].equality == (("ais", "mmsi"), ("routes", "mmsi"))
    assert (parts[1].stream, parts[1].text) == ("ais", "WITHIN_POLYGON(lat, lon, [1, 2, 3, 4, 5, "
                                                "6])")
    assert (parts[2].stream, parts[2].text) == ("routes",
                                                "(next_leg = 'a.b' OR free_load > 1.5)")
    for bad in ("mmsi = 1", "ais.x = 1 OR routes.y = 2", "ais.x = routes.y AND", "true",
                "ais.x < routes.y"):
        with pytest.raises(ConditionError):
            qualified_conjuncts(bad)


def test_a_join_grants_filter_keeps_the_sides_masks():
    """A filter the join grant adds to its own stream's side rebuilds that side's policy graph;
    the side's masks stay (they used to be dropped with it: the raw value in the join)."""
    masked = side_policy("urn:t:b", "b", join_only="a", obligations=join_ob(
        ("stream-join-stream-id", "a"), ("stream-join-condition-id", "a.k = b.k AND b.v > 2"))
        + obligation("exacml:obligation:stream-mask", ("stream-mask-attribute-id", "v:round:10")))
    p = run_sides(A_PLAIN, masked).plan
    assert Predicate("v", ">", 2.0) in p.right.filter_dnf[0]  # the grant's own-stream filter
    assert p.right.masks == (("v", "round:10"),)
