"""The thread pool that runs the WSGI side (Flask routes) of the gateway's and the proxy's server.

A task goes to the most recently idle thread, so that threads beyond what the load needs stay
idle and leave after `idle_exit` seconds; a new thread starts at once when none is idle (up to
`max`), so a burst of slow requests (a policy write waiting for proxies, a stream request
starting its Spark query) never waits for a poll. `min` threads start with the pool and stay.
Only a route's own work runs here: request bodies are read and responses written by the event
loop (server/bridge.py), so a slow client holds no thread.
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class WorkerPool:
    """Threads that run tasks. A task goes to the most recently idle thread (so that threads
    beyond what the load needs stay idle and leave after `idle_exit` seconds), and a new thread
    starts at once when none is idle, up to `max`."""

    def __init__(self, min_threads: int, max_threads: int, idle_exit: float, name: str) -> None:
        self.min = max(1, min_threads)
        self.max = max(self.min, max_threads)
        self.idle_exit = idle_exit
        self.name = name
        self._lock = threading.Lock()
        self._tasks: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = \
            collections.deque()
        self._idle: list[threading.Event] = []  # a stack: the last to go idle is woken first
        self._threads: set[threading.Thread] = set()
        self._stopping = False
        self._ids = itertools.count(1)
        self.peak = 0

    @property
    def count(self) -> int:
        return len(self._threads)

    @property
    def idle(self) -> int:
        return len(self._idle)

    def start(self) -> None:
        with self._lock:
            for _ in range(self.min):
                self._spawn()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            if self._stopping:
                raise RuntimeError("the server is stopping")
            self._tasks.append((fn, args))
            if self._idle:
                self._idle.pop().set()
            elif len(self._threads) < self.max:
                self._spawn()

    def _spawn(self) -> None:
        t = threading.Thread(target=self._run, name=f"{self.name}-worker-{next(self._ids)}",
                             daemon=True)
        self._threads.add(t)
        self.peak = max(self.peak, len(self._threads))
        t.start()

    def _run(self) -> None:
        me = threading.current_thread()
        wake = threading.Event()
        lock, tasks = self._lock, self._tasks
        while True:
            task = None
            with lock:
                if tasks:
                    task = tasks.popleft()
                elif self._stopping:
                    self._threads.discard(me)
                    return
                else:
                    wake.clear()
                    self._idle.append(wake)
            if task is None:
                if not wake.wait(self.idle_exit):
                    with lock:
                        if wake in self._idle and len(self._threads) > self.min:
                            self._idle.remove(wake)  # not chosen meanwhile: leave
                            self._threads.discard(me)
                            return
                        if wake in self._idle:
                            self._idle.remove(wake)
                continue
            fn, args = task
            try:
                fn(*args)
            except Exception:  # a task's failure must not kill its thread
                log.exception("server task failed")
            del fn, args, task

    def stop(self, timeout: float) -> None:
        with self._lock:
            self._stopping = True
            for wake in self._idle:
                wake.set()
            self._idle.clear()
            threads = list(self._threads)
        deadline = time.monotonic() + timeout
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))


__all__ = ["WorkerPool"]
