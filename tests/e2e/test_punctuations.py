"""Security punctuations through the real gateway (HTTP, catalogue, handles, Spark), across a
gateway restart: the segment's policy in force when the gateway stopped governs the tuples
appended after it came back, before any new punctuation (the shield's state is the stream's
log), and the resumed handle keeps its subject's roles."""
from __future__ import annotations

import json
import time

import requests

from tests.e2e.conftest import Reader, auth, start_gateway

ND = {"Content-Type": "application/x-ndjson"}
RULE = {"stream": "ward", "who": {"roles": ["consumer"]}, "attributes": ["patient", "hr"]}
ASK = {"Request": {"Resource": {"Attribute": [{
    "AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id", "Value": "ward"}]},
    "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                              "Value": "read"}]}}}


def lines(*records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def reading(patient: int) -> dict:
    return {"patient": patient, "hr": 60.0 + patient}


def only(roles: list[str], ts: int) -> dict:
    return {"$punctuation": {"srp": roles, "ts": ts}}


def append(base: str, body: bytes) -> None:
    r = requests.post(f"{base}/streams/ward/records", data=body, headers=auth("nea", **ND),
                      timeout=30)
    assert r.status_code == 201, r.text


def test_a_segment_outlives_a_gateway_restart(spark, tmp_path):
    data_dir = tmp_path / "gw"
    a = start_gateway(spark, data_dir)
    try:
        r = requests.post(f"{a.url}/streams", headers=auth("nea"), timeout=30, json={
            "name": "ward", "source": {"kind": "ingest", "punctuations": "on"},
            "schema": [{"name": "patient", "type": "long"}, {"name": "hr", "type": "double"}]})
        assert r.status_code == 201, r.text
        r = requests.post(f"{a.url}/policies", data=json.dumps(RULE), timeout=30, headers=auth(
            "nea", **{"Content-Type": "application/vnd.xsg.rule+json"}))
        assert r.status_code == 201, r.text
        r = requests.post(f"{a.url}/requests", json=ASK, timeout=60,
                          headers=auth("lta", **{"Content-Type": "application/xacml+json"}))
        assert r.status_code == 201, r.text
        handle, hid = r.json()["handle"], r.json()["id"]
        reader = Reader(handle).start()
        # lta (consumer) sees 1; 2 is for medics only; the last policy before the stop: medics
        append(a.url, lines(reading(1), only(["medic"], 1), reading(2),
                            only(["consumer"], 2), reading(3), only(["medic"], 3)))
        assert [row["patient"] for row in reader.wait_rows(2, timeout=60)] == [1, 3]
        last_id = reader.lines[-1]["id"]
    finally:
        a.close()
    b = start_gateway(spark, data_dir)
    try:
        assert b.services.resumed == [hid]
        reader = Reader(f"{b.url}/handles/{hid}", last_event_id=last_id).start()
        # still the medics' segment: 4 and 5 reach nobody but medics; then consumers again
        append(b.url, lines(reading(4), reading(5)))
        append(b.url, lines(only(["consumer"], 4), reading(6)))
        deadline = time.monotonic() + 60
        while 6 not in [row["patient"] for row in reader.rows] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        assert [row["patient"] for row in reader.rows] == [6]
        assert reader.rows[0] == {"patient": 6, "hr": 66.0}
    finally:
        b.close()


def test_a_files_stream_s_punctuation_lines_govern_the_lines_after_them(spark, tmp_path):
    """A `files` stream registered with punctuations on (an administrator's): the owner's
    JSON lines carry them; lta (consumer) gets the tuples of the consumers' segments of each
    file, never a punctuation line, and a file starts with no punctuation."""
    folder = tmp_path / "ward-files"
    folder.mkdir()
    a = start_gateway(spark, tmp_path / "gw")
    try:
        r = requests.post(f"{a.url}/streams", headers=auth("nea"), timeout=30, json={
            "name": "ward", "source": {"kind": "files", "path": str(folder),
                                       "punctuations": "on"},
            "schema": [{"name": "patient", "type": "long"}, {"name": "hr", "type": "double"}]})
        assert r.status_code == 201, r.text  # (main: 400, "supported on ingest streams only")
        r = requests.post(f"{a.url}/policies", data=json.dumps(RULE), timeout=30, headers=auth(
            "nea", **{"Content-Type": "application/vnd.xsg.rule+json"}))
        assert r.status_code == 201, r.text
        r = requests.post(f"{a.url}/requests", json=ASK, timeout=60,
                          headers=auth("lta", **{"Content-Type": "application/xacml+json"}))
        assert r.status_code == 201, r.text
        reader = Reader(r.json()["handle"]).start()
        time.sleep(1.5)  # the handle's query starts at the directory's end
        (folder / ".a.tmp").write_bytes(lines(reading(1), only(["medic"], 1), reading(2),
                                              only(["consumer"], 2), reading(3),
                                              only(["medic"], 3), reading(4)))
        (folder / ".a.tmp").rename(folder / "a.json")
        (folder / ".b.tmp").write_bytes(lines(reading(5)))
        (folder / ".b.tmp").rename(folder / "b.json")
        rows = reader.wait_rows(3, timeout=90)
        time.sleep(1.5)
        assert sorted(row["patient"] for row in reader.rows) == [1, 3, 5]
        assert rows[0] == reading(rows[0]["patient"])
    finally:
        a.close()
