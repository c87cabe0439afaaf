"""GET /metrics (issue 11): Prometheus text with decisions, stream requests, revocations, live
handles and the runtime's figures; an administrator's token unless it is public."""
from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

POLICIES = Path(__file__).resolve().parents[3] / "policies" / "weather"
XML = {"Content-Type": "application/xacml+xml"}
WEATHER = {"name": "weather", "time_attribute": "samplingtime", "source": {"kind": "ingest"},
           "schema": [{"name": n, "type": t} for n, t in (
               ("samplingtime", "timestamp"), ("temperature", "double"), ("humidity", "double"),
               ("solarradiation", "double"), ("rainrate", "double"), ("windspeed", "double"),
               ("winddirection", "long"), ("barometer", "double"))]}


def samples(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_follow_what_happens(tmp_path):
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path / "data", runtime)
    try:
        c = app.test_client()
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers=auth_header("lta")).status_code == 403
        c.post("/streams", json=WEATHER, headers=auth_header("nea"))
        c.post("/policies", data=(POLICIES / "nea-weather-policy.xml").read_bytes(),
               headers=auth_header("nea", **XML))
        body = (POLICIES / "lta-request.xml").read_bytes()
        c.post("/pdp", data=body, headers=auth_header("lta", **XML))
        c.post("/pdp", data=body, headers=auth_header("other", **XML))
        hid = c.post("/requests", data=body, headers=auth_header("lta", **XML)).json["id"]
        c.post("/requests", data=body, headers=auth_header("other", **XML))
        r = c.get("/metrics", headers=auth_header("nea"))
        assert r.status_code == 200 and r.content_type.startswith("text/plain; version=0.0.4")
        m = samples(r.get_data(as_text=True))
        assert m[("xsg_decisions_total", (("result", "Permit"),))] == 1
        assert m[("xsg_decisions_total", (("result", "Deny"),))] == 1
        assert m[("xsg_decision_seconds_count", ())] == 2
        assert m[("xsg_stream_requests_total", (("outcome", "granted"),))] == 1
        assert m[("xsg_stream_requests_total", (("outcome", "refused"),))] == 1
        assert m[("xsg_live_handles", (("stream", "weather"),))] == 1
        assert m[("xsg_policies_loaded", ())] == 1
        c.delete("/policies/urn:xsg:example:weather:nea-policy", headers=auth_header("nea"))
        m = samples(c.get("/metrics", headers=auth_header("nea")).get_data(as_text=True))
        assert m[("xsg_revocations_total", ())] == 1
        assert m[("xsg_revocation_seconds_count", ())] >= 1
        assert ("xsg_live_handles", (("stream", "weather"),)) not in m
        assert services.handles.get(hid).state.value == "revoked"
    finally:
        services.close()
