"""A query that fails on a row's value tells its readers, /health and the next requester that it
failed, and what kind of failure, over HTTP on real Spark; the value reaches none of them, nor
any log line (common/errors.py, docs/security.md).

The gateway's own steps never fail on a value (its sources read a bad value as null), so the
failure is made by a step added to the stream's micro-batches: a Python step on the workers that
refuses the tuple and says its value, as a bug or a library's error would.
"""
from __future__ import annotations

import json
import time

import pytest
import requests

from pep.runtime.query.lifecycle import QueryLifecycle
from pep.runtime.query.runner import MicroBatchRunner
from tests.e2e.conftest import Gateway, Reader, auth
from tests.e2e.test_stall_alarms import POLICY, REQUEST, STREAM
from tests.pep.conftest import build_gateway
from tests.pep.runtime.log_capture import captured_logs, refuse_values

pytestmark = pytest.mark.timeout(240)

SECRET = "Mrs Secret 0451"


@pytest.fixture
def gateway(spark, tmp_path):
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    from server.serving import HttpServer

    runtime = StreamRuntime(spark, tmp_path / "runtime", settings=RuntimeSettings(
        trigger_interval=0.25, stall_seconds=2.0, janitor_interval=0.2))
    app, services = build_gateway(tmp_path / "data", runtime, heartbeat=0.5, interval=0.1)
    server = HttpServer(app, host="127.0.0.1", port=0, threads=8)
    server.start()
    gw = Gateway(server.url, app, services, server, runtime)
    yield gw
    gw.close()


def test_readers_health_and_answers_say_the_failure_not_the_value(gateway, spark, tmp_path,
                                                                  caplog, monkeypatch):
    base = gateway.url
    with captured_logs(spark, caplog, tmp_path) as logs:
        r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
            "name": STREAM, "source": {"kind": "ingest"},
            "schema": [{"name": "v", "type": "double"}, {"name": "tag", "type": "string"}]})
        assert r.status_code == 201, r.text
        r = requests.post(f"{base}/policies", headers=auth("nea", **{
            "Content-Type": "application/xacml+xml"}), data=POLICY, timeout=30)
        assert r.status_code == 201, r.text
        real_run = MicroBatchRunner.run

        def run(self, batch, batch_id):
            refuse_values(batch)
            return real_run(self, batch, batch_id)

        monkeypatch.setattr(MicroBatchRunner, "run", run)
        xml = {"Content-Type": "application/xacml+xml"}
        r = requests.post(f"{base}/requests", headers=auth("lta", **xml), data=REQUEST,
                          timeout=60)
        assert r.status_code == 201, r.text
        reader = Reader(r.json()["handle"]).start()
        r = requests.post(f"{base}/streams/{STREAM}/records", timeout=30,
                          data=json.dumps({"v": 1.0, "tag": SECRET}) + "\n",
                          headers=auth("nea", **{"Content-Type": "application/x-ndjson"}))
        assert r.status_code == 201, r.text

        # the reader is told its stream failed, and of what kind
        def failed() -> list[dict]:  # (on a loaded machine a `stalled` one may come first)
            return [x for x in reader.lines if x.get("event") == "stalled"
                    and x.get("state") == "failed"]

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not failed():
            time.sleep(0.1)
        assert failed(), reader.lines
        assert SECRET not in json.dumps(failed()) and "PythonException" in json.dumps(failed())
        health = requests.get(f"{base}/health", headers=auth("nea"), timeout=30)
        assert SECRET not in health.text
        assert "PythonException" in health.text and f"stream {STREAM} is failed" in health.text

        # released, and asked for again: the new handle starts the query again, and this
        # time its start fails on the value
        released = requests.delete(reader.url, headers=auth("lta"), timeout=30)
        assert released.status_code in (200, 204), released.text
        assert reader.done.wait(30)

        def start(self, *args, **kwargs):
            refuse_values(spark.createDataFrame([(SECRET,)], "tag string"))

        monkeypatch.setattr(QueryLifecycle, "start", start)
        again = requests.post(f"{base}/requests", headers=auth("lta", **xml), data=REQUEST,
                              timeout=60)
        assert again.status_code == 503 and SECRET not in again.text, again.text
        assert "PythonException" in again.json()["detail"]

        # the handle it made ended, its reason stored and shown to its owner
        listed = requests.get(f"{base}/handles", headers=auth("lta"), timeout=30)
        ended = [h for h in listed.json()["handles"] if h["state"] == "ended"]
        assert ended and "PythonException" in ended[0]["reason"], listed.text
        assert SECRET not in listed.text

        seen = "\n".join((json.dumps(reader.lines), health.text, again.text, listed.text,
                          logs.text()))
        assert SECRET not in seen
        assert "micro-batch" in logs.text() and "runtime refused handle" in logs.text()
