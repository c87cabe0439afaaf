"""One Kafka consumer for all the readers of an edge: each plan topic's records handed to the
readers of their lane (`TopicReader.offer`), each of which keeps its own position, its own log of
keys read (`KeyLog`) and its own queue.

A consumer per reader cost each reader a librdkafka client (its threads, its connection to
every broker, its fetch loop): at 2,500 readers on an edge, the edge spent its CPU polling
idle consumers. Here one consumer, assigned the partition of every topic some reader reads
(partition 0: a plan topic has one), fetches them all; what a reader sees is what its own
consumer saw before, record for record, less the other lanes' and the topic's own records:

- plans share topics, each under a lane (`pep.delivery.lanes`): a reader's `topic` is its
  destination `<topic>#<lane>` (`<topic>`: lane ''), its topic's readers are kept by lane, and
  a record keyed `<lane>|<key>` is handed, as `<key>`, to its lane's readers only (an unprefixed
  key is lane ''s). A record of another lane costs a `find` and a dict look-up, whatever the
  topic's readers (5,000 plans in 80 topics: a record per row and plan); the topic's own
  records (the warm record, fence records not naming this edge) are handed to no reader;
- so a reader no longer sees every offset, and cannot tell a record the topic lost from one
  of another lane: the feed tells it, handing each record with the start of the run of the
  topic it read without a break (`run_start`: where it was assigned or sought to, moved up to a
  record that comes after a jump, which means the topic lost records: its retention passed);
  the reader tells a `gap` when the run began above its next offset;
- a reader's next offset is its own (`TopicReader.expected`); the consumer reads a topic from
  the lowest of its readers' and each reader ignores what it read already, so a reader that
  joins a topic below the others makes the consumer go back (`seek`), harmlessly for them;
- a reader whose queue is full refuses a record (`offer` is False) and is handed nothing more
  until it has room; then its topic is read again from its next offset (the others, which
  were handed every record of their lanes meanwhile, ignore the repeats): the consumer never
  waits on one slow reader, the topic's other readers, of every lane, go on, and no reader
  misses a record; a topic none of whose readers (of any lane) takes records is paused
  meanwhile;
- a topic this edge may not read (fenced off: authorization failed) ends its readers, every
  lane's, with `shutdown`; an error the consumer cannot place ends every reader (they
  reconnect elsewhere).
- so does a fence record (`FENCE_KEY`, `pep.delivery.topics.PlanTopics.fence`) that names this
  edge's principal, at once and before any reader is handed it or what follows it: Kafka
  authorizes a fetch when it arrives, and a fetch parked at the broker just before the fence's
  ACL took effect still returns records written after the gateway answered; the record comes
  before all of them. The topic is not read again by this edge (readers that join it end at
  once). A fence record naming other edges is handed to no reader.

Readers are added and removed from any thread; the consumer's own thread applies the changes
(a librdkafka consumer is not used from two threads). The topic's partition is assigned with
its first reader, of any lane, and let go with its last.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Protocol

from pep.delivery.lanes import kafka_topic, lane_of, split_lane
from pep.delivery.settings import FENCE_KEY, WARM_KEY, DeliverySettings

log = logging.getLogger(__name__)

POLL = 0.05  # seconds per consumer poll
CONSUME_BATCH = 500  # records taken per poll at most
IDLE_EVERY = 0.5  # seconds between the readers' looks at a quiet stream's holes
METADATA_REFRESH_MS = 1000
FETCH_WAIT_MS = 200
FENCED = "this edge may not read the handle's topic; reconnect"  # a fenced topic's readers' end
PARTITION = 0  # a plan topic's only partition


class FedReader(Protocol):
    """What the feed needs of a reader (`pep.edge.reader.TopicReader`)."""

    topic: str

    @property
    def expected(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def has_room(self) -> bool: ...

    def offer(self, offset: int, key: bytes | None, value: bytes | None,
              run_start: int) -> bool: ...

    def flush(self) -> None: ...

    def idle(self, now: float) -> None: ...

    def close(self, kind: str, reason: str | None = None) -> bool: ...


def fence_names(key: bytes | None, value: bytes | None, principal: str) -> bool | None:
    """Whether a plan-topic record is a fence record naming `principal` (None: no fence
    record). One whose value cannot be read names every edge: deny when in doubt (only the
    gateway's user may write a plan topic)."""
    if key is None or not key.startswith(FENCE_KEY):
        return None
    try:
        fenced = json.loads(value or b"")["fenced"]
        if not isinstance(fenced, list):
            raise TypeError(fenced)
    except (ValueError, KeyError, TypeError):
        log.error("plan topics: a fence record that cannot be read (%d bytes); taken as naming "
                  "this edge", len(value or b""))  # its bytes are not logged: deny, say nothing
        return True
    return principal in fenced


class _Topic:
    """The readers of one Kafka topic, by lane, and where the consumer reads it."""

    __slots__ = ("lanes", "size", "blocked", "paused", "position", "run", "due")

    def __init__(self) -> None:
        self.lanes: dict[bytes, list[FedReader]] = {}  # lane ('' : no lane) -> its readers
        self.size = 0  # readers, all lanes
        # readers that refused a record (or closed, until removed), by id(): handed nothing
        self.blocked: dict[int, FedReader] = {}
        self.paused = False
        self.position = -1  # the next offset the consumer hands out (-1: not assigned yet)
        self.run = 0  # the consumer read [run, position) without a break
        self.due: int | None = None  # read again from here when it goes on (a paused topic's)


class EdgeFeed:
    """The edge's consumer of plan topics (the module docstring)."""

    def __init__(self, settings: DeliverySettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._changes: list[tuple[str, FedReader]] = []
        self._topics: dict[str, _Topic] = {}  # by Kafka topic
        # the topics with a reader that refused a record, or paused: the only ones `_resume`
        # looks at (a look at every topic at every poll cost an edge with 1,000 readers a
        # scan of 1,000 topics some 50 times a second)
        self._waiting: set[str] = set()
        # topics a fence record named this edge in: never read again (`_hand`, `_apply`)
        self._fenced: set[str] = set()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xsg-edge-feed", daemon=True)
        self._started = False

    def add(self, reader: FedReader) -> None:
        """Hand `reader` its lane's records from its next offset on."""
        with self._lock:
            self._changes.append(("add", reader))
            if not self._started:
                self._started = True
                self._thread.start()

    def remove(self, reader: FedReader) -> None:
        """Stop handing `reader` records (its topic is let go with its last reader)."""
        with self._lock:
            self._changes.append(("remove", reader))

    def close(self) -> None:
        self._stop.set()
        if self._started and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    # -- the consumer's thread ------------------------------------------------------------------

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        config = self._settings.client(**{
            "group.id": self._settings.group_prefix + "reader", "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # how long a fetch waits at the broker for a record when its topics have none: a
            # record is returned as soon as it is there (fetch.min.bytes 1), so this bounds only
            # the idle fetches (5 a second per edge; each reads every partition the edge serves,
            # at 1,000 plan topics the most of the broker's CPU at 10 ms). A fence does not
            # rest on it: a fetch parked before the fence's ACL still returns what is written
            # while it waits, and the fence record (`fence_names`) ends the fenced edge's
            # readers at its place in the partition whatever this is
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            # a plan topic created a moment ago may be unknown to this client's first metadata:
            # asked again every second rather than librdkafka's five minutes
            "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
            # only critical client logs: the edge says once that the brokers are away
            # (`pep.edge.node`); the errors that matter come from `poll`
            "log_level": 2, "logger": logging.getLogger("pep.edge.kafka")})
        return Consumer(config)

    def _run(self) -> None:
        from confluent_kafka import KafkaError

        denied = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED)
        consumer = None
        try:
            consumer = self._consumer()
            looked = time.monotonic()
            while not self._stop.is_set():
                self._apply(consumer)
                self._resume(consumer)
                now = time.monotonic()
                if now - looked >= IDLE_EVERY:  # quiet readers look at their holes
                    looked = now
                    for entry in self._topics.values():
                        for readers in entry.lanes.values():
                            for reader in readers:
                                reader.idle(now)
                if not self._topics:
                    self._stop.wait(POLL)
                    continue
                # one record waited for (its latency stays), then what is there already
                first = consumer.poll(POLL)
                if first is None:
                    continue
                touched: dict[int, FedReader] = {}
                for msg in [first, *consumer.consume(CONSUME_BATCH - 1, 0)]:
                    error = msg.error()
                    if error is not None:
                        if error.code() in denied:  # fenced off the topic: deny
                            self._end(msg.topic(), FENCED)
                        else:
                            log.debug("plan topics: %s", error)
                        continue
                    self._hand(consumer, msg.topic(), int(msg.offset() or 0), msg.key(),
                               msg.value(), touched)
                for reader in touched.values():
                    reader.flush()
        except Exception:  # the readers are told (below), and reconnect elsewhere
            log.exception("the edge's plan topics could not be read")
        finally:
            self._end(None, "the edge could not read the handle's topic; reconnect")
            if consumer is not None:
                consumer.close()

    def _apply(self, consumer: Any) -> None:
        from confluent_kafka import TopicPartition

        with self._lock:
            changes, self._changes = self._changes, []
        for kind, reader in changes:
            topic, lane = kafka_topic(reader.topic), lane_of(reader.topic).encode()
            entry = self._topics.get(topic)
            if kind == "add" and topic in self._fenced:
                reader.close("shutdown", FENCED)  # its remove comes with the next changes
                continue
            if kind == "add":
                if entry is None:
                    entry = self._topics[topic] = _Topic()
                entry.lanes.setdefault(lane, []).append(reader)
                entry.size += 1
                start = reader.expected
                if entry.position < 0:
                    consumer.incremental_assign([TopicPartition(topic, PARTITION, start)])
                    entry.position = entry.run = start
                elif entry.paused:  # a reader that takes records: the topic goes on
                    entry.due = start if entry.due is None else min(entry.due, start)
                    self._waiting.add(topic)
                elif start < entry.position:
                    self._read_from(consumer, topic, entry, start)
            elif entry is not None and reader in (readers := entry.lanes.get(lane, [])):
                readers.remove(reader)
                if not readers:
                    del entry.lanes[lane]
                entry.size -= 1
                entry.blocked.pop(id(reader), None)
                if not entry.size:
                    del self._topics[topic]
                    self._waiting.discard(topic)
                    consumer.incremental_unassign([TopicPartition(topic, PARTITION)])
                elif len(entry.blocked) >= entry.size and not entry.paused:
                    consumer.pause([TopicPartition(topic, PARTITION)])  # its last taker gone
                    entry.paused = True

    def _hand(self, consumer: Any, topic: str | None, offset: int, key: bytes | None,
              value: bytes | None, touched: dict[int, FedReader]) -> None:
        """A record of `topic`, offered to the readers of its lane (the module docstring)."""
        entry = self._topics.get(topic or "")
        if topic is None or entry is None:
            return
        lane, rest = split_lane(key or b"")
        if not lane and fence_names(key, value, self._settings.principal):
            self._fenced.add(topic)
            entry.position = offset + 1
            self._end(topic, FENCED)
            log.warning("plan topics: this edge (%s) was fenced off %s",
                        self._settings.principal, topic)
            return
        if entry.paused or topic in self._fenced:
            return
        if offset > entry.position:  # the topic lost records (retention): a new run
            entry.run = offset
        elif offset < entry.run:  # read again from further back
            entry.run = offset
        entry.position = offset + 1
        if not lane and (rest == WARM_KEY or rest.startswith(FENCE_KEY)):
            return  # the topic's, no plan's (a fence naming another edge, the warm record)
        readers = entry.lanes.get(lane)
        if readers is None:
            return  # another plan's record
        if lane:
            key = rest
        blocked, run, refused = entry.blocked, entry.run, False
        for reader in readers:
            if id(reader) in blocked:
                continue
            if reader.closed or not reader.offer(offset, key, value, run):
                blocked[id(reader)] = reader
                refused = True
            else:
                touched[id(reader)] = reader
        if refused:
            self._waiting.add(topic)
            if len(blocked) >= entry.size:  # no reader of the topic takes records: pause it
                from confluent_kafka import TopicPartition

                consumer.pause([TopicPartition(topic, PARTITION)])
                entry.paused = True

    def _resume(self, consumer: Any) -> None:
        """Readers that refused a record and have room again (and readers that joined a paused
        topic): their topic read again from the lowest of their next offsets (the topic's other
        readers were handed every record of their lanes, and ignore what they read already); a
        paused topic goes on once one of its readers takes records."""
        from confluent_kafka import TopicPartition

        for topic in list(self._waiting):
            entry = self._topics.get(topic)
            if entry is None or (not entry.blocked and not entry.paused and entry.due is None):
                self._waiting.discard(topic)
                continue
            start = entry.due
            for rid, r in list(entry.blocked.items()):
                if not r.closed and r.has_room():  # a closed one stays until removed
                    del entry.blocked[rid]
                    start = r.expected if start is None else min(start, r.expected)
            if len(entry.blocked) >= entry.size:  # still no reader that takes records
                entry.due = start
                continue
            entry.due = None
            if entry.paused:  # what came after `position` while paused was dropped
                self._read_from(consumer, topic, entry,
                           entry.position if start is None else min(start, entry.position))
                consumer.resume([TopicPartition(topic, PARTITION)])
                entry.paused = False
            elif start is not None and start < entry.position:
                self._read_from(consumer, topic, entry, start)

    @staticmethod
    def _read_from(consumer: Any, topic: str, entry: _Topic, offset: int) -> None:
        """Read `topic` again from `offset` (not above its position): the run read without a
        break goes on (a record that then jumps ahead of `offset` starts a new one)."""
        _seek(consumer, topic, offset)
        entry.position = offset
        entry.run = min(entry.run, offset)

    def _end(self, topic: str | None, reason: str) -> None:
        """End the readers of `topic` (None: of every topic), all lanes, with `shutdown`."""
        for name, entry in list(self._topics.items()):
            if topic is None or name == topic:
                for readers in list(entry.lanes.values()):
                    for reader in list(readers):
                        reader.close("shutdown", reason)
        if topic is None:
            with self._lock:
                pending = [r for kind, r in self._changes if kind == "add"]
            for reader in pending:
                reader.close("shutdown", reason)


def _seek(consumer: Any, topic: str, offset: int) -> None:
    """Read `topic` from `offset` next; a partition librdkafka does not fetch yet (assigned a
    moment ago) cannot seek, and is assigned again from there."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        consumer.seek(TopicPartition(topic, PARTITION, offset))
    except KafkaException:
        consumer.incremental_unassign([TopicPartition(topic, PARTITION)])
        consumer.incremental_assign([TopicPartition(topic, PARTITION, offset)])


__all__ = ["FENCED", "EdgeFeed", "FedReader", "fence_names"]
