"""Issue 19: malformed and ambiguous requests, on raw sockets, against the real gateway and the
caching proxy in front of it.

Every case is one malformed request with something behind it that would change state if it
ran: a `DELETE /handles/<id>` of a live handle, or a `POST /policies` adding a policy (smuggled
in a header value, after a body whose framing is refused, or pipelined after the malformed
request; the malformed request itself is a policy write where it can be). Each case must get a
4xx, with the one JSON error body, or a closed connection, never a 2xx or 5xx, within a
second or two; and afterwards the handle is still live and the policies are the same. The
classes: (1) chunked framing, (2) control characters in header values, (3) Host and the request
target's form, (4) connection handling, (5) deadlines, (6) the proxy's path, (7) one Date.
"""
from __future__ import annotations

import json
import socket
import time

import pytest
import requests

from proxy.app import ProxyConfig, create_app as create_proxy_app, runtime_of
from server.serving import HttpServer
from tests.pep.conftest import TOKENS, RecordingRuntime, auth_header, build_gateway
from tests.pep.http.test_handles_api import POLICIES, WEATHER, XML

S = "http://www.w3.org/2001/XMLSchema#string"


def policy(n: int) -> bytes:
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
  PolicyId="urn:t:smuggled-{n}" Version="1"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
  <Target/><Rule RuleId="r" Effect="Permit"/></Policy>""".encode()


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    """The gateway (a live handle of lta's) and a proxy in front of it, each on its server."""
    runtime = RecordingRuntime()
    app, services = build_gateway(tmp_path_factory.mktemp("smuggling") / "data", runtime)
    gateway = HttpServer(app, threads=4, header_timeout=1.0, idle_timeout=3.0).start()
    url = gateway.url
    assert requests.post(f"{url}/streams", json=WEATHER, headers=auth_header("nea"),
                         timeout=10).status_code == 201
    assert requests.post(f"{url}/policies", timeout=10,
                         data=(POLICIES / "nea-weather-policy.xml").read_bytes(),
                         headers=auth_header("nea", **XML)).status_code == 201
    hid = requests.post(f"{url}/requests", data=(POLICIES / "lta-request.xml").read_bytes(),
                        headers=auth_header("lta", **XML), timeout=10).json()["id"]
    proxy_app = create_proxy_app(ProxyConfig(upstream=url, require_feed=False,
                                             start_feed=False))
    proxy = HttpServer(proxy_app, name="proxy", threads=4, header_timeout=1.0,
                       idle_timeout=3.0).start()
    yield {"gateway": gateway, "proxy": proxy, "services": services, "hid": hid}
    runtime_of(proxy_app).close()
    proxy.stop()
    services.close_stream_side()
    gateway.stop()
    services.close()


def state(services, hid: str) -> tuple:
    record = services.handles.get(hid)
    return record.live, sorted(services.policies.engine.policies)


# -- the cases ------------------------------------------------------------------------------------

def smuggled_delete(hid: str) -> bytes:
    return (f"DELETE /handles/{hid} HTTP/1.1\r\nHost: gw\r\n"
            f"Authorization: Bearer {TOKENS['lta']}\r\n\r\n").encode()


def smuggled_policy(n: int) -> bytes:
    body = policy(n)
    return (f"POST /policies HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {TOKENS['nea']}\r\n"
            f"Content-Type: application/xacml+xml\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


def policy_head(extra: str = "", version: str = "1.1", target: str = "/policies",
                host: str | None = "Host: gw\r\n", method: str = "POST") -> bytes:
    return (f"{method} {target} HTTP/{version}\r\n{host or ''}"
            f"Authorization: Bearer {TOKENS['nea']}\r\nContent-Type: application/xacml+xml\r\n"
            f"{extra}").encode()


def chunked(chunks: bytes) -> bytes:
    return policy_head("Transfer-Encoding: chunked\r\n\r\n") + chunks


def sized(body: bytes, head_extra: str = "", **kw) -> bytes:
    return policy_head(f"Content-Length: {len(body)}\r\n{head_extra}\r\n", **kw) + body


def cases(hid: str) -> dict[str, bytes]:
    delete = smuggled_delete(hid)
    body = policy(900)
    n = len(body)
    hexn = f"{n:x}".encode()
    c: dict[str, bytes] = {}
    # (1) chunked framing: sizes, extensions, trailers, chunk ends
    c["1 size 0x"] = chunked(b"0x" + hexn + b"\r\n" + body + b"\r\n0\r\n\r\n") + delete
    c["1 size +"] = chunked(b"+" + hexn + b"\r\n" + body + b"\r\n0\r\n\r\n") + delete
    c["1 size _"] = chunked(b"0_" + hexn + b"\r\n" + body + b"\r\n0\r\n\r\n") + delete
    c["1 last chunk -0"] = chunked(hexn + b"\r\n" + body + b"\r\n-0\r\n\r\n") + delete
    c["1 size with space inside"] = chunked(hexn[:1] + b" " + hexn[1:] + b"\r\n" + body
                                            + b"\r\n0\r\n\r\n") + delete
    c["1 size not hex"] = chunked(b"g" + hexn + b"\r\n" + body + b"\r\n0\r\n\r\n") + delete
    c["1 size empty"] = chunked(b"\r\n" + body + b"\r\n0\r\n\r\n") + delete
    c["1 size overflow"] = chunked(b"1" + b"0" * 17 + b"\r\n" + body + b"\r\n0\r\n\r\n") + delete
    c["1 extension with bare LF"] = chunked(hexn + b";a\nb\r\n" + body + b"\r\n0\r\n\r\n") \
        + delete
    c["1 extension with bare CR"] = chunked(hexn + b";a\rb\r\n" + body + b"\r\n0\r\n\r\n") \
        + delete
    c["1 extension with NUL"] = chunked(hexn + b";a\x00b\r\n" + body + b"\r\n0\r\n\r\n") + delete
    c["1 size line ends with bare LF"] = chunked(hexn + b"\n" + body + b"\r\n0\r\n\r\n") + delete
    c["1 chunk longer than its size"] = chunked(b"5\r\n" + body + b"\r\n0\r\n\r\n") + delete
    c["1 chunk not ended by CRLF"] = chunked(hexn + b"\r\n" + body + b"XX0\r\n\r\n") + delete
    c["1 trailer without colon"] = chunked(hexn + b"\r\n" + body + b"\r\n0\r\nnocolon\r\n\r\n") \
        + delete
    c["1 trailer with bare LF"] = chunked(hexn + b"\r\n" + body + b"\r\n0\r\nX: a\nY: b\r\n\r\n") \
        + delete
    c["1 request as trailer"] = chunked(hexn + b"\r\n" + body + b"\r\n0\r\n") + delete
    # (2) header values with bare CR, bare LF, NUL; a request inside a header value
    c["2 bare CR in value"] = sized(body, "X-A: a\rb\r\n") + delete
    c["2 bare LF in value"] = sized(body, "X-A: a\nb: c\r\n") + delete
    c["2 NUL in value"] = sized(body, "X-A: a\x00b\r\n") + delete
    c["2 DEL in value"] = sized(body, "X-A: a\x7fb\r\n") + delete
    c["2 request in a value (LF)"] = sized(body, "X-A: a\n\n" + delete.decode().replace(
        "\r\n", "\n") + "\r\n")
    c["2 request in a value (CR)"] = sized(body, "X-A: a\r\r" + delete.decode().replace(
        "\r\n", "\r") + "\r\n")
    c["2 obs-fold"] = sized(body, "X-A: a\r\n b\r\n") + delete
    c["2 space before colon"] = sized(body, "X-A : a\r\n") + delete
    c["2 header without colon"] = sized(body, "X-A a\r\n") + delete
    c["2 empty header name"] = sized(body, ": a\r\n") + delete
    c["2 head with bare LF line ends"] = (policy_head().replace(b"\r\n", b"\n")
                                          + f"Content-Length: {n}\n\n".encode() + body + delete)
    # (3) Host and the target's form
    c["3 no Host on 1.1"] = sized(body, host=None) + delete
    c["3 two Hosts"] = sized(body, "Host: other\r\n") + delete
    c["3 Host with space"] = sized(body, host="Host: g w\r\n") + delete
    c["3 Host with userinfo"] = sized(body, host="Host: u@gw\r\n") + delete
    c["3 Host list"] = sized(body, host="Host: a,b\r\n") + delete
    c["3 empty Host"] = sized(body, host="Host: \r\n") + delete
    c["3 Host port out of range"] = sized(body, host="Host: gw:99999\r\n") + delete
    c["3 absolute-form gopher"] = sized(body, target="gopher://gw/policies") + delete
    c["3 absolute-form with userinfo"] = sized(body, target="http://u@gw/policies") + delete
    c["3 absolute-form without authority"] = sized(body, target="http:///policies") + delete
    c["3 * for POST"] = sized(body, target="*") + delete
    c["3 authority-form"] = sized(body, target="gw:80") + delete
    c["3 relative target"] = sized(body, target="policies") + delete
    # (4) connection handling
    c["4 HTTP/1.0 with Transfer-Encoding"] = (
        policy_head("Transfer-Encoding: chunked\r\n\r\n", version="1.0")
        + hexn + b"\r\n" + body + b"\r\n0\r\n\r\n" + delete)
    c["4 two Connection headers"] = sized(body, "Connection: close\r\nConnection: keep-alive\r\n") \
        + delete
    c["4 NUL in target"] = sized(body, target="/poli\x00cies") + delete
    c["4 TAB in target"] = sized(body, target="/poli\tcies") + delete
    c["4 non-ASCII in target"] = sized(body, target="/poli\xffcies") + delete
    c["4 Transfer-Encoding and Content-Length"] = (
        policy_head(f"Content-Length: {n + 20}\r\nTransfer-Encoding: chunked\r\n\r\n")
        + b"0\r\n\r\n" + delete)
    c["4 two Content-Lengths"] = sized(body, f"Content-Length: {n + 5}\r\n") + delete
    c["4 signed Content-Length"] = policy_head(f"Content-Length: +{n}\r\n\r\n") + body + delete
    c["4 Transfer-Encoding gzip, chunked"] = (
        policy_head("Transfer-Encoding: gzip, chunked\r\n\r\n") + hexn + b"\r\n" + body
        + b"\r\n0\r\n\r\n" + delete)
    c["4 Transfer-Encoding xchunked"] = (
        policy_head("Transfer-Encoding: xchunked\r\n\r\n") + hexn + b"\r\n" + body
        + b"\r\n0\r\n\r\n" + delete)
    c["4 two Transfer-Encodings"] = (
        policy_head("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n")
        + hexn + b"\r\n" + body + b"\r\n0\r\n\r\n" + delete)
    c["4 HTTP/1.2"] = sized(body, version="1.2") + delete
    c["4 bad method"] = sized(body, method="PO\x01ST") + delete
    c["4 CONNECT"] = (b"CONNECT gw:80 HTTP/1.1\r\nHost: gw:80\r\n\r\n" + delete)
    c["4 policy write smuggled behind a malformed one"] = sized(body, "X-A: \x00\r\n") \
        + smuggled_policy(901)
    return c


def exchange(port: int, raw: bytes, timeout: float = 4.0) -> tuple[bytes, float]:
    """Send `raw`, read until the server closes (or `timeout`); (what came back, seconds)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    t0 = time.monotonic()
    out = b""
    try:
        s.sendall(raw)
        while True:
            data = s.recv(65536)
            if not data:
                break
            out += data
    except (TimeoutError, ConnectionResetError, BrokenPipeError):
        pass
    finally:
        s.close()
    return out, time.monotonic() - t0


def responses(data: bytes) -> list[tuple[int, dict, bytes]]:
    """The responses in `data` (Content-Length framed, as every refusal is)."""
    out = []
    while data.startswith(b"HTTP/1.1 "):
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            headers[k.strip().lower().decode()] = v.strip().decode()
        length = int(headers.get("content-length", "0"))
        out.append((status, headers, rest[:length]))
        data = rest[length:]
    return out


CASE_NAMES = sorted(cases("x"))


@pytest.mark.parametrize("where", ["gateway", "proxy"])
@pytest.mark.parametrize("name", CASE_NAMES)
def test_a_malformed_request_runs_nothing_and_gets_a_4xx(edge, where, name):
    services, hid = edge["services"], edge["hid"]
    before = state(services, hid)
    assert before[0], "the handle must be live before each case"
    data, took = exchange(edge[where].port, cases(hid)[name])
    answers = responses(data)
    assert took < 3.0, f"{name}: {took:.1f} s to answer or close"
    assert len(answers) <= 1, f"{name}: more than one answer: {data[:300]!r}"
    for status, headers, body in answers:
        assert 400 <= status < 500, f"{name}: answered {status}: {body[:200]!r}"
        assert headers.get("content-type") == "application/json", name
        doc = json.loads(body)
        assert set(doc) == {"error", "status"} and doc["status"] == status and doc["error"]
    assert state(services, hid) == before, f"{name}: something behind it ran"


def test_there_are_enough_cases_in_every_class():
    classes = {}
    for name in CASE_NAMES:
        classes.setdefault(name.split()[0], []).append(name)
    assert len(CASE_NAMES) >= 40 and set(classes) == {"1", "2", "3", "4"}


@pytest.mark.parametrize("where", ["gateway", "proxy"])
def test_a_well_formed_request_of_the_same_shape_runs(edge, where):
    """The control: the same policy write, well formed, chunked and pipelined, is executed
    (so the cases above fail for their defect, not for their shape)."""
    services = edge["services"]
    n = 950 if where == "gateway" else 951
    body = policy(n)
    raw = chunked(f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
    raw += f"DELETE /policies/urn:t:smuggled-{n} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " \
           f"{TOKENS['nea']}\r\nConnection: close\r\n\r\n".encode()
    data, _ = exchange(edge[where].port, raw)
    assert [status for status, _, _ in responses(data)] == [201, 204], data[:500]
    assert f"urn:t:smuggled-{n}" not in services.policies.engine.policies


@pytest.mark.parametrize("where", ["gateway", "proxy"])
def test_trickled_bodies_hold_no_thread_and_health_stays_fast(edge, where):
    """(5) Bodies sent one byte every 0.5 s are cut after the grace (header_timeout, 1 s here)
    at the minimum rate (1,024 bytes/s by default); /health answers meanwhile."""
    server = edge[where]
    threads = server.thread_count
    socks = []
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        s.sendall(sized(b"x" * 5000)[:-5000])
        socks.append(s)
    t0 = time.monotonic()
    slowest = 0.0
    for _ in range(6):
        for s in socks:
            try:
                s.send(b"x")
            except OSError:
                pass
        started = time.monotonic()
        path = "/health" if where == "gateway" else "/proxy/health"
        assert requests.get(f"{server.url}{path}", timeout=5).status_code == 200
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.5)
    assert slowest < 1.0
    assert server.thread_count <= max(threads, 4)
    for s in socks:
        s.settimeout(5)
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        assert data.startswith(b"HTTP/1.1 408 "), data[:200]
        s.close()
    assert time.monotonic() - t0 < 8


def test_the_proxy_forwards_the_path_it_was_given(edge):
    """(6) `/%2570olicies` is `/%70olicies` once decoded: not /policies, on the proxy as on the
    gateway (the proxy used to decode it a second time)."""
    for where in ("gateway", "proxy"):
        url = edge[where].url
        assert requests.get(f"{url}/policies", headers=auth_header("nea"),
                            timeout=10).status_code == 200
        assert requests.get(f"{url}/%2570olicies", headers=auth_header("nea"),
                            timeout=10).status_code == 404, where


def test_a_console_file_has_one_date_header(edge):
    """(7) send_from_directory sets a Date of its own; the server's is the only one sent."""
    data, _ = exchange(
        edge["gateway"].port,
        b"GET /console/console.css HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
    )
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 200") and head.count(b"\r\ndate:") == 1
