"""Opening and ending handles: the only writer of handle state.

`HandleService` opens handles (one window per subject and stream, the runtime attach) and ends
them. A join's handle (`JoinPlan`) holds the caller's window on both its streams and is attached
to the join runtime, with both streams' definitions. The runtime's deliver callback is
`HandleBuffer.put`, which checks under the buffer's lock that the buffer is open before writing, and
the buffer is closed (under that same lock) before the handle's state is persisted and before the
runtime is told to detach: so no tuple is delivered after `revoke` returns, however long Spark takes
to stop.

A differentially private window's handle (`pep.core.privacy`) is admitted only if the
consumer's remaining privacy budget can pay for it, and its deliveries go through the privacy
guard (`privacy_budget.py`), which pays for every window before it reaches the buffer and ends
the handle, its paid rows still readable, when the budget is spent.

A handle on a Kafka stream starts at its request: its plan is cut at the partitions' end offsets
read from the broker when it is opened (`_kafka_cuts`; offsets that cannot be read refuse it),
so no record acknowledged before the request reaches it (a Kafka record has no `_xsg_seq` to cut
at). Such a handle without a window gets a positioned buffer, which a restart fills again with
exactly what its readers may not have read (`pep.handles.buffer`, `pep/runtime/sources/replay.py`).
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Protocol, cast

from common.errors import described
from pep.core.errors import NotFound, Unavailable
from pep.core.plan import (
    AnyPlan,
    ExecutionPlan,
    JoinPlan,
    StreamDefinition,
    UnionPlan,
    any_plan_from_json,
    plan_streams,
    replayable,
    side_plans,
    with_start_offsets,
)
from pep.core.punctuations import shielded_plan
from pep.core.refs import handle_ref
from pep.handles.buffer import DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, HandleBuffer
from pep.handles.privacy_budget import PrivacyGuard, private_window
from pep.handles.records import HandleRecord, HandleState, HandleStore, StoredRequest, record_time
from pep.ports import Deliver, JoinRuntimePort, StreamRuntimePort

log = logging.getLogger(__name__)

FINAL_READS_POLL = 0.002  # seconds between two looks at revoked readers (`await_final_reads`)
# How long a handle that ended on its own terms (its privacy budget spent) keeps its paid rows
# for a reader that connects after the end, unless one was given its final event before.
KEPT_ROWS_SECONDS = 900.0
KAFKA_RETRY_AFTER = 5  # seconds, in the Retry-After of a request whose Kafka offsets were not read


# What tells windows apart: (kind, size, step, aggregates, keys, time attribute), or a union's
# members' signatures
WindowSignature = tuple[object, ...]


def window_signature(plan: ExecutionPlan | UnionPlan) -> WindowSignature | None:
    """What makes two windows "other" windows over the same tuples (None: no window). A
    union's windows are its members' (one grant each)."""
    if isinstance(plan, UnionPlan):
        signatures = tuple(sorted({s for s in map(window_signature, plan.plans)
                                   if s is not None}, key=repr))
        return signatures or None
    w = plan.window
    if w is None:
        return None
    return (w.kind, w.size, w.step, w.aggregates, w.keys, w.time_attribute)


def _positioned(stream: StreamDefinition, plan: AnyPlan) -> bool:
    """A handle whose buffer names its rows by micro-batch (`HandleBuffer(positioned=True)`):
    a Kafka stream's replayable view, which a restart gives again exactly."""
    return stream.source.kind == "kafka" and replayable(plan)


def _cut_kafka_sides(plan: AnyPlan, cuts: Mapping[str, tuple[int, ...]]) -> AnyPlan:
    """The plan with each Kafka stream's view cut at its offsets (`with_start_offsets`)."""
    if not cuts:
        return plan
    if isinstance(plan, JoinPlan):
        def side(p: ExecutionPlan) -> ExecutionPlan:
            # a join's sides are single plans (never unions): so are their cuts
            return with_start_offsets(p, cuts[p.stream]) if p.stream in cuts else p
        return replace(plan, left=side(plan.left), right=side(plan.right))
    return with_start_offsets(plan, cuts[plan.stream]) if plan.stream in cuts else plan


def _kafka_cuts(kafka_cut: Callable[[StreamDefinition], tuple[int, ...]] | None,
                definitions: list[StreamDefinition]) -> dict[str, tuple[int, ...]]:
    """Per Kafka stream of the plan, its partitions' end offsets now (`kafka_cut`): the handle
    starts there, so no record the broker acknowledged before the request reaches it (a Kafka
    record has no stream position: this is its cut, issue 41). Deny when in doubt: offsets
    that cannot be read refuse the request (503), never a handle without its cut."""
    cuts: dict[str, tuple[int, ...]] = {}
    for definition in definitions:
        if definition.source.kind != "kafka":
            continue
        if kafka_cut is None:
            raise Unavailable(f"stream {definition.name!r}: this gateway reads no Kafka "
                              "offsets, so a handle on a Kafka stream cannot start at its "
                              "request")
        try:
            cuts[definition.name] = tuple(kafka_cut(definition))
        except Exception as exc:  # noqa: BLE001 - whatever the client raised: refused
            # the broker's address and the topic are the owner's: in the log, not the answer
            log.warning("no handle on stream %s: %s", definition.name, described(exc))
            raise Unavailable(f"stream {definition.name!r}: the offsets of its Kafka "
                              "partitions could not be read, so a handle cannot start at "
                              "this request; retry later",
                              retry_after=KAFKA_RETRY_AFTER) from None
    return cuts


class StalePolicies(Exception):
    """The policies changed between the decision and the handle's creation: decide again."""


class WindowRegistryLike(Protocol):
    def acquire(self, subject: str, stream: str | tuple[str, ...], plan_key: str
                ) -> tuple[str, bool]: ...

    def release(self, handle_id: str) -> object: ...

    def release_many(self, handle_ids: Iterable[str]) -> object: ...

    def restore(self, subject: str, stream: str | tuple[str, ...], plan_key: str,
                handle_id: str) -> object: ...


class PlacementLike(Protocol):
    """Where a stream's handles are served, with several gateway processes (`pep.cluster`):
    `claim(streams)` returns when this process serves them all (taking them when no live
    process does), else raises (the request then goes to the process that does)."""

    def claim(self, streams: Iterable[str]) -> None: ...

    def holds(self, streams: Iterable[str]) -> bool: ...


class HandleService:
    """Opens, lists and ends handles; the only writer of handle state."""

    def __init__(self, store: HandleStore, streams: Callable[[str], StreamDefinition | None],
                 runtime: StreamRuntimePort, windows: WindowRegistryLike,
                 max_rows: int = DEFAULT_MAX_ROWS, max_bytes: int = DEFAULT_MAX_BYTES,
                 stream_position: Callable[[str], int | None] | None = None,
                 join_runtime: JoinRuntimePort | None = None,
                 privacy: PrivacyGuard | None = None,
                 kept_for: float = KEPT_ROWS_SECONDS,
                 kafka_cut: Callable[[StreamDefinition], tuple[int, ...]] | None = None,
                 tap: Callable[[str, Deliver], Deliver] | None = None,
                 admit: Callable[[list[StreamDefinition]], None] | None = None,
                 chain: Callable[[str], list[str]] | None = None
                 ) -> None:
        """`stream_position(name)`: the position (`_xsg_seq`) of the last tuple ingested into a
        stream, when the stream has positions (see `_start_after_other_windows`).
        `kafka_cut(definition)`: a Kafka stream's partitions' end offsets now (raising when they
        cannot be read); a handle on a Kafka stream is given only records at or after them
        (`_kafka_cuts`), and without it such a handle is refused.
        `join_runtime` runs joins (`attach_join(handle_id, (left, right), join_plan, deliver)`);
        without one, `runtime` gets them. `privacy` keeps the consumers' privacy budgets;
        without it a differentially private plan is refused (it could not be paid for).
        `kept_for`: seconds an ended handle's kept rows wait for a reader (`kept_buffer`).
        `tap(handle_id, put)`: what a single stream's handle is delivered to instead of its
        buffer's `put` (derived streams' feeds, `pep.streams.derived`); `admit(definitions)`
        raises a Refusal for streams no new handle may read (checked under the lock, with the
        streams looked up again). `chain(stream)`: the streams a derived stream derives from; a
        handle on it also books the caller's one window on each of them (a window over a
        derived stream's rows is a window over theirs: eXACML+ Example 2 across re-sharing)."""
        self.store = store
        self.streams = streams
        self.runtime = runtime
        # a stand-in for Spark (tests) given no join runtime takes both kinds of plan
        self.join_runtime = join_runtime if join_runtime is not None else \
            cast(JoinRuntimePort, runtime)
        self._joins: set[str] = set()  # handles attached to the join runtime
        self.windows = windows
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.stream_position = stream_position
        self.kafka_cut = kafka_cut
        self.privacy = privacy
        self.tap = tap
        self.admit = admit
        self.chain = chain
        # Serialises opening and ending handles and policy re-evaluation; reads never take it.
        self.lock = threading.RLock()
        # Bumped by every policy change; a handle decided under an older epoch is not created.
        self.policy_epoch = 0
        self._buffers: dict[str, HandleBuffer] = {}
        # Handles ended with their rows kept -> (buffer, monotonic time it is let go)
        self._kept: dict[str, tuple[HandleBuffer, float]] = {}
        self.kept_for = kept_for
        self._buffer_streams: dict[str, str] = {}  # handle id -> stream, while buffered
        self._dropped_before: dict[str, int] = {}  # stream -> rows dropped by ended buffers
        # Called with the final records after handles end (state persisted, runtime detached),
        # outside the lock, once per batch: e.g. to tell caching proxies that they are gone.
        self._listeners: list[Callable[[list[HandleRecord]], None]] = []
        self._open_listeners: list[Callable[[HandleRecord, bool], None]] = []
        # Handles being attached (outside the lock) -> their streams; a stream's deletion waits
        # for them (`wait_for_attaches`) before it removes what a query would read or write.
        self._attaching: dict[str, tuple[str, ...]] = {}
        self._attached = threading.Condition(threading.Lock())
        self.placement: PlacementLike | None = None  # several processes: `pep.cluster`

    def add_listener(self, callback: Callable[[list[HandleRecord]], None]) -> None:
        self._listeners.append(callback)

    # -- reads ------------------------------------------------------------------------------------

    def get(self, handle_id: str) -> HandleRecord | None:
        return self.store.get(handle_id)

    def get_owned(self, handle_id: str, subject: str) -> HandleRecord | None:
        """The handle if `subject` owns it, else None: others cannot even learn it exists. A
        handle of a deleted stream is no one's (`bury_stream`): None, like its stream."""
        record = self.store.get(handle_id)
        if record is None or not secrets.compare_digest(record.subject.encode(), subject.encode()):
            return None
        if self.store.buried(handle_id):
            return None
        return record

    def buffer(self, handle_id: str) -> HandleBuffer | None:
        with self.lock:
            return self._buffers.get(handle_id)

    def served(self, records: Iterable[HandleRecord]) -> list[HandleRecord]:
        """The handles this process serves (with several processes, each re-decides its own)."""
        with self.lock:
            return [r for r in records if self.placement is None or r.id in self._buffers]

    def kept_buffer(self, handle_id: str) -> HandleBuffer | None:
        """The closed buffer of a handle that ended keeping its rows (`end(keep_rows=True)`: a
        privacy budget spent), while a reader may still come for them: the rows it paid for,
        then its final event. None once a reader was given that final event, and `kept_for`
        seconds after the end (the rows live in memory only, as a live handle's do)."""
        with self.lock:
            self._drop_expired_kept()
            kept = self._kept.get(handle_id)
            if kept is None:
                return None
            if kept[0].final_delivered:
                del self._kept[handle_id]
                return None
            return kept[0]

    def _drop_expired_kept(self) -> None:
        now = time.monotonic()
        for handle_id in [h for h, (_, until) in self._kept.items() if until <= now]:
            del self._kept[handle_id]

    def list_for(self, subject: str) -> list[HandleRecord]:
        """The subject's handles, but those of deleted streams (`bury_stream`)."""
        return self.store.for_subject(subject)

    def bury_stream(self, stream: str) -> list[str]:
        """A stream is being deleted, its live handles revoked: every handle it ever had is
        set apart for good, so that none answers as a handle again (410, a listing) once its
        former owner registers the name anew: they were that stream's, not the new one's.
        Returns their ids (`unbury` them if the deletion fails)."""
        with self.lock:
            ids = self.store.on_stream(stream)
            self.store.bury(ids, stream)
        return ids

    def unbury(self, handle_ids: list[str]) -> None:
        with self.lock:
            self.store.unbury(handle_ids)

    def live(self) -> list[HandleRecord]:
        return self.store.live()

    def live_on(self, stream: str) -> list[HandleRecord]:
        """The live handles that read `stream` (a join's on either side)."""
        return self.live_on_streams((stream,))

    def live_on_streams(self, streams: Iterable[str]) -> list[HandleRecord]:
        """The live handles that read any of `streams` (a join's on either side), read
        through the store's stream index: the cost follows them, not every live handle."""
        names = set(streams)
        return [r for r in self.store.live_on(names) if any(s in names for s in r.streams)]

    # -- opening ----------------------------------------------------------------------------------

    def open(self, subject: str, roles: Iterable[str], admin: bool, plan: AnyPlan,
             policy_ids: Iterable[str], request: StoredRequest,
             epoch: int | None = None, plan_key: str | None = None) -> tuple[HandleRecord, bool]:
        """A live handle for this decision: (record, True) when new, (existing, False) when the
        same subject already has a handle with the same plan on that stream (a join: on both).
        `plan_key`: the decision's key (`pep.core.access.Grant.decided_key`: the plan's, or
        another when the grant carries the grant option); default the plan's.

        Raises the window registry's WindowConflict (another plan on that stream is live),
        StalePolicies (policies changed since `epoch`), NotFound (stream unknown) or
        Unavailable (the runtime refused)."""
        definitions = self._definitions(plan)
        roles = tuple(roles)
        key = plan_key or plan.key()  # the plan as decided
        # on punctuated streams: the consumer's roles in the plan, or a refusal
        plan = shielded_plan(plan, definitions, roles)
        if self.placement is not None:  # raises unless this process serves the streams
            self.placement.claim([d.name for d in definitions])
        stream = definitions[0]
        slots = self._slots(definitions)
        try:
            cuts: dict[str, tuple[int, ...]] | Unavailable = _kafka_cuts(
                self.kafka_cut, definitions
            )
        except Unavailable as exc:  # a broker's answer, before the lock; raised for a new handle
            cuts = exc
        with self.lock:
            if self.placement is not None and not self.placement.holds(plan_streams(plan)):
                raise Unavailable("the stream moves to another process; retry", retry_after=1)
            if epoch is not None and epoch != self.policy_epoch:
                raise StalePolicies()
            # The streams again, under the lock that a stream's change or deletion holds while
            # it deals with the live handles: a stream deleted since the decision is not found
            # (never a live handle on a deleted stream), one changed since is decided again.
            for definition in definitions:
                now = self.streams(definition.name)
                if now is None:
                    raise NotFound(f"no stream named {definition.name!r}")
                if now != definition:
                    if epoch is None:
                        raise NotFound(f"stream {definition.name!r} changed; ask again")
                    raise StalePolicies()
            if self.admit is not None:
                self.admit(definitions)
            handle_id, is_new = self.windows.acquire(subject, slots, key)
            if not is_new:
                existing = self.store.get(handle_id)
                if existing is not None and existing.live:
                    self._notify_opened(existing, False)
                    return existing, False
                # The registry remembered a handle that is not live here: forget it, start afresh.
                self.windows.release(handle_id)
                handle_id, is_new = self.windows.acquire(subject, slots, key)
            try:  # both read the store, which may fail: the window is then given back
                if isinstance(cuts, Unavailable):
                    raise cuts
                self._admit(subject, plan)
                plan = _cut_kafka_sides(self._start_after_other_windows(subject, plan), cuts)
            except BaseException:
                self.windows.release(handle_id)
                raise
            # plan_key stays the key of the plan as decided (what revocation compares with);
            # plan_json is what runs, its start position included (what a restart re-attaches).
            record = HandleRecord(
                id=handle_id, subject=subject, roles=tuple(roles), admin=bool(admin),
                stream=stream.name, plan_json=plan.canonical_json(), plan_key=key,
                policy_ids=tuple(sorted(set(policy_ids))), request=request)
            try:
                self.store.insert(record)
            except BaseException:
                self.windows.release(handle_id)
                raise
            buffer = HandleBuffer(self.max_rows, self.max_bytes,
                                  positioned=_positioned(stream, plan))
            self._buffers[handle_id] = buffer
            self._buffer_streams[handle_id] = stream.name
            self._begin_attach(handle_id, plan_streams(plan))
        # Attaching can take seconds (the first handle starts the stream's query): not under the
        # lock, so revocations of other handles are not held up. The buffer is registered first,
        # so a revocation meanwhile closes it and the runtime can deliver nothing.
        self._attach(record.id, definitions, plan, buffer, subject)
        self._notify_opened(record, True)
        return record, True

    def _admit(self, subject: str, plan: AnyPlan) -> None:
        """A private window's handle only if the consumer's budget can pay for it (raises
        PrivacyBudgetExceeded with the figures; Unavailable without a ledger)."""
        if private_window(plan) is None:
            return
        if self.privacy is None:
            raise Unavailable("this gateway keeps no privacy budgets, so it cannot serve a "
                              "differentially private window")
        self.privacy.admit(subject, plan)

    def _slots(self, definitions: list[StreamDefinition]) -> str | tuple[str, ...]:
        """The one-window slots a handle on these streams books: a join's two streams; a
        derived stream with the streams it derives from (`chain`); else its stream."""
        if len(definitions) > 1:
            return tuple(d.name for d in definitions)
        name = definitions[0].name
        upstream = self.chain(name) if self.chain is not None else []
        return (name, *upstream) if upstream else name

    def _definitions(self, plan: AnyPlan) -> list[StreamDefinition]:
        """The definitions of the plan's streams (a join's two); NotFound names a missing one."""
        found = []
        for name in plan_streams(plan):
            definition = self.streams(name)
            if definition is None:
                raise NotFound(f"no stream named {name!r}")
            found.append(definition)
        return found

    def add_open_listener(self, callback: Callable[[HandleRecord, bool], None]) -> None:
        """Called with (record, is_new) when a request gets a live handle, outside the lock."""
        self._open_listeners.append(callback)

    def _notify_opened(self, record: HandleRecord, is_new: bool) -> None:
        for callback in list(self._open_listeners):
            try:
                callback(record, is_new)
            except Exception:  # a listener must not undo a granted handle
                log.exception("handle open listener failed for %s", handle_ref(record.id))

    def _start_after_other_windows(self, subject: str, plan: AnyPlan) -> AnyPlan:
        """Example 2 across time: windows of other sizes over the same tuples rebuild raw values,
        so a consumer's query whose window differs from one of its earlier queries on the
        stream starts after every tuple ingested so far (those may have reached the earlier
        query). The same window again needs no such cut: it cannot tell anything new. A join's
        two sides are cut each against the caller's earlier queries on its own stream (joins
        included)."""
        if self.stream_position is None:
            return plan
        earlier: dict[str, set[WindowSignature | None]] = {}
        for r in self.store.for_subject(subject):
            try:
                sides = side_plans(any_plan_from_json(r.plan_json))
            except (KeyError, TypeError, ValueError):
                continue
            for name, side in sides.items():
                earlier.setdefault(name, set()).add(window_signature(side))
        stream_position = self.stream_position

        def position(side: ExecutionPlan | UnionPlan) -> int | None:
            """Where one stream's view starts: after every tuple so far when its window differs
            from an earlier one on its stream (each side of a join is another stream's: a
            stream joined with itself is refused when planned), else where it asked."""
            seen = earlier.get(side.stream)
            window = window_signature(side)
            return stream_position(side.stream) if seen and seen != {window} else None

        def cut(p: ExecutionPlan) -> ExecutionPlan:
            at = position(p)
            return p if at is None else replace(p, start_after=max(at, p.start_after or 0))

        if isinstance(plan, JoinPlan):
            # a join's sides are single plans (never unions): their cuts are too
            return replace(plan, left=cut(plan.left), right=cut(plan.right))
        if isinstance(plan, UnionPlan):
            at = position(plan)
            return plan if at is None else plan.with_start_after(at)
        return cut(plan)

    def _begin_attach(self, handle_id: str, streams: Iterable[str]) -> None:
        with self._attached:
            self._attaching[handle_id] = tuple(streams)

    def wait_for_attaches(self, stream: str, timeout: float = 60.0) -> bool:
        """Wait until no handle on `stream` is being attached to the runtime (an attach that
        began before the stream's handles were revoked ends by detaching itself); False on
        time-out."""
        with self._attached:
            return self._attached.wait_for(
                lambda: not any(stream in s for s in self._attaching.values()), timeout)

    def _attach(self, handle_id: str, streams: list[StreamDefinition], plan: AnyPlan,
                buffer: HandleBuffer, subject: str) -> None:
        try:
            self._attach_now(handle_id, streams, plan, buffer, subject)
        finally:
            with self._attached:
                self._attaching.pop(handle_id, None)
                self._attached.notify_all()

    def _attach_now(self, handle_id: str, streams: list[StreamDefinition], plan: AnyPlan,
                    buffer: HandleBuffer, subject: str) -> None:
        try:
            if isinstance(plan, JoinPlan):
                if any(private_window(side) is not None for side in (plan.left, plan.right)):
                    # refused when planned; a stored plan must not slip past the budgets
                    raise ValueError("a differentially private window cannot be joined")
                with self.lock:
                    self._joins.add(handle_id)
                self.join_runtime.attach_join(handle_id, (streams[0], streams[1]), plan,
                                              buffer.put)
            else:
                self.runtime.attach_handle(handle_id, streams[0], plan,
                                           self._deliverer(handle_id, subject, plan, buffer))
        except Exception as exc:  # noqa: BLE001 - said by its kinds
            # its kinds only, in the log, the handle's end and the answer: a query's error
            # quotes rows' values (common/errors.py)
            log.error("runtime refused handle %s: %s", handle_ref(handle_id), described(exc))
            self._finish(handle_id, HandleState.ENDED,
                         f"the stream runtime failed: {described(exc)}")
            raise Unavailable(f"the stream runtime could not start the query: "
                              f"{described(exc)}") from None
        with self.lock:
            finished_meanwhile = self._buffers.get(handle_id) is not buffer
        if finished_meanwhile:
            self._detach(handle_id)

    def _deliverer(self, handle_id: str, subject: str, plan: ExecutionPlan | UnionPlan,
                   buffer: HandleBuffer) -> Deliver:
        """What the runtime delivers to: the buffer, or for a private window the privacy guard
        in front of it (which pays for every window first); with a `tap`, what the buffer takes
        is also handed to it (after the guard paid)."""
        put = self.tap(handle_id, buffer.put) if self.tap is not None else buffer.put
        if private_window(plan) is None:
            return put
        if self.privacy is None:
            raise Unavailable("no privacy ledger: a differentially private window cannot run")

        def spent(reason: str) -> None:
            # from the micro-batch thread, under the runtime's handle lock: end it from another
            # thread (ending detaches, and a detach waits for the delivery in progress)
            threading.Thread(target=_end_spent, args=(self, handle_id, reason),
                             name="xsg-budget-spent", daemon=True).start()

        # a private window is a single plan's (a union never holds one: `private_window`)
        return self.privacy.deliverer(handle_id, subject, plan, put, spent)

    def resume(self, record: HandleRecord, policy_ids: Iterable[str] | None = None) -> bool:
        """Re-attach a live handle after a restart (or a take-over); False if not (ended, or
        ended since `record` was read: a derived stream's ending revokes handles of the
        restore's own pass, or its streams moved on meanwhile)."""
        with self.lock:
            if record.id in self._buffers:
                return True  # served here already
            current = self.store.get(record.id)
            if current is None or not current.live or (  # (with several processes: it moved)
                    self.placement is not None and not self.placement.holds(record.streams)):
                return False
            try:
                plan = any_plan_from_json(record.plan_json)
            except (KeyError, TypeError, ValueError) as exc:
                self._finish(record.id, HandleState.ENDED, f"its stored plan is unreadable: {exc}")
                return False
            try:
                definitions = self._definitions(plan)
            except NotFound:
                self._finish(record.id, HandleState.ENDED, "its stream no longer exists")
                return False
            slots = self._slots(definitions)
            generation = self.store.next_generation(record.id)
            try:
                self.windows.restore(record.subject, slots, record.plan_key, record.id)
            except Exception as exc:  # noqa: BLE001 - e.g. two live handles for one window
                self._finish(record.id, HandleState.ENDED, f"cannot restore its window: {exc}")
                return False
            if policy_ids is not None:
                self.store.set_policy_ids(record.id, policy_ids)
            buffer = HandleBuffer(self.max_rows, self.max_bytes, generation=generation,
                                  positioned=_positioned(definitions[0], plan))
            self._buffers[record.id] = buffer
            self._buffer_streams[record.id] = record.stream
            self._begin_attach(record.id, plan_streams(plan))
        try:
            self._attach(record.id, definitions, plan, buffer, record.subject)
        except Unavailable:
            return False
        return True

    # -- ending -----------------------------------------------------------------------------------

    def revoke(self, handle_id: str, reason: str) -> bool:
        return self._finish(handle_id, HandleState.REVOKED, reason)

    def close_now(self, handle_id: str, reason: str) -> bool:
        """Close a handle's buffer as revoked at once (its reader gets `revoked`, nothing more
        is written to it), ahead of `revoke_many`, which then records the state, detaches it
        and tells the listeners. A pass over many handles calls this as each is decided, so
        readers learn without waiting for the rest of the pass. Should the process stop in
        between, the handle is still live in the store and is decided again at start-up."""
        with self.lock:
            buffer = self._buffers.get(handle_id)
            return buffer.close(HandleState.REVOKED.value, reason) if buffer is not None else False

    def await_final_reads(self, handle_ids: Iterable[str], timeout: float) -> int:
        """Wait until the readers of these handles, closed by `close_now`, were given their
        final events, at most `timeout` seconds; how many were still waiting for it then.

        A pass calls this before recording and detaching what it revoked: that bookkeeping
        (a transaction, a thousand detaches, the listeners) took the interpreter lock from the
        event loop while the loop wrote the `revoked` events, and put 0.3-0.4 s between a
        DELETE and its last reader's `revoked` at 1,000 handles. Waiting, the pass sleeps."""
        with self.lock:
            waiting = [b for b in (self._buffers.get(h) for h in handle_ids)
                       if b is not None and b.closed]
        deadline = time.monotonic() + timeout
        while True:
            waiting = [b for b in waiting if not b.final_read]
            if not waiting or time.monotonic() >= deadline:
                return len(waiting)
            time.sleep(FINAL_READS_POLL)

    def revoke_many(self, revocations: Iterable[tuple[str, str]],
                    records: Mapping[str, HandleRecord] | None = None) -> list[str]:
        """Revoke several handles at once ((handle id, reason) pairs); returns those revoked.
        `records`: see `finish_many`."""
        return self.finish_many([(hid, HandleState.REVOKED, why) for hid, why in revocations],
                                records=records)

    def end(self, handle_id: str, reason: str, keep_rows: bool = False) -> bool:
        """End a handle (`ended`); with `keep_rows` the rows it was given stay readable before
        the final event (it ended on its own terms, not because it lost a right)."""
        return bool(self.finish_many([(handle_id, HandleState.ENDED, reason)],
                                     keep_rows=keep_rows))

    def release(self, handle_id: str, subject: str) -> HandleRecord | None:
        """The owner lets the handle go; None if it is not theirs. Idempotent on ended handles."""
        record = self.get_owned(handle_id, subject)
        if record is None:
            return None
        if self.placement is not None and record.live:  # where its buffer and query are
            self.placement.claim(record.streams)
        self._finish(handle_id, HandleState.RELEASED, "released by its owner")
        return self.store.get(handle_id)

    # Every write to a handle's record goes through this service under `lock` (what lets
    # `finish_many` trust records its caller read under that lock).

    def set_policy_ids(self, handle_id: str, policy_ids: Iterable[str]) -> None:
        with self.lock:
            self.store.set_policy_ids(handle_id, policy_ids)

    def set_policy_ids_many(self, updates: dict[str, tuple[str, ...]]) -> None:
        with self.lock:
            self.store.set_policy_ids_many(updates)

    def _finish(self, handle_id: str, state: HandleState, reason: str) -> bool:
        return bool(self.finish_many([(handle_id, state, reason)]))

    def finish_many(self, endings: Iterable[tuple[str, HandleState, str]],
                    keep_rows: bool = False,
                    records: Mapping[str, HandleRecord] | None = None) -> list[str]:
        """End handles: close their buffers first (no write passes after this), persist every
        state change in one transaction, free their windows, detach them from the runtime, then
        tell the listeners once with every ended record. Returns the ids that were live.
        `keep_rows`: the buffers keep their unread rows before the final event.
        `records`: the live records of (some of) these handles as the caller read them while
        holding `lock` until now (a revocation pass does); the listeners get them with their new
        state, reason and time instead of every record read back from the store. Exact: a record
        that was live then and is ended now was written by nothing else meanwhile (every write
        to a record holds `lock`), and this transaction changes only those three fields."""
        endings = list(endings)
        if not endings:
            return []
        at = record_time()
        with self.lock:
            closed = set()
            for handle_id, state, reason in endings:
                buffer = self._buffers.pop(handle_id, None)
                if buffer is not None:
                    buffer.close(state.value, reason, keep=keep_rows)
                    closed.add(handle_id)
                    self._forget_buffer(handle_id, buffer)
                    if keep_rows:
                        self._drop_expired_kept()
                        self._kept[handle_id] = (buffer, time.monotonic() + self.kept_for)
            changed = self.store.finish_many(endings, at=at)
            ended = [hid for hid, _, _ in endings if hid in changed or hid in closed]
            try:  # (the store's bookings, with several processes: one statement)
                self.windows.release_many(ended)
            except Exception:  # the handles are ended whatever the registry says
                log.exception("window registry release failed for %d handle(s)", len(ended))
        for handle_id in ended:
            self._detach(handle_id)
        finished = [hid for hid, _, _ in endings if hid in changed]
        if finished and self._listeners:
            ended_records = self._ended_records(finished, endings, records or {}, at)
            for callback in list(self._listeners):
                try:
                    callback(ended_records)
                except Exception:  # a listener must not undo an ended handle
                    log.exception("handle listener failed for %d handles", len(ended_records))
        return finished

    def _ended_records(self, finished: list[str], endings: list[tuple[str, HandleState, str]],
                       known: Mapping[str, HandleRecord], at: str) -> list[HandleRecord]:
        """The records of the handles just ended, in `finished` order: the caller's (see
        `finish_many`), as ended, else read back from the store."""
        ending: dict[str, tuple[HandleState, str]] = {}
        for hid, state, reason in endings:
            ending.setdefault(hid, (state, reason))  # the first ending of an id is the one kept
        held = {hid: r for hid, r in known.items() if r.state is HandleState.LIVE}
        unknown = [hid for hid in finished if hid not in held]
        read = {r.id: r for r in self.store.get_many(unknown)} if unknown else {}
        out = []
        for hid in finished:
            if hid in held:
                state, reason = ending[hid]
                out.append(held[hid].ended(state, reason, at))
            elif hid in read:
                out.append(read[hid])
        return out

    def _detach(self, handle_id: str) -> None:
        with self.lock:
            join = handle_id in self._joins
            self._joins.discard(handle_id)
        try:
            (self.join_runtime if join else self.runtime).detach(handle_id)
        except Exception as exc:  # noqa: BLE001 - the buffer is closed; nothing more is delivered
            log.error("runtime detach failed for %s: %s", handle_ref(handle_id), described(exc))

    def _forget_buffer(self, handle_id: str, buffer: HandleBuffer) -> None:
        stream = self._buffer_streams.pop(handle_id, None)
        if stream is not None and buffer.dropped:
            self._dropped_before[stream] = self._dropped_before.get(stream, 0) + buffer.dropped

    def dropped_rows(self) -> dict[str, int]:
        """Rows dropped for slow readers so far, per stream (ended handles included)."""
        with self.lock:
            totals = dict(self._dropped_before)
            for handle_id, buffer in self._buffers.items():
                stream = self._buffer_streams.get(handle_id)
                if stream is not None:
                    totals[stream] = totals.get(stream, 0) + buffer.dropped
        return totals

    def shutdown(self, streams: Iterable[str] | None = None,
                 reason: str = "the gateway is stopping; reconnect after its restart"
                 ) -> list[str]:
        """Process exit: buffers close with `shutdown`, but handles stay live in the store so that
        the next start re-evaluates and resumes them. `streams`: only the handles on those, as
        this process knows them (no store needed: another process serves them now, `pep.cluster`,
        and this one may have lost the store); their joins' queries stop. The handles closed."""
        names = None if streams is None else set(streams)
        with self.lock:
            ids = [
                h for h in self._buffers if names is None or self._buffer_streams.get(h) in names
            ]
            for hid in ids:
                buffer = self._buffers.pop(hid)
                buffer.close("shutdown", reason)
                self._forget_buffer(hid, buffer)
            if names is None:
                self._kept.clear()
            joins = [h for h in ids if names is not None and h in self._joins]
        for hid in joins:
            self._detach(hid)
        return ids


def _end_spent(service: HandleService, handle_id: str, reason: str) -> None:
    """End a handle that spent its privacy budget, keeping its rows; quiet when the process
    exits meanwhile (its store closed under it)."""
    try:
        service.end(handle_id, reason, keep_rows=True)
    except Exception as exc:  # noqa: BLE001 - said by its kinds
        if service.buffer(handle_id) is not None:  # not closed by the process exit
            log.error("handle %s spent its privacy budget and could not be ended: %s",
                      handle_ref(handle_id), described(exc))


__all__ = ["HandleService", "PlacementLike", "StalePolicies", "WindowRegistryLike"]
