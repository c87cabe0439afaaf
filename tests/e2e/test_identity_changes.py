"""A clearance lowered while the consumer reads (Secure Borealis: rights change, revocation at
once), over HTTP on real Spark.

A medic cleared to Secret (2) reads the multilevel `vitals` example (policies/mls) while the
owner ingests tuples of every level; the operator lowers its clearance to Confidential (1) in
the auth file. The gateway notices without any request (its watcher), re-decides that medic's
handle, whose filter `level <= {subject:clearance}` is now stale, and revokes it: the reader's
last event is `revoked`, within a second of the change, and no tuple ingested after that
reaches it; asking again gives level <= 1 only. A dedicated subject and stream keep the other
end-to-end tests undisturbed.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import requests

from tests.e2e.conftest import POLICIES, Reader, auth

SUBJECT, TOKEN = "medic-ident", "tok-medic-ident-0123456789"
STREAM = "vitals_ident"
POLICY_ID = "urn:xsg:test:e2e:vitals-ident"
XML = {"Content-Type": "application/xacml+xml"}
SCHEMA = [{"name": n, "type": t} for n, t in (("sid", "long"), ("wt", "double"), ("bp", "double"),
                                              ("pr", "double"), ("level", "long"))]


def medic_headers(**extra) -> dict:
    return {"Authorization": f"Bearer {TOKEN}", **extra}


def medic_entry(clearance: int) -> dict:
    return {"token": TOKEN, "subject": SUBJECT, "roles": ["medic", f"clearance:{clearance}"],
            "attributes": {"clearance": clearance}}


def replace_auth(path: Path, entries: list[dict]) -> float:
    """Write a new auth file atomically; returns when it is in place (monotonic)."""
    tmp = path.with_name(path.name + ".ident-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds tokens
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(entries, f)
    os.replace(tmp, path)
    return time.monotonic()


class Ingest:
    """The owner ingests a tuple of each level (0, 1, 2) every 0.1 s; remembers when each
    sid's POST began, so a test can tell what was ingested after a moment."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.started_at: dict[int, float] = {}
        self.stop = threading.Event()
        self.next_sid = 1
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            batch = []
            for level in (0, 1, 2):
                batch.append({"sid": self.next_sid, "wt": 70.0, "bp": 120.0, "pr": 60.0,
                              "level": level})
                self.next_sid += 1
            now = time.monotonic()
            for record in batch:
                self.started_at[record["sid"]] = now
            body = "".join(json.dumps(r) + "\n" for r in batch)
            requests.post(f"{self.base}/streams/{STREAM}/records", data=body, timeout=30,
                          headers=auth("nea", **{"Content-Type": "application/x-ndjson"}))
            self.stop.wait(0.1)


def test_a_lowered_clearance_revokes_within_a_second_and_nothing_of_level_2_follows(gateway):
    base = gateway.url
    auth_file = Path(gateway.services.config.auth_file)
    original = auth_file.read_text()
    entries = json.loads(original)
    replace_auth(auth_file, entries + [medic_entry(2)])
    ingest = Ingest(base)
    try:
        r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30,
                          json={"name": STREAM, "schema": SCHEMA, "source": {"kind": "ingest"}})
        assert r.status_code == 201, r.text
        policy = (POLICIES / "mls" / "vitals-policy.xml").read_bytes().replace(
            b'PolicyId="urn:xsg:example:mls:vitals-policy"', f'PolicyId="{POLICY_ID}"'.encode()
        ).replace(b">vitals</AttributeValue>", f">{STREAM}</AttributeValue>".encode())
        r = requests.post(f"{base}/policies", headers=auth("nea", **XML), data=policy, timeout=30)
        assert r.status_code == 201, r.text
        request = (POLICIES / "mls" / "medic-request.xml").read_bytes().replace(
            b">vitals</AttributeValue>", f">{STREAM}</AttributeValue>".encode())

        # the new subject is picked up by the watcher: wait until the gateway knows it
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if requests.get(f"{base}/handles", headers=medic_headers(),
                            timeout=10).status_code == 200:
                break
            time.sleep(0.1)
        r = requests.post(f"{base}/requests", headers=medic_headers(**XML), data=request,
                          timeout=60)
        assert r.status_code == 201, r.text
        assert "`level` <= 2" in r.json()["sql"], r.json()["sql"]
        reader = Reader(r.json()["handle"], token=TOKEN).start()
        ingest.thread.start()
        assert reader.wait(lambda: any(row["level"] == 2 for row in reader.rows)), \
            reader.events[-3:]

        changed_at = replace_auth(auth_file, entries + [medic_entry(1)])
        assert reader.wait(reader.done.is_set, timeout=10)
        arrived, last = reader.events[-1]
        assert last["event"] == "revoked", last
        assert "identity changed (auth file)" in last["reason"]
        seconds = arrived - changed_at
        print(
            f"\nclearance lowered in the auth file -> reader's `revoked`: {seconds * 1000:.0f} ms"
        )
        assert seconds < 1.0, seconds
        # nothing ingested after the revocation reached the old reader
        late = [row["sid"] for row in reader.rows if ingest.started_at[row["sid"]] > arrived]
        assert late == []
        assert requests.get(reader.url, headers=medic_headers(Accept="application/x-ndjson"),
                            timeout=10).status_code == 410

        # asking again: the new clearance, and no tuple of level 2 while level 2 keeps coming
        r = requests.post(f"{base}/requests", headers=medic_headers(**XML), data=request,
                          timeout=60)
        assert r.status_code == 201, r.text
        assert "`level` <= 1" in r.json()["sql"]
        again = Reader(r.json()["handle"], token=TOKEN).start()
        assert again.wait(lambda: len(again.rows) >= 20)
        assert {row["level"] for row in again.rows} <= {0, 1}
        assert {row["level"] for row in again.rows} == {0, 1}
    finally:
        ingest.stop.set()
        if ingest.thread.is_alive():
            ingest.thread.join(10)
        replace_auth(auth_file, json.loads(original))  # the medic removed: its handle ends
        requests.delete(f"{base}/policies/{POLICY_ID}", headers=auth("nea"), timeout=30)
