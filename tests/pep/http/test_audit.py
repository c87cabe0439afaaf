"""The audit trail (issue 9, class 7): who was granted what, under which policy versions; what
was refused, revoked and released; which policies and streams changed. Append-only, rotated,
queryable by administrators and by owners for their streams, never holding tokens, handle ids
or data values."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pep.audit.log import AuditLog, handle_ref
from tests.pep.conftest import TOKENS, RecordingRuntime, auth_header, build_gateway, write_auth

POLICIES = Path(__file__).resolve().parents[3] / "policies" / "weather"
XML = {"Content-Type": "application/xacml+xml"}
WEATHER = {"name": "weather", "time_attribute": "samplingtime", "source": {"kind": "ingest"},
           "schema": [{"name": n, "type": t} for n, t in (
               ("samplingtime", "timestamp"), ("temperature", "double"), ("humidity", "double"),
               ("solarradiation", "double"), ("rainrate", "double"), ("windspeed", "double"),
               ("winddirection", "long"), ("barometer", "double"))]}
OWNER_TOKEN = "tok-owner2-0123456789"


@pytest.fixture
def gw(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_auth(data / "auth.json")
    entries = json.loads((data / "auth.json").read_text())
    entries.append({"token": OWNER_TOKEN, "subject": "owner2", "roles": ["data-owner"],
                    "admin": False})
    (data / "auth.json").write_text(json.dumps(entries))
    runtime = RecordingRuntime()
    app, services = build_gateway(data, runtime)
    client = app.test_client()
    assert client.post("/streams", json=WEATHER, headers=auth_header("nea")).status_code == 201
    r = client.post("/policies", data=(POLICIES / "nea-weather-policy.xml").read_bytes(),
                    headers=auth_header("nea", **XML))
    assert r.status_code == 201
    yield client, services, runtime, data
    services.close()


def audit(client, token=None, who="nea", **params):
    headers = {"Authorization": f"Bearer {token}"} if token else auth_header(who)
    return client.get("/audit", headers=headers, query_string=params)


def test_grants_refusals_endings_and_policy_changes_are_recorded(gw):
    client, services, runtime, data = gw
    body = (POLICIES / "lta-request.xml").read_bytes()
    r = client.post("/requests", data=body, headers=auth_header("lta", **XML))
    assert r.status_code == 201
    handle_id = r.json["id"]
    assert client.post("/requests", data=body, headers=auth_header("other", **XML)).status_code == 403
    assert client.delete(f"/handles/{handle_id}", headers=auth_header("lta")).status_code == 200
    r = client.post("/requests", data=body, headers=auth_header("lta", **XML))
    second = r.json["id"]
    assert client.delete("/policies/urn:xsg:example:weather:nea-policy",
                         headers=auth_header("nea")).status_code == 204

    entries = audit(client).json["entries"]
    kinds = [e["kind"] for e in entries]
    assert kinds == ["stream-registered", "policy-added", "granted", "refused",
                     "handle-released", "granted", "handle-revoked", "policy-deleted"]
    granted = entries[2]
    assert granted["subject"] == "lta" and granted["stream"] == "weather" and granted["new"]
    assert granted["handle_ref"] == handle_ref(handle_id)
    assert granted["plan"]["window"]["size"] == 5
    assert granted["policies"] == [{"id": "urn:xsg:example:weather:nea-policy", "version": "1.0",
                                    "store_version": 1}]
    refused = entries[3]
    assert refused["subject"] == "other" and refused["stream"] == "weather"
    assert refused["refusal"] == "AccessDenied"
    assert entries[6]["handle_ref"] == handle_ref(second) and "deleted" in entries[6]["reason"]
    assert entries[7]["by"] == "nea" and entries[7]["streams"] == ["weather"]
    assert [e["seq"] for e in entries] == sorted(e["seq"] for e in entries)

    # never a token, a handle id or a data value
    text = "".join(p.read_text() for p in (data / "audit").iterdir())
    for secret in (*TOKENS.values(), handle_id, second):
        assert secret not in text


def test_queries_and_who_may_read(gw):
    client, services, runtime, data = gw
    body = (POLICIES / "lta-request.xml").read_bytes()
    client.post("/requests", data=body, headers=auth_header("lta", **XML))
    assert [e["kind"] for e in audit(client, kind="granted").json["entries"]] == ["granted"]
    assert audit(client, subject="nobody").json["entries"] == []
    assert len(audit(client, limit="2").json["entries"]) == 2
    after = audit(client).json["entries"][0]["seq"]
    assert all(e["seq"] > after for e in audit(client, after=str(after)).json["entries"])
    assert audit(client, since="2999-01-01T00:00:00Z").json["entries"] == []
    assert audit(client, who="lta").status_code == 403
    # an owner sees only the entries about its own streams
    own = {"name": "mine", "schema": [{"name": "t", "type": "timestamp"}], "time_attribute": "t"}
    r = client.post("/streams", json=own, headers={"Authorization": f"Bearer {OWNER_TOKEN}"})
    assert r.status_code == 201
    mine = audit(client, token=OWNER_TOKEN).json["entries"]
    assert [(e["kind"], e["stream"]) for e in mine] == [("stream-registered", "mine")]
    for bad in ({"limit": "0"}, {"limit": "x"}, {"since": "yesterday"}, {"after": "-1"}):
        r = audit(client, **bad)
        assert r.status_code == 400 and r.json["error"]


def test_rotation_keeps_order_and_numbering_across_files_and_restarts(tmp_path):
    log = AuditLog(tmp_path, max_bytes=2048, keep=3, durable=False)
    for i in range(60):
        log.record("policy-added", policy_id=f"p{i}", by="x" * 40)
    files = log.files()
    assert len(files) == 3 and files[-1].name == "audit.log"
    kept = list(log.entries())
    assert [e["seq"] for e in kept] == list(range(kept[0]["seq"], 61))  # the newest, in order
    log.close()
    again = AuditLog(tmp_path, max_bytes=2048, keep=3, durable=False)
    assert again.record("policy-deleted", policy_id="p0")["seq"] == 61
    with pytest.raises(ValueError, match="never hold"):
        again.record("granted", token="secret")
    again.close()


def test_a_batch_is_written_at_once_numbered_in_order_and_checked_before_writing(
        tmp_path, monkeypatch):
    import os

    log = AuditLog(tmp_path, durable=True)
    log.record("policy-added", policy_id="p0")
    syncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: syncs.append(fd) or real_fsync(fd))
    entries = log.record_many(("handle-revoked", {"subject": f"c{i}", "reason": None})
                              for i in range(500))
    assert len(syncs) == 1  # one flush to disk for the whole batch
    assert [e["seq"] for e in entries] == list(range(2, 502))
    assert "reason" not in entries[0]  # None fields are left out, as for one entry
    with pytest.raises(ValueError, match="never hold"):
        log.record_many([("handle-revoked", {"subject": "ok"}),
                         ("granted", {"Authorization": "Bearer x"})])
    assert [e["seq"] for e in log.entries()] == list(range(1, 502))  # nothing half-written
    assert log.record_many([]) == []
    log.close()
