"""Handles: the URI a consumer reads its authorised stream from, while the policy allows it.

Three parts, each with one job:

- `HandleRecord` / `HandleStore`: what was granted to whom (subject and roles at the time, the
  stored request and user query so that it can be decided again, the plan and its key, the
  policies it depended on) and the handle's state, persisted in SQLite. States:
  `live` -> `revoked` (the policy no longer allows it), `released` (its owner let it go) or
  `ended` (the gateway could not keep it: stream gone, restart without permission, runtime
  failure). Terminal states never change again; the transition is one conditional UPDATE.

- `HandleBuffer`: a bounded ring of result rows per handle. It holds at most `max_rows` rows
  and `max_bytes` of their JSON; when full, the OLDEST rows are dropped. Readers are cursors
  (the id of the last event they saw), not consumers: a reader that reconnects with
  `Last-Event-ID` gets what followed, and if some of that was dropped meanwhile it first gets
  a `gap` event saying how many rows it lost. Event ids grow strictly per handle, also across
  restarts: after the n-th restart ids start at n * 2**40, so a reader resuming with an id from
  before a restart gets a `gap` with an unknown count (the rows in memory died with the process).
  Closing the buffer (revocation, release) DISCARDS rows not yet read, then appends the final
  event: nothing of a revoked handle is delivered after the revocation returns.

- `HandleService`: opens handles (one window per subject and stream, the runtime attach) and
  ends them. The runtime's deliver callback is `HandleBuffer.put`, which checks under the
  buffer's lock that the buffer is open before writing, and the buffer is closed (under that
  same lock) before the handle's state is persisted and before the runtime is told to detach:
  so no tuple is delivered after `revoke` returns, however long Spark takes to stop.
"""
from __future__ import annotations

import json
import logging
import math
import secrets
import sqlite3
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from pep.errors import RefusedError
from pep.plan import ExecutionPlan, StreamDefinition

log = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 10_000
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
GENERATION_SPAN = 2 ** 40  # event ids of generation g are in (g * span, (g + 1) * span]


# `shutdown` closes readers when the process stops; the handle itself stays live and resumes.
FINAL_EVENTS = ("revoked", "released", "ended", "shutdown")


class HandleState(str, Enum):
    LIVE = "live"
    REVOKED = "revoked"
    RELEASED = "released"
    ENDED = "ended"


TERMINAL_STATES = (HandleState.REVOKED, HandleState.RELEASED, HandleState.ENDED)


def new_handle_id() -> str:
    """256 random bits, URL-safe: the id is the capability's secret part, so never guessable."""
    return secrets.token_urlsafe(32)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class StoredRequest:
    """What the consumer sent, kept so that the decision can be made again later."""

    body: bytes
    media_type: str
    user_query: bytes | None = None
    user_query_type: str | None = None


@dataclass(frozen=True)
class HandleRecord:
    id: str
    subject: str
    roles: tuple[str, ...]
    admin: bool
    stream: str
    plan_json: str
    plan_key: str
    policy_ids: tuple[str, ...]
    request: StoredRequest
    state: HandleState = HandleState.LIVE
    reason: str | None = None
    created_at: str = field(default_factory=_now)
    updated_at: str | None = None
    generation: int = 0

    @property
    def live(self) -> bool:
        return self.state is HandleState.LIVE

    def summary(self, base_url: str) -> dict:
        """JSON for its owner (never the stored request: it can be large)."""
        return {"id": self.id, "handle": f"{base_url}/handles/{self.id}", "stream": self.stream,
                "state": self.state.value, "reason": self.reason, "created_at": self.created_at,
                "updated_at": self.updated_at, "plan": json.loads(self.plan_json),
                "policy_ids": list(self.policy_ids)}


class HandleStore:
    """Handle records in SQLite (WAL, synchronous=FULL: a committed state change survives a crash)."""

    _COLUMNS = ("id, subject, roles, admin, stream, plan_json, plan_key, policy_ids, request_body,"
                " request_media_type, user_query, user_query_type, state, reason, created_at,"
                " updated_at, generation")

    def __init__(self, db_path: str | Path) -> None:
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(db_path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS handles ("
            " id TEXT PRIMARY KEY, subject TEXT NOT NULL, roles TEXT NOT NULL,"
            " admin INTEGER NOT NULL, stream TEXT NOT NULL, plan_json TEXT NOT NULL,"
            " plan_key TEXT NOT NULL, policy_ids TEXT NOT NULL, request_body BLOB NOT NULL,"
            " request_media_type TEXT NOT NULL, user_query BLOB, user_query_type TEXT,"
            " state TEXT NOT NULL, reason TEXT, created_at TEXT NOT NULL, updated_at TEXT,"
            " generation INTEGER NOT NULL DEFAULT 0)")
        self._db.execute("CREATE INDEX IF NOT EXISTS handles_subject ON handles (subject)")
        self._db.execute("CREATE INDEX IF NOT EXISTS handles_state ON handles (state)")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @staticmethod
    def _record(row: tuple) -> HandleRecord:
        (hid, subject, roles, admin, stream, plan_json, plan_key, policy_ids, body, media_type,
         user_query, user_query_type, state, reason, created_at, updated_at, generation) = row
        return HandleRecord(
            id=hid, subject=subject, roles=tuple(json.loads(roles)), admin=bool(admin),
            stream=stream, plan_json=plan_json, plan_key=plan_key,
            policy_ids=tuple(json.loads(policy_ids)),
            request=StoredRequest(bytes(body), media_type,
                                  bytes(user_query) if user_query is not None else None,
                                  user_query_type),
            state=HandleState(state), reason=reason, created_at=created_at,
            updated_at=updated_at, generation=generation)

    def insert(self, r: HandleRecord) -> None:
        with self._lock:
            self._db.execute(
                f"INSERT INTO handles ({self._COLUMNS}) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (r.id, r.subject, json.dumps(list(r.roles)), int(r.admin), r.stream, r.plan_json,
                 r.plan_key, json.dumps(sorted(r.policy_ids)), r.request.body,
                 r.request.media_type, r.request.user_query, r.request.user_query_type,
                 r.state.value, r.reason, r.created_at, r.updated_at, r.generation))

    def get(self, handle_id: str) -> HandleRecord | None:
        if not isinstance(handle_id, str) or len(handle_id) > 200:
            return None
        with self._lock:
            row = self._db.execute(f"SELECT {self._COLUMNS} FROM handles WHERE id = ?",
                                   (handle_id,)).fetchone()
        return self._record(row) if row else None

    def for_subject(self, subject: str) -> list[HandleRecord]:
        with self._lock:
            rows = self._db.execute(f"SELECT {self._COLUMNS} FROM handles WHERE subject = ?"
                                    " ORDER BY created_at, id", (subject,)).fetchall()
        return [self._record(r) for r in rows]

    def live(self) -> list[HandleRecord]:
        with self._lock:
            rows = self._db.execute(f"SELECT {self._COLUMNS} FROM handles WHERE state = 'live'"
                                    " ORDER BY created_at, id").fetchall()
        return [self._record(r) for r in rows]

    def finish(self, handle_id: str, state: HandleState, reason: str | None) -> bool:
        """live -> a terminal state; False when the handle was not live (nothing changes)."""
        if state not in TERMINAL_STATES:
            raise ValueError(f"{state} is not a terminal state")
        with self._lock:
            cur = self._db.execute(
                "UPDATE handles SET state = ?, reason = ?, updated_at = ? "
                "WHERE id = ? AND state = 'live'", (state.value, reason, _now(), handle_id))
            return cur.rowcount == 1

    def set_policy_ids(self, handle_id: str, policy_ids: Iterable[str]) -> None:
        with self._lock:
            self._db.execute("UPDATE handles SET policy_ids = ?, updated_at = ? WHERE id = ?",
                             (json.dumps(sorted(policy_ids)), _now(), handle_id))

    def next_generation(self, handle_id: str) -> int:
        with self._lock:
            self._db.execute("UPDATE handles SET generation = generation + 1 WHERE id = ?",
                             (handle_id,))
            row = self._db.execute("SELECT generation FROM handles WHERE id = ?",
                                   (handle_id,)).fetchone()
        return int(row[0]) if row else 0


# -- the bounded buffer -----------------------------------------------------------------------------

def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if hasattr(value, "item"):  # numpy / pandas scalars
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def row_json(row: dict) -> str:
    """A result row as compact JSON; NaN and infinities (e.g. avg of nothing) become null."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in row.items()}
    return json.dumps(clean, separators=(",", ":"), default=_json_default, allow_nan=False)


@dataclass(frozen=True)
class Event:
    """One thing a reader receives: a row (`kind == "row"`), a `gap`, or a final event
    (`revoked`, `released`, `ended`); `data` is JSON text."""

    id: int
    kind: str
    data: str

    @property
    def final(self) -> bool:
        return self.kind in FINAL_EVENTS


class HandleBuffer:
    """Bounded, thread-safe ring of one handle's results (see the module docstring)."""

    def __init__(self, max_rows: int = DEFAULT_MAX_ROWS, max_bytes: int = DEFAULT_MAX_BYTES,
                 generation: int = 0) -> None:
        if max_rows < 1 or max_bytes < 1:
            raise ValueError("a buffer must hold at least one row")
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.base = generation * GENERATION_SPAN
        self._cond = threading.Condition(threading.Lock())
        self._rows: deque[tuple[int, str]] = deque()
        self._bytes = 0
        self._last = self.base  # id of the newest event
        self._floor = self.base  # every row id <= floor has been dropped (or never existed)
        self._final: Event | None = None
        self.dropped = 0  # rows dropped because the buffer was full

    @property
    def closed(self) -> bool:
        return self._final is not None

    @property
    def last_id(self) -> int:
        return self._last

    def __len__(self) -> int:
        with self._cond:
            return len(self._rows)

    def put(self, rows: Iterable[dict]) -> bool:
        """Append result rows; False once the buffer is closed (the runtime then stops sending).

        The closed check and the write happen under one lock, the same one `close` takes: that
        is the check-before-each-write that makes revocation exact.
        """
        encoded = [row_json(r) for r in rows]  # outside the lock: encoding can be slow
        with self._cond:
            if self._final is not None:
                return False
            for text in encoded:
                size = len(text.encode("utf-8")) if not text.isascii() else len(text)
                self._last += 1
                self._rows.append((self._last, text))
                self._bytes += size
            while self._rows and (len(self._rows) > self.max_rows or self._bytes > self.max_bytes):
                rid, text = self._rows.popleft()
                self._bytes -= len(text.encode("utf-8")) if not text.isascii() else len(text)
                self._floor = rid
                self.dropped += 1
            if encoded:
                self._cond.notify_all()
            return True

    def close(self, kind: str, reason: str | None = None) -> bool:
        """Discard unread rows and append the final event; False if it was already closed."""
        with self._cond:
            if self._final is not None:
                return False
            self._rows.clear()
            self._bytes = 0
            self._floor = self._last
            self._last += 1
            self._final = Event(self._last, kind, json.dumps({"event": kind, "reason": reason}))
            self._cond.notify_all()
            return True

    def read(self, after: int | None = None, timeout: float | None = None,
             limit: int = 1000) -> list[Event]:
        """Events after the id `after` (None or 0: from the oldest kept row), waiting up to
        `timeout` seconds for one; [] on timeout. A `gap` event comes first when rows the reader
        had not seen were dropped. After the final event nothing more ever comes."""
        after = self.base if after is None or after < 0 else after
        with self._cond:
            if self._final is None and after > self._last:
                after = self._last  # an id this buffer never issued: read from now on
            if not self._has_after(after):
                self._cond.wait_for(lambda: self._has_after(after), timeout)
            events: list[Event] = []
            if self._final is not None:
                if after < self._final.id:
                    events.append(self._final)
                return events
            if after < self._floor:
                lost = self._floor - after if after >= self.base else None
                events.append(Event(self._floor, "gap", json.dumps(
                    {"event": "gap", "lost": lost, "resume_from": self._floor,
                     "reason": "buffer full" if lost is not None else "gateway restarted"})))
            start = max(after, self._floor)
            if self._rows:
                first = self._rows[0][0]
                index = start + 1 - first
                for i in range(max(index, 0), min(len(self._rows), max(index, 0) + limit)):
                    rid, text = self._rows[i]
                    events.append(Event(rid, "row", text))
            return events

    def _has_after(self, after: int) -> bool:
        if self._final is not None:
            return after < self._final.id
        return after < self._last and self._last > self.base


# -- the service ---------------------------------------------------------------------------------------

class HandleError(RefusedError):
    """A handle operation was refused (status and message for the HTTP answer)."""


class StalePolicies(Exception):
    """The policies changed between the decision and the handle's creation: decide again."""


class Runtime(Protocol):
    def attach(self, handle_id: str, stream: StreamDefinition, plan: ExecutionPlan,
               deliver: Callable[[list[dict]], bool]) -> Any: ...

    def detach(self, handle_id: str) -> Any: ...


class WindowRegistryLike(Protocol):
    def acquire(self, subject: str, stream: str, plan_key: str) -> tuple[str, bool]: ...

    def release(self, handle_id: str) -> Any: ...

    def restore(self, subject: str, stream: str, plan_key: str, handle_id: str) -> Any: ...


def plan_from_json(data: str | dict) -> ExecutionPlan:
    """Rebuild an ExecutionPlan from its canonical JSON (to re-attach a handle after a restart)."""
    from pep.plan import Aggregate, Predicate, WindowSpec

    d = json.loads(data) if isinstance(data, str) else data
    dnf = d.get("filter_dnf")
    window = d.get("window")
    return ExecutionPlan(
        stream=d["stream"],
        filter_dnf=None if dnf is None else tuple(
            tuple(Predicate(p["attribute"], p["op"], p["value"]) for p in conj) for conj in dnf),
        projection=tuple(d.get("projection") or ()),
        window=None if window is None else WindowSpec(
            kind=window["kind"], size=int(window["size"]), step=int(window["step"]),
            aggregates=tuple(Aggregate(a["attribute"], a["function"])
                             for a in window.get("aggregates") or ()),
            time_attribute=window.get("time_attribute")))


class HandleService:
    """Opens, lists and ends handles; the only writer of handle state."""

    def __init__(self, store: HandleStore, streams: Callable[[str], StreamDefinition | None],
                 runtime: Runtime, windows: WindowRegistryLike,
                 max_rows: int = DEFAULT_MAX_ROWS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.store = store
        self.streams = streams
        self.runtime = runtime
        self.windows = windows
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        # Serialises opening and ending handles and policy re-evaluation; reads never take it.
        self.lock = threading.RLock()
        # Bumped by every policy change; a handle decided under an older epoch is not created.
        self.policy_epoch = 0
        self._buffers: dict[str, HandleBuffer] = {}
        # Called with the final record after a handle ends (state persisted, runtime detached),
        # outside the lock: e.g. to tell caching proxies that the handle is gone.
        self._listeners: list[Callable[[HandleRecord], None]] = []

    def add_listener(self, callback: Callable[[HandleRecord], None]) -> None:
        self._listeners.append(callback)

    # -- reads ------------------------------------------------------------------------------------

    def get(self, handle_id: str) -> HandleRecord | None:
        return self.store.get(handle_id)

    def get_owned(self, handle_id: str, subject: str) -> HandleRecord | None:
        """The handle if `subject` owns it, else None: others cannot even learn it exists."""
        record = self.store.get(handle_id)
        if record is None or not secrets.compare_digest(record.subject.encode(), subject.encode()):
            return None
        return record

    def buffer(self, handle_id: str) -> HandleBuffer | None:
        with self.lock:
            return self._buffers.get(handle_id)

    def list_for(self, subject: str) -> list[HandleRecord]:
        return self.store.for_subject(subject)

    def live(self) -> list[HandleRecord]:
        return self.store.live()

    # -- opening ----------------------------------------------------------------------------------

    def open(self, subject: str, roles: Iterable[str], admin: bool, plan: ExecutionPlan,
             policy_ids: Iterable[str], request: StoredRequest,
             epoch: int | None = None) -> tuple[HandleRecord, bool]:
        """A live handle for this decision: (record, True) when new, (existing, False) when the
        same subject already has a handle with the same plan on that stream.

        Raises the window registry's WindowConflict (another plan on that stream is live),
        StalePolicies (policies changed since `epoch`), HandleError (stream unknown, runtime
        refused)."""
        stream = self.streams(plan.stream)
        if stream is None:
            raise HandleError(404, f"no stream named {plan.stream!r}")
        key = plan.key()
        with self.lock:
            if epoch is not None and epoch != self.policy_epoch:
                raise StalePolicies()
            handle_id, is_new = self.windows.acquire(subject, stream.name, key)
            if not is_new:
                existing = self.store.get(handle_id)
                if existing is not None and existing.live:
                    return existing, False
                # The registry remembered a handle that is not live here: forget it, start afresh.
                self.windows.release(handle_id)
                handle_id, is_new = self.windows.acquire(subject, stream.name, key)
            record = HandleRecord(
                id=handle_id, subject=subject, roles=tuple(roles), admin=bool(admin),
                stream=stream.name, plan_json=plan.canonical_json(), plan_key=key,
                policy_ids=tuple(sorted(set(policy_ids))), request=request)
            try:
                self.store.insert(record)
            except BaseException:
                self.windows.release(handle_id)
                raise
            buffer = HandleBuffer(self.max_rows, self.max_bytes)
            self._buffers[handle_id] = buffer
        # Attaching can take seconds (the first handle starts the stream's query): not under the
        # lock, so revocations of other handles are not held up. The buffer is registered first,
        # so a revocation meanwhile closes it and the runtime can deliver nothing.
        self._attach(record.id, stream, plan, buffer)
        return record, True

    def _attach(self, handle_id: str, stream: StreamDefinition, plan: ExecutionPlan,
                buffer: HandleBuffer) -> None:
        try:
            self.runtime.attach(handle_id, stream, plan, buffer.put)
        except Exception as exc:
            log.exception("runtime refused handle %s", handle_id)
            self._finish(handle_id, HandleState.ENDED, f"the stream runtime failed: {exc}")
            raise HandleError(503, f"the stream runtime could not start the query: {exc}") \
                from None
        with self.lock:
            finished_meanwhile = self._buffers.get(handle_id) is not buffer
        if finished_meanwhile:
            self._detach(handle_id)

    def resume(self, record: HandleRecord, policy_ids: Iterable[str] | None = None) -> bool:
        """Re-attach a live handle after a restart; False (and the handle ended) if impossible."""
        with self.lock:
            stream = self.streams(record.stream)
            if stream is None:
                self._finish(record.id, HandleState.ENDED, "its stream no longer exists")
                return False
            try:
                plan = plan_from_json(record.plan_json)
            except (KeyError, TypeError, ValueError) as exc:
                self._finish(record.id, HandleState.ENDED, f"its stored plan is unreadable: {exc}")
                return False
            generation = self.store.next_generation(record.id)
            try:
                self.windows.restore(record.subject, record.stream, record.plan_key, record.id)
            except Exception as exc:  # noqa: BLE001 - e.g. two live handles for one window
                self._finish(record.id, HandleState.ENDED, f"cannot restore its window: {exc}")
                return False
            if policy_ids is not None:
                self.store.set_policy_ids(record.id, policy_ids)
            buffer = HandleBuffer(self.max_rows, self.max_bytes, generation=generation)
            self._buffers[record.id] = buffer
        try:
            self._attach(record.id, stream, plan, buffer)
        except HandleError:
            return False
        return True

    # -- ending -----------------------------------------------------------------------------------

    def revoke(self, handle_id: str, reason: str) -> bool:
        return self._finish(handle_id, HandleState.REVOKED, reason)

    def end(self, handle_id: str, reason: str) -> bool:
        return self._finish(handle_id, HandleState.ENDED, reason)

    def release(self, handle_id: str, subject: str) -> HandleRecord | None:
        """The owner lets the handle go; None if it is not theirs. Idempotent on ended handles."""
        record = self.get_owned(handle_id, subject)
        if record is None:
            return None
        self._finish(handle_id, HandleState.RELEASED, "released by its owner")
        return self.store.get(handle_id)

    def set_policy_ids(self, handle_id: str, policy_ids: Iterable[str]) -> None:
        self.store.set_policy_ids(handle_id, policy_ids)

    def _finish(self, handle_id: str, state: HandleState, reason: str) -> bool:
        """Close the buffer first (no write passes after this), then persist, free the window,
        and detach from the runtime before returning. False when the handle was not live."""
        with self.lock:
            buffer = self._buffers.pop(handle_id, None)
            if buffer is not None:
                buffer.close(state.value, reason)
            changed = self.store.finish(handle_id, state, reason)
            if buffer is None and not changed:
                return False
            try:
                self.windows.release(handle_id)
            except Exception:  # noqa: BLE001 - the handle is ended whatever the registry says
                log.exception("window registry release failed for %s", handle_id)
        self._detach(handle_id)
        if changed and self._listeners:
            record = self.store.get(handle_id)
            for callback in list(self._listeners):
                try:
                    callback(record)
                except Exception:  # noqa: BLE001 - a listener must not undo an ended handle
                    log.exception("handle listener failed for %s", handle_id)
        return changed

    def _detach(self, handle_id: str) -> None:
        try:
            self.runtime.detach(handle_id)
        except Exception:  # noqa: BLE001 - the buffer is closed; nothing more is delivered
            log.exception("runtime detach failed for %s", handle_id)

    def shutdown(self) -> None:
        """Process exit: buffers close with `ended`, but handles stay live in the store so that
        the next start re-evaluates and resumes them."""
        with self.lock:
            for hid, buffer in list(self._buffers.items()):
                buffer.close("shutdown", "the gateway is stopping; reconnect after its restart")
            self._buffers.clear()


__all__ = ["HandleState", "HandleRecord", "StoredRequest", "HandleStore", "HandleBuffer", "Event",
           "HandleService", "HandleError", "StalePolicies", "new_handle_id", "row_json",
           "plan_from_json", "GENERATION_SPAN", "DEFAULT_MAX_ROWS", "DEFAULT_MAX_BYTES"]
