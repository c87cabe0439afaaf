"""A grant through an inherited role, revoked when the inheritance is removed from the auth file
(issue 47), over HTTP on real Spark.

The policy grants a stream to role `rh-reader` only. A subject holding `rh-senior`, which the
auth file's `role_hierarchy` says inherits `rh-reader`, opens a handle and reads the rows the
owner ingests. The operator removes the inheritance from the file: the gateway notices without
any request (its watcher), re-decides that subject's handle with its narrower roles, and revokes
it. The reader's last event is `revoked`, no row follows it, no row ingested after it reached
the reader, and asking again is refused. A dedicated owner, reader, stream and policy keep the
other end-to-end tests undisturbed; the file is put back as it was.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import requests

from tests.e2e.conftest import RESOURCE, Reader, auth, bearer, match, read_request
from tests.e2e.test_identity_changes import replace_auth

OWNER, OWNER_TOKEN = "rh-owner", "tok-rh-owner-0123456789"
READER, READER_TOKEN = "rh-analyst", "tok-rh-analyst-0123456789"
STREAM = "rh_gauge"
POLICY_ID = "urn:xsg:test:e2e:rh-gauge"
XML = {"Content-Type": "application/xacml+xml"}
ND = {"Content-Type": "application/x-ndjson"}
ROLE = ("urn:oasis:names:tc:xacml:1.0:subject-category:access-subject",
        "urn:oasis:names:tc:xacml:2.0:subject:role")


# Only `rh-reader` is granted; the reader never holds it directly.
POLICY = f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
  PolicyId="{POLICY_ID}" Version="1"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
  <Target><AnyOf><AllOf>{match(*RESOURCE, STREAM)}</AllOf></AnyOf></Target>
  <Rule RuleId="readers" Effect="Permit">
    <Target><AnyOf><AllOf>{match(*ROLE, "rh-reader")}</AllOf></AnyOf></Target></Rule>
</Policy>""".encode()

REQUEST = read_request(STREAM)


class Producer:
    """The owner appends one record every 0.05 s, `v` counting up from 1; remembers when each
    value's POST began."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.next_v = 1
        self.sent_at: dict[float, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            v = float(self.next_v)
            self.sent_at[v] = time.monotonic()
            r = requests.post(f"{self.base}/streams/{STREAM}/records",
                              data=json.dumps({"v": v}) + "\n", headers=bearer(OWNER_TOKEN, **ND),
                              timeout=30)
            if r.status_code != 201:
                return
            self.next_v += 1
            self.stop.wait(0.05)


def auth_file_with(original: list, hierarchy: dict) -> dict:
    return {"tokens": original + [
        {"token": OWNER_TOKEN, "subject": OWNER, "roles": ["data-owner"]},
        {"token": READER_TOKEN, "subject": READER, "roles": ["rh-senior"]}],
        "role_hierarchy": hierarchy}


def test_a_handle_granted_through_an_inherited_role_ends_with_the_inheritance(gateway):
    base = gateway.url
    auth_file = Path(gateway.services.config.auth_file)
    original = auth_file.read_text()
    entries = json.loads(original)
    replace_auth(auth_file, auth_file_with(entries, {"rh-senior": ["rh-reader"]}))
    producer = Producer(base)
    try:
        deadline = time.monotonic() + 10  # the watcher picks the new subjects up
        while requests.get(f"{base}/handles", headers=bearer(READER_TOKEN),
                           timeout=10).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        r = requests.post(f"{base}/streams", headers=bearer(OWNER_TOKEN), timeout=30, json={
            "name": STREAM, "source": {"kind": "ingest"},
            "schema": [{"name": "v", "type": "double"}]})
        assert r.status_code == 201, r.text
        r = requests.post(f"{base}/policies", headers=bearer(OWNER_TOKEN, **XML), data=POLICY,
                          timeout=30)
        assert r.status_code == 201, r.text
        r = requests.post(f"{base}/requests", headers=bearer(READER_TOKEN, **XML), data=REQUEST,
                          timeout=60)
        assert r.status_code == 201, r.text  # granted through the inherited rh-reader
        handle = r.json()["handle"]
        reader = Reader(handle, token=READER_TOKEN, timeout=120).start()
        producer.thread.start()
        assert reader.wait(lambda: len(reader.rows) >= 10), reader.events[-3:]

        # the inheritance removed: the reader's handle is re-decided and revoked at once
        changed_at = time.monotonic()
        replace_auth(auth_file, auth_file_with(entries, {}))
        assert reader.wait(lambda: reader.done.is_set(), timeout=10)
        arrived, last = reader.events[-1]
        assert last["event"] == "revoked", last
        assert "identity changed (auth file)" in last["reason"], last
        print(f"\ninheritance removed -> reader's `revoked`: "
              f"{(arrived - changed_at) * 1000:.0f} ms")
        assert arrived - changed_at < 5.0
        # 0 rows after `revoked`: the stream ends with it, and no value whose append began
        # after the revocation reached the reader
        late = [row["v"] for row in reader.rows if producer.sent_at[row["v"]] > arrived]
        assert late == []
        assert requests.get(handle, headers=bearer(READER_TOKEN, Accept="application/x-ndjson"),
                            timeout=10).status_code == 410
        r = requests.post(f"{base}/requests", headers=bearer(READER_TOKEN, **XML), data=REQUEST,
                          timeout=60)
        assert r.status_code == 403, r.text
        # the owner's other handles and the rest of the file were untouched: nea still decides
        assert requests.get(f"{base}/handles", headers=auth("nea"), timeout=10).status_code == 200
    finally:
        producer.stop.set()
        if producer.thread.is_alive():
            producer.thread.join(10)
        replace_auth(auth_file, json.loads(original))
        requests.delete(f"{base}/streams/{STREAM}?remove_policies=true", headers=auth("nea"),
                        timeout=60)
