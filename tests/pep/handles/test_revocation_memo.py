"""A revocation pass decides the live handles' stored requests from the memo of parsed requests
(`pep.core.parsed`), filled when the handles were opened, and gets what a fresh parse gets:
the same revocations, with the same reasons."""
from __future__ import annotations

import pytest

from pdp import RequestSyntaxError, parse_request
from pep.core import access
from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway

from .test_revocation_at_scale import CONSUMERS, SCHEMA, XML, policy, request


@pytest.fixture
def gw(tmp_path):
    app, services = build_gateway(tmp_path / "data", RecordingRuntime())
    client = app.test_client()
    handles = {}
    for name in ("s0", "s1"):
        r = client.post("/streams", json={"name": name, "schema": SCHEMA, "time_attribute": "t"},
                        headers=auth_header("nea"))
        assert r.status_code == 201, r.json
        r = client.post("/policies", data=policy(f"urn:t:{name}", name),
                        headers=auth_header("nea", **XML))
        assert r.status_code == 201, r.json
        for who in CONSUMERS:
            r = client.post("/requests", data=request(name), headers=auth_header(who, **XML))
            assert r.status_code == 201, r.json
            handles[(who, name)] = r.json["id"]
    yield client, services, handles
    services.close()


def state(services, handle_id):
    record = services.handles.get(handle_id)
    return record.state.value, record.reason


def test_a_pass_reads_the_requests_parsed_when_the_handles_opened(gw, monkeypatch):
    client, services, handles = gw
    parses = []
    real = access.parse_request
    monkeypatch.setattr(access, "parse_request", lambda *a: parses.append(1) or real(*a))
    memo = services.revocation.parsed
    hits = memo.hits
    r = client.put("/policies/urn:t:s0", data=policy("urn:t:s0", "s0", subjects=["lta"]),
                   headers=auth_header("nea", **XML))
    assert r.status_code == 200
    assert parses == [] and memo.hits - hits == 2 * len(CONSUMERS)  # request and query each
    assert state(services, handles[("lta", "s0")]) == ("live", None)
    assert state(services, handles[("other", "s0")]) == (
        "revoked", "policy 'urn:t:s0' updated: the request is no longer permitted "
        "(AccessDenied): access denied: decision is Deny")
    # the next pass, with `other` permitted again, decides again and keeps what it may
    r = client.put("/policies/urn:t:s0", data=policy("urn:t:s0", "s0"),
                   headers=auth_header("nea", **XML))
    assert r.status_code == 200 and parses == []
    assert state(services, handles[("lta", "s0")]) == ("live", None)


def test_a_stored_request_that_does_not_parse_is_revoked_with_the_reason_it_always_had(gw):
    client, services, handles = gw
    broken = b"<Request xmlns='urn:oasis:names:tc:xacml:3.0:core:schema:wd-17'"
    with pytest.raises(RequestSyntaxError) as info:
        parse_request(broken, XML["Content-Type"])
    hid = handles[("lta", "s1")]
    services.handle_store._db.execute("UPDATE handles SET request_body = ? WHERE id = ?",
                                      (broken, hid))
    for _ in range(2):  # the memo keeps nothing of it: a second pass refuses it the same way
        record = services.handles.get(hid)
        verdict = services.revocation.reevaluate(record, services.policies.engine)
        assert not verdict.keep and verdict.reason == (
            f"the request is no longer permitted (MalformedRequest): {info.value}")
    r = client.put("/policies/urn:t:s1", data=policy("urn:t:s1", "s1"),
                   headers=auth_header("nea", **XML))
    assert r.status_code == 200
    assert state(services, hid) == (
        "revoked", "policy 'urn:t:s1' updated: the request is no longer permitted "
        f"(MalformedRequest): {info.value}")
    assert state(services, handles[("other", "s1")]) == ("live", None)
