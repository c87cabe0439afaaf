"""One reader's view of a handle's plan topic on an edge: the events of its plan's records
(its lane's, `pep.delivery.lanes`, when plans share the topic), through the reading interface
the gateway's handle stream pulls from (`pep.http.handles.HandleStream`: `read`, `withholds`,
`last_id`, `base`, waiters), so the edge writes them with the gateway's own code.

- A row's event id is its position in the topic: the record at offset o is event o + 1. Every
  edge numbers the same record the same, so a reader resumes on any edge with `Last-Event-ID`
  exactly where it was. A lane's ids increase but are not consecutive (other lanes' records
  are between); its keys reach the reader without the lane, as on a topic of its own, so
  repeats, holes and counts below are its lane's alone.
- The topic is read from the handle's start offset (where it was bound, `delivery_handles`) on:
  a micro-batch written again after a failure repeats keys (`m:<epoch>:<batch>:<i>`,
  `pep/runtime/delivery`), and a record whose key was read before (`KeyLog`) is skipped; since
  every edge reads from the same start, every edge skips the same ones. Records up to the
  reader's `Last-Event-ID` are read for that and not sent.
- A failed write may have put some of a batch's records on the topic and not others before them
  (the producer's batches of one partition expire, the later ones go on with a new producer
  epoch), so the write run again fills holes below the highest key: only keys read before are
  skipped, never "not above the highest" (which dropped those rows, issue 45). A hole still
  open when the next batch's first record comes (a batch's write ends before the next batch
  starts) is a row lost: the reader is told with a `gap`, never silence.
  A hole in the last batch written (no next batch comes: a quiet stream) is told as a `gap`
  once no record came for `hole_after` seconds while the edge reached the brokers; a row that
  fills it later is still given (under its own position).
- A real-time query (`pep.runtime.query.realtime`) keys a record by its place in the
  stream's topic (`r:<epoch>:<topic>/<partition>/<offset>`) and writes a source partition's
  records in offset order; started again, it writes again what it read since its last commit:
  a record whose source offset is not above the highest read of its partition is skipped
  (`SourceLog`).
  Its holes are found by count markers (`c:<epoch>:<mark>`, written by the gateway after each
  real-time batch, `pep.runtime.query.realtime_mode`): a marker names the batch's source offset
  ranges, the records written to this topic from them, and a marker read before (`after`)
  that every record of the batch follows. When the reader read that one, it read the whole
  batch: the records it lacks (distinct source offsets in the ranges, against the count) are
  told as a `gap` at the marker, after the batch's rows (`CountLog`). A marker whose `after`
  it did not read (it joined within the batch, or the topic lost records) checks nothing: an
  alarm only for a real loss. Markers, like the warm record, take offsets and give no event.
- A fence record (`f:<id>`, `pep.delivery.topics.PlanTopics.fence`) that names another edge
  takes an offset and gives no event either (no row, no hole, no count); one naming this edge
  ends the reader with `shutdown` there (`pep.edge.feed`): nothing from it on is given. The
  feed hands a reader neither these nor the warm record (the reader skips them all the same).
- A record the topic no longer holds (its retention passed) is told as a `gap`: the feed hands
  each record with the start of the run of the topic it read without a break (`offer`'s
  `run_start`), and a run that began above the reader's next offset lost what lay between,
  told with the count (`lost`), or `lost: null` on a lane (how many were its own, no one can
  tell).
- `hold(detail)` (the edge lost the control topic: the brokers are away, `pep.edge.node`): the
  reader is told `stalled` at once and given nothing more (rows read meanwhile wait) until
  `release()`, which tells it `resumed` (or nothing, when it had not read the `stalled` yet).
  Deny when in doubt: rows are withheld while revocations cannot reach the edge, and nothing
  is lost or repeated: the consumer keeps its position, and ids stay positions in the topic.
- `notice(kind, fields)` (the gateway said the stream's query stalled or runs again:
  `pep.delivery.control.StreamNotice`): `stalled` / `resumed` in the rows' order, as the
  gateway's own readers get them (`pep.handles.stall_notices`); rows are not withheld (the
  query writes none while it is stalled), and a notice that repeats the last is not given.
- `close(kind, reason)` drops the rows not yet given to the reader and ends with the final
  event (revoked, released, ended, shutdown), whose id is the last row the reader was given (a
  reader told `shutdown` resumes from there on another edge).
- The records come from the edge's one consumer (`pep.edge.feed`), shared by all its readers;
  each reader keeps its own next offset and key logs, so it sees what a consumer of its own
  would. The feed runs ahead of the reader by at most `MAX_QUEUED` rows (a full reader refuses
  a record and is handed it again once it has room).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from pep.delivery.lanes import lane_of
from pep.delivery.settings import COUNT_KIND, FENCE_KEY, WARM_KEY, DeliverySettings
from pep.edge.feed import FENCED, EdgeFeed, fence_names
from pep.handles.buffer import Event

log = logging.getLogger(__name__)

MAX_QUEUED = 5000  # rows read from the topic and not yet given to the reader
MAX_UNCHECKED = 1_000_000  # real-time records read and not yet checked by a marker, at most
HOLE_AFTER = 30.0  # seconds of quiet (brokers reached) after which the last batch's hole is a gap
NOTICES = ("stalled", "resumed")  # what a held reader is still given


def parse_key(key: bytes | None) -> tuple[str, int, int] | None:
    """(epoch, batch, index) of a plan-topic record's key; None for another key."""
    try:
        kind, epoch, batch, index = (key or b"").decode("ascii").split(":")
        return (epoch, int(batch), int(index)) if kind == "m" else None
    except ValueError:
        return None


def parse_source_key(key: bytes | None) -> tuple[str, str, int] | None:
    """(epoch, source topic/partition, offset) of a key a real-time query wrote
    (`r:<epoch>:<topic>/<partition>/<offset>`, `pep.runtime.query.realtime`); None for
    another key."""
    try:
        kind, epoch, place = (key or b"").decode("ascii").split(":")
        topic, partition, offset = place.rsplit("/", 2)
        return (epoch, f"{topic}/{int(partition)}", int(offset)) if kind == "r" else None
    except ValueError:
        return None


def parse_count_key(key: bytes | None) -> tuple[str, str] | None:
    """(epoch, mark) of a count marker's key (`c:<epoch>:<mark>`); None for another key."""
    try:
        kind, epoch, mark = (key or b"").decode("ascii").split(":")
        return (epoch, mark) if kind == COUNT_KIND and mark else None
    except ValueError:
        return None


class CountLog:
    """A real-time query's records as one reader read them, checked against the count markers
    (the module docstring): per source partition the offsets read and not yet checked, and
    the marks of the markers read since the topic was last read without a break."""

    def __init__(self) -> None:
        self.epoch: str | None = None
        self.read: dict[str, set[int]] = {}
        self.unchecked = 0  # offsets noted since the last marker (bounds `read`)
        self.anchors: deque[str] = deque(maxlen=64)

    def _epoch(self, epoch: str) -> None:
        if epoch != self.epoch:
            self.epoch, self.read = epoch, {}
            self.anchors.clear()

    def note(self, key: tuple[str, str, int]) -> None:
        """A record of a real-time query (a repeat too: its offset is counted once)."""
        epoch, partition, offset = key
        self._epoch(epoch)
        self.read.setdefault(partition, set()).add(offset)
        self.unchecked += 1
        if self.unchecked > MAX_UNCHECKED:  # no marker for long: what was read is let go
            self.read, self.unchecked = {}, 0
            self.anchors.clear()

    def broken(self) -> None:
        """The topic lost records (told as a gap already): no marker read so far vouches for
        what follows."""
        self.anchors.clear()

    def check(self, key: tuple[str, str], value: bytes | None) -> int:
        """A count marker: how many of its batch's records this reader lacks (0 when it cannot
        tell: it did not read the marker the batch follows)."""
        epoch, mark = key
        self._epoch(epoch)
        try:
            body = json.loads(value or b"{}")
            ranges = {str(p): (int(r[0]), int(r[1]))
                      for p, r in (body.get("ranges") or {}).items()}
            rows, after = int(body.get("rows") or 0), body.get("after")
        except (ValueError, TypeError, AttributeError, IndexError):
            log.warning("plan topic: a count marker that cannot be read (%s); not checked",
                        mark)
            return 0
        lost = 0
        if ranges and after is not None and after in self.anchors:
            have = sum(1 for p, (first, end) in ranges.items()
                       for o in self.read.get(p, ()) if first <= o < end)
            lost = max(0, rows - have)
        # checked or not, done with; only its own ranges: a marker may come late, after the
        # next batch's (a query started again within a batch begins where that batch began)
        for p, (first, end) in ranges.items():
            kept = {o for o in self.read.get(p, ()) if not first <= o < end}
            if kept:
                self.read[p] = kept
            else:
                self.read.pop(p, None)
        self.anchors.append(mark)
        self.unchecked = sum(len(v) for v in self.read.values())
        return lost


class KeyLog:
    """The keys of the records read so far, for the batch being written (`note`). A key of an
    earlier batch of the same epoch is a repeat: batch b + 1 runs only once b's write
    succeeded, so b's records are all on the topic before b + 1's first one."""

    def __init__(self) -> None:
        self.epoch: str | None = None
        self.batch = -1
        self.seen: set[int] = set()
        self.told: set[int] = set()  # holes of this batch already told as a gap (`tell`)

    def note(self, key: tuple[str, int, int]) -> tuple[bool, int]:
        """(whether the record is new, how many of the batch before it were never written:
        indexes between the lowest and the highest read that no record had, and that were
        not told already)."""
        epoch, batch, index = key
        lost = 0
        if epoch != self.epoch or batch > self.batch:
            lost = len(self.missing() - self.told)
            self.epoch, self.batch, self.seen, self.told = epoch, batch, set(), set()
        elif batch < self.batch or index in self.seen:
            return False, 0
        self.seen.add(index)
        return True, lost

    def missing(self) -> set[int]:
        """The batch's indexes between the lowest and the highest read that no record had."""
        if not self.seen:
            return set()
        return set(range(min(self.seen), max(self.seen) + 1)) - self.seen

    def tell(self) -> int:
        """How many of the batch's holes were not told yet; they count as told from now."""
        new = self.missing() - self.told
        self.told |= new
        return len(new)


class SourceLog:
    """The source records a real-time query wrote, per source partition the highest offset
    read (`note`). A real-time query writes a partition's records in offset order; one started
    again reads from its last committed offsets and writes some records again, under the same
    keys: not above the highest, a repeat."""

    def __init__(self) -> None:
        self.epoch: str | None = None
        self.top: dict[str, int] = {}

    def note(self, key: tuple[str, str, int]) -> bool:
        """Whether the record is new."""
        epoch, partition, offset = key
        if epoch != self.epoch:
            self.epoch, self.top = epoch, {}
        if offset <= self.top.get(partition, -1):
            return False
        self.top[partition] = offset
        return True


class TopicReader:
    """A handle's plan topic for one reader (the module docstring)."""

    positioned = False
    base = 0

    def __init__(self, settings: DeliverySettings, handle_id: str, topic: str,
                 start_offset: int, after: int | None, hole_after: float = HOLE_AFTER,
                 stream: str = "") -> None:
        self.handle_id = handle_id
        self.topic = topic  # the destination: `<topic>#<lane>`, or `<topic>` (lane '')
        self._lane = lane_of(topic)
        self.stream = stream
        self._settings = settings
        self._start = max(0, int(start_offset))
        # the reader has had every event up to this id (ids are offsets + 1)
        self._given = max(self._start, after or 0)
        self._rows: deque[Event] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._final: Event | None = None
        self._final_read = False
        self._held = False  # `hold`: only notices are given
        self._hold_notice: Event | None = None  # the `stalled` that `hold` queued
        self._stream_notice = "resumed"  # the last stream notice given (`notice`)
        self._released_at = 0.0  # monotonic time of the last `release` (the quiet restarts)
        self._hole_after = hole_after
        self._waiters: tuple[Callable[[], None], ...] = ()
        # the topic as this reader has read it (the feed's thread only)
        self._expected = self._start  # the next offset needed
        self._keys = KeyLog()
        self._sources = SourceLog()
        self._counts = CountLog()
        self._last_record = time.monotonic()
        self._looked = True  # at the holes, since the last record (once per quiet spell)
        self._pending: list[Event] = []  # taken by `offer`, given at `flush`
        self._feed: EdgeFeed | None = None
        self._own_feed = False
        self.skipped = 0  # records repeated by a micro-batch written again

    def start(self, feed: EdgeFeed | None = None) -> None:
        """Read the topic through the edge's consumer `feed` (None: a consumer of its own)."""
        if feed is None:
            feed, self._own_feed = EdgeFeed(self._settings), True
        self._feed = feed
        feed.add(self)

    # -- the reading interface of `HandleStream` -------------------------------------------------

    @property
    def withholds(self) -> bool:
        return self._final is not None

    @property
    def closed(self) -> bool:
        return self._final is not None

    @property
    def final_read(self) -> bool:
        return self._final_read

    @property
    def last_id(self) -> int:
        with self._cond:
            if self._final is not None:
                return self._final.id + (0 if self._final_read else 1)
            return self._rows[-1].id if self._rows else self._given

    def add_waiter(self, callback: Callable[[], None]) -> None:
        with self._cond:
            self._waiters = self._waiters + (callback,)
        callback()

    def remove_waiter(self, callback: Callable[[], None]) -> None:
        with self._cond:
            self._waiters = tuple(w for w in self._waiters if w is not callback)

    def _wake(self, final: bool = False) -> None:
        self._cond.notify_all()
        for waiter in self._waiters:
            try:
                (getattr(waiter, "urgent", waiter) if final else waiter)()
            except Exception:  # noqa: BLE001 - a reader's callback must not stop the consumer
                pass

    def read(self, after: int | None = None, timeout: float | None = None, limit: int = 1000,
             max_bytes: int | None = None) -> list[Event]:
        """Events after the id `after` (None: after what was given), waiting up to `timeout`
        seconds for one; after the final event, nothing."""
        with self._cond:
            if after is not None and after > self._given:
                self._given = after
            if not self._readable() and self._final is None and timeout:
                self._cond.wait(timeout)
            if self._final is not None:
                if self._final_read:
                    return []
                self._final_read = True
                return [self._final]
            out: list[Event] = []
            size = 0
            rows = self._rows
            while rows and len(out) < limit:
                if self._held and rows[0].kind not in NOTICES:
                    break  # withheld until `release`
                event = rows.popleft()
                if event.id < self._given or (event.id == self._given and event.kind == "row"):
                    continue  # a gap or a notice has the id of the row before it
                out.append(event)
                size += len(event.data)
                if max_bytes is not None and size >= max_bytes:
                    break
            if out:
                self._given = out[-1].id
                self._cond.notify_all()  # room for the consumer
            return out

    def _readable(self) -> bool:
        """Under the lock: whether `read` has something to give now."""
        rows = self._rows
        return bool(rows) and (not self._held or rows[0].kind in NOTICES)

    def hold(self, detail: str) -> None:
        """Tell the reader `stalled` and give it nothing else until `release` (the module
        docstring)."""
        with self._cond:
            if self._final is not None or self._held:
                return
            self._held = True
            self._hold_notice = Event(self._given, "stalled", json.dumps(
                {"event": "stalled", "state": "stalled", "detail": detail}))
            self._rows.appendleft(self._hold_notice)
            self._wake()

    def release(self) -> None:
        """Give the reader its rows again, after `resumed` (none when it had not read the
        `stalled` notice yet: nothing to tell)."""
        with self._cond:
            if not self._held:
                return
            self._held = False
            self._released_at = time.monotonic()
            if self._final is not None:
                return
            if self._rows and self._rows[0] is self._hold_notice:
                self._rows.popleft()
            else:
                self._rows.appendleft(Event(self._given, "resumed", json.dumps(
                    {"event": "resumed", "state": "serving"})))
            self._wake()

    def notice(self, kind: str, fields: dict[str, object]) -> None:
        """A stream notice (`stalled` or `resumed`, the module docstring), after the rows
        queued; nothing when it repeats the last one given."""
        with self._cond:
            if self._final is not None or kind == self._stream_notice:
                return
            self._stream_notice = kind
            at = self._rows[-1].id if self._rows else self._given
            self._rows.append(Event(at, kind, json.dumps({"event": kind, **fields})))
            self._wake()

    def close(self, kind: str, reason: str | None = None) -> bool:
        """Drop what the reader was not given, and end with the final event (False: closed
        already)."""
        with self._cond:
            if self._final is not None:
                return False
            self._rows.clear()
            self._final = Event(self._given, kind, json.dumps({"event": kind, "reason": reason}))
            self._wake(final=True)
        feed = self._feed
        if feed is not None:
            feed.remove(self)
            if self._own_feed:
                feed.close()
        return True

    # -- the topic ------------------------------------------------------------------------------

    # -- the topic (records handed by the edge's consumer, `pep.edge.feed`) --------------------

    @property
    def expected(self) -> int:
        """The offset of the next record this reader needs."""
        return self._expected

    def has_room(self) -> bool:
        with self._cond:
            return len(self._rows) < MAX_QUEUED or self._final is not None

    def offer(self, offset: int, key: bytes | None, value: bytes | None,
              run_start: int) -> bool:
        """The record of this reader's lane at `offset` of the topic, `key` without the lane
        (the feed's thread only), which the feed read every offset of the topic from
        `run_start` to without a break: False when the queue is full (the record is not taken;
        the feed hands it again later). A record below the next one needed was read before."""
        if offset < self._expected or self._final is not None:
            return True
        with self._cond:
            if len(self._rows) + len(self._pending) >= MAX_QUEUED:
                return False
        self._last_record = time.monotonic()
        self._looked = False
        events: list[Event] = []
        expected, self._expected = self._expected, offset + 1
        if run_start > expected:  # the topic lost its records [expected, run_start)
            self._counts.broken()
            if run_start > self._given:  # (a lane's: how many were its own, nobody knows)
                events.append(Event(offset, "gap", json.dumps(
                    {"event": "gap",
                     "lost": None if self._lane else run_start - max(expected, self._given),
                     "resume_from": offset + 1})))
        parsed = parse_key(key)
        place = parse_source_key(key) if parsed is None else None
        if place is not None:
            self._counts.note(place)
        if key == WARM_KEY:  # no row: the producer's first record to a new topic
            self.skipped += 1
        elif key is not None and key.startswith(FENCE_KEY):
            # no row: another edge was fenced off the topic (a record naming this edge ends
            # the topic's readers in the feed before any of them is handed it)
            if fence_names(key, value, self._settings.principal):
                self.close("shutdown", FENCED)  # not through the feed: deny all the same
                return True
        elif parsed is None and place is None and (marker := parse_count_key(key)) is not None:
            lost = self._counts.check(marker, value)  # no row: a real-time batch's count
            if lost and offset + 1 > self._given:
                events.append(Event(offset, "gap", json.dumps(
                    {"event": "gap", "lost": lost, "resume_from": offset + 1})))
        elif place is not None and not self._sources.note(place):
            self.skipped += 1
        elif parsed is not None and not (noted := self._keys.note(parsed))[0]:
            self.skipped += 1
        else:
            lost = noted[1] if parsed is not None else 0
            if lost and offset + 1 > self._given:  # rows a failed write never put
                events.append(Event(offset, "gap", json.dumps(
                    {"event": "gap", "lost": lost, "resume_from": offset + 1})))
            if offset + 1 > self._given:
                events.append(Event(offset + 1, "row", (value or b"{}").decode("utf-8")))
        self._pending += events
        return True

    def flush(self) -> None:
        """Give the reader what `offer` took since the last flush, in one step (one lock, one
        wake of its writer per poll's records: one per record held a reader to ~5,000 rows/s
        on a loaded machine, bench_kafka.py)."""
        if self._pending:
            events, self._pending = self._pending, []
            self._put(events)

    def idle(self, now: float) -> None:
        """No record for a while (the feed's thread, every so often): a quiet stream's last
        batch's hole is told as a gap without waiting for a next batch (issue 45)."""
        if self._looked or self._held or \
                now - max(self._last_record, self._released_at) < self._hole_after:
            return
        self._looked = True
        lost = self._keys.tell()
        if lost and self._expected >= self._given:
            self._put([Event(self._expected, "gap", json.dumps(
                {"event": "gap", "lost": lost, "resume_from": self._expected + 1}))])

    def _put(self, events: list[Event]) -> None:
        with self._cond:
            if self._final is not None:  # closed: what it was not given is dropped
                return
            self._rows.extend(events)
            self._wake()


__all__ = ["MAX_QUEUED", "CountLog", "KeyLog", "SourceLog", "TopicReader", "parse_count_key",
           "parse_key", "parse_source_key"]
