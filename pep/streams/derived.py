"""Derived streams (issue 48): a consumer with the grant option re-shares its handle's rows as a
stream it owns, and everything derived from a grant ends with it.

**Deriving** (`DerivedStreams.derive`, `POST /handles/<id>/derive`): the caller's live handle on
one stream is decided again, now, as the caller stands now (`decide`: the handle's stored
request, its identity, the live policies): it must still be permitted exactly as it is (the same
decided key) and carry the grant option (`pep.core.obligations`; else 403 saying so). Its plan's
output becomes the derived stream's schema (`pep.core.derived.derive`: a join or a union of
grants cannot be derived, 422); the policies that already name the new stream's name (kept
from a deleted stream of that name, which only its former owner may register again) are
checked against the deriving grant as a write would be (409 naming one that is wider); then
the stream is registered, owned by the caller, `restricted` unless it asks otherwise (its schema
tells what the caller was given: the upstream owner's grant is nobody else's to list), together
with its derivation record, in one transaction (`StreamCatalog.register`). All of it under the
handles' lock, so no policy change or ending of the handle interleaves.

**Feeding** (`DerivedFeeds`): the handle's deliveries, as the runtime hands them to the handle's
buffer (after a private window paid for them), are appended to the derived stream's own ingest,
inside the gateway (never through the consumer's connection), while the derived stream has a
live handle (before that, nothing reads them: a stream's first handle starts at its end). The
derived stream is then an ingest stream like any other: its own shared query on Spark, its own
consumers, each decided by the derived stream's policies. The tap writes only while the
derivation record is live and names this handle, so rows never reach a stream of the same name
registered later. Records that do not fit the derived schema (a null time) are left out and
counted; nothing else is dropped. Its owner cannot append to it (`StreamCatalog.append_records`)
nor change its schema. Across a restart the feed is at least once: a micro-batch delivered but
not committed before a crash is delivered, and fed, again.

**Ending** (`handles_ended`, a listener of `HandleService`): when the deriving handle ends for
any reason (revoked by a policy change, an identity change or the grant option taken away, which
changes its decided key; released by its consumer; its stream deleted), the derivation ends:
the record says when and why, the feed stops for good, and every live handle on the derived
stream is revoked at once, in the same pass, before the change that caused it returns; their
readers get `revoked`, with a reason that names the derived stream and nothing of the upstream
policies, and no row after it. Those handles may feed derived streams of their own: their
endings end those too, transitively. The derived stream stays registered, with its policies
and nothing new to read: a request for it is 410 (`admit_streams`) until its owner deletes it.
A join that reads a derived stream is refused (its audit entries could not show the chain).
Deleting the derived stream removes its record and ends its consumers' handles as any stream's
deletion does; the deriving handle goes on.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from common.auth import Identity
from common.errors import described
from pep.audit.trail import AuditTrail, PolicyVersions
from pep.core import punctuations
from pep.core.access import Grant
from pep.core.derived import CannotDerive, Derivation, WiderThanGrant, derive
from pep.core.errors import Conflict, Gone, InvalidInput, NotFound, NotPermitted, Refusal
from pep.core.explain import plan_to_json
from pep.core.jsontypes import JsonObject, JsonValue
from pep.core.plan import StreamDefinition
from pep.core.refs import handle_ref
from pep.core.rows import RowBatch
from pep.handles.records import HandleRecord
from pep.streams.catalog import StreamCatalog
from pep.streams.definition import (
    RESTRICTED,
    STREAM_NAME,
    InvalidStream,
    StreamConflict,
    StreamJson,
    StreamNotFound,
    describe,
    field_json,
    parse_schema,
)
from pep.streams.derivations import (
    DerivationRecord,
    DerivationTable,
    DerivationView,
    FeedStats,
    now,
)
from pep.streams.policy_check import derived_warnings
from pep.streams.records import RecordError

log = logging.getLogger(__name__)

Deliver = Callable[[RowBatch], bool]
DERIVE_FIELDS = ("name", "description", "visibility")


class Handles(Protocol):
    """What derived streams need of the handles (`pep.handles.service.HandleService`)."""

    lock: threading.RLock
    policy_epoch: int

    def get_owned(self, handle_id: str, subject: str) -> HandleRecord | None: ...

    def get(self, handle_id: str) -> HandleRecord | None: ...

    def live_on(self, stream: str) -> list[HandleRecord]: ...

    def served(self, records: Iterable[HandleRecord]) -> list[HandleRecord]: ...

    def revoke_many(self, revocations: Iterable[tuple[str, str]],
                    records: Mapping[str, HandleRecord] | None = None) -> list[str]: ...


# -- the feed --------------------------------------------------------------------------------------

@dataclass
class _Feed:
    """One derived stream fed by one handle: what it appended, and what did not fit."""

    stream: str
    handle_id: str
    rows: int = 0
    batches: int = 0
    left_out: int = 0
    closed: bool = False


class DerivedFeeds:
    """The taps on deriving handles' deliveries (`tap`, wrapped around every single-stream
    handle's buffer by `HandleService`): a dict read per delivered batch, so a handle that
    feeds nothing pays nothing else, and a derivation started on a running handle needs no
    re-attach. `has_readers(stream)`: whether the derived stream has a live handle."""

    def __init__(self, catalog: StreamCatalog,
                 has_readers: Callable[[str], bool] | None = None) -> None:
        self._catalog = catalog
        self._derivations: DerivationTable = catalog.derivations
        self._has_readers = has_readers
        self._lock = threading.Lock()
        self._feeds: dict[str, tuple[_Feed, ...]] = {}
        for record in self._derivations.live():
            self.start(record.handle_id, record.stream)

    def tap(self, handle_id: str, put: Deliver) -> Deliver:
        """What the runtime delivers to instead of `put`: `put`, then the handle's feeds with
        the rows `put` took (none once the handle's buffer is closed)."""
        feeds = self._feeds

        def deliver(batch: RowBatch) -> bool:
            taken = put(batch)
            fed = feeds.get(handle_id)
            if taken and fed and batch.rows:
                for feed in fed:
                    self._append(feed, batch)
            return taken

        return deliver

    def start(self, handle_id: str, stream: str) -> None:
        with self._lock:
            kept = tuple(f for f in self._feeds.get(handle_id, ()) if f.stream != stream)
            self._feeds[handle_id] = kept + (_Feed(stream, handle_id),)

    def stop(self, stream: str) -> None:
        """No more rows for `stream` from any handle."""
        with self._lock:
            for handle_id, feeds in list(self._feeds.items()):
                for feed in feeds:
                    if feed.stream.lower() == stream.lower():
                        feed.closed = True
                kept = tuple(f for f in feeds if not f.closed)
                if kept:
                    self._feeds[handle_id] = kept
                else:
                    del self._feeds[handle_id]

    def stats(self) -> dict[str, FeedStats]:
        """Per derived stream being fed: rows and batches appended, records left out."""
        with self._lock:
            return {f.stream: {"rows": f.rows, "batches": f.batches, "left_out": f.left_out}
                    for feeds in self._feeds.values() for f in feeds}

    def _append(self, feed: _Feed, batch: RowBatch) -> None:
        """Append the batch's rows to the derived stream's ingest; never raises (the runtime
        would detach the deriving handle)."""
        record = self._derivations.get(feed.stream)
        if feed.closed or record is None or not record.live or record.handle_id != feed.handle_id:
            return
        try:
            if self._has_readers is not None and not self._has_readers(feed.stream):
                return
            lines = list(batch.rows)
            while lines:
                try:
                    appended = self._catalog.ingest.append_records(
                        feed.stream, "\n".join(lines).encode("utf-8"))
                except RecordError as exc:
                    if exc.line is None or not 1 <= exc.line <= len(lines):
                        raise
                    # a record the derived schema refuses (a null time): left out, counted
                    del lines[exc.line - 1]
                    feed.left_out += 1
                    continue
                feed.rows += appended
                feed.batches += 1
                break
        except (StreamNotFound, StreamConflict):
            feed.closed = True  # the derived stream is gone: its deletion settles the rest
        except Exception as exc:  # noqa: BLE001 - the deriving handle must keep its own deliveries
            log.error("derived stream %s: a batch of %s could not be appended: %s",
                      feed.stream, handle_ref(feed.handle_id), described(exc))


def admit_streams(derivations: DerivationTable, definitions: Sequence[StreamDefinition]) -> None:
    """`HandleService`'s check, under its lock, before a handle opens on these streams: a
    derived stream whose feed ended gets no new data (Gone), and a join never reads a derived
    stream (its audit entries could not show each owner its chain)."""
    for definition in definitions:
        record = derivations.get(definition.name)
        if record is None:
            continue
        if len(definitions) > 1:
            raise CannotDerive(f"stream {definition.name!r} is derived from stream "
                               f"{record.source!r}; a join that reads a derived stream is not "
                               "supported: read it on its own", stream=definition.name)
        if not record.live:
            raise Gone(f"derived stream {definition.name!r} gets no new data: the grant it "
                       f"derives from ended at {record.ended_at}; its owner may delete it",
                       stream=definition.name)


# -- the service -----------------------------------------------------------------------------------

def _derive_body(body: JsonValue) -> JsonObject:
    if not isinstance(body, dict):
        raise InvalidInput("a derivation is a JSON object {\"name\": ..., \"description\": ...,"
                           " \"visibility\": ...}")
    unknown = sorted(map(str, set(body) - set(DERIVE_FIELDS)))
    if unknown:
        raise InvalidInput(f"unknown key(s): {', '.join(unknown)}; known: "
                           f"{', '.join(DERIVE_FIELDS)}", field=f"/{unknown[0]}"[:200])
    name = body.get("name")
    if not isinstance(name, str) or not STREAM_NAME.fullmatch(name):
        raise InvalidInput(f"the derived stream's name must match {STREAM_NAME.pattern}, got "
                           f"{str(name)[:80]!r}", field="/name")
    return body


@dataclass
class DerivedStreams:
    """Deriving streams, feeding them, ending them (module docstring). `decide(record,
    identity)` decides a handle's stored request again now (a `pep.core.access.Grant`, or a
    Refusal); `policies_about(name)` lists (policy id, document) of the policies whose target
    names `name`; `audit` records derivations and their ends."""

    catalog: StreamCatalog
    handles: Handles
    feeds: DerivedFeeds
    decide: Callable[[HandleRecord, Identity], Grant]
    policies_about: Callable[[str], list[tuple[str, bytes]]] = field(default=lambda name: [])
    audit: AuditTrail | None = None
    # (id, version, store_version) of policies, as the audit trail names them
    policy_versions: PolicyVersions = field(default=lambda ids: [])
    # with several gateway processes: raises unless this process serves these streams (a
    # derivation is made where its deriving handle is served: `pep.cluster`)
    claim: Callable[[Iterable[str]], None] | None = None
    # whether a handle's rows go to a plan topic (`delivery = "kafka"`, pep/delivery): they
    # never pass this process, so they cannot feed a derived stream
    through_topic: Callable[[str], bool] = field(default=lambda handle_id: False)

    # -- what a derived stream is --------------------------------------------------------------

    def derivation(self, name: str) -> Derivation | None:
        """The derived stream `name` as the checks read it (None: it is not derived). Its
        source's schema as it is now; a source deleted since: the derived stream's own (nothing
        hidden is then known, and its derivation ended with the source)."""
        record = self.catalog.derivations.get(name)
        stream = self.catalog.get(name)
        if record is None or stream is None:
            return None
        source = self.catalog.get(record.source)
        schema = source.schema if source is not None else stream.schema
        time = source.time_attribute if source is not None else None
        try:
            found = derive(stream.name, record.plan, schema, time)
        except CannotDerive:
            found = None
        if found is None or found.schema != stream.schema:
            # the source changed shape since (attributes added are never in the plan): read
            # the derived stream as registered
            return Derivation(stream.name, record.source, record.plan, schema, stream.schema,
                              stream.time_attribute)
        return found

    # -- deriving -------------------------------------------------------------------------------

    def derive(self, identity: Identity, handle_id: str, body: JsonValue) -> StreamJson:
        """Register the caller's handle's output as a derived stream it owns (module
        docstring); the stream as described to its owner, with `derived_from`."""
        body = _derive_body(body)
        name = body["name"]
        visibility = body.get("visibility", RESTRICTED)
        handles = self.handles
        if self.claim is not None:
            owned = handles.get_owned(handle_id, identity.subject)
            if owned is not None and owned.live:
                self.claim(owned.streams)
        with handles.lock:
            record = handles.get_owned(handle_id, identity.subject)
            if record is None:
                raise NotFound("no such handle")
            if not record.live:
                raise Gone(f"handle is {record.state.value}", state=record.state.value)
            if len(record.streams) > 1:
                raise CannotDerive("the handle reads a join of two streams: only a single "
                                   "grant's plan on one stream can be derived")
            for fed in self.catalog.derivations.fed_by(record.id):
                raise Conflict(f"this handle already feeds derived stream {fed.stream!r}; "
                               "one handle feeds one derived stream", stream=fed.stream)
            source = self.catalog.get(record.stream)
            if source is None:
                raise NotFound("no such handle")
            if punctuations.enabled(source):
                # its rows are what the stream's punctuations show the caller's roles: re-shared,
                # they would reach roles the punctuations exclude (the paper's per-punctuation
                # grant option is not built)
                raise CannotDerive(f"stream {source.name!r} carries security punctuations: "
                                   "what a handle on it gets cannot be re-shared "
                                   "(docs/punctuations.md)", stream=source.name)
            if self.through_topic(record.id):
                raise CannotDerive("the handle's rows are delivered through a Kafka plan topic "
                                   "by the edges and never pass the gateway: they cannot feed "
                                   "a derived stream (docs/operate/edges.md)",
                                   stream=source.name)
            try:
                grant = self.decide(record, identity)
            except Refusal as exc:
                raise NotPermitted(f"your handle on stream {source.name!r} is no longer "
                                   f"permitted as it is ({type(exc).__name__}: {exc.message}); "
                                   "it is about to be revoked", stream=source.name) from None
            if grant.decided_key != record.plan_key:
                raise Conflict(f"the policies changed what your handle on stream "
                               f"{source.name!r} gets since it opened; it is re-decided now: "
                               "ask for the stream again, then derive", stream=source.name)
            if not grant.grant_option:
                raise NotPermitted(
                    f"your grant on stream {source.name!r} carries no grant option (obligation "
                    "exacml:obligation:stream-grant-option, a sharing rule's \"grant_option\": "
                    "true): you may read what it gives you, not re-share it", stream=source.name)
            derivation = derive(name, grant.plan, source.schema, source.time_attribute)
            try:
                schema = parse_schema(derivation.schema)
            except InvalidStream as exc:
                raise CannotDerive(f"the handle's output cannot be a stream's schema: "
                                   f"{exc.message}") from None
            self._check_kept_policies(derivation)
            entry = DerivationRecord(
                stream=name, owner=identity.subject, source=source.name, handle_id=record.id,
                plan_json=grant.plan.canonical_json(), plan_key=record.plan_key,
                policy_ids=tuple(record.policy_ids), created_at=now())
            definition = self.catalog.register(
                name, identity.subject, [field_json(f) for f in schema.fields],
                {"kind": "ingest"}, derivation.time_attribute, trusted=False,
                visibility=visibility, description=body.get("description"), derivation=entry)
            self.feeds.start(record.id, definition.name)
        if self.audit is not None:
            self.audit.stream_derived(entry, self.catalog.derivations.chain(definition.name),
                                      grant.plan_json)
        stored = self.catalog.entry(definition.name)
        out = describe(definition, stored.created_at if stored else None, show_source=True,
                       visibility=stored.visibility if stored else None,
                       settings=stored.settings() if stored else None)
        out["derived_from"] = {"stream": source.name, "holds": derivation.describe()}
        return out

    def _check_kept_policies(self, derivation: Derivation) -> None:
        """The policies that already name the derived stream's name (kept when a stream of that
        name was deleted) are checked as a write of them would be now."""
        for policy_id, document in self.policies_about(derivation.stream):
            try:
                derived_warnings(document, derivation)
            except WiderThanGrant as exc:
                raise Conflict(f"policy {policy_id!r}, kept for the name "
                               f"{derivation.stream!r}, is wider than this grant: "
                               f"{exc.message}; delete or narrow it first",
                               policy=policy_id, wider=exc.what) from None

    # -- ending -----------------------------------------------------------------------------------

    def handles_ended(self, records: list[HandleRecord]) -> None:
        """`HandleService`'s listener: a deriving handle that ended ends its derived streams,
        and their live handles are revoked (transitively: their endings come back here)."""
        for record in records:
            for derivation in self.catalog.derivations.fed_by(record.id):
                self._end(derivation, f"its deriving handle was {record.state.value}: "
                                      f"{record.reason}", record.state.value)

    def _end(self, derivation: DerivationRecord, reason: str, how: str) -> None:
        handles = self.handles
        why = (f"derived stream {derivation.stream!r} ended: the grant it derives from ended "
               "(it gets no new data)")
        with handles.lock:
            handles.policy_epoch += 1  # a request decided meanwhile is decided again
            ended = self.catalog.derivations.end(derivation.stream, reason)
            self.feeds.stop(derivation.stream)
            if ended is None:
                return
            # (with several processes, a derived stream's handles are served with its source's)
            live = handles.served(handles.live_on(derivation.stream))
            revoked = handles.revoke_many([(r.id, why) for r in live],
                                          {r.id: r for r in live})
        log.info("derived stream %s ended (%s); %d handle(s) revoked", derivation.stream, how,
                 len(revoked))
        if self.audit is not None:
            self.audit.derivation_ended(ended, self.catalog.derivations.chain(ended.stream),
                                        how, len(revoked))

    def settle(self) -> int:
        """At start, once the handles were restored: a live derivation whose deriving handle is
        no longer live ends (it ended while nothing listened), and an ended one's handles still
        live are revoked. Returns how many derivations ended."""
        ended = 0
        for derivation in self.catalog.derivations.live():
            record = self.handles.get(derivation.handle_id)
            if record is None or not record.live:
                self._end(derivation, "its deriving handle did not survive the restart",
                          "ended")
                ended += 1
        for derivation in self.catalog.derivations.all():
            if derivation.live:
                continue
            # (with several processes, the one serving the derived stream revokes them)
            live = self.handles.served(self.handles.live_on(derivation.stream))
            if live:
                self.handles.revoke_many(
                    [(r.id, f"derived stream {derivation.stream!r} ended: the grant it "
                            "derives from ended (it gets no new data)") for r in live])
        return ended

    # -- reading -----------------------------------------------------------------------------------

    def _owner_of(self, stream: str) -> str | None:
        """A stream's owner, or a deleted stream's former owner."""
        found = self.catalog.get(stream) or self.catalog.deleted(stream)
        return found.owner if found is not None else None

    def chain_view(self, name: str, identity: Identity) -> DerivationView:
        """What `GET /streams/<name>/derivation` shows this caller: the derivation, if the
        caller is an administrator, the derived stream's owner or the owner of a stream it
        derives from (anyone else: NotFound, as for a stream that is not derived). The
        deriving plan is shown to the derived stream's owner (its own handle's) and to the
        source's owner (its grant), and so is the reason it ended (the deriving handle's); the
        policies that decided it to the source's owner only (they are its policies) and to
        administrators."""
        record = self.catalog.derivations.get(name)
        if record is None:
            raise NotFound(f"stream {name!r} is not derived")
        chain = self.catalog.derivations.chain(record.stream)
        admin = identity.admin
        owner = record.owner == identity.subject
        source_owner = self._owner_of(record.source) == identity.subject
        upstream = any(self._owner_of(s) == identity.subject for s in chain)
        if not (admin or owner or upstream):
            raise NotFound(f"stream {name!r} is not derived")
        out = record.summary(chain)
        if admin or owner or source_owner:
            out["plan"] = plan_to_json(record.plan)
            derived = self.derivation(record.stream)
            if derived is not None:
                out["holds"] = derived.describe()
        else:
            out.pop("reason", None)  # the deriving handle's: its owner's and its source's
        if admin or source_owner:
            out["policies"] = self.policy_versions(record.policy_ids)
        fed = self.feeds.stats().get(record.stream)
        if fed is not None and (admin or owner):
            out["fed"] = fed
        return out


__all__ = ["DerivedStreams", "DerivedFeeds", "admit_streams", "Handles"]
