"""Plan lanes' names and keys (`pep.delivery.lanes`): what the gateway writes and the edges
parse must agree, and a destination or key without a lane must read as a topic of one plan."""
from __future__ import annotations

import pytest

from pep.config.model import GatewayConfig
from pep.delivery.lanes import (
    destination,
    kafka_topic,
    kafka_topics,
    lane_key,
    lane_of,
    new_lane,
    split_key,
    split_lane,
)
from pep.delivery.settings import DeliverySettings

PLAIN = {"delivery_security_protocol": "PLAINTEXT"}


@pytest.mark.timeout(10)
def test_a_destination_names_its_topic_and_lane_and_reads_back():
    lane = new_lane()
    assert len(lane) == 8 and lane != new_lane()
    dest = destination("xsg.plan.abc", lane)
    assert dest == f"xsg.plan.abc#{lane}"
    assert (kafka_topic(dest), lane_of(dest)) == ("xsg.plan.abc", lane)
    # a topic of one plan: no lane
    assert destination("xsg.plan.abc", "") == "xsg.plan.abc"
    assert (kafka_topic("xsg.plan.abc"), lane_of("xsg.plan.abc")) == ("xsg.plan.abc", "")
    assert kafka_topics([dest, "xsg.plan.abc#x", "xsg.plan.d"]) == ["xsg.plan.abc",
                                                                      "xsg.plan.d"]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("key", [b"m:e1:3:7", b"r:e1:src.t/2/99", b"c:e1:b4"])
def test_a_lane_s_key_splits_back_into_lane_and_key(key):
    assert split_key(lane_key("a1b2c3d4", key)) == ("a1b2c3d4", key)
    assert split_key(lane_key("", key)) == ("", key)  # a topic of one plan: the key as is
    assert split_lane(lane_key("a1b2c3d4", key)) == (b"a1b2c3d4", key)  # the edge's form
    assert split_lane(key) == (b"", key)


@pytest.mark.timeout(10)
def test_keys_of_the_whole_topic_carry_no_lane():
    assert split_key(b"w:") == ("", b"w:")
    assert split_key(b"f:0011") == ("", b"f:0011")
    assert split_key(None) == ("", None)


@pytest.mark.timeout(10)
def test_plans_per_topic_is_a_setting_with_bounds():
    assert DeliverySettings.of(GatewayConfig(delivery="kafka", delivery_brokers="b:9092", **PLAIN,
                                             store="postgresql://x@h/db")).plans_per_topic == 64
    made = GatewayConfig(delivery="kafka", delivery_brokers="b:9092", **PLAIN,
                         store="postgresql://x@h/db", delivery_plans_per_topic=1)
    assert DeliverySettings.of(made).plans_per_topic == 1
    with pytest.raises(ValueError, match="delivery_plans_per_topic"):
        GatewayConfig(delivery="kafka", delivery_brokers="b:9092", **PLAIN, store="postgresql://x@h/db",
                      delivery_plans_per_topic=0)
