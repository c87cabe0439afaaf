"""The driver's share of a micro-batch (routing its Arrow results into handles), one batch behind
the query, on a thread of its own.

A shared query's cycle was: Spark's own steps between two batches (list the source, write the
offset and source logs, plan the batch, call foreachBatch, ~0.2 s here), the batch's jobs (~0.15-
0.2 s), then routing their results into a thousand handles' buffers (~0.15 s of Python), and
only then the commit and the next batch. Routing needs nothing from Spark once the jobs' results
are Arrow tables on the driver, so the batch hands them to this worker and returns: Spark
commits and prepares the next batch while the worker delivers this one (measured: the next
batch's results are ready ~0.3 s after a batch returns, routing fits in that time).

What stays exact:
- order: one worker per query, one batch at a time, in batch order; a batch waits for the one
  before it to be routed before it hands over its own (at most one batch in flight), so rows
  reach every handle in stream order and memory holds at most two batches' results;
- state that routing changes and the next batch's jobs read (a tuple window's pane offset in the
  plan table, a time window's watermark) is read only after the worker is idle: the executor
  waits for it (`drain`) before building a batch whose plans have windows;
- revocation: delivery checks each handle under its lock, wherever it runs (`base/delivery.py`);
- stop: stopping waits for the batch in flight to be routed before the last delivered batch is
  written down for a resumed query (`query/lifecycle.py`);
- errors: a routing failure is recorded at once and raised by the batch that comes next (it
  fails the query, as a failure in the batch did).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from common.errors import described

log = logging.getLogger(__name__)

DRAIN_WAIT = 120.0  # the longest a batch or a stop waits for the batch in flight (seconds)


class RoutingFailed(RuntimeError):
    """The previous micro-batch's routing failed; raised by the batch after it."""


class RouteWorker:
    """One thread that runs handed-over routing jobs in order, at most one at a time."""

    def __init__(self, name: str, on_error: Callable[[BaseException], None]) -> None:
        self._name = name
        self._on_error = on_error
        self._cond = threading.Condition()
        self._job: Callable[[], None] | None = None
        self._busy = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def in_worker(self) -> bool:
        thread = self._thread
        return thread is not None and thread.ident == threading.get_ident()

    def submit(self, job: Callable[[], None]) -> None:
        """Hand `job` over once the one before it is done; raises `RoutingFailed` if that one
        failed (the job is then not run)."""
        self.drain()
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._closed = False
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._job = job
            self._busy = True
            self._cond.notify_all()

    def drain(self, timeout: float = DRAIN_WAIT) -> None:
        """Wait until no job is in flight; raise `RoutingFailed` if the last one failed (once).
        Called from the worker itself (a stop started by a delivery), it returns at once."""
        if self.in_worker():
            return
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RoutingFailed(f"{self._name}: the micro-batch in flight was not "
                                        f"routed within {timeout:.0f} s")
                self._cond.wait(left)
            error, self._error = self._error, None
        if error is not None:
            # its kinds only: this message is logged and reported (common/errors.py)
            raise RoutingFailed(f"routing the previous micro-batch failed: "
                                f"{described(error)}") from error

    def idle(self) -> bool:
        with self._cond:
            return not self._busy

    def close(self) -> None:
        """End the thread once the job in flight is done (a later `submit` starts a new one)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._closed:
                    self._cond.wait()
                job, self._job = self._job, None
                if job is None:  # closed and nothing handed over
                    if self._thread is not None and self._thread.ident == threading.get_ident():
                        self._thread = None
                    return
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - kept for the next batch to raise
                log.error("%s: routing a micro-batch failed: %s", self._name, described(exc))
                try:
                    self._on_error(exc)
                except Exception:  # noqa: BLE001 - the worker must go on; the failure is logged
                    pass
                with self._cond:
                    self._error = exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


__all__ = ["RouteWorker", "RoutingFailed", "DRAIN_WAIT"]
