"""Stream events: conditions on a stream that, while they hold, open grants for policies to use.

An owner defines an event on its stream: a name, a condition over the stream's attributes, how
long it stays open after the last tuple that met it (`hold` seconds), and optionally a key
attribute whose values are collected while it is open (which ships are in the emergency). The
runtime evaluates the condition like any filter (in Spark, as data); while tuples meet it, the
event is open. Policies see the state as environment attributes that only the gateway sets (a
request's own `urn:xsg:` attributes are dropped, see `pdp.request.bind_environment`):

- `urn:xsg:event:<stream>:<name>`: boolean, true while the event is open (absent otherwise);
- `urn:xsg:event:<stream>:<name>:keys`: the bag of key values seen since it opened (with `key`);
- `urn:xsg:event:<stream>:<name>:since`: dateTime at which it opened.

A policy's Rule can then require the event (ASSIST Table 2, last row: a captain sees every
attribute of the ships in an emergency, while it lasts), and a filter obligation can name the
keys (`mmsi IN {environment:urn:xsg:event:ais:emergency:keys}`). Whenever an event opens,
closes or gains keys, the live handles are decided again, so a grant opens and closes on time.

Definitions are persisted; the state is not: after a restart every event is closed until a tuple
meets it again (closed is the side that denies).

Who sees an event. Its state is its stream owner's information (with a key, values of the
stream's data), so a decision sees only the events of the stream it is about: `environment(s)`
gives stream s's events, and a request that names no stream, or several, sees none (a join
decides each side with its own stream's). Policies cannot name another stream's event either,
unless an administrator wrote them (`pep.streams.event_scope`, `pep.streams.ownership`). The
definitions and states are listed to the stream's owner and administrators only
(`GET /streams/<name>/events`); listeners hear which streams' events changed, so that only the
handles reading those streams are decided again.
What moves an event: its condition reads every tuple of the stream, including tuples a
consumer's policy hides. That is the owner's declassification (the owner writes the event and
the policy that grants on it, which reveals the event's state, not the tuples). Nothing else
moves it: a tuple that does not meet the condition changes nothing, and no tuple's event time
does (opening, `since` and the hold run on the gateway's clock). Tested in
tests/pep/runtime/test_hidden_time.py.
"""
from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import NotRequired, TypedDict

from common.db import Database, StoreUnavailable, open_database, opening
from common.migrations import Schema, Step, migrate
from common.numbers import NumberError, check_float
from pep.core.conditions import ConditionError, parse_condition
from pep.core.errors import Conflict, InvalidInput, NotFound
from pep.core.graph import pipeline_graph
from pep.core.jsontypes import JsonObject, JsonValue
from pep.core.merge import merge
from pep.core.plan import ExecutionPlan, StreamDefinition
from pep.core.rows import RowBatch
from pep.ports import StreamRuntimePort

EVENT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
PREFIX = "urn:xsg:event:"
BOOLEAN = "http://www.w3.org/2001/XMLSchema#boolean"
STRING = "http://www.w3.org/2001/XMLSchema#string"
DATETIME = "http://www.w3.org/2001/XMLSchema#dateTime"
MAX_HOLD = 7 * 24 * 3600
MAX_KEYS = 10_000
MAX_EVENTS_PER_STREAM = 64

log = logging.getLogger(__name__)

# the definitions' versioned schema (`common.migrations`)
SCHEMA = Schema("events", (
    Step("stream events' definitions",
         sqlite=("CREATE TABLE IF NOT EXISTS events (stream TEXT NOT NULL, name TEXT NOT NULL,"
                 " condition TEXT NOT NULL, hold REAL NOT NULL, key TEXT, owner TEXT NOT NULL,"
                 " created_at TEXT NOT NULL, PRIMARY KEY (stream, name))",),
         postgresql=("CREATE TABLE events (stream TEXT COLLATE \"C\" NOT NULL,"
                     " name TEXT COLLATE \"C\" NOT NULL, condition TEXT NOT NULL,"
                     " hold DOUBLE PRECISION NOT NULL, key TEXT, owner TEXT NOT NULL,"
                     " created_at TEXT NOT NULL, PRIMARY KEY (stream, name))",)),
))


class EventJson(TypedDict):
    """An event as its owner lists it (`GET /streams/<name>/events`) and the audit records it;
    with its state, `open`, `since` and how many `keys` were seen."""

    stream: str
    name: str
    condition: str
    hold: float
    key: str | None
    owner: str
    attribute: str
    created_at: str
    open: NotRequired[bool]
    since: NotRequired[str | None]
    keys: NotRequired[int]


@dataclass(frozen=True)
class EventDefinition:
    stream: str
    name: str
    condition: str
    hold: float
    key: str | None
    owner: str
    created_at: str = ""

    @property
    def attribute_id(self) -> str:
        return f"{PREFIX}{self.stream}:{self.name}"

    @property
    def runtime_id(self) -> str:
        """How the event's evaluation is attached to the runtime (never a handle id)."""
        return f"event:{self.stream}:{self.name}"

    def to_json(self, state: EventState | None = None) -> EventJson:
        out: EventJson = {"stream": self.stream, "name": self.name,
                               "condition": self.condition, "hold": self.hold, "key": self.key,
                               "owner": self.owner, "attribute": self.attribute_id,
                               "created_at": self.created_at}
        if state is not None:
            out["open"] = state.open
            out["since"] = _iso(state.since) if state.open else None
            out["keys"] = len(state.keys)
        return out


@dataclass
class EventState:
    open: bool = False
    since: float = 0.0
    last_match: float = 0.0
    keys: set[JsonValue] = field(default_factory=set)  # the key's values, as rows hold them


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


class StreamEvents:
    """Definitions (in their store) and states (memory) of every stream event. `where`: the
    store's database, or the path of its SQLite file."""

    def __init__(self, where: Database | str | Path,
                 stream_lookup: Callable[[str], StreamDefinition | None],
                 clock: Callable[[], float] = time.time) -> None:
        with opening("stream events", str(where)):
            self._db = open_database(where, "events")
        try:
            with opening("stream events", self._db.describe()):
                migrate(self._db, SCHEMA)
        except BaseException:
            self._db.close()
            raise
        self._lookup = stream_lookup
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[tuple[str, str], EventState] = {}
        self._version = 0  # bumped whenever what policies see changes
        self._holds: dict[tuple[str, str], float] = {}  # as `tick` last read them
        # Called (outside the lock) with the streams whose environment attributes changed.
        self._listeners: list[Callable[[frozenset[str]], None]] = []

    def add_listener(self, callback: Callable[[frozenset[str]], None]) -> None:
        """`callback(streams)` whenever the events of those streams open, close or grow."""
        self._listeners.append(callback)

    # -- definitions --------------------------------------------------------------------------

    def define(self, stream: str, name: JsonValue, condition: JsonValue,
               hold: JsonValue = 3600.0, key: JsonValue = None,
               owner: str = "") -> EventDefinition:
        """Check and store an event; InvalidInput says what is wrong, Conflict if it exists."""
        definition = self.check(stream, name, condition, hold, key, owner)
        with self._db.transaction() as cur:
            if cur.execute("SELECT 1 FROM events WHERE stream = ? AND name = ?",
                           (stream, definition.name)).fetchone():
                raise Conflict(f"stream {stream!r} already has an event {definition.name!r}")
            count = cur.execute("SELECT COUNT(*) FROM events WHERE stream = ?",
                                (stream,)).fetchone()[0]
            if count >= MAX_EVENTS_PER_STREAM:
                raise Conflict(f"stream {stream!r} has {count} events, the most allowed")
            cur.execute("INSERT INTO events (stream, name, condition, hold, key, owner,"
                        " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (stream, definition.name, definition.condition, definition.hold,
                         definition.key, owner, definition.created_at))
        return definition

    def check(self, stream_name: str, name: JsonValue, condition: JsonValue, hold: JsonValue,
              key: JsonValue, owner: str) -> EventDefinition:
        stream = self._lookup(stream_name)
        if stream is None:
            raise NotFound(f"no stream named {stream_name!r}")
        if not isinstance(name, str) or not EVENT_NAME.fullmatch(name):
            raise InvalidInput(f"an event's name must match {EVENT_NAME.pattern}")
        if not isinstance(condition, str) or not condition.strip():
            raise InvalidInput("an event needs a condition over the stream's attributes")
        try:
            parse_condition(condition, stream.schema, allow_placeholders=False)
        except ConditionError as exc:
            raise InvalidInput(f"condition: {exc}", field="condition") from None
        try:
            hold = check_float(hold, "hold", low=0, high=MAX_HOLD)
        except NumberError:
            hold = 0.0
        if not hold > 0:
            raise InvalidInput(f"hold must be seconds in (0, {MAX_HOLD}]", field="hold")
        if key is not None:
            f = stream.schema.lookup(key) if isinstance(key, str) else None
            if f is None:
                raise InvalidInput(f"key {key!r} is not an attribute of stream {stream.name!r}",
                                   field="key")
            key = f.name
        created = datetime.now(UTC).isoformat(timespec="seconds")
        return EventDefinition(stream.name, name, condition.strip(), hold, key, owner,
                               created)

    def delete(self, stream: str, name: str) -> EventDefinition:
        definition = self.get(stream, name)
        if definition is None:
            raise NotFound(f"stream {stream!r} has no event {name!r}")
        self._db.execute("DELETE FROM events WHERE stream = ? AND name = ?", (stream, name))
        with self._lock:
            state = self._states.pop((stream, name), None)
            changed = state is not None and state.open
            if changed:
                self._version += 1
        if changed:
            self._notify({stream})
        return definition

    def get(self, stream: str, name: str) -> EventDefinition | None:
        row = self._db.fetchone("SELECT stream, name, condition, hold, key, owner, created_at"
                                " FROM events WHERE stream = ? AND name = ?", (stream, name))
        return EventDefinition(*row) if row else None

    def all(self, stream: str | None = None) -> list[EventDefinition]:
        sql = "SELECT stream, name, condition, hold, key, owner, created_at FROM events"
        rows = (self._db.fetchall(sql + " WHERE stream = ? ORDER BY name", (stream,))
                if stream is not None else self._db.fetchall(sql + " ORDER BY stream, name"))
        return [EventDefinition(*r) for r in rows]

    def state(self, definition: EventDefinition) -> EventState:
        with self._lock:
            return self._states.get((definition.stream, definition.name)) or EventState()

    def plan(self, definition: EventDefinition) -> ExecutionPlan:
        """What the runtime evaluates: the condition as a filter, the key (or the event time)
        as the only attribute that comes back."""
        stream = self._lookup(definition.stream)
        if stream is None:
            raise NotFound(f"no stream named {definition.stream!r}")
        expr = parse_condition(definition.condition, stream.schema, allow_placeholders=False)
        keep = definition.key or stream.time_attribute or stream.schema.names[0]
        graph = pipeline_graph(stream.name, filter=(expr, definition.condition), map=(keep,))
        return merge(graph, None, stream.schema).plan

    # -- evaluation ---------------------------------------------------------------------------

    def evaluate(self, definition: EventDefinition, runtime: StreamRuntimePort) -> None:
        """Have the runtime evaluate the event's condition and report matches to `observe`."""
        stream = self._lookup(definition.stream)
        if stream is None:
            return
        runtime.attach_handle(definition.runtime_id, stream, self.plan(definition),
                              lambda rows: self.observe(definition, rows))

    def evaluate_all(self, runtime: StreamRuntimePort) -> None:
        for definition in self.all():
            try:
                self.evaluate(definition, runtime)
            except Exception:  # one event must not keep the others off
                log.exception("cannot evaluate event %s", definition.attribute_id)

    # -- state --------------------------------------------------------------------------------

    def observe(self, definition: EventDefinition, rows: RowBatch | Iterable[JsonObject]) -> bool:
        """Tuples that met the event's condition (the runtime's delivery); always True."""
        if isinstance(rows, RowBatch):
            if not rows.rows:
                return True
            values = [json.loads(r).get(definition.key) for r in rows.rows] \
                if definition.key else [None]
        else:
            rows = list(rows)
            if not rows:
                return True
            values = [r.get(definition.key) for r in rows] if definition.key else [None]
        now = self._clock()
        with self._lock:
            state = self._states.setdefault((definition.stream, definition.name), EventState())
            changed = not state.open
            if not state.open:
                state.open, state.since, state.keys = True, now, set()
            state.last_match = now
            if definition.key:
                before = len(state.keys)
                for v in values:
                    if v is not None and len(state.keys) < MAX_KEYS:
                        state.keys.add(v)
                changed = changed or len(state.keys) != before
            if changed:
                self._version += 1
        if changed:
            self._notify({definition.stream})
        return True

    def tick(self) -> bool:
        """Close the events whose hold ran out; True when something closed. While the store
        cannot be read (StoreUnavailable: logged once by the store), the holds last read still
        close what they would: an event closes on time, never late."""
        now = self._clock()
        try:
            holds = {(d.stream, d.name): d.hold for d in self.all()}
            self._holds = holds
        except StoreUnavailable:
            holds = self._holds
        with self._lock:
            closed = [k for k, s in self._states.items()
                      if s.open and now - s.last_match > holds.get(k, 0.0)]
            for k in closed:
                self._states[k] = EventState()
            if closed:
                self._version += 1
        if closed:
            self._notify({stream for stream, _ in closed})
        return bool(closed)

    @property
    def version(self) -> int:
        return self._version

    def environment(self, stream: str) -> list[tuple[str, str, list[str]]]:
        """The environment attributes a decision about `stream` sees now: that stream's open
        events only (see the module docstring)."""
        with self._lock:
            if not any(state.open and key[0] == stream for key, state in self._states.items()):
                return []  # the common case, asked once per decision: no database read
        definitions = {(d.stream, d.name): d for d in self.all(stream)}
        out: list[tuple[str, str, list[str]]] = []
        with self._lock:
            for k, state in sorted(self._states.items()):
                d = definitions.get(k)
                if d is None or not state.open:
                    continue
                out.append((d.attribute_id, BOOLEAN, ["true"]))
                out.append((d.attribute_id + ":since", DATETIME, [_iso(state.since)]))
                if d.key:
                    out.append((d.attribute_id + ":keys", STRING,
                                sorted(str(v) for v in state.keys)))
        return out

    def environment_for(self, resource_ids: Iterable[str]) -> list[tuple[str, str, list[str]]]:
        """What a XACML request naming these resource-id values sees (POST /pdp): the events
        of the stream when it names exactly one, else none."""
        names = set(resource_ids)
        return self.environment(names.pop()) if len(names) == 1 else []

    def forget(self, streams: Iterable[str]) -> None:
        """These streams' events are evaluated by another gateway process from now on
        (`pep.cluster`): their states here close (closed is the side that denies)."""
        names = set(streams)
        with self._lock:
            closed = [k for k, state in self._states.items() if k[0] in names and state.open]
            for key in [k for k in self._states if k[0] in names]:
                del self._states[key]
            if closed:
                self._version += 1
        if closed:
            self._notify({stream for stream, _ in closed})

    def _notify(self, streams: set[str]) -> None:
        changed = frozenset(streams)
        for callback in list(self._listeners):
            try:
                callback(changed)
            except Exception:  # a listener must not stop the event's state
                log.exception("event listener failed")

    def close(self) -> None:
        self._db.close()


__all__ = ["StreamEvents", "EventDefinition", "EventJson", "EventState", "PREFIX"]
