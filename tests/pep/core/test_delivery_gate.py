"""Revocation before rows: deliveries wait while a pass decides handles (bounded)."""
import threading
import time

import pep.runtime.base.delivery as delivery
from pep.core.delivery_gate import DeliveryGate
from pep.core.rows import RowBatch
from pep.runtime.base.delivery import deliver_to


def test_a_delivery_waits_for_the_pass_and_goes_on_when_it_ends() -> None:
    gate = DeliveryGate(max_hold=5.0)
    waited: list[float] = []
    with gate.closed():
        assert not gate.is_open
        t = threading.Thread(target=lambda: (gate.wait_open(), waited.append(time.monotonic())))
        t.start()
        time.sleep(0.2)
        assert not waited  # still deciding: the delivery waits
        ended = time.monotonic()
    t.join(5)
    assert waited and waited[0] >= ended
    assert gate.is_open


def test_the_wait_is_bounded_and_the_passing_thread_never_waits_for_itself() -> None:
    gate = DeliveryGate(max_hold=0.2)
    with gate.closed():
        with gate.closed():  # nested passes of one thread
            assert gate.wait_open() is True  # its own pass: no wait
        started = time.monotonic()
        result: list[bool] = []
        t = threading.Thread(target=lambda: result.append(gate.wait_open()))
        t.start()
        t.join(5)
        assert result == [False]  # gave up after max_hold
        assert 0.15 <= time.monotonic() - started < 2.0
    assert gate.is_open


class Handle:
    def __init__(self, hid: str, got: list) -> None:
        self.id = hid
        self.active = True
        self.delivered_rows = 0
        self.lock = threading.RLock()
        self.deliver = lambda batch: got.append((hid, time.monotonic())) or True


def test_deliver_to_waits_before_each_handle_while_a_pass_runs(monkeypatch) -> None:
    gate = DeliveryGate(max_hold=5.0)
    monkeypatch.setattr(delivery, "DELIVERY_GATE", gate)
    got: list = []
    handles = [Handle(f"h{i}", got) for i in range(3)]
    counters = {"rows_delivered": 0}
    with gate.closed():
        t = threading.Thread(target=deliver_to, args=(handles, RowBatch(("{}",), 2), counters))
        t.start()
        time.sleep(0.2)
        assert got == []  # nothing delivered while the pass runs
        # the pass can still take a handle's lock (revocation closes under it): no deadlock
        with handles[1].lock:
            handles[1].active = False
        ended = time.monotonic()
    t.join(5)
    assert [h for h, _ in got] == ["h0", "h2"] and all(at >= ended for _, at in got)
    assert counters["rows_delivered"] == 2
