"""HandleCache: LRU, TTL, statistics, and the insert rule that keeps revoked handles out."""
from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from proxy.cache import CachedAnswer, HandleCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def answer(handle: str, tag: str = "") -> CachedAnswer:
    return CachedAnswer(handle, 201, f'{{"handle": "h/{handle}", "tag": "{tag}"}}'.encode(),
                        "application/json")


def test_hit_miss_and_stats():
    cache = HandleCache(10, 60)
    assert cache.get("k") is None
    assert cache.put("k", answer("h1"), cache.generation())
    assert cache.get("k").handle_id == "h1"
    s = cache.stats()
    assert (s["hits"], s["misses"], s["inserts"], s["size"]) == (1, 1, 1, 1)
    assert s["hit_ratio"] == 0.5


def test_lru_evicts_the_least_recently_used():
    cache = HandleCache(3, 60)
    for k in "abc":
        cache.put(k, answer("h" + k), cache.generation())
    cache.get("a")  # a is now the most recent; b is the oldest
    cache.put("d", answer("hd"), cache.generation())
    assert "b" not in cache and all(k in cache for k in "acd")
    assert cache.stats()["evictions"] == 1
    assert "hb" not in cache.handles()


def test_ttl_expires_entries():
    clock = Clock()
    cache = HandleCache(10, ttl=5, clock=clock)
    cache.put("k", answer("h"), cache.generation())
    clock.now += 4.9
    assert cache.get("k") is not None
    clock.now += 0.2
    assert cache.get("k") is None
    assert cache.stats()["expirations"] == 1 and len(cache) == 0


def test_invalidation_drops_every_key_of_the_handle():
    cache = HandleCache(10, 60)
    g = cache.generation()
    cache.put("k1", answer("h"), g)
    cache.put("k2", answer("h"), g)  # same handle reached by two tokens
    cache.put("k3", answer("other"), g)
    assert cache.invalidate_handles(["h"]) == 2
    assert "k1" not in cache and "k2" not in cache and "k3" in cache
    assert cache.stats()["invalidations"] == 2


def test_in_flight_answer_for_a_revoked_handle_is_refused():
    cache = HandleCache(10, 60)
    g = cache.generation()  # request leaves for the gateway
    cache.invalidate_handles(["h"])  # meanwhile h is revoked
    assert not cache.put("k", answer("h"), g)
    assert cache.get("k") is None
    assert cache.stats()["rejected_inserts"] == 1
    # An unrelated revocation does not cost the answer its place.
    g = cache.generation()
    cache.invalidate_handles(["x"])
    assert cache.put("k", answer("h"), g)


def test_flush_and_disable_refuse_in_flight_answers():
    cache = HandleCache(10, 60)
    g = cache.generation()
    cache.flush()
    assert not cache.put("k", answer("h"), g)
    cache.set_enabled(False)
    assert not cache.put("k", answer("h"), cache.generation())
    assert cache.get("k") is None
    cache.set_enabled(True)
    assert cache.put("k", answer("h"), cache.generation())


def test_snapshot_older_than_the_history_is_refused():
    cache = HandleCache(10, 60)
    g = cache.generation()
    for i in range(600):
        cache.invalidate_handles([f"x{i}"])
    assert not cache.put("k", answer("h"), g)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        HandleCache(0, 60)
    with pytest.raises(ValueError):
        HandleCache(10, 0)


# -- interleavings ---------------------------------------------------------------------------

ops = st.lists(st.one_of(
    st.tuples(st.just("begin"), st.integers(0, 5)),
    st.tuples(st.just("end"), st.integers(0, 5)),
    st.tuples(st.just("revoke"), st.integers(0, 3)),
    st.tuples(st.just("flush"), st.just(0)),
    st.tuples(st.just("get"), st.integers(0, 2)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_no_interleaving_serves_a_handle_revoked_after_its_request_began(sequence):
    """Model check: request slot i begins (snapshot), later ends (put key i%3 -> handle i%4).

    A served answer of slot i is wrong when its handle was revoked, or the cache flushed,
    after slot i began and before the lookup.
    """
    cache = HandleCache(4, 60)
    began: dict[int, tuple[int, int]] = {}  # slot -> (generation, step)
    history: list[tuple[int, str | None]] = []  # (step, handle revoked or None for flush)
    for step, (op, n) in enumerate(sequence):
        if op == "begin":
            began[n] = (cache.generation(), step)
        elif op == "end" and n in began:
            gen, start = began.pop(n)
            cache.put(f"k{n % 3}", answer(f"h{n % 4}", f"{n}:{start}"), gen)
        elif op == "revoke":
            cache.invalidate_handles([f"h{n}"])
            history.append((step, f"h{n}"))
        elif op == "flush":
            cache.flush()
            history.append((step, None))
        elif op == "get":
            got = cache.get(f"k{n}")
            if got is None:
                continue
            slot, start = (int(x) for x in got.body.decode().split('"tag": "')[1][:-2].split(":"))
            for when, handle in history:
                assert not (when > start and handle in (None, got.handle_id)), (sequence, got)


def test_threaded_stress_never_serves_a_revoked_handle():
    """Readers, in-flight writers and revokers race for about a second; every hit is checked.

    The gateway is modelled as live handles per key. A revoker marks a handle dead (as the
    gateway does first), then invalidates, then records that the invalidation returned. A
    reader that finds a handle whose invalidation returned before the lookup began fails.
    """
    cache = HandleCache(50, 60)
    gw_lock = threading.Lock()
    live: dict[str, str] = {}  # key -> live handle
    dead: set[str] = set()
    returned: set[str] = set()
    violations: list[str] = []
    counter = [0]
    hits = [0]
    stop = time.monotonic() + 1.0
    keys = [f"k{i}" for i in range(8)]

    def gateway_answer(key: str) -> str:
        with gw_lock:
            handle = live.get(key)
            if handle is None or handle in dead:
                counter[0] += 1
                handle = live[key] = f"h{counter[0]}"
            return handle

    def reader(seed: int) -> None:
        rnd = random.Random(seed)
        while time.monotonic() < stop:
            key = rnd.choice(keys)
            with gw_lock:
                already = set(returned)
            got = cache.get(key)
            if got is not None:
                hits[0] += 1
                if got.handle_id in already:
                    violations.append(f"{key} served revoked {got.handle_id}")
                continue
            gen = cache.generation()
            handle = gateway_answer(key)
            if rnd.random() < 0.5:
                time.sleep(rnd.random() / 2000)  # widen the in-flight window
            cache.put(key, answer(handle), gen)

    def revoker(seed: int) -> None:
        rnd = random.Random(seed)
        while time.monotonic() < stop:
            with gw_lock:
                candidates = [h for h in live.values() if h not in dead]
                if not candidates:
                    victim = None
                else:
                    victim = rnd.choice(candidates)
                    dead.add(victim)
            if victim is not None:
                if rnd.random() < 0.05:
                    cache.flush()
                else:
                    cache.invalidate_handles([victim])
                with gw_lock:
                    returned.add(victim)
            time.sleep(rnd.random() / 1000)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=revoker, args=(100 + i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not violations, violations[:5]
    assert hits[0] > 20 and len(returned) > 10  # the race really ran both ways
    assert cache.stats()["rejected_inserts"] >= 0
