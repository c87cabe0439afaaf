"""One edge process: who it serves and whether it may serve at all.

An edge keeps nothing a restart would miss: a reader's handle, owner, state, topic and start are
read from the shared store (`DeliveryStore.reader_views`) every time a reader connects, and the
rows from the plan topics (through one consumer for all its readers, `pep.edge.feed`). The
readers that connect while a check is under way are checked together by the next one, one query
for all of them on one connection (`ReaderChecks`): a burst of thousands of readers (a proxy or
an edge restarted, an edge killed: its readers all move to the others at once) is a few queries,
and leaves the pool's other connections to the edge's looks below, so that a burst never makes
the edge believe it lost the store. A reader whose check does not come within `CHECK_WAIT`
seconds (or whose check failed) gets 503 with Retry-After, never rows: load is told as load, and
a handle that could not be checked is not served. What it holds in memory is which readers it
serves now, so that:

- a revocation on the control topic (`pep.delivery.control`) closes them at once, before the
  edge acknowledges it (rows not yet written are dropped, `pep.edge.reader`);
- every `WATCH_EVERY` seconds (0.5 s) the store is asked for the state of the handles it
  serves (a second path, should a control record be missed; kept at 0.5 s: it bounds how long
  a reader of a handle ended in the store can be served should the control topic fail to
  bring the revocation), and every second the edge's row in `delivery_edges` is renewed (the
  gateway waits for the acknowledgements of the edges seen within 5 s);
- when the store cannot be reached for `LOST_AFTER` seconds, it stops serving: every reader
  gets `shutdown` (it resumes on another edge), and new readers get 503 until it is back.
- when the control topic cannot be reached for `LOST_AFTER` seconds (the brokers are away:
  no row comes either), it stops serving too, but its readers stay connected: each is told
  `stalled` and given nothing more (`TopicReader.hold`) until the control topic is back and a
  look at the store begun after that found their handles live; then `resumed`, and the rows
  go on from where they were (nothing lost or repeated). New readers get 503 meanwhile.
  Deny when in doubt: an edge that cannot check a handle, or hear of its revocation, gives
  nothing of it.
- a stream whose query the gateway found stalled (or failed) and later running again: its
  readers are told `stalled` / `resumed` as the gateway's own are (`pep.handles.
  stall_notices`). The news comes on the control topic (`StreamNotice`) and is in the store
  (`stalled_streams`), read when the edge starts and every 2 s: an edge that starts during
  a stall tells its readers at once, and a control record missed is made up within 2 s.

A reader is registered before its handle is checked in the store, and a revocation that comes
between the check and the registration is remembered (`_revoked`), so no interleaving lets a
reader of a revoked handle through.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable

from pep.core.errors import Gone, NotFound, Unavailable
from pep.core.refs import possible_handle_id
from pep.delivery.control import CONTROL_LOST, ControlListener, Revocation, StreamNotice
from pep.delivery.settings import DeliverySettings
from pep.delivery.store import DeliveryStore, ReaderView
from pep.edge.feed import EdgeFeed
from pep.edge.reader import TopicReader

log = logging.getLogger(__name__)

WATCH_EVERY = 0.5  # seconds between the edge's looks at the store (its handles' states)
SEEN_EVERY = 2  # looks between two renewals of the edge's row (1 s; the gateway waits 5 s)
STALLS_EVERY = 4  # looks between two reads of the streams stalled now (2 s)
LOST_AFTER = CONTROL_LOST  # seconds without the store (or the control topic) before it stops
REVOKED_KEPT = 300.0  # seconds a revocation is remembered for readers being checked
CHECK_WAIT = 5.0  # seconds a connecting reader waits for its check before a 503 (retry)
CHECK_BATCH = 1000  # handles checked in one query at most


class _Check:
    """One connecting reader's wait for its handle's check."""

    __slots__ = ("done", "view", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.view: ReaderView | None = None
        self.error: BaseException | None = None


class ReaderChecks:
    """The checks of connecting readers, coalesced: one thread reads the views of every handle
    whose reader waits (`look`: `DeliveryStore.reader_views`, one query per thousand), so that
    the readers that come while a query runs are answered by the next one, and reader checks
    hold one pooled connection at a time however many readers connect at once (the module
    docstring). Nothing is cached: every check is a read begun after the reader came."""

    def __init__(self, look: Callable[[list[str]], dict[str, ReaderView]]) -> None:
        self._look = look
        self._cond = threading.Condition()
        self._waiting: dict[str, list[_Check]] = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="xsg-edge-checks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def check(self, handle_id: str, wait: float = CHECK_WAIT) -> ReaderView | None:
        """The handle's view from a store read begun after this call (None: no such handle);
        Unavailable (503, retry) when no read answered within `wait` seconds or it failed."""
        pending = _Check()
        with self._cond:
            if self._stopped:
                raise Unavailable("this edge is stopping; retry (another edge)", retry_after=1)
            self._waiting.setdefault(handle_id, []).append(pending)
            self._cond.notify()
        if not pending.done.wait(wait):
            with self._cond:
                left = self._waiting.get(handle_id)
                if left is not None and pending in left:
                    left.remove(pending)
                    if not left:
                        del self._waiting[handle_id]
            raise Unavailable(f"this edge could not check the handle within {wait:g} s (many "
                              "readers connecting at once); retry", retry_after=1)
        if pending.error is not None:
            raise Unavailable("this edge cannot reach the store: "
                              f"{type(pending.error).__name__}", retry_after=1)
        return pending.view

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                ids = list(self._waiting)[:CHECK_BATCH]
                batch = {h: self._waiting.pop(h) for h in ids}
            error: BaseException | None = None
            try:
                views = self._look(ids)
            except Exception as exc:  # noqa: BLE001 - the store away or busy: 503s, deny
                log.debug("reader checks: the store did not answer: %s", exc)
                views, error = {}, exc
            for handle_id, checks in batch.items():
                for pending in checks:
                    pending.view, pending.error = views.get(handle_id), error
                    pending.done.set()

    def stop(self) -> None:
        """Readers still waiting get 503 (retry on another edge)."""
        with self._cond:
            self._stopped = True
            left = [c for cs in self._waiting.values() for c in cs]
            self._waiting.clear()
            self._cond.notify_all()
        for pending in left:
            pending.error = RuntimeError("the edge is stopping")
            pending.done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


class EdgeNode:
    """An edge (the module docstring). `store` is the delivery store on the gateway's
    PostgreSQL database; `edge` this edge's id (unique among the edges); `url` where readers
    reach it."""

    def __init__(self, settings: DeliverySettings, store: DeliveryStore, edge: str,
                 url: str = "") -> None:
        self.settings = settings
        self.store = store
        self.edge = edge
        self.url = url
        self._lock = threading.Lock()
        self._readers: dict[str, set[TopicReader]] = {}
        self._revoked: dict[str, float] = {}  # handle id -> monotonic time it was revoked
        self._stalls: dict[str, StreamNotice] = {}  # the streams stalled now
        self._noticed: dict[str, float] = {}  # stream -> when the control topic last told
        self._store_ok = time.monotonic()
        self._looked_from = 0.0  # when the last look at the store that answered began
        self._back_at: float | None = None  # when store and control topic were first both back
        self._serving = False
        self._holding = False  # the control topic lost: readers held (`TopicReader.hold`)
        self._stop = threading.Event()
        self.control: ControlListener | None = None
        self.feed = EdgeFeed(settings)  # one consumer of plan topics for all the readers
        self.checks = ReaderChecks(store.reader_views)
        self._watch = threading.Thread(target=self._watch_loop, name="xsg-edge-watch",
                                       daemon=True)

    def start(self, url: str | None = None) -> None:
        """Join the edges (the store's row, the control topic) and serve."""
        if url is not None:
            self.url = url
        self.store.register_edge(self.edge, self.settings.principal, self.url,
                                 socket.gethostname(), os.getpid())
        self.control = ControlListener(self.settings, self.edge, self.revoked,
                                       self.stream_notice)
        self._look_at_stalls(time.monotonic(), self.store.stalled_streams())
        self._store_ok = time.monotonic()
        self.checks.start()
        self._serving = True
        self._watch.start()
        log.info("edge %s serves plan topics (%s)", self.edge, self.settings.brokers)

    @property
    def serving(self) -> bool:
        return self._serving

    # -- readers --------------------------------------------------------------------------------

    def open(self, handle_id: str, subject: str, after: int | None) -> TopicReader:
        """A reader of `subject`'s handle from the event after `after`: NotFound for a handle
        that is not theirs (or does not exist, or was of a deleted stream), Gone for one that
        ended, Unavailable when this edge cannot check it now."""
        if not self._serving:
            raise Unavailable("this edge cannot check handles now; retry (another edge)",
                              retry_after=1)
        if not possible_handle_id(handle_id):  # no handle has such an id: never a query
            raise NotFound("no such handle")
        view = self.checks.check(handle_id)  # Unavailable when it cannot be checked: deny
        if view is None or view.buried or view.subject != subject:
            raise NotFound("no such handle")
        if not view.live:
            raise Gone(f"handle is {view.state}", state=view.state, reason=view.reason)
        if view.topic is None:
            raise NotFound("this handle is not delivered through a plan topic; read it from "
                           "the gateway")
        reader = TopicReader(self.settings, handle_id, view.topic, view.start_offset, after,
                             stream=view.stream)
        with self._lock:
            if handle_id in self._revoked:  # revoked since the store said live
                raise Gone("handle is revoked", state="revoked", reason=None)
            if not self._serving:  # stopped serving since the first check
                raise Unavailable("this edge cannot check handles now; retry (another edge)",
                                  retry_after=1)
            self._readers.setdefault(handle_id, set()).add(reader)
            stall = self._stalls.get(view.stream)
            if stall is not None:  # stalled before the reader came: told first
                reader.notice(*stall.event())
        reader.start(self.feed)
        return reader

    def closed(self, reader: TopicReader) -> None:
        """The reader's connection ended."""
        reader.close("shutdown", "the reader left")
        with self._lock:
            readers = self._readers.get(reader.handle_id)
            if readers is not None:
                readers.discard(reader)
                if not readers:
                    del self._readers[reader.handle_id]

    def reader_count(self) -> int:
        with self._lock:
            return sum(len(r) for r in self._readers.values())

    # -- endings --------------------------------------------------------------------------------

    def revoked(self, revocation: Revocation) -> None:
        """The control topic's revocation: these handles' readers end now (before the edge
        acknowledges)."""
        now = time.monotonic()
        with self._lock:
            for handle_id in revocation.handles:
                self._revoked[handle_id] = now
            readers = [r for h in revocation.handles for r in self._readers.pop(h, ())]
            if len(self._revoked) > 10_000:
                self._revoked = {h: t for h, t in self._revoked.items()
                                 if now - t < REVOKED_KEPT}
        for reader in readers:
            reader.close(revocation.state, revocation.reason)

    # -- stream notices -------------------------------------------------------------------------

    def stream_notice(self, notice: StreamNotice) -> None:
        """The control topic's news of a stream's query: its readers told (the module
        docstring)."""
        with self._lock:
            self._noticed[notice.stream] = time.monotonic()
            self._tell(notice)

    def _look_at_stalls(self, began: float, stalls: dict[str, tuple[str, str | None]]) -> None:
        """The store's streams stalled now, from a look begun at `began`: what differs from
        what the edge knows is told (a stream the control topic told of since the look began
        is left as it said: the store's answer may be older)."""
        with self._lock:
            for stream in set(stalls) | set(self._stalls):
                if self._noticed.get(stream, -1.0) >= began:
                    continue
                if stream in stalls:
                    state, at = stalls[stream]
                    known = self._stalls.get(stream)
                    if known is None or known.state != state:
                        self._tell(StreamNotice(stream, True, state, at))
                elif stream in self._stalls:
                    self._tell(StreamNotice(stream, False, None))

    def _tell(self, notice: StreamNotice) -> None:
        """Under the lock: remember the stream's verdict and tell its readers."""
        if notice.stalled:
            self._stalls[notice.stream] = notice
        elif self._stalls.pop(notice.stream, None) is None:
            return
        kind, fields = notice.event()
        for readers in self._readers.values():
            for reader in readers:
                if reader.stream == notice.stream:
                    reader.notice(kind, fields)

    def _end_readers(self, pick: Callable[[str], tuple[str, str | None] | None]) -> int:
        """Close the readers of the handles `pick` gives a (state, reason) for."""
        with self._lock:
            ending = [(h, pick(h)) for h in list(self._readers)]
            closing = [(r, end) for h, end in ending if end is not None
                       for r in self._readers.pop(h, ())]
        for reader, (state, reason) in closing:
            reader.close(state, reason)
        return len(closing)

    def _watch_loop(self) -> None:
        looks = 0
        while not self._stop.wait(WATCH_EVERY):
            began = time.monotonic()
            looks += 1
            stalls = None
            try:
                # the handles served: at every look (the second path of a revocation). The
                # edge's row: every `SEEN_EVERY` looks, well within the gateway's `EDGE_ALIVE`;
                # the streams stalled: every `STALLS_EVERY` (the control topic tells at once;
                # this is for an edge that missed it). Fewer round trips to the store per edge
                # (each one a connection check and a query): an edge's fixed cost per second
                asked = looks % SEEN_EVERY == 0
                if asked and not self.store.seen(self.edge):
                    self.store.register_edge(self.edge, self.settings.principal, self.url,
                                             socket.gethostname(), os.getpid())
                with self._lock:
                    served = list(self._readers)
                states = self.store.states(served) if served else {}
                if looks % STALLS_EVERY == 0:
                    stalls = self.store.stalled_streams()
                if asked or served:  # the store answered (a look that asked nothing: no news)
                    self._store_ok = time.monotonic()
                    self._looked_from = began
            except Exception as exc:  # noqa: BLE001 - counted below: deny after the bound
                log.debug("edge %s: the store did not answer: %s", self.edge, exc)
                states = None
            if states is not None:
                self._end_readers(_not_live(states, served))
                if stalls is not None:
                    self._look_at_stalls(began, stalls)
            self._check_health()

    def _check_health(self) -> None:
        now = time.monotonic()
        store_ok = now - self._store_ok < LOST_AFTER
        control_ok = self.control is not None and self.control.healthy
        if not (store_ok and control_ok):
            self._back_at = None
        if not store_ok:
            if self._serving or self._holding:
                self._serving = self._holding = False
                log.warning("edge %s lost the store: it stops serving until it is back",
                            self.edge)
                self._end_readers(lambda h: ("shutdown", "the edge lost the store; reconnect"))
        elif not control_ok:
            if self._serving:
                self._serving, self._holding = False, True
                log.warning("edge %s lost the control topic (the brokers): its readers are "
                            "told `stalled` and given nothing until it is back", self.edge)
                self._each_reader(lambda r: r.hold(
                    "the edge cannot reach the brokers; the rows resume when they are back"))
        elif not self._serving and not self._stop.is_set():
            if self._back_at is None:
                self._back_at = now
            if self._looked_from <= self._back_at:
                return  # a revocation published meanwhile is in the store: look first
            if self._holding:
                self._holding = False
                self._each_reader(lambda r: r.release())
            self._serving = True
            log.info("edge %s serves again", self.edge)

    def _each_reader(self, do: Callable[[TopicReader], None]) -> None:
        with self._lock:
            readers = [r for rs in self._readers.values() for r in rs]
        for reader in readers:
            do(reader)

    def stop(self) -> None:
        """Readers get `shutdown` (they resume on another edge); the edge leaves."""
        self._stop.set()
        self._serving = False
        self.checks.stop()
        self._end_readers(lambda h: ("shutdown", "the edge is stopping; reconnect"))
        if self._watch.is_alive():
            self._watch.join(timeout=5)
        if self.control is not None:
            self.control.close()
        self.feed.close()
        try:
            self.store.leave(self.edge)
        except Exception:  # noqa: BLE001 - its row ages out
            log.debug("edge %s could not leave the store", self.edge)


def _not_live(states: dict[str, tuple[str, str | None]], asked: Iterable[str]
              ) -> Callable[[str], tuple[str, str | None] | None]:
    """The readers to end after a look at the store: the state and reason of each handle asked
    about that is no longer live (one the store does not know: ended). A handle whose first
    reader came after the look was not asked about and stays (`open` checked it): ending it as
    unknown cut live handles' readers off with `ended` (issue 45)."""
    looked = set(asked)

    def pick(h: str) -> tuple[str, str | None] | None:
        if h not in looked or states.get(h, ("gone", None))[0] == "live":
            return None
        return states[h] if h in states else ("ended", None)
    return pick


__all__ = ["CHECK_WAIT", "EdgeNode", "LOST_AFTER", "ReaderChecks", "SEEN_EVERY", "STALLS_EVERY",
           "WATCH_EVERY"]
