"""Who may see which stream: the owner's choice, decided by the PDP.

A stream is `listed` (every authenticated caller sees it: the default, and what every stream was
before this choice existed) or `restricted`. A restricted stream is seen by its owner, by
administrators, and by a caller for whom the PDP, asked now, permits some action on it; for
everyone else it does not exist: every route that names it answers exactly what it answers for a
name no stream has (the same status and the same body), so its name, owner and schema reach
nobody who could not be granted anything on it.

How the PDP is asked (`Seer.permits`). The caller's real identity (bound as for a stream request:
subject-id, roles and the identity's attributes, `pdp.bind_subject`), the gateway's environment
(its clock and stream events, `pdp.bind_environment`), the stream as the resource-id, and each
action id in turn, until one is Permit. The action ids are those the stored policies name in
their targets for that stream (`PolicyEngine.target_values` of every policy whose resource scope
can include the stream or is unknown), plus `read` and `subscribe` (what the example requests
ask, and what a policy without any action match permits). Nothing else is put in the request:
a policy that permits only when a request carries some other attribute (a purpose, say) or that
tests the action id only in a Condition does not make the stream visible; its owner keeps such
a stream `listed`, or the caller learns of it out of band. A caller with a live handle on the
stream also sees it (the PDP granted it, and every policy or identity change re-decides it).

Why not a guess from the policies' text: a rule's target may name the role, a Condition may
compare the caller's clearance, an environment event may open the grant; only evaluating the
policies with the caller's identity answers all of those the way the stream request will be
answered. Why not cached: a decision can change with any policy change, any identity change, a
stream event or the clock; nothing here is remembered but the action ids per engine generation
(an engine is immutable, and a policy change makes a new one, so that cannot go stale).

Cost: a listed stream costs nothing; a restricted one that the caller does not own costs one
decision per action id until a Permit (about 0.03 ms each with the target index). An unknown
name costs the same probe as a restricted one, so that the answer's timing says no more than its
body.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from common.auth import Identity
from pdp import (
    ACTION as ACTION_CATEGORY,
    ACTION_ID,
    RESOURCE as RESOURCE_CATEGORY,
    RESOURCE_ID,
    STRING,
    Decision,
    PolicyEngine,
    RequestContext,
    bind_environment,
    bind_subject,
)
from pep.core.access import EnvironmentAttributes
from pep.core.plan import StreamDefinition
from pep.handles.records import HandleRecord
from pep.streams.definition import LISTED
from pep.streams.entries import StreamEntry

if TYPE_CHECKING:  # the catalogue is handed in (it imports this package's modules)
    from pep.streams.catalog import StreamCatalog

DEFAULT_ACTIONS = ("read", "subscribe")


class StreamVisibility:
    """Answers "may this caller see that stream?" (module docstring).

    `catalog` is the stream catalogue (`visibility`, `get`); `engine()` the PDP's current
    engine (None: no PDP, so a restricted stream is seen only by its owner and administrators);
    `environment(stream)` the gateway's environment attributes for a decision on that stream;
    `live_streams(subject)` the streams of the subject's live handles."""

    def __init__(self, catalog: StreamCatalog, engine: Callable[[], PolicyEngine] | None = None,
                 environment: Callable[[str], EnvironmentAttributes] | None = None,
                 live_streams: Callable[[str], Iterable[str]] | None = None) -> None:
        self.catalog = catalog
        self.engine = engine
        self.environment = environment
        self.live_streams = live_streams
        self._lock = threading.Lock()
        self._actions_of: tuple[PolicyEngine, dict[str, frozenset[str]], frozenset[str]] | None \
            = None

    def seer(self, identity: Identity) -> Seer:
        """One caller's view: what it sees, deciding each stream as it is asked about (GET
        /streams asks about them all with one Seer)."""
        return Seer(self, identity)

    def may_see(self, identity: Identity, name: str) -> bool:
        """May the caller see the stream it names (spelled in any case)? False for no stream."""
        return self.seer(identity).sees_name(name)

    # -- the action ids to ask about, per engine generation ------------------------------------

    def actions_for(self, engine: PolicyEngine, stream: str) -> tuple[str, ...]:
        by_stream, anywhere = self._actions(engine)
        return tuple(sorted(anywhere | by_stream.get(stream, frozenset())))

    def _actions(self, engine: PolicyEngine) -> tuple[dict[str, frozenset[str]], frozenset[str]]:
        with self._lock:
            cached = self._actions_of
            if cached is not None and cached[0] is engine:
                return cached[1], cached[2]
        by_stream: dict[str, set[str]] = {}
        anywhere: set[str] = set(DEFAULT_ACTIONS)
        for policy_id in list(engine.policies):
            values = {v for v in engine.target_values(policy_id, ACTION_CATEGORY, ACTION_ID)
                      if isinstance(v, str)}
            if not values:
                continue
            scope = engine.resource_scope(policy_id)
            if scope is None:
                anywhere |= values
            else:
                for stream in scope:
                    by_stream.setdefault(stream, set()).update(values)
        frozen = {s: frozenset(v) for s, v in by_stream.items()}
        with self._lock:
            self._actions_of = (engine, frozen, frozenset(anywhere))
        return frozen, frozenset(anywhere)


class Seer:
    """What one caller sees, with what does not change between streams computed once: the
    bound identity and environment, the engine of this moment, the caller's live streams."""

    def __init__(self, visibility: StreamVisibility, identity: Identity) -> None:
        self.visibility = visibility
        self.identity = identity
        self._engine: PolicyEngine | None = None
        self._base: RequestContext | None = None
        self._live: frozenset[str] | None = None

    def __call__(self, identity: Identity, entry: StreamEntry) -> bool:
        """`catalog.list_visible`'s `may_see(identity, entry)`."""
        return self.sees(entry.definition, entry.visibility)

    def sees_name(self, name: str) -> bool:
        catalog = self.visibility.catalog
        definition = catalog.get(name) if isinstance(name, str) else None
        if definition is None:
            if isinstance(name, str):
                self.permits(name)  # the same work as for a hidden stream; the answer is no
            return False
        return self.sees(definition, catalog.visibility(definition.name))

    def sees(self, definition: StreamDefinition, visibility: str | None) -> bool:
        if visibility == LISTED:
            return True
        identity = self.identity
        if identity.admin or definition.owner == identity.subject:
            return True
        if definition.name.lower() in self.live():
            return True
        return self.permits(definition.name)

    def live(self) -> frozenset[str]:
        if self._live is None:
            lookup = self.visibility.live_streams
            self._live = frozenset(s.lower() for s in lookup(self.identity.subject)) \
                if lookup is not None else frozenset()
        return self._live

    def permits(self, stream: str) -> bool:
        """Does the PDP permit the caller some action on `stream` now?"""
        if self.visibility.engine is None:
            return False
        if self._engine is None or self._base is None:
            self._engine = self.visibility.engine()
            self._base = bind_subject(RequestContext([]), self.identity)
        engine = self._engine
        # a decision about a stream sees that stream's events only (pep/streams/event_scope.py)
        environment = self.visibility.environment(stream) if self.visibility.environment else []
        on_stream = bind_environment(self._base, environment).with_attribute(
            RESOURCE_CATEGORY, RESOURCE_ID, STRING, [stream])
        for action in self.visibility.actions_for(engine, stream):
            response = engine.decide(
                on_stream.with_attribute(ACTION_CATEGORY, ACTION_ID, STRING, [action]))
            if len(response.results) == 1 and response.results[0].decision is Decision.PERMIT:
                return True
        return False


def hidden_from(may_see: Callable[[Identity, str], bool] | None, identity: Identity
                ) -> Callable[[HandleRecord], bool]:
    """For the handle routes: is this handle of the caller's an ended one on a stream it may no
    longer see? Such a handle answers as one that does not exist, as its stream does. A live
    handle is always shown: the PDP granted it, and every change re-decides it."""
    seen: dict[str, bool] = {}

    def hidden(record: HandleRecord) -> bool:
        if may_see is None or record.live:
            return False
        for stream in record.streams:
            if stream not in seen:
                seen[stream] = may_see(identity, stream)
            if not seen[stream]:
                return True
        return False

    return hidden


__all__ = ["StreamVisibility", "Seer", "DEFAULT_ACTIONS", "hidden_from"]
