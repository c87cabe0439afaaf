"""The gateway side of cache invalidation: tells caching proxies which handle answers died.

A caching proxy (proxy/) answers a repeated stream request with the handle it already has. That is
only safe while the proxy learns, before a revocation call returns, that the handle is gone. The
hub gives proxies two channels:

* **Webhooks (synchronous).** Every registered proxy gets each event as a signed JSON POST.
  `publish` returns once every *fresh* proxy acknowledged it, or the short timeout ran out; a proxy
  that failed or timed out is marked *stale* and is no longer waited for (one dead proxy must not
  add a timeout to every revocation). Deliveries to one proxy go through one worker thread, so a
  proxy sees events in id order; the next acknowledged delivery makes a stale proxy fresh again.
  A proxy that missed an event notices the gap in the ids and flushes its cache.
* **A feed (asynchronous, resumable).** `GET /events/invalidations` is an SSE stream with event ids
  (`<epoch>.<n>`) that resumes after `Last-Event-ID` as long as the bounded log still holds the
  events; `?after=N` answers the same log as one JSON poll. Proxies follow it in the background;
  when they lose it they stop serving from cache until they are back (see proxy/README.md).

The events, their ids and signatures are the protocol (`common.invalidation`); the HTTP
routes are in `pep/http/invalidation.py`.

Ordering contract for the callers (the handle manager, the policy API): publish *after* the
handle's state is revoked or released, so that a request racing the revocation cannot get the dead
handle back from the gateway once the proxy has dropped it; and do not hold locks that the proxy's
own request path needs while publishing.
"""
from __future__ import annotations

import json
import logging
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import (
    Future,
    ThreadPoolExecutor,
    TimeoutError as FutureTimeout,
    wait as wait_futures,
)
from dataclasses import dataclass, field
from typing import TypedDict
from urllib.parse import urlsplit

import requests

from common.invalidation import (
    EVENT_ID_HEADER,
    KINDS,
    InvalidationEvent,
    format_event_id,
    parse_event_id,
    sign,
)
from pdp import PolicyChange, PolicyEvents
from pep.core.refs import handle_ref

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishResult:
    event: InvalidationEvent
    acknowledged: tuple[str, ...]
    failed: tuple[str, ...]  # waited for, but failed or timed out: now stale
    skipped: tuple[str, ...]  # stale already: delivered in the background, not waited for


class FeedHello(TypedDict):
    """The first event of a feed: where the log stands, and whether the reader's replay
    resumed it (False: the reader re-syncs)."""

    epoch: str
    last_id: int
    resumed: bool
    heartbeat: float


class ProxyState(TypedDict):
    """A registered proxy as the hub sees it (`GET /invalidation/proxies`, the stats)."""

    url: str
    state: str  # fresh or stale
    pending: int
    delivered: int
    failures: int
    last_error: str | None
    last_ok: float | None


class HubStats(TypedDict):
    """The hub's figures: its log, its feed readers and its proxies."""

    epoch: str
    last_id: int
    published: int
    log_size: int
    oldest_id: int | None
    feed_readers: int
    proxies: list[ProxyState]


@dataclass
class _Proxy:
    url: str
    executor: ThreadPoolExecutor
    stale: bool = False
    pending: int = 0
    delivered: int = 0
    failures: int = 0
    last_error: str | None = None
    last_ok: float | None = None
    registered: float = field(default_factory=time.time)

    def describe(self) -> ProxyState:
        return {"url": self.url, "state": "stale" if self.stale else "fresh",
                "pending": self.pending, "delivered": self.delivered, "failures": self.failures,
                "last_error": self.last_error, "last_ok": self.last_ok}


class _Subscription:
    """One SSE reader's queue; overflow ends the stream (the reader re-syncs on reconnect)."""

    def __init__(self, capacity: int) -> None:
        self.queue: queue.Queue[InvalidationEvent | None] = queue.Queue(capacity)
        self.closed = False
        self.overflowed = False
        self.waiter: Callable[[], None] | None = None  # told of every offer (FeedBody)

    def offer(self, event: InvalidationEvent | None) -> None:
        try:
            self.queue.put_nowait(event)
        except queue.Full:
            self.closed = self.overflowed = True
        waiter = self.waiter
        if waiter is not None:
            waiter()


class _FeedBody:
    """One reader's SSE text. Its subscription ends when the text ends or when the server closes
    the body, also before the first line: a generator closed before it started never runs its
    `finally`, and each such reader would keep its place (at `max_feed_readers`: a 503 for
    every new one)."""

    def __init__(self, lines: Generator[str, None, None], end: Callable[[], None]) -> None:
        self._lines = lines
        self._end = end

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._lines)

    def close(self) -> None:
        try:
            self._lines.close()
        finally:
            self._end()


class InvalidationHub:
    """Numbers invalidation events, keeps a bounded log, pushes them to proxies, feeds readers."""

    def __init__(self, *, secret: str | bytes | None = None, proxy_token: str | None = None,
                 webhooks: Iterable[str] = (), timeout: float = 1.0,
                 connect_timeout: float = 0.5, log_size: int = 1024, heartbeat: float = 2.0,
                 max_proxies: int = 64, max_pending: int = 256, max_feed_readers: int = 64,
                 session: requests.Session | None = None) -> None:
        if log_size < 1:
            raise ValueError("log_size must be at least 1")
        self.epoch = secrets.token_hex(8)
        self.secret = secret
        self.proxy_token = proxy_token
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.heartbeat = heartbeat
        self.max_proxies = max_proxies
        self.max_pending = max_pending
        self.max_feed_readers = max_feed_readers
        if session is None:
            session = requests.Session()
            session.trust_env = False  # proxy variables must not reroute invalidations
        self._session = session
        self._lock = threading.Lock()
        self._log: deque[InvalidationEvent] = deque(maxlen=log_size)
        self._last_id = 0
        self._proxies: dict[str, _Proxy] = {}
        self._subscriptions: set[_Subscription] = set()
        self._closed = False
        self.published = 0
        for url in webhooks:
            self.register(url)

    # -- registration -------------------------------------------------------------------------

    def register(self, url: str) -> None:
        """Add (or refresh) a proxy's webhook URL; a re-registering proxy counts as fresh."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"webhook URL must be http(s)://host[:port]/path, got {url!r}")
        if self.secret is None:
            raise ValueError("webhooks need a shared secret to sign events; none is configured")
        with self._lock:
            existing = self._proxies.get(url)
            if existing is not None:
                existing.stale = False
                existing.last_error = None
                return
            if len(self._proxies) >= self.max_proxies:
                raise ValueError(f"too many registered proxies (limit {self.max_proxies})")
            self._proxies[url] = _Proxy(url, ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="xsg-invalidation-push"))
        log.info("invalidation webhook registered: %s", _loggable_url(url))

    def unregister(self, url: str) -> bool:
        with self._lock:
            proxy = self._proxies.pop(url, None)
        if proxy is None:
            return False
        proxy.executor.shutdown(wait=False, cancel_futures=True)
        log.info("invalidation webhook unregistered: %s", _loggable_url(url))
        return True

    def proxies(self) -> list[ProxyState]:
        with self._lock:
            return [p.describe() for p in self._proxies.values()]

    # -- publishing ---------------------------------------------------------------------------

    def publish(self, kind: str, handle_ids: Iterable[str] = (), subject: str | None = None,
                stream: str | None = None, policy_id: str | None = None,
                streams: Iterable[str] | None = None) -> PublishResult:
        """Record an event and return once every fresh proxy acknowledged it (or timed out).
        `streams` (policy-changed): the streams whose decisions the change can alter; None for
        any stream (proxies then flush)."""
        if kind not in KINDS:
            raise ValueError(f"unknown invalidation kind {kind!r}; expected one of {KINDS}")
        ids = tuple(str(h) for h in handle_ids)
        scope = None if streams is None else tuple(sorted({str(s) for s in streams}))
        waited: list[tuple[_Proxy, Future[bool]]] = []
        skipped: list[str] = []
        with self._lock:
            # After close() there are no proxies or readers left: the event is only logged.
            self._last_id += 1
            event = InvalidationEvent(self._last_id, self.epoch, kind, ids, subject, stream,
                                      policy_id, time.time(), scope)
            self._log.append(event)
            self.published += 1
            for sub in list(self._subscriptions):
                sub.offer(event)
            body = json.dumps(event.to_json(), separators=(",", ":")).encode("utf-8")
            for proxy in self._proxies.values():
                if proxy.pending >= self.max_pending:
                    # The proxy is far behind; it will see the gap in the ids and flush.
                    proxy.last_error = "backlog full: event dropped, receiver must re-sync"
                    skipped.append(proxy.url)
                    continue
                proxy.pending += 1
                future = proxy.executor.submit(self._deliver, proxy, event, body)
                if proxy.stale:
                    skipped.append(proxy.url)
                else:
                    waited.append((proxy, future))
        # never a handle id (a capability): its handle_ref, as the access log and audit name it
        log.info("invalidation %s: %s handles=%d refs=%s subject=%s stream=%s policy=%s "
                 "streams=%s", event.sse_id, kind, len(ids), [handle_ref(h) for h in ids[:10]],
                 subject, stream, policy_id, "any" if scope is None else len(scope))
        acked: list[str] = []
        failed: list[str] = []
        if waited:
            # Every wait shares one deadline: the slowest fresh proxy bounds the call.
            budget = self.connect_timeout + self.timeout + 0.5
            wait_futures([f for _, f in waited], timeout=budget)
            for proxy, future in waited:
                ok = False
                try:
                    ok = future.done() and future.result(timeout=0)
                except (FutureTimeout, Exception):  # noqa: BLE001 - a failure is recorded below
                    ok = False
                if ok:
                    acked.append(proxy.url)
                else:
                    with self._lock:
                        if not proxy.stale:
                            log.warning("proxy %s did not acknowledge invalidation %s in time: "
                                        "marked stale", _loggable_url(proxy.url), event.sse_id)
                        proxy.stale = True
                    failed.append(proxy.url)
        return PublishResult(event, tuple(acked), tuple(failed), tuple(skipped))

    def _deliver(self, proxy: _Proxy, event: InvalidationEvent, body: bytes) -> bool:
        try:
            headers = {"Content-Type": "application/json", EVENT_ID_HEADER: event.sse_id}
            headers.update(sign(self.secret or b"", body))
            resp = self._session.post(proxy.url, data=body, headers=headers,
                                      timeout=(self.connect_timeout, self.timeout))
            resp.close()
            ok = 200 <= resp.status_code < 300
            error = None if ok else f"HTTP {resp.status_code}"
        except requests.RequestException as exc:
            ok, error = False, _loggable_error(exc, proxy.url)
        with self._lock:
            proxy.pending -= 1
            if ok:
                proxy.delivered += 1
                proxy.last_ok = time.time()
                if proxy.stale:
                    log.info("proxy %s acknowledged %s: fresh again", _loggable_url(proxy.url),
                             event.sse_id)
                proxy.stale = False
                proxy.last_error = None
            else:
                proxy.failures += 1
                proxy.last_error = error
                if not proxy.stale:
                    log.warning("proxy %s did not acknowledge invalidation %s (%s): marked stale",
                                _loggable_url(proxy.url), event.sse_id, error)
                proxy.stale = True
        return ok

    def follow_policy_events(self, events: PolicyEvents) -> Callable[[], None]:
        """Publish `policy-changed` for every change of a `pdp.events.PolicyEvents` hub, with
        the streams it can concern (`PolicyChange.resources`: the policy's target scope before
        and after the change; None, any stream, when a target cannot be narrowed to streams)."""

        def on_change(change: PolicyChange) -> None:
            resources = change.resources
            self.publish("policy-changed", policy_id=change.policy_id, subject=change.owner,
                         streams=None if resources is None else resources)

        return events.subscribe(on_change)

    # -- the log and the feed -----------------------------------------------------------------

    @property
    def last_id(self) -> int:
        with self._lock:
            return self._last_id

    def events_after(
        self, after: int, epoch: str | None = None
    ) -> tuple[list[InvalidationEvent], bool]:
        """Events with id > after, and whether that list is complete (False: re-sync needed)."""
        with self._lock:
            return self._after_locked(after, epoch)

    def _after_locked(self, after: int, epoch: str | None) -> tuple[list[InvalidationEvent], bool]:
        if epoch is not None and epoch != self.epoch:
            return [], False
        if after > self._last_id or after < 0:
            return [], False
        events = [e for e in self._log if e.id > after]
        first_needed = after + 1
        complete = after == self._last_id or (bool(events) and events[0].id == first_needed)
        return events, complete

    def open_feed(self, last_event_id: str | None
                  ) -> tuple[_Subscription, FeedHello, list[InvalidationEvent]]:
        """Register an SSE reader atomically with a snapshot: (subscription, hello, replay)."""
        position = parse_event_id(last_event_id)
        with self._lock:
            if self._closed:
                raise RuntimeError("invalidation hub is closed")
            if len(self._subscriptions) >= self.max_feed_readers:
                raise OverflowError(f"too many feed readers (limit {self.max_feed_readers})")
            replay: list[InvalidationEvent] = []
            resumed = False
            if position is not None:
                replay, resumed = self._after_locked(position[1], position[0])
                if not resumed:
                    replay = []
            sub = _Subscription(max(64, self._log.maxlen or 64))
            self._subscriptions.add(sub)
            hello: FeedHello = {"epoch": self.epoch, "last_id": self._last_id,
                                "resumed": resumed, "heartbeat": self.heartbeat}
        return sub, hello, replay

    def close_feed(self, sub: _Subscription) -> None:
        with self._lock:
            self._subscriptions.discard(sub)

    def disconnect_feed_readers(self) -> int:
        """End every open SSE stream (readers reconnect and re-sync); returns how many."""
        with self._lock:
            subs = list(self._subscriptions)
            self._subscriptions.clear()
        for sub in subs:
            sub.closed = True
            sub.offer(None)
        return len(subs)

    def feed_body(self, last_event_id: str | None) -> FeedBody:
        """The same SSE text as `feed_stream`, as a body the server's event loop pulls
        (server.streaming.StreamBody): no thread waits on the reader's queue."""
        sub, hello, replay = self.open_feed(last_event_id)
        return FeedBody(self, sub, hello, replay)

    def feed_stream(self, last_event_id: str | None) -> Iterator[str]:
        """SSE text for one reader: hello, the replayed events, then live events and heartbeats."""
        sub, hello, replay = self.open_feed(last_event_id)

        def generate() -> Generator[str, None, None]:
            try:
                yield (f"retry: 1000\nid: {format_event_id(hello['epoch'], hello['last_id'])}\n"
                       f"event: hello\ndata: {json.dumps(hello)}\n\n")
                for event in replay:
                    yield _sse(event)
                while not sub.closed and not self._closed:
                    try:
                        item = sub.queue.get(timeout=self.heartbeat)
                    except queue.Empty:
                        yield f": heartbeat {format_event_id(self.epoch, self.last_id)}\n\n"
                        continue
                    if item is None:
                        break
                    yield _sse(item)
                if sub.overflowed:
                    yield "event: overflow\ndata: {}\n\n"
            finally:
                self.close_feed(sub)

        return _FeedBody(generate(), lambda: self.close_feed(sub))

    # -- bookkeeping --------------------------------------------------------------------------

    def stats(self) -> HubStats:
        with self._lock:
            return {"epoch": self.epoch, "last_id": self._last_id, "published": self.published,
                    "log_size": len(self._log),
                    "oldest_id": self._log[0].id if self._log else None,
                    "feed_readers": len(self._subscriptions),
                    "proxies": [p.describe() for p in self._proxies.values()]}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            proxies = list(self._proxies.values())
            self._proxies.clear()
        self.disconnect_feed_readers()
        for proxy in proxies:
            proxy.executor.shutdown(wait=False, cancel_futures=True)
        self._session.close()


class FeedBody:
    """One feed reader's events, pulled without waiting (see `InvalidationHub.feed_body`)."""

    def __init__(self, hub: InvalidationHub, sub: _Subscription, hello: FeedHello,
                 replay: list[InvalidationEvent]) -> None:
        self.hub = hub
        self.sub = sub
        self.heartbeat_interval = hub.heartbeat
        self._pending = (f"retry: 1000\nid: {format_event_id(hello['epoch'], hello['last_id'])}\n"
                         f"event: hello\ndata: {json.dumps(hello)}\n\n"
                         + "".join(_sse(e) for e in replay))
        self._closed = False

    def start(self, wake: Callable[[], None]) -> None:
        self.sub.waiter = wake
        wake()

    def pull(self, max_bytes: int) -> tuple[bytes, bool]:
        parts = [self._pending]
        self._pending = ""
        size = len(parts[0])
        finished = False
        while size < max_bytes:
            try:
                item = self.sub.queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                finished = True
                break
            text = _sse(item)
            parts.append(text)
            size += len(text)
        if not finished and (self.sub.closed or self.hub._closed) and self.sub.queue.empty():
            finished = True
        if finished and self.sub.overflowed:
            parts.append("event: overflow\ndata: {}\n\n")
        return "".join(parts).encode("utf-8"), finished

    def heartbeat(self) -> bytes:
        hub = self.hub
        return f": heartbeat {format_event_id(hub.epoch, hub.last_id)}\n\n".encode()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.sub.waiter = None
            self.hub.close_feed(self.sub)
def _loggable_url(url: str) -> str:
    """A webhook URL as logged: scheme, host and path; never userinfo or a query string, which
    may hold credentials."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def _loggable_error(exc: Exception, url: str) -> str:
    """Why a delivery failed, without the parts of the URL that may hold credentials (the
    client's message quotes the URL it was given)."""
    parts = urlsplit(url)
    text = f"{type(exc).__name__}: {exc}"
    userinfo = parts.netloc.rpartition("@")[0]
    for secret in (parts.query, userinfo):
        if secret:
            text = text.replace(secret, "...")
    return text


def _sse(event: InvalidationEvent) -> str:
    data = json.dumps(event.to_json(), separators=(",", ":"))
    return f"id: {event.sse_id}\nevent: invalidation\ndata: {data}\n\n"


__all__ = ["FeedHello", "HubStats", "InvalidationHub", "ProxyState", "PublishResult"]
