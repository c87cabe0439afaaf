"""A revocation pass tells the edges of its revocations once they are decided, before its
transaction (`PlanTopics.closing`, `RevocationService.add_closing_listener`); the
transaction's listener (`PlanTopics.ended`) then tells only what was not told: each ending
reaches the edges once. A real broker, a real edge's control listener, a real PostgreSQL
store."""
from __future__ import annotations

import time

import pytest

from pep.delivery.control import ControlListener, Revocation
from pep.delivery.settings import DeliverySettings
from pep.delivery.store import DeliveryStore
from pep.delivery.topics import PlanTopics
from pep.handles.records import HandleRecord, HandleState, HandleStore, StoredRequest


def ended(handle_id: str, state: HandleState, reason: str) -> HandleRecord:
    return HandleRecord(handle_id, "lta", ("consumer",), False, "s", "{}", "k", ("p1",),
                        StoredRequest(b"<Request/>", "application/xacml+xml"), state, reason)


@pytest.mark.timeout(120)
def test_a_pass_tells_the_edges_before_its_transaction_and_each_ending_once(
        kafka_broker, postgres, tmp_path):
    from common.db import open_storage

    storage = open_storage(tmp_path, postgres.new_url(), pool_size=4)
    HandleStore(storage.database("handles")).close()
    store = DeliveryStore(storage.database("delivery"))
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT",
                                prefix=f"cl{time.time_ns() % 10**9}.", ack_timeout=5.0)
    topics = PlanTopics(settings, store, handle=lambda h: None, eligible=lambda r: False)
    told: list[Revocation] = []
    edge = ControlListener(settings, "edge-1", told.append)
    store.register_edge("edge-1", settings.principal, "http://127.0.0.1:1", "h", 1)
    try:
        destination, _ = topics.topic_for("s", "plan")
        store.bind("h1", destination, 0)
        store.bind("h2", destination, 0)
        # the pass's revocations: the edge acknowledged before `closing` returned (h9 is no
        # handle of a plan topic: not published)
        topics.closing([("h1", "revoked", "policy deleted"), ("h9", "revoked", "x")])
        assert [(r.handles, r.state, r.reason) for r in told] == [
            (("h1",), "revoked", "policy deleted")]
        # the transaction's listener: h1 is not told again, h2 (released) is
        topics.ended([ended("h1", HandleState.REVOKED, "policy deleted"),
                      ended("h2", HandleState.RELEASED, "released by its owner")])
        assert [(r.handles, r.state) for r in told] == [(("h1",), "revoked"),
                                                        (("h2",), "released")]
        assert edge.acknowledged == 2
        # told once: a later ending of h1 (another pass's) is told again
        topics.ended([ended("h1", HandleState.REVOKED, "again")])
        assert [r.reason for r in told][-1] == "again"
    finally:
        edge.close()
        topics.close()
        storage.close()
