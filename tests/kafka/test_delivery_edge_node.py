"""An edge checks every reader in the store, and stops serving (deny when in doubt) when it
cannot reach the store: a real PostgreSQL store, the session's broker for the control topic,
an `EdgeNode` in this process."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pep.core.errors import Gone, NotFound, Unavailable
from pep.delivery.control import Revocation, ensure_topics
from pep.delivery.settings import DeliverySettings
from pep.delivery.store import DeliveryStore
from pep.edge.node import LOST_AFTER, EdgeNode


class EdgeStore(DeliveryStore):
    """The store as an edge sees it: its edge-side calls (`seen`, `states`, `stalled_streams`)
    fail as an unreachable store's do while `cut`; the callables in `during` run while the
    edge's look at the states of the handles it serves is under way (a reader that opens
    meanwhile)."""

    def __init__(self, database: Any) -> None:
        super().__init__(database)
        self.cut = False
        self.during: list[Callable[[], None]] = []
        self.views: list[list[str]] = []  # the handles of each reader check, in order
        self.views_slow = 0.0  # seconds each reader check takes more (a loaded store)
        self.views_cut = False  # reader checks fail as an unreachable store's do

    def reader_views(self, handle_ids):
        self.views.append(sorted(handle_ids))
        time.sleep(self.views_slow)
        if self.views_cut:
            raise ConnectionError("the store cannot be reached")
        return super().reader_views(handle_ids)

    def seen(self, edge: str) -> bool:
        if self.cut:
            raise ConnectionError("the store cannot be reached")
        return super().seen(edge)

    def stalled_streams(self):
        if self.cut:
            raise ConnectionError("the store cannot be reached")
        return super().stalled_streams()

    def states(self, handle_ids):
        if self.cut:
            raise ConnectionError("the store cannot be reached")
        out = super().states(handle_ids)
        while self.during:
            self.during.pop()()
        return out


@dataclass
class World:
    """A real PostgreSQL store with two live handles of `lta` ("h1", "h2") bound to one plan
    topic, and the delivery topics on the session's broker."""

    settings: DeliverySettings
    store: EdgeStore
    handles: Any


@pytest.fixture
def world(kafka_broker, postgres, tmp_path):
    from confluent_kafka.admin import AdminClient

    from common.db import open_storage
    from common.migrations import migrate
    from pep.handles.records import HandleRecord, HandleStore, StoredRequest
    from pep.streams.entries import SCHEMA as CATALOG_SCHEMA

    storage = open_storage(tmp_path, postgres.new_url(), pool_size=4)
    handles = HandleStore(storage.database("handles"))
    migrate(storage.database("streams"), CATALOG_SCHEMA)
    prefix = f"n{int(time.time() * 1000) % 1000000}."
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT",
                                prefix=prefix)
    ensure_topics(AdminClient({"bootstrap.servers": kafka_broker.bootstrap}), settings,
                  (settings.control_topic, settings.acks_topic, prefix + "plan.p"))
    store = EdgeStore(storage.database("delivery"))
    for hid in ("h1", "h2"):
        handles.insert(HandleRecord(hid, "lta", (), False, "s", "{}", "k", (),
                                    StoredRequest(b"<Request/>", "application/xacml+xml")))
        store.bind(hid, prefix + "plan.p", 0)
    try:
        yield World(settings, store, handles)
    finally:
        storage.close()


@pytest.mark.timeout(120)
def test_an_edge_checks_readers_and_stops_serving_without_its_store(world):
    from pep.handles.records import HandleState

    store = world.store
    node = EdgeNode(world.settings, store, "edge-n", "http://127.0.0.1:1")
    node.start()
    try:
        with pytest.raises(NotFound):
            node.open("h1", "other", None)  # another subject: as for no such handle
        with pytest.raises(NotFound):
            node.open("nope", "lta", None)
        for absurd in ("h1\x00", "x" * 5000, ""):  # no handle's id: no query, as for none
            with pytest.raises(NotFound):
                node.open(absurd, "lta", None)
        reader = node.open("h1", "lta", None)
        # a revocation on the control topic closes its readers, and no new reader opens
        node.revoked(Revocation("r1", ("h1",), "revoked", "a test"))
        assert reader.closed and reader.read(None)[0].kind == "revoked"
        world.handles.finish_many([("h1", HandleState.REVOKED, "a test")],
                                  at="2026-01-01T00:00:00Z")
        with pytest.raises(Gone):
            node.open("h1", "lta", None)
        # the store away: after the bound, the readers end and new ones are refused
        other = node.open("h2", "lta", None)
        store.cut = True
        deadline = time.monotonic() + LOST_AFTER + 3
        while node.serving and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not node.serving
        assert other.closed and other.read(None)[0].kind == "shutdown"
        with pytest.raises(Unavailable):
            node.open("h2", "lta", None)
        store.cut = False  # back: it serves again
        deadline = time.monotonic() + 5
        while not node.serving and time.monotonic() < deadline:
            time.sleep(0.1)
        assert node.serving
        node.closed(node.open("h2", "lta", None))
    finally:
        node.stop()


@pytest.mark.timeout(120)
def test_a_reader_that_opens_during_the_edges_look_at_the_store_is_not_ended(world):
    """The edge's look (twice a second) asks about the handles it served when it began; a
    handle whose first reader came meanwhile is live, and its reader reads on (issue 45: it got
    `ended` at once, and none of its rows)."""
    from pep.edge.node import WATCH_EVERY

    store = world.store
    node = EdgeNode(world.settings, store, "edge-s", "http://127.0.0.1:1")
    node.start()
    try:
        first = node.open("h1", "lta", None)
        late: list = []
        store.during.append(lambda: late.append(node.open("h2", "lta", None)))
        deadline = time.monotonic() + 10
        while not late and time.monotonic() < deadline:
            time.sleep(0.05)
        assert late, "the edge did not look at the store"
        time.sleep(3 * WATCH_EVERY)  # its next looks ask about h2 too
        assert not first.closed
        assert not late[0].closed, late[0].read(None)
        node.closed(late[0])
        node.closed(first)
    finally:
        node.stop()


@pytest.mark.timeout(60)
def test_an_edge_tells_a_streams_readers_of_its_stall_from_the_store_and_the_control_topic(world):
    """Issue 45: the streams stalled now are in the store (read at each look, twice a second)
    and come on the control topic; a reader of a stalled stream's handle is told `stalled`
    (first, when it comes during the stall), then `resumed`, each once; a store answer older
    than the control record does not undo it."""
    import json

    from pep.delivery.control import StreamNotice
    from pep.edge.node import WATCH_EVERY

    def kinds(reader) -> list[str]:
        return [e.kind for e in reader.read(None, timeout=0.1)]

    store = world.store
    node = EdgeNode(world.settings, store, "edge-t", "http://127.0.0.1:1")
    node.start()
    try:
        first = node.open("h1", "lta", None)
        store.save_stalls("g1", {"s": ("stalled", "2026-01-01T00:00:00Z")})  # the gateway's save
        deadline = time.monotonic() + 5
        told: list = []
        while not told and time.monotonic() < deadline:
            told = first.read(None, timeout=0.1)
        assert [e.kind for e in told] == ["stalled"], told
        assert json.loads(told[0].data) == {
            "event": "stalled", "stream": "s", "state": "stalled",
            "last_batch_at": "2026-01-01T00:00:00Z", "detail": json.loads(told[0].data)["detail"]}
        late = node.open("h2", "lta", None)  # during the stall: told at once
        assert kinds(late) == ["stalled"]
        node.stream_notice(StreamNotice("s", True, "stalled"))  # the control record: no repeat
        time.sleep(3 * WATCH_EVERY)
        assert kinds(first) == [] and kinds(late) == []
        # the gateway saves, then publishes: whichever the edge hears of first tells, once
        store.save_stalls("g1", {})
        node.stream_notice(StreamNotice("s", False, None))
        assert kinds(first) == ["resumed"] and kinds(late) == ["resumed"]
        time.sleep(3 * WATCH_EVERY)
        assert kinds(first) == [] and kinds(late) == []
        node.closed(first)
        node.closed(late)
    finally:
        node.stop()


@pytest.mark.timeout(60)
def test_stalls_are_kept_per_gateway_and_a_silent_gateway_s_are_not_read(world):
    """Several `--cluster` gateways share the store, each running its own streams: one's save
    does not erase another's stalls; a gateway not heard from for `STALLS_STALE` seconds
    stopped (its streams run elsewhere now) and its rows are not read."""
    store = world.store
    store.save_stalls("g1", {"s": ("stalled", None)})
    store.save_stalls("g2", {"t": ("failed", "2026-01-01T00:00:00Z")})
    assert store.stalled_streams() == {"s": ("stalled", None),
                                       "t": ("failed", "2026-01-01T00:00:00Z")}
    store.save_stalls("g2", {})  # g2's stream runs again; g1's is still stalled
    assert store.stalled_streams() == {"s": ("stalled", None)}
    store.save_stalls("g2", {"s": ("failed", None)})  # while s moves: failed over stalled
    assert store.stalled_streams() == {"s": ("failed", None)}
    store.save_stalls("g2", {})
    with store._db.transaction() as cur:  # g1 silent for longer than STALLS_STALE
        cur.execute("UPDATE delivery_stream_stalls SET seen = seen - 3600 WHERE reporter = 'g1'")
    assert store.stalled_streams() == {}


def test_a_gateway_renews_its_stalls_while_they_last():
    """`StreamNotices` saves on a change, and again every `STALLS_REFRESH` seconds while a
    stream is stalled (so that its rows are not read as a stopped gateway's), never while
    nothing is stalled and nothing changed; notices only on changes."""
    from pep.delivery.control import StreamNotices
    from pep.delivery.store import STALLS_REFRESH

    now = [100.0]
    saved: list = []
    told: list = []
    notices = StreamNotices("g1", lambda r, s: saved.append((r, s)), told.append,
                            clock=lambda: now[0])
    notices.changed({})
    notices.changed({})
    assert saved == [("g1", {})]
    notices.changed({"s": ("stalled", None)})
    notices.changed({"s": ("stalled", None)})
    assert len(saved) == 2 and [(n.stream, n.stalled) for n in told] == [("s", True)]
    now[0] += STALLS_REFRESH + 0.1
    notices.changed({"s": ("stalled", None)})
    assert saved[-1] == ("g1", {"s": ("stalled", None)}) and len(saved) == 3
    assert len(told) == 1  # renewed, not told again
    notices.changed({})
    assert saved[-1] == ("g1", {}) and [(n.stream, n.stalled) for n in told][-1] == ("s", False)


@pytest.mark.timeout(60)
def test_readers_connecting_at_once_are_checked_together_and_never_unchecked(world):
    """Issue 45: a burst of readers is a few store reads (those that come while one runs are
    checked by the next, together), each begun after its readers came; a reader whose check
    fails gets 503, never a reader, and the edge keeps serving the others."""
    import threading

    store = world.store
    node = EdgeNode(world.settings, store, "edge-b", "http://127.0.0.1:1")
    node.start()
    store.views_slow = 0.3
    wanted = ["h1", "h2", "nope"] * 40
    start = threading.Barrier(len(wanted))
    got: list[Any] = [None] * len(wanted)

    def connect(i: int) -> None:
        start.wait()
        try:
            got[i] = node.open(wanted[i], "lta", None)
        except Exception as exc:  # noqa: BLE001 - what the reader was told
            got[i] = exc
    try:
        threads = [threading.Thread(target=connect, args=(i,)) for i in range(len(wanted))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for handle, answer in zip(wanted, got, strict=True):
            if handle == "nope":
                assert isinstance(answer, NotFound), answer
            else:
                assert getattr(answer, "handle_id", None) == handle, answer
        assert 1 <= len(store.views) <= 4, store.views  # 120 readers, a few reads
        assert sorted({h for v in store.views for h in v}) == ["h1", "h2", "nope"]
        for reader in got:
            if not isinstance(reader, Exception):
                node.closed(reader)
        store.views_slow, store.views_cut = 0.0, True  # the reads fail: 503, no reader
        with pytest.raises(Unavailable) as told:
            node.open("h1", "lta", None)
        assert told.value.retry_after == 1
        assert node.reader_count() == 0
        store.views_cut = False
        node.closed(node.open("h1", "lta", None))
    finally:
        node.stop()
