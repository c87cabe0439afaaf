"""Handle records, the state machine and the service around them (a recording runtime: no Spark)."""
from __future__ import annotations

import re
import threading
import time

import pytest

from pep.core.errors import NotFound, Unavailable
from pep.core.plan import plan_from_json
from pep.handles.one_window import WindowConflict, WindowRegistry
from pep.handles.records import (
    HandleRecord,
    HandleState,
    HandleStore,
    StoredRequest,
    new_handle_id,
)
from pep.handles.service import HandleService, StalePolicies
from pep.streams.catalog import StreamCatalog
from tests.pep.conftest import RecordingRuntime, plan

REQ = StoredRequest(b"<Request/>", "application/xacml+xml", b"<UserQuery/>", "application/xml")


@pytest.fixture
def env(tmp_path, storage):
    """The handle service over a catalogue and a handle store on each database."""
    catalog = StreamCatalog(storage.database("streams"), tmp_path / "d")
    catalog.register("weather", "nea", [{"name": "samplingtime", "type": "timestamp"},
                                        {"name": "rainrate", "type": "double"},
                                        {"name": "windspeed", "type": "double"}],
                     None, "samplingtime")
    store = HandleStore(storage.database("handles"))
    runtime = RecordingRuntime()
    windows = WindowRegistry(new_handle_id=new_handle_id)
    svc = HandleService(store, catalog.get, runtime, windows, max_rows=100)
    svc.storage = storage  # what a restart opens again (a test attribute)
    yield svc, runtime, windows, catalog, tmp_path
    store.close()
    catalog.close()


def open_(svc, subject="lta", p=None, **kw):
    return svc.open(subject, ("consumer",), False, p or plan(), {"p1"}, REQ, **kw)


def test_handle_ids_are_unguessable():
    ids = {new_handle_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{43}", i) for i in ids)  # 256 bits, URL-safe
    # none a command line takes for an option (one in 64 did: `xsg stream derive <id> <name>`)
    assert not any(i.startswith("-") for i in ids)


def test_open_persists_and_attaches(env):
    svc, runtime, windows, _, _ = env
    record, new = open_(svc)
    assert new and record.state is HandleState.LIVE and record.id in runtime.attached
    stored = svc.get(record.id)
    assert stored == record and stored.request == REQ and stored.policy_ids == ("p1",)
    assert runtime.push(record.id, [{"rainrate": 9.0}])
    assert [e.kind for e in svc.buffer(record.id).read(0, timeout=0)] == ["row"]


def test_finish_many_ends_each_live_handle_once_as_its_first_ending_says(storage):
    """Past one statement's 500 ids, with two (state, reason) groups, a handle named twice (its
    first ending holds) and one ended before (left as it was)."""
    store = HandleStore(storage.database("handles"))
    try:
        ids = [new_handle_id() for _ in range(1203)]
        for i, hid in enumerate(ids):
            store.insert(HandleRecord(hid, f"s{i}", ("consumer",), False, "weather", "{}",
                                      f"k{i}", ("p1",), REQ))
        assert store.finish(ids[0], HandleState.RELEASED, "released by its owner")
        endings = [(h, HandleState.REVOKED, "policy deleted") for h in ids[:1100]]
        endings += [(ids[5], HandleState.ENDED, "later"), (ids[1100], HandleState.ENDED, "done"),
                    (ids[1100], HandleState.REVOKED, "second")]
        changed = store.finish_many(endings, at="2026-12-07T00:00:00.000000Z")
        assert changed == set(ids[1:1101])
        got = {r.id: r for r in store.get_many(ids)}
        assert (got[ids[0]].state, got[ids[0]].reason) == (HandleState.RELEASED,
                                                           "released by its owner")
        assert all(got[h].state is HandleState.REVOKED and got[h].reason == "policy deleted"
                   and got[h].updated_at == "2026-12-07T00:00:00.000000Z" for h in ids[1:1100])
        assert (got[ids[1100]].state, got[ids[1100]].reason) == (HandleState.ENDED, "done")
        assert all(got[h].live for h in ids[1101:])
        assert store.finish_many([(ids[1], HandleState.ENDED, "x")]) == set()
        with pytest.raises(ValueError):
            store.finish_many([(ids[1201], HandleState.LIVE, None)])
        assert store.get(ids[1201]).live
    finally:
        store.close()


def test_identical_request_gets_same_handle_different_one_conflicts(env):
    svc, runtime, *_ = env
    first, _ = open_(svc)
    again, new = open_(svc)
    assert not new and again.id == first.id and len(runtime.attached) == 1
    with pytest.raises(WindowConflict) as e:
        open_(svc, p=plan(threshold=50))
    assert e.value.existing_handle_id == first.id
    other, new = open_(svc, subject="other")  # another subject has its own window
    assert new and other.id != first.id


def test_owner_only(env):
    svc, *_ = env
    record, _ = open_(svc)
    assert svc.get_owned(record.id, "lta") is not None
    assert svc.get_owned(record.id, "other") is None
    assert svc.get_owned("x" * 43, "lta") is None
    assert svc.release(record.id, "other") is None and svc.get(record.id).live
    assert [r.id for r in svc.list_for("lta")] == [record.id] and svc.list_for("other") == []


def test_revoke_stops_delivery_at_once(env):
    svc, runtime, windows, *_ = env
    record, _ = open_(svc)
    deliver = runtime.attached[record.id][2]
    buf = svc.buffer(record.id)
    assert deliver([{"n": 1}])
    assert svc.revoke(record.id, "policy deleted")
    # the runtime's callback (still held by Spark's thread) now refuses every write
    assert deliver([{"n": 2}]) is False
    assert record.id in runtime.detached and windows.booking(record.id) is None
    events = buf.read(0, timeout=0)
    assert [e.kind for e in events] == ["revoked"]  # the unread row was withheld
    r = svc.get(record.id)
    assert r.state is HandleState.REVOKED and r.reason == "policy deleted"
    # terminal states never change again
    assert svc.revoke(record.id, "again") is False
    assert svc.release(record.id, "lta").state is HandleState.REVOKED
    assert svc.store.finish(record.id, HandleState.ENDED, "x") is False
    # the window is free again: a new request gets a new handle
    again, new = open_(svc, p=plan(threshold=50))
    assert new and again.id != record.id


def test_revocation_races_with_delivery(env):
    """Writers hammer the callback while the handle is revoked: nothing is stored after."""
    svc, runtime, *_ = env
    record, _ = open_(svc)
    deliver = runtime.attached[record.id][2]
    buf = svc.buffer(record.id)
    stop = threading.Event()
    accepted_after = []
    revoked = threading.Event()

    def writer():
        while not stop.is_set():
            started_after = revoked.is_set()
            ok = deliver([{"n": 1}])
            if started_after and ok:
                accepted_after.append(1)

    threads = [threading.Thread(target=writer) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    svc.revoke(record.id, "r")
    revoked.set()
    time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    assert accepted_after == []
    assert buf.read(0, timeout=0)[-1].kind == "revoked" and len(buf) == 0


def test_release(env):
    svc, runtime, windows, *_ = env
    record, _ = open_(svc)
    buf = svc.buffer(record.id)
    out = svc.release(record.id, "lta")
    assert out.state is HandleState.RELEASED and svc.buffer(record.id) is None
    assert [e.kind for e in buf.read(0, timeout=0)] == ["released"]
    assert windows.booking(record.id) is None


def test_stale_epoch_is_refused(env):
    svc, runtime, windows, *_ = env
    epoch = svc.policy_epoch
    svc.policy_epoch += 1
    with pytest.raises(StalePolicies):
        open_(svc, epoch=epoch)
    assert not runtime.attached and len(windows) == 0 and svc.live() == []


def test_runtime_failure_ends_handle_and_frees_window(env):
    svc, runtime, windows, *_ = env
    runtime.fail = True
    with pytest.raises((NotFound, Unavailable)) as e:
        open_(svc)
    assert isinstance(e.value, Unavailable)
    (r,) = svc.list_for("lta")
    assert r.state is HandleState.ENDED and "runtime" in r.reason and len(windows) == 0


@pytest.mark.parametrize("failing", ["for_subject", "insert"])
def test_a_store_that_fails_while_a_handle_opens_leaves_no_handle_and_no_window(env, monkeypatch,
                                                                                 failing):
    """Each store call of an opening may fail (a PostgreSQL store lost: StoreUnavailable): then
    nothing is granted, nothing attached, and the subject's window is free for its next try."""
    from common.db import StoreUnavailable

    svc, runtime, windows, catalog, _ = env
    svc.stream_position = catalog.position  # as the gateway's has: an opening reads earlier ones

    def lost(*args, **kwargs):
        raise StoreUnavailable("the store cannot be reached, nothing was changed: lost")

    monkeypatch.setattr(svc.store, failing, lost)
    with pytest.raises(StoreUnavailable):
        open_(svc)
    monkeypatch.undo()
    assert not runtime.attached and len(windows) == 0 and svc.list_for("lta") == []
    record, new = open_(svc)
    assert new and record.live and record.id in runtime.attached


def test_unknown_stream(env):
    svc, *_ = env
    with pytest.raises((NotFound, Unavailable)) as e:
        open_(svc, p=plan(stream="nope"))
    assert isinstance(e.value, NotFound)


def test_plan_round_trips_through_json(env):
    p = plan()
    assert plan_from_json(p.canonical_json()) == p
    assert plan_from_json(p.canonical_json()).key() == p.key()


def test_restart_resumes_with_new_generation(env):
    svc, runtime, windows, catalog, tmp_path = env
    record, _ = open_(svc)
    svc.shutdown()  # process exit: readers told, handle stays live
    assert svc.get(record.id).live
    store2 = HandleStore(svc.storage.database("handles"))
    runtime2 = RecordingRuntime()
    windows2 = WindowRegistry(new_handle_id=new_handle_id)
    svc2 = HandleService(store2, catalog.get, runtime2, windows2)
    (live,) = svc2.live()
    assert live.id == record.id
    assert svc2.resume(live, ("p1", "p2"))
    assert record.id in runtime2.attached and windows2.booking(record.id).plan_key == live.plan_key
    assert runtime2.attached[record.id][1] == plan()
    assert svc2.get(record.id).policy_ids == ("p1", "p2")
    runtime2.push(record.id, [{"n": 1}])
    ev = svc2.buffer(record.id).read(5, timeout=0)  # an id from before the restart
    assert ev[0].kind == "gap" and ev[1].id > 5
    # the same subject asking again gets the resumed handle
    again, new = svc2.open("lta", ("consumer",), False, plan(), {"p1"}, REQ)
    assert not new and again.id == record.id
    store2.close()


def test_resume_ends_handle_whose_stream_is_gone(env):
    svc, runtime, windows, catalog, tmp_path = env
    record, _ = open_(svc)
    svc2 = HandleService(svc.store, lambda name: None, RecordingRuntime(), WindowRegistry())
    assert svc2.resume(svc2.get(record.id)) is False
    r = svc2.get(record.id)
    assert r.state is HandleState.ENDED and "stream" in r.reason


def test_the_handles_of_a_deleted_stream_are_buried_on_either_store(env):
    """`bury` (a deleted stream's handles are nobody's to see) in the SQL both stores read."""
    svc, *_ = env
    record, _ = open_(svc)
    store = svc.store
    assert store.on_stream("WEATHER") == [record.id] and store.on_stream("other") == []
    store.bury([record.id], "weather")
    store.bury([record.id], "weather")  # again: kept once
    assert store.buried(record.id) and store.for_subject("lta") == []
    store.unbury([record.id])
    assert not store.buried(record.id)
    assert [r.id for r in store.for_subject("lta")] == [record.id]
