"""Defining and deleting a stream's events: the store, the runtime and the audit, in order.

`StreamEvents` keeps definitions and states; evaluating an event is the runtime's work. Defining
one takes three steps: the definition is checked and stored, the runtime starts evaluating its
condition, and the audit hears of it; deleting one stores, detaches and tells, likewise. They
are done here rather than in the HTTP blueprint (`pep/http/events.py`), which only reads the
request, checks that the caller manages the stream and answers.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pep.core.errors import NotFound
from pep.core.jsontypes import JsonValue
from pep.ports import StreamRuntimePort
from pep.streams.catalog import StreamCatalog
from pep.streams.events import EventDefinition, EventJson, StreamEvents


@dataclass
class StreamEventAdmin:
    """Owner-side operations on stream events; `on_change(kind, event_json)` hears of
    definitions added (`event-defined`) and removed (`event-deleted`): the audit."""

    catalog: StreamCatalog
    events: StreamEvents
    runtime: StreamRuntimePort
    on_change: Callable[[str, EventJson], None] | None = None
    # with several gateway processes: raises unless this process runs the stream's query,
    # which evaluates its events (`pep.cluster`)
    claim: Callable[[str], None] | None = None

    def define(self, stream: str, name: JsonValue, condition: JsonValue, hold: JsonValue,
               key: JsonValue, owner: str) -> EventDefinition:
        """Check, store and start evaluating an event over `stream` (InvalidInput, Conflict,
        NotFound say why not). Under the stream's life-cycle lock: never while the stream is
        changed or deleted."""
        with self.catalog.changing(stream):
            found = self.catalog.get(stream)
            if found is None:
                raise NotFound(f"no stream named {stream!r}")
            if self.claim is not None:
                self.claim(found.name)
            definition = self.events.define(stream, name, condition, hold, key, owner)
            self.events.evaluate(definition, self.runtime)
        if self.on_change is not None:
            self.on_change("event-defined", definition.to_json())
        return definition

    def delete(self, stream: str, name: str) -> EventDefinition:
        """Remove an event (an open one closes) and stop evaluating it; NotFound if none."""
        found = self.catalog.get(stream)
        if self.claim is not None and found is not None:
            self.claim(found.name)
        definition = self.events.delete(stream, name)
        self.runtime.detach(definition.runtime_id)
        if self.on_change is not None:
            self.on_change("event-deleted", definition.to_json())
        return definition


__all__ = ["StreamEventAdmin"]
