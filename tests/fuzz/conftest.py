"""One gateway per fuzz module: the real PDP, PAP, catalogue, planner and handle service over a
temporary data directory, with the recording runtime in place of Spark (nothing here starts a
JVM). It holds the example weather stream and NEA's policy (as tests/pep/http sets them up), and
a `ships` stream with string and boolean fields under the same obligations."""
from __future__ import annotations

import pytest

from tests.fuzz.support import NEA_POLICY, SHIPS, SHIPS_POLICY, WEATHER
from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

XML = {"Content-Type": "application/xacml+xml"}


class FuzzGateway:
    def __init__(self, client, runtime: RecordingRuntime, services) -> None:
        self.client = client
        self.runtime = runtime
        self.services = services

    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return "<gateway>"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path_factory.mktemp("fuzz") / "data", runtime)
    client = app.test_client()
    for stream in (WEATHER, SHIPS):
        r = client.post("/streams", json=stream, headers=auth_header("nea"))
        assert r.status_code == 201, r.get_data(as_text=True)
    for policy in (NEA_POLICY, SHIPS_POLICY):
        r = client.post("/policies", data=policy, headers=auth_header("nea", **XML))
        assert r.status_code == 201, r.get_data(as_text=True)
    yield FuzzGateway(client, runtime, services)
    services.close()
