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

Event ids grow by one per event within an *epoch*, a random string chosen when the hub starts, so a
proxy can tell "the gateway restarted and its counter began again" from "I missed nothing".

Signature: `X-XSG-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>`, with the
timestamp (Unix seconds) in `X-XSG-Timestamp`. Receivers reject signatures older than a window;
a replayed event can only make a proxy drop entries, never keep one.

Ordering contract for the callers (the handle manager, the policy API): publish *after* the
handle's state is revoked or released, so that a request racing the revocation cannot get the dead
handle back from the gateway once the proxy has dropped it; and do not hold locks that the proxy's
own request path needs while publishing.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import requests

if TYPE_CHECKING:  # Flask is needed only by the gateway's HTTP edge, not by publishers
    from flask import Blueprint

log = logging.getLogger(__name__)

KINDS = ("handle-revoked", "handle-released", "handle-ended", "policy-changed")
SIGNATURE_HEADER = "X-XSG-Signature"
TIMESTAMP_HEADER = "X-XSG-Timestamp"
EVENT_ID_HEADER = "X-XSG-Event-Id"
DEFAULT_SIGNATURE_WINDOW = 300.0
FEED_PATH = "/events/invalidations"
MAX_HANDLE_IDS = 10_000


class InvalidEventError(ValueError):
    """An event document that does not follow the invalidation protocol."""


@dataclass(frozen=True)
class InvalidationEvent:
    """One invalidation; `id` grows by one per event within `epoch`."""

    id: int
    epoch: str
    kind: str
    handle_ids: tuple[str, ...] = ()
    subject: str | None = None
    stream: str | None = None
    policy_id: str | None = None
    time: float = 0.0

    @property
    def sse_id(self) -> str:
        return format_event_id(self.epoch, self.id)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "epoch": self.epoch, "kind": self.kind,
                "handle_ids": list(self.handle_ids), "subject": self.subject,
                "stream": self.stream, "policy_id": self.policy_id, "time": self.time}

    @classmethod
    def from_json(cls, doc: Any) -> "InvalidationEvent":
        """Validate a received event document; raises InvalidEventError saying which field."""
        if not isinstance(doc, dict):
            raise InvalidEventError("event must be a JSON object")
        ident, epoch, kind = doc.get("id"), doc.get("epoch"), doc.get("kind")
        if not isinstance(ident, int) or isinstance(ident, bool) or ident < 1:
            raise InvalidEventError("event.id must be a positive integer")
        if not isinstance(epoch, str) or not epoch or len(epoch) > 64:
            raise InvalidEventError("event.epoch must be a non-empty string")
        if kind not in KINDS:
            raise InvalidEventError(f"event.kind must be one of {', '.join(KINDS)}, got {kind!r}")
        handle_ids = doc.get("handle_ids", [])
        if (not isinstance(handle_ids, list) or len(handle_ids) > MAX_HANDLE_IDS
                or not all(isinstance(h, str) and h for h in handle_ids)):
            raise InvalidEventError("event.handle_ids must be a list of non-empty strings")
        for name in ("subject", "stream", "policy_id"):
            if doc.get(name) is not None and not isinstance(doc.get(name), str):
                raise InvalidEventError(f"event.{name} must be a string or null")
        stamp = doc.get("time", 0.0)
        if not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
            raise InvalidEventError("event.time must be a number")
        return cls(ident, epoch, kind, tuple(handle_ids), doc.get("subject"), doc.get("stream"),
                   doc.get("policy_id"), float(stamp))


def format_event_id(epoch: str, ident: int) -> str:
    return f"{epoch}.{ident}"


def parse_event_id(text: str | None) -> tuple[str, int] | None:
    """`<epoch>.<n>` -> (epoch, n); None for anything else (treated as "no position")."""
    if not text:
        return None
    epoch, sep, num = text.strip().rpartition(".")
    if not sep or not epoch or not num.isdigit() or len(num) > 18:
        return None
    return epoch, int(num)


def _key(secret: str | bytes) -> bytes:
    return secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)


def sign(secret: str | bytes, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """Headers that authenticate `body` for a receiver that knows `secret`."""
    stamp = str(int(time.time()) if timestamp is None else int(timestamp))
    mac = hmac.new(_key(secret), stamp.encode("ascii") + b"." + body, hashlib.sha256).hexdigest()
    return {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: "sha256=" + mac}


def verify(secret: str | bytes, body: bytes, signature: str | None, timestamp: str | None,
           window: float = DEFAULT_SIGNATURE_WINDOW, now: float | None = None) -> str | None:
    """None when the signature is good; otherwise the reason it is refused."""
    if not signature or not timestamp:
        return "missing signature or timestamp header"
    if not timestamp.isdigit() or len(timestamp) > 12:
        return "malformed timestamp"
    now = time.time() if now is None else now
    if abs(now - int(timestamp)) > window:
        return "timestamp outside the accepted window (clock skew or replay)"
    if not signature.startswith("sha256="):
        return "unsupported signature scheme"
    expected = sign(secret, body, int(timestamp))[SIGNATURE_HEADER]
    if not hmac.compare_digest(expected.encode("ascii"), signature.encode("ascii", "replace")):
        return "bad signature"
    return None


@dataclass(frozen=True)
class PublishResult:
    event: InvalidationEvent
    acknowledged: tuple[str, ...]
    failed: tuple[str, ...]  # waited for, but failed or timed out: now stale
    skipped: tuple[str, ...]  # stale already: delivered in the background, not waited for


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

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "state": "stale" if self.stale else "fresh",
                "pending": self.pending, "delivered": self.delivered, "failures": self.failures,
                "last_error": self.last_error, "last_ok": self.last_ok}


class _Subscription:
    """One SSE reader's queue; overflow ends the stream (the reader re-syncs on reconnect)."""

    def __init__(self, capacity: int) -> None:
        self.queue: queue.Queue[InvalidationEvent | None] = queue.Queue(capacity)
        self.closed = False
        self.overflowed = False

    def offer(self, event: InvalidationEvent | None) -> None:
        try:
            self.queue.put_nowait(event)
        except queue.Full:
            self.closed = self.overflowed = True


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
        log.info("invalidation webhook registered: %s", url)

    def unregister(self, url: str) -> bool:
        with self._lock:
            proxy = self._proxies.pop(url, None)
        if proxy is None:
            return False
        proxy.executor.shutdown(wait=False, cancel_futures=True)
        log.info("invalidation webhook unregistered: %s", url)
        return True

    def proxies(self) -> list[dict[str, Any]]:
        with self._lock:
            return [p.describe() for p in self._proxies.values()]

    # -- publishing ---------------------------------------------------------------------------

    def publish(self, kind: str, handle_ids: Iterable[str] = (), subject: str | None = None,
                stream: str | None = None, policy_id: str | None = None) -> PublishResult:
        """Record an event and return once every fresh proxy acknowledged it (or timed out)."""
        if kind not in KINDS:
            raise ValueError(f"unknown invalidation kind {kind!r}; expected one of {KINDS}")
        ids = tuple(str(h) for h in handle_ids)
        waited: list[tuple[_Proxy, Future]] = []
        skipped: list[str] = []
        with self._lock:
            # After close() there are no proxies or readers left: the event is only logged.
            self._last_id += 1
            event = InvalidationEvent(self._last_id, self.epoch, kind, ids, subject, stream,
                                      policy_id, time.time())
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
        log.info("invalidation %s: %s handles=%s subject=%s stream=%s policy=%s", event.sse_id,
                 kind, list(ids)[:10], subject, stream, policy_id)
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
                                        "marked stale", proxy.url, event.sse_id)
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
            ok, error = False, f"{type(exc).__name__}: {exc}"
        with self._lock:
            proxy.pending -= 1
            if ok:
                proxy.delivered += 1
                proxy.last_ok = time.time()
                if proxy.stale:
                    log.info("proxy %s acknowledged %s: fresh again", proxy.url, event.sse_id)
                proxy.stale = False
                proxy.last_error = None
            else:
                proxy.failures += 1
                proxy.last_error = error
                if not proxy.stale:
                    log.warning("proxy %s did not acknowledge invalidation %s (%s): marked stale",
                                proxy.url, event.sse_id, error)
                proxy.stale = True
        return ok

    def follow_policy_events(self, events: Any) -> Callable[[], None]:
        """Publish `policy-changed` for every change of a `pdp.events.PolicyEvents` hub."""

        def on_change(change: Any) -> None:
            self.publish("policy-changed", policy_id=change.policy_id, subject=change.owner)

        return events.subscribe(on_change)

    # -- the log and the feed -----------------------------------------------------------------

    @property
    def last_id(self) -> int:
        with self._lock:
            return self._last_id

    def events_after(self, after: int, epoch: str | None = None) -> tuple[list[InvalidationEvent], bool]:
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

    def open_feed(self, last_event_id: str | None) -> tuple[_Subscription, dict, list[InvalidationEvent]]:
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
            hello = {"epoch": self.epoch, "last_id": self._last_id, "resumed": resumed,
                     "heartbeat": self.heartbeat}
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
            try:
                sub.queue.put_nowait(None)
            except queue.Full:
                pass
        return len(subs)

    def feed_stream(self, last_event_id: str | None) -> Iterator[str]:
        """SSE text for one reader: hello, the replayed events, then live events and heartbeats."""
        sub, hello, replay = self.open_feed(last_event_id)

        def generate() -> Iterator[str]:
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

        return generate()

    # -- bookkeeping --------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
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


def _sse(event: InvalidationEvent) -> str:
    data = json.dumps(event.to_json(), separators=(",", ":"))
    return f"id: {event.sse_id}\nevent: invalidation\ndata: {data}\n\n"


# -- Flask glue ------------------------------------------------------------------------------------

def invalidation_blueprint(hub: InvalidationHub,
                           require_admin: Callable[[], bool] | None = None) -> "Blueprint":
    """`/events/invalidations` (SSE or `?after=N` JSON) and `/events/invalidations/subscribers`.

    A caller is let in with `Authorization: Bearer <hub.proxy_token>`, or when `require_admin()`
    (called inside the request) returns True; it may also raise an HTTPException of its own.
    These routes authorise themselves: keep them out of any user-token check in front of them.
    """
    from flask import Blueprint, Response, jsonify, request

    bp = Blueprint("xsg_invalidation", __name__)

    def refused():
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if hub.proxy_token and token and hmac.compare_digest(
                hashlib.sha256(token.encode("utf-8")).digest(),
                hashlib.sha256(hub.proxy_token.encode("utf-8")).digest()):
            return None
        if require_admin is not None and require_admin():
            return None
        status = 403 if token else 401
        resp = jsonify(error="the invalidation feed needs the proxy token or an administrator")
        resp.status_code = status
        if status == 401:
            resp.headers["WWW-Authenticate"] = 'Bearer realm="xsg"'
        return resp

    def bad_request(message: str):
        resp = jsonify(error=message)
        resp.status_code = 400
        return resp

    @bp.get(FEED_PATH)
    def feed():
        denied = refused()
        if denied is not None:
            return denied
        after = request.args.get("after")
        wants_sse = "text/event-stream" in request.headers.get("Accept", "") or after is None
        if after is not None or not wants_sse:
            position = parse_event_id(after) if after and "." in after else None
            if position is None:
                if after is None or not after.isdigit() or len(after) > 18:
                    return bad_request("after must be an event number N or an id <epoch>.<N>")
                position = (request.args.get("epoch") or hub.epoch, int(after))
            events, complete = hub.events_after(position[1], position[0])
            return jsonify(epoch=hub.epoch, last_id=hub.last_id, reset=not complete,
                           events=[e.to_json() for e in events])
        last = request.headers.get("Last-Event-ID") or request.args.get("last_event_id")
        try:
            body = hub.feed_stream(last)
        except OverflowError as exc:
            resp = jsonify(error=str(exc))
            resp.status_code = 503
            return resp
        except RuntimeError as exc:
            resp = jsonify(error=str(exc))
            resp.status_code = 503
            return resp
        return Response(body, mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def webhook_from_body():
        doc = request.get_json(silent=True)
        if not isinstance(doc, dict) or not isinstance(doc.get("webhook"), str):
            return None, bad_request('body must be JSON {"webhook": "http(s)://..."}')
        return doc["webhook"], None

    @bp.post(FEED_PATH + "/subscribers")
    def register():
        denied = refused()
        if denied is not None:
            return denied
        url, error = webhook_from_body()
        if error is not None:
            return error
        try:
            hub.register(url)
        except ValueError as exc:
            return bad_request(str(exc))
        return jsonify(registered=url, epoch=hub.epoch, last_id=hub.last_id)

    @bp.delete(FEED_PATH + "/subscribers")
    def unregister():
        denied = refused()
        if denied is not None:
            return denied
        url, error = webhook_from_body()
        if error is not None:
            return error
        return jsonify(unregistered=hub.unregister(url))

    @bp.get(FEED_PATH + "/subscribers")
    def subscribers():
        denied = refused()
        if denied is not None:
            return denied
        return jsonify(hub.stats())

    return bp
