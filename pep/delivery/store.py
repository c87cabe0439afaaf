"""What the gateway and its edges share about delivery through plan topics, in the store.

- `delivery_plan_topics`: each plan's destination (`<topic>#<lane>`, `pep.delivery.lanes`: up
  to `plans_per_topic` plans of a stream share a Kafka topic, each under a lane; a name without
  `#` is a topic of one plan), the stream and plan key it carries, live, ended or deleted (its
  Kafka topic deleted from the brokers). A plan's handles share its destination; a plan asked
  for again after it ended gets a new one. A Kafka topic is deleted once none of its
  destinations is live (a deleted Kafka topic's name cannot be used again at once); one left
  ended but not deleted (its gateway stopped before the deletion) is deleted by the next
  gateway that starts.
- `delivery_handles`: which topic a handle reads and the offset it starts at (the topic's end
  when the handle was opened: a handle joining a plan gets nothing of the plan from before it).
  An edge checks every reader against this and `handles` (owner, state) before it serves.
- `delivery_edges`: the edge processes alive (seen within a few seconds, by the database's
  clock) and their Kafka principals: a revocation waits for each one's acknowledgement.
- `delivery_stream_stalls`: the streams whose query is stalled (or failed) now, as each
  gateway's stall check last saw them (`pep.delivery.control.StreamNotices`): an edge that
  starts, or misses a control record, learns from it that their readers are to be told
  `stalled`. A stream's name and state only, nothing of a policy. Rows are per reporting
  gateway (several `--cluster` processes share the store, each running its own streams: one's
  save must not erase another's stalls), refreshed every `STALLS_REFRESH` seconds; a reporter
  silent for `STALLS_STALE` seconds stopped, and its rows are not read.
- `delivery_fences`: the DENY ACLs a revocation put on a plan topic for an edge that did not
  acknowledge in time; taken away with the topic.

Only PostgreSQL: edges are processes of their own, on other hosts too, reading one database.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from common.db import Database, opening
from common.migrations import Schema, Step, migrate

# the database's clock, in epoch seconds
NOW = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"

_TOPICS = ("CREATE TABLE delivery_plan_topics (topic TEXT COLLATE \"C\" PRIMARY KEY,"
           " stream TEXT NOT NULL, plan_key TEXT NOT NULL, state TEXT NOT NULL,"
           " created_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION)")
_TOPICS_BY_PLAN = ("CREATE INDEX delivery_plan_topics_by_plan ON delivery_plan_topics"
                   " (stream, plan_key, state)")
_HANDLES = ("CREATE TABLE delivery_handles (handle_id TEXT COLLATE \"C\" PRIMARY KEY,"
            " topic TEXT COLLATE \"C\" NOT NULL, start_offset BIGINT NOT NULL)")
_HANDLES_BY_TOPIC = "CREATE INDEX delivery_handles_by_topic ON delivery_handles (topic)"
_EDGES = ("CREATE TABLE delivery_edges (edge TEXT PRIMARY KEY, principal TEXT NOT NULL,"
          " url TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,"
          " started_at DOUBLE PRECISION NOT NULL, seen_at DOUBLE PRECISION NOT NULL)")
_FENCES = ("CREATE TABLE delivery_fences (topic TEXT COLLATE \"C\" NOT NULL,"
           " principal TEXT NOT NULL, fenced_at DOUBLE PRECISION NOT NULL,"
           " PRIMARY KEY (topic, principal))")
_STALLS = ("CREATE TABLE delivery_stream_stalls (reporter TEXT NOT NULL, stream TEXT NOT NULL,"
           " state TEXT NOT NULL, last_batch_at TEXT, seen DOUBLE PRECISION NOT NULL,"
           " PRIMARY KEY (reporter, stream))")
# a gateway saves its stalled streams at least this often (seconds); rows of a reporter not
# heard from for STALLS_STALE are a stopped gateway's, whose streams another one took over
STALLS_REFRESH = 5.0
STALLS_STALE = 20.0
# SQLite is listed for the schema's own tests only: delivery through topics runs on PostgreSQL
SCHEMA = Schema("delivery", (
    Step("plan topics, the handles reading them, the edges and their fences",
         sqlite=tuple(s.replace("DOUBLE PRECISION", "REAL").replace("BIGINT", "INTEGER")
                      .replace(' COLLATE "C"', "")
                      for s in (_TOPICS, _TOPICS_BY_PLAN, _HANDLES, _HANDLES_BY_TOPIC, _EDGES,
                                _FENCES)),
         postgresql=(_TOPICS, _TOPICS_BY_PLAN, _HANDLES, _HANDLES_BY_TOPIC, _EDGES, _FENCES)),
    Step("the streams stalled now, for the edges",
         sqlite=(_STALLS.replace("DOUBLE PRECISION", "REAL"),), postgresql=(_STALLS,)),
))


@dataclass(frozen=True)
class ReaderView:
    """What an edge checks before it serves a handle's reader (`reader_views`)."""

    subject: str
    state: str
    reason: str | None
    stream: str
    topic: str | None  # None: the handle is not delivered through a topic (yet)
    start_offset: int
    buried: bool  # its stream was deleted: the handle is no one's any more
    visibility: str | None  # its stream's, None when the stream is gone

    @property
    def live(self) -> bool:
        return self.state == "live"


@dataclass(frozen=True)
class EdgeMember:
    edge: str
    principal: str
    url: str


class DeliveryStore:
    """The delivery tables (the module docstring)."""

    def __init__(self, db: Database) -> None:
        if db.dialect.name != "postgresql":
            raise ValueError("delivery through Kafka topics needs a PostgreSQL store (store = "
                             "\"postgresql://...\"): the edges read it from their processes")
        with opening("delivery tables", db.describe()):
            migrate(db, SCHEMA)
        self._db = db

    # -- plan topics ----------------------------------------------------------------------------

    def live_topic(self, stream: str, plan_key: str) -> str | None:
        row = self._db.fetchone("SELECT topic FROM delivery_plan_topics WHERE stream = ? AND"
                                " plan_key = ? AND state = 'live' ORDER BY created_at DESC"
                                " LIMIT 1", (stream, plan_key))
        return str(row[0]) if row else None

    def add_topic(self, topic: str, stream: str, plan_key: str) -> None:
        self._db.execute("INSERT INTO delivery_plan_topics (topic, stream, plan_key, state,"
                         f" created_at) VALUES (?, ?, ?, 'live', {NOW})",
                         (topic, stream, plan_key))

    def open_topic(self, stream: str, limit: int) -> tuple[str, int] | None:
        """A Kafka topic of `stream` that other plans' lanes may join (`pep.delivery.lanes`):
        some of its lanes live (a topic whose lanes all ended is on its way out), fewer than
        `limit`, and no edge fenced off it (a fence holds for the topic's life: a new plan
        there could not be read by that edge); (its name, its live lanes), the fullest first.
        None when there is none."""
        if limit < 2:
            return None
        row = self._db.fetchone(
            "SELECT split_part(p.topic, '#', 1) AS t, COUNT(*) AS n FROM delivery_plan_topics p"
            " WHERE p.stream = ? AND p.state = 'live' AND strpos(p.topic, '#') > 0"
            " AND NOT EXISTS (SELECT 1 FROM delivery_fences f"
            " WHERE f.topic = split_part(p.topic, '#', 1))"
            " GROUP BY t HAVING COUNT(*) < ? ORDER BY n DESC, t LIMIT 1", (stream, int(limit)))
        return (str(row[0]), int(row[1])) if row else None

    def topics_in_use(self, topics: Iterable[str]) -> set[str]:
        """Of these Kafka topics, those with a live plan (a live destination, any lane)."""
        names = sorted(set(topics))
        out: set[str] = set()
        for lo in range(0, len(names), 1000):
            chunk = names[lo:lo + 1000]
            marks = ", ".join("?" for _ in chunk)
            out.update(str(r[0]) for r in self._db.fetchall(
                "SELECT DISTINCT split_part(topic, '#', 1) FROM delivery_plan_topics WHERE"
                f" state = 'live' AND split_part(topic, '#', 1) IN ({marks})", chunk))
        return out

    def end_topic(self, topic: str) -> None:
        """The topic is deleted (or being deleted): no handle may be bound to it again."""
        self._db.execute(f"UPDATE delivery_plan_topics SET state = 'ended', ended_at = {NOW}"
                         " WHERE topic = ?", (topic,))

    def end_topics(self, topics: Iterable[str]) -> None:
        """`end_topic` of each, a statement per thousand (a revocation of 1,000 handles of
        1,000 plans ends 1,000 topics before its DELETE answers)."""
        self._execute_in(f"UPDATE delivery_plan_topics SET state = 'ended', ended_at = {NOW}"
                         " WHERE topic IN ({marks})", topics)

    def topic_live(self, topic: str) -> bool:
        row = self._db.fetchone("SELECT state FROM delivery_plan_topics WHERE topic = ?",
                                (topic,))
        return bool(row) and row[0] == "live"

    def unused_topics(self, topics: Iterable[str]) -> list[str]:
        """Of these live topics, those no live handle reads any more."""
        names = sorted(set(topics))
        if not names:
            return []
        marks = ", ".join("?" for _ in names)
        rows = self._db.fetchall(
            f"SELECT t.topic FROM delivery_plan_topics t WHERE t.topic IN ({marks}) AND"
            " t.state = 'live' AND NOT EXISTS (SELECT 1 FROM delivery_handles d JOIN handles h"
            " ON h.id = d.handle_id WHERE d.topic = t.topic AND h.state = 'live')"
            " ORDER BY t.topic", names)
        return [str(r[0]) for r in rows]

    def orphan_topics(self) -> list[str]:
        """Live topics no live handle reads (a gateway stopped before it deleted them)."""
        rows = self._db.fetchall(
            "SELECT t.topic FROM delivery_plan_topics t WHERE t.state = 'live' AND NOT EXISTS"
            " (SELECT 1 FROM delivery_handles d JOIN handles h ON h.id = d.handle_id WHERE"
            " d.topic = t.topic AND h.state = 'live') ORDER BY t.topic")
        return [str(r[0]) for r in rows]

    def undeleted_topics(self) -> list[str]:
        """Kafka topics whose destinations have all ended but that were not deleted (a gateway
        stopped within the grace before the deletion, or the brokers were away then): the
        next gateway to start deletes them (`PlanTopics`)."""
        rows = self._db.fetchall(
            "SELECT DISTINCT split_part(t.topic, '#', 1) AS k FROM delivery_plan_topics t"
            " WHERE t.state = 'ended' AND NOT EXISTS (SELECT 1 FROM delivery_plan_topics l"
            " WHERE l.state = 'live' AND split_part(l.topic, '#', 1) ="
            " split_part(t.topic, '#', 1)) ORDER BY k")
        return [str(r[0]) for r in rows]

    def deleted_topics(self, topics: Iterable[str]) -> None:
        """These Kafka topics are deleted from the brokers: their ended destinations are
        marked `deleted` (`undeleted_topics` no longer lists them)."""
        self._execute_in("UPDATE delivery_plan_topics SET state = 'deleted' WHERE"
                         " state = 'ended' AND split_part(topic, '#', 1) IN ({marks})", topics)

    def _execute_in(self, statement: str, names: Iterable[str]) -> None:
        """`statement` over these names, distinct, a thousand at a time (its `{marks}`: their
        placeholders)."""
        unique = sorted(set(names))
        for lo in range(0, len(unique), 1000):
            chunk = unique[lo:lo + 1000]
            self._db.execute(statement.format(marks=", ".join("?" for _ in chunk)), chunk)

    def live_topics(self) -> list[str]:
        """Every live plan topic (at a gateway's start, once `orphan_topics` are ended: the
        topics its handles read, which it takes up)."""
        rows = self._db.fetchall("SELECT topic FROM delivery_plan_topics WHERE state = 'live'"
                                 " ORDER BY topic")
        return [str(r[0]) for r in rows]

    # -- handles --------------------------------------------------------------------------------

    def bind(self, handle_id: str, topic: str, start_offset: int) -> None:
        """The handle reads `topic` from `start_offset` on (kept when already bound: a
        handle resumed after a restart or a take-over reads on where it was)."""
        self._db.execute("INSERT INTO delivery_handles (handle_id, topic, start_offset)"
                         " VALUES (?, ?, ?) ON CONFLICT (handle_id) DO NOTHING",
                         (handle_id, topic, int(start_offset)))

    def binding(self, handle_id: str) -> tuple[str, int] | None:
        row = self._db.fetchone("SELECT topic, start_offset FROM delivery_handles WHERE"
                                " handle_id = ?", (handle_id,))
        return (str(row[0]), int(row[1])) if row else None

    def topics_of(self, handle_ids: Iterable[str]) -> dict[str, str]:
        ids = sorted(set(handle_ids))
        out: dict[str, str] = {}
        for lo in range(0, len(ids), 1000):
            chunk = ids[lo:lo + 1000]
            marks = ", ".join("?" for _ in chunk)
            out.update({str(h): str(t) for h, t in self._db.fetchall(
                f"SELECT handle_id, topic FROM delivery_handles WHERE handle_id IN ({marks})",
                chunk)})
        return out

    def reader_views(self, handle_ids: Iterable[str]) -> dict[str, ReaderView]:
        """Everything an edge checks before serving a reader of each of these handles, a query
        per thousand (an edge checks the readers that connected meanwhile together: `pep.edge.
        node.ReaderChecks`); a handle the store does not know is missing."""
        ids = sorted(set(handle_ids))
        out: dict[str, ReaderView] = {}
        for lo in range(0, len(ids), 1000):
            for row in self._db.fetchall(
                    "SELECT h.id, h.subject, h.state, h.reason, h.stream, d.topic,"
                    " d.start_offset,"
                    " EXISTS (SELECT 1 FROM deleted_stream_handles b WHERE b.id = h.id),"
                    " (SELECT s.visibility FROM streams s WHERE s.name = h.stream)"
                    " FROM handles h LEFT JOIN delivery_handles d ON d.handle_id = h.id"
                    " WHERE h.id = ANY(?)", (ids[lo:lo + 1000],)):
                hid, subject, state, reason, stream, topic, start, buried, visibility = row
                out[str(hid)] = ReaderView(str(subject), str(state), reason, str(stream),
                                           None if topic is None else str(topic),
                                           int(start or 0), bool(buried), visibility)
        return out

    def states(self, handle_ids: Iterable[str]) -> dict[str, tuple[str, str | None]]:
        """The state and reason of each of these handles (an edge's look at those it serves);
        an id the store does not know is missing."""
        ids = sorted(set(handle_ids))
        out: dict[str, tuple[str, str | None]] = {}
        for lo in range(0, len(ids), 1000):
            chunk = ids[lo:lo + 1000]
            marks = ", ".join("?" for _ in chunk)
            for hid, state, reason, buried in self._db.fetchall(
                    f"SELECT h.id, h.state, h.reason, EXISTS (SELECT 1 FROM"
                    f" deleted_stream_handles b WHERE b.id = h.id) FROM handles h WHERE h.id"
                    f" IN ({marks})", chunk):
                out[str(hid)] = (str(state) if not buried else "ended", reason)
        return out

    # -- edges ----------------------------------------------------------------------------------

    def register_edge(self, edge: str, principal: str, url: str, host: str, pid: int) -> None:
        self._db.execute(
            "INSERT INTO delivery_edges (edge, principal, url, host, pid, started_at, seen_at)"
            f" VALUES (?, ?, ?, ?, ?, {NOW}, {NOW}) ON CONFLICT (edge) DO UPDATE SET"
            " url = excluded.url, seen_at = excluded.seen_at",
            (edge, principal, url, host, int(pid)))

    def seen(self, edge: str) -> bool:
        """This edge is alive now; False when its row is gone (it was let go: register again)."""
        return self._db.execute(f"UPDATE delivery_edges SET seen_at = {NOW} WHERE edge = ?",
                                (edge,)) > 0

    def leave(self, edge: str) -> None:
        self._db.execute("DELETE FROM delivery_edges WHERE edge = ?", (edge,))

    def edges(self, seen_within: float | None = None) -> list[EdgeMember]:
        sql = "SELECT edge, principal, url FROM delivery_edges"
        params: tuple[float, ...] = ()
        if seen_within is not None:
            sql += f" WHERE seen_at > {NOW} - ?"
            params = (seen_within,)
        return [EdgeMember(str(e), str(p), str(u))
                for e, p, u in self._db.fetchall(sql + " ORDER BY started_at", params)]

    def forget_edges(self, older_than: float) -> int:
        """Rows of edges not seen for `older_than` seconds (they died): removed."""
        return self._db.execute(f"DELETE FROM delivery_edges WHERE seen_at < {NOW} - ?",
                                (older_than,))

    # -- stream stalls ---------------------------------------------------------------------------

    def save_stalls(self, reporter: str, stalls: dict[str, tuple[str, str | None]]) -> None:
        """The streams stalled now in the gateway `reporter` (stream -> (state, last batch's
        time)), in place of those it saved before; other gateways' rows are theirs."""
        with self._db.transaction() as cur:
            cur.execute("DELETE FROM delivery_stream_stalls WHERE reporter = ?", (reporter,))
            cur.executemany("INSERT INTO delivery_stream_stalls (reporter, stream, state,"
                            f" last_batch_at, seen) VALUES (?, ?, ?, ?, {NOW})",
                            [(reporter, s, state, at)
                             for s, (state, at) in sorted(stalls.items())])

    def stalled_streams(self) -> dict[str, tuple[str, str | None]]:
        """The streams stalled now (an edge's look): stream -> (state, last batch's time), from
        the gateways heard from within `STALLS_STALE` seconds ("failed" over "stalled" when two
        say different things of one stream, as while it moves between them)."""
        rows = self._db.fetchall(
            "SELECT stream, state, last_batch_at FROM delivery_stream_stalls"
            f" WHERE seen > {NOW} - ? ORDER BY stream, state DESC",
            (STALLS_STALE,))
        out: dict[str, tuple[str, str | None]] = {}
        for stream, state, at in rows:
            if str(stream) not in out or str(state) == "failed":
                out[str(stream)] = (str(state), None if at is None else str(at))
        return out

    # -- fences ---------------------------------------------------------------------------------

    def fenced(self, topic: str, principals: Iterable[str]) -> None:
        with self._db.transaction() as cur:
            cur.executemany(
                "INSERT INTO delivery_fences (topic, principal, fenced_at) VALUES"
                f" (?, ?, {NOW}) ON CONFLICT (topic, principal) DO NOTHING",
                [(topic, p) for p in sorted(set(principals))])

    def fences(self, topic: str) -> list[str]:
        return [str(r[0]) for r in self._db.fetchall(
            "SELECT principal FROM delivery_fences WHERE topic = ? ORDER BY principal",
            (topic,))]

    def unfence(self, topic: str) -> None:
        self._db.execute("DELETE FROM delivery_fences WHERE topic = ?", (topic,))


__all__ = ["DeliveryStore", "EdgeMember", "NOW", "ReaderView", "SCHEMA"]
