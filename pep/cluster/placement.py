"""Which streams this process serves: its leases, kept, renewed, given up and taken over.

`claim(streams)` is what every stream-side request passes first (opening a handle, reading or
releasing one, appending records, changing or deleting a stream, defining an event): it returns
when this process holds the leases of the streams and of every stream a live join ties to them
(taking those no live process holds, and then resuming their handles here: `take_over`), and
raises `Elsewhere` naming the process that holds them, or `SplitStreams` when two processes
hold a join's streams.

Renewal (`tick`, every `seconds / 5` on a thread of its own) renews every lease in one
transaction. Its safety rule: this process trusts its leases only until `LET_GO_AT` of the
lease after the start of its last successful renewal (its own monotonic clock; the database
dates the renewal later than that start, so the lease outlives this deadline by at least
`(1 - LET_GO_AT)` of its length). When the deadline passes without a renewal (the store cannot
be reached, the process stalled) or a renewal does not return a lease (it expired and may be
another's), the streams are let go (`let_go`: their readers get `shutdown` and their queries
stop) before the lease can expire: no two processes deliver one stream. The same thread looks
for orphans (streams with live handles or events and no valid lease: their process died) and
takes at most its share of them per look, so that the survivors split a dead process's streams.

Failover bound: a dead process's streams are taken at most `seconds` after its last renewal
plus one look (`seconds / 5`), and their handles resumed then (their queries restart from their
checkpoints). With the default 5 s lease: 6 s, plus the queries' start.
"""
from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable

from common.db import StoreUnavailable
from common.errors import described
from pep.cluster.store import ClusterStore
from pep.core.errors import Conflict

log = logging.getLogger(__name__)

LET_GO_AT = 0.7  # of the lease's length after the last renewal began: streams are let go
RENEWALS_PER_LEASE = 5  # renewals (and looks for orphans) per lease length
WATCH_EVERY = 0.1  # seconds between two looks at the deadline


class Elsewhere(Exception):
    """The streams are served by another process: the request goes there (not a refusal:
    `pep.cluster.forward` sends it on; a 421 when nothing in front of the app does)."""

    def __init__(self, member: str, streams: Iterable[str]) -> None:
        self.member = member
        self.streams = tuple(sorted(streams))
        super().__init__(f"stream(s) {', '.join(self.streams)} are served by gateway process "
                         f"{member}")


class SplitStreams(Conflict):
    """A join's streams are served by two different processes (409)."""


class Placement:
    """This process's leases (the module docstring). `take_over(streams)` resumes what this
    process just took; `let_go(streams, reason)` stops serving what it can no longer trust;
    both run outside the placement's locks."""

    def __init__(self, store: ClusterStore, seconds: float,
                 take_over: Callable[[list[str]], None],
                 let_go: Callable[[list[str], str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.seconds = float(seconds)
        self._take_over = take_over
        self._let_go = let_go
        self._clock = clock
        self.held: dict[str, int] = {}  # stream -> epoch of our lease
        self.deadline = 0.0  # our monotonic clock: the held leases are trusted until then
        self._lock = threading.Lock()  # held, deadline
        self._claiming = threading.Lock()  # one claim in the database at a time
        self._taking = threading.Lock()  # take-overs and let-gos one at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        self.taken_over = 0  # streams taken over from a process that died (observable)
        self.let_go_count = 0

    # -- the request path ---------------------------------------------------------------------

    def holds(self, streams: Iterable[str]) -> bool:
        """Whether this process holds every one of `streams` and may still trust it."""
        with self._lock:
            return self._clock() < self.deadline and all(s in self.held for s in streams)

    def claim(self, streams: Iterable[str], wait: bool = True) -> None:
        """Return once this process holds `streams` (the module docstring); raises Elsewhere,
        SplitStreams, or StoreUnavailable (the store cannot say who holds them). What it takes
        is taken over before it returns, or with `wait` False on a thread of its own (the
        renewals' thread must not wait for handles to resume)."""
        wanted = set(streams)
        if not wanted or self.holds(wanted):
            return
        with self._claiming:
            if self.holds(wanted):
                return
            group = self.store.joined_with(wanted)
            started = self._clock()
            outcome = self.store.claim(group, self.seconds)
            if outcome.holders:
                owners = set(outcome.holders.values())
                mine = sorted(s for s in group if s not in outcome.holders)
                if len(owners) > 1 or (mine and self.holds(mine)):
                    raise SplitStreams(
                        "a join's streams must be served by one gateway process, and "
                        + "; ".join(f"{s} is served by process {m}"
                                    for s, m in sorted(outcome.holders.items()))
                        + (f"; {', '.join(mine)} by this one" if mine else "")
                        + ": ask again once one of them has no live handle, or through the "
                          "process named")
                raise Elsewhere(owners.pop(), outcome.holders)
            with self._lock:
                fresh = started + LET_GO_AT * self.seconds
                self.deadline = fresh if not self.held else min(self.deadline, fresh)
                self.held.update(outcome.renewed)
                self.held.update(outcome.acquired)
        if outcome.acquired and wait:
            self._taken(sorted(outcome.acquired))
        elif outcome.acquired:
            threading.Thread(target=self._taken, args=(sorted(outcome.acquired),),
                             name="xsg-cluster-take-over", daemon=True).start()

    def _taken(self, streams: list[str]) -> None:
        """Resume what was taken (one take-over at a time). A take-over does not hold up a
        let-go: each handle is resumed only while its streams are held (`HandleService`
        checks `holds` as it registers the handle's buffer, under the lock a let-go closes
        buffers under)."""
        log.info("cluster: this process now serves stream(s) %s", ", ".join(streams))
        with self._taking:
            try:
                self._take_over(streams)
            except Exception as exc:  # noqa: BLE001 - the handles that could not resume say so
                log.error("cluster: taking over %s failed: %s", ", ".join(streams),
                          described(exc))

    # -- the thread -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="xsg-cluster-leases",
                                            daemon=True)
            self._thread.start()
            self._watcher = threading.Thread(target=self._watch, name="xsg-cluster-deadline",
                                             daemon=True)
            self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in (self._thread, self._watcher):
            if thread is not None:
                thread.join(timeout=10)
        self._thread = self._watcher = None

    def _watch(self) -> None:
        """The deadline, looked at on a thread of its own: a renewal stuck waiting for the
        store must not keep this process serving past it."""
        while not self._stop.wait(WATCH_EVERY):
            with self._lock:
                lost = sorted(self.held) if self.held and self._clock() >= self.deadline \
                    else []
                if lost:
                    self.held.clear()
            if lost:
                self._lose(lost, "its leases could not be renewed in time (the store cannot "
                                 "be reached, or this process stalled)")

    def _run(self) -> None:
        every = self.seconds / RENEWALS_PER_LEASE
        while not self._stop.wait(every * (0.9 + 0.2 * random.random())):
            try:
                self.tick()
            except Exception:  # the thread must survive one bad look
                log.exception("cluster: lease upkeep failed")

    def tick(self) -> None:
        """Renew, let go of what cannot be trusted, take a share of the orphans."""
        lost: list[str] = []
        with self._claiming:  # a claim's leases are in `held` once it is in the database
            started = self._clock()
            try:
                renewed = self.store.renew(self.seconds)
            except StoreUnavailable:
                renewed = None
            with self._lock:
                if renewed is not None:
                    lost = [s for s in self.held if s not in renewed]
                    for s in lost:
                        del self.held[s]
                    self.held.update({s: e for s, e in renewed.items() if s in self.held})
                    self.deadline = started + LET_GO_AT * self.seconds
                stray = sorted(s for s in renewed or () if s not in self.held)
            if stray:
                # renewed in the store, but let go here meanwhile (the renewal came too late):
                # given up, for whichever process looks first (this one included)
                try:
                    self.store.release(stray)
                except StoreUnavailable:
                    pass
        if lost:  # (on a thread of its own: the renewals go on meanwhile)
            threading.Thread(target=self._lose, args=(sorted(lost), "its lease on the store "
                                                      "expired before it was renewed"),
                             name="xsg-cluster-let-go", daemon=True).start()
        if renewed is not None:
            self._adopt_orphans()

    def _lose(self, streams: list[str], why: str) -> None:
        """Let go of streams no longer in `held` (so nothing resumes on them any more), at
        once: never behind a take-over."""
        log.warning("cluster: this process stops serving stream(s) %s: %s; another process "
                    "takes them over", ", ".join(streams), why)
        self.let_go_count += len(streams)
        try:
            self._let_go(streams, f"this stream moved to another gateway process ({why}); "
                                  "reconnect with Last-Event-ID")
        except Exception:
            log.exception("cluster: letting go of %s failed", ", ".join(streams))

    def _adopt_orphans(self) -> None:
        """Take this process's share of the streams no live process serves."""
        orphans = self.store.orphans()
        if not orphans:
            return
        alive = max(1, len(self.store.members(seen_within=self.seconds)))
        share = math.ceil(len(orphans) / alive)
        random.shuffle(orphans)
        taken = 0
        for stream in orphans:
            if taken >= share or self._stop.is_set():
                break
            try:
                before = len(self.held)
                self.claim([stream], wait=False)
                taken += max(1, len(self.held) - before)
                self.taken_over += 1
            except (Elsewhere, SplitStreams):
                continue  # another process was quicker
            except StoreUnavailable:
                return

    def release_all(self) -> None:
        """A clean stop: nothing of ours is trusted any more, and the leases end now."""
        with self._lock:
            self.held.clear()
            self.deadline = 0.0
        try:
            self.store.leave()
        except StoreUnavailable:
            log.warning("cluster: could not give up the leases at stop (the store cannot be "
                        "reached); they expire within %g s", self.seconds)


__all__ = ["Elsewhere", "LET_GO_AT", "Placement", "SplitStreams"]
