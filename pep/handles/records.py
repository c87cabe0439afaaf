"""Handle records: what was granted to whom, persisted so that it can be decided again.

A record keeps the subject and roles at the time, the stored request and user query (so the
decision can be made again), the plan and its key, the policies it depended on, and the
handle's state: `live` -> `revoked` (the policy no longer allows it), `released` (its owner let
it go) or `ended` (the gateway could not keep it: stream gone, restart without permission,
runtime failure). Terminal states never change again; the transition is one conditional UPDATE.

A handle of a stream that was deleted is kept, but listed in `deleted_stream_handles`
(`bury`): it belonged to that stream, not to its name, so it is not its owner's to see any more,
whether or not the name is registered again (`for_subject` leaves it out, `buried` says so).
"""
from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from functools import lru_cache
from pathlib import Path
from typing import TypedDict

from common.db import Database, Row, open_database, opening, upsert_sql
from common.migrations import Schema, Step, migrate
from pep.core.explain import AnyPlanJson, plan_to_json
from pep.core.plan import any_plan_from_json, is_join_json
from pep.core.refs import possible_handle_id


class HandleState(str, Enum):
    LIVE = "live"
    REVOKED = "revoked"
    RELEASED = "released"
    ENDED = "ended"


TERMINAL_STATES = (HandleState.REVOKED, HandleState.RELEASED, HandleState.ENDED)


def new_handle_id() -> str:
    """256 random bits, URL-safe: the id is the capability's secret part, so never guessable.
    Never one that begins with '-': a command line (`xsg stream derive <handle> <name>`) took
    such an id for an option, one id in 64 (drawing again costs no bit of the 256)."""
    while True:
        handle_id = secrets.token_urlsafe(32)
        if not handle_id.startswith("-"):
            return handle_id


def record_time() -> str:
    """Now, as a record's created_at and updated_at hold it."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


_now = record_time


@dataclass(frozen=True)
class StoredRequest:
    """What the consumer sent, kept so that the decision can be made again later."""

    body: bytes
    media_type: str
    user_query: bytes | None = None
    user_query_type: str | None = None


class HandleSummary(TypedDict):
    """A handle as its owner reads it (`GET /handles`, `GET /handles/<id>/info`)."""

    id: str
    handle: str
    stream: str
    streams: list[str]
    state: str
    reason: str | None
    created_at: str
    updated_at: str | None
    plan: AnyPlanJson
    policy_ids: list[str]


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

    @property
    def streams(self) -> tuple[str, ...]:
        """Every stream the handle reads: its own, or a join's two (the first is `stream`)."""
        if is_join_json(self.plan_json):
            join = json.loads(self.plan_json)["join"]
            return (join["left"]["stream"], join["right"]["stream"])
        return (self.stream,)

    def ended(self, state: HandleState, reason: str | None, at: str) -> HandleRecord:
        """This record as `HandleStore.finish_many` leaves it (state, reason, updated_at): what
        a pass tells the listeners without reading a thousand records back. Built field by
        field (twice as fast as dataclasses.replace); a test checks it against replace()."""
        return HandleRecord(
            id=self.id, subject=self.subject, roles=self.roles, admin=self.admin,
            stream=self.stream, plan_json=self.plan_json, plan_key=self.plan_key,
            policy_ids=self.policy_ids, request=self.request, state=state, reason=reason,
            created_at=self.created_at, updated_at=at, generation=self.generation)

    def summary(self, base_url: str) -> HandleSummary:
        """JSON for its owner (never the stored request: it can be large). The plan has the
        shape POST /requests and POST /explain give it."""
        return {"id": self.id, "handle": f"{base_url}/handles/{self.id}", "stream": self.stream,
                "streams": list(self.streams), "state": self.state.value, "reason": self.reason,
                "created_at": self.created_at, "updated_at": self.updated_at,
                "plan": plan_to_json(any_plan_from_json(self.plan_json)),
                "policy_ids": list(self.policy_ids)}


_INDEXES = ("CREATE INDEX IF NOT EXISTS handles_subject ON handles (subject)",
            "CREATE INDEX IF NOT EXISTS handles_state ON handles (state)",
            "CREATE INDEX IF NOT EXISTS handles_stream ON handles (stream, state)")
# The handles' versioned schema (`common.migrations`); on PostgreSQL the texts a handle list is
# ordered by compare as bytes, as SQLite's do. `deleted_stream_handles`: the handles of deleted
# streams (`bury`). `gateway_keys` holds keys the gateway makes once and every process on the
# store shares (the read tokens' HMAC key: `shared_key`).
SCHEMA = Schema("handles", (
    Step("handle records",
         sqlite=("""CREATE TABLE IF NOT EXISTS handles (
    id TEXT PRIMARY KEY, subject TEXT NOT NULL, roles TEXT NOT NULL,
    admin INTEGER NOT NULL, stream TEXT NOT NULL, plan_json TEXT NOT NULL,
    plan_key TEXT NOT NULL, policy_ids TEXT NOT NULL, request_body BLOB NOT NULL,
    request_media_type TEXT NOT NULL, user_query BLOB, user_query_type TEXT,
    state TEXT NOT NULL, reason TEXT, created_at TEXT NOT NULL, updated_at TEXT,
    generation INTEGER NOT NULL DEFAULT 0)""", *_INDEXES,
                 "CREATE TABLE IF NOT EXISTS deleted_stream_handles (id TEXT PRIMARY KEY,"
                 " stream TEXT NOT NULL, deleted_at TEXT NOT NULL)"),
         postgresql=("""CREATE TABLE handles (
    id TEXT COLLATE "C" PRIMARY KEY, subject TEXT NOT NULL, roles TEXT NOT NULL,
    admin INTEGER NOT NULL, stream TEXT NOT NULL, plan_json TEXT NOT NULL,
    plan_key TEXT NOT NULL, policy_ids TEXT NOT NULL, request_body BYTEA NOT NULL,
    request_media_type TEXT NOT NULL, user_query BYTEA, user_query_type TEXT,
    state TEXT NOT NULL, reason TEXT, created_at TEXT COLLATE "C" NOT NULL, updated_at TEXT,
    generation BIGINT NOT NULL DEFAULT 0)""", *_INDEXES,
                     "CREATE TABLE deleted_stream_handles (id TEXT COLLATE \"C\" PRIMARY KEY,"
                     " stream TEXT NOT NULL, deleted_at TEXT NOT NULL)")),
    Step("keys the gateway's processes share",
         sqlite=("CREATE TABLE gateway_keys (name TEXT PRIMARY KEY, value TEXT NOT NULL)",),
         postgresql=("CREATE TABLE gateway_keys (name TEXT PRIMARY KEY, value TEXT NOT NULL)",)),
))


_STATES = {state.value: state for state in HandleState}


@lru_cache(maxsize=4096)
def _texts(encoded: str) -> tuple[str, ...]:
    """A JSON list of texts (roles, policy ids) as a tuple. Memoised: a pass loads a thousand
    handles whose lists are mostly the same few, and the answer is a pure function of the text
    (an immutable tuple, so sharing it is safe)."""
    return tuple(json.loads(encoded))


class HandleStore:
    """Handle records in their store (SQLite, WAL and synchronous=FULL, or PostgreSQL: a
    committed state change survives a crash). `where`: the store's database, or the path of
    its SQLite file."""

    _COLUMNS = ("id, subject, roles, admin, stream, plan_json, plan_key, policy_ids, request_body,"
                " request_media_type, user_query, user_query_type, state, reason, created_at,"
                " updated_at, generation")

    def __init__(self, where: Database | str | Path) -> None:
        with opening("handle store", str(where)):
            self._db = open_database(where, "handles")
        try:
            with opening("handle store", self._db.describe()):
                migrate(self._db, SCHEMA)
        except BaseException:
            self._db.close()
            raise

    def shared_key(self, name: str) -> str:
        """The key called `name` that every process on this store shares: made (256 random
        bits) by the first that asks, read by the others."""
        with self._db.transaction() as cur:
            cur.execute(upsert_sql("gateway_keys", ("name", "value"), ("name",), update=()),
                        (name, secrets.token_urlsafe(32)))
            row = cur.execute("SELECT value FROM gateway_keys WHERE name = ?",
                              (name,)).fetchone()
        return str(row[0])

    def close(self) -> None:
        self._db.close()

    @staticmethod
    def _record(row: Row) -> HandleRecord:
        (hid, subject, roles, admin, stream, plan_json, plan_key, policy_ids, body, media_type,
         user_query, user_query_type, state, reason, created_at, updated_at, generation) = row
        return HandleRecord(
            id=hid, subject=subject, roles=_texts(roles), admin=bool(admin),
            stream=stream, plan_json=plan_json, plan_key=plan_key,
            policy_ids=_texts(policy_ids),
            request=StoredRequest(bytes(body), media_type,
                                  bytes(user_query) if user_query is not None else None,
                                  user_query_type),
            state=_STATES.get(state) or HandleState(state), reason=reason,
            created_at=created_at, updated_at=updated_at, generation=generation)

    def insert(self, r: HandleRecord) -> None:
        self._db.execute(
            f"INSERT INTO handles ({self._COLUMNS}) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r.id, r.subject, json.dumps(list(r.roles)), int(r.admin), r.stream, r.plan_json,
             r.plan_key, json.dumps(sorted(r.policy_ids)), r.request.body,
             r.request.media_type, r.request.user_query, r.request.user_query_type,
             r.state.value, r.reason, r.created_at, r.updated_at, r.generation))

    def get(self, handle_id: str) -> HandleRecord | None:
        if not possible_handle_id(handle_id):
            return None
        row = self._db.fetchone(f"SELECT {self._COLUMNS} FROM handles WHERE id = ?",
                                (handle_id,))
        return self._record(row) if row else None

    def for_subject(self, subject: str) -> list[HandleRecord]:
        """The subject's handles, but those of deleted streams (`bury`)."""
        rows = self._db.fetchall(f"SELECT {self._COLUMNS} FROM handles WHERE subject = ?"
                                 " AND id NOT IN (SELECT id FROM deleted_stream_handles)"
                                 " ORDER BY created_at, id", (subject,))
        return [self._record(r) for r in rows]

    def on_stream(self, stream: str) -> list[str]:
        """The ids of every handle, in any state, that reads `stream` (a join's on either
        side); names compared case-insensitively, as the catalogue looks streams up."""
        name = stream.lower()
        rows = self._db.fetchall(
            f"SELECT {self._COLUMNS} FROM handles WHERE lower(stream) = ?"
            " OR plan_json LIKE '{\"join\":%'", (name,))
        return [r.id for r in map(self._record, rows)
                if any(s.lower() == name for s in r.streams)]

    def bury(self, handle_ids: Iterable[str], stream: str) -> None:
        """These handles belonged to `stream`, which is being deleted (module docstring)."""
        now = _now()
        with self._db.transaction() as cur:
            for handle_id in handle_ids:
                cur.execute(upsert_sql("deleted_stream_handles", ("id", "stream", "deleted_at"),
                                       ("id",), update=()), (handle_id, stream, now))

    def unbury(self, handle_ids: Iterable[str]) -> None:
        """The deletion failed and the stream is back: its handles are its owners' again."""
        with self._db.transaction() as cur:
            for handle_id in handle_ids:
                cur.execute("DELETE FROM deleted_stream_handles WHERE id = ?", (handle_id,))

    def buried(self, handle_id: str) -> bool:
        return self._db.fetchone("SELECT 1 FROM deleted_stream_handles WHERE id = ?",
                                 (handle_id,)) is not None

    def live(self) -> list[HandleRecord]:
        rows = self._db.fetchall(f"SELECT {self._COLUMNS} FROM handles WHERE state = 'live'"
                                 " ORDER BY created_at, id")
        return [self._record(r) for r in rows]

    def live_on(self, streams: Iterable[str]) -> list[HandleRecord]:
        """The live handles that may read one of `streams`: those on them, and every join
        (whose second stream is in its plan; the caller checks `HandleRecord.streams`). Read
        through the stream index: the cost follows these handles, not all live ones."""
        names = sorted(set(streams))
        found: dict[str, HandleRecord] = {}
        for start in range(0, len(names), 500):  # SQLite's bound on parameters per statement
            chunk = names[start:start + 500]
            marks = ", ".join("?" * len(chunk))
            for row in self._db.fetchall(
                    f"SELECT {self._COLUMNS} FROM handles WHERE state = 'live' "
                    f"AND stream IN ({marks})", chunk):
                record = self._record(row)
                found[record.id] = record
        for row in self._db.fetchall(
                f"SELECT {self._COLUMNS} FROM handles WHERE state = 'live' "
                "AND plan_json LIKE '{\"join\":%'"):
            record = self._record(row)
            found[record.id] = record
        return sorted(found.values(), key=lambda r: (r.created_at, r.id))

    def finish(self, handle_id: str, state: HandleState, reason: str | None) -> bool:
        """live -> a terminal state; False when the handle was not live (nothing changes)."""
        return handle_id in self.finish_many([(handle_id, state, reason)])

    def finish_many(self, endings: Iterable[tuple[str, HandleState, str | None]],
                    at: str | None = None) -> set[str]:
        """Several live -> terminal transitions in one transaction; returns the ids changed.
        `at`: their updated_at (default now). An id given twice ends as its first ending says.
        One statement per (state, reason) and 500 ids (SQLite's bound on a statement's
        parameters), not one per handle: a policy's revocation of 1,000 handles spent 128 ms
        of its 277 ms in 1,000 UPDATEs on PostgreSQL, before any edge was told."""
        groups: dict[tuple[HandleState, str | None], list[str]] = {}
        seen: set[str] = set()
        for handle_id, state, reason in endings:
            if state not in TERMINAL_STATES:
                raise ValueError(f"{state} is not a terminal state")
            if handle_id not in seen:
                seen.add(handle_id)
                groups.setdefault((state, reason), []).append(handle_id)
        changed: set[str] = set()
        now = at if at is not None else _now()
        with self._db.transaction() as cur:
            for (state, reason), ids in groups.items():
                for start in range(0, len(ids), 500):
                    chunk = ids[start:start + 500]
                    marks = ", ".join("?" * len(chunk))
                    rows = cur.execute(
                        "UPDATE handles SET state = ?, reason = ?, updated_at = ? "
                        f"WHERE state = 'live' AND id IN ({marks}) RETURNING id",
                        (state.value, reason, now, *chunk)).fetchall()
                    changed.update(str(row[0]) for row in rows)
        return changed

    def get_many(self, handle_ids: Iterable[str]) -> list[HandleRecord]:
        """The records of these handles, in the order given (unknown ids left out)."""
        ids = list(handle_ids)
        found: dict[str, HandleRecord] = {}
        for start in range(0, len(ids), 500):  # SQLite's bound on parameters per statement
            chunk = ids[start:start + 500]
            marks = ", ".join("?" * len(chunk))
            for row in self._db.fetchall(
                    f"SELECT {self._COLUMNS} FROM handles WHERE id IN ({marks})", chunk):
                record = self._record(row)
                found[record.id] = record
        return [found[h] for h in ids if h in found]

    def set_policy_ids_many(self, updates: dict[str, tuple[str, ...]]) -> None:
        now = _now()
        with self._db.transaction() as cur:
            for handle_id, policy_ids in updates.items():
                cur.execute("UPDATE handles SET policy_ids = ?, updated_at = ? WHERE id = ?",
                            (json.dumps(sorted(policy_ids)), now, handle_id))

    def set_policy_ids(self, handle_id: str, policy_ids: Iterable[str]) -> None:
        self._db.execute("UPDATE handles SET policy_ids = ?, updated_at = ? WHERE id = ?",
                         (json.dumps(sorted(policy_ids)), _now(), handle_id))

    def next_generation(self, handle_id: str) -> int:
        with self._db.transaction() as cur:
            cur.execute("UPDATE handles SET generation = generation + 1 WHERE id = ?",
                        (handle_id,))
            row = cur.execute("SELECT generation FROM handles WHERE id = ?",
                              (handle_id,)).fetchone()
        return int(row[0]) if row else 0


__all__ = ["HandleState", "HandleRecord", "StoredRequest", "HandleStore", "new_handle_id",
           "TERMINAL_STATES", "record_time"]
