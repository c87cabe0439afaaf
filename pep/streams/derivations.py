"""The catalogue's record of derived streams (issue 48): which stream each derives from, through
which handle, under which plan and policies, and whether its feed still runs.

A row is written in the same transaction as the derived stream's registration
(`StreamCatalog.register`), ended (never removed) when its feed stops (`end`: the deriving
handle ended, the grant option went), and removed with the derived stream itself
(`StreamCatalog.finish_delete`). The rows are few (one per derived stream) and read on every
append and every decision about a derived stream, so they are also kept in memory, written only
through this object after their transaction committed (as the catalogue keeps its visibilities).

The handle id is the capability of the deriving consumer's handle: it stays in this table (as it
does in the handles' own) and is never shown, logged or audited (`pep.core.refs.handle_ref`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import NotRequired, TypedDict

from common.db import Cursor, Database
from pep.audit.trail import PolicyVersion
from pep.core.explain import AnyPlanJson
from pep.core.plan import ExecutionPlan, plan_from_json

LIVE = "live"
ENDED = "ended"
COLUMNS = ("stream, owner, source, handle_id, plan_json, plan_key, policy_ids, created_at,"
           " state, ended_at, reason")
MAX_CHAIN = 64  # upstream streams followed (a chain cannot loop: a stream is derived once)


class FeedStats(TypedDict):
    """What a derived stream's feed did: rows and batches appended, records left out."""

    rows: int
    batches: int
    left_out: int


class DerivationView(TypedDict):
    """A derivation as `GET /streams/<name>/derivation` shows it (never its handle id): the
    record and the `chain` of streams it derives from, nearest first, and what this reader may
    see of the rest (`pep.streams.derived.DerivedStreams.chain_view`): the deriving plan, what
    the stream holds, the policies that decided the grant, the feed's figures, and `reason`
    (why it ended)."""

    stream: str
    owner: str
    source: str
    created_at: str
    state: str
    ended_at: str | None
    reason: NotRequired[str | None]
    chain: list[str]
    plan: NotRequired[AnyPlanJson]
    holds: NotRequired[dict[str, object]]
    policies: NotRequired[list[PolicyVersion]]
    fed: NotRequired[FeedStats]


@dataclass(frozen=True)
class DerivationRecord:
    """One derived stream: `stream` (owned by `owner`) is fed by handle `handle_id` on `source`,
    whose plan (as it runs) is `plan_json` and whose decided key is `plan_key`; `policy_ids`
    decided that handle's grant (the source owner's policies)."""

    stream: str
    owner: str
    source: str
    handle_id: str
    plan_json: str
    plan_key: str
    policy_ids: tuple[str, ...]
    created_at: str
    state: str = LIVE
    ended_at: str | None = None
    reason: str | None = None

    @property
    def live(self) -> bool:
        return self.state == LIVE

    @property
    def plan(self) -> ExecutionPlan:
        return plan_from_json(self.plan_json)

    def summary(self, chain: list[str]) -> DerivationView:
        """The record as its derived stream's owner and administrators read it (no handle id),
        with the `chain` it derives from."""
        return {"stream": self.stream, "owner": self.owner, "source": self.source,
                "created_at": self.created_at, "state": self.state,
                "ended_at": self.ended_at, "reason": self.reason, "chain": chain}


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _record(row: tuple[object, ...]) -> DerivationRecord:
    (stream, owner, source, handle_id, plan_json, plan_key, policy_ids, created_at, state,
     ended_at, reason) = row
    return DerivationRecord(str(stream), str(owner), str(source), str(handle_id), str(plan_json),
                            str(plan_key), tuple(json.loads(str(policy_ids))), str(created_at),
                            str(state), None if ended_at is None else str(ended_at),
                            None if reason is None else str(reason))


class DerivationTable:
    """The `derivations` table of the catalogue's database (module docstring)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._lock = db.lock
        self._by_name: dict[str, DerivationRecord] = {
            r.stream.lower(): r for r in map(_record, db.fetchall(
                f"SELECT {COLUMNS} FROM derivations"))}

    # -- writes (the catalogue's transactions, then memory) ----------------------------------------

    @staticmethod
    def insert(cur: Cursor, record: DerivationRecord) -> None:
        """Write a new derivation inside the caller's transaction (the stream's registration);
        `remember` it once that committed."""
        cur.execute(f"INSERT INTO derivations ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (record.stream, record.owner, record.source, record.handle_id,
                     record.plan_json, record.plan_key, json.dumps(list(record.policy_ids)),
                     record.created_at, record.state, record.ended_at, record.reason))

    def remember(self, record: DerivationRecord) -> None:
        with self._lock:
            self._by_name[record.stream.lower()] = record

    @staticmethod
    def remove(cur: Cursor, stream: str) -> None:
        """Remove a derived stream's row inside the caller's transaction (its deletion);
        `forget` it once that committed."""
        cur.execute("DELETE FROM derivations WHERE stream = ?", (stream,))

    def forget(self, stream: str) -> None:
        with self._lock:
            self._by_name.pop(stream.lower(), None)

    def end(self, stream: str, reason: str) -> DerivationRecord | None:
        """Mark a live derivation ended (its feed stops for good); the record as ended, None
        when it was not live."""
        with self._lock:
            record = self._by_name.get(stream.lower())
            if record is None or not record.live:
                return None
            ended = replace(record, state=ENDED, ended_at=now(), reason=reason)
            with self._db.transaction() as cur:
                cur.execute("UPDATE derivations SET state = ?, ended_at = ?, reason = ?"
                            " WHERE stream = ?", (ENDED, ended.ended_at, reason, record.stream))
            self._by_name[stream.lower()] = ended
            return ended

    # -- reads (memory) ---------------------------------------------------------------------------

    def get(self, stream: str) -> DerivationRecord | None:
        """The derivation of `stream` (live or ended), None for a stream that is not derived."""
        return self._by_name.get(stream.lower()) if isinstance(stream, str) else None

    def fed_by(self, handle_id: str) -> list[DerivationRecord]:
        """The live derivations this handle feeds."""
        return [r for r in list(self._by_name.values()) if r.live and r.handle_id == handle_id]

    def live(self) -> list[DerivationRecord]:
        return [r for r in list(self._by_name.values()) if r.live]

    def all(self) -> list[DerivationRecord]:
        return sorted(self._by_name.values(), key=lambda r: r.stream.lower())

    def chain(self, stream: str) -> list[str]:
        """The streams `stream` derives from, nearest first ([] for a stream that is not
        derived): its source, that source's source, ..."""
        out: list[str] = []
        record = self.get(stream)
        while record is not None and len(out) < MAX_CHAIN:
            out.append(record.source)
            record = self.get(record.source)
        return out


__all__ = ["DerivationRecord", "DerivationTable", "LIVE", "ENDED"]
