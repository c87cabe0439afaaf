"""Fixtures for the PDP store, API, server and CLI tests: a gateway on a temporary data dir,
seeded from the repository's policies/, with known tokens; on SQLite and on PostgreSQL
(`store_url`, tests/conftest.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from common.auth import write_auth_file
from pep.config import GatewayConfig
from pep.http.app import create_app
from pep.services import GatewayServices, build_services

REPO = Path(__file__).resolve().parents[3]
POLICIES = REPO / "policies"
WEATHER_POLICY = POLICIES / "weather" / "nea-weather-policy.xml"
WEATHER_ID = "urn:xsg:example:weather:nea-policy"
LTA_REQUEST_XML = POLICIES / "weather" / "lta-request.xml"
LTA_REQUEST_JSON = POLICIES / "weather" / "lta-request.json"

TOKENS = {"nea": "tok-nea-admin-0123456789", "lta": "tok-lta-consumer-0123456789",
          "other": "tok-other-consumer-0123456789"}
AUTH_ENTRIES = [
    {"token": TOKENS["nea"], "subject": "nea", "roles": ["data-owner"], "admin": True},
    {"token": TOKENS["lta"], "subject": "lta", "roles": ["consumer"], "admin": False},
    {"token": TOKENS["other"], "subject": "other", "roles": ["consumer", "medic", "clearance:1"],
     "admin": False, "attributes": {"clearance": 1}},
]

XML = "application/xacml+xml"
JSON = "application/xacml+json"


def bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


def simple_policy(policy_id: str, resource: str = "weather", subject: str = "lta",
                  effect: str = "Permit", version: str = "1.0") -> bytes:
    """A one-rule policy: `effect` for `subject` on `resource` (no obligations)."""
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="{policy_id}"
  Version="{version}"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides">
  <Target><AnyOf><AllOf>
    <Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">{resource}</AttributeValue>
      <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
        AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
        DataType="http://www.w3.org/2001/XMLSchema#string" MustBePresent="false"/>
    </Match></AllOf></AnyOf></Target>
  <Rule RuleId="{policy_id}:rule" Effect="{effect}">
    <Target><AnyOf><AllOf>
      <Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
        <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">{subject}</AttributeValue>
        <AttributeDesignator Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
          AttributeId="urn:oasis:names:tc:xacml:1.0:subject:subject-id"
          DataType="http://www.w3.org/2001/XMLSchema#string" MustBePresent="false"/>
      </Match></AllOf></AnyOf></Target>
  </Rule>
</Policy>""".encode()


def xml_request(subject: str, resource: str, action: str = "read") -> bytes:
    return f"""<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
  ReturnPolicyIdList="false" CombinedDecision="false">
  <Attributes Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject">
    <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:subject:subject-id"
      IncludeInResult="false">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">{subject}</AttributeValue>
    </Attribute></Attributes>
  <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource">
    <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
      IncludeInResult="false">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">{resource}</AttributeValue>
    </Attribute></Attributes>
  <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:action">
    <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:action:action-id" IncludeInResult="false">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">{action}</AttributeValue>
    </Attribute></Attributes>
</Request>""".encode()


@dataclass
class Gateway:
    config: GatewayConfig
    services: GatewayServices
    app: object
    client: object

    def decide(self, who: str, body: bytes, content_type: str = XML, accept: str | None = None):
        headers = {**bearer(who), "Content-Type": content_type}
        if accept:
            headers["Accept"] = accept
        return self.client.post("/pdp", data=body, headers=headers)

    def decision(self, who: str, subject: str, resource: str = "weather",
                 action: str = "read") -> str:
        """The decision, read from the JSON Profile response."""
        r = self.decide(who, xml_request(subject, resource, action), accept=JSON)
        assert r.status_code == 200, r.get_data(as_text=True)
        return r.get_json()["Response"][0]["Decision"]


def make_config(tmp_path: Path, **overrides) -> GatewayConfig:
    auth = tmp_path / "auth.json"
    if not auth.exists():
        write_auth_file(auth, AUTH_ENTRIES)
    values = dict(data_dir=tmp_path / "data", auth_file=auth, policies_dir=POLICIES, port=0)
    values.update(overrides)
    return GatewayConfig(**values)


@pytest.fixture
def gateway(tmp_path, store_url):
    """A gateway on each store: SQLite files, then a PostgreSQL schema of its own."""
    config = make_config(tmp_path, store=store_url)
    services = build_services(config)
    app = create_app(services=services)
    app.testing = True
    yield Gateway(config, services, app, app.test_client())
    services.close()
