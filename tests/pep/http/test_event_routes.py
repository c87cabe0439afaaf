"""The events' routes are one module-level blueprint reading the app's services: two gateways in
one process each serve their own streams' events through it, and its pieces (`owned_stream`)
work in any request context of an app that carries services."""
from __future__ import annotations

import pytest
from flask import g

from common.auth import Identity
from pep.core.errors import NotFound, NotPermitted
from pep.http.events import owned_stream
from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

SCHEMA = [{"name": "samplingtime", "type": "timestamp"}, {"name": "rainrate", "type": "double"}]


@pytest.fixture
def gateways(tmp_path):
    built = []
    for name in ("one", "two"):
        runtime = RecordingRuntime()
        app, services = build_gateway(tmp_path / name, runtime)
        services.catalog.register("weather", "lta", SCHEMA, None, "samplingtime")
        built.append((app, services, runtime))
    yield built
    for _, services, _ in built:
        services.close()


def test_each_app_defines_and_deletes_events_through_its_own_services(gateways):
    (app1, services1, runtime1), (app2, services2, runtime2) = gateways
    client = app1.test_client()
    r = client.post("/streams/weather/events", headers=auth_header("lta"),
                    json={"name": "storm", "condition": "rainrate > 5", "hold": 60})
    assert r.status_code == 201, r.json
    runtime_id = services1.stream_events.get("weather", "storm").runtime_id
    # stored, evaluated by this gateway's runtime, audited; the other gateway saw nothing
    assert runtime_id in runtime1.attached and not runtime2.attached
    assert [d.name for d in services1.stream_events.all("weather")] == ["storm"]
    assert services2.stream_events.all("weather") == []
    assert app2.test_client().get("/streams/weather/events",
                                  headers=auth_header("lta")).json["events"] == []
    kinds = [e["kind"] for e in services1.audit.log.query(limit=100)]
    assert "event-defined" in kinds

    r = client.delete("/streams/weather/events/storm", headers=auth_header("lta"))
    assert r.status_code == 204
    assert runtime_id in runtime1.detached and runtime_id not in runtime1.attached
    assert "event-deleted" in [e["kind"] for e in services1.audit.log.query(limit=100)]


def test_owned_stream_in_a_request_context(gateways):
    app, _, _ = gateways[0]
    cases = [(Identity("lta", ("consumer",), False), None),  # the owner
             (Identity("nea", ("data-owner",), True), None),  # an administrator
             (Identity("other", ("consumer",), False), NotPermitted)]
    for identity, refusal in cases:
        with app.test_request_context("/streams/weather/events"):
            g.xsg_identity = identity
            if refusal is None:
                assert owned_stream("weather").owner == "lta"
            else:
                with pytest.raises(refusal):
                    owned_stream("weather")
    with app.test_request_context("/"):
        g.xsg_identity = cases[0][0]
        with pytest.raises(NotFound):
            owned_stream("WEATHER")  # names are matched exactly
        with pytest.raises(NotFound):
            owned_stream("nowhere")
