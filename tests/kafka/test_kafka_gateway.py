"""Kafka streams end to end over HTTP: the real gateway on Spark, a real broker, topics of three
partitions fed by the owner's own producer (confluent-kafka) and through `POST
/streams/<s>/records`, consumers reading their handles as NDJSON, under the same policies as any
stream (filters, maps, windows, group-by, joins with a Kafka side, revocation, one window per
user)."""
from __future__ import annotations

import json
import time
from collections import Counter

import pytest
import requests

from tests.e2e.conftest import Reader, auth, start_gateway
from tests.e2e.test_restart_and_sse import sensor_policy, sensor_request
from tests.kafka.broker import free_port
from tests.kafka.conftest import kafka_source

XML = {"Content-Type": "application/xacml+xml"}
ND = {"Content-Type": "application/x-ndjson"}
T0 = 1_700_000_000
SENSOR_SCHEMA = [{"name": "ts", "type": "timestamp"}, {"name": "value", "type": "double"},
                 {"name": "secret", "type": "string"}]


@pytest.fixture(scope="module")
def kgateway(spark, tmp_path_factory, kafka_broker):
    gw = start_gateway(spark, tmp_path_factory.mktemp("kafka-gateway"))
    yield gw
    gw.close()


def register(base: str, name: str, source: dict, schema=SENSOR_SCHEMA, time_attribute="ts",
             who: str = "nea") -> requests.Response:
    return requests.post(f"{base}/streams", headers=auth(who), timeout=30, json={
        "name": name, "time_attribute": time_attribute, "source": source, "schema": schema})


def sensors(values, start: int = 0, secret: str = "s") -> list[dict]:
    return [{"ts": T0 + start + i, "value": v, "secret": secret} for i, v in enumerate(values)]


def ndjson(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def topic_values(broker, topic: str, timeout: float = 10.0) -> list[dict]:
    """Every record on the topic, read from the start by a consumer of our own."""
    from confluent_kafka import Consumer
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"check-{time.time()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    out, deadline, quiet = [], time.monotonic() + timeout, 0
    try:
        while time.monotonic() < deadline and quiet < 6:
            msg = consumer.poll(0.5)
            if msg is None:
                quiet += 1 if out or time.monotonic() > deadline - timeout + 3 else 0
                continue
            if msg.error() is None:
                quiet = 0
                out.append(json.loads(msg.value()))
    finally:
        consumer.close()
    return out


def test_owner_producer_and_gateway_ingest_under_policy_then_revocation(
        kgateway, kafka_broker, kafka_topic, producer):
    base = kgateway.url
    topic = kafka_topic(3)
    r = register(base, "k_sensors", kafka_source(kafka_broker, topic))
    assert r.status_code == 201, r.text
    assert requests.post(f"{base}/policies", headers=auth("nea", **XML), timeout=30,
                         data=sensor_policy("k_sensors", "urn:t:k_sensors")).status_code == 201
    r = requests.post(f"{base}/requests", headers=auth("lta", **XML),
                      data=sensor_request("k_sensors"), timeout=60)
    assert r.status_code == 201, r.text
    handle = r.json()["handle"]
    reader = Reader(handle).start()
    # the owner's own producer, records spread over the partitions ...
    producer.send(topic, sensors([1.0, -1.0], 0), partition=2)
    producer.send(topic, sensors([2.0], 2), partition=0)
    # ... and the gateway's API: answered once the broker acknowledged every record
    r = requests.post(f"{base}/streams/k_sensors/records", headers=auth("nea", **ND),
                      data=ndjson(sensors([3.0, -2.0, 4.0], 3)), timeout=30)
    assert r.status_code == 201 and r.json() == {"stream": "k_sensors", "appended": 3}, r.text
    rows = reader.wait_rows(4, timeout=90)
    assert sorted(x["value"] for x in rows) == [1.0, 2.0, 3.0, 4.0]
    assert all(set(x) == {"ts", "value"} for x in rows)  # `secret` is not shown
    # the records read, policy or not, as Spark's progress reports count them (a Kafka batch
    # observes nothing itself): all six, each once
    deadline = time.monotonic() + 15
    while (kgateway.runtime.stats()["k_sensors"]["rows_in"] < 6
           and time.monotonic() < deadline):
        time.sleep(0.2)
    assert kgateway.runtime.stats()["k_sensors"]["rows_in"] == 6
    # what the gateway produced is on the topic, as JSON objects of the schema's attributes
    on_topic = topic_values(kafka_broker, topic)
    assert {json.dumps(x, sort_keys=True) for x in on_topic} >= {
        json.dumps({"ts": "2023-11-14T22:13:23.000000Z", "value": 3.0, "secret": "s"},
                   sort_keys=True)}
    # revocation: the owner deletes the policy; the reader's last event is `revoked`, and
    # records produced afterwards reach nobody
    delivered = kgateway.runtime.stats()["k_sensors"]["rows_delivered"]
    r = requests.delete(f"{base}/policies/urn:t:k_sensors", headers=auth("nea"), timeout=30)
    assert r.status_code == 204, r.text
    assert reader.done.wait(30) and reader.lines[-1]["event"] == "revoked"
    count = len(reader.rows)
    producer.send(topic, sensors([5.0, 6.0], 10))
    r = requests.post(f"{base}/streams/k_sensors/records", headers=auth("nea", **ND),
                      data=ndjson(sensors([7.0], 12)), timeout=30)
    assert r.status_code == 201
    time.sleep(2.0)
    assert len(reader.rows) == count
    assert requests.get(handle, headers=auth("lta"), timeout=10).status_code == 410
    assert kgateway.runtime.stats().get("k_sensors", {}).get("rows_delivered",
                                                             delivered) == delivered


def test_bad_records_send_nothing_and_a_broker_that_does_not_answer_is_a_503(
        kgateway, kafka_broker, kafka_topic):
    base = kgateway.url
    topic = kafka_topic(2)
    assert register(base, "k_checked", kafka_source(kafka_broker, topic)).status_code == 201
    bad = ndjson(sensors([1.0, 2.0])) + b'{"ts": 1700000009, "value": "high", "secret": "s"}\n'
    r = requests.post(f"{base}/streams/k_checked/records", headers=auth("nea", **ND), data=bad,
                      timeout=30)
    assert r.status_code == 400 and r.json()["status"] == 400
    assert "line 3" in r.json()["error"] and "value" in r.json()["error"]
    # a consumer's token may not append; another owner's neither
    r = requests.post(f"{base}/streams/k_checked/records", headers=auth("lta", **ND),
                      data=ndjson(sensors([1.0])), timeout=30)
    assert r.status_code == 403
    assert topic_values(kafka_broker, topic, timeout=4) == []  # nothing was produced
    # a non-administrator may not register a Kafka source (it reaches the server's network)
    r = register(base, "k_owner", kafka_source(kafka_broker, topic), who="lta")
    assert r.status_code == 403
    # the broker is not there: 503 saying which stream, topic and servers, never a 500
    dead = {"kind": "kafka", "bootstrap.servers": f"127.0.0.1:{free_port()}",
            "subscribe": "nowhere"}
    assert register(base, "k_dead", dead).status_code == 201
    kgateway.services.catalog.kafka_timeout = 2.0
    started = time.monotonic()
    r = requests.post(f"{base}/streams/k_dead/records", headers=auth("nea", **ND),
                      data=ndjson(sensors([1.0])), timeout=60)
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["status"] == 503 and "k_dead" in body["error"] and "nowhere" in body["error"]
    assert "acknowledge" in body["error"] and r.headers.get("Retry-After")
    assert time.monotonic() - started < 20
    # a topic the broker does not have: the same, quickly
    assert register(base, "k_notopic", {"kind": "kafka", "bootstrap.servers":
                                        kafka_broker.bootstrap,
                                        "subscribe": "no-such-topic"}).status_code == 201
    r = requests.post(f"{base}/streams/k_notopic/records", headers=auth("nea", **ND),
                      data=ndjson(sensors([1.0])), timeout=60)
    assert r.status_code == 503 and "no-such-topic" in r.json()["error"], r.text
    # a registration that names something else than one topic is refused, saying why
    r = register(base, "k_two", {"kind": "kafka", "bootstrap.servers": kafka_broker.bootstrap,
                                 "subscribe": "a,b"})
    assert r.status_code == 400 and "one topic" in r.json()["error"]


def test_windows_group_by_and_one_window_per_user(kgateway, kafka_broker, kafka_topic,
                                                  producer):
    base = kgateway.url
    topic = kafka_topic(3)
    assert register(base, "k_windows", kafka_source(kafka_broker, topic)).status_code == 201
    assert requests.post(f"{base}/policies", headers=auth("nea", **XML), timeout=30,
                         data=sensor_policy("k_windows", "urn:t:k_windows")).status_code == 201
    query = {"window": {"type": "time", "size": 10, "step": 10, "aggregates": ["value:sum",
                                                                                "value:count"]}}
    r = requests.post(f"{base}/requests", headers=auth("lta"), timeout=60, files={
        "request": ("r.xml", sensor_request("k_windows"), "application/xacml+xml"),
        "query": ("q.json", json.dumps(query), "application/json")})
    assert r.status_code == 201, r.text
    handle = r.json()["handle"]
    reader = Reader(handle).start()
    # one window per user: another query on the same stream is refused, naming the handle
    other = {"window": {"type": "tuple", "size": 2, "step": 2, "aggregates": ["value:avg"]}}
    r = requests.post(f"{base}/requests", headers=auth("lta"), timeout=60, files={
        "request": ("r.xml", sensor_request("k_windows"), "application/xacml+xml"),
        "query": ("q.json", json.dumps(other), "application/json")})
    assert r.status_code == 409 and handle.rsplit("/", 1)[1] in r.text
    start = (T0 + 100) // 10 * 10 - T0
    producer.send(topic, sensors([1.0, -5.0, 2.0], start), partition=0)
    producer.send(topic, sensors([3.0, 4.0], start + 3), partition=1)
    producer.send(topic, sensors([1.0], start + 30), partition=2)  # closes the first window
    rows = reader.wait_rows(1, timeout=90)
    # the policy's filter (value > 0) runs before the window: -5 never counts
    assert rows[0]["sum_value"] == 10.0 and rows[0]["count_value"] == 4
    assert requests.delete(handle, headers=auth("lta"), timeout=30).status_code == 200


def test_join_with_a_kafka_side(kgateway, kafka_broker, kafka_topic, producer):
    """A Kafka stream joined with an ingest stream, each side under its own policy."""
    from tests.e2e.test_joins import policy
    base = kgateway.url
    topic = kafka_topic(2)
    ships_schema = [{"name": "ts", "type": "timestamp"}, {"name": "area", "type": "string"},
                    {"name": "mmsi", "type": "long"}, {"name": "speed", "type": "double"}]
    stations_schema = [{"name": "t", "type": "timestamp"}, {"name": "station", "type": "string"},
                       {"name": "rainrate", "type": "double"}]
    assert register(base, "k_ships", kafka_source(kafka_broker, topic),
                    schema=ships_schema).status_code == 201
    assert register(base, "k_stations", {"kind": "ingest"}, schema=stations_schema,
                    time_attribute="t").status_code == 201
    for doc in (policy("k_stations", "lta", "rainrate &gt; 1", "t", "station", "rainrate"),
                policy("k_ships", "lta", "speed &lt; 20", "ts", "area", "mmsi", "speed")):
        r = requests.post(f"{base}/policies", headers=auth("nea", **XML), data=doc, timeout=30)
        assert r.status_code == 201, r.text
    request = json.dumps({"Request": {
        "Resource": {"Attribute": [{"AttributeId":
                                    "urn:oasis:names:tc:xacml:1.0:resource:resource-id",
                                    "Value": "k_stations"}],
                     "Content": {"join": {"stream": "k_ships", "on": [["station", "area"]],
                                          "within": 5}}},
        "Action": {"Attribute": [{"AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
                                  "Value": "read"}]}}}).encode()
    r = requests.post(f"{base}/requests", timeout=60, data=request,
                      headers=auth("lta", **{"Content-Type": "application/xacml+json"}))
    assert r.status_code == 201, r.text
    reader = Reader(r.json()["handle"]).start()  # the join runs: its Kafka side's offsets are set
    now = int(time.time())
    ships = [{"ts": now + i, "area": "AB"[i % 2], "mmsi": 1000 + i, "speed": 10.0 + 10 * (i % 2)}
             for i in range(6)]  # speeds 10, 20, 10, 20, ...: the odd ones are hidden
    stations = [{"t": now + i, "station": "AB"[i % 2], "rainrate": 2.0} for i in range(6)]
    producer.send(topic, ships[:3], partition=0)
    producer.send(topic, ships[3:], partition=1)
    r = requests.post(f"{base}/streams/k_stations/records", headers=auth("nea", **ND),
                      data=ndjson(stations), timeout=30)
    assert r.status_code == 201
    expected = Counter((a["station"], b["mmsi"]) for a in stations for b in ships
                       if b["speed"] < 20 and a["station"] == b["area"]
                       and abs(a["t"] - b["ts"]) <= 5)
    assert sum(expected.values()) == 9
    rows = reader.wait_rows(9, timeout=90)
    time.sleep(1.0)
    got = Counter((x["k_stations.station"], x["k_ships.mmsi"]) for x in reader.rows)
    assert got == expected
    assert all(x["k_ships.speed"] < 20 for x in rows)
    r = requests.delete(f"{base}/policies/urn:t:join:k_ships:lta", headers=auth("nea"),
                        timeout=30)
    assert r.status_code == 204
    assert reader.done.wait(30) and reader.lines[-1]["event"] == "revoked"
