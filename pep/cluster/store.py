"""The cluster's tables: its processes (members) and who holds which stream (leases).

Times are the database's (`clock_timestamp()`, epoch seconds), never a process's: a lease's
expiry means the same to every process, whatever their clocks say. A lease row is
(stream, member, epoch, expires_at): `epoch` grows by one whenever the lease changes hands, the
fencing token that tells a stale holder from the current one (a renewal names its holder and
renews only a lease still valid; a lease that expired is another process's to take).

Taking leases (`claim`) is one transaction over every stream asked for (a join's two move
together, and so do a derived stream and the stream it is fed from): the rows are created when
missing, locked in name order (two claims never wait on each other in a circle), and taken only when
none is validly held by another process; then the holder is named and nothing changes.

Only PostgreSQL: several processes need one database they all reach.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from common.db import Database, opening
from common.migrations import Schema, Step, migrate

# the database's clock, in epoch seconds
NOW = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"

_MEMBERS = ("CREATE TABLE cluster_members (member TEXT PRIMARY KEY, url TEXT NOT NULL,"
            " host TEXT NOT NULL, pid INTEGER NOT NULL, started_at DOUBLE PRECISION NOT NULL,"
            " seen_at DOUBLE PRECISION NOT NULL)")
_LEASES = ("CREATE TABLE stream_leases (stream TEXT PRIMARY KEY, member TEXT NOT NULL,"
           " epoch BIGINT NOT NULL, expires_at DOUBLE PRECISION NOT NULL)")
_BOOKINGS = ("CREATE TABLE window_bookings (subject TEXT NOT NULL, stream TEXT NOT NULL,"
             " handle_id TEXT NOT NULL, plan_key TEXT NOT NULL,"
             " booked_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (subject, stream))")
_BOOKINGS_BY_HANDLE = "CREATE INDEX window_bookings_by_handle ON window_bookings (handle_id)"
# the cluster's versioned schema (`common.migrations`); SQLite is listed for the schema's tests
# only: a cluster runs on PostgreSQL
SCHEMA = Schema("cluster", (
    Step("the gateway's processes, their streams' leases, the one-window bookings",
         sqlite=(_MEMBERS.replace("DOUBLE PRECISION", "REAL"),
                 _LEASES.replace("DOUBLE PRECISION", "REAL").replace("BIGINT", "INTEGER"),
                 _BOOKINGS.replace("DOUBLE PRECISION", "REAL"), _BOOKINGS_BY_HANDLE),
         postgresql=(_MEMBERS, _LEASES.replace("stream TEXT", 'stream TEXT COLLATE "C"'),
                     _BOOKINGS, _BOOKINGS_BY_HANDLE)),
))


@dataclass(frozen=True)
class Member:
    """One gateway process of the cluster."""

    member: str
    url: str
    host: str
    pid: int
    started_at: float
    seen_at: float


@dataclass(frozen=True)
class Lease:
    stream: str
    member: str
    epoch: int
    expires_in: float  # seconds from now (negative: expired)


@dataclass
class Claim:
    """What a claim did: streams taken (-> their new epoch), streams already ours (renewed),
    or, when another process validly holds one of them, who (and nothing changed)."""

    acquired: dict[str, int] = field(default_factory=dict)
    renewed: dict[str, int] = field(default_factory=dict)
    holders: dict[str, str] = field(default_factory=dict)


class ClusterStore:
    """The members and leases of one cluster, as seen by one of its processes (`member`)."""

    def __init__(self, db: Database, member: str) -> None:
        if db.dialect.name != "postgresql":
            raise ValueError("several gateway processes need a PostgreSQL store (store = "
                             "\"postgresql://...\"): SQLite files are one process's")
        with opening("cluster tables", db.describe()):
            migrate(db, SCHEMA)
        self._db = db
        self.member = member
        self.url = ""
        self.host = ""
        self.pid = 0

    # -- members ----------------------------------------------------------------------------

    def join(self, url: str, host: str, pid: int) -> None:
        """This process is a member, reachable at `url`."""
        self.url, self.host, self.pid = url, host, pid
        self._db.execute(
            "INSERT INTO cluster_members (member, url, host, pid, started_at, seen_at)"
            f" VALUES (?, ?, ?, ?, {NOW}, {NOW}) ON CONFLICT (member) DO UPDATE SET"
            " url = excluded.url, seen_at = excluded.seen_at", (self.member, url, host, pid))

    def leave(self) -> None:
        """This process stops: its leases end now (another process takes its streams at its
        next look) and its row goes."""
        with self._db.transaction() as cur:
            cur.execute("UPDATE stream_leases SET expires_at = 0 WHERE member = ?",
                        (self.member,))
            cur.execute("DELETE FROM cluster_members WHERE member = ?", (self.member,))

    def members(self, seen_within: float | None = None) -> list[Member]:
        """The members, those seen within `seen_within` seconds only when given."""
        sql = "SELECT member, url, host, pid, started_at, seen_at FROM cluster_members"
        params: tuple[Any, ...] = ()
        if seen_within is not None:
            sql += f" WHERE seen_at > {NOW} - ?"
            params = (seen_within,)
        return [Member(*row) for row in self._db.fetchall(sql + " ORDER BY started_at", params)]

    def member_url(self, member: str) -> str | None:
        row = self._db.fetchone("SELECT url FROM cluster_members WHERE member = ?", (member,))
        return str(row[0]) if row else None

    # -- leases -----------------------------------------------------------------------------

    def renew(self, seconds: float) -> dict[str, int]:
        """Renew this member's valid leases for `seconds` and say it is alive; the streams
        renewed (-> epoch). A lease that expired meanwhile is not renewed: it may be another
        process's already."""
        with self._db.transaction() as cur:
            rows = cur.execute(
                f"UPDATE stream_leases SET expires_at = {NOW} + ? WHERE member = ? AND"
                f" expires_at > {NOW} RETURNING stream, epoch", (seconds, self.member)).fetchall()
            cur.execute(
                "INSERT INTO cluster_members (member, url, host, pid, started_at, seen_at)"
                f" VALUES (?, ?, ?, ?, {NOW}, {NOW}) ON CONFLICT (member) DO UPDATE SET"
                " seen_at = excluded.seen_at", (self.member, self.url, self.host, self.pid))
        return {str(s): int(e) for s, e in rows}

    def claim(self, streams: Iterable[str], seconds: float) -> Claim:
        """Take the leases of `streams` for `seconds`, all or none (the module docstring)."""
        names = sorted(set(streams))
        out = Claim()
        if not names:
            return out
        marks = ", ".join("?" for _ in names)
        with self._db.transaction() as cur:
            cur.executemany("INSERT INTO stream_leases (stream, member, epoch, expires_at)"
                            " VALUES (?, '', 0, 0) ON CONFLICT (stream) DO NOTHING",
                            [(n,) for n in names])
            rows = cur.execute(
                f"SELECT stream, member, epoch, expires_at > {NOW} FROM stream_leases"
                f" WHERE stream IN ({marks}) ORDER BY stream FOR UPDATE", names).fetchall()
            out.holders = {str(s): str(m) for s, m, _, valid in rows
                           if valid and m != self.member}
            if out.holders:
                return out
            for stream, member, epoch, valid in rows:
                if member == self.member and valid:
                    cur.execute(f"UPDATE stream_leases SET expires_at = {NOW} + ? WHERE"
                                " stream = ?", (seconds, stream))
                    out.renewed[str(stream)] = int(epoch)
                else:
                    cur.execute(f"UPDATE stream_leases SET member = ?, epoch = epoch + 1,"
                                f" expires_at = {NOW} + ? WHERE stream = ?",
                                (self.member, seconds, stream))
                    out.acquired[str(stream)] = int(epoch) + 1
        return out

    def release(self, streams: Iterable[str]) -> None:
        """Give up these leases now (held by this member only)."""
        names = sorted(set(streams))
        if names:
            marks = ", ".join("?" for _ in names)
            self._db.execute(f"UPDATE stream_leases SET expires_at = 0 WHERE member = ? AND"
                             f" stream IN ({marks})", (self.member, *names))

    def holder(self, stream: str) -> str | None:
        """The member validly holding the stream's lease now, if any."""
        row = self._db.fetchone(f"SELECT member FROM stream_leases WHERE stream = ? AND"
                                f" expires_at > {NOW}", (stream,))
        return str(row[0]) if row else None

    def leases(self) -> list[Lease]:
        rows = self._db.fetchall(f"SELECT stream, member, epoch, expires_at - {NOW}"
                                 " FROM stream_leases WHERE member <> '' ORDER BY stream")
        return [Lease(str(s), str(m), int(e), float(x)) for s, m, e, x in rows]

    # -- what needs a home --------------------------------------------------------------------

    def orphans(self) -> list[str]:
        """Streams that need a process and have none: they have live handles or events, and
        no valid lease (their process died or stopped)."""
        rows = self._db.fetchall(
            "SELECT s FROM (SELECT stream AS s FROM handles WHERE state = 'live'"
            " UNION SELECT stream FROM events) needed WHERE NOT EXISTS (SELECT 1 FROM"
            f" stream_leases l WHERE l.stream = needed.s AND l.expires_at > {NOW}) ORDER BY s")
        return [str(r[0]) for r in rows]

    def live_joins(self) -> list[tuple[str, str]]:
        """The two streams of every live join handle (a join's streams move together)."""
        rows = self._db.fetchall("SELECT plan_json FROM handles WHERE state = 'live' AND"
                                 " plan_json LIKE '{\"join\":%'")
        out = []
        for (plan_json,) in rows:
            join = json.loads(plan_json)["join"]
            out.append((str(join["left"]["stream"]), str(join["right"]["stream"])))
        return out

    def derivations(self) -> list[tuple[str, str]]:
        """Each live derived stream and the stream its deriving handle reads: the handle's
        deliveries are appended to the derived stream where the handle is served, so they move
        together (`pep.streams.derived`)."""
        rows = self._db.fetchall("SELECT stream, source FROM derivations WHERE state = 'live'")
        return [(str(derived), str(source)) for derived, source in rows]

    def joined_with(self, streams: Iterable[str]) -> set[str]:
        """`streams` and every stream a live join or a live derivation ties to them,
        transitively."""
        group = set(streams)
        joins = self.live_joins() + self.derivations()
        grew = True
        while grew:
            grew = False
            for left, right in joins:
                if (left in group) != (right in group):
                    group.update((left, right))
                    grew = True
        return group


__all__ = ["Claim", "ClusterStore", "Lease", "Member", "NOW", "SCHEMA"]
