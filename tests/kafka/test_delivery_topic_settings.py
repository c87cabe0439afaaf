"""Delivery topics that exist before the gateway starts get the settings it creates topics with
(issue 45, `pep.delivery.control.align_topics`): a topic made by an older xsg, or under another
retention, kept Kafka's 1 GiB / 7-day segments (rows kept for a week whatever the retention
said) and 4 KiB index intervals. Only the keys the gateway sets change; a key an operator set
stays."""
from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from pep.delivery.settings import DeliverySettings

pytestmark = pytest.mark.timeout(120)
OPERATOR_KEY = ("max.message.bytes", "2000000")  # not one of the gateway's keys


def _configs(admin: AdminClient, topics: list[str]) -> dict[str, dict[str, str]]:
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t)
                                        for t in topics])
    return {r.name: {k: e.value for k, e in f.result(30).items()} for r, f in described.items()}


def _known(admin: AdminClient, topics: list[str], timeout: float = 30.0) -> None:
    """Until the broker describes these new topics (it learns them from the controller a
    moment after the creation is acknowledged)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _configs(admin, topics)
            return
        except KafkaException:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def _in_line(admin: AdminClient, topics: list[str], wanted: dict[str, str],
             timeout: float = 30.0) -> dict[str, dict[str, str]]:
    """The topics' configs once the broker describes `wanted` for each (it applies an altered
    config from the cluster's metadata a moment after the controller acknowledged it: 1,000
    topics described right after their alter still had their old settings), or as they are
    after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        got = _configs(admin, topics)
        if all({k: got[t][k] for k in wanted} == wanted for t in topics) \
                or time.monotonic() >= deadline:
            return got
        time.sleep(0.1)


def _made_before(admin: AdminClient, topics: list[str], config: dict[str, str]) -> None:
    """Topics as an older xsg (or an operator) left them: not the gateway's settings."""
    for future in admin.create_topics([NewTopic(t, 1, 1, config=config) for t in topics],
                                      request_timeout=30).values():
        future.result(30)
    _known(admin, topics)


def _prefix(tag: str) -> str:
    return f"{tag}{int(time.time() * 1000) % 10**8}."


def test_a_gateway_gives_existing_delivery_topics_its_settings_at_start(
        kafka_broker, postgres, tmp_path, caplog):
    from common.db import open_storage
    from pep.delivery.store import DeliveryStore
    from pep.delivery.topics import PlanTopics
    from pep.handles.records import HandleRecord, HandleStore, StoredRequest

    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT",
                                prefix=_prefix("a"), retention_seconds=3600,
                                retention_bytes=64 * 1024 * 1024)
    plan, gone = settings.plan_prefix + "old", settings.plan_prefix + "gone"
    control = [settings.control_topic, settings.acks_topic]
    # the control topics with Kafka's defaults; the plan topic with another retention and a
    # key of the operator's
    _made_before(admin, control, {})
    _made_before(admin, [plan], {"retention.ms": str(7 * 24 * 3600 * 1000),
                                 OPERATOR_KEY[0]: OPERATOR_KEY[1]})
    before = _configs(admin, [*control, plan])
    assert before[plan]["segment.bytes"] == str(1 << 30)  # Kafka's: never rolls in time
    assert before[settings.control_topic]["index.interval.bytes"] == "4096"

    storage = open_storage(tmp_path, postgres.new_url(), pool_size=4)
    handles = HandleStore(storage.database("handles"))
    store = DeliveryStore(storage.database("delivery"))
    # live handles read the plan topic, and a topic the store lists that someone deleted
    for hid, topic in (("h1", plan), ("h2", gone)):
        handles.insert(HandleRecord(hid, "lta", (), False, "s", "{}", "k", (),
                                    StoredRequest(b"<Request/>", "application/xacml+xml")))
        store.add_topic(topic, "s", hid)
        store.bind(hid, topic, 0)

    def start() -> list[logging.LogRecord]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pep.delivery"):
            PlanTopics(settings, store, handle=lambda h: None, eligible=lambda r: False).close()
        # the gateway's own lines (not its Kafka clients' log, `pep.delivery.kafka`)
        return [r for r in caplog.records if r.name in ("pep.delivery.topics",
                                                        "pep.delivery.control")]

    try:
        logged = start()
        wanted = settings.topic_config()
        after = _in_line(admin, [*control, plan], wanted)
        for topic in (*control, plan):
            assert {k: after[topic][k] for k in wanted} == wanted, topic
        assert after[plan][OPERATOR_KEY[0]] == OPERATOR_KEY[1]  # the operator's key stays
        assert [(r.levelname, r.getMessage()) for r in logged] == [
            ("INFO", "delivery topics: 3 existing topic(s) given this gateway's settings "
                     "(retention, segments, index interval; other keys kept)")]
        # the next start finds them in line: nothing altered, nothing logged
        assert start() == []
    finally:
        storage.close()


def test_topics_are_aligned_a_batch_per_request_and_only_where_they_differ(kafka_broker):
    from pep.delivery.control import align_topics

    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    settings = DeliverySettings(kafka_broker.bootstrap, security_protocol="PLAINTEXT",
                                prefix=_prefix("b"), retention_seconds=600)
    topics = [settings.plan_prefix + f"t{i}" for i in range(5)]
    _made_before(admin, topics[:4], {OPERATOR_KEY[0]: OPERATOR_KEY[1]})
    _made_before(admin, topics[4:], settings.topic_config())  # already in line
    done = align_topics(admin, settings, topics, batch=2)
    assert (done.altered, done.left, done.error) == (4, 0, None)
    after = _in_line(admin, topics, settings.topic_config())
    assert all({k: after[t][k] for k in settings.topic_config()} == settings.topic_config()
               for t in topics)
    assert all(after[t][OPERATOR_KEY[0]] == OPERATOR_KEY[1] for t in topics[:4])


def test_brokers_that_do_not_answer_leave_the_topics_for_the_next_start():
    """Nothing listens on the port: the alignment gives up within its bound and says how many
    topics it left and why (the gateway logs it as one WARNING and starts)."""
    from pep.delivery.control import align_topics
    from tests.kafka.broker import free_port

    address = f"127.0.0.1:{free_port()}"
    settings = DeliverySettings(address, security_protocol="PLAINTEXT", prefix="away.")
    admin = AdminClient({"bootstrap.servers": address, "log_level": 0})
    began = time.monotonic()
    done = align_topics(admin, settings, ["away.control", "away.acks", "away.plan.p"],
                        timeout=2.0)
    assert time.monotonic() - began < 6.0
    assert (done.altered, done.left) == (0, 3)
    assert done.error
