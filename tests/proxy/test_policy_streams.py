"""A policy change drops only the cached answers of the streams it concerns (issue 26).

The gateway's policy events carry the streams a change can alter (the policy's target scope
before and after it); the proxy drops the answers on those streams and keeps the others. A
policy whose target cannot be narrowed to streams, or an event that does not say, flushes all.
The end-to-end test runs the real gateway (its PDP, handles, hub; Spark's runtime replaced) on
its HTTP server, with the real proxy in front of it, webhooks and feed included.
"""
from __future__ import annotations

import pytest
import requests
from hypothesis import given, settings, strategies as st

from common.invalidation import InvalidationEvent, InvalidEventError
from pdp.events import PolicyChange, PolicyEvents
from pep.invalidation.hub import InvalidationHub
from proxy.app import ProxyConfig, answer_streams, create_app, runtime_of
from proxy.cache import CachedAnswer, HandleCache
from proxy.canonical import canonical_request, resource_ids
from proxy.feed import wait_live
from proxy.sync import CacheSync
from server.serving import HttpServer
from tests.pep.conftest import RecordingRuntime, auth_header, build_gateway
from tests.pep.handles.test_revocation_at_scale import SCHEMA, policy, request
from tests.proxy.conftest import _LateApp

S = "http://www.w3.org/2001/XMLSchema#string"
XML = {"Content-Type": "application/xacml+xml"}


def on(handle: str, *streams: str, unknown: bool = False) -> CachedAnswer:
    return CachedAnswer(handle, 201, b"{}", "application/json",
                        streams=None if unknown else frozenset(streams))


# -- the cache -------------------------------------------------------------------------------


def test_invalidate_streams_drops_its_streams_and_the_unknown_ones_only():
    cache = HandleCache(10, 60)
    for key, answer in (("a", on("h1", "A")), ("b", on("h2", "B")), ("ab", on("h3", "A", "B")),
                        ("u", on("h4", unknown=True))):
        assert cache.put(key, answer, cache.generation())
    assert cache.invalidate_streams(["B"]) == 3  # b, the join on A and B, the unknown one
    assert cache.get("a").handle_id == "h1" and len(cache) == 1
    assert cache.invalidate_streams(["C"]) == 0 and len(cache) == 1
    assert cache.invalidate_streams(["A"]) == 1 and len(cache) == 0
    assert cache.stats()["stream_invalidations"] == 4 and cache.stats()["flushes"] == 0
    # the stream index forgets removed entries: a re-insert is indexed afresh
    assert cache.put("a", on("h1", "A"), cache.generation())
    cache.invalidate_handles(["h1"])
    assert cache.invalidate_streams(["A"]) == 0


def test_an_answer_in_flight_during_a_change_on_its_stream_is_not_stored():
    cache = HandleCache(10, 60)
    generation = cache.generation()
    cache.invalidate_streams(["B"])
    assert cache.put("a", on("h1", "A"), generation)  # another stream's change: stored
    generation = cache.generation()
    cache.invalidate_streams(["A"])
    assert not cache.put("a2", on("h2", "A"), generation)
    assert not cache.put("u", on("h3", unknown=True), generation)  # streams unknown: refused


STREAMS_OF = {0: frozenset({"A"}), 1: frozenset({"B"}), 2: frozenset({"A", "B"}), 3: None}
stream_ops = st.lists(st.tuples(st.sampled_from(["begin", "end", "change", "flush", "get"]),
                                st.integers(0, 3)), max_size=40)


@settings(max_examples=500, deadline=None)
@given(stream_ops)
def test_no_interleaving_serves_an_answer_its_streams_policy_change_overtook(sequence):
    """Model check: request slot i begins (snapshot) and later ends (puts key i%2, on the
    streams STREAMS_OF[i%4]; 3: not known). A served answer is wrong when a change on one of
    its streams (any change, for unknown streams), or a flush, came after its slot began."""
    cache = HandleCache(4, 60)
    began: dict[int, tuple[int, int]] = {}
    history: list[tuple[int, frozenset | None]] = []  # (step, streams changed; None: flush)
    for step, (op, n) in enumerate(sequence):
        if op == "begin":
            began[n] = (cache.generation(), step)
        elif op == "end" and n in began:
            gen, start = began.pop(n)
            streams = STREAMS_OF[n % 4]
            cache.put(f"k{n % 2}", CachedAnswer(f"h{n}", 201, f"{start}".encode(), "a/j",
                                                 streams=streams), gen)
        elif op == "change":
            changed = frozenset({("A", "B", "C")[n]}) if n < 3 else frozenset({"A", "B"})
            cache.invalidate_streams(changed)
            history.append((step, changed))
        elif op == "flush":
            cache.flush()
            history.append((step, None))
        elif op == "get":
            got = cache.get(f"k{n % 2}")
            if got is None:
                continue
            start = int(got.body)
            for when, changed in history:
                if when <= start:
                    continue
                assert changed is not None and got.streams is not None \
                    and changed.isdisjoint(got.streams), (sequence, got)


# -- the protocol, the hub and the sequencer ---------------------------------------------------


def test_policy_changed_events_carry_their_streams_or_null():
    doc = {"id": 1, "epoch": "e", "kind": "policy-changed", "streams": ["a", "b"]}
    assert InvalidationEvent.from_json(doc).streams == ("a", "b")
    assert InvalidationEvent.from_json({**doc, "streams": None}).streams is None
    older = {k: v for k, v in doc.items() if k != "streams"}  # a gateway that does not say
    assert InvalidationEvent.from_json(older).streams is None
    assert InvalidationEvent.from_json({**doc, "streams": []}).streams == ()
    for bad in ("a", [""], [1], {"a": 1}):
        with pytest.raises(InvalidEventError, match="event.streams"):
            InvalidationEvent.from_json({**doc, "streams": bad})
    event = InvalidationEvent.from_json(doc)
    assert InvalidationEvent.from_json(event.to_json()) == event


def test_the_hub_publishes_the_scope_of_a_policy_change():
    events, hub = PolicyEvents(), InvalidationHub()
    hub.follow_policy_events(events)
    events.emit(PolicyChange("added", "p1", "1", "nea", resources=frozenset({"b", "a"})))
    events.emit(PolicyChange("updated", "p2", "1", "nea", resources=None))
    got, _ = hub.events_after(0)
    assert [(e.policy_id, e.streams) for e in got] == [("p1", ("a", "b")), ("p2", None)]
    assert got[1].to_json()["streams"] is None


def test_the_sequencer_drops_by_stream_and_flushes_without_streams():
    sync = CacheSync(HandleCache(10, 60))
    sync.feed_hello("e", 0, resumed=False)
    generation = sync.cache.generation()
    assert sync.cache.put("a", on("h1", "A"), generation)
    assert sync.cache.put("b", on("h2", "B"), generation)
    sync.apply(InvalidationEvent(1, "e", "policy-changed", streams=("B",)), "feed")
    assert sync.cache.handles() == {"h1"}
    assert sync.cache.put("b", on("h2", "B"), sync.cache.generation())
    sync.apply(InvalidationEvent(2, "e", "policy-changed"), "feed")  # streams unknown
    assert len(sync.cache) == 0


def test_the_streams_of_an_answer():
    canon = canonical_request(request("weather"), "application/xacml+xml")
    assert resource_ids(canon) == {"weather"}
    assert answer_streams({"stream": "a", "streams": ["a", "b"]}, frozenset({"a"})) == {"a", "b"}
    assert answer_streams({"stream": "a"}, frozenset()) == {"a"}
    # an answer that names no stream concerns any: deny when in doubt
    assert answer_streams({"handle": "x"}, frozenset({"a"})) is None
    assert answer_streams({"streams": [1]}, frozenset({"a"})) is None


# -- end to end: the real gateway, the real proxy ---------------------------------------------

SECRET, PROXY_TOKEN = "stream-scope-secret", "stream-scope-proxy-token"


def unconfined(policy_id: str) -> bytes:
    """A policy whose target names no resource: it may concern any stream."""
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="{policy_id}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-overrides">
      <Target/><Rule RuleId="r" Effect="Deny"><Target><AnyOf><AllOf>
        <Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
        <AttributeValue DataType="{S}">nobody</AttributeValue><AttributeDesignator
          Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject"
          AttributeId="urn:oasis:names:tc:xacml:1.0:subject:subject-id" DataType="{S}"
          MustBePresent="false"/></Match></AllOf></AnyOf></Target></Rule>
    </Policy>""".encode()


@pytest.fixture
def stack(tmp_path):
    hub = InvalidationHub(secret=SECRET, proxy_token=PROXY_TOKEN, heartbeat=0.2)
    app, services = build_gateway(tmp_path / "data", RecordingRuntime(), invalidation=hub)
    gateway = HttpServer(app, name="gateway", threads=8).start()
    late = _LateApp()
    server = HttpServer(late, name="proxy", threads=8).start()
    late.app = create_app(ProxyConfig(
        upstream=gateway.url, feed_token=PROXY_TOKEN, webhook_secret=SECRET,
        webhook_url=server.url + "/proxy/invalidate", feed_read_timeout=0.8,
        feed_backoff=(0.05, 0.2)))
    runtime = runtime_of(late.app)
    try:
        assert wait_live(runtime.sync, 10), runtime.stats()
        admin = {**auth_header("nea"), **XML}
        for name in ("sa", "sb"):
            r = requests.post(gateway.url + "/streams", headers=auth_header("nea"), timeout=10,
                              json={"name": name, "schema": SCHEMA, "time_attribute": "t"})
            assert r.status_code == 201, r.text
            r = requests.post(gateway.url + "/policies", data=policy(f"urn:t:{name}", name),
                              headers=admin, timeout=10)
            assert r.status_code == 201, r.text
        yield gateway.url, server.url, runtime, admin
    finally:
        runtime.close()
        server.stop()
        gateway.stop()
        services.close()


def ask(proxy_url: str, stream: str) -> requests.Response:
    return requests.post(proxy_url + "/requests", data=request(stream), timeout=10,
                         headers=auth_header("lta", **XML))


def test_a_policy_change_drops_only_the_answers_of_its_streams(stack):
    gateway, proxy, runtime, admin = stack
    flushes = runtime.cache.stats()["flushes"]  # the feed's hello flushed (an empty cache)
    first = {s: ask(proxy, s) for s in ("sa", "sb")}
    assert all(r.status_code == 201 and r.headers["X-XSG-Cache"] == "miss"
               for r in first.values()), [r.text for r in first.values()]
    assert ask(proxy, "sa").headers["X-XSG-Cache"] == "hit"
    # a new policy on sb, written at the gateway directly: only the hub tells the proxy, and
    # it has told it when the call returns
    r = requests.post(gateway + "/policies", data=policy("urn:t:more-b", "sb"), headers=admin,
                      timeout=10)
    assert r.status_code == 201, r.text
    assert ask(proxy, "sa").headers["X-XSG-Cache"] == "hit"  # sa's answer survived
    again = ask(proxy, "sb")
    assert again.headers["X-XSG-Cache"] == "miss"  # sb's was dropped
    assert again.json()["id"] == first["sb"].json()["id"]  # the handle lives: same answer
    # a change on sa drops sa's answer, and keeps sb's
    r = requests.post(gateway + "/policies", data=policy("urn:t:more-a", "sa"), headers=admin,
                      timeout=10)
    assert r.status_code == 201, r.text
    assert ask(proxy, "sb").headers["X-XSG-Cache"] == "hit"
    assert ask(proxy, "sa").headers["X-XSG-Cache"] == "miss"
    stats = runtime.cache.stats()
    assert stats["flushes"] == flushes and stats["stream_invalidations"] == 2
    assert stats["size"] == 2
    # a policy whose target names no stream may concern any: everything goes
    r = requests.post(gateway + "/policies", data=unconfined("urn:t:everywhere"), headers=admin,
                      timeout=10)
    assert r.status_code == 201, r.text
    assert len(runtime.cache) == 0 and runtime.cache.stats()["flushes"] == flushes + 1
    assert ask(proxy, "sa").headers["X-XSG-Cache"] == "miss"


def test_policies_written_through_the_proxy_drop_what_they_concern(stack):
    gateway, proxy, runtime, admin = stack
    assert ask(proxy, "sa").status_code == 201 and ask(proxy, "sb").status_code == 201
    r = requests.post(proxy + "/policies", data=policy("urn:t:via-proxy", "sb"), headers=admin,
                      timeout=10)
    assert r.status_code == 201, r.text
    assert ask(proxy, "sa").headers["X-XSG-Cache"] == "hit"
    assert ask(proxy, "sb").headers["X-XSG-Cache"] == "miss"
    # a deletion: the proxy alone cannot tell what the deleted policy covered, the gateway can
    r = requests.delete(proxy + "/policies/urn:t:via-proxy", headers=auth_header("nea"),
                        timeout=10)
    assert r.status_code == 204, r.text
    assert len(runtime.cache) == 0  # the proxy's own shortcut flushes on what it cannot scope
