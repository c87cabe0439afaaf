"""What the synchronous and the asyncio clients share, without I/O: the settings of a connection
to the gateway, handle references, the answers of the gateway's JSON routes, and the reading of
a handle stream as a state machine (`ReadState`) that the two clients drive over their sockets.

Reading a handle (see `ReadState`): connect with `Last-Event-ID` (the id of the last event
given to the caller); feed the bytes as they come, one chunk at a time, to get events; when the
connection breaks before the handle's final event, or the gateway says it is stopping, report
`Disconnected`, wait, and connect again after the same id: the gateway sends what followed,
with a `gap` first when rows went meanwhile (or a restart lost them). A 503 (the gateway
restores its handles after a restart) or a 429 (too many readers) is waited out the same way,
after the time its Retry-After says. A first connection that cannot be made fails at once: the
URL or the network is wrong, there is nothing to resume.
"""
from __future__ import annotations

import json
import logging
import os
import re
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

from xsg_client.errors import (
    BadHandle,
    ConnectionLost,
    HTTPError,
    Unreachable,
    XsgError,
    error_message,
    short_id,
)
from xsg_client.events import Disconnected, End, Event, Gap, Notice, Reconnected, Row, parse_event
from xsg_client.schema import HandleSchema, parse_timestamp

DEFAULT_URL = "http://127.0.0.1:8080"
NDJSON = "application/x-ndjson"
READ_TOKEN_PARAMETER = "read_token"
_HANDLE_ID = re.compile(r"[A-Za-z0-9_-]{20,200}")
_HANDLE_PATH = re.compile(r"(?P<prefix>.*)/handles/(?P<id>[A-Za-z0-9_-]{1,200})/?")
TRANSIENT = (429, 502, 503, 504)  # statuses a reader waits out and asks again
FIRST_DELAY, MAX_DELAY = 0.2, 5.0
_fromisoformat = datetime.fromisoformat  # the gateway's timestamps end in Z: UTC at once
_UTC = UTC  # seconds between attempts to reconnect: doubled, capped


# -- logs ------------------------------------------------------------------------------------------

class RedactHandles(logging.Filter):
    """Takes handle ids and read tokens out of the httpx logger's lines: httpx logs every
    request's URL at INFO, and a handle's URL carries its capability (its id; a read URL also
    a read token). A record keeps its level and logger; only the URL is shortened."""

    _SECRET = re.compile(r"(/handles/[A-Za-z0-9_-]{6})[A-Za-z0-9_-]+|"
                         r"(read_token=)[^&\s\"']+")

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that does not format is not ours to fix
            return True
        redacted = self._SECRET.sub(lambda m: (m.group(1) + "...") if m.group(1)
                                    else (m.group(2) + "..."), text)
        if redacted != text:
            record.msg, record.args = redacted, None
        return True


def redact_http_logs() -> None:
    """Install `RedactHandles` on httpx's logger (once)."""
    logger = logging.getLogger("httpx")
    if not any(isinstance(f, RedactHandles) for f in logger.filters):
        logger.addFilter(RedactHandles())


# -- settings --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """Where the gateway is and how to talk to it: `url` (default `XSG_URL`, else
    http://127.0.0.1:8080), the bearer `token` (default `XSG_TOKEN`), `ca_file` (a PEM file of
    the certificate authorities that sign the gateway's certificate; default: the system's),
    `timeout` (seconds per call), `read_timeout` (seconds a handle stream may stay silent,
    heartbeats included, before it counts as broken; the gateway sends one every 15 s)."""

    url: str
    token: str | None
    ca_file: str | None
    timeout: float
    read_timeout: float

    @classmethod
    def make(cls, url: str | None, token: str | None, ca_file: str | None, timeout: float,
             read_timeout: float) -> Settings:
        base = (url or os.environ.get("XSG_URL") or DEFAULT_URL).rstrip("/")
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise XsgError(f"not a gateway URL: {base!r} (expected http(s)://HOST[:PORT])")
        if token is None:
            token = os.environ.get("XSG_TOKEN") or None
        return cls(base, token, ca_file, float(timeout), float(read_timeout))

    def verify(self) -> ssl.SSLContext | bool:
        """What httpx checks the gateway's certificate with."""
        if self.ca_file is None:
            return True
        try:
            return ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise XsgError(f"cannot use the CA file {self.ca_file}: {exc}") from None

    def own(self, ref: HandleRef) -> HandleRef:
        """`ref`, when this client may read it: a handle on its own gateway (same scheme, host
        and port), or a read URL (`?read_token=`, which needs no bearer token). The bearer
        token is never sent to another host than the gateway's, whatever a URL says."""
        if ref.read_token is None and _origin(ref.url) != _origin(self.url):
            raise BadHandle(f"the handle {ref.shown} is on {_origin(ref.url)}, not on this "
                            f"client's gateway {_origin(self.url)}: its bearer token goes to "
                            "no other host. Read it with a client for that gateway, or give "
                            "its id")
        return ref

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def need_token(self, what: str) -> None:
        if not self.token:
            raise XsgError(f"{what} needs a bearer token: pass token= or set XSG_TOKEN")


# -- handles ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HandleRef:
    """A handle: its URL (`https://HOST/handles/ID`, no query), its id, and the read token its
    URL carried (`?read_token=`), if any."""

    url: str
    id: str
    read_token: str | None = None

    @property
    def shown(self) -> str:
        """The handle as messages show it (its id shortened: the id is its capability)."""
        return f"/handles/{short_id(self.id)}"

    def stream_url(self) -> str:
        return (self.url if self.read_token is None
                else f"{self.url}?{READ_TOKEN_PARAMETER}={quote(self.read_token, safe='')}")

    def with_read_token(self, token: str | None) -> HandleRef:
        return HandleRef(self.url, self.id, token)


def _origin(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def handle_ref(handle: str | HandleRef | Any, base_url: str) -> HandleRef:
    """A handle given as its URL (what `POST /requests` answered, or a read URL with
    `?read_token=`), as its id (on the gateway at `base_url`), or as a `Grant` or `HandleInfo`
    (which the gateway at `base_url` answered: its id there, whatever public URL the gateway
    writes into its answers). `BadHandle` says what is wrong with anything else."""
    if isinstance(handle, HandleRef):
        return handle
    handle_id = getattr(handle, "id", None)
    if isinstance(handle_id, str) and isinstance(getattr(handle, "handle", None), str):
        if not _HANDLE_ID.fullmatch(handle_id):
            raise BadHandle(f"not a handle id: {_shown(handle_id)!r}")
        return HandleRef(f"{base_url}/handles/{handle_id}", handle_id)
    text = getattr(handle, "handle", handle)
    if not isinstance(text, str):
        raise BadHandle(f"a handle is its URL or its id, not {type(text).__name__}")
    text = text.strip()
    if _HANDLE_ID.fullmatch(text):
        return HandleRef(f"{base_url}/handles/{text}", text)
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadHandle(f"not a handle: {_shown(text)!r}: give its URL "
                        "(http(s)://HOST[:PORT]/handles/ID, as POST /requests answered it) "
                        "or its id")
    match = _HANDLE_PATH.fullmatch(parts.path)
    if match is None:
        raise BadHandle(f"not a handle URL: {_shown(text)!r}: its path must end in "
                        "/handles/ID")
    if parts.fragment:
        raise BadHandle("a handle URL has no #fragment")
    read_token = None
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name != READ_TOKEN_PARAMETER:
            raise BadHandle(f"a handle URL takes no query parameter but {READ_TOKEN_PARAMETER!r} "
                            f"(found {name!r}; where to resume is last_event_id=)")
        read_token = value
    url = urlunsplit((parts.scheme, parts.netloc, f"{match['prefix']}/handles/{match['id']}",
                      "", ""))
    return HandleRef(url, match["id"], read_token)


def _shown(text: str) -> str:
    """A handle reference that did not parse, as a message shows it: without anything that
    may be a handle id or a read token."""
    text = re.sub(r"[A-Za-z0-9_-]{20,}", lambda m: short_id(m.group(0)), text)
    return text[:120]


# -- answers ---------------------------------------------------------------------------------------

def failure(method: str, what: str, status: int, text: str, reason: str) -> HTTPError:
    message, body = error_message(text, reason)
    return HTTPError(method, what, status, message, body)


def json_object(text: str, what: str) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except ValueError:
        raise XsgError(f"{what}: the gateway's answer is not JSON: {text[:200]!r}") from None
    if not isinstance(body, dict):
        raise XsgError(f"{what}: the gateway's answer is not a JSON object")
    return body


@dataclass(frozen=True)
class Grant:
    """The gateway's answer to a stream request: the handle (`handle`, its URL; `id`), whether
    it is `new` (a repeated request gets the caller's live handle for the same plan), the
    `warnings` (partial results, each with its `kind`, `message` and the policy's
    `predicates`), the merged `plan` and its `sql` text, the `policy_ids` that granted it,
    `privacy` (a differentially private window: the caller's budgets), and the whole answer
    (`raw`)."""

    handle: str
    id: str
    stream: str
    streams: tuple[str, ...]
    new: bool
    warnings: tuple[dict[str, Any], ...]
    plan: dict[str, Any]
    sql: str | None
    policy_ids: tuple[str, ...]
    privacy: dict[str, Any] | None
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Grant:
        return cls(handle=str(body["handle"]), id=str(body["id"]), stream=str(body["stream"]),
                   streams=tuple(body.get("streams") or (body["stream"],)),
                   new=bool(body.get("new", True)),
                   warnings=tuple(w for w in body.get("warnings") or () if isinstance(w, dict)),
                   plan=dict(body.get("plan") or {}), sql=body.get("sql"),
                   policy_ids=tuple(body.get("policy_ids") or ()), privacy=body.get("privacy"),
                   raw=dict(body))


@dataclass(frozen=True)
class HandleInfo:
    """A handle's description (`GET /handles`, or a handle read as application/json): its
    `state` (live, revoked, released, ended) and `reason`, its stream(s), plan and policies."""

    handle: str
    id: str
    stream: str
    streams: tuple[str, ...]
    state: str
    reason: str | None
    created_at: str | None
    updated_at: str | None
    plan: dict[str, Any]
    policy_ids: tuple[str, ...]

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> HandleInfo:
        return cls(handle=str(body["handle"]), id=str(body["id"]), stream=str(body["stream"]),
                   streams=tuple(body.get("streams") or (body["stream"],)),
                   state=str(body["state"]), reason=body.get("reason"),
                   created_at=body.get("created_at"), updated_at=body.get("updated_at"),
                   plan=dict(body.get("plan") or {}),
                   policy_ids=tuple(body.get("policy_ids") or ()))

    @property
    def live(self) -> bool:
        return self.state == "live"


@dataclass(frozen=True)
class ReadToken:
    """A handle read token (`POST /handles/<id>/read-token`): `url` reads the handle without a
    bearer token until `expires_at` (it acts only as the handle's owner, only for that GET)."""

    token: str
    url: str
    expires_at: str
    expires_in: int


# -- reading a stream ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReadOptions:
    """How a handle is read (see `Client.open`)."""

    resume_after_shutdown: bool = True
    reconnect_timeout: float | None = 300.0
    idle_timeout: float | None = None


class RetryLater(Exception):
    """An answer to wait out (503, 429, ...), after `retry_after` seconds when it says."""

    def __init__(self, cause: str, retry_after: float | None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.retry_after = retry_after


def retry_after(value: str | None) -> float | None:
    try:
        return min(max(float(value), 0.0), 60.0) if value else None
    except ValueError:
        return None


class ReadState:
    """One reader of one handle, without I/O: what to ask (`headers`), what an answer means
    (`answered`), the events in the bytes that come (`feed`), and what to do when the
    connection is lost (`lost`). The clients' loops drive it (`client.HandleStream`,
    `aio.AsyncHandleStream`)."""

    def __init__(self, ref: HandleRef, schema: HandleSchema, last_event_id: int | None,
                 options: ReadOptions) -> None:
        self.ref = ref
        self.schema = schema
        self.timestamps = schema.timestamps
        self.last_event_id = last_event_id
        self.options = options
        self.end: End | None = None
        self.connected = False  # a connection was made once (later failures are resumed)
        self.lost_at: float | None = None  # when the connection in use was lost
        self.attempt = 0
        self.resume_cause: str | None = None  # the gateway stopped: read again after it
        self.last_event_at = time.monotonic()  # the last event that was not a heartbeat
        self._pending = b""

    def over(self) -> bool:
        """The handle's final event came (or the handle had ended before)."""
        return self.end is not None

    def headers(self) -> dict[str, str]:
        headers = {"Accept": NDJSON}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = str(self.last_event_id)
        return headers

    def answered(self, status: int, text: str | None, retry: str | None) -> Event | None:
        """The stream's answer: None or `Reconnected` (200: read on), `End` (410: the handle
        ended before this connection); `RetryLater` for an answer to wait out; `HTTPError`
        for a refusal."""
        if status == 200:
            event: Event | None = None
            if self.lost_at is not None:
                event = Reconnected(self.last_event_id, time.monotonic() - self.lost_at)
            self.connected, self.lost_at, self.attempt = True, None, 0
            self._pending = b""
            self.last_event_at = time.monotonic()
            return event
        if status == 410:
            body = json_object(text or "{}", f"GET {self.ref.shown}")
            self.end = End(None, str(body.get("state") or "ended"), body.get("reason"))
            return self.end
        if status in TRANSIENT:
            message, _ = error_message(text or "", f"HTTP {status}")
            raise RetryLater(f"HTTP {status}: {message}", retry_after(retry))
        raise failure("GET", self.ref.shown, status, text or "", f"HTTP {status}")

    def feed(self, chunk: bytes) -> list[Event]:
        """The events in the next bytes of the stream (a line cut by the chunk's end waits for
        the next one). After the final event nothing more is read; a `shutdown` the reader
        resumes after is no event of its own (`resume_cause` says it came).

        The chunk's lines are decoded as one JSON array (`[line,line,...]`): one call of the
        C decoder per chunk (~1,000 events) instead of one per line, which more than pays for
        the typing of the rows (measured in tests/bench/bench_client.py)."""
        if self._pending:
            chunk = self._pending + chunk
        lines = chunk.split(b"\n")
        self._pending = lines.pop()
        lines = [line for line in lines if line]
        if not lines:
            return []
        try:
            objects = json.loads(b"[" + b",".join(lines) + b"]")
        except ValueError:
            objects = [_decoded(line) for line in lines]  # to name the line that is wrong
        out: list[Event] = []
        append = out.append
        timestamps = self.timestamps
        last = self.last_event_id
        for obj in objects:
            row = obj.get("row") if type(obj) is dict else None
            if row is not None:
                last = obj["id"]
                for name in timestamps:
                    value = row.get(name)
                    if type(value) is str:
                        stamp = _fromisoformat(value)
                        row[name] = stamp if stamp.tzinfo is _UTC else parse_timestamp(value)
                append(Row(last, row))
                continue
            event = parse_event(obj)
            if event is None:  # a heartbeat
                continue
            last = event.id
            if isinstance(event, End):
                if event.kind == "shutdown" and self.options.resume_after_shutdown:
                    self.resume_cause = "shutdown" + (f": {event.reason}" if event.reason
                                                      else ": the gateway is stopping")
                else:
                    self.end = event
                    append(event)
                break
            append(event)
        self.last_event_id = last
        if out:
            self.last_event_at = time.monotonic()
        return out

    def closed_cause(self) -> str:
        """Why a connection that ended without the final event did."""
        return self.resume_cause or "the connection closed before the handle's final event"

    def given(self, events: list[Event], upto: int) -> None:
        """The caller stopped reading after `events[upto]`: resume after that one, not after
        the last event fed."""
        last = None
        for event in reversed(events[:upto + 1]):
            if isinstance(event, (Row, Gap, Notice, End)) and event.id is not None:
                last = event.id
                break
        if last is not None:
            self.last_event_id = last

    def idle(self) -> bool:
        """No event (heartbeats aside) for `idle_timeout` seconds: a reader that asked to stop
        then (`idle_timeout`) has read what there was."""
        timeout = self.options.idle_timeout
        return timeout is not None and time.monotonic() - self.last_event_at >= timeout

    def lost(self, cause: str, wait: float | None = None) -> Disconnected:
        """The connection in use ended before the final event (or could not be made):
        `Disconnected` with the time to wait before the next attempt; `ConnectionLost` once
        `reconnect_timeout` has passed; `Unreachable` when no connection was ever made (nothing
        to resume: the gateway or the URL is wrong), unless the gateway asked to wait (`wait`)."""
        now = time.monotonic()
        if not self.connected and wait is None:
            raise Unreachable(_origin(self.ref.url), cause)
        if self.lost_at is None:
            self.lost_at = now
        limit = self.options.reconnect_timeout
        if limit is not None and now - self.lost_at >= limit:
            raise ConnectionLost(f"cannot read {self.ref.shown} again after {limit:g} s: "
                                 f"{cause}", self.last_event_id)
        self.attempt += 1
        delay = min(FIRST_DELAY * 2 ** (self.attempt - 1), MAX_DELAY) if wait is None else wait
        if limit is not None:
            delay = max(0.0, min(delay, self.lost_at + limit - now))
        self._pending = b""
        self.resume_cause = None
        return Disconnected(cause, self.attempt, delay, self.last_event_id)


def _decoded(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        raise XsgError(f"the gateway sent a line that is not JSON: {line[:200]!r}") from None


def transport_cause(exc: BaseException) -> str:
    """A network error as a message says it."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = ["Settings", "HandleRef", "handle_ref", "Grant", "HandleInfo", "ReadToken",
           "ReadOptions", "ReadState", "RetryLater", "failure", "json_object", "retry_after",
           "transport_cause", "DEFAULT_URL", "NDJSON", "TRANSIENT"]
