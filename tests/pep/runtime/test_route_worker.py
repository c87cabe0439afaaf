"""The route worker: a micro-batch's delivery one batch behind the query (no Spark)."""
import threading
import time

import pytest

from pep.runtime.query.route_worker import RouteWorker, RoutingFailed


def worker(errors: list | None = None) -> RouteWorker:
    return RouteWorker("test-route", (errors if errors is not None else []).append)


def test_jobs_run_in_order_one_at_a_time() -> None:
    w = worker()
    done: list[int] = []
    running = []

    def job(i: int) -> None:
        running.append(i)
        assert len(running) == 1  # never two at once
        time.sleep(0.01)
        done.append(i)
        running.remove(i)
    for i in range(20):
        w.submit(lambda i=i: job(i))
    w.drain(5)
    assert done == list(range(20))
    w.close()


def test_submit_returns_while_the_job_runs_and_waits_for_it_next_time() -> None:
    w = worker()
    release = threading.Event()
    started = threading.Event()
    w.submit(lambda: (started.set(), release.wait(5)))
    assert started.wait(5)
    assert not w.idle()  # handed over: the caller went on while it runs
    second: list[float] = []
    t = threading.Thread(target=lambda: w.submit(lambda: second.append(time.monotonic())))
    t.start()
    time.sleep(0.1)
    assert not second  # the next batch waits for the one in flight
    opened = time.monotonic()
    release.set()
    t.join(5)
    w.drain(5)
    assert second and second[0] >= opened
    w.close()


def test_a_failure_is_raised_by_the_next_batch_once() -> None:
    errors: list = []
    w = worker(errors)
    w.submit(lambda: 1 / 0)
    with pytest.raises(RoutingFailed, match="ZeroDivisionError"):
        w.submit(lambda: None)
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)
    w.submit(lambda: None)  # reported once; the worker goes on
    w.drain(5)
    w.close()


def test_drain_from_the_worker_itself_does_not_wait_for_itself() -> None:
    w = worker()
    inside: list[bool] = []

    def job() -> None:
        inside.append(w.in_worker())
        w.drain(0.5)  # e.g. a delivery that ends a handle, whose query stops
    w.submit(job)
    w.drain(5)
    assert inside == [True] and not w.in_worker()
    w.close()


def test_a_job_that_does_not_end_is_reported_not_waited_for_ever() -> None:
    w = worker()
    release = threading.Event()
    w.submit(lambda: release.wait(5))
    with pytest.raises(RoutingFailed, match="not routed within"):
        w.drain(0.2)
    release.set()
    w.drain(5)
    w.close()


def test_closed_worker_starts_again_on_the_next_batch() -> None:
    w = worker()
    w.submit(lambda: None)
    w.drain(5)
    w.close()
    deadline = time.monotonic() + 5
    while w._thread is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w._thread is None  # the thread ended
    got: list[int] = []
    w.submit(lambda: got.append(1))
    w.drain(5)
    assert got == [1]
    w.close()
