"""A gateway killed with kill -9 while a consumer reads a Kafka stream: at the restart its query
resumes from its checkpoint, the handle resumes, and every record the broker acknowledged reaches
the reader exactly once: those read before the kill, those produced just before it, and those
produced while no gateway ran. `xsg serve` runs as a child process whose output goes to
files."""
from __future__ import annotations

import time

import pytest
import requests

from tests.client.conftest import ServeProcess
from tests.e2e.conftest import Reader, auth
from tests.e2e.test_restart_and_sse import sensor_policy, sensor_request
from tests.kafka.conftest import SteadyProducer, kafka_source
from tests.kafka.test_kafka_gateway import SENSOR_SCHEMA

XML = {"Content-Type": "application/xacml+xml"}


class KilledReader(Reader):
    """A reader whose connection may end mid-chunk (the gateway is killed)."""

    def _run(self) -> None:
        try:
            super()._run()
        except requests.RequestException:
            pass


@pytest.mark.timeout(600)
def test_kill_9_while_records_flow_resumes_every_record_once_without_a_gap(
        tmp_path, kafka_broker, kafka_topic):
    """Issue 41, item 3: Kafka keeps the records, so after a kill -9 the gateway knows what its
    reader had (`Last-Event-ID`) and gives it exactly the rest: every acknowledged record the
    policy lets through, once, those produced before the kill, while no gateway ran and after
    the restart, and no `gap` (nothing was lost)."""
    gw = ServeProcess(tmp_path, heartbeat=15.0)  # (the gateway's default heartbeat)
    topic = kafka_topic(3)
    gw.start()
    producer = SteadyProducer(kafka_broker.bootstrap, topic, every=0.01, negative=3)
    try:
        r = requests.post(f"{gw.url}/streams", headers=auth("nea"), timeout=30, json={
            "name": "k_killed", "time_attribute": "ts", "schema": SENSOR_SCHEMA,
            "source": kafka_source(kafka_broker, topic)})
        assert r.status_code == 201, r.text
        r = requests.post(f"{gw.url}/policies", headers=auth("nea", **XML), timeout=30,
                          data=sensor_policy("k_killed", "urn:t:k_killed"))
        assert r.status_code == 201, r.text
        r = requests.post(f"{gw.url}/requests", headers=auth("lta", **XML), timeout=120,
                          data=sensor_request("k_killed"))
        assert r.status_code == 201, r.text
        handle = r.json()["handle"]
        first = KilledReader(handle).start()
        producer.start()  # after the grant: every record it acknowledges is the handle's
        assert len(first.wait_rows(60, timeout=120)) >= 60
        gw.kill()  # while records flow
        assert first.done.wait(30)
        time.sleep(1.0)  # they flow while no gateway runs
        gw.start()
        last_id = max((x["id"] for x in first.lines if "id" in x), default=None)
        second = KilledReader(handle, last_event_id=last_id).start()
        time.sleep(2.0)  # and after the restart
        producer.stop.set()
        producer.join(60)
        assert not producer.errors and len(producer.acked) == len(producer.produced)
        wanted = producer.matching()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and \
                {x["value"] for x in first.rows + second.rows} < wanted:
            time.sleep(0.2)
        time.sleep(1.0)
        got = [x["value"] for x in first.rows + second.rows]
        assert sorted(got) == sorted(wanted), (
            f"missing {len(wanted - set(got))}, repeated {len(got) - len(set(got))}, "
            f"unexpected {len(set(got) - wanted)}", gw.stderr())
        gaps = [x for x in second.lines if x.get("event") == "gap"]
        assert not gaps, gaps
    finally:
        producer.stop.set()
        gw.stop()
