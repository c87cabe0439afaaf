"""Differentially private windows over the HTTP API, with a recording stand-in for Spark: bad
privacy attributes deny, a consumer's own epsilon is checked, explain and requests show the
budgets, a spent budget is a 403 with its figures (and survives a restart of the gateway), and
nothing answers 500. tests/e2e/test_private_windows.py runs the same on Spark."""
from __future__ import annotations

import json

import pytest

from tests.e2e.test_private_windows import private_policy
from tests.e2e.test_restart_and_sse import sensor_request
from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

STREAM = "dp_weather"
XML = {"Content-Type": "application/xacml+xml"}
SCHEMA = {"name": STREAM, "time_attribute": "samplingtime", "source": {"kind": "ingest"},
          "schema": [{"name": "samplingtime", "type": "timestamp"},
                     {"name": "rainrate", "type": "double"}]}


def start(data_dir):
    runtime = RecordingRuntime()
    app, services = build_gateway(data_dir, runtime)
    return app.test_client(), runtime, services


@pytest.fixture
def gw(tmp_path):
    client, runtime, services = start(tmp_path / "data")
    assert client.post("/streams", json=SCHEMA, headers=auth_header("nea")).status_code == 201
    r = client.post("/policies", data=private_policy(STREAM), headers=auth_header("nea", **XML))
    assert r.status_code == 201, r.json
    state = {"services": services}
    yield client, runtime, state, tmp_path
    state["services"].close()


def ask(client, who="lta", **window):
    query = {"window": {"type": "tuple", "size": 3, "step": 2, **window}}
    return client.post("/requests", headers=auth_header(who), data={
        "request": (__import__("io").BytesIO(sensor_request(STREAM)), "r.xml",
                    "application/xacml+xml"),
        "query": (__import__("io").BytesIO(json.dumps(query).encode()), "q.json",
                  "application/json")}, content_type="multipart/form-data")


def windows(starts):
    from pep.core.rows import RowBatch
    return RowBatch.of({"window_start": s, "window_end": s + 2, "sum_rainrate": 1.0}
                       for s in starts)


@pytest.mark.parametrize("bad", ["epsilon: 0", "epsilon: -1", "epsilon: 1e999",
                                 "bounds: rainrate:9", "bounds: samplingtime:0:1",
                                 "budget: 0.1/60", "budget: 1/-5", "unknown"])
def test_a_bad_privacy_attribute_is_refused_naming_it(gw, bad):
    """The owner's policy is checked when it is written (pep/streams/policy_check.py reads its
    obligations as a request would): 400 naming the attribute and its line. At a decision,
    the same obligation would deny (tests/pep/core/test_privacy.py)."""
    client, *_ = gw
    policy = private_policy(STREAM).decode()
    if bad == "unknown":
        policy = policy.replace("stream-window-dp-budget-id", "stream-window-dp-budgets-id")
    else:
        name, value = bad.split(": ")
        old = {"epsilon": ">0.5<", "bounds": ">rainrate:0:10<", "budget": ">12/86400<"}[name]
        policy = policy.replace(old, f">{value}<")
    r = client.put(f"/policies/urn:t:{STREAM}", data=policy.encode(),
                   headers=auth_header("nea", **XML))
    assert r.status_code == 400, r.json
    assert "obligations cannot be fulfilled" in r.json["error"] and r.json["line"]
    word = {"epsilon": "epsilon", "bounds": "bound", "budget": "budget",
            "unknown": "stream-window-dp-budgets-id"}[bad.split(":")[0]]
    assert word in r.json["error"]
    # the stored policy is unchanged: requests still get private windows
    assert ask(client).status_code == 201


@pytest.mark.parametrize("window, status", [
    ({"epsilon": 0.1}, 201), ({"epsilon": 0.6}, 403), ({"delta": 1e-9}, 403),
    ({"epsilon": "0.1"}, 400), ({"epsilon": None}, 400), ({"epsilon": 1e400}, 400),
    ({"epsilon": True}, 400), ({"delta": -1}, 400), ({"aggregates": ["rainrate:min"]}, 403),
])
def test_a_consumers_privacy_parameters(gw, window, status):
    client, *_ = gw
    if window.get("epsilon") == 1e400:  # not JSON: send the text
        r = client.post("/requests", headers=auth_header("lta"), data={
            "request": (__import__("io").BytesIO(sensor_request(STREAM)), "r.xml",
                        "application/xacml+xml"),
            "query": (__import__("io").BytesIO(b'{"window": {"type": "tuple", "size": 3, '
                                               b'"step": 2, "epsilon": 1e400}}'), "q.json",
                      "application/json")}, content_type="multipart/form-data")
    else:
        r = ask(client, **window)
    assert r.status_code == status, r.json
    assert r.json is not None and r.json.get("status", status) == status


def test_budgets_shown_spent_refused_and_kept_across_a_restart(gw):
    client, runtime, state, tmp_path = gw
    r = client.post("/explain", data=sensor_request(STREAM), headers=auth_header("lta", **XML))
    assert r.status_code == 200
    assert r.json["privacy"]["budgets"][0]["windows_affordable"] == 24
    assert r.json["plan"]["window"]["privacy"]["quantities"][0]["laplace_scale"] == 20
    r = ask(client)
    assert r.status_code == 201 and r.json["privacy"]["admitted"] is True
    handle_id = r.json["id"]
    assert runtime.push(handle_id, windows(range(0, 40, 2)))  # 20 windows: 10 of 12
    assert not runtime.push(handle_id, windows(range(40, 60, 2)))  # 4 paid, then spent
    record = state["services"].handles.get(handle_id)
    for _ in range(200):
        if not record.live:
            break
        __import__("time").sleep(0.02)
        record = state["services"].handles.get(handle_id)
    assert record.state.value == "ended" and record.reason.startswith("privacy budget spent")
    r = ask(client)
    assert r.status_code == 403 and r.json["budget"]["remaining"] == 0
    assert "12 per 86400 s" in r.json["error"] and r.json["budget"]["refills_at"]
    # another consumer has its own budget
    assert ask(client, who="other").status_code == 201
    # a restart: the ledger is read back
    state["services"].close()
    client2, _, services2 = start(tmp_path / "data")
    state["services"] = services2
    r = ask(client2)
    assert r.status_code == 403 and r.json["budget"]["spent"] == 12
    r = client2.post("/explain", data=sensor_request(STREAM), headers=auth_header("lta", **XML))
    assert r.json["privacy"]["admitted"] is False
    audit = (tmp_path / "data" / "audit" / "audit.log").read_text()
    assert "privacy budget spent" in audit and "sum_rainrate" not in audit


def spend_all(client, runtime, state) -> str:
    """A handle whose budget runs out with no reader connected: 24 windows paid, then ended."""
    r = ask(client)
    assert r.status_code == 201, r.json
    handle_id = r.json["id"]
    assert runtime.push(handle_id, windows(range(0, 40, 2)))
    assert not runtime.push(handle_id, windows(range(40, 60, 2)))
    for _ in range(200):
        if not state["services"].handles.get(handle_id).live:
            break
        __import__("time").sleep(0.02)
    assert state["services"].handles.get(handle_id).state.value == "ended"
    return handle_id


def read_lines(client, handle_id, **headers):
    r = client.get(f"/handles/{handle_id}",
                   headers=auth_header("lta", Accept="application/x-ndjson", **headers))
    lines = [json.loads(line) for line in r.get_data().splitlines() if line.strip()] \
        if r.status_code == 200 else r.json
    return r.status_code, lines


def test_the_paid_windows_stay_readable_after_the_budget_ran_out(gw):
    """(issue 41, item 6) "the rows it was given stay readable before that event": also for a
    reader that connects after the end (it was away, or reconnecting), since the windows are
    paid for; once a reader was given the final event the handle is 410 like any ended one."""
    client, runtime, state, _ = gw
    handle_id = spend_all(client, runtime, state)
    status, lines = read_lines(client, handle_id, **{"Last-Event-ID": "20"})
    assert status == 200, lines
    rows = [line for line in lines if "row" in line]
    assert [w["row"]["window_start"] for w in rows] == [40, 42, 44, 46]
    assert lines[-1]["event"] == "ended" and "privacy budget spent" in lines[-1]["reason"]
    # the final event was given: the handle is gone now, with its state and reason
    status, body = read_lines(client, handle_id)
    assert status == 410 and body["state"] == "ended"
    # the JSON description of an ended handle is a 410 throughout
    r = client.get(f"/handles/{handle_id}", headers=auth_header("lta", Accept="application/json"))
    assert r.status_code == 410


def test_the_gateways_server_streams_the_kept_windows_too(gw):
    """The same on the gateway's own server, where the event loop writes the stream."""
    import requests

    from server.serving import HttpServer

    client, runtime, state, _ = gw
    handle_id = spend_all(client, runtime, state)
    server = HttpServer(client.application, name="dp-gateway").start()
    try:
        url = f"{server.url}/handles/{handle_id}"
        r = requests.get(url, headers=auth_header("lta", Accept="text/event-stream",
                                                  **{"Last-Event-ID": "22"}), timeout=10)
        assert r.status_code == 200, r.text
        assert r.text.count("\ndata: {") == 3 and "event: ended" in r.text
        assert "privacy budget spent" in r.text.rsplit("event: ended", 1)[1]
        assert requests.get(url, headers=auth_header("lta"), timeout=10).status_code == 410
    finally:
        server.stop()


def test_kept_windows_are_their_owners_only_and_go_after_their_time(gw):
    client, runtime, state, _ = gw
    handles = state["services"].handles
    first = spend_all(client, runtime, state)
    r = client.get(f"/handles/{first}", headers=auth_header("other", Accept="application/x-ndjson"))
    assert r.status_code == 404  # another subject: as for no handle
    assert client.delete(f"/handles/{first}", headers=auth_header("lta")).status_code == 410
    # another consumer's handle (its own budget), kept for no time at all
    handles.kept_for = 0.0
    r = client.post("/requests", headers=auth_header("other"), data={
        "request": (__import__("io").BytesIO(sensor_request(STREAM)), "r.xml",
                    "application/xacml+xml"),
        "query": (__import__("io").BytesIO(json.dumps(
            {"window": {"type": "tuple", "size": 3, "step": 2}}).encode()), "q.json",
            "application/json")}, content_type="multipart/form-data")
    second = r.json["id"]
    assert runtime.push(second, windows(range(0, 40, 2)))
    assert not runtime.push(second, windows(range(40, 60, 2)))
    for _ in range(200):
        if not handles.get(second).live:
            break
        __import__("time").sleep(0.02)
    r = client.get(f"/handles/{second}", headers=auth_header("other",
                                                             Accept="application/x-ndjson"))
    assert r.status_code == 410
