"""Stream owners manage the policies of their own streams, and nothing else (HTTP, real gateway:
PDP, PAP, catalogue, request processor; the Spark runtime is a RecordingRuntime)."""
from __future__ import annotations

import json
from urllib.parse import quote

import pytest

from common.auth import write_auth_file
from tests.pep.conftest import RecordingRuntime, build_gateway

TOKENS = {"root": "tok-root-0123456789", "own1": "tok-own1-0123456789",
          "own2": "tok-own2-0123456789", "lta": "tok-lta-0123456789"}
XML = "application/xacml+xml"
NS = "urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
STR = "http://www.w3.org/2001/XMLSchema#string"
RES = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
SUBJ = "urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
RID = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"
SID = "urn:oasis:names:tc:xacml:1.0:subject:subject-id"
EQ = "urn:oasis:names:tc:xacml:1.0:function:string-equal"


def h(who: str, **extra) -> dict:
    return {"Authorization": f"Bearer {TOKENS[who]}", **extra}


def stream(name: str) -> dict:
    return {"name": name, "source": {"kind": "ingest"},
            "schema": [{"name": "t", "type": "long"}, {"name": "v", "type": "double"}]}


def _match(value: str, category: str, attr: str) -> str:
    return (f'<Match MatchId="{EQ}"><AttributeValue DataType="{STR}">{value}</AttributeValue>'
            f'<AttributeDesignator Category="{category}" AttributeId="{attr}" DataType="{STR}" '
            f'MustBePresent="false"/></Match>')


def grant(pid: str, *streams: str, subject: str = "lta", effect: str = "Permit",
          version: str = "1.0", target: bool = True) -> bytes:
    """`effect` for `subject` on the given streams; target=False drops the policy's Target."""
    alts = "".join(f"<AllOf>{_match(s, RES, RID)}</AllOf>" for s in streams)
    tgt = f"<Target><AnyOf>{alts}</AnyOf></Target>" if target else "<Target/>"
    rule = (f'<Rule RuleId="{pid}:r" Effect="{effect}"><Target><AnyOf><AllOf>'
            f'{_match(subject, SUBJ, SID)}</AllOf></AnyOf></Target></Rule>')
    return (f'<Policy xmlns="{NS}" PolicyId="{pid}" Version="{version}" RuleCombiningAlgId='
            f'"urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides">{tgt}{rule}'
            f'</Policy>').encode()


def request(stream_name: str, subject: str = "lta") -> bytes:
    return (f'<Request xmlns="{NS}" ReturnPolicyIdList="false" CombinedDecision="false">'
            f'<Attributes Category="{SUBJ}"><Attribute AttributeId="{SID}" IncludeInResult="false">'
            f'<AttributeValue DataType="{STR}">{subject}</AttributeValue></Attribute></Attributes>'
            f'<Attributes Category="{RES}"><Attribute AttributeId="{RID}" IncludeInResult="false">'
            f'<AttributeValue DataType="{STR}">{stream_name}</AttributeValue></Attribute>'
            f'</Attributes></Request>').encode()


@pytest.fixture
def gw(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_auth_file(data / "auth.json", [
        {"token": TOKENS["root"], "subject": "root", "roles": [], "admin": True},
        {"token": TOKENS["own1"], "subject": "own1", "roles": ["data-owner"], "admin": False},
        {"token": TOKENS["own2"], "subject": "own2", "roles": ["data-owner"], "admin": False},
        {"token": TOKENS["lta"], "subject": "lta", "roles": ["consumer"], "admin": False},
    ])
    app, services = build_gateway(data, RecordingRuntime())
    client = app.test_client()
    for who, name in (("own1", "alpha"), ("own1", "alpha2"), ("own2", "beta")):
        r = client.post("/streams", json=stream(name), headers=h(who))
        assert r.status_code == 201, r.json
    yield client, services
    services.close()


def add(client, who: str, body: bytes):
    return client.post("/policies", data=body, headers=h(who, **{"Content-Type": XML}))


def put(client, who: str, pid: str, body: bytes):
    return client.put(f"/policies/{quote(pid, safe='')}", data=body,
                      headers=h(who, **{"Content-Type": XML}))


def delete(client, who: str, pid: str):
    return client.delete(f"/policies/{quote(pid, safe='')}", headers=h(who))


def get(client, who: str, pid: str, **query):
    return client.get(f"/policies/{quote(pid, safe='')}", headers=h(who), query_string=query)


def listed(client, who: str) -> list[str]:
    r = client.get("/policies", headers=h(who))
    assert r.status_code == 200
    return [p["id"] for p in r.json]


def ask(client, stream_name: str) -> int:
    """lta's stream request: 201 for a new handle (200 for the same one again) or 403."""
    status = client.post("/requests", data=request(stream_name),
                         headers=h("lta", **{"Content-Type": XML})).status_code
    return 201 if status == 200 else status


def test_owner_adds_a_confined_policy_that_takes_effect(gw):
    client, services = gw
    assert ask(client, "alpha") == 403
    r = add(client, "own1", grant("urn:own1:alpha", "alpha"))
    assert r.status_code == 201, r.json
    assert services.store.get("urn:own1:alpha").owner == "own1"
    assert ask(client, "alpha") == 201
    # one policy over several of one's own streams is fine too
    assert add(client, "own1", grant("urn:own1:both", "alpha", "alpha2")).status_code == 201
    assert ask(client, "alpha2") == 201
    assert ask(client, "beta") == 403


def test_owner_cannot_write_a_policy_about_another_owners_stream(gw):
    client, services = gw
    before = services.store.store_version()
    r = add(client, "own1", grant("urn:own1:beta", "beta"))
    assert r.status_code == 403
    assert "'beta'" in r.json["error"] and "does not own" in r.json["error"]
    # nor one that mixes its own stream with another's
    r = add(client, "own1", grant("urn:own1:mixed", "alpha", "beta"))
    assert r.status_code == 403 and "'beta'" in r.json["error"]
    # nor a Deny that would shut another's stream
    assert add(client, "root", grant("urn:root:beta", "beta")).status_code == 201
    assert ask(client, "beta") == 201
    r = add(client, "own1", grant("urn:own1:deny-beta", "beta", effect="Deny"))
    assert r.status_code == 403
    assert ask(client, "beta") == 201
    assert services.store.store_version() == before + 1


@pytest.mark.parametrize("body, fragment", [
    (grant("urn:own1:open", "alpha", target=False), "not confined"),
    (grant("urn:own1:open", "alpha").replace(EQ.encode(), (
        b"urn:oasis:names:tc:xacml:1.0:function:string-regexp-match")), "not confined"),
    (grant("urn:own1:open", "ALPHA"), "not a registered stream"),
    (grant("urn:own1:open", "gamma"), "not a registered stream"),
])
def test_owner_cannot_add_an_unconfined_policy(gw, body, fragment):
    client, _ = gw
    r = add(client, "own1", body)
    assert r.status_code == 403 and fragment in r.json["error"], r.json
    assert "urn:own1:open" not in listed(client, "root")
    assert ask(client, "beta") == 403


def test_owners_cannot_touch_each_others_policies(gw):
    client, _ = gw
    assert add(client, "own1", grant("urn:own1:alpha", "alpha")).status_code == 201
    assert add(client, "own2", grant("urn:own2:beta", "beta")).status_code == 201
    assert listed(client, "own1") == ["urn:own1:alpha"]
    assert listed(client, "own2") == ["urn:own2:beta"]
    r = get(client, "own1", "urn:own2:beta")
    # refused without saying what own2's document holds (which stream it is about: issue 20)
    assert r.status_code == 403 and "'beta'" not in r.json["error"]
    assert "written by someone else" in r.json["error"]
    assert get(client, "own1", "urn:own1:alpha").status_code == 200
    r = delete(client, "own1", "urn:own2:beta")
    assert r.status_code == 403
    # a confined new version does not take over a policy that is not one's own
    r = put(client, "own1", "urn:own2:beta", grant("urn:own2:beta", "alpha", version="2.0"))
    assert r.status_code == 403 and "current version" in r.json["error"]
    assert "'beta'" not in r.json["error"]
    # nor may an owner move its own policy onto another's stream
    r = put(client, "own1", "urn:own1:alpha", grant("urn:own1:alpha", "beta", version="2.0"))
    assert r.status_code == 403 and "new version" in r.json["error"]
    assert ask(client, "beta") == 201  # own2's policy still stands
    r = put(client, "own1", "urn:own1:alpha", grant("urn:own1:alpha", "alpha", effect="Deny",
                                                      version="2.0"))
    assert r.status_code == 200 and ask(client, "alpha") == 403
    assert delete(client, "own1", "urn:own1:alpha").status_code == 204
    assert listed(client, "own1") == []


def test_an_older_version_written_by_someone_else_stays_closed(gw):
    client, _ = gw
    pid = "urn:shared:policy"
    assert add(client, "root", grant(pid, "beta")).status_code == 201
    assert put(client, "root", pid, grant(pid, "alpha", version="2.0")).status_code == 200
    assert get(client, "own1", pid).status_code == 200  # now confined to own1's stream
    r = get(client, "own1", pid, version="1.0")
    assert r.status_code == 403 and "this version" in r.json["error"]
    assert get(client, "root", pid, version="1.0").status_code == 200


def test_admin_manages_everything_and_consumers_nothing(gw):
    client, services = gw
    assert add(client, "own2", grant("urn:own2:beta", "beta")).status_code == 201
    assert add(client, "root", grant("urn:root:anything", "alpha", target=False)).status_code == 201
    assert sorted(listed(client, "root")) == ["urn:own2:beta", "urn:root:anything"]
    assert put(client, "root", "urn:own2:beta",
               grant("urn:own2:beta", "beta", version="2.0")).status_code == 200
    assert services.store.get("urn:own2:beta").owner == "root"
    assert get(client, "root", "urn:own2:beta").status_code == 200
    # lta owns no stream: nothing to see, nothing to write, even a perfectly confined policy
    assert listed(client, "lta") == []
    r = add(client, "lta", grant("urn:lta:alpha", "alpha"))
    assert r.status_code == 403 and "does not own" in r.json["error"]
    assert get(client, "lta", "urn:own2:beta").status_code == 403
    assert delete(client, "lta", "urn:own2:beta").status_code == 403
    # the unconfined admin policy is out of reach for owners, even for its stream's owner
    assert get(client, "own1", "urn:root:anything").status_code == 403
    assert delete(client, "own1", "urn:root:anything").status_code == 403
    assert delete(client, "root", "urn:root:anything").status_code == 204
    assert delete(client, "root", "urn:own2:beta").status_code == 204
    assert listed(client, "root") == []


def test_refusals_change_nothing_and_say_why_in_json(gw):
    client, services = gw
    before = (services.store.store_version(), sorted(services.policies.engine.policies))
    r = add(client, "own2", grant("urn:own2:alpha", "alpha"))
    assert r.status_code == 403 and r.content_type.startswith("application/problem+json")
    assert json.loads(r.data)["error"].startswith("'own2' may not manage policy 'urn:own2:alpha'")
    assert (services.store.store_version(), sorted(services.policies.engine.policies)) == before
