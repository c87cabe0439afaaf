"""Real-time mode's part of a stream query's life cycle (`QueryLifecycle` holds one): which
mode the stream's query runs in, the change of mode when handles come or go, and what makes a
change of mode repeat no row in either direction (issue 45).

The query of a Kafka stream runs in real-time mode while its plans qualify
(`pep.runtime.query.realtime`), else micro-batches; both run on the same checkpoint, so a
change of mode is a stop and a start on it. Two things made a row come twice across one:

- **Real-time mode to micro-batches.** A real-time query writes each record to the plan topics
  as it reads it, but writes its offsets to the checkpoint only when its batch ends
  (`batch_seconds`; Spark's `MicroBatchExecution.markMicroBatchEnd` in real-time mode): a stop
  within a batch leaves every record read since the last end written and uncommitted. The
  micro-batch query that follows starts at the last committed offsets and writes those records
  again, under micro-batch keys (`m:<epoch>:<batch>:<i>`) that the edges cannot tell from new
  rows (the real-time keys name the source record, `r:<epoch>:<topic>/<partition>/<offset>`;
  the micro-batch keys do not). And the stopped query's tasks end, and their Kafka producer
  sends what they handed it, a moment after `StreamingQuery.stop()` returns (Spark's Kafka
  writer does nothing on abort: its cached producer delivers what it holds).
  So after a real-time query stops, `after_stop` waits until its tasks have ended and its
  records are on the brokers, reads per plan topic the highest source offset per partition it
  wrote (its keys say it), and raises those plans' Kafka cuts past it (`raise_cuts`): a plan's
  records are matched in source order, so every record at or below that offset that passes the
  plan is on its topic already, and none above is. Plans the real-time query did not serve
  (the window plan that caused the change) keep their own cuts and get every record they are
  owed.
- **Micro-batches to real-time mode.** A micro-batch whose rows were all delivered but whose
  commit the stop cut off is run again by the next query; the micro-batch query skips it (the
  router's completed batch), a real-time query cannot (no foreachBatch), so `start` writes the
  missing commit of a batch delivered in full first (`commit_delivered`).

`mode` says "micro-batch" only once the real-time query has stopped: a row sent after it says
so is never read by the real-time query.

Holes (`CountMarkers`): after each real-time batch the gateway writes to each plan topic a count
marker (`c:<epoch>:b<batch>`: the batch's source offset ranges, from its progress, and the
records the query wrote to that topic, its observation `realtime.COUNTS`), and before each
real-time query starts an opening marker (`c:<epoch>:o<random>`). A batch's tasks flush their
producer before they end (Spark's `KafkaDataWriter.commit`), the progress comes after the batch
committed: the marker is on the topic after every record of its batch. A batch's successor
writes while the marker is written, so records of batch n + 1 may precede marker n: each marker
names (`after`) the latest marker of its topic acknowledged before its batch began (the
progress's `timestamp`, the driver's clock, as the acknowledgement's): every record of the
batch is after that one, so an edge that read it read the whole batch. A batch whose marker
never comes (the query stopped within it, the gateway died, the brokers refused the marker) is
not checked; the records of a batch cut short are written again, and counted, by the next
real-time query's first batch.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener
from pyspark.sql.streaming.query import StreamingQuery

from common.errors import described
from pep.delivery.lanes import destination, kafka_topic, kafka_topics, lane_key, lane_of, split_key
from pep.runtime.delivery.topic_rows import PlanRoute
from pep.runtime.delivery.writer import TopicWriter
from pep.runtime.query.progress import query_progress
from pep.runtime.query.realtime import (
    COUNTS,
    RealTimeRows,
    batch_ranges,
    count_key,
    counted_topics,
    ensure_epoch,
    marker_value,
    refusal,
    routes_key,
    source_place,
)
from pep.runtime.query.settings import StreamLayout
from pep.runtime.sources.frames import kafka_realtime_frame
from pep.runtime.sources.replay import last_committed, planned_batches

log = logging.getLogger(__name__)

TASKS_END = 15.0  # seconds a stopped real-time query's tasks may take to end
SETTLE = 0.3  # seconds the plan topics' ends must stay still before their tails are read
SETTLE_MAX = 10.0  # seconds at most of waiting for them (Spark's producer: delivery.timeout.ms)

MARKER_TIMEOUT = 30.0  # seconds a count marker may wait for the brokers before it is given up
OPEN_WAIT = 10.0  # seconds a query's start waits for its opening markers
ANCHORS = 16  # markers remembered per topic (`after`)

Cuts = dict[int, tuple[int, ...]]  # plan id -> per source partition, the first offset it is given


@dataclass(frozen=True)
class Chosen:
    """The plans a real-time query would serve now, and their routes to the plan topics."""

    plans: list[Any]
    routes: list[PlanRoute]


@dataclass
class _Running:
    """What the running real-time query was built from and wrote under."""

    built: tuple[Any, ...]
    routes: list[PlanRoute]
    epoch: str
    run_id: str
    started: float
    progressed: float | None = None


@dataclass
class _Counted:
    """What one real-time query counts: its epoch and its counted plan topics."""

    epoch: str
    topics: list[str]
    name: str = ""


@dataclass
class _Anchors:
    """Per plan topic, the markers written lately: (mark, when acknowledged, epoch seconds)."""

    by_topic: dict[str, deque[tuple[str, float]]] = field(default_factory=dict)
    # delivery reports run in whichever thread flushes (a query's start, the writer's thread)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, topic: str, mark: str, acked: float) -> None:
        with self.lock:
            self.by_topic.setdefault(topic, deque(maxlen=ANCHORS)).append((mark, acked))

    def before(self, topic: str, began: float) -> str | None:
        """The latest marker of `topic` acknowledged before `began`."""
        with self.lock:
            for mark, acked in reversed(self.by_topic.get(topic, ())):
                if acked < began:
                    return mark
        return None


class CountMarkers(StreamingQueryListener):
    """Writes the count markers of a session's real-time queries (the module docstring): the
    opening marker before a query starts (`open`, waited for), a batch's markers when its
    progress comes (a listener of the session; written by a thread of its own, never on
    Spark's listener bus). `client`: librdkafka settings of the gateway's identity."""

    def __init__(self, client: dict[str, Any]) -> None:
        from confluent_kafka import Producer

        settings = {k: v for k, v in client.items() if k not in CONSUMER_ONLY}
        self._producer = Producer({**settings, "acks": "all", "enable.idempotence": True,
                                   "linger.ms": 0,
                                   # a late marker to a topic deleted meanwhile (its plan's
                                   # last handle left) must not create it again
                                   "allow.auto.create.topics": False,
                                   "message.timeout.ms": int(MARKER_TIMEOUT * 1000),
                                   "logger": logging.getLogger("pep.runtime.delivery.kafka")})
        self._lock = threading.Lock()
        self._queries: dict[str, _Counted] = {}  # run id -> what it counts (the last few)
        self._anchors = _Anchors()
        self._work: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="xsg-count-markers", daemon=True)
        self._thread.start()
        self.written = 0  # markers acknowledged (observable)
        self.failed = 0  # markers given up

    def open(self, topics: Sequence[str], epoch: str) -> None:
        """Write an opening marker to each topic and wait for them (before the query starts:
        every record it writes comes after)."""
        mark = f"o{uuid.uuid4().hex[:12]}"
        self._write([(t, epoch, mark, marker_value(None, None, None)) for t in topics],
                    OPEN_WAIT)

    def counting(self, run_id: str, counted: _Counted) -> None:
        """The query `run_id` (started) counts `counted`'s topics."""
        with self._lock:
            self._queries[run_id] = counted
            while len(self._queries) > ANCHORS:
                self._queries.pop(next(iter(self._queries)))

    def close(self) -> None:
        self._work.put(None)
        self._thread.join(timeout=5)
        self._producer.flush(5)

    # ----- the listener (Spark's bus: hand over, never block it) ------------------------------
    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        with self._lock:
            counted = self._queries.get(str(progress.runId))
        if counted is not None:
            self._work.put((counted, progress))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    # ----- the writer's thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            counted, progress = item
            try:
                self._batch(counted, progress)
            except Exception as exc:  # noqa: BLE001 - that batch is not checked; the next ones are
                log.error("stream query %s: the counts of real-time batch %s could not be "
                          "written (%s); its rows are not checked for holes", counted.name,
                          getattr(progress, "batchId", "?"), described(exc))

    def _batch(self, counted: _Counted, progress: Any) -> None:
        metrics = (progress.observedMetrics or {}).get(COUNTS)
        if metrics is None:
            return  # not this query's observation: nothing to compare with
        ranges = batch_ranges(progress.sources)
        began = _timestamp(progress.timestamp)
        values = metrics.asDict()
        mark = f"b{int(progress.batchId)}"
        self._write([(topic, counted.epoch, mark,
                      marker_value(ranges, int(values.get(f"n{i}") or 0),
                                   self._anchors.before(topic, began)))
                     for i, topic in enumerate(counted.topics)], MARKER_TIMEOUT + 5)

    def _write(self, markers: list[tuple[str, str, str, bytes]], wait: float) -> None:
        """Produce the markers and wait for them up to `wait` seconds; each acknowledged one
        becomes an anchor (one acknowledged later anchors no batch that began before)."""
        from confluent_kafka import KafkaError

        failed: list[str] = []
        gone = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)

        def report(err: Any, msg: Any) -> None:
            if err is None:
                lane, key = split_key(msg.key())
                self._anchors.add(destination(str(msg.topic()), lane), mark_of(key), time.time())
                self.written += 1
            elif err.code() in gone:  # deleted with its plan: no reader left to check
                log.debug("plan topic %s: gone before its count marker", msg.topic())
            else:
                failed.append(f"{msg.topic()}: {err}")
        for dest, epoch, mark, value in markers:  # a marker per plan: to its lane of a topic
            self._producer.produce(kafka_topic(dest), value,
                                   lane_key(lane_of(dest), count_key(epoch, mark)),
                                   on_delivery=report)
        left = self._producer.flush(wait)
        if failed or left:
            self.failed += len(failed) + left
            log.warning("plan topics: %d count marker(s) not acknowledged (%s); those "
                        "real-time batches may go unchecked for holes", len(failed) + left,
                        "; ".join(failed[:3]) or "the brokers did not answer")


CONSUMER_ONLY = frozenset({"group.id", "enable.auto.commit", "auto.offset.reset",
                           "enable.partition.eof"})


def mark_of(key: bytes | None) -> str:
    """The mark of a count marker's key (`c:<epoch>:<mark>`)."""
    return (key or b"").decode("ascii").rsplit(":", 1)[-1]


def _timestamp(text: str) -> float:
    """A progress's `timestamp` (`2026-12-06T17:23:53.113Z`, the batch's start) in epoch
    seconds."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=UTC).timestamp()


_MARKERS_ATTRIBUTE = "_xsg_count_markers"
_MARKERS_LOCK = threading.Lock()


def count_markers(spark: SparkSession, client: dict[str, Any]) -> CountMarkers:
    """The session's marker writer for these brokers and identity (added to the session as a
    listener on first use, kept on it: runtimes of one session may use other brokers)."""
    key = tuple(sorted((k, str(v)) for k, v in client.items() if k not in CONSUMER_ONLY
                       and not callable(v) and not isinstance(v, logging.Logger)))
    with _MARKERS_LOCK:
        writers: dict[Any, CountMarkers] = getattr(spark, _MARKERS_ATTRIBUTE, None) or {}
        markers = writers.get(key)
        if markers is None:
            markers = writers[key] = CountMarkers(client)
            spark.streams.addListener(markers)
            setattr(spark, _MARKERS_ATTRIBUTE, writers)
        return markers


class QueryControl(Protocol):
    """What the part asks of the query's life cycle to change the mode."""

    @property
    def layout(self) -> StreamLayout:
        """The stream's layout now."""

    @property
    def running(self) -> bool:
        """The query runs and was not stopped from outside (a change of mode may restart it)."""

    def restart(self) -> None:
        """Stop the query between two batches and start it again (it chooses its mode at its
        start); raises what the start raised."""


class RealTimeMode:
    """The real-time mode of one Kafka stream's query (the module docstring). `rows`: builds
    and starts the real-time query; `plans()`: the registry's plan states; `punctuated`: the
    stream has security punctuations; `raise_cuts(cuts)`: raise these plans' Kafka cuts (never
    lowers one); `client`: librdkafka settings of a consumer of the plan topics (None: the
    tails are not read, and a change to micro-batches may repeat rows)."""

    def __init__(self, rows: RealTimeRows, spark: SparkSession, plans: Callable[[], list[Any]],
                 punctuated: bool, raise_cuts: Callable[[Cuts], None],
                 client: dict[str, Any] | None) -> None:
        self._rows = rows
        self._spark = spark
        self._plans = plans
        self._punctuated = punctuated
        self._raise_cuts = raise_cuts
        self._client = client
        self._running: _Running | None = None
        self.lock = threading.Lock()  # one change of mode at a time, none after a stop
        self.ended = False  # the query was stopped from outside: no change of mode restarts it

    # ----- what the life cycle and the tests read ---------------------------------------------
    @property
    def mode(self) -> str:
        """"realtime" while the real-time query runs (until it has stopped), else
        "micro-batch"."""
        return "realtime" if self._running is not None else "micro-batch"

    @property
    def plan_ids(self) -> tuple[int, ...]:
        running = self._running
        return tuple(route.pid for route, _ in running.built) if running is not None else ()

    # ----- choosing and starting --------------------------------------------------------------
    def choose(self, layout: StreamLayout) -> Chosen | None:
        """The plans when the stream's query may run in real-time mode now; None:
        micro-batches (the reason is logged at DEBUG)."""
        plans = [s for s in self._plans() if s.used]
        why = refusal(plans, self._punctuated) or self._slots_refusal(plans, layout)
        if why is not None:
            log.debug("stream %s: micro-batches, not real-time mode: %s", layout.name, why)
            return None
        routes = TopicWriter.routes(plans, lambda s: tuple(layout.row_columns(
            s.compiled, s.compiled.projection)))
        return Chosen(plans, routes)

    def _slots_refusal(self, plans: list[Any], layout: StreamLayout) -> str | None:
        """A real-time task per source partition holds its slot for the whole batch: the query
        needs fewer partitions than the session has slots (one left for the other queries)."""
        slots = int(self._spark.sparkContext.defaultParallelism)
        cuts = [len(s.compiled.start_offsets) for s in plans
                if s.compiled.start_offsets is not None]
        if not cuts:
            try:
                from pep.runtime.sources.kafka_offsets import KafkaOffsets
                cuts = [len(KafkaOffsets().end_offsets(layout.definition))]
            except Exception as exc:  # noqa: BLE001 - micro-batches, which need no count
                return f"the topic's partitions are unknown ({described(exc)})"
        partitions = max(cuts)
        if partitions >= slots:
            return (f"the topic has {partitions} partition(s) and Spark {slots} task slot(s): "
                    "real-time mode needs a slot per partition and one more")
        return None

    def start(self, chosen: Chosen, layout: StreamLayout, name: str, location: Path,
              delivered: int, progressed: Callable[[int], None]) -> StreamingQuery:
        """Start the real-time query on the checkpoint at `location`; `delivered`: the last
        micro-batch delivered in full (its commit is written if a stop cut it off);
        `progressed(rows)`: a real-time batch ended."""
        commit_delivered(location, delivered)
        epoch = ensure_epoch(location)
        records = self._rows.records(kafka_realtime_frame(self._spark, layout.definition),
                                     layout.schema, chosen.plans, chosen.routes, epoch)

        def ended(rows: int) -> None:
            running = self._running
            if running is not None:
                running.progressed = time.time()
            progressed(rows)
        query_progress(self._spark).register(name, ended)
        markers = None
        if self._client is not None:
            markers = count_markers(self._spark, self._client)
            topics = counted_topics(chosen.routes)
            try:
                markers.open(topics, epoch)
            except Exception as exc:  # noqa: BLE001 - its first batch: checked by an earlier marker
                log.error("stream %s: no opening count marker (%s)", layout.name, described(exc))
        started = time.time()
        query = self._rows.start(records, name, location)
        if markers is not None:
            markers.counting(str(query.runId), _Counted(epoch, topics, name))
        self._running = _Running(routes_key(chosen.routes, chosen.plans), list(chosen.routes),
                                 epoch, str(query.runId), started)
        log.info("stream %s: real-time mode, %d plan(s)", layout.name, len(chosen.plans))
        return query

    # ----- stopping ---------------------------------------------------------------------------
    def after_stop(self, layout: StreamLayout) -> None:
        """The real-time query was stopped (`StreamingQuery.stop()` returned): wait for its
        tasks and records, then raise the cuts of the plans it served past what it wrote (the
        module docstring). Nothing when the query was not in real-time mode."""
        running = self._running
        if running is None:
            return
        try:
            self._await_tasks(running.run_id)
            # the plans still attached (a plan whose last handle left: its topic goes too)
            live = {s.id for s in self._plans() if s.used}
            routes = [r for r in running.routes if r.pid in live]
            if self._client is None or not routes:
                return
            since = (running.progressed or running.started) - self._rows.batch_seconds - 2.0
            tops = written_tops(self._client, sorted({t for r in routes for t in r.topics}),
                                running.epoch, since)
            cuts = plan_cuts(routes, tops)
            if cuts:
                self._raise_cuts(cuts)
                log.info("stream %s: the real-time query wrote up to offsets %s: its plans "
                         "start after them", layout.name,
                         {pid: list(c) for pid, c in sorted(cuts.items())})
        except Exception as exc:  # noqa: BLE001 - the next query may then write some rows again
            log.error("stream %s: what the real-time query wrote is unknown (%s); the next "
                      "query may write some of its rows again", layout.name, described(exc))
        finally:
            self._running = None

    def forget(self) -> None:
        """The query stopped for good (the last handle left, the gateway stops)."""
        self._running = None

    def _await_tasks(self, run_id: str) -> None:
        """Until the stopped query's tasks have ended (a stop cancels its job; its tasks end a
        moment later, still writing meanwhile), at most TASKS_END seconds."""
        tracker = self._spark.sparkContext.statusTracker()
        deadline = time.monotonic() + TASKS_END
        while time.monotonic() < deadline:
            active = 0
            for job in tracker.getJobIdsForGroup(run_id):
                info = tracker.getJobInfo(job)
                for stage in (info.stageIds if info is not None else ()):
                    stage_info = tracker.getStageInfo(stage)
                    active += stage_info.numActiveTasks if stage_info is not None else 0
            if not active:
                return
            time.sleep(0.05)
        log.warning("real-time query %s: its tasks did not end within %.0f s", run_id, TASKS_END)

    # ----- changing the mode ------------------------------------------------------------------
    def plans_changed(self, control: QueryControl) -> None:
        """A handle came or went: the query is started again when its mode must change, or
        when the plans a real-time query was built from changed (they are literals of it); in
        a thread of its own (the caller may hold the runtime's lock or be in a batch's
        delivery)."""
        if not control.running:
            return
        threading.Thread(target=self._change, args=(control,), name="xsg-realtime-restart",
                         daemon=True).start()

    def _change(self, control: QueryControl) -> None:
        with self.lock:
            if self.ended or not control.running:
                return
            if not any(s.used for s in self._plans()):
                return  # the last handle left: the runtime stops the query
            layout = control.layout
            chosen = self.choose(layout)
            running = self._running
            if chosen is None and running is None:
                return
            if chosen is not None and running is not None \
                    and routes_key(chosen.routes, chosen.plans) == running.built:
                return
            log.info("stream %s: %s, its query starts again", layout.name,
                     "its plans changed" if chosen is not None and running is not None
                     else f"to {'real-time mode' if chosen is not None else 'micro-batches'}")
            control.restart()


def commit_delivered(location: Path, delivered: int) -> bool:
    """Write Spark's commit of the checkpoint's last planned micro-batch when that batch was
    delivered in full (`delivered` is at least its id) and a stop cut off its commit, so that a
    real-time query, which cannot skip it, does not run it again. True when written."""
    commits = location / "commits"
    planned = planned_batches(location)
    if not planned:
        return False
    last = planned[-1]
    committed = last_committed(location)
    if last > delivered or committed >= last:
        return False
    previous = (commits / str(committed)) if committed >= 0 else None
    text = (previous.read_text(encoding="utf-8") if previous is not None
            else 'v1\n{"nextBatchWatermarkMs":0}')
    commits.mkdir(parents=True, exist_ok=True)
    tmp = commits / f".{last}.{uuid.uuid4().hex}.tmp"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(commits / str(last))
    return True


def written_tops(client: dict[str, Any], dests: Sequence[str], epoch: str, since: float
                 ) -> dict[str, dict[int, int]]:
    """Per plan destination (a lane of a topic, `pep.delivery.lanes`), per source partition,
    the highest source offset a real-time query of `epoch` wrote to it (its keys,
    `realtime_key`), among the records written from `since` (epoch seconds) on; read once the
    topics' ends stay still for SETTLE seconds."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({**client, "enable.auto.commit": False, "auto.offset.reset": "latest",
                         "enable.partition.eof": True, "log_level": 2,
                         "logger": logging.getLogger("pep.runtime.delivery.kafka")})
    topics = kafka_topics(dests)
    try:
        ends = _settled_ends(consumer, topics)
        wanted = [TopicPartition(t, 0, int(since * 1000)) for t in topics if ends.get(t, 0) > 0]
        starts = consumer.offsets_for_times(wanted, timeout=10.0) if wanted else []
        out: dict[str, dict[int, int]] = {d: {} for d in dests}
        assign = [TopicPartition(tp.topic, 0, tp.offset) for tp in starts
                  if tp.offset >= 0 and tp.offset < ends[tp.topic]]
        if not assign:
            return out
        consumer.assign(assign)
        left = {tp.topic for tp in assign}
        deadline = time.monotonic() + 30.0
        while left and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                topic, error, offset = str(msg.topic()), msg.error(), msg.offset()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        left.discard(topic)
                    continue
                lane, key = split_key(msg.key())
                place = source_place(key)
                top = out.get(destination(topic, lane))
                if place is not None and place[0] == epoch and top is not None:
                    top[place[1]] = max(top.get(place[1], -1), place[2])
                if offset is not None and offset + 1 >= ends[topic]:
                    left.discard(topic)
        if left:
            raise TimeoutError(f"plan topics {sorted(left)} not read to their ends")
        return out
    finally:
        consumer.close()


def _settled_ends(consumer: Any, topics: Sequence[str]) -> dict[str, int]:
    """The topics' end offsets once they stayed the same for SETTLE seconds (a stopped
    query's producer delivers what its tasks handed it)."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    gone = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
            KafkaError._UNKNOWN_PARTITION)

    def end(topic: str) -> int:
        try:
            return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10.0)[1])
        except KafkaException as exc:
            if exc.args and exc.args[0].code() in gone:
                return 0  # deleted meanwhile (its handles ended): nothing to start after
            raise

    def ends() -> dict[str, int]:
        return {t: end(t) for t in topics}
    last = ends()
    deadline = time.monotonic() + SETTLE_MAX
    while time.monotonic() < deadline:
        time.sleep(SETTLE)
        now = ends()
        if now == last:
            return now
        last = now
    return last


def plan_cuts(routes: Sequence[PlanRoute], tops: dict[str, dict[int, int]]) -> Cuts:
    """Per plan the real-time query served, the cut past what it wrote: per source partition
    the highest offset written + 1. A plan with several topics takes the lowest of theirs per
    partition (a task stopped between two of a record's writes: the topic that has it may get
    it again, the one that lacks it does not lose it)."""
    cuts: Cuts = {}
    for route in routes:
        per_topic = [tops.get(t, {}) for t in route.topics]
        partitions = set().union(*per_topic) if per_topic else set()
        if not partitions:
            continue
        firsts = {p: min(top.get(p, -1) for top in per_topic) + 1 for p in partitions}
        if not any(firsts.values()):
            continue
        cuts[route.pid] = tuple(firsts.get(p, 0) for p in range(max(partitions) + 1))
    return cuts


__all__ = ["Chosen", "CountMarkers", "Cuts", "QueryControl", "RealTimeMode", "commit_delivered",
           "count_markers", "mark_of", "plan_cuts", "written_tops"]
