"""Stream visibility, the owner's choice: a `restricted` stream is seen by its owner, by
administrators and by callers the PDP may permit some action on it; for anyone else, every route
that names it answers byte for byte what it answered before the stream existed.

The gateway is the real one (PDP, catalogue, handles, audit) with a recording stand-in for
Spark; its answers are compared over the Flask test client.
"""
from __future__ import annotations

import json
import sqlite3
import time

import pytest

from pep.streams.catalog import StreamCatalog
from tests.pep.conftest import RecordingRuntime, build_gateway

TOKENS = {"root": "tok-root-0123456789", "acme": "tok-acme-0123456789",
          "lta": "tok-lta-0123456789", "other": "tok-other-0123456789",
          "rival": "tok-rival-0123456789"}
XML = {"Content-Type": "application/xacml+xml"}
SECRET = {"name": "secret", "source": {"kind": "ingest"}, "time_attribute": "ts",
          "schema": [{"name": "ts", "type": "timestamp"}, {"name": "v", "type": "double"}]}
POLICY_ID = "urn:t:secret-policy"


def bearer(who: str, **extra) -> dict:
    return {"Authorization": f"Bearer {TOKENS[who]}", **extra}


def auth_entries(other_roles=("consumer",)) -> list[dict]:
    return [
        {"token": TOKENS["root"], "subject": "root", "roles": [], "admin": True},
        {"token": TOKENS["acme"], "subject": "acme", "roles": ["data-owner"]},
        {"token": TOKENS["rival"], "subject": "rival", "roles": ["data-owner"]},
        {"token": TOKENS["lta"], "subject": "lta", "roles": ["consumer"]},
        {"token": TOKENS["other"], "subject": "other", "roles": list(other_roles)},
    ]


def match(category: str, attribute: str, value: str) -> str:
    return f"""<Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">{value}</AttributeValue>
      <AttributeDesignator Category="{category}" AttributeId="{attribute}" MustBePresent="false"
        DataType="http://www.w3.org/2001/XMLSchema#string"/></Match>"""


RESOURCE = ("urn:oasis:names:tc:xacml:3.0:attribute-category:resource",
            "urn:oasis:names:tc:xacml:1.0:resource:resource-id")
ACTION = ("urn:oasis:names:tc:xacml:3.0:attribute-category:action",
          "urn:oasis:names:tc:xacml:1.0:action:action-id")
ROLE = ("urn:oasis:names:tc:xacml:1.0:subject-category:access-subject",
        "urn:oasis:names:tc:xacml:2.0:subject:role")
SUBJECT = ("urn:oasis:names:tc:xacml:1.0:subject-category:access-subject",
           "urn:oasis:names:tc:xacml:1.0:subject:subject-id")


def policy(stream: str = "secret", who: str = "lta", action: str = "peek",
           policy_id: str = POLICY_ID, version: str = "1") -> bytes:
    """`who` may `action` the stream (an action id no default probe would try); anyone else is
    denied. Confined to the stream, so its owner may write it."""
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="{policy_id}" Version="{version}"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
      <Target><AnyOf><AllOf>{match(*RESOURCE, stream)}</AllOf></AnyOf></Target>
      <Rule RuleId="permit" Effect="Permit"><Target>
        <AnyOf><AllOf>{match(*SUBJECT, who)}</AllOf></AnyOf>
        <AnyOf><AllOf>{match(*ACTION, action)}</AllOf></AnyOf></Target></Rule>
      <Rule RuleId="deny" Effect="Deny"/></Policy>""".encode()


def access_request(stream: str, action: str = "peek", join: str | None = None) -> bytes:
    content = ""
    if join:
        content = (f'<Content><UserQuery xmlns=""><Stream name="{stream}"/><Join>'
                   f'<Stream name="{join}"/><On left="v" right="v"/><Within>10</Within></Join>'
                   f'</UserQuery></Content>')
    return f"""<Request xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      ReturnPolicyIdList="false" CombinedDecision="false">
      <Attributes Category="{RESOURCE[0]}">{content}<Attribute AttributeId="{RESOURCE[1]}"
        IncludeInResult="false"><AttributeValue
        DataType="http://www.w3.org/2001/XMLSchema#string">{stream}</AttributeValue></Attribute>
      </Attributes>
      <Attributes Category="{ACTION[0]}"><Attribute AttributeId="{ACTION[1]}"
        IncludeInResult="false"><AttributeValue
        DataType="http://www.w3.org/2001/XMLSchema#string">{action}</AttributeValue></Attribute>
      </Attributes></Request>""".encode()


@pytest.fixture
def gw(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "auth.json").write_text(json.dumps(auth_entries()))
    runtime = RecordingRuntime()
    app, services = build_gateway(data, runtime)
    yield app.test_client(), runtime, services, data
    services.close()


def names(client, who: str) -> list[str]:
    r = client.get("/streams", headers=bearer(who))
    assert r.status_code == 200
    return [s["name"] for s in r.json["streams"]]


# Every route that names a stream, as `other` (who may not see a restricted "secret") asks it.
def routes_naming(stream: str) -> list[tuple]:
    nd = {"Content-Type": "application/x-ndjson"}
    return [
        ("GET", f"/streams/{stream}", {}, None),
        ("GET", f"/streams/{stream.upper()}", {}, None),  # names are found in any case
        ("POST", f"/streams/{stream}/records", nd, b'{"ts": "2026-01-01T00:00:00Z", "v": 1}\n'),
        ("POST", f"/streams/{stream}/records", nd, b"not json\n"),
        ("PATCH", f"/streams/{stream}", {"Content-Type": "application/json"},
         b'{"visibility": "listed"}'),
        ("PATCH", f"/streams/{stream}", {"Content-Type": "application/json"}, b'{"colour": 1}'),
        ("PATCH", f"/streams/{stream}", {"Content-Type": "text/plain"}, b"x"),
        ("GET", f"/streams/{stream}/events", {}, None),
        ("POST", f"/streams/{stream}/events", {"Content-Type": "application/json"},
         b'{"name": "e", "condition": "v > 1"}'),
        ("DELETE", f"/streams/{stream}/events/e", {}, None),
        ("POST", "/requests", XML, access_request(stream)),
        ("POST", "/requests", XML, access_request(stream, "read")),
        ("POST", "/explain", XML, access_request(stream)),
        ("POST", "/requests", XML, access_request("open", "read", join=stream)),  # a join's 2nd
        ("POST", "/explain", XML, access_request("open", "read", join=stream)),
    ]


def answers(client, who: str, stream: str) -> list[tuple[int, bytes]]:
    out = []
    for method, path, headers, body in routes_naming(stream):
        r = client.open(path, method=method, headers=bearer(who, **headers), data=body)
        out.append((r.status_code, r.get_data()))
    return out


def open_stream_for_everyone(client) -> None:
    """A listed stream anyone may read, for the join requests."""
    r = client.post("/streams", headers=bearer("root"), json={**SECRET, "name": "open"})
    assert r.status_code == 201
    r = client.post("/policies", headers=bearer("root", **XML), data=b"""<Policy
      xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="urn:t:open"
      Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
      <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">open</AttributeValue>
      <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
        AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" MustBePresent="false"
        DataType="http://www.w3.org/2001/XMLSchema#string"/></Match></AllOf></AnyOf></Target>
      <Rule RuleId="p" Effect="Permit"/></Policy>""")
    assert r.status_code == 201, r.json


def test_a_hidden_stream_answers_every_route_as_before_it_existed(gw):
    client, runtime, services, _ = gw
    open_stream_for_everyone(client)
    before = answers(client, "other", "secret")
    assert {status for status, _ in before} == {404}, before
    r = client.post("/streams", headers=bearer("acme"), json={**SECRET, "visibility": "restricted"})
    assert r.status_code == 201 and r.json["visibility"] == "restricted"
    r = client.post("/policies", headers=bearer("acme", **XML), data=policy())
    assert r.status_code == 201, r.json
    hidden = answers(client, "other", "secret")
    for (method, path, *_), was, now in zip(routes_naming("secret"), before, hidden, strict=True):
        assert now == was, (method, path, was, now)
    # the same routes once the stream is listed: they answer otherwise (the test can fail)
    r = client.patch("/streams/secret", headers=bearer("acme"), json={"visibility": "listed"})
    assert r.status_code == 200 and r.json["visibility"] == "listed"
    listed = answers(client, "other", "secret")
    assert sum(a != b for a, b in zip(before, listed, strict=True)) >= 10
    assert listed[0][0] == 200 and listed[10][0] == 403  # described; the PDP says Deny


def test_who_sees_a_restricted_stream(gw):
    client, runtime, services, _ = gw
    client.post("/streams", headers=bearer("acme"), json={**SECRET, "visibility": "restricted"})
    assert names(client, "acme") == ["secret"]   # its owner
    assert names(client, "root") == ["secret"]   # an administrator
    assert names(client, "lta") == []            # no policy permits lta anything yet
    assert client.get("/streams/secret", headers=bearer("lta")).status_code == 404
    client.post("/policies", headers=bearer("acme", **XML), data=policy())
    # the policy is seen at once (no cache): lta may `peek`, an action only the policy names
    assert names(client, "lta") == ["secret"] and names(client, "other") == []
    described = client.get("/streams/secret", headers=bearer("lta")).json
    assert described["visibility"] == "restricted" and described["source"] == {"kind": "ingest"}
    # a policy change re-decides: now only `other` may
    r = client.put(f"/policies/{POLICY_ID}", headers=bearer("acme", **XML),
                   data=policy(who="other", version="2"))
    assert r.status_code == 200, r.json
    assert names(client, "lta") == [] and names(client, "other") == ["secret"]
    client.delete(f"/policies/{POLICY_ID}", headers=bearer("acme"))
    assert names(client, "other") == []


def test_an_identity_change_changes_what_a_caller_sees(gw):
    client, runtime, services, data = gw
    client.post("/streams", headers=bearer("acme"), json={**SECRET, "visibility": "restricted"})
    by_role = policy().replace(match(*SUBJECT, "lta").encode(),
                               match(*ROLE, "auditor").encode())
    assert client.post("/policies", headers=bearer("acme", **XML), data=by_role).status_code == 201
    assert names(client, "other") == []
    (data / "auth.json").write_text(json.dumps(auth_entries(other_roles=("auditor",))))
    services.authenticator.reload()
    assert names(client, "other") == ["secret"]


def test_ended_handles_on_a_hidden_stream_are_hidden_with_it(gw):
    client, runtime, services, _ = gw
    client.post("/streams", headers=bearer("acme"), json={**SECRET, "visibility": "restricted"})
    client.post("/policies", headers=bearer("acme", **XML), data=policy())
    r = client.post("/requests", headers=bearer("lta", **XML), data=access_request("secret"))
    assert r.status_code == 201, r.get_data(as_text=True)
    hid = r.json["id"]
    listed = client.get("/handles", headers=bearer("lta")).json["handles"]
    assert [h["id"] for h in listed] == [hid]
    # the owner withdraws lta's grant: the handle is revoked, and lta no longer sees the stream
    client.put(f"/policies/{POLICY_ID}", headers=bearer("acme", **XML),
               data=policy(who="other", version="2"))
    assert services.handle_store.get(hid).state.value == "revoked"
    assert client.get("/handles", headers=bearer("lta")).json["handles"] == []
    missing = "x" * len(hid)
    for method, path in (("GET", "/handles/{}"), ("DELETE", "/handles/{}"),
                         ("POST", "/handles/{}/read-token")):
        hidden = client.open(path.format(hid), method=method, headers=bearer("lta"))
        absent = client.open(path.format(missing), method=method, headers=bearer("lta"))
        assert (hidden.status_code, hidden.get_data()) == (absent.status_code, absent.get_data())
        assert hidden.status_code == 404
    # listed again: the ended handle is there, 410 with its reason
    client.patch("/streams/secret", headers=bearer("acme"), json={"visibility": "listed"})
    assert client.get(f"/handles/{hid}", headers=bearer("lta")).status_code == 410


def test_patch_is_for_the_owner_and_administrators_and_names_what_it_refuses(gw):
    client, runtime, services, _ = gw
    client.post("/streams", headers=bearer("acme"), json=SECRET)  # listed by default
    assert client.get("/streams/secret", headers=bearer("other")).json["visibility"] == "listed"
    r = client.patch("/streams/secret", headers=bearer("other"), json={"visibility": "restricted"})
    assert r.status_code == 403 and "owner" in r.json["error"]
    r = client.patch("/streams/secret", headers=bearer("acme"),
                     json={"visibility": "restricted", "owner": "x", "source": {}})
    assert r.status_code == 400 and r.json["fields"] == ["owner", "source"]
    assert "owner, source" in r.json["error"] and "visibility" in r.json["error"]
    for body, fragment in (({"visibility": "hidden"}, "one of listed, restricted, got 'hidden'"),
                           ({"visibility": None}, "got null"), ({}, "nothing to change"),
                           ([1], "JSON object")):
        r = client.patch("/streams/secret", headers=bearer("acme"), json=body)
        assert r.status_code == 400 and fragment in r.json["error"], r.json
    r = client.patch("/streams/secret", headers=bearer("acme", **{"Content-Type": "text/plain"}),
                     data=b'{"visibility": "restricted"}')
    assert r.status_code == 415
    assert client.get("/streams/secret", headers=bearer("other")).status_code == 200  # unchanged
    r = client.patch("/streams/SECRET", headers=bearer("root"), json={"visibility": "restricted"})
    assert r.status_code == 200 and r.json["name"] == "secret"
    assert r.json["visibility"] == "restricted"
    assert client.get("/streams/secret", headers=bearer("other")).status_code == 404
    changed = services.audit.log.query(kinds=["stream-changed"])
    assert [(e["stream"], e["by"], e["changes"]) for e in changed] == [
        ("secret", "root", {"visibility": "restricted"})]
    r = client.post("/streams", headers=bearer("acme"),
                    json={**SECRET, "name": "other1", "visibility": "secret"})
    assert r.status_code == 400 and "visibility must be one of" in r.json["error"]


def test_an_owner_cannot_learn_of_a_hidden_stream_through_a_policy(gw):
    client, runtime, services, _ = gw
    before = client.post("/policies", headers=bearer("rival", **XML),
                         data=policy(policy_id="urn:t:rival"))
    client.post("/streams", headers=bearer("acme"), json={**SECRET, "visibility": "restricted"})
    hidden = client.post("/policies", headers=bearer("rival", **XML),
                         data=policy(policy_id="urn:t:rival"))
    assert (hidden.status_code, hidden.get_data()) == (before.status_code, before.get_data())
    assert b"not a registered stream" in hidden.get_data()
    client.patch("/streams/secret", headers=bearer("acme"), json={"visibility": "listed"})
    listed = client.post("/policies", headers=bearer("rival", **XML),
                         data=policy(policy_id="urn:t:rival"))
    assert listed.status_code == 403 and b"does not own" in listed.get_data()


def test_public_metrics_name_no_restricted_stream(tmp_path):
    from pep.config import GatewayConfig
    from pep.http.app import create_app
    from pep.services import build_services

    data = tmp_path / "data"
    data.mkdir()
    (data / "auth.json").write_text(json.dumps(auth_entries()))
    runtime = RecordingRuntime()
    config = GatewayConfig(data_dir=data, auth_file=data / "auth.json", policies_dir=None,
                           port=0, metrics_public=True)
    services = build_services(config, runtime=runtime)
    try:
        client = create_app(services=services).test_client()
        client.post("/streams", headers=bearer("acme"), json={**SECRET, "visibility": "restricted"})
        client.post("/policies", headers=bearer("acme", **XML), data=policy())
        assert client.post("/requests", headers=bearer("lta", **XML),
                           data=access_request("secret")).status_code == 201
        assert b'stream="secret"' not in client.get("/metrics").data
        client.patch("/streams/secret", headers=bearer("acme"), json={"visibility": "listed"})
        assert b'xsg_live_handles{stream="secret"} 1.0' in client.get("/metrics").data
    finally:
        services.close()


def test_an_existing_store_is_migrated_and_its_streams_stay_listed(tmp_path):
    db = tmp_path / "streams.db"
    old = sqlite3.connect(db)
    old.execute("CREATE TABLE streams (name TEXT PRIMARY KEY COLLATE NOCASE, owner TEXT NOT NULL,"
                " schema_json TEXT NOT NULL, source_json TEXT NOT NULL, time_attribute TEXT,"
                " created_at TEXT NOT NULL, next_seq INTEGER NOT NULL DEFAULT 1)")
    old.execute("INSERT INTO streams VALUES ('weather', 'nea', '[[\"v\", \"double\"]]',"
                " '[\"ingest\", []]', NULL, '2026-01-01T00:00:00+00:00', 7)")
    old.commit()
    old.close()
    catalog = StreamCatalog(db, tmp_path / "d")
    try:
        entry = catalog.entry("weather")
        assert entry.visibility == "listed" and entry.next_seq == 7
        assert catalog.update("weather", {"visibility": "restricted"}, by="nea").visibility \
            == "restricted"
    finally:
        catalog.close()
    again = StreamCatalog(db, tmp_path / "d")  # migrated once; the change persisted
    try:
        assert again.visibility("WEATHER") == "restricted"
    finally:
        again.close()


def test_listing_many_restricted_streams_stays_cheap(gw):
    """Rough cost: 300 restricted streams, each with its own policy naming two actions, listed
    by a caller permitted on a tenth of them (each hidden one costs its probe decisions)."""
    client, runtime, services, _ = gw
    for i in range(300):
        name = f"s{i:03d}"
        services.catalog.register(name, "acme", SECRET["schema"], visibility="restricted")
        services.policies.add(policy(stream=name, who="lta" if i % 10 == 0 else "nobody",
                                     policy_id=f"urn:t:p{i}"), owner="acme")
    started = time.perf_counter()
    seen = names(client, "lta")
    seconds = time.perf_counter() - started
    assert len(seen) == 30
    print(f"\nGET /streams over 300 restricted streams: {seconds * 1000:.0f} ms")
    assert seconds < 5
