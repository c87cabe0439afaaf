"""The audit trail (issue 9, class 7): who was granted what, under which policy versions; what
was refused, revoked and released; which policies and streams changed. Append-only, rotated,
queryable by administrators and by owners for their streams, never holding tokens, handle ids
or data values."""
from __future__ import annotations

import json
import threading
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
def gw(tmp_path, store_url):
    """A gateway on each store: the audit trail in files (SQLite) or a table (PostgreSQL)."""
    data = tmp_path / "data"
    data.mkdir()
    write_auth(data / "auth.json")
    entries = json.loads((data / "auth.json").read_text())
    entries.append({"token": OWNER_TOKEN, "subject": "owner2", "roles": ["data-owner"],
                    "admin": False})
    (data / "auth.json").write_text(json.dumps(entries))
    runtime = RecordingRuntime()
    app, services = build_gateway(data, runtime, store=store_url)
    client = app.test_client()
    assert client.post("/streams", json=WEATHER, headers=auth_header("nea")).status_code == 201
    r = client.post("/policies", data=(POLICIES / "nea-weather-policy.xml").read_bytes(),
                    headers=auth_header("nea", **XML))
    assert r.status_code == 201
    yield client, services, runtime, data
    services.close()


def stored_text(services, data) -> str:
    """Everything the trail wrote, as it is stored: its files, or its table's rows."""
    if services.storage.url is None:
        return "".join(p.read_text() for p in (data / "audit").iterdir())
    return "".join(row[0] for row in services.storage.database("audit").fetchall(
        "SELECT entry FROM audit_entries"))


def audit(client, token=None, who="nea", **params):
    headers = {"Authorization": f"Bearer {token}"} if token else auth_header(who)
    return client.get("/audit", headers=headers, query_string=params)


def test_grants_refusals_endings_and_policy_changes_are_recorded(gw):
    client, services, runtime, data = gw
    body = (POLICIES / "lta-request.xml").read_bytes()
    r = client.post("/requests", data=body, headers=auth_header("lta", **XML))
    assert r.status_code == 201
    handle_id = r.json["id"]
    assert (
        client.post("/requests", data=body, headers=auth_header("other", **XML)).status_code == 403
    )
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

    # never a token, a handle id or a data value, in what is stored
    text = stored_text(services, data)
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


# -- the trail as a table of the store (PostgreSQL's; the same class runs on SQLite) ------------

def test_the_table_numbers_batches_in_order_checks_them_first_and_survives_a_restart(storage):
    from common.db import open_storage
    from pep.audit.table import AuditTable

    table = AuditTable(storage.database("audit"))
    table.record("policy-added", policy_id="p0")
    entries = table.record_many(("handle-revoked", {"subject": f"c{i}", "reason": None})
                                for i in range(500))
    assert [e["seq"] for e in entries] == list(range(2, 502))
    assert "reason" not in entries[0]  # None fields are left out, as for one entry
    with pytest.raises(ValueError, match="never hold"):
        table.record_many([("handle-revoked", {"subject": "ok"}),
                           ("granted", {"Authorization": "Bearer x"})])
    assert [e["seq"] for e in table.entries()] == list(range(1, 502))  # nothing half-written
    assert table.record_many([]) == []
    # queries: the newest `limit`, oldest first; filters in SQL and in Python agree
    assert [e["subject"] for e in table.query(kinds=["handle-revoked"], limit=3)] == \
        ["c497", "c498", "c499"]
    assert [e["seq"] for e in table.query(after_seq=499)] == [500, 501]
    assert table.query(subject="c7")[0]["seq"] == 9
    assert table.query(kinds=["policy-added"], view=lambda e: None) == []
    # a stream's entries, either side of a join included (`pep.audit.views.entry_streams`)
    table.record("granted", subject="lta", stream="left", streams=["left", "right"])
    table.record("granted", subject="lta", stream="weather")
    assert [e["stream"] for e in table.query(stream="right")] == ["left"]
    assert [e["stream"] for e in table.query(stream="weather", kinds=["granted"])] == ["weather"]
    table.close()
    storage.close()
    again = open_storage(storage.data_dir, storage.url)  # a restart (a new pool)
    try:
        table = AuditTable(again.database("audit"))
        assert table.record("policy-deleted", policy_id="p0")["seq"] == 504
        assert [e["kind"] for e in table.query(kinds=["policy-added", "policy-deleted"])] == [
            "policy-added", "policy-deleted"]
    finally:
        again.close()


def test_two_writers_on_one_table_share_one_sequence(storage):
    """Two trails on one store (two processes' pools on PostgreSQL): every seq once, in commit
    order, whoever wrote it."""
    from common.db import open_storage
    from pep.audit.table import AuditTable

    other = open_storage(storage.data_dir, storage.url)
    tables = [AuditTable(storage.database("audit")), AuditTable(other.database("audit"))]
    errors = []

    def write(n: int) -> None:
        try:
            for i in range(40):
                tables[n].record_many([("granted", {"subject": f"w{n}", "i": i})] * 3)
        except Exception as exc:  # noqa: BLE001 - reported below  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    other.close()
    assert errors == []
    seqs = [e["seq"] for e in tables[0].entries()]
    assert seqs == list(range(1, 241))
    for n in (0, 1):
        mine = [e for e in tables[0].entries() if e["subject"] == f"w{n}"]
        assert [e["i"] for e in mine] == sorted(e["i"] for e in mine)  # each writer's order kept
