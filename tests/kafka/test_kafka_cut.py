"""A Kafka handle starts at its request (issue 41, item 2), seen from the consumer's side over
HTTP: while an owner's producer writes continuously (each acknowledgement timestamped) and
another consumer's handle keeps the stream's query running, a consumer's request gets a handle
that receives no record the broker acknowledged before the request was sent, and every record
produced after the handle was granted (no over-cut). Offsets that cannot be read refuse the
request (503) rather than open a handle without its cut."""
from __future__ import annotations

import time

import requests

from tests.e2e.conftest import Reader, auth
from tests.e2e.test_restart_and_sse import sensor_request
from tests.kafka import test_kafka_gateway
from tests.kafka.broker import free_port
from tests.kafka.conftest import SteadyProducer, kafka_source
from tests.kafka.test_kafka_gateway import register

kgateway = test_kafka_gateway.kgateway  # its gateway fixture, shared under its name
XML = {"Content-Type": "application/xacml+xml"}
S = "http://www.w3.org/2001/XMLSchema#string"


def open_policy(stream: str, policy_id: str) -> bytes:
    """Anyone authenticated may read `stream`'s positive values (ts and value only)."""
    def assign(obligation: str, attribute: str, value: str) -> str:
        return (f'<ObligationExpression ObligationId="exacml:obligation:{obligation}" '
                f'FulfillOn="Permit"><AttributeAssignmentExpression '
                f'AttributeId="exacml:obligation:{attribute}"><AttributeValue DataType="{S}">'
                f"{value}</AttributeValue></AttributeAssignmentExpression></ObligationExpression>")
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="{policy_id}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
        <AttributeValue DataType="{S}">{stream}</AttributeValue>
        <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
          AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" DataType="{S}"
          MustBePresent="false"/></Match></AllOf></AnyOf></Target>
      <Rule RuleId="all" Effect="Permit"><ObligationExpressions>
        {assign("stream-filter", "stream-filter-condition-id", "value &gt; 0")}
        {assign("stream-map", "stream-map-attribute-id", "value")}
      </ObligationExpressions></Rule></Policy>""".encode()


def test_a_handle_gets_no_record_acknowledged_before_its_request(kgateway, kafka_broker,
                                                                  kafka_topic):
    base = kgateway.url
    topic = kafka_topic(3)
    assert register(base, "k_cut", kafka_source(kafka_broker, topic)).status_code == 201
    r = requests.post(f"{base}/policies", headers=auth("nea", **XML), timeout=30,
                      data=open_policy("k_cut", "urn:t:k_cut"))
    assert r.status_code == 201, r.text
    # another consumer's handle: the stream's query runs before, during and after the request
    r = requests.post(f"{base}/requests", headers=auth("other", **XML), timeout=60,
                      data=sensor_request("k_cut"))
    assert r.status_code == 201, r.text
    holder = Reader(r.json()["handle"], who="other").start()
    producer = SteadyProducer(kafka_broker.bootstrap, topic)
    producer.start()
    try:
        assert len(holder.wait_rows(30, timeout=90)) >= 30  # records flow through the query
        sent = time.time()
        r = requests.post(f"{base}/requests", headers=auth("lta", **XML), timeout=60,
                          data=sensor_request("k_cut"))
        granted = time.time()
        assert r.status_code == 201, r.text
        reader = Reader(r.json()["handle"]).start()
        time.sleep(2.0)
    finally:
        producer.stop.set()
        producer.join(60)
    assert not producer.errors and len(producer.acked) == len(producer.produced)
    total = len(producer.produced)
    # the holder got every record: the query has read all of them
    assert len(holder.wait_rows(total, timeout=90)) == total
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
            x["value"] == total for x in reader.rows):
        time.sleep(0.1)
    time.sleep(0.5)
    got = [int(x["value"]) - 1 for x in reader.rows]
    before = {i for i, at in producer.acked.items() if at < sent}
    after = {i for i, at in producer.produced.items() if at > granted}
    assert before and after and len(got) == len(set(got))
    leaked = sorted(set(got) & before)
    assert not leaked, (f"{len(leaked)} records acknowledged up to "
                        f"{sent - producer.acked[leaked[0]]:.3f} s before the request reached "
                        "the handle")
    assert after <= set(got), sorted(after - set(got))[:10]
    # the cut is the topic's offsets: how many records it held, hidden ones too; the consumer's
    # description of its handle does not show it
    described = requests.get(reader.url, timeout=30,
                             headers=auth("lta", Accept="application/json"))
    assert described.status_code == 200 and "start_offsets" not in described.text
    assert requests.delete(reader.url, headers=auth("lta"), timeout=30).status_code == 200
    assert requests.delete(holder.url, headers=auth("other"), timeout=30).status_code == 200


def test_a_request_whose_offsets_cannot_be_read_is_refused(kgateway):
    """Deny when in doubt: no broker to ask for the end offsets, no handle (503, saying why),
    rather than a handle without its cut."""
    from pep.runtime.sources.kafka_offsets import KafkaOffsets
    base = kgateway.url
    dead = {"kind": "kafka", "bootstrap.servers": f"127.0.0.1:{free_port()}",
            "subscribe": "gone"}
    assert register(base, "k_cut_dead", dead).status_code == 201
    r = requests.post(f"{base}/policies", headers=auth("nea", **XML), timeout=30,
                      data=open_policy("k_cut_dead", "urn:t:k_cut_dead"))
    assert r.status_code == 201, r.text
    handles = kgateway.services.handles
    before, handles.kafka_cut = handles.kafka_cut, KafkaOffsets(timeout=1.5).end_offsets
    try:
        r = requests.post(f"{base}/requests", headers=auth("lta", **XML), timeout=60,
                          data=sensor_request("k_cut_dead"))
    finally:
        handles.kafka_cut = before
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert "k_cut_dead" in error and "offsets" in error, error
    # the stream's source (its topic and servers) is its owner's, not told to a consumer
    assert "gone" not in r.text and dead["bootstrap.servers"] not in r.text
    assert r.headers.get("Retry-After")
    assert not [h for h in handles.list_for("lta") if h.live and h.stream == "k_cut_dead"]
