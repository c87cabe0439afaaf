"""Issue 42: a stall is reported only when input has really waited, over HTTP on real Spark.

A gateway of its own with a short stall bound (2 s, the default is 30 s) and its stall checks
every 0.1 s. A stream idle for longer than the bound, then one append: the reader gets the row
and no `stalled` event, and /health stays ready throughout (the bug: the input's waiting time
was counted from the last micro-batch, not from when the input arrived, so the append's batch
was reported stalled while it ran, then resumed). A real stall, input waiting behind a
micro-batch whose delivery does not return, is still reported: `stalled` to the reader, /health
degraded, a warning; and `resumed` once the batch goes on.
"""
from __future__ import annotations

import json
import logging
import threading
import time

import pytest
import requests

from pep.core.plan import ExecutionPlan
from tests.e2e.conftest import RESOURCE, SUBJECT, Gateway, Reader, auth, match, read_request
from tests.pep.conftest import build_gateway

pytestmark = pytest.mark.timeout(240)

STALL = 2.0  # seconds: the stall bound of this gateway
STREAM = "quiet_gauge"
XML = {"Content-Type": "application/xacml+xml"}
POLICY = f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
  PolicyId="urn:xsg:test:e2e:quiet-gauge" Version="1"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
  <Target><AnyOf><AllOf>{match(*RESOURCE, STREAM)}</AllOf></AnyOf></Target>
  <Rule RuleId="lta" Effect="Permit">
    <Target><AnyOf><AllOf>{match(*SUBJECT, "lta")}</AllOf></AnyOf></Target></Rule>
  <Rule RuleId="deny" Effect="Deny"/></Policy>""".encode()
REQUEST = read_request(STREAM)


@pytest.fixture(scope="module")
def quick_stalls(spark, tmp_path_factory):
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    from server.serving import HttpServer

    data_dir = tmp_path_factory.mktemp("stall-gateway")
    runtime = StreamRuntime(spark, data_dir / "runtime", settings=RuntimeSettings(
        trigger_interval=0.25, stall_seconds=STALL, janitor_interval=0.2))
    app, services = build_gateway(data_dir, runtime, heartbeat=0.5, interval=0.1)
    server = HttpServer(app, host="127.0.0.1", port=0, threads=8)
    server.start()
    gw = Gateway(server.url, app, services, server, runtime)
    yield gw
    gw.close()


def append(base: str, v: float) -> None:
    r = requests.post(f"{base}/streams/{STREAM}/records", timeout=30,
                      data=json.dumps({"v": v}) + "\n",
                      headers=auth("nea", **{"Content-Type": "application/x-ndjson"}))
    assert r.status_code == 201, r.text


def watch(gw: Gateway, until, timeout: float) -> tuple[set[str], set[str]]:
    """Poll the runtime's and /health's verdicts every 20 ms until `until()` (then 0.5 s
    more: several stall checks); (stream states seen, /health statuses seen)."""
    states, statuses = set(), set()
    deadline, after = time.monotonic() + timeout, None
    while time.monotonic() < deadline and (after is None or time.monotonic() < after):
        states.add(gw.runtime.health()[STREAM]["state"])
        statuses.add(requests.get(f"{gw.url}/health", timeout=10).json()["status"])
        if after is None and until():
            after = time.monotonic() + 0.5
        time.sleep(0.02)
    return states, statuses


def test_an_append_after_an_idle_stream_is_no_stall_and_a_real_stall_still_is(quick_stalls,
                                                                             caplog):
    gw, base = quick_stalls, quick_stalls.url
    r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
        "name": STREAM, "source": {"kind": "ingest"}, "schema": [{"name": "v",
                                                                  "type": "double"}]})
    assert r.status_code == 201, r.text
    r = requests.post(f"{base}/policies", headers=auth("nea", **XML), data=POLICY, timeout=30)
    assert r.status_code == 201, r.text
    r = requests.post(f"{base}/requests", headers=auth("lta", **XML), data=REQUEST, timeout=60)
    assert r.status_code == 201, r.text
    reader = Reader(r.json()["handle"]).start()
    with caplog.at_level(logging.WARNING, logger="pep.runtime.runtime"):
        append(base, 1.0)
        states, statuses = watch(gw, lambda: len(reader.rows) >= 1, 90)
        assert len(reader.rows) == 1, reader.lines

        for n in (2, 3):  # idle for longer than the stall bound, then one append
            time.sleep(STALL * 1.5)
            assert gw.runtime.health()[STREAM]["state"] == "idle"
            append(base, float(n))
            seen = watch(gw, lambda n=n: len(reader.rows) >= n, 60)
            states |= seen[0]
            statuses |= seen[1]
            assert [row["v"] for row in reader.rows] == [float(v) for v in range(1, n + 1)]
        assert "stalled" not in reader.kinds(), reader.lines
        assert "stalled" not in states and statuses == {"ready"}, (states, statuses)
        assert not [r for r in caplog.records if "stalled" in r.getMessage()]

        # a real stall: a delivery that does not return holds the stream's next batch back
        release, blocked = threading.Event(), threading.Event()

        def stuck(batch) -> bool:
            blocked.set()
            release.wait(60)
            return True

        definition = gw.services.catalog.get(STREAM)
        gw.runtime.attach_handle("stuck", definition, ExecutionPlan(STREAM, None, ("v",)),
                                 stuck)
        try:
            append(base, 4.0)
            assert blocked.wait(60)
            append(base, 5.0)  # waits behind the batch whose delivery is stuck
            arrived = time.monotonic()
            states, statuses = watch(gw, lambda: "stalled" in reader.kinds(), 30)
            assert "stalled" in reader.kinds(), reader.lines
            assert time.monotonic() - arrived >= STALL  # not before the bound
            assert "stalled" in states and "degraded" in statuses
            warned = [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]
            assert len(warned) == 1 and f"stream {STREAM} is stalled" in warned[0]
        finally:
            release.set()
        watch(gw, lambda: "resumed" in reader.kinds() and len(reader.rows) == 5, 30)
        kinds = reader.kinds()
        assert "resumed" in kinds and kinds.index("resumed") > kinds.index("stalled"), kinds
        assert kinds.count("stalled") == 1
        assert [row["v"] for row in reader.rows] == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert requests.get(f"{base}/health", timeout=10).json()["status"] == "ready"
        gw.runtime.detach("stuck")
