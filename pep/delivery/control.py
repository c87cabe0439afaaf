"""The control topic and the acknowledgements topic: how a revocation reaches every edge before
the gateway answers.

The gateway (`Revocations`) publishes a `Revocation` (its id, the handles, their new state and
reason) on `<prefix>control` once the handles' state is in the store, then waits until every edge
the store lists as alive (`delivery_edges`, seen within `EDGE_ALIVE` seconds) acknowledged it on
`<prefix>acks`, at most `ack_timeout` seconds. An edge (`ControlListener`) reads the control topic
from where it was when it started, closes the readers of the handles named (rows in its memory
are dropped: `pep.edge.reader`) and then acknowledges. An edge that cannot reach the control
topic for `CONTROL_LOST` seconds stops serving (deny when in doubt), so an edge that missed a
revocation is not serving anyone after that bound either.

The control topic also carries stream notices (`StreamNotice`): the gateway's verdict that a
stream's query stalled (or failed) and later runs again (`pep.handles.stall_notices`), so that
an edge tells the readers of that stream's handles `stalled` / `resumed` as the gateway tells
its own. A notice names the stream and its state, never a row, a predicate or an error's text
(the text may quote a plan). It is not acknowledged: the streams stalled now are also in the
store (`DeliveryStore.stalled_streams`), which an edge reads when it starts and every 2 s,
so an edge that starts during a stall, or missed a record, learns it there.

Both topics have one partition (one order for every edge); their records are JSON.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pep.delivery.settings import DeliverySettings
from pep.delivery.store import STALLS_REFRESH

log = logging.getLogger(__name__)

EDGE_ALIVE = 5.0  # seconds: an edge not seen in the store for longer is not waited for
CONTROL_LOST = 3.0  # seconds without reaching the control topic after which an edge stops
PROBE_EVERY = 0.5  # seconds between an edge's probes of the control topic
CONTROL_POLL = 0.1  # seconds an edge's control consumer waits in a poll
CONTROL_FETCH_WAIT_MS = 250  # its fetches parked at the broker until a record comes, at most
CONTROL_PARTITION = 0
ALIGN_BATCH = 1000  # topics per describe and per alter request of `align_topics`
ALIGN_TIMEOUT = 10.0  # seconds `align_topics` may take in all (a gateway's start waits for it)


@dataclass(frozen=True)
class Revocation:
    """Handles that ended (revoked, released, ended): no edge may serve them any more."""

    id: str
    handles: tuple[str, ...]
    state: str
    reason: str | None

    def encode(self) -> bytes:
        return json.dumps({"kind": "revocation", "id": self.id, "handles": list(self.handles),
                           "state": self.state, "reason": self.reason}).encode("utf-8")

    @staticmethod
    def decode(data: bytes | None) -> Revocation | None:
        """A control record as a revocation; None for anything else (never raises)."""
        try:
            obj = json.loads(data or b"")
            if not isinstance(obj, dict) or obj.get("kind") != "revocation":
                return None
            handles = tuple(str(h) for h in obj["handles"])
            reason = obj.get("reason")
            return Revocation(str(obj["id"]), handles, str(obj["state"]),
                              None if reason is None else str(reason))
        except (ValueError, KeyError, TypeError):
            return None


STALL_DETAIL = ("the stream's query has not completed a micro-batch within the stall bound; "
                "the rows resume when it runs again")
FAIL_DETAIL = "the stream's query failed; the rows resume when it runs again"


@dataclass(frozen=True)
class StreamNotice:
    """A stream's query stalled (`state` "stalled" or "failed") or runs again (`stalled`
    False, `state` its state then, or None when its query is gone)."""

    stream: str
    stalled: bool
    state: str | None
    last_batch_at: str | None = None

    def event(self) -> tuple[str, dict[str, object]]:
        """The notice a reader is given, as the gateway's own readers get it
        (`pep.handles.stall_notices`): its kind and fields."""
        if not self.stalled:
            return "resumed", {"stream": self.stream, "state": self.state}
        return "stalled", {"stream": self.stream, "state": self.state,
                           "last_batch_at": self.last_batch_at,
                           "detail": FAIL_DETAIL if self.state == "failed" else STALL_DETAIL}

    def encode(self) -> bytes:
        return json.dumps({"kind": "stream", "stream": self.stream, "stalled": self.stalled,
                           "state": self.state, "last_batch_at": self.last_batch_at}
                          ).encode("utf-8")

    @staticmethod
    def decode(data: bytes | None) -> StreamNotice | None:
        """A control record as a stream notice; None for anything else (never raises)."""
        try:
            obj = json.loads(data or b"")
            if not isinstance(obj, dict) or obj.get("kind") != "stream":
                return None
            state, at = obj.get("state"), obj.get("last_batch_at")
            return StreamNotice(str(obj["stream"]), bool(obj["stalled"]),
                                None if state is None else str(state),
                                None if at is None else str(at))
        except (ValueError, KeyError, TypeError):
            return None


def ensure_topics(admin: Any, settings: DeliverySettings, names: Iterable[str],
                  timeout: float = 30.0) -> None:
    """Create these one-partition delivery topics when they do not exist yet."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    wanted = [NewTopic(n, 1, settings.replication, config=settings.topic_config())
              for n in names]
    for name, future in admin.create_topics(wanted, request_timeout=timeout).items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            log.debug("delivery topic %s exists", name)


@dataclass(frozen=True)
class Alignment:
    """What `align_topics` did: topics whose settings it changed, topics it could not check or
    change (the brokers away or refusing), and why (None: every topic was checked)."""

    altered: int
    left: int
    error: str | None


def align_topics(admin: Any, settings: DeliverySettings, names: Iterable[str],
                 timeout: float = ALIGN_TIMEOUT, batch: int = ALIGN_BATCH) -> Alignment:
    """Bring existing delivery topics to the settings `ensure_topics` creates them with
    (`DeliverySettings.topic_config`).

    `ensure_topics` only creates: a topic made by an older xsg, or under another retention,
    kept what it had (Kafka's 1 GiB / 7-day segments, which keep rows for a week whatever the
    retention says; 4 KiB index intervals, the broker stall at 1,000 topics). Each topic's
    settings are described, and only the keys the gateway sets that differ are changed, by an
    incremental alter (any other key an operator set stays, and a topic already in line is not
    written to, so the count is what changed); `batch` topics per describe and per alter
    request (a request to the controller is one round trip whatever the number). A topic that
    no longer exists is skipped. The first failure, or `timeout` seconds in all, ends it: the
    rest keep their settings until the next call."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    wanted = settings.topic_config()
    topics = sorted(set(names))
    deadline = time.monotonic() + timeout
    altered, left, error = 0, 0, None
    for lo in range(0, len(topics), batch):
        if error is not None:
            left += len(topics) - lo
            break
        chunk = topics[lo:lo + batch]
        changes: dict[str, dict[str, str]] = {}
        answers = _answers(admin.describe_configs,
                           [ConfigResource(ConfigResource.Type.TOPIC, t) for t in chunk],
                           deadline, timeout)
        for topic, (config, problem) in answers.items():
            if problem is not None:
                left, error = left + 1, error or problem
            elif config is not _GONE:
                diff = {k: v for k, v in wanted.items()
                        if (config[k].value if k in config else None) != v}
                if diff:
                    changes[topic] = diff
        if not changes:
            continue
        alters = [ConfigResource(ConfigResource.Type.TOPIC, t, incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in sorted(diff.items())]) for t, diff in sorted(changes.items())]
        answers = _answers(admin.incremental_alter_configs, alters, deadline, timeout)
        for _, (done, problem) in answers.items():
            if problem is not None:
                left, error = left + 1, error or problem
            elif done is not _GONE:
                altered += 1
    return Alignment(altered, left, error)


_GONE = object()  # `_answers`: the topic does not exist (any more)


def _remaining(deadline: float, timeout: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"no answer within {timeout:g} s")
    return left


def _answers(ask: Callable[..., dict[Any, Any]], resources: list[Any], deadline: float,
             timeout: float) -> dict[str, tuple[Any, str | None]]:
    """Each topic's answer to one admin request about these topics' `ConfigResource`s (`ask`:
    the admin client's method, which returns a future per resource): (the result, None),
    (`_GONE`, None) for a topic that does not exist, or (None, why) when the brokers refused
    or did not answer by `deadline`."""
    from confluent_kafka import KafkaError, KafkaException

    topics = [r.name for r in resources]
    try:
        asked = ask(resources, request_timeout=_remaining(deadline, timeout))
        futures = {resource.name: future for resource, future in asked.items()}
    except (KafkaException, TimeoutError, ValueError) as exc:
        return {t: (None, _why(exc)) for t in topics}
    out: dict[str, tuple[Any, str | None]] = {}
    for topic in topics:
        try:
            # librdkafka answers by `request_timeout`: a moment more for its answer to come
            wait = max(0.0, deadline - time.monotonic()) + 1.0
            out[topic] = (futures[topic].result(wait), None)
        except KafkaException as exc:
            gone = exc.args[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                          KafkaError._UNKNOWN_TOPIC)
            out[topic] = (_GONE, None) if gone else (None, _why(exc))
        except (TimeoutError, KeyError):
            out[topic] = (None, f"no answer within {timeout:g} s")
    return out


def _why(exc: Exception) -> str:
    """An admin request's failure in a few words (librdkafka's text, or the exception's)."""
    from confluent_kafka import KafkaException

    if isinstance(exc, KafkaException) and exc.args and hasattr(exc.args[0], "str"):
        return str(exc.args[0].str())
    return str(exc) or type(exc).__name__


def end_offset(consumer: Any, topic: str, timeout: float = 10.0) -> int:
    """The offset the next record of a one-partition topic will have (from the broker; a topic
    just created has no leader for a moment: asked again until `timeout`)."""
    from confluent_kafka import KafkaException, TopicPartition

    deadline = time.monotonic() + timeout
    while True:
        try:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(topic, CONTROL_PARTITION), timeout=max(0.5, timeout / 4),
                cached=False)
            return int(high)
        except KafkaException:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


class Revocations:
    """The gateway's side (the module docstring). `edges()`: the edges alive now, as
    (edge id) strings."""

    def __init__(self, settings: DeliverySettings, edges: Callable[[], list[str]]) -> None:
        from confluent_kafka import Consumer, Producer, TopicPartition

        self._settings = settings
        self._edges = edges
        self._producer = Producer(settings.client(**{
            "acks": "all", "enable.idempotence": True, "linger.ms": 0,
            "logger": logging.getLogger("pep.delivery.kafka")}))
        self._acks = Consumer(settings.client(**{
            "group.id": settings.group_prefix + "gateway-acks", "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 1000,
            "logger": logging.getLogger("pep.delivery.kafka")}))
        start = end_offset(self._acks, settings.acks_topic)
        self._acks.assign([TopicPartition(settings.acks_topic, CONTROL_PARTITION, start)])
        self._cond = threading.Condition()
        self._acked: dict[str, set[str]] = {}  # revocation id -> edges that acknowledged it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read_acks, name="xsg-delivery-acks",
                                        daemon=True)
        self._thread.start()

    def _read_acks(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self._acks.poll(0.2)
            except RuntimeError:  # closed
                return
            if msg is None or msg.error():
                continue
            try:
                obj = json.loads(msg.value() or b"")
                rid, edge = str(obj["id"]), str(obj["edge"])
            except (ValueError, KeyError, TypeError):
                continue
            with self._cond:
                if rid in self._acked:
                    self._acked[rid].add(edge)
                    self._cond.notify_all()

    def publish(self, handles: Iterable[str], state: str, reason: str | None) -> list[str]:
        """Publish a revocation of `handles` and wait for every live edge's acknowledgement, at
        most `ack_timeout` seconds; the edges that did not acknowledge (empty: all did)."""
        ids = tuple(sorted(set(handles)))
        if not ids:
            return []
        revocation = Revocation(uuid.uuid4().hex, ids, state, reason)
        waiting = set(self._edges())
        with self._cond:
            self._acked[revocation.id] = set()
        try:
            self._producer.produce(self._settings.control_topic, revocation.encode(),
                                   partition=CONTROL_PARTITION)
            left = self._producer.flush(self._settings.ack_timeout)
            if left:
                log.warning("plan topics: a revocation of %d handle(s) could not be published "
                            "within %.2f s; every edge stops serving when it cannot read the "
                            "control topic", len(ids), self._settings.ack_timeout)
                return sorted(waiting)
            deadline = time.monotonic() + self._settings.ack_timeout
            with self._cond:
                while not waiting <= self._acked[revocation.id]:
                    left_s = deadline - time.monotonic()
                    if left_s <= 0:
                        break
                    self._cond.wait(left_s)
                silent = sorted(waiting - self._acked[revocation.id])
        finally:
            with self._cond:
                self._acked.pop(revocation.id, None)
        if silent:
            log.warning("plan topics: edge(s) %s did not acknowledge a revocation of %d "
                        "handle(s) within %.2f s", ", ".join(silent), len(ids),
                        self._settings.ack_timeout)
        return silent

    @property
    def producer(self) -> Any:
        """The gateway's producer of delivery records (acks=all, idempotent), which `PlanTopics`
        also writes fence records with."""
        return self._producer

    def tell(self, notice: StreamNotice) -> None:
        """Publish a stream notice (not acknowledged, never waited for: the stall check must
        not wait on brokers that are away; the store has the same news for the edges)."""
        self._producer.produce(self._settings.control_topic, notice.encode(),
                               partition=CONTROL_PARTITION)
        self._producer.poll(0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._producer.flush(5.0)
        self._acks.close()


class StreamNotices:
    """The gateway's side of stream notices (the module docstring): `changed(troubled)` with
    the streams stalled or failed now (stream -> (state, last batch's time), from the stall
    check, `pep.handles.stall_notices`) saves them in the store under this gateway's name
    (`save(reporter, troubled)`) and publishes a notice for each stream whose verdict changed
    (`tell`). Called at every check; it saves again only when something changed, or every
    `STALLS_REFRESH` seconds while a stream is stalled (an edge reads no row its gateway has not
    renewed lately: a stopped gateway's streams run elsewhere); a save that failed is done again
    at the next call."""

    def __init__(self, reporter: str,
                 save: Callable[[str, dict[str, tuple[str, str | None]]], None],
                 tell: Callable[[StreamNotice], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._reporter = reporter
        self._save = save
        self._tell = tell
        self._clock = clock
        self._saved: dict[str, tuple[str, str | None]] | None = None  # None: never saved
        self._saved_at = 0.0

    def changed(self, troubled: dict[str, tuple[str, str | None]]) -> None:
        now = self._clock()
        if troubled == self._saved and (not troubled or now - self._saved_at < STALLS_REFRESH):
            return
        before = self._saved or {}
        try:
            self._save(self._reporter, dict(troubled))
        except Exception as exc:  # noqa: BLE001 - saved at the next check
            log.warning("plan topics: the streams stalled now could not be saved for the "
                        "edges (%s); tried again at the next check", type(exc).__name__)
            return
        self._saved, self._saved_at = dict(troubled), now
        notices = [StreamNotice(s, True, state, at) for s, (state, at) in troubled.items()
                   if before.get(s, (None,))[0] != state]
        notices += [StreamNotice(s, False, None) for s in before if s not in troubled]
        for notice in notices:
            try:
                self._tell(notice)
            except Exception as exc:  # noqa: BLE001 - the edges read the store too
                log.warning("plan topics: a stream notice could not be published (%s); the "
                            "edges learn it from the store", type(exc).__name__)


class ControlListener:
    """An edge's side (the module docstring): `on_revoked(revocation)` for each revocation
    published since the edge started, then its acknowledgement; `on_notice(notice)` for each
    stream notice; `healthy` while the control
    topic was reached within `CONTROL_LOST` seconds."""

    def __init__(self, settings: DeliverySettings, edge: str,
                 on_revoked: Callable[[Revocation], None],
                 on_notice: Callable[[StreamNotice], None] | None = None) -> None:
        from confluent_kafka import Consumer, Producer, TopicPartition

        self._settings = settings
        self._edge = edge
        self._on_revoked = on_revoked
        self._on_notice = on_notice
        kafka_log = logging.getLogger("pep.edge.kafka")
        self._consumer = Consumer(settings.client(**{
            "group.id": settings.group_prefix + edge, "enable.auto.commit": False,
            # a fetch parked at the broker returns as soon as a record comes (a revocation
            # waits for nothing): parked longer, the edge's idle fetches are fewer (at 10 ms,
            # 100 round trips a second per edge for a quiet topic)
            "fetch.wait.max.ms": CONTROL_FETCH_WAIT_MS, "logger": kafka_log}))
        self._producer = Producer(settings.client(**{"acks": "all", "linger.ms": 0,
                                                     "logger": kafka_log}))
        self._partition = TopicPartition(settings.control_topic, CONTROL_PARTITION)
        start = end_offset(self._consumer, settings.control_topic)
        self._consumer.assign([TopicPartition(settings.control_topic, CONTROL_PARTITION,
                                              start)])
        self._reached = time.monotonic()
        self._stop = threading.Event()
        self.acknowledged = 0
        self._thread = threading.Thread(target=self._run, name="xsg-edge-control", daemon=True)
        self._thread.start()

    @property
    def healthy(self) -> bool:
        return time.monotonic() - self._reached < CONTROL_LOST

    def _run(self) -> None:
        probed = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - probed >= PROBE_EVERY:
                probed = now
                try:  # the broker answers for the control topic: it is reachable
                    self._consumer.get_watermark_offsets(self._partition, timeout=1.0,
                                                         cached=False)
                    self._reached = time.monotonic()
                except Exception:  # noqa: BLE001 - unreachable: `healthy` turns False
                    pass
            try:  # returns at once when a record comes; the probes' pace otherwise
                msg = self._consumer.poll(CONTROL_POLL)
            except RuntimeError:  # closed
                return
            if msg is None or msg.error():
                continue
            revocation = Revocation.decode(msg.value())
            if revocation is None:
                notice = StreamNotice.decode(msg.value())
                if notice is not None and self._on_notice is not None:
                    try:
                        self._on_notice(notice)
                    except Exception:
                        log.exception("edge %s: a stream notice could not be applied",
                                      self._edge)
                continue
            try:
                self._on_revoked(revocation)
            except Exception:  # never acknowledge what was not done
                log.exception("edge %s: a revocation could not be applied", self._edge)
                continue
            self._producer.produce(self._settings.acks_topic, json.dumps(
                {"id": revocation.id, "edge": self._edge}).encode("utf-8"),
                partition=CONTROL_PARTITION)
            self._producer.flush(self._settings.ack_timeout)
            self.acknowledged += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._producer.flush(2.0)
        self._consumer.close()


__all__ = ["ALIGN_BATCH", "ALIGN_TIMEOUT", "Alignment", "CONTROL_LOST", "ControlListener",
           "EDGE_ALIVE", "Revocation", "Revocations", "StreamNotice", "StreamNotices",
           "align_topics", "end_offset", "ensure_topics"]
