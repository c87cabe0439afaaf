"""Changes announced between the gateway's processes: PostgreSQL LISTEN/NOTIFY.

A process that commits a change (a policy written, the catalogue changed) announces it once on
the `xsg_changes` channel: {"kind", "origin", "seq", ...}. Every other process receives it on a
connection of its own that only listens, applies it (`apply`: policies in store-version order,
the catalogue read again, its own live handles decided again), and acknowledges on `xsg_acks`.
The writer waits (`wait`) until every process seen alive acknowledged, at most `timeout`
seconds, so that when a change answers, the handles it revokes are revoked on every process
that answered in time (one that did not is named in the log; it cannot hear changes, so it
cannot renew its leases either, and stops serving within its lease: `pep.cluster.placement`).

An announcement carries nothing a process needs besides "look": what changed is read from the
store, by version (`catch_up`). So a process whose listening connection was lost misses nothing:
it catches up as soon as it listens again, and every `poll` seconds regardless (the one gap
NOTIFY leaves: a process that died between its commit and its announcement).

Received announcements are applied on a worker thread, one at a time and in the order they
came; the listening thread only reads (acknowledgements for this process's own waits never wait
behind another process's change being applied).
"""
from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from common.db import Database, StoreUnavailable

log = logging.getLogger(__name__)

CHANGES = "xsg_changes"
ACKS = "xsg_acks"
POLL = 2.0  # seconds between two catch-ups when nothing is announced
RECONNECT = (0.2, 5.0)  # the listening connection is tried again after this long, doubling


class Announcements:
    """One process's end of the channels (the module docstring). `apply(announcement)` applies
    another process's change; `catch_up()` applies whatever the store holds that this process
    has not applied; `others()` names the other live processes (whose acknowledgements a
    writer waits for); `connect()` opens a connection of its own (LISTEN)."""

    def __init__(self, connect: Callable[[], Any], db: Database, member: str,
                 apply: Callable[[dict[str, Any]], None], catch_up: Callable[[], None],
                 others: Callable[[], list[str]], poll: float = POLL) -> None:
        self._connect = connect
        self._db = db
        self.member = member
        self._apply = apply
        self._catch_up = catch_up
        self._others = others
        self.poll = poll
        self._seq = itertools.count(1)
        self._acks: dict[int, set[str]] = {}  # our announcements being waited for -> ackers
        self._acked = threading.Condition()
        self._work: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conn: Any = None
        self.listening = threading.Event()  # set while the listening connection is up
        self.applied = 0  # announcements applied (observable)

    # -- sending --------------------------------------------------------------------------------

    def announce(self, kind: str, **fields: Any) -> int:
        """Announce a committed change of `kind`; its number, to `wait` for. Raises
        StoreUnavailable when the store cannot be reached (the change is committed: the other
        processes catch up on their own)."""
        seq = next(self._seq)
        with self._acked:
            self._acks[seq] = set()
        payload = json.dumps({"kind": kind, "origin": self.member, "seq": seq, **fields},
                             separators=(",", ":"))
        try:
            self._db.execute("SELECT pg_notify(?, ?)", (CHANGES, payload))
        except BaseException:
            with self._acked:
                self._acks.pop(seq, None)
            raise
        return seq

    def wait(self, seq: int, timeout: float) -> list[str]:
        """Wait until every other live process acknowledged announcement `seq`, at most
        `timeout` seconds; the processes that did not."""
        try:
            expected = set(self._others())
        except StoreUnavailable:
            expected = set()
        deadline = time.monotonic() + timeout
        with self._acked:
            try:
                while True:
                    missing = expected - self._acks.get(seq, set())
                    left = deadline - time.monotonic()
                    if not missing or left <= 0:
                        return sorted(missing)
                    self._acked.wait(min(left, 0.5))
            finally:
                self._acks.pop(seq, None)

    def announce_and_wait(self, kind: str, timeout: float, **fields: Any) -> list[str]:
        """`announce`, then `wait`; the processes that did not acknowledge in time (logged)."""
        try:
            seq = self.announce(kind, **fields)
        except StoreUnavailable:
            log.warning("cluster: a %s change could not be announced (the store cannot be "
                        "reached); the other processes catch up within %g s", kind, self.poll)
            return []
        return self.wait_logged(seq, kind, timeout)

    def wait_logged(self, seq: int, kind: str, timeout: float) -> list[str]:
        """`wait`, the processes that did not acknowledge in time named in the log."""
        missing = self.wait(seq, timeout)
        if missing:
            log.warning("cluster: gateway process(es) %s did not acknowledge a %s change within "
                        "%g s (they apply it when they catch up; a process that cannot reach "
                        "the store stops serving its streams within its lease)",
                        ", ".join(missing), kind, timeout)
        return missing

    # -- receiving ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._threads:
            return
        self._stop.clear()
        for target, name in ((self._listen, "xsg-cluster-listen"),
                             (self._worker, "xsg-cluster-apply")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._work.put(None)
        conn = self._conn
        if conn is not None:
            try:
                conn.cancel_safe() if hasattr(conn, "cancel_safe") else conn.cancel()
            except Exception:  # noqa: BLE001 - it is being closed anyway
                pass
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads = []

    def _listen(self) -> None:
        backoff = RECONNECT[0]
        while not self._stop.is_set():
            try:
                conn = self._connect()
            except Exception as exc:  # noqa: BLE001 - StoreUnavailable, or the driver's
                log.debug("cluster: cannot listen for announcements yet: %s", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, RECONNECT[1])
                continue
            self._conn = conn
            try:
                conn.execute(f"LISTEN {CHANGES}")
                conn.execute(f"LISTEN {ACKS}")
                if not self.listening.is_set() and backoff > RECONNECT[0]:
                    log.info("cluster: listening for announcements again; catching up")
                self.listening.set()
                backoff = RECONNECT[0]
                self._work.put({"kind": "catch-up"})  # whatever was missed meanwhile
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=self.poll):
                        self._received(note.channel, note.payload)
                    self._work.put({"kind": "catch-up"})
            except Exception as exc:  # noqa: BLE001 - the connection is gone: listen again
                if not self._stop.is_set():
                    log.warning("cluster: the connection listening for announcements was lost "
                                "(%s); listening again", str(exc).strip().splitlines()[0]
                                if str(exc).strip() else type(exc).__name__)
            finally:
                self.listening.clear()
                self._conn = None
                try:
                    conn.close()
                except Exception:  # noqa: BLE001 - the connection is broken already
                    pass
            self._stop.wait(backoff)

    def _received(self, channel: str, payload: str) -> None:
        try:
            message = json.loads(payload)
        except ValueError:
            log.warning("cluster: an announcement that is not JSON was ignored")
            return
        if not isinstance(message, dict):
            return
        if channel == ACKS:
            if message.get("origin") == self.member:
                with self._acked:
                    seq = message.get("seq")  # one of ours: the int `announce` sent
                    ackers = self._acks.get(seq) if seq is not None else None
                    if ackers is not None:
                        ackers.add(str(message.get("member")))
                        self._acked.notify_all()
            return
        if message.get("origin") != self.member:
            self._work.put(message)

    def _worker(self) -> None:
        while True:
            message = self._work.get()
            if message is None or self._stop.is_set():
                return
            try:
                if message.get("kind") == "catch-up":
                    self._catch_up()
                    continue
                self._apply(message)
                self.applied += 1
                self._db.execute("SELECT pg_notify(?, ?)", (ACKS, json.dumps(
                    {"origin": message.get("origin"), "seq": message.get("seq"),
                     "member": self.member}, separators=(",", ":"))))
            except StoreUnavailable as exc:  # (the store says once that it is down)
                log.debug("cluster: a %s waits for the store (%s); it is applied at the next "
                          "catch-up", message.get("kind"), exc)
            except Exception:  # the worker must survive one bad change
                log.exception("cluster: applying an announced %s change failed",
                              message.get("kind"))


__all__ = ["ACKS", "Announcements", "CHANGES", "POLL"]
