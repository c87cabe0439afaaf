"""Handle streams on the gateway's own server: written by its I/O thread in whole chunks, with
notices, resumption and final events, and no thread held per reader."""
from __future__ import annotations

import json
import socket
import time

import pytest
import requests

from pep.core.rows import RowBatch
from server.serving import HttpServer
from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway
from tests.pep.http.test_handles_api import POLICIES, WEATHER, XML


def _live(tmp_path, heartbeat: float):
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path / "data", runtime, heartbeat=heartbeat)
    server = HttpServer(app, threads=4).start()
    url = server.url
    assert requests.post(f"{url}/streams", json=WEATHER, headers=auth_header("nea"),
                         timeout=10).status_code == 201
    assert requests.post(f"{url}/policies", timeout=10,
                         data=(POLICIES / "nea-weather-policy.xml").read_bytes(),
                         headers=auth_header("nea", **XML)).status_code == 201
    hid = requests.post(f"{url}/requests", data=(POLICIES / "lta-request.xml").read_bytes(),
                        headers=auth_header("lta", **XML), timeout=10).json()["id"]
    yield server, services, runtime, hid
    services.close_stream_side()
    server.stop()
    services.close()


@pytest.fixture
def live(tmp_path):
    yield from _live(tmp_path, heartbeat=0.3)


@pytest.fixture
def live_quiet(tmp_path):
    """Heartbeats far apart: nothing but data wakes the writer."""
    yield from _live(tmp_path, heartbeat=60.0)


def raw_get(server: HttpServer, path: str, accept: str, **headers) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: gw\r\nAccept: {accept}\r\n"
               f"Authorization: {auth_header('lta')['Authorization']}\r\n{extra}\r\n").encode())
    return s


class Chunks:
    """Reads a chunked response off a raw socket: its headers, then its chunks as sent."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.headers: dict | None = None

    def _need(self, want, deadline: float) -> None:
        while not (len(self.buf) >= want if isinstance(want, int) else want in self.buf):
            if time.monotonic() > deadline:
                raise TimeoutError(self.buf[-300:])
            data = self.sock.recv(65536)
            if not data:
                raise EOFError(self.buf[-300:])
            self.buf += data

    def until(self, marker: bytes, timeout: float = 10) -> list[bytes]:
        """Chunks up to the one that contains `marker`; EOFError after the last chunk."""
        deadline = time.monotonic() + timeout
        if self.headers is None:
            self._need(b"\r\n\r\n", deadline)
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            self.headers = dict(line.decode().lower().split(": ", 1)
                                for line in head.split(b"\r\n")[1:])
        out = []
        while True:
            self._need(b"\r\n", deadline)
            size_line, self.buf = self.buf.split(b"\r\n", 1)
            size = int(size_line, 16)
            self._need(size + 2, deadline)
            data, self.buf = self.buf[:size], self.buf[size + 2:]
            if size == 0:
                raise EOFError(b"".join(out))
            out.append(data)
            if marker in data:
                return out


def test_many_rows_go_out_in_a_few_writes(live):
    server, _, runtime, hid = live
    s = raw_get(server, f"/handles/{hid}", "application/x-ndjson")
    time.sleep(0.3)
    batch = RowBatch.of([{"avg_rainrate": float(i), "pad": "p" * 60} for i in range(3000)])
    assert runtime.push(hid, batch)
    reader = Chunks(s)
    got = reader.until(b'"avg_rainrate":2999.0')
    headers = reader.headers
    assert headers["transfer-encoding"] == "chunked" and headers["content-type"].startswith(
        "application/x-ndjson")
    lines = [json.loads(x) for c in got for x in c.decode().splitlines()]
    rows = [x for x in lines if "row" in x]
    assert [x["id"] for x in rows] == list(range(1, 3001))
    assert rows[0]["row"] == {"avg_rainrate": 0.0, "pad": "p" * 60}
    data_chunks = [c for c in got if b'"row"' in c]
    assert len(data_chunks) <= 10  # about 128 KiB per write, not a write per row


def test_a_large_batch_goes_out_at_once_not_a_pull_per_heartbeat(live_quiet):
    # One put of 6,000 rows wakes the writer once; a pull takes at most 1,000 events (about
    # 128 KiB): the writer must go on pulling while the body has data. It used to send the
    # rest a pull per heartbeat (here 60 s; a Kafka backlog of 50,000 rows lagged 8 s behind
    # Spark with heartbeats of 1 s).
    server, _, runtime, hid = live_quiet
    s = raw_get(server, f"/handles/{hid}", "application/x-ndjson")
    time.sleep(0.3)
    started = time.monotonic()
    assert runtime.push(hid, RowBatch.of([{"i": i} for i in range(6000)]))
    got = Chunks(s).until(b'"i":5999', timeout=20)
    assert time.monotonic() - started < 10
    ids = [json.loads(x)["id"] for c in got for x in c.decode().splitlines() if '"row"' in x]
    assert ids == list(range(1, 6001))


def test_sse_notice_resume_and_final_event(live):
    server, services, runtime, hid = live
    runtime.push(hid, [{"x": 1}])
    services.handles.buffer(hid).notice("stalled", {"seconds": 30})
    runtime.push(hid, [{"x": 2}])
    s = raw_get(server, f"/handles/{hid}", "text/event-stream")
    reader = Chunks(s)
    text = b"".join(reader.until(b'"x":2')).decode()
    assert reader.headers["content-type"].startswith("text/event-stream")
    assert text.startswith(": connected\n\n")
    assert 'id: 1\ndata: {"x":1}\n\n' in text
    assert 'id: 2\nevent: stalled\ndata: {"event":"stalled","seconds":30}\n\n' in text
    assert 'id: 3\ndata: {"x":2}\n\n' in text
    # idle: heartbeats; then the owner releases the handle: the final event, and the end
    reader.until(b": keep-alive")
    assert requests.delete(f"{server.url}/handles/{hid}", headers=auth_header("lta"),
                           timeout=10).status_code == 200
    rest = reader.until(b"event: released")
    assert b"id: 4\nevent: released\n" in b"".join(rest)
    with pytest.raises(EOFError):
        reader.until(b"never", timeout=5)  # the terminating chunk
    s.settimeout(5)
    assert s.recv(1) == b""  # and the close
    s.close()


def test_resume_with_last_event_id_over_ndjson(live):
    server, _, runtime, hid = live
    runtime.push(hid, [{"x": i} for i in range(5)])
    s = raw_get(server, f"/handles/{hid}", "application/x-ndjson", **{"Last-Event-ID": "3"})
    got = Chunks(s).until(b'"x":4')
    assert [json.loads(x)["id"] for c in got for x in c.decode().splitlines()] == [4, 5]


def test_readers_hold_no_thread(live):
    server, _, runtime, hid = live
    server.pool.idle_exit = 0.3
    socks = []
    # the per-subject limit (32 by default) bounds one subject's readers
    for _ in range(30):
        socks.append(raw_get(server, f"/handles/{hid}", "application/x-ndjson"))
    deadline = time.monotonic() + 10
    while server.stream_count < 30 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.stream_count == 30
    # the burst of requests started threads; once answered, the readers need none
    deadline = time.monotonic() + 10
    while server.thread_count > 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.thread_count == 4 and server.stream_count == 30
    runtime.push(hid, [{"x": 1}])
    for s in socks:
        got = Chunks(s).until(b'"x":1')
        assert b'{"id":1,"row":{"x":1}}' in b"".join(got)
        s.close()


def test_a_stream_is_logged_once_when_it_ends(live, caplog):
    """The access log's line for a handle stream comes when the stream ends (its duration is
    the stream's), with the handle's reference, never its id."""
    import logging

    server, _, runtime, hid = live
    caplog.set_level(logging.INFO, logger="xsg.access")
    s = raw_get(server, f"/handles/{hid}", "application/x-ndjson")
    reader = Chunks(s)
    runtime.push(hid, [{"x": 1}])
    reader.until(b'"x":1')
    time.sleep(0.5)
    streamed = [r for r in caplog.records if "/handles/ref:" in r.getMessage()]
    assert streamed == []  # still streaming: not logged yet
    assert requests.delete(f"{server.url}/handles/{hid}", headers=auth_header("lta"),
                           timeout=10).status_code == 200
    reader.until(b'"released"')
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        streamed = [r for r in caplog.records if r.getMessage().startswith("GET /handles/ref:")]
        if streamed:
            break
        time.sleep(0.05)
    assert len(streamed) == 1 and hid not in streamed[0].getMessage()
    assert streamed[0].access["status"] == 200 and streamed[0].access["duration_ms"] >= 500
