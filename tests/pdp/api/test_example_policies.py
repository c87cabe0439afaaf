"""Every example under policies/ loads in the real engine and decides as its README says."""
from __future__ import annotations

import pytest
from lxml import etree

from pdp.engine import PolicyEngine, PolicySource, inspect_policy
from pdp.request import parse_request
from pdp.results import Decision
from pdp.service import load_sources, policy_files
from tests.pdp.api.conftest import POLICIES

XML, JSON = "application/xacml+xml", "application/xacml+json"


@pytest.fixture(scope="module")
def engine():
    return PolicyEngine.compile(load_sources(policy_files(POLICIES)))


def decide(engine, relative: str):
    path = POLICIES / relative
    result = engine.decide(
        parse_request(path.read_bytes(), JSON if path.suffix == ".json" else XML)
    )
    assert len(result.results) == 1
    return result.results[0]


def test_every_policy_file_loads_on_its_own():
    files = policy_files(POLICIES)
    assert {f.relative_to(POLICIES).as_posix() for f in files} == {
        "weather/nea-weather-policy.xml", "ais/port-authority-policy.xml", "mls/vitals-policy.xml",
        "joins/routes-policy.xml", "mls/position-policy.xml"}
    for f in files:
        info = inspect_policy(PolicySource(str(f), f.read_bytes()))
        assert info.id.startswith("urn:xsg:example:") and info.version == "1.0"


def test_every_xml_file_is_well_formed_and_requests_parse():
    requests = [p for p in POLICIES.rglob("*") if p.suffix in (".xml", ".json")
                and p not in policy_files(POLICIES) and p.name != "streams.json"]
    assert len(requests) == 15
    for p in requests:
        parse_request(p.read_bytes(), JSON if p.suffix == ".json" else XML)


def figure2(result):
    return {o.id: [(a.attribute_id, a.datatype.rsplit("#", 1)[-1], a.value) for a in o.assignments]
            for o in result.obligations}


EXPECTED_FIGURE2 = {
    "exacml:obligation:stream-filter": [
        ("pCloud:obligation:stream-filter-condition-id", "string", "rainrate > 5")],
    "exacml:obligation:stream-map": [
        ("pCloud:obligation:stream-map-attribute-id", "string", "samplingtime"),
        ("pCloud:obligation:stream-map-attribute-id", "string", "rainrate"),
        ("pCloud:obligation:stream-map-attribute-id", "string", "windspeed")],
    "exacml:obligation:stream-window": [
        ("pCloud:obligation:stream-window-step-id", "integer", "2"),
        ("pCloud:obligation:stream-window-size-id", "integer", "5"),
        ("pCloud:obligation:stream-window-type-id", "string", "tuple"),
        ("pCloud:obligation:stream-window-attr-id", "string", "samplingtime:lastval"),
        ("pCloud:obligation:stream-window-attr-id", "string", "rainrate:avg"),
        ("pCloud:obligation:stream-window-attr-id", "string", "windspeed:max"),
        ("exacml:obligation:stream-window-filter-attribute-id", "string", "rainrate")],
}


@pytest.mark.parametrize("request_file", ["weather/lta-request.xml", "weather/lta-request.json",
                                          "weather/lta-request-with-query.xml"])
def test_nea_lta_request_gets_permit_with_figure_2_obligations(engine, request_file):
    result = decide(engine, request_file)
    assert result.decision is Decision.PERMIT
    assert figure2(result) == EXPECTED_FIGURE2


def test_user_query_travels_in_the_resource_content():
    path = POLICIES / "weather" / "lta-request-with-query.xml"
    ctx = parse_request(path.read_bytes(), XML)
    content = ctx.content("urn:oasis:names:tc:xacml:3.0:attribute-category:resource")
    query = content if isinstance(content, etree._Element) else etree.fromstring(content)
    if etree.QName(query).localname == "Content":
        query = query[0]
    assert etree.QName(query).localname == "UserQuery"
    assert query.find("Stream").get("name") == "weather"
    assert query.findtext("Filter/FilterCondition").strip() == "RainRate > 50"
    assert [e.text for e in query.find("Aggregation")] == ["tuple", "10", "2", "avg(RainRate)"]


def test_weather_others_are_denied(engine):
    base = (POLICIES / "weather" / "lta-request.xml").read_bytes()
    for subject, action, expected in [("other", b"read", Decision.DENY),
                                      ("lta", b"delete", Decision.DENY),
                                      ("nea", b"read", Decision.PERMIT)]:
        body = base.replace(b">lta<", f">{subject}<".encode()).replace(
            b">read<", b">" + action + b"<"
        )
        result = engine.decide(parse_request(body, XML)).results[0]
        assert result.decision is expected, subject
        if subject == "nea":
            assert result.obligations == ()  # the owner reads the raw stream


def test_ais_port_authority(engine):
    read = decide(engine, "ais/port-authority-request.xml")
    assert read.decision is Decision.PERMIT
    assert [o.id for o in read.obligations] == ["exacml:obligation:stream-filter"]
    assert read.obligations[0].values("stream-filter-condition-id") == [
        "WITHIN_POLYGON(lat, lon, {subject:port-bounds})"]
    count = decide(engine, "ais/port-authority-count-request.xml")
    assert count.decision is Decision.PERMIT
    window = next(o for o in count.obligations if o.id == "exacml:obligation:stream-window")
    assert window.values("stream-window-type-id") == ["time"]
    assert window.values("stream-window-size-id") == ["600"]
    assert window.values("stream-window-attr-id") == ["mmsi:count"]
    assert window.values("stream-window-key-id") == ["shiptype"]
    near = next(o for o in count.obligations if o.id == "exacml:obligation:stream-filter")
    assert near.values("stream-filter-condition-id") == [
        "DISTANCE(lat, lon, {subject:port-lat}, {subject:port-lon}) <= 92600"]
    traffic = decide(engine, "ais/port-authority-traffic-request.xml")
    assert traffic.decision is Decision.PERMIT
    mask = next(o for o in traffic.obligations if o.id == "exacml:obligation:stream-mask")
    assert mask.values("stream-mask-attribute-id") == [
        "lat,lon:grid:0.1", "mmsi:hash", "speed:bands:0,5,10,15,20", "ts:truncate:minute"]


def test_ais_ship_company_and_captain(engine):
    company = decide(engine, "ais/ship-company-request.xml")
    assert company.decision is Decision.PERMIT
    assert company.obligations[0].values("stream-filter-condition-id") == [
        "mmsi IN {subject:ship-list}"]
    captain = decide(engine, "ais/ship-captain-request.xml")
    assert captain.decision is Decision.PERMIT
    assert captain.obligations[0].values("stream-filter-condition-id") == [
        "DISTANCE_TO(lat, lon, mmsi, {subject:ship-mmsi}) <= 370400"]
    assert captain.obligations[1].values("stream-map-attribute-id") == ["mmsi", "lon", "lat"]
    # the emergency view (row 6, the same action) only while the gateway says the event is
    # open: offline never, so the captain's read is row 5's grant alone
    assert [g.rule_id for g in captain.rule_grants()] == [
        "urn:xsg:example:ais:captain-sees-nearby-positions"]
    from pdp.request import bind_environment
    body = (POLICIES / "ais/ship-captain-request.xml").read_bytes()
    during = engine.decide(bind_environment(parse_request(body, XML), [
        ("urn:xsg:event:ais:emergency", "http://www.w3.org/2001/XMLSchema#boolean", ["true"]),
        ("urn:xsg:event:ais:emergency:keys", "http://www.w3.org/2001/XMLSchema#string",
         ["244000011"])])).results[0]
    assert during.decision is Decision.PERMIT
    assert [g.rule_id for g in during.rule_grants()] == [
        "urn:xsg:example:ais:captain-sees-nearby-positions",
        "urn:xsg:example:ais:captain-sees-emergencies"]
    assert [o.id for o in during.rule_grants()[1].obligations] == [
        "exacml:obligation:stream-filter"]


def test_port_authority_join_both_sides(engine):
    """The join request decides `ais`; its second side, `routes`, is the same request with the
    resource-id replaced and `join-with` ais (pep.core.access): both are Permit for the port
    authority, and routes only in that join (Table 2, row 3: a join privilege)."""
    from pdp.request import bind_join
    path = POLICIES / "joins" / "port-authority-join-request.xml"
    first = engine.decide(parse_request(path.read_bytes(), XML)).results[0]
    assert first.decision is Decision.PERMIT
    second_body = path.read_bytes().replace(b">ais</AttributeValue>", b">routes</AttributeValue>")
    assert engine.decide(parse_request(second_body, XML)).results[0].decision is Decision.DENY
    second = engine.decide(bind_join(parse_request(second_body, XML), "ais")).results[0]
    assert second.decision is Decision.PERMIT
    assert second.obligations[1].values("stream-map-attribute-id") == [
        "mmsi", "next_leg", "free_load", "eta", "ts"]
    join = second.obligations[2]
    assert join.id == "exacml:obligation:stream-join"
    assert join.values("stream-join-stream-id") == ["ais"]
    assert engine.decide(bind_join(parse_request(second_body, XML), "weather")).results[0] \
        .decision is Decision.DENY
    captain = second_body.replace(b">port-authority<", b">ship-captain<")
    assert engine.decide(bind_join(parse_request(captain, XML), "ais")).results[0].decision \
        is Decision.DENY


def test_mls_no_read_up(engine):
    ok = decide(engine, "mls/medic-request.xml")
    assert ok.decision is Decision.PERMIT
    assert ok.obligations[0].values("stream-filter-condition-id") == [
        "level <= {subject:clearance}"
    ]
    assert decide(engine, "mls/medic-read-up-request.xml").decision is Decision.DENY


def test_readme_names_every_file():
    readme = (POLICIES / "README.md").read_text()
    for p in POLICIES.rglob("*"):
        if p.is_file() and p.name != "README.md":
            assert p.relative_to(POLICIES).as_posix() in readme, p
