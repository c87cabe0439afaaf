"""A join's handle: both sides decided, one window on both streams, revoked by either policy.

The whole gateway (PDP, processor, handle service, revocation) over Flask's test client; the
runtime is the recording stand-in, which receives joins too (`attach_join(id, (left, right),
plan, deliver)`). tests/e2e/test_joins.py runs the same paths on real Spark.
"""
from __future__ import annotations

import json

import pytest

from pep.core.plan import JoinPlan
from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway
from tests.pep.core.test_access import inline_policy, obligation

XML = {"Content-Type": "application/xacml+xml"}
JSON = {"Content-Type": "application/xacml+json"}
STATIONS = {"name": "jstations", "time_attribute": "t", "source": {"kind": "ingest"},
            "schema": [{"name": "t", "type": "timestamp"}, {"name": "station", "type": "string"},
                       {"name": "rainrate", "type": "double"},
                       {"name": "humidity", "type": "double"}]}
SHIPS = {"name": "jships", "time_attribute": "ts", "source": {"kind": "ingest"},
         "schema": [{"name": "ts", "type": "timestamp"}, {"name": "area", "type": "string"},
                    {"name": "mmsi", "type": "long"}, {"name": "owner", "type": "string"}]}


def policy(stream: str, subject: str, filter_text: str, *visible: str) -> bytes:
    obligations = obligation("exacml:obligation:stream-filter",
                             ("stream-filter-condition-id", filter_text))
    obligations += obligation("exacml:obligation:stream-map",
                              *(("stream-map-attribute-id", a) for a in visible))
    return inline_policy(f"urn:t:{stream}-{subject}", stream, subject, obligations).data


def request(stream: str, query: dict | None = None) -> bytes:
    resource = {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
                               "Value": stream}]}
    if query is not None:
        resource["Content"] = query
    return json.dumps({"Request": {
        "Resource": resource,
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                  "Value": "read"}]}}}).encode()


JOIN = {"join": {"stream": "jships", "on": [["station", "area"]], "within": 30}}


@pytest.fixture
def gw(tmp_path):
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path / "data", runtime)
    client = app.test_client()
    for stream in (STATIONS, SHIPS):
        assert client.post("/streams", json=stream, headers=auth_header("nea")).status_code == 201
    for doc in (policy("jstations", "lta", "rainrate > 1", "t", "station", "rainrate"),
                policy("jships", "lta", "mmsi > 0", "ts", "area", "mmsi")):
        r = client.post("/policies", data=doc, headers=auth_header("nea", **XML))
        assert r.status_code == 201, r.json
    yield client, runtime, services, tmp_path
    services.close()


def post(client, body, who="lta"):
    return client.post("/requests", data=body, headers=auth_header(who, **JSON))


def test_a_join_handle_runs_a_join_plan_on_both_stream_definitions(gw):
    client, runtime, services, _ = gw
    r = post(client, request("jstations", JOIN))
    assert r.status_code == 201, r.json
    hid = r.json["id"]
    streams, plan, deliver = runtime.attached[hid]
    assert isinstance(plan, JoinPlan) and [s.name for s in streams] == ["jstations", "jships"]
    assert r.json["plan"]["join"]["on"] == [{"left": "station", "right": "area"}]
    assert "JOIN `jships`" in r.json["sql"]
    assert set(r.json["policy_ids"]) == {"urn:t:jstations-lta", "urn:t:jships-lta"}
    assert r.json["streams"] == ["jstations", "jships"]
    listed = client.get("/handles", headers=auth_header("lta")).json["handles"]
    assert listed[0]["plan"]["streams"] == ["jstations", "jships"]
    assert listed[0]["streams"] == ["jstations", "jships"]
    # /metrics counts the join's handle on both streams
    text = client.get("/metrics", headers=auth_header("nea")).get_data(as_text=True)
    for name in ("jstations", "jships"):
        assert f'xsg_live_handles{{stream="{name}"}} 1.0' in text, text
    record = services.handles.get(hid)
    assert record.stream == "jstations" and record.streams == ("jstations", "jships")
    assert runtime.push(hid, [{"jstations.station": "A", "jships.area": "A"}])
    # the same join again maps to the same handle
    again = post(client, request("jstations", JOIN))
    assert again.status_code == 200 and again.json["id"] == hid


def test_a_join_holds_the_callers_window_on_both_streams(gw):
    client, runtime, services, _ = gw
    hid = post(client, request("jstations", JOIN)).json["id"]
    for stream in ("jstations", "jships"):
        r = post(client, request(stream))
        assert r.status_code == 409 and r.json["handle"].endswith(hid), (stream, r.json)
    # another join reading one of them conflicts too
    other = {"join": {**JOIN["join"], "within": 5}}
    r = post(client, request("jstations", other))
    assert r.status_code == 409 and r.json["handle"].endswith(hid)
    # releasing the join frees both slots
    assert client.delete(f"/handles/{hid}", headers=auth_header("lta")).status_code == 200
    assert hid in runtime.detached
    assert post(client, request("jships")).status_code == 201
    assert post(client, request("jstations")).status_code == 201


def test_a_join_cannot_open_while_another_query_is_live_on_either_stream(gw):
    client, *_ = gw
    single = post(client, request("jships")).json["id"]
    r = post(client, request("jstations", JOIN))
    assert r.status_code == 409 and r.json["handle"].endswith(single)
    assert "jships" in r.json["detail"]


@pytest.mark.parametrize("stream, how", [("jstations", "delete"), ("jships", "delete"),
                                         ("jships", "update")])
def test_a_policy_change_on_either_stream_revokes_the_join(gw, stream, how):
    client, runtime, services, _ = gw
    hid = post(client, request("jstations", JOIN)).json["id"]
    policy_id = f"urn:t:{stream}-lta"
    if how == "delete":
        r = client.delete(f"/policies/{policy_id}", headers=auth_header("nea"))
        assert r.status_code == 204
    else:  # new obligations on the second side: the join's plan changes
        doc = policy("jships", "lta", "mmsi > 5", "ts", "area", "mmsi")
        r = client.put(f"/policies/{policy_id}", data=doc, headers=auth_header("nea", **XML))
        assert r.status_code == 200, r.json
    record = services.handles.get(hid)
    assert record.state.value == "revoked" and policy_id in record.reason
    assert hid in runtime.detached and hid not in runtime.attached
    assert runtime.push(hid, [{"x": 1}]) is False  # nothing after the revocation
    # both slots are free again
    assert post(client, request("jships")).status_code in (201, 403)


def test_a_change_on_an_unrelated_stream_leaves_the_join_alone(gw):
    client, runtime, services, _ = gw
    hid = post(client, request("jstations", JOIN)).json["id"]
    assert client.post("/streams", json={**SHIPS, "name": "jother"},
                       headers=auth_header("nea")).status_code == 201
    r = client.post("/policies", data=policy("jother", "lta", "mmsi > 0", "ts", "mmsi"),
                    headers=auth_header("nea", **XML))
    assert r.status_code == 201
    assert services.handles.get(hid).live


def test_a_join_handle_resumes_after_a_restart_with_both_slots(tmp_path):
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path / "data", runtime)
    c = app.test_client()
    for stream in (STATIONS, SHIPS):
        c.post("/streams", json=stream, headers=auth_header("nea"))
    for doc in (policy("jstations", "lta", "rainrate > 1", "t", "station", "rainrate"),
                policy("jships", "lta", "mmsi > 0", "ts", "area", "mmsi")):
        c.post("/policies", data=doc, headers=auth_header("nea", **XML))
    hid = post(c, request("jstations", JOIN)).json["id"]
    services.close()

    runtime2 = RecordingRuntime()
    app2, services2 = build_gateway(tmp_path / "data", runtime2)
    try:
        assert services2.resumed == [hid]
        streams, plan, _ = runtime2.attached[hid]
        assert isinstance(plan, JoinPlan) and [s.name for s in streams] == ["jstations", "jships"]
        c2 = app2.test_client()
        r = post(c2, request("jships"))
        assert r.status_code == 409 and r.json["handle"].endswith(hid)
    finally:
        services2.close()


def test_a_join_on_a_punctuated_stream_opens_with_the_roles_on_that_side(tmp_path):
    """A join of a stream with security punctuations and one without (issue 48): the handle
    opens (it was refused with a 403 before joins read each side's segments), the punctuated
    side's plan carries the consumer's roles, the other side's none."""
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path / "data", runtime)
    client = app.test_client()
    try:
        punctuated = {**STATIONS, "source": {"kind": "ingest", "punctuations": "on"}}
        for stream in (punctuated, SHIPS):
            assert client.post("/streams", json=stream,
                               headers=auth_header("nea")).status_code == 201
        for doc in (policy("jstations", "lta", "rainrate > 1", "t", "station", "rainrate"),
                    policy("jships", "lta", "mmsi > 0", "ts", "area", "mmsi")):
            assert client.post("/policies", data=doc,
                               headers=auth_header("nea", **XML)).status_code == 201
        r = post(client, request("jstations", JOIN))
        assert r.status_code == 201, r.json
        _, plan, _ = runtime.attached[r.json["id"]]
        assert isinstance(plan, JoinPlan)
        assert plan.left.punctuation_roles is not None and plan.right.punctuation_roles is None
    finally:
        services.close()
