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
# The Spark sink's producer batch, in bytes (the Java client's batch.size, 16 KiB by default):
# a micro-batch's rows of a topic are written in a burst by one task, and 16 KiB batches were
# ~340 produce requests per 50,000 rows; at 256 KiB the same write cost the broker 40% of the
# CPU and took less time (bench_kafka). With linger.ms 0 a batch still leaves as soon as the
# producer can send it: no row waits for a batch to fill.
SINK_BATCH_BYTES = 262_144
# the key of the record that makes a new plan topic known to Spark's producer before its first
# rows (`pep.runtime.delivery.warm`): no row, an edge skips it
WARM_KEY = b"w:"
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
                   realtime=float(config.delivery_realtime))

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
        """A delivery topic's settings: deleted by time and size, never compacted."""
        return {"retention.ms": str(int(self.retention_seconds * 1000)),
                "retention.bytes": str(self.retention_bytes), "cleanup.policy": "delete"}

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


__all__ = ["ACKS", "CONTROL", "COUNT_KIND", "DeliverySettings", "GROUP", "PLAN", "WARM_KEY",
           "delivery_settings"]
