"""Following the gateway's invalidation feed (SSE) in a background thread.

The feed is the proxy's lease on its cache: the gateway sends a heartbeat at least every few
seconds, and a read that waits longer than `read_timeout` counts as a lost feed. Lost means
`CacheSync.feed_lost` (cache off, everything passes through) and reconnection with a backoff; a
`hello` from the gateway means `CacheSync.feed_hello` (flush, resume, cache on). So a proxy cut
off from the gateway serves cached answers for at most `read_timeout` seconds after the last sign
of life, and each of those answers names a handle that the gateway itself still checks on every
read.

On each (re)connection the proxy also (re)registers its webhook URL, if it has one, so that the
gateway waits for it again on the next revocation.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import requests

from common.invalidation import FEED_PATH, MAX_EVENT_NUMBER, InvalidationEvent, InvalidEventError
from common.numbers import check_float, check_int
from proxy.forward import iter_raw, make_session
from proxy.sync import CacheSync

log = logging.getLogger(__name__)

MAX_HEARTBEAT = 3600.0  # seconds; a hello announcing more is malformed


def parse_sse(chunks: Iterator[bytes]) -> Iterator[tuple[str, str, str | None]]:
    """(event, data, id) for each SSE message; comments yield ('comment', text, None)."""
    buffer = b""
    event, ident = "message", None
    data: list[str] = []

    def lines_of(text: bytes) -> list[bytes]:
        return text.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")

    def feed(lines: list[bytes]) -> Iterator[tuple[str, str, str | None]]:
        nonlocal event, data, ident
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            if not line:
                if data:
                    yield event, "\n".join(data), ident
                event, data, ident = "message", [], None
                continue
            if line.startswith(":"):
                yield "comment", line[1:].strip(), None
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                ident = value

    for chunk in chunks:
        buffer += chunk
        if len(buffer) > 1024 * 1024:
            raise ValueError("SSE line longer than 1 MiB")
        # A CR at the end may be the first half of a CRLF: keep it for the next chunk.
        held = b"\r" if buffer.endswith(b"\r") else b""
        *lines, rest = lines_of(buffer[:-1] if held else buffer)
        buffer = rest + held
        yield from feed(lines)
    if buffer.endswith(b"\r"):  # the stream ended right after a CR line ending
        yield from feed(lines_of(buffer[:-1]))


class FeedClient:
    """Reads `GET <upstream>/events/invalidations` and drives a CacheSync."""

    def __init__(self, upstream: str, sync: CacheSync, token: str | None,
                 webhook_url: str | None = None, read_timeout: float = 6.0,
                 connect_timeout: float = 2.0, backoff: tuple[float, float] = (0.2, 5.0),
                 verify: bool | str = True) -> None:
        self.url = upstream.rstrip("/") + FEED_PATH
        self.sync = sync
        self.token = token
        self.webhook_url = webhook_url
        self.read_timeout = read_timeout
        self.connect_timeout = connect_timeout
        self.backoff = backoff
        self.session = make_session(pool_size=2, verify=verify)
        self.connects = 0
        self.registrations = 0
        self.registration_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: requests.Response | None = None
        self._lock = threading.Lock()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="xsg-proxy-feed", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            resp = self._resp
        if resp is not None:
            try:
                resp.close()
            except Exception:  # noqa: BLE001 - closing must go on
                pass
        if self._thread is not None:
            self._thread.join(timeout)
        self.session.close()

    def _run(self) -> None:
        delay = self.backoff[0]
        while not self._stop.is_set():
            connects = self.connects
            try:
                self._follow()
                reason = "feed stream ended"
            except Exception as exc:  # noqa: BLE001 - any failure means: no feed
                reason = f"{type(exc).__name__}: {exc}"[:300]
            if self._stop.is_set():
                return
            self.sync.feed_lost(reason)
            # A connection that worked restarts the backoff; repeated failures lengthen it.
            delay = self.backoff[0] if self.connects != connects else min(delay * 2,
                                                                          self.backoff[1])
            self._stop.wait(delay)

    def _register(self) -> bool:
        """Register the webhook URL with the hub; False when that failed."""
        if not self.webhook_url:
            return True
        try:
            resp = self.session.post(self.url + "/subscribers", json={"webhook": self.webhook_url},
                                     headers={"Authorization": f"Bearer {self.token}"}
                                     if self.token else {},
                                     timeout=(self.connect_timeout, self.read_timeout))
            if resp.status_code == 200:
                self.registrations += 1
                self.registration_error = None
                return True
            self.registration_error = f"HTTP {resp.status_code}: {resp.text[:200]}"
            log.warning("webhook registration refused: %s", self.registration_error)
        except requests.RequestException as exc:
            self.registration_error = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("webhook registration failed: %s", self.registration_error)
        return False

    def _follow(self) -> None:
        headers = self._headers()
        position = self.sync.position
        if position:
            headers["Last-Event-ID"] = position
        resp = self.session.get(self.url, headers=headers, stream=True,
                                timeout=(self.connect_timeout, self.read_timeout))
        with self._lock:
            self._resp = resp
        try:
            if resp.status_code != 200:
                raise ConnectionError(f"feed answered HTTP {resp.status_code}")
            if "text/event-stream" not in resp.headers.get("Content-Type", ""):
                raise ConnectionError("feed did not answer with text/event-stream")
            self.connects += 1
            greeted = False
            for event, data, _ident in parse_sse(iter_raw(resp)):
                if self._stop.is_set():
                    return
                self.sync.check_webhooks()
                if event == "comment":
                    continue
                if event == "hello":
                    hello = json.loads(data)
                    if not isinstance(hello, dict):
                        raise ValueError("hello is not a JSON object")
                    heartbeat = check_float(hello.get("heartbeat") or 0, "hello.heartbeat",
                                            low=0, high=MAX_HEARTBEAT)
                    if heartbeat and self.read_timeout < 2 * heartbeat:
                        # Our lease would expire between two heartbeats: lengthen it, reconnect.
                        log.warning("feed heartbeat is %.1f s but the read timeout %.1f s; "
                                    "using %.1f s", heartbeat, self.read_timeout, 3 * heartbeat)
                        self.read_timeout = 3 * heartbeat
                        raise ConnectionError("read timeout adjusted to the feed's heartbeat")
                    # Register before serving from cache, so the next revocation waits for us.
                    registered = self._register()
                    self.sync.feed_hello(str(hello["epoch"]),
                                         check_int(hello["last_id"], "hello.last_id",
                                                   high=MAX_EVENT_NUMBER),
                                         bool(hello.get("resumed")), webhook_registered=registered)
                    greeted = True
                elif event == "invalidation":
                    if not greeted:
                        raise ConnectionError("invalidation before hello")
                    self.sync.apply(InvalidationEvent.from_json(json.loads(data)), "feed")
                elif event == "overflow":
                    raise ConnectionError("gateway dropped this reader (backlog overflow)")
        except (ValueError, KeyError, TypeError, InvalidEventError) as exc:
            # NumberError is a ValueError; TypeError: a message that is not a JSON object
            raise ConnectionError(f"malformed feed message: {exc}") from None
        finally:
            with self._lock:
                self._resp = None
            resp.close()

    def stats(self) -> dict[str, Any]:
        return {"url": self.url, "connects": self.connects,
                "webhook_url": self.webhook_url, "webhook_registrations": self.registrations,
                "webhook_registration_error": self.registration_error,
                "read_timeout": self.read_timeout}


def wait_live(sync: CacheSync, timeout: float) -> bool:
    """Block until the feed is live (tests and start-up scripts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sync.state == "live":
            return True
        time.sleep(0.02)
    return sync.state == "live"
