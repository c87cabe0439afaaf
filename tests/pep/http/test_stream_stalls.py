"""A stream whose query stalls (issue 15): readers are told, /health says so, and when the query
runs again readers are told that too. The runtime is the recording stand-in with a settable
health report (tests/pep/runtime covers how the Spark runtime decides that it is stalled)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway
from tests.pep.http.test_handles_api import WEATHER, XML

POLICIES = Path(__file__).resolve().parents[3] / "policies" / "weather"
ND = {"Accept": "application/x-ndjson"}


class ReportingRuntime(RecordingRuntime):
    def __init__(self) -> None:
        super().__init__()
        self.states: dict[str, dict] = {}

    def health(self) -> dict:
        return dict(self.states)


@pytest.fixture
def gw(tmp_path):
    runtime = ReportingRuntime()
    app, services = build_gateway(tmp_path / "data", runtime)
    client = app.test_client()
    assert client.post("/streams", json=WEATHER, headers=auth_header("nea")).status_code == 201
    r = client.post("/policies", data=(POLICIES / "nea-weather-policy.xml").read_bytes(),
                    headers=auth_header("nea", **XML))
    assert r.status_code == 201, r.json
    yield client, runtime, services
    services.close()


def events_until(client, path: str, count: int) -> list[dict]:
    """The first `count` non-heartbeat lines of a handle's NDJSON stream."""
    r = client.get(path, headers=auth_header("lta", **ND), buffered=False)
    assert r.status_code == 200
    out = []
    for chunk in r.response:
        for text in chunk.decode().splitlines():
            obj = json.loads(text)
            if obj.get("event") != "heartbeat":
                out.append(obj)
        if len(out) >= count:
            break
    r.close()
    return out


def test_readers_are_told_when_their_stream_stalls_and_when_it_runs_again(gw):
    client, runtime, services = gw
    r = client.post("/requests", data=(POLICIES / "lta-request.xml").read_bytes(),
                    headers=auth_header("lta", **XML))
    assert r.status_code == 201, r.json
    path = "/" + r.json["handle"].split("://", 1)[1].split("/", 1)[1]
    hid = path.rsplit("/", 1)[1]

    runtime.states = {"weather": {"state": "running", "last_batch_at": 1_700_000_000.0,
                                  "last_error": None}}
    services.stall_notices.check()
    runtime.states["weather"] = {"state": "stalled", "last_batch_at": 1_700_000_000.0,
                                 "last_error": None}
    services.stall_notices.check()
    services.stall_notices.check()  # told once, not on every check
    runtime.push(hid, [{"samplingtime": "2024-05-01T08:00:00Z", "rainrate": 7.0,
                        "windspeed": 1.0}])
    runtime.states["weather"]["state"] = "running"
    services.stall_notices.check()

    events = events_until(client, path, 3)
    assert [e.get("event", "row") for e in events] == ["stalled", "row", "resumed"]
    assert events[0]["stream"] == "weather" and events[0]["state"] == "stalled"
    assert events[0]["last_batch_at"] == "2023-11-14T22:13:20Z"
    assert "stall bound" in events[0]["detail"]
    assert events[2] == {"id": events[2]["id"], "event": "resumed", "stream": "weather",
                         "state": "running"}
    assert services.handles.get(hid).state.value == "live"  # a stall does not end the handle


def test_health_reports_a_stalled_stream_naming_it_only_to_an_administrator(gw):
    client, runtime, _ = gw
    r = client.get("/health")
    assert r.status_code == 200 and r.json["status"] == "ready" and r.json["streams"] == {}

    runtime.states = {"weather": {"state": "stalled", "last_batch_at": None, "last_error": None},
                      "ais": {"state": "failed", "last_batch_at": None,
                              "last_error": "SparkException: /secret/path unreadable"}}
    public = client.get("/health")
    assert public.status_code == 200
    assert public.json["status"] == "degraded"
    assert public.json["streams"] == {"failed": 1, "stalled": 1}
    assert sorted(public.json["problems"]) == ["a stream is failed", "a stream is stalled"]
    assert "weather" not in public.get_data(as_text=True)
    assert "secret" not in public.get_data(as_text=True)
    assert "stream_states" not in public.json

    for token in (auth_header("lta"), {"Authorization": "Bearer not-a-token"}):
        assert "weather" not in client.get("/health", headers=token).get_data(as_text=True)

    admin = client.get("/health", headers=auth_header("nea"))
    assert admin.json["status"] == "degraded"
    assert admin.json["problems"] == [
        "stream ais is failed: SparkException: /secret/path unreadable",
        "stream weather is stalled"]
    assert admin.json["stream_states"]["weather"]["state"] == "stalled"

    runtime.states = {"weather": {"state": "running", "last_batch_at": None, "last_error": None}}
    r = client.get("/health")
    assert r.json["status"] == "ready" and "problems" not in r.json
