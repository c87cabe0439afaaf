"""Every policy write is linted (`pep.streams.policy_lint`): what the written document adds to
the policy set comes back as warnings, in the answer of the write and of its dry run, about the
written document only, and never about a policy the writer may not manage."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway
from tests.pep.http.test_policy_writes import WEATHER

POLICIES = Path(__file__).resolve().parents[3] / "policies" / "weather"
NEA_POLICY = (POLICIES / "nea-weather-policy.xml").read_bytes()
XML = {"Content-Type": "application/xacml+xml"}
S = "http://www.w3.org/2001/XMLSchema#string"


def windowed(policy_id: str, stream: str | None, kind: str = "time", subject: str = "lta"
             ) -> bytes:
    """A Permit for `subject` reading `stream` (None: any stream) through a window."""
    pinned = f"""<Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
        <AttributeValue DataType="{S}">{stream}</AttributeValue>
        <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
          AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" DataType="{S}"
          MustBePresent="false"/></Match></AllOf></AnyOf></Target>""" if stream else "<Target/>"  # noqa: E501 - the tests read findings' line numbers: the document keeps its lines
    assignments = "".join(
        f'<AttributeAssignmentExpression AttributeId="exacml:obligation:stream-window-{k}-id">'
        f'<AttributeValue DataType="{S}">{v}</AttributeValue></AttributeAssignmentExpression>'
        for k, v in (("type", kind), ("size", "60"), ("step", "60"), ("attr", "v:avg")
                     if stream != "weather" else ("attr", "rainrate:avg")))
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="{policy_id}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides">
      {pinned}
      <Rule RuleId="{policy_id}:rule" Effect="Permit">
        <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
          <AttributeValue DataType="{S}">{subject}</AttributeValue>
          <AttributeDesignator Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
            AttributeId="urn:oasis:names:tc:xacml:1.0:subject:subject-id" DataType="{S}"
            MustBePresent="false"/></Match></AllOf></AnyOf></Target>
        <ObligationExpressions>
          <ObligationExpression ObligationId="exacml:obligation:stream-window" FulfillOn="Permit">
            {assignments}
          </ObligationExpression>
        </ObligationExpressions></Rule></Policy>""".encode()  # noqa: E501 - the tests read findings' line numbers: the document keeps its lines


@pytest.fixture
def gw(tmp_path):
    app, services = build_gateway(tmp_path / "data", RecordingRuntime())
    client = app.test_client()
    assert client.post("/streams", json=WEATHER, headers=auth_header("nea")).status_code == 201
    yield client, services
    services.close()


def test_a_write_whose_grant_conflicts_with_another_gets_the_finding_as_a_warning(gw):
    client, _ = gw
    assert client.post("/policies", data=NEA_POLICY, headers=auth_header("nea", **XML)).json[
        "warnings"] == []
    doc = windowed("urn:t:times", "weather")
    r = client.post("/policies?dry_run=true", data=doc, headers=auth_header("nea", **XML))
    assert r.status_code == 200
    expected = [
        "conflict: line 9: rule urn:t:times:rule (policy urn:t:times): rules urn:t:times:rule "
        "(policy urn:t:times) and urn:xsg:example:weather:lta-reads-windows (policy "
        "urn:xsg:example:weather:nea-policy) can both apply to a request about stream "
        "'weather', and their obligations cannot be honoured together, so such a request is "
        "denied: applicable policies require windows of different types (time and tuple); no "
        "window satisfies all of them"]
    assert r.json["warnings"] == expected
    r = client.post("/policies", data=doc, headers=auth_header("nea", **XML))
    assert r.status_code == 201 and r.json["warnings"] == expected
    # what is wrong with the set already is not told again on an unrelated write
    other = windowed("urn:t:other", "weather", "tuple", subject="other")
    assert client.post("/policies", data=other, headers=auth_header("nea", **XML)).json[
        "warnings"] == []
    # an update that removes the conflict: nothing left to say
    r = client.put("/policies/urn:t:times", data=windowed("urn:t:times", "weather", "tuple"),
                   headers=auth_header("nea", **XML))
    assert r.status_code == 200 and r.json["warnings"] == []


def test_an_owner_is_never_told_about_a_policy_it_does_not_manage(gw):
    client, services = gw
    services.catalog.register("lta-obs", "lta", [{"name": "v", "type": "double"}])
    # an administrator's policy for every stream: lta may not manage it
    r = client.post("/policies", data=windowed("urn:t:everywhere", None, "tuple"),
                    headers=auth_header("nea", **XML))
    assert r.status_code == 201
    mine = windowed("urn:t:lta-obs", "lta-obs", "time")
    r = client.post("/policies?dry_run=true", data=mine, headers=auth_header("lta", **XML))
    assert r.status_code == 200, r.json
    assert r.json["warnings"] == []
    # the administrator writing the same document is told
    r = client.post("/policies?dry_run=true", data=mine, headers=auth_header("nea", **XML))
    assert len(r.json["warnings"]) == 1 and "urn:t:everywhere" in r.json["warnings"][0]
