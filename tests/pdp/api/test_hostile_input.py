"""Hostile and malformed input to the PAP and the PDP: always a clear 4xx, never a 500, and the
store and the live engine are unchanged afterwards."""
from __future__ import annotations

import pytest

from pep.http.app import create_app
from pep.services import build_services
from tests.pdp.api.conftest import JSON, XML, bearer, make_config, simple_policy

BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
]>
<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="urn:evil:lol" Version="1.0"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides">
  <Description>&lol6;</Description><Target/></Policy>"""

XXE = b"""<?xml version="1.0"?>
<!DOCTYPE Policy [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="urn:evil:xxe" Version="1.0"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides">
  <Description>&xxe;</Description><Target/></Policy>"""

EXTERNAL_DTD = b"""<?xml version="1.0"?>
<!DOCTYPE Policy SYSTEM "http://127.0.0.1:9/evil.dtd">
<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="urn:evil:dtd" Version="1.0"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides"><Target/></Policy>"""

GOOD = simple_policy("urn:test:good")
DEEP = (b"<Policy xmlns='urn:oasis:names:tc:xacml:3.0:core:schema:wd-17' PolicyId='urn:evil:deep' "
        b"Version='1.0' RuleCombiningAlgId='urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:"
        b"deny-overrides'>" + b"<Description>" * 500 + b"</Description>" * 500 + b"</Policy>")

HOSTILE_POLICIES = [
    ("billion laughs", BILLION_LAUGHS, XML, 400),
    ("external entity", XXE, XML, 400),
    ("external DTD", EXTERNAL_DTD, XML, 400),
    ("truncated", GOOD[: len(GOOD) // 2], XML, 400),
    ("deeply nested", DEEP, XML, 400),
    ("not XML", b"\x00\xff\xfe garbage \x80\x81", XML, 400),
    ("a request, not a policy",
     b"<Request xmlns='urn:oasis:names:tc:xacml:3.0:core:schema:wd-17'/>", XML, 400),
    ("wrong namespace", GOOD.replace(b"urn:oasis:names:tc:xacml:3.0:core:schema:wd-17",
                                     b"urn:example:not-xacml"), XML, 400),
    ("bad version", GOOD.replace(b'Version="1.0"', b'Version="one"'), XML, 400),
    ("empty body", b"", XML, 400),
    ("whitespace body", b"   \n ", XML, 400),
    ("wrong content type", GOOD, "text/plain", 415),
    ("JSON content type", GOOD, JSON, 415),
    ("no content type", GOOD, None, 415),
]


@pytest.fixture
def small_gateway(tmp_path, store_url):
    """A gateway with a 64 KB body limit, so 'huge' stays cheap to test (on each store)."""
    services = build_services(make_config(tmp_path, max_content_length=64 * 1024,
                                          store=store_url))
    app = create_app(services=services)
    yield app.test_client(), services
    services.close()


def state(services):
    return (services.store.store_version(), [p.store_version for p in services.store.list()],
            sorted(services.policies.engine.policies))


@pytest.mark.parametrize("name, body, content_type, status", HOSTILE_POLICIES,
                         ids=[c[0] for c in HOSTILE_POLICIES])
def test_hostile_policy_is_refused_and_nothing_changes(small_gateway, name, body, content_type,
                                                       status):
    client, services = small_gateway
    before = state(services)
    headers = bearer("nea")
    if content_type:
        headers["Content-Type"] = content_type
    for method, url in (("post", "/policies"), ("put", "/policies/urn:test:good")):
        if method == "put":  # PUT needs an existing policy
            client.post("/policies", data=GOOD, headers={**bearer("nea"), "Content-Type": XML})
            before = state(services)
        r = getattr(client, method)(url, data=body, headers=headers)
        assert r.status_code == status, (name, method, r.status_code, r.data[:300])
        assert r.is_json and r.get_json()["error"], name
        assert state(services) == before, name
    if status == 400 and body.strip():
        assert "root:" not in r.get_json()["error"]  # no local file content leaks back


@pytest.mark.parametrize("version", ["١.0", "1.٣", "²", "1." + "9" * 19, "1" * 5000, "1._0",
                                     "1.0" * 100])
def test_policy_versions_are_ascii_digits_of_bounded_length(small_gateway, version):
    # issue 19: \d took every Unicode decimal digit (int('١') is 1), a digit run went on to
    # int() and past Python's 4300-digit limit (a ValueError, a 500)
    client, services = small_gateway
    before = state(services)
    body = simple_policy("urn:test:versioned", version=version)
    r = client.post("/policies", data=body, headers={**bearer("nea"), "Content-Type": XML})
    assert r.status_code == 400 and "Version" in r.get_json()["error"], r.data[:300]
    assert state(services) == before
    reference = f"""<PolicySet xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicySetId="urn:test:set" Version="1.0"
      PolicyCombiningAlgId="urn:oasis:names:tc:xacml:3.0:policy-combining-algorithm:deny-overrides">
      <Target/><PolicyIdReference Version="{version}.*">urn:test:good</PolicyIdReference>
    </PolicySet>""".encode()
    r = client.post("/policies", data=reference, headers={**bearer("nea"), "Content-Type": XML})
    assert r.status_code == 400 and "version pattern" in r.get_json()["error"], r.data[:300]
    assert state(services) == before


def test_huge_bodies_are_413(small_gateway):
    client, services = small_gateway
    before = state(services)
    huge = GOOD.replace(b"</Policy>", b"<!--" + b"x" * 200_000 + b"--></Policy>")
    r = client.post("/policies", data=huge, headers={**bearer("nea"), "Content-Type": XML})
    assert r.status_code == 413 and "65536 bytes" in r.get_json()["error"]
    r = client.post("/pdp", data=b"<Request>" + b" " * 200_000,
                    headers={**bearer("lta"), "Content-Type": XML})
    assert r.status_code == 413 and r.is_json
    assert state(services) == before


HOSTILE_REQUESTS = [
    (BILLION_LAUGHS.replace(b"Policy", b"Request"), XML),
    (XXE.replace(b"Policy", b"Request"), XML),
    (b"[" * 100_00 + b"]" * 100_00, JSON),
    (b'{"Request": {"AccessSubject": {"Attribute": [{"AttributeId": 1}]}}}', JSON),
    (b"\xff\xfe\x00garbage", JSON),
    (
        b"<Request xmlns='urn:oasis:names:tc:xacml:3.0:core:schema:wd-17'><Attributes/></Request>",
        XML,
    ),
]


@pytest.mark.parametrize("body, content_type", HOSTILE_REQUESTS)
def test_hostile_decision_requests_are_syntax_errors(gateway, body, content_type):
    r = gateway.decide("lta", body, content_type=content_type, accept=JSON)
    assert r.status_code == 400, r.data[:300]
    result = r.get_json()["Response"][0]
    assert result["Decision"] == "Indeterminate"
    assert result["Status"]["StatusCode"]["Value"].endswith(":syntax-error")
    assert result["Status"]["StatusMessage"]


@pytest.mark.parametrize("store_version", ["²", "٣", "9" * 5000, "9" * 30, str(2 ** 63)])
def test_odd_store_versions_are_400_not_500(gateway, store_version):
    # issue 9, item 4: str.isdigit() let '²' and '٣' through to int(); long digit runs hit
    # Python's 4300-digit limit or SQLite's INTEGER range (a ValueError / OverflowError, a 500)
    r = gateway.client.get("/policies/urn:xsg:example:weather:nea-policy",
                           query_string={"store_version": store_version}, headers=bearer("nea"))
    assert r.status_code == 400 and "'store_version' must be a whole number" in r.json["error"]


@pytest.mark.parametrize("version", ["١.0", "²", "1.", "x", "1" * 300, ""])
def test_odd_version_parameters_are_400_naming_it(gateway, version):
    r = gateway.client.get("/policies/urn:xsg:example:weather:nea-policy",
                           query_string={"version": version}, headers=bearer("nea"))
    assert r.status_code == 400 and "'version' must be a XACML version" in r.json["error"]


def test_unknown_json_member_with_a_lone_surrogate_is_400_in_either_format(gateway):
    # issue 9, item 4: the message quoted the member's name raw, and the JSON rendering of the
    # XACML answer raised UnicodeEncodeError (a 500)
    for accept in (JSON, XML):
        r = gateway.decide("lta", b'{"Request": {"\\ud800": 1}}', content_type=JSON, accept=accept)
        assert r.status_code == 400 and b"unknown member" in r.data, (accept, r.data[:200])
