"""Policies are checked against the schemas of the streams they target when written (issue 9,
class 6): a typo in an obligation is refused with its attribute, stream and line."""
from __future__ import annotations

import pytest

from pdp import PolicyLoadError
from pep.core.plan import Field, SourceSpec, StreamDefinition, StreamSchema
from pep.streams.policy_check import check_policy

S = "http://www.w3.org/2001/XMLSchema#string"
NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
WEATHER = StreamDefinition("weather", "nea", StreamSchema((
    Field("samplingtime", "timestamp"), Field("rainrate", "double"), Field("windspeed", "double"))),
    SourceSpec("ingest"), "samplingtime")
SHIPS = StreamDefinition(
    "ships", "nea", StreamSchema((Field("mmsi", "long"),)), SourceSpec("ingest")
)
STREAMS = {s.name: s for s in (WEATHER, SHIPS)}


def check(doc: bytes) -> list[str]:
    return check_policy(doc, STREAMS.get, lambda: list(STREAMS.values()))


def assignment(suffix: str, value: str) -> str:
    return (f'<AttributeAssignmentExpression AttributeId="exacml:obligation:{suffix}">'
            f'<AttributeValue DataType="{S}">{value}</AttributeValue>'
            "</AttributeAssignmentExpression>")


def policy(obligations: str, streams=("weather",)) -> bytes:
    target = ""
    if streams:
        target = "<AnyOf>" + "".join(
            f'<AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">'
            f'<AttributeValue DataType="{S}">{s}</AttributeValue><AttributeDesignator '
            f'Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource" '
            f'AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" DataType="{S}" '
            f'MustBePresent="false"/></Match></AllOf>' for s in streams) + "</AnyOf>"
    return f"""<Policy xmlns="{NS}" PolicyId="p" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides">
      <Target>{target}</Target>
      <Rule RuleId="r" Effect="Permit"><ObligationExpressions>
{obligations}
      </ObligationExpressions></Rule></Policy>""".encode()


def ob(obligation: str, *assignments: str) -> str:
    return (f'<ObligationExpression ObligationId="exacml:obligation:{obligation}" '
            f'FulfillOn="Permit">' + "".join(assignments) + "</ObligationExpression>")


GOOD = ob("stream-filter", assignment("stream-filter-condition-id", "rainrate &gt; 5")) + ob(
    "stream-map", assignment("stream-map-attribute-id", "rainrate"))


def test_a_policy_that_fits_its_stream_passes():
    assert check(policy(GOOD)) == []


@pytest.mark.parametrize("obligations, attribute", [
    (ob("stream-map", assignment("stream-map-attribute-id", "rainrat")), "rainrat"),
    (ob("stream-filter", assignment("stream-filter-condition-id", "rainrat &gt; 5")), "rainrat"),
    (ob("stream-window", assignment("stream-window-type-id", "tuple"),
        assignment("stream-window-size-id", "5"), assignment("stream-window-step-id", "5"),
        assignment("stream-window-attr-id", "windsped:avg")), "windsped"),
    (ob("stream-window", assignment("stream-window-type-id", "time"),
        assignment("stream-window-size-id", "60"), assignment("stream-window-step-id", "60"),
        assignment("stream-window-attr-id", "rainrate:avg"),
        assignment("stream-window-filter-attribute-id", "rainrat")), "rainrat"),
])
def test_a_typo_is_refused_naming_attribute_stream_and_line(obligations, attribute):
    with pytest.raises(PolicyLoadError) as info:
        check(policy(GOOD + obligations))
    assert attribute in info.value.message and "'weather'" in info.value.message
    assert info.value.element == "ObligationExpression" and info.value.line > 4


def test_every_targeted_stream_is_checked():
    with pytest.raises(PolicyLoadError, match="'ships'"):
        check(policy(GOOD, streams=("weather", "ships")))


def test_an_unknown_stream_gives_a_warning():
    warnings = check(policy(GOOD, streams=("weather", "future")))
    assert len(warnings) == 1 and "'future' is not registered yet" in warnings[0]


def test_an_unpinned_policy_warns_for_the_streams_it_cannot_serve():
    warnings = check(policy(GOOD, streams=()))
    assert len(warnings) == 1 and "'ships'" in warnings[0] and "rainrate" in warnings[0]


def test_placeholders_and_computed_values():
    placeholder = ob("stream-filter", assignment("stream-filter-condition-id",
                                                  "rainrate &lt;= {subject:clearance}"))
    assert check(policy(placeholder)) == []
    computed = ('<ObligationExpression ObligationId="exacml:obligation:stream-map" '
                'FulfillOn="Permit"><AttributeAssignmentExpression '
                'AttributeId="exacml:obligation:stream-map-attribute-id"><AttributeDesignator '
                'Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject" '
                f'AttributeId="x" DataType="{S}" MustBePresent="false"/>'
                "</AttributeAssignmentExpression></ObligationExpression>")
    warnings = check(policy(computed))
    assert len(warnings) == 1 and "computed at decision time" in warnings[0]


def test_spatial_placeholders_pass_the_shape_check():
    """A polygon from a bag placeholder needs at least three vertices at check time; the
    single-value placeholders beside it still read one (repeated) value."""
    ais = StreamDefinition("ais", "nea", StreamSchema((
        Field("mmsi", "long"), Field("lat", "double"), Field("lon", "double"))),
        SourceSpec("ingest"))
    streams = {"ais": ais}
    for condition in ("WITHIN_POLYGON(lat, lon, {subject:port-bounds})",
                      "DISTANCE(lat, lon, {subject:port-lat}, {subject:port-lon}) &lt;= 92600",
                      "DISTANCE_TO(lat, lon, mmsi, {subject:ship-mmsi}) &lt;= 370400",
                      "mmsi IN {subject:ship-list}"):
        doc = policy(ob("stream-filter", assignment("stream-filter-condition-id", condition)),
                     streams=("ais",))
        assert check_policy(doc, streams.get, lambda: [ais]) == [], condition
    bad = policy(ob("stream-filter", assignment("stream-filter-condition-id",
                                                "WITHIN_POLYGON(lat, mmsi2, {subject:b})")),
                 streams=("ais",))
    with pytest.raises(PolicyLoadError, match="mmsi2"):
        check_policy(bad, streams.get, lambda: [ais])
