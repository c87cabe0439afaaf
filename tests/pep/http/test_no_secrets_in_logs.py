"""No log line carries a handle id, a bearer token, a read token or a proxy secret (issue 20,
class 3: the invalidation hub wrote full handle ids to stderr).

A representative run of the gateway in process, every log record captured with the root logger
at DEBUG: stream requests, handle reads (bearer and read token), a join, revocations by a policy
change and by a stream event, releases, the invalidation feed and webhooks (one receiver
answers, one is down), and refusals of every kind. Then every record (its message, arguments,
extra fields and traceback) is searched for every secret the run handed out.
"""
from __future__ import annotations

import http.server
import logging
import threading

import pytest

from pep.core.refs import handle_ref
from proxy.forward import loggable_url_path
from tests.pep.http.boundaries import (
    ADMIN,
    ALICE,
    BOB,
    CAROL,
    DAVE,
    JSON_TYPE,
    PROXY_SECRET,
    PROXY_TOKEN,
    READ_TOKEN_KEY,
    TOKENS,
    XML,
    build,
    join_query,
    policy,
    reading,
    request,
    stream_json,
    stream_obligations,
)


class Capture(logging.Handler):
    """Every record that reaches the root logger, formatted as a log line would be (with its
    traceback), plus its arguments and extra fields."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.records: list[logging.LogRecord] = []
        self.formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception as exc:  # noqa: BLE001 - a record that does not format: keep its parts
            text = f"{record.msg!r} {exc!r}"
        extra = {k: v for k, v in record.__dict__.items() if k not in _PLAIN}
        self.lines.append(f"{text} | args={record.args!r} | extra={extra!r}")
        self.records.append(record)


_PLAIN = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class Receiver(http.server.BaseHTTPRequestHandler):
    """A caching proxy's webhook endpoint: acknowledges every event."""

    def do_POST(self) -> None:  # the http.server API
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:  # its own stderr lines are not the gateway's
        pass


@pytest.fixture
def captured():
    root = logging.getLogger()
    capture = Capture()
    level = root.level
    root.addHandler(capture)
    root.setLevel(logging.DEBUG)
    try:
        yield capture
    finally:
        root.removeHandler(capture)
        root.setLevel(level)


@pytest.fixture
def receiver():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/proxy/invalidate"
    server.shutdown()
    server.server_close()


def test_a_representative_run_logs_no_handle_id_token_or_secret(tmp_path, captured, receiver):
    dead = "http://user:pw-b0und4ry@127.0.0.1:9/proxy/invalidate?key=q-b0und4ry"
    gw = build(tmp_path / "data", webhooks=(receiver, dead))
    secrets = {*TOKENS.values(), PROXY_TOKEN, PROXY_SECRET, READ_TOKEN_KEY, "pw-b0und4ry",
               "q-b0und4ry"}
    handles: list[str] = []
    try:
        call = gw.call
        for who, name in ((ALICE, "astream"), (BOB, "bstream")):
            assert call("POST", "/streams", who, json=stream_json(name)).status_code == 201
        assert call("POST", "/streams/bstream/events", BOB, json={
            "name": "bevent", "condition": "speed > 50", "key": "area"}).status_code == 201
        waits = reading("condition", "urn:xsg:event:bstream:bevent")
        for who, pid, stream, extra in ((ALICE, "urn:alice:p", "astream", {}),
                                        (BOB, "urn:bob:p", "bstream", waits)):
            doc = policy(pid, (stream,), (CAROL,),
                         obligations=stream_obligations("speed > 1", ("ts", "mmsi", "area")),
                         **extra)
            assert call("POST", "/policies", who, data=doc, headers=XML).status_code == 201
        # a single stream's handle: granted, read with the bearer token and with a read token
        r = call("POST", "/requests", CAROL, data=request("astream"), headers=JSON_TYPE)
        assert r.status_code == 201
        single = r.json["id"]
        handles.append(single)
        assert call("POST", "/requests", CAROL, data=request("astream"),
                    headers=JSON_TYPE).json["id"] == single  # the same handle again
        gw.runtime.push(single, [{"ts": "2026-01-01T00:00:00Z", "mmsi": 1, "area": "A"}])
        assert call("GET", f"/handles/{single}", CAROL,
                    headers={"Accept": "application/json"}).status_code == 200
        r = call("POST", f"/handles/{single}/read-token", CAROL)
        assert r.status_code == 201
        token = r.json["read_token"]
        secrets.add(token)
        streamed = gw.client.get(f"/handles/{single}?read_token={token}",
                                 headers={"Accept": "application/x-ndjson"}, buffered=False)
        assert streamed.status_code == 200
        # refusals: another's handle, an unknown one, a bad token, a read token on another
        # handle, a window conflict, a denial
        assert call("GET", f"/handles/{single}", DAVE).status_code == 404
        assert call("GET", "/handles/" + "x" * 43, CAROL).status_code == 404
        assert gw.client.get("/handles", headers={
            "Authorization": "Bearer not-a-token-b0und4ry"}).status_code == 401
        secrets.add("not-a-token-b0und4ry")
        assert gw.client.get(f"/handles/{'y' * 43}?read_token={token}").status_code in (401, 404)
        assert call("POST", "/requests", CAROL, data=request("astream", {"filter": "mmsi > 3"}),
                    headers=JSON_TYPE).status_code == 409
        assert call("POST", "/requests", DAVE, data=request("astream"),
                    headers=JSON_TYPE).status_code == 403
        # a policy change revokes the handle while its stream is being read
        narrower = policy("urn:alice:p", ("astream",), (CAROL,), obligations=stream_obligations(
            "speed > 2", ("ts", "mmsi", "area")))
        assert call("PUT", "/policies/urn:alice:p", ALICE, data=narrower,
                    headers=XML).status_code == 200
        body = b"".join(streamed.response)
        assert b'"revoked"' in body
        assert call("GET", f"/handles/{single}", CAROL).status_code == 410
        # a join, opened by Bob's event and revoked when it closes; then one released
        gw.open_event("bstream", "bevent", "KEY-1")
        r = call("POST", "/requests", CAROL, data=request("astream", join_query("bstream")),
                 headers=JSON_TYPE)
        assert r.status_code == 201, r.json
        handles.append(r.json["id"])
        gw.services.stream_events._clock = lambda: 4e9
        assert gw.services.stream_events.tick()
        assert gw.services.handles.get(r.json["id"]).state.value == "revoked"
        r = call("POST", "/requests", CAROL, data=request("astream"), headers=JSON_TYPE)
        handles.append(r.json["id"])
        assert call("DELETE", f"/handles/{r.json['id']}", CAROL).status_code == 200
        # the invalidation feed and its subscribers, with the proxy token and as administrator
        proxy = {"Authorization": f"Bearer {PROXY_TOKEN}"}
        feed = gw.client.get("/events/invalidations?after=0", headers=proxy)
        assert feed.status_code == 200 and feed.json["events"]
        assert any(single in e["handle_ids"] for e in feed.json["events"])  # the feed carries ids
        assert gw.client.get("/events/invalidations/subscribers",
                             headers=proxy).status_code == 200
        assert call("GET", "/events/invalidations?after=0", ADMIN).status_code == 200
        assert call("GET", "/events/invalidations?after=0", ALICE).status_code == 403
        # the audit and the metrics are read too
        assert call("GET", "/audit", ADMIN).status_code == 200
        assert gw.client.get("/metrics").status_code == 200
    finally:
        gw.services.close()

    lines = captured.lines
    assert len(handles) == 3 and all(handles)
    leaks = [(secret[:12], line) for line in lines for secret in (*secrets, *handles)
             if secret in line]
    assert leaks == [], "\n".join(f"{s}...: {line}" for s, line in leaks[:20])
    # the run was captured: access lines name handles by reference, and the hub logged its
    # invalidations (refs, not ids), the dead webhook's failure without its credentials
    assert any(f"/handles/ref:{handle_ref(single)}" in line for line in lines)
    hub = [line for line in lines if line.startswith("pep.invalidation.hub")]
    assert any(handle_ref(single) in line for line in hub), hub
    assert any("127.0.0.1:9/proxy/invalidate" in line and "stale" in line for line in hub), hub


def test_the_proxy_logs_an_upstream_handle_url_by_its_reference():
    hid = "a" * 43
    shown = loggable_url_path(f"http://gw:8080/handles/{hid}?read_token=v1.2.3.x.y")
    assert shown == f"/handles/ref:{handle_ref(hid)}"
    assert loggable_url_path("http://gw/streams") == "/streams"
