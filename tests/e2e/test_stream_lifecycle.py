"""A stream's owner changes and then deletes it while a consumer reads it, over HTTP on real
Spark.

A dedicated owner and reader (added to the auth file for this test, removed after it) and a
dedicated stream keep the other end-to-end tests undisturbed. The reader's grant names its
attributes (a map), so attributes added meanwhile change nothing it sees, while the stream's
query restarts to read them: every record ingested reaches the reader exactly once across the
restart. Then the owner deletes the stream: the reader's last event is `revoked`, no row
follows it, the stream's query is stopped and its directories (ingest, checkpoint, archive)
are gone.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import requests

from tests.e2e.conftest import (
    RESOURCE,
    STRING,
    SUBJECT,
    Reader,
    auth,
    bearer,
    match,
    read_request,
)
from tests.e2e.test_identity_changes import replace_auth

OWNER, OWNER_TOKEN = "lc-owner", "tok-lc-owner-0123456789"
READER, READER_TOKEN = "lc-reader", "tok-lc-reader-0123456789"
STREAM = "lc_gauge"
POLICY_ID = "urn:xsg:test:e2e:lc-gauge"
XML = {"Content-Type": "application/xacml+xml"}
ND = {"Content-Type": "application/x-ndjson"}


POLICY = f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
  PolicyId="{POLICY_ID}" Version="1"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
  <Target><AnyOf><AllOf>{match(*RESOURCE, STREAM)}</AllOf></AnyOf></Target>
  <Rule RuleId="reader" Effect="Permit">
    <Target><AnyOf><AllOf>{match(*SUBJECT, READER)}</AllOf></AnyOf></Target>
    <ObligationExpressions>
      <ObligationExpression ObligationId="exacml:obligation:stream-map" FulfillOn="Permit">
        <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-map-attribute-id">
          <AttributeValue DataType="{STRING}">ts</AttributeValue></AttributeAssignmentExpression>
        <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-map-attribute-id">
          <AttributeValue DataType="{STRING}">v</AttributeValue></AttributeAssignmentExpression>
      </ObligationExpression>
    </ObligationExpressions></Rule>
  <Rule RuleId="deny" Effect="Deny"/></Policy>""".encode()

REQUEST = read_request(STREAM)


class Producer:
    """The owner appends one record every 0.05 s, `v` counting up from 1; with `wide` set, the
    added attribute `w` too. Stops at the first answer that is not 201 (the stream is gone)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.next_v = 1
        self.wide = False
        self.statuses: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            row = {"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "v": float(self.next_v)}
            if self.wide:
                row["w"] = self.next_v * 10
            r = requests.post(f"{self.base}/streams/{STREAM}/records", data=json.dumps(row) + "\n",
                              headers=bearer(OWNER_TOKEN, **ND), timeout=30)
            self.statuses.append(r.status_code)
            if r.status_code != 201:
                return
            self.next_v += 1
            self.stop.wait(0.05)


def test_an_owner_adds_attributes_then_deletes_the_stream_while_it_is_read(gateway):
    base = gateway.url
    data_dir = Path(gateway.services.config.data_dir)
    auth_file = Path(gateway.services.config.auth_file)
    original = auth_file.read_text()
    replace_auth(auth_file, json.loads(original) + [
        {"token": OWNER_TOKEN, "subject": OWNER, "roles": ["data-owner"]},
        {"token": READER_TOKEN, "subject": READER, "roles": ["consumer"]}])
    producer = Producer(base)
    try:
        deadline = time.monotonic() + 10  # the watcher picks the new subjects up
        while requests.get(f"{base}/handles", headers=bearer(READER_TOKEN),
                           timeout=10).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        r = requests.post(f"{base}/streams", headers=bearer(OWNER_TOKEN), timeout=30, json={
            "name": STREAM, "source": {"kind": "ingest"}, "time_attribute": "ts",
            "schema": [{"name": "ts", "type": "timestamp"}, {"name": "v", "type": "double"}]})
        assert r.status_code == 201, r.text
        r = requests.post(f"{base}/policies", headers=bearer(OWNER_TOKEN, **XML), data=POLICY,
                          timeout=30)
        assert r.status_code == 201, r.text
        r = requests.post(f"{base}/requests", headers=bearer(READER_TOKEN, **XML), data=REQUEST,
                          timeout=60)
        assert r.status_code == 201, r.text
        handle = r.json()["handle"]
        reader = Reader(handle, token=READER_TOKEN, timeout=120).start()
        producer.thread.start()
        assert reader.wait(lambda: len(reader.rows) >= 10), reader.events[-3:]

        # attributes added while records arrive: the query restarts, the reader sees nothing
        # change and misses nothing
        r = requests.patch(f"{base}/streams/{STREAM}", headers=bearer(OWNER_TOKEN), timeout=60,
                           json={"add_attributes": [{"name": "w", "type": "long"}],
                                 "description": "a gauge that grows"})
        assert r.status_code == 200, r.text
        assert r.json()["added"] == ["w"] and r.json()["revoked"] == 0
        producer.wide = True
        seen = len(reader.rows)
        assert reader.wait(lambda: len(reader.rows) >= seen + 20), reader.events[-3:]
        values = [row["v"] for row in reader.rows]
        assert values == [float(v) for v in range(int(values[0]), int(values[0]) + len(values))]
        assert all(set(row) == {"ts", "v"} for row in reader.rows)

        # the owner deletes it: the reader's last event is `revoked`, nothing after it
        query = gateway.runtime.query_id(STREAM)
        assert query is not None
        before = requests.get(f"{base}/streams/{STREAM}/dependents", headers=bearer(OWNER_TOKEN),
                              timeout=30).json()
        assert before["live_handles"] == 1
        assert [p["id"] for p in before["policies"]] == [POLICY_ID]
        started = time.monotonic()
        r = requests.delete(f"{base}/streams/{STREAM}?remove_policies=true",
                            headers=bearer(OWNER_TOKEN), timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["handles_revoked"] == 1 and r.json()["data"] == "removed"
        assert reader.wait(lambda: reader.done.is_set(), timeout=10)
        arrived, last = reader.events[-1]
        assert last["event"] == "revoked" and f"stream '{STREAM}' was deleted" in last["reason"]
        print(f"\nDELETE /streams -> reader's `revoked`: {(arrived - started) * 1000:.0f} ms")
        assert requests.get(handle, headers=bearer(READER_TOKEN, Accept="application/x-ndjson"),
                            timeout=10).status_code == 404
        time.sleep(1.0)
        assert producer.statuses[-1] == 404  # the next append found no stream
        assert gateway.runtime.query_id(STREAM) is None and STREAM not in gateway.runtime.stats()
        for gone in (data_dir / "streams" / STREAM,
                     data_dir / "runtime" / "checkpoints" / STREAM,
                     data_dir / "runtime" / "archive" / STREAM):
            assert not gone.exists(), gone
        held = data_dir / "deleted"
        assert not held.exists() or not any(p.name.startswith(STREAM) for p in held.iterdir())
        assert requests.get(f"{base}/policies/{POLICY_ID}", headers=auth("nea"),
                            timeout=10).status_code == 404
        entry = requests.get(f"{base}/audit?kind=stream-deleted&stream={STREAM}",
                             headers=bearer(OWNER_TOKEN), timeout=10).json()["entries"]
        assert [(e["by"], e["handles_revoked"]) for e in entry] == [(OWNER, 1)]
    finally:
        producer.stop.set()
        if producer.thread.is_alive():
            producer.thread.join(10)
        replace_auth(auth_file, json.loads(original))
        requests.delete(f"{base}/streams/{STREAM}?remove_policies=true", headers=auth("nea"),
                        timeout=60)
