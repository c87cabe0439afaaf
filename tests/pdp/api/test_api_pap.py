"""The PAP over HTTP: add, list, show, update, delete; permissions; events; atomicity."""
from __future__ import annotations

from urllib.parse import quote

from common.auth import Identity
from pdp import may_manage_policy
from tests.pdp.api.conftest import WEATHER_ID, WEATHER_POLICY, XML, bearer, simple_policy


def post_policy(gateway, body: bytes, who: str = "nea", content_type: str = XML):
    return gateway.client.post("/policies", data=body,
                               headers={**bearer(who), "Content-Type": content_type})


def put_policy(gateway, policy_id: str, body: bytes, who: str = "nea"):
    return gateway.client.put(f"/policies/{quote(policy_id, safe='')}", data=body,
                              headers={**bearer(who), "Content-Type": XML})


def delete_policy(gateway, policy_id: str, who: str = "nea"):
    return gateway.client.delete(f"/policies/{quote(policy_id, safe='')}", headers=bearer(who))


def snapshot(gateway):
    """What must not change when a write is refused: store contents and the live engine."""
    store = gateway.services.store
    return (store.store_version(), [(p.policy_id, p.store_version) for p in store.list()],
            sorted(gateway.services.policies.engine.policies))


def record_events(gateway):
    seen = []
    gateway.services.events.subscribe(seen.append)
    return seen


def test_seeded_policies_are_listed(gateway):
    r = gateway.client.get("/policies", headers=bearer("nea"))
    assert r.status_code == 200
    ids = [p["id"] for p in r.get_json()]
    assert ids == sorted(["urn:xsg:example:ais:port-authority-policy",
                          "urn:xsg:example:joins:routes-policy",
                          "urn:xsg:example:mls:position-policy",
                          "urn:xsg:example:mls:vitals-policy", WEATHER_ID])
    assert {p["owner"] for p in r.get_json()} == {"xsg-seed"}


def test_add_show_update_delete_take_effect_at_once(gateway):
    events = record_events(gateway)
    pid = "urn:test:other-weather"
    assert gateway.decision("other", "other", "rain") == "NotApplicable"

    r = post_policy(gateway, simple_policy(pid, resource="rain", subject="other"))
    assert r.status_code == 201, r.data
    assert r.get_json() == {"id": pid, "version": "1.0", "store_version": 6, "warnings": [],
                            # what it grants, in one line (pep/http/rules.py)
                            "summary": "rain: other (any action) gets every attribute",
                            "form": "rule"}
    assert r.headers["Location"].endswith("/policies/" + quote(pid, safe=""))
    assert gateway.decision("other", "other", "rain") == "Permit"
    assert [(e.kind, e.policy_id, e.version, e.owner) for e in events] == [
        ("added", pid, "1.0", "nea")]

    r = gateway.client.get(f"/policies/{quote(pid, safe='')}", headers=bearer("nea"))
    assert r.status_code == 200 and r.mimetype == XML
    assert r.data == simple_policy(pid, resource="rain", subject="other")
    assert r.headers["X-Store-Version"] == "6"

    r = put_policy(gateway, pid, simple_policy(pid, resource="rain", subject="other",
                                               effect="Deny", version="2.0"))
    assert r.status_code == 200 and r.get_json()["version"] == "2.0"
    assert gateway.decision("other", "other", "rain") == "Deny"
    assert events[-1].kind == "updated" and events[-1].version == "2.0"

    # history: both versions, by XACML version and by store version
    r = gateway.client.get(f"/policies/{quote(pid, safe='')}?history=true", headers=bearer("nea"))
    assert [h["version"] for h in r.get_json()] == ["1.0", "2.0"]
    r = gateway.client.get(f"/policies/{quote(pid, safe='')}?version=1.0", headers=bearer("nea"))
    assert b'Effect="Permit"' in r.data
    r = gateway.client.get(
        f"/policies/{quote(pid, safe='')}?store_version=6", headers=bearer("nea")
    )
    assert b'Version="1.0"' in r.data
    r = gateway.client.get(
        f"/policies/{quote(pid, safe='')}?store_version=x", headers=bearer("nea")
    )
    assert r.status_code == 400

    r = delete_policy(gateway, pid)
    assert r.status_code == 204 and r.data == b""
    assert gateway.decision("other", "other", "rain") == "NotApplicable"
    assert events[-1].kind == "deleted" and events[-1].policy_id == pid
    r = gateway.client.get(f"/policies/{quote(pid, safe='')}", headers=bearer("nea"))
    assert r.status_code == 404
    r = gateway.client.get(f"/policies/{quote(pid, safe='')}?history=1", headers=bearer("nea"))
    assert [h["deleted"] for h in r.get_json()] == [False, False, True]
    assert delete_policy(gateway, pid).status_code == 404


def test_revocation_is_complete_when_delete_returns(gateway):
    """The subscriber runs inside the DELETE call, after the new engine is live."""
    observed = []

    def on_change(change):
        observed.append((change.kind, gateway.decision("lta", "lta")))

    gateway.services.events.subscribe(on_change)
    assert gateway.decision("lta", "lta") == "Permit"
    assert delete_policy(gateway, WEATHER_ID).status_code == 204
    assert observed == [("deleted", "NotApplicable")]


def test_duplicate_id_is_409(gateway):
    before = snapshot(gateway)
    r = post_policy(gateway, WEATHER_POLICY.read_bytes())
    assert r.status_code == 409 and r.get_json()["id"] == WEATHER_ID
    assert snapshot(gateway) == before


def test_only_admins_change_policies(gateway):
    events = record_events(gateway)
    before = snapshot(gateway)
    body = simple_policy("urn:test:x")
    assert post_policy(gateway, body, who="lta").status_code == 403
    assert (
        put_policy(gateway, WEATHER_ID, WEATHER_POLICY.read_bytes(), who="lta").status_code == 403
    )
    assert delete_policy(gateway, WEATHER_ID, who="lta").status_code == 403
    r = gateway.client.get(f"/policies/{quote(WEATHER_ID, safe='')}", headers=bearer("lta"))
    assert r.status_code == 403
    assert gateway.client.get("/policies", headers=bearer("lta")).get_json() == []
    r = gateway.client.post("/policies", data=body, headers={"Content-Type": XML})
    assert r.status_code == 401
    r = gateway.client.delete(f"/policies/{quote(WEATHER_ID, safe='')}",
                              headers={"Authorization": "Bearer not-a-token"})
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
    assert snapshot(gateway) == before and events == []


def test_may_manage_is_one_replaceable_function(gateway):
    assert may_manage_policy(Identity("nea", (), True), None) is True
    assert may_manage_policy(Identity("lta", (), False), None) is False

    def owners_too(identity, info):  # what the PEP will do: stream owners manage their policies
        return may_manage_policy(identity, info) or (
            identity.subject == "lta" and info.id.startswith("urn:lta:"))

    gateway.services.may_manage = owners_too
    assert post_policy(gateway, simple_policy("urn:lta:mine"), who="lta").status_code == 201
    assert post_policy(gateway, simple_policy("urn:nea:theirs"), who="lta").status_code == 403
    ids = [p["id"] for p in gateway.client.get("/policies", headers=bearer("lta")).get_json()]
    assert ids == ["urn:lta:mine"]


def test_update_with_another_id_is_400(gateway):
    before = snapshot(gateway)
    r = put_policy(gateway, WEATHER_ID, simple_policy("urn:test:something-else"))
    assert r.status_code == 400
    assert "urn:test:something-else" in r.get_json()["error"]
    assert snapshot(gateway) == before
    r = put_policy(gateway, "urn:test:missing", simple_policy("urn:test:missing"))
    assert r.status_code == 404


def test_invalid_policy_changes_nothing(gateway):
    events = record_events(gateway)
    before = snapshot(gateway)
    broken = WEATHER_POLICY.read_bytes().replace(
        b"urn:oasis:names:tc:xacml:1.0:function:string-equal",
        b"urn:oasis:names:tc:xacml:1.0:function:no-such-function", 1)
    for r in (post_policy(gateway, broken.replace(WEATHER_ID.encode(), b"urn:test:new")),
              put_policy(gateway, WEATHER_ID, broken)):
        assert r.status_code == 400, r.data
        body = r.get_json()
        assert set(body) == {"type", "title", "status", "detail", "error", "source", "element",
                             "line"}
        assert "no-such-function" in body["error"]
        assert body["source"] == "request body" and isinstance(body["line"], int)
    assert snapshot(gateway) == before and events == []
    assert gateway.decision("lta", "lta") == "Permit"  # the old policy still decides


def test_reference_to_missing_policy_is_refused(gateway):
    before = snapshot(gateway)
    policy_set = b"""<PolicySet xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicySetId="urn:test:set" Version="1.0"
      PolicyCombiningAlgId="urn:oasis:names:tc:xacml:3.0:policy-combining-algorithm:deny-overrides">
      <Target/><PolicyIdReference>urn:test:not-there</PolicyIdReference></PolicySet>"""
    r = post_policy(gateway, policy_set)
    assert r.status_code == 400 and "urn:test:not-there" in r.get_json()["error"]
    assert snapshot(gateway) == before


def test_restart_keeps_policies_and_does_not_reseed(tmp_path, store_url):
    from pep.http.app import create_app
    from pep.services import build_services
    from tests.pdp.api.conftest import make_config

    config = make_config(tmp_path, store=store_url)
    services = build_services(config)
    client = create_app(services=services).test_client()
    assert client.delete(f"/policies/{quote(WEATHER_ID, safe='')}",
                         headers=bearer("nea")).status_code == 204
    r = client.post("/policies", data=simple_policy("urn:test:kept"),
                    headers={**bearer("nea"), "Content-Type": XML})
    assert r.status_code == 201
    services.close()

    again = build_services(make_config(tmp_path, store=store_url))
    try:
        assert again.seeded == []  # not empty: the deletion of a seeded policy survives
        assert sorted(again.policies.engine.policies) == [
            "urn:test:kept", "urn:xsg:example:ais:port-authority-policy",
            "urn:xsg:example:joins:routes-policy", "urn:xsg:example:mls:position-policy",
            "urn:xsg:example:mls:vitals-policy"]
        assert again.store.store_version() == 7
    finally:
        again.close()
