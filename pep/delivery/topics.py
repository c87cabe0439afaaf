"""The gateway's side of delivery through plan topics (`delivery = "kafka"`).

- A handle opened (or resumed) on a single stream, without a differentially private window, is
  attached to the runtime with a `TopicTarget` instead of its buffer (`tap`): the runtime writes
  its plan's rows to the plan's destination (`pep/runtime/delivery`), and its rows never reach
  this process's memory. The destination is the plan's live one in the store, else a new lane
  (`pep.delivery.lanes`) on a topic of the stream with room for one more plan
  (`plans_per_topic`), else on a new topic (created here, one partition, the configured
  retention); the handle is bound to it from the topic's end offset then (a handle joining a
  plan gets nothing of the plan from before it). A join, a private window and a handle that
  feeds derived streams stay in this process.
- When handles end (`ended`, a `HandleService` listener, so before the DELETE or the
  revocation pass returns): the revocation is published on the control topic and every live
  edge's acknowledgement awaited (`pep.delivery.control`); a revocation pass tells the edges
  earlier, once its handles are decided and before its transaction (`closing`), as it closes
  this process's readers then. Then the destinations no live handle reads any more are
  marked ended in the store (no handle binds to them again), and the Kafka
  topics left with no live destination are deleted `DELETE_GRACE` seconds later (a micro-batch
  under way may still be writing to them; one that another gateway gave a new lane meanwhile
  is kept).
- At start, topics that no live handle reads (a gateway stopped before deleting them) go the
  same way, and so do topics whose destinations all ended but that were never deleted (a
  gateway stopped within `DELETE_GRACE`, or the brokers were away then); the delivery topics
  it takes up (the control and acks topics, the live plan topics) are given the settings it
  would create them with (`pep.delivery.control.align_topics`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from common.edge_affinity import affinity_key, rendezvous
from pep.core.errors import Unavailable
from pep.delivery.control import (
    EDGE_ALIVE,
    Revocations,
    align_topics,
    end_offset,
    ensure_topics,
)
from pep.delivery.lanes import destination, kafka_topic, kafka_topics, new_lane
from pep.delivery.settings import FENCE_KEY, DeliverySettings
from pep.delivery.store import DeliveryStore
from pep.handles.records import HandleRecord
from pep.ports import Deliver, TopicTarget

log = logging.getLogger(__name__)

DELETE_GRACE = 10.0  # seconds between a topic's last handle ending and the topic's deletion
ENDS_KEPT = 2.0  # seconds a topic's end offset serves a new lane's handles (`_lane_start`)
TOLD_KEPT = 60.0  # seconds `closing` remembers a handle it told of, for `ended`


@dataclass
class _Creation:
    """A plan's destination on its way (`PlanTopics.topic_for`)."""

    stream: str
    plan_key: str
    topic: str = ""  # its destination, once placed (`_place`)
    new: bool = False  # on a topic created for it and others now (empty: bound from 0)
    done: bool = False
    error: Exception | None = None


class PlanTopics:
    """Plan topics for one gateway process (the module docstring). `handle(id)`: a handle's
    stored record; `eligible(record)`: whether it may be delivered through a topic."""

    def __init__(self, settings: DeliverySettings, store: DeliveryStore,
                 handle: Callable[[str], HandleRecord | None],
                 eligible: Callable[[HandleRecord], bool]) -> None:
        from confluent_kafka import Consumer
        from confluent_kafka.admin import AdminClient

        self.settings = settings
        self.store = store
        self._handle = handle
        self._eligible = eligible
        kafka_log = logging.getLogger("pep.delivery.kafka")
        self._admin = AdminClient(settings.client(logger=kafka_log))
        self._offsets = Consumer(settings.client(**{
            "group.id": settings.group_prefix + "gateway", "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 1000,  # new plan topics are known soon
            "logger": kafka_log}))
        ensure_topics(self._admin, settings, (settings.control_topic, settings.acks_topic))
        self.revocations = Revocations(
            settings, lambda: [e.edge for e in store.edges(seen_within=EDGE_ALIVE)])
        # one topic per plan, also when two handles open at once (`topic_for`)
        self._lock = threading.Condition()
        self._creating: dict[tuple[str, str], _Creation] = {}  # plans whose topic is on its way
        self._pending: list[_Creation] = []  # topics the next creation makes
        self._creator = False  # a call is creating topics
        self._timers: list[tuple[threading.Timer, list[str]]] = []  # deletions to come
        self._ends: dict[str, tuple[float, int]] = {}  # topic -> (when, its end): `_lane_start`
        self._told: dict[str, float] = {}  # handles `closing` told the edges of -> when
        self.retire(store.orphan_topics())
        self._delete_later(store.undeleted_topics())  # ended before, never deleted
        # the topics this gateway takes up (made before it started, perhaps by an older xsg
        # or under other settings) get the settings it creates topics with
        self._align([settings.control_topic, settings.acks_topic,
                     *kafka_topics(t for t in store.live_topics()
                                   if t.startswith(settings.plan_prefix))])

    def _align(self, topics: list[str]) -> None:
        """`align_topics` within `ALIGN_TIMEOUT` seconds; what it could not do is logged once
        (a WARNING) and left to the next start: a start does not wait long on brokers that
        are away, and a topic keeps working with its old settings meanwhile."""
        done = align_topics(self._admin, self.settings, topics)
        if done.altered:
            log.info("delivery topics: %d existing topic(s) given this gateway's settings "
                     "(retention, segments, index interval; other keys kept)", done.altered)
        if done.error is not None:
            log.warning("delivery topics: the settings of %d of %d existing topic(s) could not "
                        "be checked or changed (%s); they keep theirs until the next start",
                        done.left, len(topics), done.error)

    # -- opening --------------------------------------------------------------------------------

    def tap_over(self, other: Callable[[str, Deliver], Deliver]
                 ) -> Callable[[str, Deliver], Deliver]:
        """`HandleService`'s tap: a topic target for an eligible handle, `other`'s otherwise."""
        def tap(handle_id: str, put: Deliver) -> Deliver:
            target = self.target(handle_id, put)
            return target if target is not None else other(handle_id, put)
        return tap

    def target(self, handle_id: str, put: Deliver) -> TopicTarget | None:
        """The handle's topic target, bound in the store; None when it stays in this process.
        `put` is its buffer's: the target is open while that buffer is."""
        record = self._handle(handle_id)
        if record is None or not self._eligible(record):
            return None
        binding = self.store.binding(handle_id)
        if binding is None or not self.store.topic_live(binding[0]):
            # keyed by the plan that runs (its start position included), not the plan as
            # decided: the runtime writes each running plan's rows to its handles' topics, so
            # two running plans on one topic would write its rows twice
            running = hashlib.sha256(record.plan_json.encode("utf-8")).hexdigest()
            dest, fresh = self.topic_for(record.stream, running)
            # a plan already running: the topic's end now (a handle joining a plan gets
            # nothing of it from before); a lane made now: `_lane_start`
            self.store.bind(handle_id, dest, self._lane_start(kafka_topic(dest)) if fresh
                            else end_offset(self._offsets, kafka_topic(dest)))
            binding = self.store.binding(handle_id)
            assert binding is not None
        owner: Any = getattr(put, "__self__", None)  # the handle's HandleBuffer
        if isinstance(getattr(owner, "closed", None), bool):
            return TopicTarget(binding[0], lambda: not owner.closed)
        return TopicTarget(binding[0], lambda: True)

    def _lane_start(self, topic: str) -> int:
        """Where the first handle of a lane made now starts: no record of the lane exists yet,
        so any offset up to the topic's end will do, and the end asked at most `ENDS_KEPT`
        seconds ago (0 for a topic created now: the broker may not know its leader yet)
        spares a round trip to the broker per new plan (most handles of a benchmark's
        thousands); the reader skips the other lanes' few records after it."""
        now = time.monotonic()
        with self._lock:
            kept = self._ends.get(topic)
        if kept is not None and now - kept[0] < ENDS_KEPT:
            return kept[1]
        end = end_offset(self._offsets, topic)
        with self._lock:
            self._ends[topic] = (now, end)
            if len(self._ends) > 10_000:
                self._ends = {t: e for t, e in self._ends.items() if now - e[0] < ENDS_KEPT}
        return end

    def topic_for(self, stream: str, plan_key: str) -> tuple[str, bool]:
        """The plan's live destination, made when it has none; (its name, whether this call
        made it: its lane has no record yet).

        Topics asked for at the same time are created together: a creation is one round trip
        to the controller (about 50 ms here) whether it makes one topic or a thousand, so
        while one call creates, the others' plans wait for the next call and go in one
        (handles opened by 8 clients at once: 8 topics a round trip, not one)."""
        key = (stream, plan_key)
        with self._lock:
            topic = self.store.live_topic(stream, plan_key)
            if topic is not None:
                return topic, False
            creation = self._creating.get(key)
            mine = creation is None
            if creation is None:
                creation = _Creation(stream, plan_key)
                self._creating[key] = creation
                self._pending.append(creation)
            while not creation.done:
                if self._pending and not self._creator:
                    self._create_pending()  # returns with the lock held again
                else:
                    self._lock.wait()
        if creation.error is not None:
            raise creation.error
        if mine:
            log.debug("plan destination %s for a plan of %s", creation.topic, stream)
        return creation.topic, mine

    def _create_pending(self) -> None:
        """Create every pending topic in one call (the lock held on entry and on return, not
        meanwhile), record them in the store, and wake their waiters."""
        self._creator = True
        batch, self._pending = self._pending, []
        self._lock.release()
        try:
            created = self._place(batch)
            if created:
                ensure_topics(self._admin, self.settings, created)
            for c in batch:
                self.store.add_topic(c.topic, c.stream, c.plan_key)
        except Exception as exc:  # noqa: BLE001 - raised to every caller of the call
            for c in batch:
                c.error = exc
        else:
            now = time.monotonic()
            for c in batch:  # a topic created now is empty
                if c.new:
                    self._ends[kafka_topic(c.topic)] = (now, 0)
        finally:
            self._lock.acquire()
            self._creator = False
            for c in batch:
                c.done = True
                self._creating.pop((c.stream, c.plan_key), None)
            self._lock.notify_all()

    def _place(self, batch: list[_Creation]) -> list[str]:
        """Give each plan of `batch` its destination: a new lane on a topic of its stream with
        room (`plans_per_topic`), else on a new topic; the new topics' names (to create).
        With `plans_per_topic` 1, a topic of its own, without a lane."""
        per_topic = max(1, self.settings.plans_per_topic)
        created: list[str] = []
        by_stream: dict[str, list[_Creation]] = {}
        for c in batch:
            by_stream.setdefault(c.stream, []).append(c)
        for stream, plans in by_stream.items():
            room: tuple[str, int] | None = None
            if per_topic > 1:
                found = self.store.open_topic(stream, per_topic)
                room = (found[0], per_topic - found[1]) if found else None
            for c in plans:
                if room is None or room[1] <= 0:
                    room = (self.settings.plan_prefix + secrets.token_hex(12), per_topic)
                    created.append(room[0])
                c.topic = destination(room[0], new_lane() if per_topic > 1 else "")
                c.new = room[0] in created
                room = (room[0], room[1] - 1)
        return created

    def edge_url(self, handle_id: str) -> tuple[str, str] | None:
        """Where a reader of this handle reads it: (a live edge's URL, the affinity key of the
        handle's topic), the first live edge in the key's rendezvous order, so that the readers
        of one topic meet on one edge (`common.edge_affinity`); None when the handle is not
        delivered through a topic; Unavailable when no edge is alive."""
        binding = self.store.binding(handle_id)
        if binding is None:
            return None
        edges = [e.url for e in self.store.edges(seen_within=EDGE_ALIVE) if e.url]
        if not edges:
            raise Unavailable("no edge serves plan topics now; retry shortly", retry_after=1)
        key = affinity_key(kafka_topic(binding[0]))
        return rendezvous(edges, key)[0], key

    # -- ending ---------------------------------------------------------------------------------

    def closing(self, endings: list[tuple[str, str, str | None]]) -> None:
        """Handles a revocation pass is about to end, (id, state, reason) (a closing listener
        of `pep.handles.revocation.RevocationService`): the edges are told and acknowledge (or
        are fenced) before this returns, ahead of the pass's transaction and detaches; `ended`
        then tells only what was not told here."""
        topics = self.store.topics_of(h for h, _, _ in endings)
        if not topics:
            return
        ours = [e for e in endings if e[0] in topics]
        self._tell(ours, topics)
        now = time.monotonic()
        with self._lock:
            self._told = {h: t for h, t in self._told.items() if now - t < TOLD_KEPT}
            self._told.update((h, now) for h, _, _ in ours)

    def ended(self, records: list[HandleRecord]) -> None:
        """Handles ended (a `HandleService` listener): the edges are told and acknowledge before
        this returns (unless `closing` told them); the topics no live handle reads are
        retired."""
        topics = self.store.topics_of(r.id for r in records)
        if not topics:
            return
        with self._lock:
            told = {r.id for r in records if self._told.pop(r.id, None) is not None}
        self._tell([(r.id, r.state.value, r.reason) for r in records
                    if r.id in topics and r.id not in told], topics)
        self.retire(self.store.unused_topics(topics.values()))

    def _tell(self, endings: list[tuple[str, str, str | None]], topics: dict[str, str]) -> None:
        """Publish the endings (one revocation per state and reason); the edges that did not
        acknowledge are fenced off the handles' topics."""
        by_state: dict[tuple[str, str | None], list[str]] = {}
        for handle_id, state, reason in endings:
            by_state.setdefault((state, reason), []).append(handle_id)
        for (state, reason), ids in by_state.items():
            silent = self.revocations.publish(ids, state, reason)
            if silent:
                self.fence(silent, kafka_topics(topics[h] for h in ids))

    def fence(self, edges: Iterable[str], topics: Iterable[str]) -> list[str]:
        """Cut these edges off these plan topics: a DENY READ ACL for each one's Kafka
        principal on each topic (a DENY wins over the ALLOW its identity has on the plan
        topics' prefix), recorded in the store and taken away with the topic; once the brokers
        list it, a fence record on each topic (`_mark`). The principals fenced; an edge without
        an identity of its own (no SASL) cannot be fenced, which is logged.

        The ACL alone does not hold: Kafka authorizes a fetch when it arrives, and a fetch the
        edge parked at the broker just before the ACL took effect still returns what is
        written while it waits. The record does: a partition keeps its order, so everything
        written after this returns comes after the record, and an edge it names ends the
        topic's readers there (`pep.edge.feed`)."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        wanted = set(edges)
        principals = sorted({e.principal for e in self.store.edges() if e.edge in wanted})
        own = [p for p in principals if p not in ("User:ANONYMOUS", self.settings.principal)]
        if len(own) < len(principals) or len(principals) < len(wanted):
            log.error("plan topics: edge(s) %s did not acknowledge a revocation and cannot be "
                      "fenced (no Kafka identity of their own)", ", ".join(sorted(wanted)))
        names = sorted(set(topics))
        if not own or not names:
            return []
        bindings = [AclBinding(ResourceType.TOPIC, t, ResourcePatternType.LITERAL, p, "*",
                               AclOperation.READ, AclPermissionType.DENY)
                    for t in names for p in own]
        for future in self._admin.create_acls(bindings, request_timeout=10).values():
            future.result(10)  # a fence that could not be put raises: the DELETE fails
        for topic in names:  # before the waits: a fence put is taken away with its topic
            self.store.fenced(topic, own)
        self._until_in_force(bindings)
        self._mark(names, own)
        log.warning("plan topics: fenced %s off %d plan topic(s): no acknowledgement of a "
                    "revocation within %.2f s", ", ".join(own), len(names),
                    self.settings.ack_timeout)
        return own

    def retire(self, dests: Iterable[str]) -> None:
        """Mark these destinations ended now; their Kafka topics left with no live one are
        deleted `DELETE_GRACE` seconds later (`_delete` looks again)."""
        ended = sorted(set(dests))
        if not ended:
            return
        self.store.end_topics(ended)
        topics = kafka_topics(ended)
        self._delete_later(sorted(set(topics) - self.store.topics_in_use(topics)))

    def _delete_later(self, names: list[str]) -> None:
        """Delete these Kafka topics `DELETE_GRACE` seconds from now (`_delete`)."""
        if not names:
            return
        timer = threading.Timer(DELETE_GRACE, self._delete, args=(names,))
        timer.daemon = True
        timer.name = "xsg-plan-topics-delete"
        with self._lock:
            self._timers = [(t, n) for t, n in self._timers if t.is_alive()] + [(timer, names)]
        timer.start()

    def _delete(self, topics: list[str]) -> None:
        # a topic another gateway gave a new lane since it was retired stays
        try:
            topics = sorted(set(topics) - self.store.topics_in_use(topics))
        except Exception as exc:  # noqa: BLE001 - the next start deletes orphans
            log.warning("plan topics could not be checked before their deletion: %s", exc)
            return
        if not topics:
            return
        from confluent_kafka import KafkaError, KafkaException

        self._unfence(topics)
        deleted = []
        try:
            for topic, future in self._admin.delete_topics(topics, request_timeout=30).items():
                try:
                    future.result(30)
                    deleted.append(topic)
                except KafkaException as exc:
                    if exc.args and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        deleted.append(topic)  # deleted already (by another gateway)
                    else:  # the brokers away: the next start deletes it
                        log.warning("plan topic %s could not be deleted: %s", topic, exc)
                except Exception as exc:  # noqa: BLE001 - the next start deletes it
                    log.warning("plan topic %s could not be deleted: %s", topic, exc)
        except Exception as exc:  # noqa: BLE001 - the next start deletes them
            log.warning("plan topics could not be deleted: %s", exc)
        try:
            self.store.deleted_topics(deleted)
        except Exception as exc:  # noqa: BLE001 - deleted again at a start: no harm
            log.warning("plan topics deleted but not marked so in the store: %s", exc)

    def _mark(self, topics: list[str], principals: list[str], timeout: float = 10.0) -> None:
        """Write a fence record (`FENCE_KEY`, naming `principals`) to each topic, acknowledged
        by every in-sync replica, and wait for them all. Raises when one is not written within
        `timeout` (the DELETE then fails rather than answer as if the fence held)."""
        value = json.dumps({"fenced": principals}).encode("utf-8")
        cond = threading.Condition()
        reported: list[Any] = []  # one error (None: written) per record

        def done(error: Any, _msg: Any) -> None:
            with cond:
                reported.append(error)
                cond.notify_all()

        producer = self.revocations.producer
        for topic in topics:  # partition 0: a plan topic's only one
            producer.produce(topic, value, FENCE_KEY + secrets.token_hex(8).encode("ascii"),
                             partition=0, on_delivery=done)
        deadline = time.monotonic() + timeout
        producer.flush(timeout)
        with cond:  # another thread's flush or poll may serve the reports
            while len(reported) < len(topics) and time.monotonic() < deadline:
                cond.wait(max(0.0, deadline - time.monotonic()))
            errors = [e for e in reported if e is not None]
            if len(reported) < len(topics) or errors:
                raise RuntimeError("the fence records could not be written to the plan "
                                   f"topics: {errors[0] if errors else 'timed out'}")

    def _until_in_force(self, bindings: list[Any], timeout: float = 10.0) -> None:
        """Wait until the brokers list the fences among their ACLs: a broker applies a new ACL
        from the cluster's metadata a moment after the controller took it, and a fetch
        meanwhile would still be served. Raises when they do not within `timeout` (the DELETE
        then fails rather than answer as if the fence held)."""
        from confluent_kafka.admin import (
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        waiting = [AclBindingFilter(ResourceType.TOPIC, b.name, ResourcePatternType.LITERAL,
                                    b.principal, "*", AclOperation.READ, AclPermissionType.DENY)
                   for b in bindings]
        deadline = time.monotonic() + timeout
        while True:
            waiting = [f for f in waiting
                       if not self._admin.describe_acls(f, request_timeout=timeout).result(timeout)]
            if not waiting:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError("the brokers did not put the fences in force in time")
            time.sleep(0.05)

    def _unfence(self, topics: list[str]) -> None:
        """The fences of these topics go with them (Kafka keeps ACLs of deleted topics)."""
        from confluent_kafka.admin import (
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        for topic in topics:
            try:
                principals = self.store.fences(topic)
                if not principals:
                    continue
                filters = [AclBindingFilter(ResourceType.TOPIC, topic,
                                            ResourcePatternType.LITERAL, p, "*",
                                            AclOperation.READ, AclPermissionType.DENY)
                           for p in principals]
                for future in self._admin.delete_acls(filters, request_timeout=10).values():
                    future.result(10)
                self.store.unfence(topic)
            except Exception as exc:  # noqa: BLE001 - the store keeps it: the next try
                log.warning("plan topic %s: its fences could not be taken away: %s", topic, exc)

    def close(self) -> None:
        with self._lock:
            timers, self._timers = self._timers, []
        for timer, names in timers:  # deleted now rather than never (their handles ended)
            if timer.is_alive():
                timer.cancel()
                self._delete(names)
        self.revocations.close()
        self._offsets.close()


def delivered_through_topics(record: HandleRecord) -> bool:
    """A handle the runtime may write to a plan topic: one stream, no private window (its
    budget is paid in this process, window by window)."""
    from pep.core.plan import JoinPlan, any_plan_from_json
    from pep.handles.privacy_budget import private_window

    try:
        plan = any_plan_from_json(record.plan_json)
    except (KeyError, TypeError, ValueError):
        return False
    return not isinstance(plan, JoinPlan) and len(record.streams) == 1 \
        and private_window(plan) is None


__all__ = ["DELETE_GRACE", "PlanTopics", "delivered_through_topics"]
