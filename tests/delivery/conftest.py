"""Delivery through plan topics: the session's broker (tests/kafka) and its producer."""
from tests.kafka.conftest import kafka_broker, kafka_topic, producer  # noqa: F401
