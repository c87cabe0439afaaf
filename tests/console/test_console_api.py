"""The console's server side without a browser: its files and headers, whoami, the live-handle
count of a policy, handle read tokens (what they open and what they do not), and CORS."""
from __future__ import annotations

import re
import time

import pytest
import requests

from pep.http.cors import normalise_origins
from pep.http.read_tokens import ReadTokens
from tests.console.conftest import WEATHER_POLICY_ID

XML = {"Content-Type": "application/xacml+xml"}
LTA_REQUEST = (__import__("pathlib").Path(__file__).resolve().parents[2] / "policies" / "weather"
               / "lta-request.xml").read_bytes()


def open_handle(gw, who: str = "lta") -> str:
    r = gw.api("POST", "/requests", who=who, data=LTA_REQUEST, headers=XML)
    assert r.status_code in (200, 201), r.text
    return r.json()["id"]


@pytest.fixture
def weather_gw(gateway):
    gateway.add_weather()
    gateway.add_weather_policy()
    return gateway


# -- files and whoami ---------------------------------------------------------------------------

def test_console_is_served_with_a_strict_policy(gateway):
    for path in ("/console", "/console/", "/console/app.js", "/console/console.css"):
        r = requests.get(gateway.url + path, timeout=5)
        assert r.status_code == 200, path
        csp = r.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert r.headers["Referrer-Policy"] == "no-referrer"
        assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert "text/html" in requests.get(gateway.url + "/console", timeout=5).headers["Content-Type"]
    assert "javascript" in requests.get(gateway.url + "/console/app.js",
                                        timeout=5).headers["Content-Type"]
    for bad in ("/console/nothing.js", "/console/%2e%2e%2fsetup.cfg", "/console/..%2fconsole.py",
                "/console/index.html.bak"):
        assert requests.get(gateway.url + bad, timeout=5).status_code == 404, bad


def test_the_page_itself_stores_no_token():
    from pep.http.console import STATIC_DIR
    script = (STATIC_DIR / "app.js").read_text()
    code = re.sub(r"/\*.*?\*/", "", script, flags=re.S)  # the comments may name them
    for pattern in (r"localStorage", r"sessionStorage", r"document\.cookie", r"innerHTML",
                    r"outerHTML", r"insertAdjacentHTML", r"\beval\(", r"new Function"):
        assert not re.search(pattern, code), pattern


def test_whoami(gateway):
    r = gateway.api("GET", "/console/whoami", who="nea")
    assert r.json() == {"subject": "nea", "roles": ["data-owner"], "admin": True,
                        "may_register_streams": True}
    assert gateway.api("GET", "/console/whoami", who="lta").json()["may_register_streams"] is False
    assert requests.get(gateway.url + "/console/whoami", timeout=5).status_code == 401


# -- the live handles a policy deletion would touch --------------------------------------------

def test_policy_handles_counts_live_handles_for_managers_only(weather_gw):
    gw = weather_gw
    path = f"/policies/{WEATHER_POLICY_ID}/handles"
    assert gw.api("GET", path).json() == {"policy": WEATHER_POLICY_ID, "live_handles": 0,
                                          "streams": {}, "subjects": []}
    hid = open_handle(gw, "lta")
    body = gw.api("GET", path).json()
    assert body == {"policy": WEATHER_POLICY_ID, "live_handles": 1, "streams": {"weather": 1},
                    "subjects": ["lta"]}
    assert hid not in str(body)
    assert gw.api("GET", path, who="lta").status_code == 403
    assert gw.api("GET", "/policies/urn:none/handles").status_code == 404
    assert gw.api("DELETE", f"/handles/{hid}", who="lta").status_code == 200
    assert gw.api("GET", path).json()["live_handles"] == 0


def test_a_policy_whose_id_ends_in_handles_stays_readable(gateway):
    xml = (
        '<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="p/handles" '
        'Version="1.0" RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:'
        'first-applicable"><Target/><Rule RuleId="r" Effect="Deny"/></Policy>')
    gateway.add_policy(xml)
    r = gateway.api("GET", "/policies/p/handles")
    assert r.status_code == 200 and b'PolicyId="p/handles"' in r.content


# -- read tokens ----------------------------------------------------------------------------------

def mint(gw, hid: str, who: str = "lta") -> requests.Response:
    return gw.api("POST", f"/handles/{hid}/read-token", who=who)


def sse_status(gw, path: str, headers: dict | None = None, method: str = "GET") -> tuple[int, str]:
    with requests.request(method, gw.url + path, headers={"Accept": "text/event-stream",
                                                          **(headers or {})},
                          stream=True, timeout=10) as r:
        first = next(r.iter_content(64), b"").decode() if r.status_code == 200 else r.text
        return r.status_code, first


def test_read_token_opens_the_handle_stream_for_its_owner(weather_gw):
    gw = weather_gw
    hid = open_handle(gw)
    r = mint(gw, hid)
    assert r.status_code == 201 and r.headers["Cache-Control"] == "no-store"
    body = r.json()
    assert body["url"].endswith(f"/handles/{hid}?read_token={body['read_token']}")
    assert 290 <= body["expires_in"] <= 300 and body["expires_at"].endswith("Z")
    assert TOKENSAFE(body["read_token"])
    status, first = sse_status(gw, f"/handles/{hid}?read_token={body['read_token']}")
    assert status == 200 and first.startswith(": connected")
    gw.runtime.push(hid, [{"avg_rainrate": 9.5}])
    with requests.get(f"{gw.url}/handles/{hid}", params={"read_token": body["read_token"]},
                      headers={"Accept": "application/x-ndjson"}, stream=True, timeout=10) as s:
        line = next(s.iter_lines())
        assert b'"avg_rainrate":9.5' in line


def TOKENSAFE(token: str) -> bool:
    return all(c.isalnum() or c in "._-" for c in token) and TOKEN_NOT_BEARER(token)


def TOKEN_NOT_BEARER(token: str) -> bool:
    from tests.pep.conftest import TOKENS
    return not any(t in token for t in TOKENS.values())


def test_read_token_is_refused_for_anything_else(weather_gw):
    gw = weather_gw
    hid = open_handle(gw, "lta")
    token = mint(gw, hid).json()["read_token"]
    q = f"?read_token={token}"
    # another caller's handle, and another caller asking for one: as if it did not exist
    assert mint(gw, hid, who="other").status_code == 404
    assert mint(gw, "no-such-handle").status_code == 404
    assert requests.post(f"{gw.url}/handles/{hid}/read-token", timeout=5).status_code == 401
    # the token opens nothing but GET of this handle
    assert requests.delete(f"{gw.url}/handles/{hid}{q}", timeout=5).status_code == 401
    assert requests.get(f"{gw.url}/handles{q}", timeout=5).status_code == 401
    assert requests.get(f"{gw.url}/streams{q}", timeout=5).status_code == 401
    assert requests.post(f"{gw.url}/requests{q}", data=LTA_REQUEST, headers=XML,
                         timeout=5).status_code == 401
    assert requests.post(f"{gw.url}/handles/{hid}/read-token{q}", timeout=5).status_code == 401
    # nor another handle: nea's own handle on the same stream
    other_hid = open_handle(gw, "nea")
    assert sse_status(gw, f"/handles/{other_hid}{q}")[0] == 401
    # tampered, truncated, garbage
    for bad in (token[:-2] + ("AA" if not token.endswith("AA") else "BB"), token[:20], "x",
                token.replace("v1.", "v2.", 1), "." * 5, "v1.1.a.b.c"):
        assert sse_status(gw, f"/handles/{hid}?read_token={bad}")[0] == 401, bad
    # a bearer header wins over a token: a wrong bearer is refused whatever the token
    assert sse_status(gw, f"/handles/{hid}{q}", {"Authorization": "Bearer nope"})[0] == 401
    assert sse_status(gw, f"/handles/{hid}{q}")[0] == 200


def test_read_token_for_an_ended_handle_and_the_gone_answer(weather_gw):
    gw = weather_gw
    hid = open_handle(gw)
    token = mint(gw, hid).json()["read_token"]
    assert gw.api("DELETE", f"/handles/{hid}", who="lta").status_code == 200
    assert mint(gw, hid).status_code == 410
    status, _ = sse_status(gw, f"/handles/{hid}?read_token={token}")
    assert status == 410


def test_read_tokens_expire_and_bind_their_subject():
    now = [1_000_000.0]

    class Who:
        def __init__(self, subject):
            self.subject = subject

    people = [Who("lta")]
    tokens = ReadTokens("k" * 32, ttl=60, identities=lambda: people, clock=lambda: now[0])
    token, expiry = tokens.mint("h1", "lta")
    assert expiry == 1_000_060
    assert tokens.verify(token, "h1") == "lta"
    assert tokens.verify(token, "h2") is None
    now[0] += 59.5
    assert tokens.verify(token, "h1") == "lta"
    now[0] += 1
    assert tokens.verify(token, "h1") is None
    # another key (another process, by default) knows none of them
    assert ReadTokens("other-key", ttl=60, clock=lambda: 1_000_000.0).verify(token, "h1") is None
    # a subject no longer in the auth file is nobody
    assert tokens.identity("lta") is people[0]
    people.clear()
    assert tokens.identity("lta") is None
    # the subject is inside the MAC: re-labelling the token breaks it
    parts = token.split(".")
    import base64
    parts[3] = base64.urlsafe_b64encode(b"nea").rstrip(b"=").decode()
    assert ReadTokens("k" * 32, ttl=60, clock=lambda: 1_000_000.0).verify(".".join(parts),
                                                                         "h1") is None
    # an expiry in digits int() refuses or reads otherwise is no token (never a 500)
    for expiry in ("²", "٣" * 7, "1_000_000_060", "-1", "9" * 13):
        parts = token.split(".")
        parts[1] = expiry
        assert tokens.verify(".".join(parts), "h1") is None


def test_expired_read_token_is_refused_over_http(gateway_factory):
    gw = gateway_factory(read_token_ttl=1)
    gw.add_weather()
    gw.add_weather_policy()
    hid = open_handle(gw)
    token = mint(gw, hid).json()["read_token"]
    assert sse_status(gw, f"/handles/{hid}?read_token={token}")[0] == 200
    time.sleep(1.2)
    status, body = sse_status(gw, f"/handles/{hid}?read_token={token}")
    assert status == 401 and "read token" in body


def test_configured_key_survives_a_restart(tmp_path):
    from tests.console.conftest import start_gateway
    first = start_gateway(tmp_path / "data", read_token_key="a-configured-key-0123456789")
    try:
        first.add_weather()
        first.add_weather_policy()
        hid = open_handle(first)
        token = mint(first, hid).json()["read_token"]
    finally:
        first.close()
    again = start_gateway(tmp_path / "data", read_token_key="a-configured-key-0123456789")
    try:
        # the handle resumed at start; the token minted before the restart still reads it
        status, _ = sse_status(again, f"/handles/{hid}?read_token={token}")
        assert status == 200
    finally:
        again.close()


# -- CORS ------------------------------------------------------------------------------------------

def test_no_cors_by_default(gateway):
    r = requests.options(gateway.url + "/policies", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "GET"}, timeout=5)
    assert "Access-Control-Allow-Origin" not in r.headers
    r = gateway.api("GET", "/streams", headers={"Origin": "http://app.example"})
    assert "Access-Control-Allow-Origin" not in r.headers


def test_cors_for_configured_origins(gateway_factory):
    gw = gateway_factory(cors_origins=("http://app.example:3000", "https://other.example/"))
    pre = requests.options(gw.url + "/policies", headers={
        "Origin": "http://app.example:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"}, timeout=5)
    assert pre.status_code == 204
    assert pre.headers["Access-Control-Allow-Origin"] == "http://app.example:3000"
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert "Authorization" in pre.headers["Access-Control-Allow-Headers"]
    assert "Access-Control-Allow-Credentials" not in pre.headers
    assert "Origin" in pre.headers["Vary"]
    r = gw.api("GET", "/streams", headers={"Origin": "https://other.example"})
    assert r.headers["Access-Control-Allow-Origin"] == "https://other.example"
    assert "Location" in r.headers["Access-Control-Expose-Headers"]
    # errors carry it too (the app must read the error body)
    r = requests.get(gw.url + "/streams", headers={"Origin": "https://other.example"}, timeout=5)
    assert r.status_code == 401 and r.headers["Access-Control-Allow-Origin"]
    # anyone else: no CORS headers, preflight not answered for them
    for origin in ("http://evil.example", "http://app.example", "http://app.example:3001"):
        pre = requests.options(gw.url + "/policies", headers={
            "Origin": origin, "Access-Control-Request-Method": "DELETE"}, timeout=5)
        assert "Access-Control-Allow-Origin" not in pre.headers, origin
        assert "Access-Control-Allow-Methods" not in pre.headers, origin


def test_cors_any_origin(gateway_factory):
    gw = gateway_factory(cors_origins="*")
    r = gw.api("GET", "/streams", headers={"Origin": "http://whoever.example"})
    assert r.headers["Access-Control-Allow-Origin"] == "*"


def test_cors_origins_are_checked():
    assert normalise_origins(["HTTP://A.example:80/", "*"]) == {"http://a.example:80", "*"}
    for bad in ("app.example", "http://a.example/path", "ftp://a.example", "http://a b"):
        with pytest.raises(ValueError):
            normalise_origins([bad])


def test_browser_settings(tmp_path):
    from pep.config import GatewayConfig
    config = GatewayConfig(data_dir=tmp_path, cors_origins="http://a.example, http://b.example:8000")
    assert config.cors_origins == ("http://a.example", "http://b.example:8000")
    default = GatewayConfig(data_dir=tmp_path)
    assert default.cors_origins == () and default.read_token_key is None
    assert default.read_token_ttl == 300
    for ttl in (0, 3601):
        with pytest.raises(ValueError):
            GatewayConfig(data_dir=tmp_path, read_token_ttl=ttl)


def test_the_console_changes_visibility_through_the_api_it_shows(gateway_factory):
    """What the console's visibility switch sends (PATCH /streams/<name>, from another origin
    too when CORS allows it) and what its streams page reads back."""
    gw = gateway_factory(cors_origins=("http://app.example",))
    gw.add_weather()
    pre = requests.options(gw.url + "/streams/weather", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "PATCH",
        "Access-Control-Request-Headers": "authorization, content-type"}, timeout=5)
    assert pre.status_code == 204 and "PATCH" in pre.headers["Access-Control-Allow-Methods"]
    assert [s["visibility"] for s in gw.api("GET", "/streams", who="lta").json()["streams"]] \
        == ["listed"]
    r = gw.api("PATCH", "/streams/weather", json={"visibility": "restricted"},
               headers={"Origin": "http://app.example"})
    assert r.status_code == 200 and r.json()["visibility"] == "restricted"
    assert r.headers["Access-Control-Allow-Origin"] == "http://app.example"
    assert gw.api("GET", "/streams", who="lta").json()["streams"] == []
    assert gw.api("PATCH", "/streams/weather", who="lta",
                  json={"visibility": "listed"}).status_code == 404
    index = requests.get(gw.url + "/console", timeout=5).text
    assert 'id="reg-visibility"' in index and "<th>Visibility</th>" in index
