"""A gateway with two stream owners, their consumers and an administrator, for the tests of the
boundary between owners (issue 20): what one owner can learn of the other's streams, events,
policies and consumers. The whole gateway over Flask's test client, with the recording runtime
in place of Spark (events and joins are delivered by hand)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.auth import write_auth_file
from tests.pep.conftest import RecordingRuntime

NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
XS = "http://www.w3.org/2001/XMLSchema#"
STRING, BOOLEAN, DATETIME, INTEGER = (XS + "string", XS + "boolean", XS + "dateTime",
                                      XS + "integer")
FN = "urn:oasis:names:tc:xacml:1.0:function:"
RESOURCE = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
RESOURCE_ID = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"
SUBJECT = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
SUBJECT_ID = "urn:oasis:names:tc:xacml:1.0:subject:subject-id"
ENVIRONMENT = "urn:oasis:names:tc:xacml:3.0:attribute-category:environment"
XML = {"Content-Type": "application/xacml+xml"}
JSON_TYPE = {"Content-Type": "application/xacml+json"}

ADMIN, ALICE, BOB = "nea", "alice", "bob"
# consumers: `carol` reads both owners' streams (both may know her); Bob's own consumers carry
# canary names Alice must never see
CAROL, DAVE = "carol", "dave"
BOB_CONSUMERS = ("bobcons-q7zcanary1", "bobcons-q7zcanary2")
SUBJECTS = {ADMIN: (["data-owner"], True), ALICE: (["data-owner"], False),
            BOB: (["data-owner"], False), CAROL: (["consumer"], False),
            DAVE: (["consumer"], False),
            **{c: (["consumer"], False) for c in BOB_CONSUMERS}}
TOKENS = {name: f"tok-{name}-b0und4ry-{i:04d}" for i, name in enumerate(SUBJECTS)}
PROXY_TOKEN = "proxy-tok-b0und4ry-secret"
PROXY_SECRET = "proxy-secret-b0und4ry-hmac"
READ_TOKEN_KEY = "read-token-key-b0und4ry"


def headers(who: str, **extra: str) -> dict:
    return {"Authorization": f"Bearer {TOKENS[who]}", **extra}


def schema_json() -> list[dict]:
    return [{"name": n, "type": t} for n, t in (("ts", "timestamp"), ("mmsi", "long"),
                                                 ("area", "string"), ("speed", "double"))]


def stream_json(name: str) -> dict:
    return {"name": name, "time_attribute": "ts", "source": {"kind": "ingest"},
            "schema": schema_json()}


# -- policies -------------------------------------------------------------------------------------

def match(function: str, datatype: str, value: str, category: str, attribute: str) -> str:
    return (f'<Match MatchId="{function}"><AttributeValue DataType="{datatype}">{value}'
            f'</AttributeValue><AttributeDesignator Category="{category}" AttributeId='
            f'"{attribute}" DataType="{datatype}" MustBePresent="false"/></Match>')


def any_of(*matches: str) -> str:
    """An AnyOf with one AllOf per match (an OR)."""
    return "<AnyOf>" + "".join(f"<AllOf>{m}</AllOf>" for m in matches) + "</AnyOf>"


def on_streams(*streams: str) -> str:
    return any_of(*(match(FN + "string-equal", STRING, s, RESOURCE, RESOURCE_ID)
                    for s in streams))


def for_subjects(*subjects: str) -> str:
    return any_of(*(match(FN + "string-equal", STRING, s, SUBJECT, SUBJECT_ID)
                    for s in subjects))


def obligation(obligation_id: str, *pairs: tuple[str, str]) -> str:
    return (f'<ObligationExpression ObligationId="{obligation_id}" FulfillOn="Permit">' + "".join(
        f'<AttributeAssignmentExpression AttributeId="exacml:obligation:{k}">'
        f'<AttributeValue DataType="{STRING}">{v}</AttributeValue>'
        f'</AttributeAssignmentExpression>' for k, v in pairs) + "</ObligationExpression>")


def stream_obligations(filter_text: str | None, visible: tuple[str, ...] = ()) -> str:
    out = ""
    if filter_text:
        out += obligation("exacml:obligation:stream-filter",
                          ("stream-filter-condition-id", filter_text))
    if visible:
        out += obligation("exacml:obligation:stream-map",
                          *(("stream-map-attribute-id", a) for a in visible))
    return out


def policy(policy_id: str, streams: tuple[str, ...], subjects: tuple[str, ...] = (), *,
           obligations: str = "", advice: str = "", condition: str = "",
           rule_target: str = "", variables: str = "", target_extra: str = "") -> bytes:
    """A Permit policy confined to `streams` (its Target), for `subjects` (when given, in the
    Target too: NotApplicable to anyone else), with the parts given verbatim."""
    target = on_streams(*streams) if streams else ""
    if subjects:
        target += for_subjects(*subjects)
    target += target_extra
    rule = (f'<Rule RuleId="{policy_id}:r" Effect="Permit"><Target>{rule_target}</Target>'
            + (f"<Condition>{condition}</Condition>" if condition else "")
            + (f"<ObligationExpressions>{obligations}</ObligationExpressions>"
               if obligations else "")
            + (f"<AdviceExpressions>{advice}</AdviceExpressions>" if advice else "")
            + "</Rule>")
    return (f'<Policy xmlns="{NS}" PolicyId="{policy_id}" Version="1.0" RuleCombiningAlgId='
            f'"urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides">'
            f"<Target>{target}</Target>{variables}{rule}</Policy>").encode()


EVENT_TYPES = {"": BOOLEAN, ":since": DATETIME, ":keys": STRING}
SAMPLE_VALUES = {BOOLEAN: "true", DATETIME: "2026-01-01T00:00:00Z", STRING: "x"}
PLACEMENTS = ("condition", "advice", "obligation", "rule-target", "variable", "policy-target",
              "placeholder")


def designator(attribute: str, datatype: str, category: str = ENVIRONMENT) -> str:
    return (f'<AttributeDesignator Category="{category}" AttributeId="{attribute}" '
            f'DataType="{datatype}" MustBePresent="false"/>')


def reading(placement: str, attribute: str, value: str | None = None) -> dict[str, str]:
    """The keyword arguments of `policy` that make it read `attribute` (an event attribute,
    `urn:xsg:event:<stream>:<event>[:since|:keys]`) at `placement`; a Target match compares it
    with `value` (by default a sample of its type)."""
    suffix = next((s for s in (":since", ":keys") if attribute.endswith(s)), "")
    datatype = EVENT_TYPES[suffix]
    short = datatype.rsplit("#", 1)[1]
    size = (f'<Apply FunctionId="{FN}integer-greater-than"><Apply FunctionId="{FN}{short}'
            f'-bag-size">{designator(attribute, datatype)}</Apply>'
            f'<AttributeValue DataType="{INTEGER}">0</AttributeValue></Apply>')
    echo = (f'<AttributeAssignmentExpression AttributeId="urn:t:echo">'
            f'{designator(attribute, datatype)}</AttributeAssignmentExpression>')
    equal = match(f"{FN}{short}-equal", datatype, value or SAMPLE_VALUES[datatype],
                  ENVIRONMENT, attribute)
    if placement == "condition":
        return {"condition": size}
    if placement == "advice":
        return {"advice": f'<AdviceExpression AdviceId="urn:t:echo" AppliesTo="Permit">{echo}'
                          "</AdviceExpression>"}
    if placement == "obligation":
        return {"obligations": f'<ObligationExpression ObligationId="urn:t:echo" '
                               f'FulfillOn="Permit">{echo}</ObligationExpression>'}
    if placement == "rule-target":
        return {"rule_target": any_of(equal)}
    if placement == "variable":
        return {"variables": f'<VariableDefinition VariableId="v">{size}</VariableDefinition>',
                "condition": '<VariableReference VariableId="v"/>'}
    if placement == "policy-target":
        return {"target_extra": any_of(equal)}
    if placement == "placeholder":
        keys = attribute if suffix == ":keys" else attribute + ":keys"
        return {"obligations": stream_obligations(f"area IN {{environment:{keys}}}")}
    raise ValueError(placement)


# -- requests -------------------------------------------------------------------------------------

def request(stream: str, query: dict | None = None, return_policy_ids: bool = False) -> bytes:
    resource: dict[str, Any] = {"Attribute": [{"AttributeId": RESOURCE_ID, "Value": stream}]}
    if query is not None:
        resource["Content"] = query
    body: dict[str, Any] = {
        "Resource": resource,
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                  "Value": "read"}]}}
    if return_policy_ids:
        body["ReturnPolicyIdList"] = True
    return json.dumps({"Request": body}).encode()


def join_query(second: str) -> dict:
    return {"join": {"stream": second, "on": [["mmsi", "mmsi"]], "within": 30}}


# -- the gateway ----------------------------------------------------------------------------------

def write_auth(path: Path) -> None:
    write_auth_file(path, [{"token": TOKENS[name], "subject": name, "roles": roles,
                            "admin": admin} for name, (roles, admin) in SUBJECTS.items()])


@dataclass
class Gateway:
    client: Any
    runtime: RecordingRuntime
    services: Any
    data_dir: Path
    log: list = field(default_factory=list)

    def call(self, method: str, path: str, who: str | None = None, **kwargs: Any):
        extra = kwargs.pop("headers", {})
        hdrs = {**(headers(who) if who else {}), **extra}
        return self.client.open(path, method=method, headers=hdrs, **kwargs)

    def open_event(self, stream: str, event: str, *keys: str) -> None:
        """Tuples met the event's condition: it opens (gaining `keys` as its key values)."""
        _, _, deliver = self.runtime.attached[f"event:{stream}:{event}"]
        deliver([{"area": k} for k in keys] or [{"area": None}])


def build(data_dir: Path, *, metrics_public: bool = True, webhooks: tuple[str, ...] = (),
          interval: float = 0) -> Gateway:
    """The gateway (administrator `nea`, owners `alice` and `bob`, consumers); the periodic
    re-evaluation is off unless `interval` is given (tests tick by hand)."""
    from pep.config import GatewayConfig
    from pep.http.app import create_app
    from pep.invalidation.hub import InvalidationHub
    from pep.services import build_services

    data_dir.mkdir(parents=True, exist_ok=True)
    auth = data_dir / "auth.json"
    write_auth(auth)
    config = GatewayConfig(data_dir=data_dir, auth_file=auth, policies_dir=None, port=0,
                           heartbeat=0.2, reevaluation_interval=interval,
                           metrics_public=metrics_public, proxy_token=PROXY_TOKEN,
                           proxy_secret=PROXY_SECRET, read_token_key=READ_TOKEN_KEY)
    runtime = RecordingRuntime()
    hub = InvalidationHub(secret=PROXY_SECRET, proxy_token=PROXY_TOKEN, webhooks=webhooks,
                          timeout=0.5, connect_timeout=0.3)
    services = build_services(config, runtime=runtime, invalidation=hub)
    return Gateway(create_app(services=services).test_client(), runtime, services, data_dir)
