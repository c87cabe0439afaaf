"""A gateway killed with kill -9 while a consumer reads a Kafka stream: at the restart its query
resumes from its checkpoint, the handle resumes, and every record the broker acknowledged reaches
the reader exactly once: those read before the kill, those produced just before it, and those
produced while no gateway ran. `xsg serve` runs as a child process whose output goes to
files."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import Reader, auth
from tests.e2e.test_restart_and_sse import sensor_policy, sensor_request
from tests.kafka.broker import free_port
from tests.kafka.conftest import SteadyProducer, kafka_source
from tests.kafka.test_kafka_gateway import SENSOR_SCHEMA
from tests.pep.conftest import write_auth

REPO = Path(__file__).resolve().parents[2]
XML = {"Content-Type": "application/xacml+xml"}


class KilledReader(Reader):
    """A reader whose connection may end mid-chunk (the gateway is killed)."""

    def _run(self) -> None:
        try:
            super()._run()
        except requests.RequestException:
            pass


class ServeProcess:
    """`xsg serve` on a fixed port (the handle's URL survives the restart); stdout and stderr
    go to files, never to a pipe."""

    def __init__(self, data_dir: Path, auth_file: Path, port: int, log_dir: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.args = [sys.executable, "-u", "-m", "pep.cli", "serve", "--port", str(port),
                     "--data-dir", str(data_dir), "--auth", str(auth_file),
                     "--spark-master", "local[2]", "--conf", "spark.driver.memory=1g"]
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout: float = 180.0) -> None:
        self.starts += 1
        out = open(self.log_dir / f"serve-{self.starts}.out", "wb")
        err = open(self.log_dir / f"serve-{self.starts}.err", "wb")
        with out, err:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, cwd=self.log_dir,
                                         env={**os.environ, "PYTHONPATH": str(REPO)},
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"xsg serve exited with {self.proc.returncode}: {self.stderr()}")
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.25)
        self.kill()
        pytest.fail(f"xsg serve did not become ready in {timeout} s: {self.stderr()}")

    def stderr(self) -> str:
        path = self.log_dir / f"serve-{self.starts}.err"
        return path.read_text(errors="replace")[-4000:] if path.is_file() else ""

    def kill(self) -> None:
        """kill -9, the whole process group (the gateway and its JVM)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.mark.timeout(600)
def test_kill_9_while_records_flow_resumes_every_record_once_without_a_gap(
        tmp_path, kafka_broker, kafka_topic):
    """Issue 41, item 3: Kafka keeps the records, so after a kill -9 the gateway knows what its
    reader had (`Last-Event-ID`) and gives it exactly the rest: every acknowledged record the
    policy lets through, once, those produced before the kill, while no gateway ran and after
    the restart, and no `gap` (nothing was lost)."""
    auth_file = tmp_path / "auth.json"
    write_auth(auth_file)
    gw = ServeProcess(tmp_path / "data", auth_file, free_port(), tmp_path)
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
