"""A gateway restart while the client reads (HTTPS, the client trusting the gateway's CA file):
the reader resumes with no row lost beyond what the gateway reports as a gap, and none twice;
a reader that asked not to resume ends with the gateway's `shutdown` and its reason."""
from __future__ import annotations

import pytest

from tests.client.conftest import ServeProcess, wait_for
from tests.client.test_client import SENSOR, collect, sensor
from tests.pep.conftest import TOKENS
from tests.server.test_http_server import self_signed
from xsg_client import Client, Disconnected, End, Gap, Reconnected, Row, XsgError

GENERATION_SPAN = 2 ** 40  # event ids after the n-th restart start at n * 2**40


@pytest.mark.timeout(600)
def test_a_gateway_restart_is_resumed_with_no_row_lost_or_read_twice(tmp_path):
    cert, key = self_signed(tmp_path)
    gateway = ServeProcess(tmp_path, tls=(cert, key)).start()
    try:
        gateway.stream("r_sensor", SENSOR, {"attributes": ["ts", "n"]})
        with Client(gateway.url, TOKENS["lta"]) as untrusting:
            with pytest.raises(XsgError, match="CERTIFICATE_VERIFY_FAILED"):
                untrusting.handles()
        with Client(gateway.url, TOKENS["lta"], ca_file=cert) as xsg:
            grant = xsg.request("r_sensor")
            resuming: list = []
            reading = collect(xsg.open(grant), 10, resuming)
            stopping_reader = xsg.open(grant, resume_after_shutdown=False)
            stopping: list = []
            stopped = collect(stopping_reader, 10 ** 6, stopping)
            gateway.append("r_sensor", sensor(range(5)))
            for events in (resuming, stopping):
                wait_for(lambda events=events: sum(isinstance(e, Row) for e in events) == 5,
                         what="5 rows")
            gateway.stop()  # SIGTERM: readers get `shutdown`; live handles resume at the start
            stopped.join(30)
            assert not stopped.is_alive()
            wait_for(lambda: any(isinstance(e, Disconnected) for e in resuming),
                     what="the resuming reader's Disconnected")
            gateway.start()
            wait_for(lambda: any(isinstance(e, Reconnected) for e in resuming), timeout=120,
                     what="the resuming reader's Reconnected")
            gateway.append("r_sensor", sensor(range(5, 10)))
            reading.join(120)
            assert not reading.is_alive(), gateway.stderr()
    finally:
        gateway.stop()

    rows = [e for e in resuming if isinstance(e, Row)]
    assert [r.values["n"] for r in rows] == list(range(10))  # none lost, none twice
    disconnected = [e for e in resuming if isinstance(e, Disconnected)]
    assert disconnected[0].cause.startswith("shutdown: ")
    assert disconnected[0].last_event_id == rows[4].id + 1  # after the `shutdown` event
    gaps = [e for e in resuming if isinstance(e, Gap)]
    # what the gateway reports: the rows it held in memory died with it (their count unknown)
    assert len(gaps) == 1 and gaps[0].lost is None
    back = resuming.index(next(e for e in resuming if isinstance(e, Reconnected)))
    assert back < resuming.index(gaps[0]) < resuming.index(rows[5])
    assert all(r.id > GENERATION_SPAN for r in rows[5:]) and all(r.id <= 5 for r in rows[:5])

    end = stopping[-1]
    assert isinstance(end, End) and end.kind == "shutdown" and end.reason
    assert not any(isinstance(e, Disconnected) for e in stopping)
    assert [e.values["n"] for e in stopping if isinstance(e, Row)] == list(range(5))
