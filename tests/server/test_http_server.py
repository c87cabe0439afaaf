"""server.serving on its own (uvicorn, the strict protocol, the WSGI bridge): HTTP/1.1 framing,
limits and time-outs, the elastic pool, and streams written by the event loop. Raw sockets where
the wire matters. The framing classes of issue 19 against the real gateway and proxy are in
test_smuggling.py."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import requests

from server.serving import HttpServer
from server.streaming import STREAM_BODY


def echo_app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/boom":
        raise RuntimeError("boom")
    body = environ["wsgi.input"].read()
    doc = {"method": environ["REQUEST_METHOD"], "path": path,
           "query": environ["QUERY_STRING"], "body": body.decode("latin-1"),
           "x": environ.get("HTTP_X_TEST"), "ctype": environ.get("CONTENT_TYPE")}
    doc["host"] = environ.get("HTTP_HOST")
    doc["scheme"] = environ["wsgi.url_scheme"]
    doc["remote"] = environ["REMOTE_ADDR"]
    out = json.dumps(doc).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(out))),
                              ("Date", "Mon, 01 Jan 2001 00:00:00 GMT")])  # the server's wins
    return [out]


@pytest.fixture
def server():
    srv = HttpServer(echo_app, threads=2, max_threads=300, idle_timeout=1.0,
                     header_timeout=0.5, write_timeout=0.5, min_body_rate=100).start()
    yield srv
    srv.stop()


def connect(srv: HttpServer, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(5)
    s.connect(("127.0.0.1", srv.port))
    return s


class Wire:
    """Reads HTTP responses off a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if not self._more():
                raise EOFError
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def take(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._more():
                raise EOFError
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self, head_only: bool = False) -> tuple[int, dict, bytes]:
        status = int(self.line().split()[1])
        headers = {}
        self.all_headers = []
        while True:
            line = self.line()
            if not line:
                break
            k, v = line.decode().split(":", 1)
            headers[k.strip().lower()] = v.strip()
            self.all_headers.append(k.strip().lower())
        if head_only or status in (100, 204, 304):
            return status, headers, b""
        if "content-length" in headers:
            return status, headers, self.take(int(headers["content-length"]))
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int(self.line(), 16)
                if size == 0:
                    self.line()
                    return status, headers, body
                body += self.take(size)
                self.take(2)
        while self._more():
            pass
        body, self.buf = self.buf, b""
        return status, headers, body

    def closed(self, timeout: float) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True


def test_keep_alive_and_pipelined_requests(server):
    s = connect(server)
    s.sendall(b"GET /a?x=1 HTTP/1.1\r\nHost: h\r\nX-Test: 1\r\n\r\n"
              b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Type: t/x\r\n\r\nhello")
    w = Wire(s)
    st, hd, body = w.response()
    assert st == 200 and json.loads(body) == {"method": "GET", "path": "/a", "query": "x=1",
                                              "body": "", "x": "1", "ctype": None, "host": "h",
                                              "scheme": "http", "remote": "127.0.0.1"}
    assert hd["server"] == "xsg" and "connection" not in hd
    assert hd["date"] != "Mon, 01 Jan 2001 00:00:00 GMT"
    st, _, body = w.response()
    assert json.loads(body)["body"] == "hello" and json.loads(body)["ctype"] == "t/x"
    s.sendall(b"GET /c HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    st, hd, body = w.response()
    assert json.loads(body)["path"] == "/c" and hd["connection"] == "close"
    assert w.closed(2)


def test_chunked_upload_and_100_continue(server):
    s = connect(server)
    s.sendall(b"POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
              b"Expect: 100-continue\r\n\r\n")
    w = Wire(s)
    assert w.response(head_only=True)[0] == 100
    s.sendall(b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n")
    st, _, body = w.response()
    assert st == 200 and json.loads(body)["body"] == "hello world"
    # the same connection goes on
    s.sendall(b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
    assert json.loads(w.response()[2])["path"] == "/next"


def test_head_http10_and_quoted_slash(server):
    s = connect(server)
    s.sendall(b"HEAD /h HTTP/1.1\r\nHost: h\r\n\r\n")
    w = Wire(s)
    st, hd, _ = w.response(head_only=True)
    assert st == 200 and int(hd["content-length"]) > 0
    s.sendall(b"GET /p%3Aq/a%2Fb%20c HTTP/1.1\r\nHost: h\r\n\r\n")
    assert json.loads(w.response()[2])["path"] == "/p:q/a%2Fb c"
    s10 = connect(server)
    s10.sendall(b"GET /old HTTP/1.0\r\n\r\n")
    w10 = Wire(s10)
    doc = json.loads(w10.response()[2])
    assert doc["path"] == "/old" and doc["host"] is None  # HTTP/1.0 may omit Host
    assert w10.closed(2)


@pytest.mark.parametrize("raw, status", [
    (b"NONSENSE\r\n\r\n", 400),
    (b"GET / HTTP/2.0\r\n\r\n", 505),
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc", 400),
    (b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\n\r\n", 400),  # no Host
    (b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", 431),
])
def test_malformed_requests_get_a_json_error_and_the_connection_closes(server, raw, status):
    s = connect(server)
    s.sendall(raw)
    w = Wire(s)
    st, hd, body = w.response()
    assert st == status and hd["content-type"] == "application/json"
    assert json.loads(body)["status"] == status and json.loads(body)["error"]
    assert w.closed(2)


def test_one_date_header_and_the_server_name(server):
    s = connect(server)
    s.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    w = Wire(s)
    w.response()
    assert w.all_headers.count("date") == 1 and w.all_headers.count("server") == 1


def test_absolute_form_target_names_the_host_and_options_star(server):
    s = connect(server)
    s.sendall(b"GET http://gw.example:8080/p?q=1 HTTP/1.1\r\nHost: other\r\n\r\n")
    w = Wire(s)
    doc = json.loads(w.response()[2])
    assert doc["host"] == "gw.example:8080" and doc["path"] == "/p" and doc["query"] == "q=1"
    s.sendall(b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n")
    st, hd, _ = w.response()
    assert st == 200 and "GET" in hd["allow"]


def test_a_trickled_body_is_cut_after_the_grace_at_the_minimum_rate(server):
    """min_body_rate 100 bytes/s after header_timeout (0.5 s): one byte every 0.3 s fails."""
    s = connect(server)
    s.sendall(b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 50\r\n\r\n")
    t0 = time.monotonic()
    w = Wire(s)
    try:
        for _ in range(20):
            s.sendall(b"x")
            time.sleep(0.3)
    except OSError:
        pass
    st, _, body = w.response()
    assert st == 408 and "bytes/s" in json.loads(body)["error"]
    assert time.monotonic() - t0 < 5 and w.closed(2)
    assert server.thread_count == 2  # the body never held a thread


def test_a_body_over_the_limit_is_refused_before_it_is_read():
    srv = HttpServer(echo_app, threads=1, max_body=1000).start()
    try:
        s = connect(srv)
        s.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5000\r\n\r\n")
        st, hd, body = Wire(s).response()
        assert st == 413 and "1000 bytes" in json.loads(body)["error"]
        s = connect(srv)
        s.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                  + b"3e8\r\n" + b"y" * 1000 + b"\r\n" + b"1\r\nz\r\n0\r\n\r\n")
        assert Wire(s).response()[0] == 413
    finally:
        srv.stop()


def test_app_error_is_a_500_json(server):
    s = connect(server)
    s.sendall(b"GET /boom HTTP/1.1\r\nHost: h\r\n\r\n")
    st, _, body = Wire(s).response()
    assert st == 500 and "see the server log" in json.loads(body)["error"]


def test_slow_request_head_is_dropped_with_408(server):
    s = connect(server)
    s.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n")  # never finished
    st, _, body = Wire(s).response()
    assert st == 408 and "0.5 s" in json.loads(body)["error"]


def test_idle_connections_hold_no_thread_and_are_closed(server):
    threads = server.thread_count
    t0 = time.monotonic()
    socks = [connect(server) for _ in range(50)]
    time.sleep(0.3)
    assert server.connection_count == 50
    assert server.thread_count == threads  # waiting for a first byte takes no worker
    assert all(Wire(s).closed(5) for s in socks)
    assert 0.95 <= time.monotonic() - t0 < 5  # idle_timeout is 1 s, checked every 0.25 s
    # a keep-alive connection idle between requests, too
    s = connect(server)
    s.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    w = Wire(s)
    assert w.response()[0] == 200 and w.closed(3)
    deadline = time.monotonic() + 2
    while server.connection_count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.connection_count == 0


def test_connection_cap_answers_429_without_a_worker():
    srv = HttpServer(echo_app, threads=1, max_connections=3, retry_after=7).start()
    try:
        held = [connect(srv) for _ in range(3)]
        time.sleep(0.2)
        extra = connect(srv)
        extra.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        st, hd, body = Wire(extra).response()
        assert st == 429 and hd["retry-after"] == "7" and hd["connection"] == "close"
        doc = json.loads(body)
        assert doc["status"] == 429 and "at most 3" in doc["error"]
        held[0].close()
        deadline = time.monotonic() + 2
        while srv.connection_count > 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        again = connect(srv)
        again.sendall(b"GET /ok HTTP/1.1\r\nHost: h\r\n\r\n")
        assert Wire(again).response()[0] == 200
    finally:
        srv.stop()


def test_a_burst_of_long_requests_gets_a_thread_each_at_once():
    entered, release = [], threading.Event()

    def app(environ, start_response):
        entered.append(time.monotonic())
        release.wait(20)
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    srv = HttpServer(app, threads=2, max_threads=500).start()
    srv.pool.idle_exit = 0.5
    try:
        t0 = time.monotonic()
        results = []
        clients = [threading.Thread(target=lambda: results.append(
            requests.get(f"{srv.url}/", timeout=30).status_code)) for _ in range(200)]
        for c in clients:
            c.start()
        deadline = time.monotonic() + 15
        while len(entered) < 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(entered) == 200
        assert max(entered) - t0 < 10  # cheroot's pool: 16 threads per 0.2 s poll
        release.set()
        for c in clients:
            c.join(30)
        assert results == [200] * 200
        deadline = time.monotonic() + 10
        while srv.thread_count > 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert srv.thread_count == 2  # the surplus left once idle
    finally:
        release.set()
        srv.stop()


def test_a_generator_body_whose_client_does_not_read_is_cut():
    closed = threading.Event()

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])

        def body():
            try:
                while True:
                    yield b"x" * 65536
            finally:
                closed.set()
        return body()

    srv = HttpServer(app, threads=1, write_timeout=0.5).start()
    try:
        s = connect(srv, rcvbuf=4096)
        s.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert closed.wait(15)  # the worker gave up the write and closed the generator
        assert srv.stats["write_failed"] == 1
    finally:
        srv.stop()


class FakeBody:
    """A StreamBody fed by the test: `feed(bytes)`, `finish()`."""

    heartbeat_interval = 0.3

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.done = False
        self.wake = None
        self.closed = threading.Event()
        self.withdrawn = False
        self.lock = threading.Lock()

    def start(self, wake):
        self.wake = wake
        wake()

    def feed(self, data: bytes, finish: bool = False) -> None:
        with self.lock:
            self.parts.append(data)
            self.done = self.done or finish
        if self.wake:
            self.wake()

    def pull(self, max_bytes):
        with self.lock:
            out, self.parts = b"".join(self.parts), []
            return out, self.done

    def heartbeat(self):
        return b":hb\n"

    def retract(self):
        return self.withdrawn

    def close(self):
        self.closed.set()


def stream_server(body: FakeBody, **kw) -> HttpServer:
    def app(environ, start_response):
        environ[STREAM_BODY](body)
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "0")])
        return [b""]
    return HttpServer(app, threads=1, **kw).start()


def test_stream_body_is_written_by_the_io_thread_in_chunks_with_heartbeats():
    body = FakeBody()
    srv = stream_server(body)
    try:
        s = connect(srv)
        s.sendall(b"GET /s HTTP/1.1\r\nHost: h\r\n\r\n")
        w = Wire(s)
        st, hd, _ = w.response(head_only=True)
        assert st == 200 and hd["transfer-encoding"] == "chunked" and hd["connection"] == "close"
        assert "content-length" not in hd
        time.sleep(0.2)
        assert srv.stream_count == 1 and srv.thread_count == 1  # the worker is free again
        body.feed(b"one\n")
        body.feed(b"two\n")
        size = int(w.line(), 16)
        got = w.take(size)
        assert got in (b"one\n", b"one\ntwo\n")
        if got == b"one\n":
            w.take(2)
            assert w.take(int(w.line(), 16)) == b"two\n"
        w.take(2)
        # nothing for heartbeat_interval: a heartbeat chunk
        assert w.take(int(w.line(), 16)) == b":hb\n"
        w.take(2)
        body.feed(b"last\n", finish=True)
        assert w.take(int(w.line(), 16)) == b"last\n"
        w.take(2)
        assert w.line() == b"0" and w.line() == b""
        assert w.closed(2) and body.closed.wait(2)
    finally:
        srv.stop()


def test_stream_client_gone_closes_the_body():
    body = FakeBody()
    srv = stream_server(body)
    try:
        s = connect(srv)
        s.sendall(b"GET /s HTTP/1.1\r\nHost: h\r\n\r\n")
        Wire(s).response(head_only=True)
        s.close()
        assert body.closed.wait(3)
        deadline = time.monotonic() + 2
        while srv.connection_count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.connection_count == 0 and srv.stream_count == 0
    finally:
        srv.stop()


def test_stream_whose_client_does_not_read_is_cut_after_the_write_bound():
    body = FakeBody()
    srv = stream_server(body, write_timeout=0.6)
    try:
        s = connect(srv, rcvbuf=4096)
        s.sendall(b"GET /s HTTP/1.1\r\nHost: h\r\n\r\n")
        time.sleep(0.2)
        t0 = time.monotonic()
        for _ in range(40):
            body.feed(b"y" * 65536)
            time.sleep(0.01)
        assert body.closed.wait(10)
        assert time.monotonic() - t0 >= 0.6 and srv.stats["stalled_closed"] == 1
        assert srv.stream_count == 0
    finally:
        srv.stop()


def test_a_stream_pulls_only_what_the_connection_can_take():
    """A reader that does not read: the body is not drained into the server's buffers, so what
    it withholds later (a revoked handle's rows) never reaches the reader."""
    body = FakeBody()
    body.pull = lambda max_bytes: bounded_pull(body, max_bytes)
    srv = stream_server(body)
    try:
        s = connect(srv, rcvbuf=4096)
        s.sendall(b"GET /s HTTP/1.1\r\nHost: h\r\n\r\n")
        w = Wire(s)
        w.response(head_only=True)
        for _ in range(40):  # 2.5 MiB offered to a reader that reads nothing
            body.feed(b"z" * 65536)
            time.sleep(0.01)
        time.sleep(0.5)
        with body.lock:
            body.parts = []  # withdrawn: what was not pulled is gone
            body.parts.append(b"FINAL\n")
            body.done = True
        body.wake()
        s.settimeout(5)
        data = w.buf
        try:
            while True:
                more = s.recv(1 << 20)
                if not more:
                    break
                data += more
        except (TimeoutError, ConnectionResetError):
            pass
        assert body.closed.wait(3)
        assert data.count(b"z") < 1024 * 1024  # the transport's and the socket's buffers
        assert data.endswith(b"FINAL\n\r\n0\r\n\r\n")
    finally:
        srv.stop()


def bounded_pull(body: FakeBody, max_bytes: int) -> tuple[bytes, bool]:
    with body.lock:
        data = b"".join(body.parts)
        out, rest = data[:max_bytes], data[max_bytes:]
        body.parts = [rest] if rest else []
        return out, body.done and not rest


def test_stop_lets_streams_send_their_last_bytes():
    body = FakeBody()
    srv = stream_server(body)
    s = connect(srv)
    s.sendall(b"GET /s HTTP/1.1\r\nHost: h\r\n\r\n")
    w = Wire(s)
    w.response(head_only=True)
    time.sleep(0.2)
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    time.sleep(0.2)
    body.feed(b"bye\n", finish=True)  # e.g. the `shutdown` event of a handle
    stopper.join(10)
    assert not stopper.is_alive()
    chunk = b":hb\n"
    while chunk == b":hb\n":
        chunk = w.take(int(w.line(), 16))
        w.take(2)
    assert chunk == b"bye\n"


def self_signed(tmp_path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and localhost, and its key (PEM files)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_tls(tmp_path):
    cert, key = self_signed(tmp_path)
    srv = HttpServer(echo_app, threads=1, tls_cert=cert, tls_key=key).start()
    try:
        assert srv.url.startswith("https://")
        doc = requests.get(f"{srv.url}/t", verify=cert, timeout=10).json()
        assert doc["scheme"] == "https" and doc["path"] == "/t"
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(f"{srv.url}/t", timeout=10)  # not a CA the system trusts
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(srv.url.replace("https", "http") + "/t", timeout=10)
    finally:
        srv.stop()


def test_a_certificate_without_its_key_is_refused(tmp_path):
    cert, _ = self_signed(tmp_path)
    with pytest.raises(ValueError):
        HttpServer(echo_app, tls_cert=cert)


@pytest.mark.parametrize("trusted", [True, False])
def test_forwarded_headers_only_from_trusted_proxies(trusted):
    srv = HttpServer(echo_app, threads=1,
                     forwarded_allow_ips=["127.0.0.1"] if trusted else []).start()
    try:
        doc = requests.get(f"{srv.url}/f", timeout=10, headers={
            "X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"}).json()
        if trusted:
            assert doc["remote"] == "203.0.113.9" and doc["scheme"] == "https"
        else:
            assert doc["remote"] == "127.0.0.1" and doc["scheme"] == "http"
    finally:
        srv.stop()
