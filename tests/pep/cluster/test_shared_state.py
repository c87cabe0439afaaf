"""What several gateway processes share, on a real PostgreSQL (tests/pg_server.py), each "process"
its own `Storage` (its own connection pool) as two `xsg serve` processes would have: leases and
their fencing, the one-window rule and the privacy budgets checked in the store's transactions,
policies followed by version, announcements and their acknowledgements. No Spark: the processes
with Spark are tests/e2e/test_cluster.py's."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from common.db import StoreUnavailable, open_storage
from common.migrations import migrate
from pdp import PolicyEvents, PolicyService
from pdp.store import SQLPolicyStore
from pep.cluster.announce import Announcements
from pep.cluster.placement import LET_GO_AT, Elsewhere, Placement, SplitStreams
from pep.cluster.store import NOW, ClusterStore
from pep.cluster.windows import StoreWindows
from pep.core.privacy import Budget, units
from pep.handles.one_window import WindowConflict
from pep.handles.privacy_budget import PrivacyLedger
from pep.handles.records import HandleRecord, HandleState, HandleStore, StoredRequest
from pep.streams.entries import SCHEMA as CATALOG_SCHEMA
from pep.streams.events import SCHEMA as EVENTS_SCHEMA

REQ = StoredRequest(b"<Request/>", "application/xacml+xml")


@pytest.fixture
def url(postgres):
    return postgres.new_url()


@pytest.fixture
def storages(url, tmp_path):
    """Three processes' storages on one schema."""
    opened = [open_storage(tmp_path / f"p{n}", url, pool_size=4) for n in range(3)]
    # the tables the cluster's queries read beside its own (the gateway makes them at start)
    HandleStore(opened[0].database("handles")).close()
    migrate(opened[0].database("events"), EVENTS_SCHEMA)
    migrate(opened[0].database("streams"), CATALOG_SCHEMA)  # derived streams move with theirs
    yield opened
    for s in opened:
        s.close()


def lease_left(storage, stream: str) -> float:
    db = storage.database("cluster")
    row = db.fetchone(f"SELECT expires_at - {NOW} FROM stream_leases WHERE stream = ?",
                      (stream,))
    return float(row[0])


class Calls:
    def __init__(self) -> None:
        self.taken: list[list[str]] = []
        self.gone: list[tuple[list[str], str, float]] = []

    def take(self, streams: list[str]) -> None:
        self.taken.append(streams)

    def let_go(self, streams: list[str], reason: str) -> None:
        self.gone.append((streams, reason, time.monotonic()))


class Isolated(ClusterStore):
    """A process cut off from the store: its renewals fail as an unreachable store's do."""

    cut = False

    def renew(self, seconds: float) -> dict[str, int]:
        if self.cut:
            raise StoreUnavailable("the store cannot be reached, nothing was changed: cut")
        return super().renew(seconds)


@pytest.mark.timeout(120)
def test_a_stream_is_held_by_one_process_and_moves_only_once_its_holder_let_it_go(storages):
    a_calls, b_calls = Calls(), Calls()
    a_store = Isolated(storages[0].database("cluster"), "a")
    b_store = ClusterStore(storages[1].database("cluster"), "b")
    a_store.join("http://a", "h", 1)
    b_store.join("http://b", "h", 2)
    a = Placement(a_store, 2.0, a_calls.take, a_calls.let_go)
    b = Placement(b_store, 2.0, b_calls.take, b_calls.let_go)
    try:
        a.claim(["weather"])
        assert a_calls.taken == [["weather"]] and a.holds(["weather"])
        with pytest.raises(Elsewhere) as where:
            b.claim(["weather"])
        assert where.value.member == "a"
        a.claim(["weather"])  # held: nothing in the store, nothing taken again
        assert a_calls.taken == [["weather"]]
        a.start()
        time.sleep(2.5)  # renewed past its first term
        assert a.holds(["weather"]) and lease_left(storages[0], "weather") > 0
        with pytest.raises(Elsewhere):
            b.claim(["weather"])

        # a loses the store: it lets go before its lease can expire, and b cannot take the
        # stream until then
        a_store.cut = True
        cut_at = time.monotonic()
        deadline = time.monotonic() + 10
        while not a_calls.gone and time.monotonic() < deadline:
            time.sleep(0.02)
        assert a_calls.gone, "a kept serving with no way to renew its lease"
        streams, reason, at = a_calls.gone[0]
        assert streams == ["weather"] and "moved to another gateway process" in reason
        assert at - cut_at <= 2.0 * LET_GO_AT + 0.5
        left = lease_left(storages[1], "weather")
        assert left > 0.2, f"a let go only {left:.2f} s before its lease expired"
        assert not a.holds(["weather"])
        with pytest.raises(Elsewhere):  # still a's in the store: b waits for the expiry
            b.claim(["weather"])
        time.sleep(left + 0.05)
        b.claim(["weather"])
        assert b_calls.taken == [["weather"]]
        epochs = storages[2].database("cluster").fetchall(
            "SELECT member, epoch FROM stream_leases WHERE stream = 'weather'")
        assert epochs == [("b", 2)]  # the fencing token moved on
    finally:
        a.stop()
        b.stop()


@pytest.mark.timeout(60)
def test_a_join_takes_both_streams_or_names_the_process_that_holds_them(storages):
    a = Placement(ClusterStore(storages[0].database("cluster"), "a"), 5.0, Calls().take,
                  Calls().let_go)
    b = Placement(ClusterStore(storages[1].database("cluster"), "b"), 5.0, Calls().take,
                  Calls().let_go)
    a.claim(["ais"])
    b.claim(["weather"])
    with pytest.raises(SplitStreams, match="a join's streams must be served by one gateway "
                                           "process.*ais is served by process a"):
        b.claim(["ais", "weather"])
    with pytest.raises(Elsewhere):
        b.claim(["ais"])
    a.claim(["ais", "vessels"])  # free and held: taken together
    assert a.holds(["ais", "vessels"])


@pytest.mark.timeout(60)
def test_a_dead_process_streams_are_split_between_the_survivors(storages):
    """Orphans (live handles, no valid lease) are taken by a look of the survivors, at most
    their share each."""
    dead = ClusterStore(storages[0].database("cluster"), "dead")
    handles = HandleStore(storages[0].database("handles"))
    for n in range(4):
        handles.insert(HandleRecord(f"h{n}", "lta", (), False, f"s{n}", "{}", "k", (), REQ))
    dead.claim([f"s{n}" for n in range(4)], 0.5)
    survivors = []
    for n, name in ((1, "b"), (2, "c")):
        store = ClusterStore(storages[n].database("cluster"), name)
        store.join(f"http://{name}", "h", n)
        survivors.append((Placement(store, 2.0, Calls().take, Calls().let_go), store))
    time.sleep(0.6)
    assert sorted(survivors[0][1].orphans()) == ["s0", "s1", "s2", "s3"]
    survivors[0][0].tick()  # its share: half of the four
    assert len(survivors[0][0].held) == 2
    for _ in range(2):  # the others' looks take what is left
        for placement, _ in survivors:
            placement.tick()
    held = [sorted(p.held) for p, _ in survivors]
    assert sorted(held[0] + held[1]) == ["s0", "s1", "s2", "s3"]
    assert all(held), held
    assert survivors[0][1].orphans() == []
    handles.close()


def live_handle(store: HandleStore, handle_id: str, stream: str = "weather") -> None:
    store.insert(HandleRecord(handle_id, "lta", (), False, stream, "{}", "k", (), REQ))


@pytest.mark.timeout(60)
def test_the_one_window_rule_holds_across_processes(storages):
    ids = iter(f"h{n}" for n in range(100))
    a = StoreWindows(storages[0].database("cluster"), new_handle_id=lambda: next(ids))
    b = StoreWindows(storages[1].database("cluster"), new_handle_id=lambda: next(ids))
    handles = HandleStore(storages[0].database("handles"))
    first, new = a.acquire("lta", "weather", "plan-1")
    assert new
    live_handle(handles, first)
    assert b.acquire("lta", "weather", "plan-1") == (first, False)  # the same query: its handle
    with pytest.raises(WindowConflict) as conflict:
        b.acquire("lta", "weather", "plan-2")  # another window over the same tuples
    assert conflict.value.existing_handle_id == first
    with pytest.raises(WindowConflict):
        b.acquire("lta", ("weather", "ais"), "join")  # a join on it too
    assert b.acquire("nea", "weather", "plan-2")[1]  # another subject's slot
    handles.finish(first, HandleState.RELEASED, "released")  # its end frees the slot
    second, new = b.acquire("lta", "weather", "plan-2")
    assert new and second != first
    live_handle(handles, second)
    with pytest.raises(WindowConflict):
        a.restore("lta", "weather", "plan-1", first)
    a.restore("lta", "weather", "plan-2", second)  # the handle resumed by another process
    # a booking whose handle is being opened counts; refused after booking, it is released
    ghost, _ = a.acquire("lta", "ais", "plan-3")
    with pytest.raises(WindowConflict):
        b.acquire("lta", "ais", "plan-4")
    assert a.release(ghost)
    assert b.acquire("lta", "ais", "plan-4")[1]
    handles.close()


@pytest.mark.timeout(60)
def test_concurrent_bookings_of_one_slot_give_one_window(storages):
    counter = iter(range(10_000))
    lock = threading.Lock()

    def new_id() -> str:
        with lock:
            return f"h{next(counter)}"

    stores = [StoreWindows(s.database("cluster"), new_handle_id=new_id) for s in storages]
    handles = [HandleStore(s.database("handles")) for s in storages]
    outcomes: list[str] = []
    barrier = threading.Barrier(len(stores))

    def book(n: int) -> None:
        barrier.wait()
        try:
            handle_id, new = stores[n].acquire("lta", "weather", f"plan-{n}")
        except WindowConflict:
            outcomes.append("conflict")
            return
        live_handle(handles[n], handle_id)  # as HandleService.open writes it next
        outcomes.append("booked")

    threads = [threading.Thread(target=book, args=(n,)) for n in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # each books inside its own transaction under the subject's lock, and a booking being
    # opened counts: one booking, the others refused
    assert sorted(outcomes) == ["booked", "conflict", "conflict"]
    live = storages[0].database("handles").fetchall(
        "SELECT b.handle_id FROM window_bookings b JOIN handles h ON h.id = b.handle_id"
        " WHERE b.subject = 'lta' AND b.stream = 'weather' AND h.state = 'live'")
    assert len(live) == 1
    for h in handles:
        h.close()


@pytest.mark.timeout(60)
def test_privacy_budgets_hold_across_processes(storages):
    """Two processes pay for one consumer's windows on one stream (the stream moved, or moved
    back): each checks the other's spends in its own transaction, so the budget holds."""
    budget = (Budget(1.0, 3600),)
    ledgers = [PrivacyLedger(s.database("privacy"), shared=True) for s in storages[:2]]
    paid = [0, 0]
    barrier = threading.Barrier(2)

    def spend(n: int) -> None:
        barrier.wait()
        for _ in range(20):
            paid[n] += ledgers[n].spend("lta", "weather", units(0.1), 1, budget)[0]

    threads = [threading.Thread(target=spend, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(paid) == 10  # 10 windows of 0.1: the budget, not a window more
    for ledger in ledgers:
        (state,) = ledger.states("lta", "weather", budget)
        assert state.spent == units(1.0) and state.remaining == 0
    # an in-memory ledger (one process's) would have paid again from its own sums
    assert ledgers[0].spend("lta", "weather", units(0.1), 1, budget)[0] == 0
    for ledger in ledgers:
        ledger.close()


def policy(policy_id: str, stream: str = "weather", effect: str = "Permit",
           version: str = "1") -> bytes:
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
  PolicyId="{policy_id}" Version="{version}"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides">
  <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
    <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">{stream}</AttributeValue>
    <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
      AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
      DataType="http://www.w3.org/2001/XMLSchema#string" MustBePresent="false"/>
  </Match></AllOf></AnyOf></Target>
  <Rule RuleId="r" Effect="{effect}"/>
</Policy>""".encode()


def service(storage) -> tuple[PolicyService, list]:
    seen: list = []
    events = PolicyEvents()
    events.subscribe(seen.append)
    svc = PolicyService(SQLPolicyStore(storage.database("policies", foreign_keys=True)), events)
    svc.shared = True
    return svc, seen


@pytest.mark.timeout(120)
def test_policies_written_by_two_processes_at_once_are_all_followed_in_order(storages):
    a, a_seen = service(storages[0])
    b, b_seen = service(storages[1])
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def write(svc: PolicyService, who: str) -> None:
        barrier.wait()
        try:
            for n in range(15):
                svc.add(policy(f"{who}-{n}"), who)
                svc.update(f"shared-{who}" if n else f"shared-{who}", policy(
                    f"shared-{who}", version=str(n + 2)), who) if n else \
                    svc.add(policy(f"shared-{who}"), who)
                if n % 5 == 4:
                    svc.delete(f"{who}-{n}", who)
        except BaseException as exc:  # noqa: BLE001 - reported below  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(svc, who)) for svc, who in ((a, "a"),
                                                                                  (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert errors == []
    store = SQLPolicyStore(storages[2].database("policies", foreign_keys=True))
    versions = [p.store_version for p in store.versions_after(0)]
    assert versions == list(range(1, len(versions) + 1)) and len(versions) == 2 * (15 + 15 + 3)
    for svc in (a, b):
        svc.catch_up()
        assert svc.applied_version == versions[-1]
        assert [(p.policy_id, p.store_version) for p in svc.list()] == \
            [(p.policy_id, p.store_version) for p in store.list()]
        assert sorted(svc.engine.policies) == sorted(p.policy_id for p in store.list())
    # each process announced every version to its subscribers, in order, once
    for seen in (a_seen, b_seen):
        numbers = [change.store_version for change in seen]
        assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
        assert set(numbers) == set(versions)
    store.close()


@pytest.mark.timeout(120)
def test_announcements_are_acknowledged_and_a_lost_listener_catches_up(storages):
    applied: dict[str, list] = {"a": [], "b": []}
    caught: dict[str, int] = {"a": 0, "b": 0}
    nodes = {}
    for n, name in ((0, "a"), (1, "b")):
        store = ClusterStore(storages[n].database("cluster"), name)
        store.join(f"http://{name}", "h", n)
        other = "b" if name == "a" else "a"

        def catch_up(name: str = name) -> None:
            caught[name] += 1

        nodes[name] = Announcements(storages[n].dedicated_connection,
                                    storages[n].database("cluster"), name,
                                    applied[name].append, catch_up,
                                    lambda other=other: [other], poll=0.5)
        nodes[name].start()
    try:
        for node in nodes.values():
            assert node.listening.wait(10)
        started = time.monotonic()
        missing = nodes["a"].announce_and_wait("policies", 5.0, version=7)
        assert missing == [] and time.monotonic() - started < 2.0
        assert [(m["kind"], m["version"], m["origin"]) for m in applied["b"]] == [
            ("policies", 7, "a")]
        assert applied["a"] == []  # its own announcement is not applied again
        # b's listening connection dies: it listens again and catches up by itself
        before = caught["b"]
        storages[2].database("cluster").execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE"
            " '%LISTEN%' AND pid <> pg_backend_pid()")
        deadline = time.monotonic() + 10
        while caught["b"] <= before + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert caught["b"] > before + 1
        assert nodes["b"].listening.wait(10)
        assert nodes["a"].announce_and_wait("streams", 5.0, streams=["x"]) == []
        # a process that does not answer is named (after the time-out), the write goes on
        nodes["b"].stop()
        assert nodes["a"].announce_and_wait("policies", 0.5, version=8) == ["b"]
    finally:
        for node in nodes.values():
            node.stop()


@pytest.mark.timeout(60)
def test_processes_starting_together_seed_and_register_once(storages, tmp_path):
    """Two processes starting on an empty store both seed it (the example policies and
    streams) and both may register one name at once: each name is registered once, the other
    learns it exists (a 409, never a database error), and neither start fails."""
    from pdp import seed_store
    from pep.streams.catalog import StreamCatalog, seed_streams
    from pep.streams.definition import StreamConflict

    repo = Path(__file__).resolve().parents[3]
    catalogs = [StreamCatalog(s.database("streams"), tmp_path / f"d{n}")
                for n, s in enumerate(storages[:2])]
    stores = [SQLPolicyStore(s.database("policies", foreign_keys=True)) for s in storages[:2]]
    outcomes: list = []
    barrier = threading.Barrier(2)

    def start(n: int) -> None:
        barrier.wait()
        try:
            seeded = seed_store(stores[n], repo / "policies", owner="xsg-seed")
            names = seed_streams(catalogs[n], repo / "policies" / "streams.json")
            outcomes.append((len(seeded), names))
        except BaseException as exc:  # noqa: BLE001 - reported below  # pragma: no cover
            outcomes.append(exc)

    threads = [threading.Thread(target=start, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    registered = sorted(name for _, names in outcomes for name in names)
    assert registered == sorted(e.definition.name for e in catalogs[0].all())  # each once
    assert sum(n for n, _ in outcomes) == len(stores[0].list()) > 0  # one seeding
    barrier2 = threading.Barrier(2)
    answers: list = []

    def register(n: int) -> None:
        barrier2.wait()
        try:
            catalogs[n].register("sensors", "nea", [{"name": "v", "type": "double"}])
            answers.append("registered")
        except StreamConflict as exc:
            answers.append(str(exc))

    threads = [threading.Thread(target=register, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(answers) == ["registered", "stream 'sensors' already exists"]
    for c in catalogs:
        c.close()
    for st in stores:
        st.close()
