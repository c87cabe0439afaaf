"""Identity changes act at once: a subject whose roles or attributes change, or who is removed,
has its live handles re-decided with the identity now in force, as a policy change does.

The gateway is the real one (PDP, catalogue, handles, revocation, audit) with a recording
stand-in for Spark; the multilevel example (policies/mls) makes the plan depend on the caller's
clearance, so lowering it changes the handle's filter. tests/e2e/test_identity_changes.py does
the same on real Spark, over HTTP.
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from pep.handles.records import HandleState
from pep.serve import reload_on_sighup
from tests.pep.conftest import RecordingRuntime, build_gateway

MLS = Path(__file__).resolve().parents[3] / "policies" / "mls"
VITALS = {"name": "vitals", "source": {"kind": "ingest"},
          "schema": [{"name": n, "type": t} for n, t in (
              ("sid", "long"), ("wt", "double"), ("bp", "double"), ("pr", "double"),
              ("level", "long"))]}
XML = {"Content-Type": "application/xacml+xml"}
TOKENS = {"nea": "tok-nea-0123456789", "m1": "tok-medic1-0123456789",
          "m2": "tok-medic2-0123456789"}


def medic(who: str, subject: str, clearance: int, **more) -> dict:
    return {"token": TOKENS[who], "subject": subject, "roles": ["medic", f"clearance:{clearance}"],
            "attributes": {"clearance": clearance, **more}}


def auth_entries(m1: int | None = 2, m2: int | None = 2, **m1_more) -> list[dict]:
    entries = [{"token": TOKENS["nea"], "subject": "nea", "roles": ["data-owner"], "admin": True}]
    if m1 is not None:
        entries.append(medic("m1", "medic-1", m1, **m1_more))
    if m2 is not None:
        entries.append(medic("m2", "medic-2", m2))
    return entries


def replace_auth(path: Path, entries: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(entries))
    os.replace(tmp, path)


def bearer(who: str, **extra) -> dict:
    return {"Authorization": f"Bearer {TOKENS[who]}", **extra}


def open_handle(client, who: str) -> dict:
    r = client.post("/requests", data=(MLS / "medic-request.xml").read_bytes(),
                    headers=bearer(who, **XML))
    assert r.status_code == 201, r.get_data(as_text=True)
    return r.json


def level_bound(plan: dict) -> float:
    """The `level <= n` of a vitals plan."""
    text = json.dumps(plan)
    assert '"level"' in text, plan
    (bound,) = {p["value"] for conj in plan["filter"] for p in conj if p["attribute"] == "level"}
    return bound


@pytest.fixture
def gw(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    auth = data / "auth.json"
    auth.write_text(json.dumps(auth_entries()))
    runtime = RecordingRuntime()
    app, services = build_gateway(data, runtime)
    client = app.test_client()
    assert client.post("/streams", json=VITALS, headers=bearer("nea")).status_code == 201
    r = client.post("/policies", data=(MLS / "vitals-policy.xml").read_bytes(),
                    headers=bearer("nea", **XML))
    assert r.status_code == 201, r.json
    decided: list[str] = []
    real = services.revocation.decide_and_plan

    def counting(engine, body, media_type, identity, *args, **kwargs):
        decided.append(identity.subject)
        return real(engine, body, media_type, identity, *args, **kwargs)

    services.revocation.decide_and_plan = counting
    yield client, runtime, services, auth, decided
    services.close()


def wait_state(services, handle_id: str, timeout: float = 3.0) -> tuple[HandleState, float]:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        record = services.handle_store.get(handle_id)
        if record.state is not HandleState.LIVE:
            return record.state, time.monotonic() - started
        time.sleep(0.01)
    return services.handle_store.get(handle_id).state, time.monotonic() - started


def test_a_lowered_clearance_revokes_at_once_without_any_request(gw):
    client, runtime, services, auth, decided = gw
    h1 = open_handle(client, "m1")
    h2 = open_handle(client, "m2")
    assert level_bound(h1["plan"]) == 2
    deliver = runtime.attached[h1["id"]][2]
    assert deliver([{"sid": 1, "level": 2}]) is True

    replace_auth(auth, auth_entries(m1=1))  # clearance 2 -> 1 (and its role), nothing else
    state, seconds = wait_state(services, h1["id"])
    assert state is HandleState.REVOKED and seconds < 1.0, seconds
    record = services.handle_store.get(h1["id"])
    assert "identity changed (auth file)" in record.reason
    assert "obligations changed" in record.reason  # Permit still, but the filter is stale
    assert deliver([{"sid": 2, "level": 2}]) is False and h1["id"] in runtime.detached
    # only the subject that changed was decided again; the other medic is untouched
    assert decided == ["medic-1"]
    assert services.handle_store.get(h2["id"]).state is HandleState.LIVE
    # the audit trail says why (written just after the state, by the handles' listener)
    deadline = time.monotonic() + 3
    entries: list = []
    while not entries and time.monotonic() < deadline:
        entries = services.audit.log.query(kinds=["handle-revoked"], subject="medic-1")
        time.sleep(0.01)
    assert len(entries) == 1 and "identity changed" in entries[0]["reason"]
    # the reader got `revoked` as its last event
    lines = client.get(f"/handles/{h1['id']}", headers=bearer("m1", Accept="application/x-ndjson"))
    assert lines.status_code == 410 and lines.json["state"] == "revoked"
    # asking again gives the new clearance
    again = open_handle(client, "m1")
    assert again["id"] != h1["id"] and level_bound(again["plan"]) == 1


def test_a_change_that_leaves_the_plan_alone_keeps_the_handle(gw):
    client, runtime, services, auth, decided = gw
    h1 = open_handle(client, "m1")
    replace_auth(auth, auth_entries(m1=2, unit="3rd-battalion"))  # a new, unused attribute
    deadline = time.monotonic() + 3
    while not decided and time.monotonic() < deadline:
        time.sleep(0.01)
    assert decided == ["medic-1"]
    assert services.handle_store.get(h1["id"]).state is HandleState.LIVE
    assert runtime.push(h1["id"], [{"sid": 1}]) is True


def test_a_lost_role_denies_and_a_removed_subject_loses_its_handles(gw):
    client, runtime, services, auth, decided = gw
    h1 = open_handle(client, "m1")
    h2 = open_handle(client, "m2")
    entries = auth_entries()
    entries[1]["roles"] = ["medic"]  # clearance 2 still claimed, but no role backs it: Deny
    del entries[2]                   # medic-2 removed from the file
    replace_auth(auth, entries)
    assert wait_state(services, h1["id"])[0] is HandleState.REVOKED
    assert wait_state(services, h2["id"])[0] is HandleState.REVOKED
    assert "no longer permitted" in services.handle_store.get(h1["id"]).reason
    assert "no longer known" in services.handle_store.get(h2["id"]).reason
    assert sorted(decided) == ["medic-1"]  # medic-2 had no identity left to decide with
    assert client.get("/handles", headers=bearer("m2")).status_code == 401


def test_sighup_revokes_through_the_reload_function(gw):
    client, runtime, services, auth, decided = gw
    h1 = open_handle(client, "m1")
    # only SIGHUP may notice: no watcher, no look at requests
    services.authenticator.stop()
    services.authenticator.tokens.check_interval = 3600
    replace_auth(auth, auth_entries(m1=1))
    time.sleep(0.4)
    assert services.handle_store.get(h1["id"]).state is HandleState.LIVE
    with reload_on_sighup(services):
        os.kill(os.getpid(), signal.SIGHUP)
        state, seconds = wait_state(services, h1["id"])
    assert state is HandleState.REVOKED and seconds < 1.0
    assert "identity changed (auth file)" in services.handle_store.get(h1["id"]).reason


def test_a_request_decided_with_the_old_identity_is_decided_again(gw):
    """The race: the caller's clearance is lowered between its request's decision and the
    opening of its handle. The epoch the change bumps makes the open fail, and the retry decides
    with the caller's identity as its token stands for now."""
    client, runtime, services, auth, decided = gw
    real_open = services.handles.open
    calls = []

    def open_after_change(*args, **kwargs):
        if not calls:
            replace_auth(auth, auth_entries(m1=1))
            assert services.authenticator.reload()
        calls.append(args[0])
        return real_open(*args, **kwargs)

    services.handles.open = open_after_change
    handle = open_handle(client, "m1")
    assert len(calls) == 2  # the first open was refused as stale
    assert level_bound(handle["plan"]) == 1


# -- JWTs ------------------------------------------------------------------------------------------

@pytest.fixture
def issuer():
    from tests.common.auth.conftest import Issuer

    it = Issuer()
    yield it
    it.close()


def test_a_jwt_with_a_lower_clearance_revokes_before_its_request_returns(issuer, tmp_path):
    from pep.config import GatewayConfig
    from pep.http.app import create_app
    from pep.services import build_services
    from tests.common.auth.test_oidc import settings

    data = tmp_path / "data"
    data.mkdir()
    (data / "auth.json").write_text(json.dumps(auth_entries(m1=None, m2=None)))
    runtime = RecordingRuntime()
    config = GatewayConfig(data_dir=data, auth_file=data / "auth.json", policies_dir=None,
                           port=0, oidc=settings(issuer))
    services = build_services(config, runtime=runtime)
    try:
        client = create_app(services=services).test_client()
        assert client.post("/streams", json=VITALS, headers=bearer("nea")).status_code == 201
        assert client.post("/policies", data=(MLS / "vitals-policy.xml").read_bytes(),
                           headers=bearer("nea", **XML)).status_code == 201

        def jwt(clearance: int) -> dict:
            token = issuer.token("medic-j", roles=["medic", f"clearance:{clearance}"],
                                 clearance=clearance)
            return {"Authorization": f"Bearer {token}"}

        r = client.post("/requests", data=(MLS / "medic-request.xml").read_bytes(),
                        headers={**jwt(2), **XML})
        assert r.status_code == 201, r.get_data(as_text=True)
        hid = r.json["id"]
        assert level_bound(r.json["plan"]) == 2
        assert client.get("/handles", headers=jwt(2)).status_code == 200  # same claims: kept
        assert services.handle_store.get(hid).state is HandleState.LIVE
        # any call with a newer token carrying a lower clearance: revoked before it answers
        listed = client.get("/handles", headers=jwt(1)).json["handles"]
        assert [h["state"] for h in listed] == ["revoked"]
        assert "identity changed (new token claims)" in listed[0]["reason"]
        assert runtime.push(hid, [{"level": 2}]) is False
        # the claims are remembered for later re-decisions (and across restarts)
        assert services.authenticator.identity_for("medic-j").attribute("clearance") == (1,)
    finally:
        services.close()
