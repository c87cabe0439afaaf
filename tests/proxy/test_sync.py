"""CacheSync: event sequencing across the two channels, feed loss, and missing webhooks."""
from __future__ import annotations

from common.invalidation import InvalidationEvent
from proxy.cache import CachedAnswer, HandleCache
from proxy.sync import CacheSync


def ev(ident: int, kind: str = "handle-revoked", handles=("h1",), epoch: str = "e1"):
    return InvalidationEvent(ident, epoch, kind, tuple(handles))


def filled(sync: CacheSync, *handles: str) -> None:
    for h in handles:
        assert sync.cache.put(f"k-{h}", CachedAnswer(h, 201, b"{}", "application/json"),
                              sync.cache.generation())


def live_sync(**kw) -> CacheSync:
    sync = CacheSync(HandleCache(100, 60), **kw)
    assert not sync.cache.enabled  # nothing is served before the feed said hello
    sync.feed_hello("e1", 4, resumed=False)
    assert sync.cache.enabled and sync.position == "e1.4"
    return sync


def test_next_event_drops_only_its_handles_and_duplicates_are_ignored():
    sync = live_sync()
    filled(sync, "h1", "h2")
    assert sync.apply(ev(5), "webhook") == "applied"
    assert sync.cache.handles() == {"h2"}
    assert sync.apply(ev(5), "feed") == "duplicate"
    assert sync.apply(ev(6, "policy-changed", ()), "feed") == "applied"
    assert len(sync.cache) == 0


def test_gap_or_new_epoch_flushes_everything():
    sync = live_sync()
    filled(sync, "h1", "h2")
    assert sync.apply(ev(7, handles=("zz",)), "webhook") == "flushed"  # 5 and 6 were missed
    assert len(sync.cache) == 0 and sync.position == "e1.7"
    filled(sync, "h3")
    assert sync.apply(ev(1, handles=("zz",), epoch="e2"), "feed") == "flushed"  # restart
    assert len(sync.cache) == 0 and sync.position == "e2.1"
    assert sync.stats()["gaps"] == 2


def test_lost_feed_turns_the_cache_off_until_hello():
    sync = live_sync()
    filled(sync, "h1")
    sync.feed_lost("read timeout")
    assert not sync.cache.enabled and len(sync.cache) == 0
    assert sync.stats()["state"] == "down" and sync.stats()["last_error"] == "read timeout"
    sync.feed_hello("e1", 4, resumed=True)
    assert sync.cache.enabled and sync.position == "e1.4"  # resumed: keeps its own position


def test_events_that_never_come_by_webhook_stop_the_cache():
    now = [100.0]
    sync = live_sync(expect_webhooks=True, webhook_grace=2.0, clock=lambda: now[0])
    sync.apply(ev(5), "feed")
    sync.apply(ev(5), "webhook")  # confirmed
    sync.apply(ev(6), "feed")
    now[0] += 1.0
    sync.check_webhooks()
    assert sync.cache.enabled  # still within the grace period
    now[0] += 1.5
    sync.check_webhooks()
    assert not sync.cache.enabled and sync.stats()["webhook_channel"] == "missing"
    sync.apply(ev(7), "webhook")  # the channel works again
    assert sync.cache.enabled and sync.stats()["webhook_channel"] == "ok"


def test_without_a_feed_requirement_the_cache_is_on():
    sync = CacheSync(HandleCache(10, 60), require_feed=False)
    assert sync.cache.enabled and sync.stats()["state"] == "no-feed"


def test_failed_webhook_registration_keeps_the_cache_off():
    sync = CacheSync(HandleCache(10, 60), expect_webhooks=True)
    sync.feed_hello("e1", 0, resumed=False, webhook_registered=False)
    assert not sync.cache.enabled and sync.stats()["webhook_channel"] == "missing"
    sync.apply(ev(1), "webhook")  # the gateway reaches us after all
    assert sync.cache.enabled
