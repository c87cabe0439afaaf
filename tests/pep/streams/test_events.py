"""Event-triggered grants (issue 14): a condition on a stream opens a grant while it holds and
closes it on time; requests cannot claim the event themselves."""
from __future__ import annotations

import pytest

from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

S = "http://www.w3.org/2001/XMLSchema#string"
B = "http://www.w3.org/2001/XMLSchema#boolean"
XML = {"Content-Type": "application/xacml+xml"}
EVENT = "urn:xsg:event:weather:storm"


def policy() -> bytes:
    """lta reads the weather stream only while the storm event is open."""
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="p"
      Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target/>
      <Rule RuleId="storm" Effect="Permit"><Condition>
        <Apply FunctionId="urn:oasis:names:tc:xacml:1.0:function:and">
          <Apply FunctionId="urn:oasis:names:tc:xacml:1.0:function:string-is-in">
            <AttributeValue DataType="{S}">lta</AttributeValue>
            <AttributeDesignator MustBePresent="false" DataType="{S}"
              Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
              AttributeId="urn:oasis:names:tc:xacml:1.0:subject:subject-id"/></Apply>
          <Apply FunctionId="urn:oasis:names:tc:xacml:1.0:function:boolean-is-in">
            <AttributeValue DataType="{B}">true</AttributeValue>
            <AttributeDesignator MustBePresent="false" DataType="{B}"
              Category="urn:oasis:names:tc:xacml:3.0:attribute-category:environment"
              AttributeId="{EVENT}"/></Apply>
        </Apply></Condition></Rule></Policy>""".encode()


def request(claim: bool = False) -> bytes:
    env = ""
    if claim:
        env = (f'<Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:'
               f'environment"><Attribute AttributeId="{EVENT}" IncludeInResult="false">'
               f'<AttributeValue DataType="{B}">true</AttributeValue></Attribute></Attributes>')
    return f"""<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      ReturnPolicyIdList="false" CombinedDecision="false">
      <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource">
        <Attribute AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
          IncludeInResult="false"><AttributeValue DataType="{S}">weather</AttributeValue>
        </Attribute></Attributes>{env}</Request>""".encode()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def gw(tmp_path, store_url):
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path / "data", runtime, interval=0,  # ticks by hand
                                  store=store_url)
    services.store_url = store_url  # what a restart opens again (a test attribute)
    clock = Clock()
    services.stream_events._clock = clock
    client = app.test_client()
    r = client.post("/streams", headers=auth_header("nea"), json={
        "name": "weather", "time_attribute": "t",
        "schema": [{"name": "t", "type": "timestamp"}, {"name": "rainrate", "type": "double"}]})
    assert r.status_code == 201
    assert (
        client.post("/policies", data=policy(), headers=auth_header("nea", **XML)).status_code
        == 201
    )
    yield client, runtime, services, clock
    services.close()


def test_an_event_opens_a_grant_while_it_holds_and_closes_it_on_time(gw):
    client, runtime, services, clock = gw
    r = client.post("/streams/weather/events", headers=auth_header("nea"),
                    json={"name": "storm", "condition": "rainrate > 50", "hold": 60})
    assert r.status_code == 201 and r.json["attribute"] == EVENT and r.json["open"] is False
    stream, plan, deliver = runtime.attached["event:weather:storm"]
    assert plan.filter_dnf[0][0].attribute == "rainrate" and plan.projection == ("t",)
    assert (
        client.post("/requests", data=request(), headers=auth_header("lta", **XML)).status_code
        == 403
    )
    # a request cannot claim the event for itself
    assert client.post("/requests", data=request(claim=True),
                       headers=auth_header("lta", **XML)).status_code == 403
    deliver([{"t": "2026-01-01T00:00:00Z"}])  # a tuple met the condition: the event opens
    r = client.post("/requests", data=request(), headers=auth_header("lta", **XML))
    assert r.status_code == 201
    handle = r.json["id"]
    listed = client.get("/streams/weather/events", headers=auth_header("nea")).json["events"]
    assert listed[0]["open"] is True and listed[0]["since"]
    clock.now += 30
    deliver([{"t": "2026-01-01T00:00:30Z"}])  # still storming: the hold starts again
    clock.now += 59
    assert services.stream_events.tick() is False
    assert services.handles.get(handle).live
    clock.now += 2  # 61 s after the last matching tuple: the event closes, the grant with it
    assert services.stream_events.tick() is True
    record = services.handles.get(handle)
    assert record.state.value == "revoked" and "stream event" in record.reason
    assert (
        client.post("/requests", data=request(), headers=auth_header("lta", **XML)).status_code
        == 403
    )


def test_defining_events_is_for_owners_and_checked(gw):
    client, runtime, services, clock = gw
    ok = {"name": "storm", "condition": "rainrate > 50", "hold": 60}
    assert client.post("/streams/weather/events", headers=auth_header("lta"),
                       json=ok).status_code == 403
    for bad, fragment in (({**ok, "condition": "rainrat > 50"}, "rainrat"),
                          ({**ok, "hold": 0}, "hold"), ({**ok, "key": "nope"}, "nope"),
                          ({**ok, "name": "bad name"}, "name"), ({**ok, "x": 1}, "unknown"),
                          ({**ok, "condition": "rainrate > {subject:x}"}, "placeholder")):
        r = client.post("/streams/weather/events", headers=auth_header("nea"), json=bad)
        assert r.status_code == 400 and fragment in r.json["error"], (bad, r.json)
    assert client.post("/streams/weather/events", headers=auth_header("nea"),
                       json=ok).status_code == 201
    assert client.post("/streams/weather/events", headers=auth_header("nea"),
                       json=ok).status_code == 409
    assert client.delete("/streams/weather/events/storm",
                         headers=auth_header("nea")).status_code == 204
    assert "event:weather:storm" in runtime.detached
    audit = client.get("/audit", headers=auth_header("nea"), query_string={"kind": [
        "event-defined", "event-deleted"]}).json["entries"]
    assert [e["kind"] for e in audit] == ["event-defined", "event-deleted"]


def test_events_survive_a_restart_closed(gw, tmp_path):
    client, runtime, services, clock = gw
    client.post("/streams/weather/events", headers=auth_header("nea"),
                json={"name": "storm", "condition": "rainrate > 50", "hold": 60})
    runtime.attached["event:weather:storm"][2]([{"t": "2026-01-01T00:00:00Z"}])
    services.close()
    runtime2 = RecordingRuntime()
    app2, services2 = build_gateway(tmp_path / "data", runtime2, store=services.store_url)
    try:
        assert "event:weather:storm" in runtime2.attached  # evaluated again
        assert services2.stream_events.environment("weather") == []  # closed until a tuple meets it
    finally:
        services2.close()
