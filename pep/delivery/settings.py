"""What a process needs to reach the delivery topics: the brokers, its own identity there, the
topics' names and bounds (`DeliverySettings`, made from a `GatewayConfig`), in the two forms the
two clients read: librdkafka's (confluent-kafka: the gateway's driver, its admin client, the
edges) and the Java client's (Spark's Kafka sink on the workers, `kafka.`-prefixed options)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

CONTROL = "control"  # the control topic's name after the prefix: revocations, stream notices
ACKS = "acks"  # the edges' acknowledgements of control messages
PLAN = "plan."  # plan topics: <prefix>plan.<random id>
GROUP = "edge."  # consumer group ids (edges assign partitions; librdkafka wants a group id)
# The Spark sink's producer (`DeliverySettings.spark_options`; tests/bench/bench_sink_topics.py).
# The Java client takes a whole batch.size from its buffer for each partition it has records
# for, however few, and blocks a writing task when buffer.memory is spent until batches sent
# earlier are acknowledged: at 256 KiB against the default 32 MiB, a micro-batch's rows to
# 1,000 plan topics went out 128 topics at a time, in eight rounds of acknowledgements
# (1.2-2.8 s for 20,000 records, where 0.25-0.6 s with the settings below). 32 KiB in
# 128 MiB gives 4,000 topics a batch each at once; a stream with few plans writes bigger
# bursts per topic, where 32 KiB batches cost the write 7-17% against 256 KiB in two runs
# (1M records to 4 topics; the trials' ranges overlap), far from its bottleneck. With
# linger.ms 0 a batch leaves as soon as the producer can send it: no row waits for it to fill.
SINK_BATCH_BYTES = 32 * 1024
SINK_BUFFER_BYTES = 128 * 1024 * 1024
# the key of the record that makes a new plan topic known to Spark's producer before its first
# rows (`pep.runtime.delivery.warm`): no row, an edge skips it
WARM_KEY = b"w:"
# the key prefix of a fence record (`f:<id>`, `pep.delivery.topics.PlanTopics.fence`): written
# to a plan topic once the fence's DENY ACLs are in force, its value names the principals fenced
# (JSON `{"fenced": [...]}`); no row: an edge named ends the topic's readers there (a fetch
# parked before the ACL may still return what follows), another edge skips it
FENCE_KEY = b"f:"
# a delivery topic's segments (`DeliverySettings.topic_config`): a quarter of the retention
# each, in Kafka's bounds for segment.bytes (1 MiB to 1 GiB); an offset-index entry per MiB
SEGMENT_PARTS = 4
MIN_SEGMENT_BYTES = 1 << 20
MAX_SEGMENT_BYTES = 1 << 30
INDEX_INTERVAL_BYTES = 1 << 20
# the kind of a real-time batch's count marker (`c:<epoch>:<mark>`, written by the gateway after
# the batch, `pep.runtime.query.realtime_mode`): no row, an edge checks its holes with it
COUNT_KIND = "c"
JAAS_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


@dataclass(frozen=True)
class DeliverySettings:
    """One process's view of the delivery topics (the module docstring)."""

    brokers: str
    security_protocol: str = "SASL_PLAINTEXT"
    sasl_mechanism: str = "SCRAM-SHA-512"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    prefix: str = "xsg."
    retention_seconds: float = 3600.0
    retention_bytes: int = 256 * 1024 * 1024
    replication: int = 1
    ack_timeout: float = 1.0
    # seconds of a real-time batch for Kafka streams whose plans all qualify
    # (`pep.runtime.query.realtime`); 0: micro-batches only
    realtime: float = 0.0
    # plans of a stream sharing one plan topic, each under a lane (`pep.delivery.lanes`)
    plans_per_topic: int = 64

    @classmethod
    def of(cls, config: Any) -> DeliverySettings:
        """From a `GatewayConfig` whose `delivery` is kafka."""
        return cls(brokers=str(config.delivery_brokers),
                   security_protocol=config.delivery_security_protocol,
                   sasl_mechanism=config.delivery_sasl_mechanism,
                   username=config.delivery_username, password=config.delivery_password,
                   prefix=config.delivery_topic_prefix,
                   retention_seconds=float(config.delivery_retention_seconds),
                   retention_bytes=int(config.delivery_retention_bytes),
                   replication=int(config.delivery_replication),
                   ack_timeout=float(config.delivery_ack_timeout),
                   realtime=float(config.delivery_realtime),
                   plans_per_topic=int(config.delivery_plans_per_topic))

    # -- names ----------------------------------------------------------------------------------

    @property
    def control_topic(self) -> str:
        return self.prefix + CONTROL

    @property
    def acks_topic(self) -> str:
        return self.prefix + ACKS

    @property
    def plan_prefix(self) -> str:
        return self.prefix + PLAN

    @property
    def group_prefix(self) -> str:
        return self.prefix + GROUP

    @property
    def principal(self) -> str:
        """This process's Kafka principal (User:ANONYMOUS without SASL)."""
        return f"User:{self.username}" if self.sasl and self.username else "User:ANONYMOUS"

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL")

    def topic_config(self) -> dict[str, str]:
        """A delivery topic's settings: deleted by time and size, never compacted.

        Kafka deletes whole segments, never the one being written unless all of it expired, so
        retention holds only with segments that roll: with Kafka's defaults (1 GiB or 7 days)
        a topic written to every few seconds kept every row for up to a week whatever
        `retention_seconds` said. A segment here rolls after a quarter of the retention (time
        and size), each roll moved earlier by up to a quarter of that at random
        (`segment.jitter.ms`) so that topics created together do not roll together; a row
        then goes between the retention and 1.25 times it, plus the broker's retention check
        (`log.retention.check.interval.ms`, 5 minutes by default).

        The offset index gets an entry per `index.interval.bytes` of a segment, and the first
        entry of a segment touches its memory-mapped index files for the first time: at
        Kafka's 4 KiB, 1,000 plan topics written at the same pace reached it in the same
        batch, and the broker's request threads spent 21 s on those first touches (page faults
        that allocate the files' blocks) while every produce request waited. At 1 MiB a topic
        written at a few KiB a second has no entry for minutes, or none before its segment
        rolls; a reader resuming at an offset then reads at most 1 MiB of the segment to find
        it."""
        retention_ms = max(1, int(self.retention_seconds * 1000))
        segment_ms = max(1, retention_ms // SEGMENT_PARTS)
        segment_bytes = min(MAX_SEGMENT_BYTES, max(MIN_SEGMENT_BYTES,
                                                   self.retention_bytes // SEGMENT_PARTS))
        return {"retention.ms": str(retention_ms),
                "retention.bytes": str(self.retention_bytes), "cleanup.policy": "delete",
                "segment.ms": str(segment_ms),
                "segment.jitter.ms": str(segment_ms // SEGMENT_PARTS),
                "segment.bytes": str(segment_bytes),
                "index.interval.bytes": str(min(INDEX_INTERVAL_BYTES, segment_bytes))}

    # -- the clients ----------------------------------------------------------------------------

    def client(self, **extra: Any) -> dict[str, Any]:
        """librdkafka settings of a client of this identity, with `extra`."""
        out: dict[str, Any] = {"bootstrap.servers": self.brokers,
                               "security.protocol": self.security_protocol}
        if self.sasl:
            out.update({"sasl.mechanism": self.sasl_mechanism, "sasl.username": self.username,
                        "sasl.password": self.password})
        out.update(extra)
        return out

    def spark_options(self) -> dict[str, str]:
        """Spark's Kafka sink options for this identity (the Java client's names, `kafka.`):
        acknowledged by every in-sync replica, idempotent, and quick to say the brokers are
        away (a write that fails is tried again by the micro-batch: `pep.runtime.delivery`).

        A broker that is there but slow is waited for: a request that times out closes the
        connection and sends everything in flight again, which on a loaded machine (a batch's
        records to 1,000 plan topics, load 18 on 2 cores) turned a slow batch into one of 36 s
        of retries; 15 s per request, 20 s per record (a broker that went away is told to
        the readers by the edges, which lose the control topic, not by these bounds)."""
        out = {"kafka.bootstrap.servers": self.brokers,
               "kafka.security.protocol": self.security_protocol,
               "kafka.acks": "all", "kafka.enable.idempotence": "true",
               "kafka.max.in.flight.requests.per.connection": "5",
               "kafka.linger.ms": "0", "kafka.batch.size": str(SINK_BATCH_BYTES),
               "kafka.buffer.memory": str(SINK_BUFFER_BYTES),
               "kafka.max.block.ms": "5000",
               "kafka.request.timeout.ms": "15000", "kafka.delivery.timeout.ms": "20000"}
        if self.sasl:
            module = JAAS_MODULES[self.sasl_mechanism]
            out["kafka.sasl.mechanism"] = self.sasl_mechanism
            out["kafka.sasl.jaas.config"] = (
                f"{module} required username={json.dumps(self.username or '')} "
                f"password={json.dumps(self.password or '')};")
        return out


def delivery_settings(config: Any) -> DeliverySettings | None:
    """The delivery settings of a configuration, None when rows are delivered in-process."""
    if getattr(config, "delivery", "process") != "kafka":
        return None
    return DeliverySettings.of(config)


__all__ = ["ACKS", "CONTROL", "COUNT_KIND", "DeliverySettings", "FENCE_KEY", "GROUP", "PLAN",
           "WARM_KEY", "delivery_settings"]
