"""A single-node Kafka broker in KRaft mode (no ZooKeeper, no Docker), run from the Maven jars
that `make install` fetched into .cache/kafka/broker-<version>/ (deploy/fetch_kafka_jars.sh).

The tests start one per run (tests/kafka/conftest.py); `make kafka` starts one for a person
trying the README (`python -m tests.kafka.broker --port 9092`). The broker is a child process
whose output goes to a file (never a pipe nobody reads), started and stopped with time-outs.

Two client listeners. `bootstrap` (PLAINTEXT) is the administrators' listener: its principal
(User:ANONYMOUS) is a super user, as is the broker's own on its inter-broker and controller
listeners; the owners' streams in the tests use it as they always did. `sasl_bootstrap`
(SASL_PLAINTEXT, SCRAM-SHA-512) authenticates every client by its own SCRAM user
(`add_scram_user`) and the StandardAuthorizer decides what it may do by the ACLs (deny when
no ACL allows): delivery through plan topics (pep/delivery) runs there, the gateway and each
edge with an identity of their own. A broker for real use has no PLAINTEXT listener on a
network anyone reaches; this one listens on 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XSG_KAFKA_CACHE", REPO / ".cache" / "kafka"))

_LOG4J = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{ISO8601}} %p %c: %m%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""


SCRAM = "SCRAM-SHA-512"


class BrokerUnavailable(RuntimeError):
    """No broker jars (with the reason the fetch gave), or the broker did not come up."""


def broker_jars() -> Path:
    """The directory of the broker's jars, or BrokerUnavailable saying why there is none."""
    found = sorted(p for p in CACHE.glob("broker-*") if (p / ".complete").is_file())
    if found:
        return found[-1]
    note = CACHE / "unavailable.txt"
    if note.is_file():
        raise BrokerUnavailable(note.read_text(encoding="utf-8").strip())
    raise BrokerUnavailable(f"no Kafka broker jars under {CACHE}: run `make install` "
                            "(deploy/fetch_kafka_jars.sh fetches them with mvn)")


# the broker's heap before its topics (`heap_for`)
BASE_HEAP_MB = 896


def heap_for(topics: int) -> str:
    """The broker's heap for this many one-partition topics, with plan topics written and read.
    A topic's log keeps about 40 KB of heap (measured: 420 MB live after a full GC with 10,000
    plan topics; with 384 MB the old generation was full at 4,000 topics and the broker stopped
    answering metadata near 8,000), but under bench_edges' traffic (1,000 handles, 20,000
    rows/s, two edges) the broker kept 240-300 MB live at 1,000 topics: with 448 MB (SerialGC:
    an old generation of ~300 MB) it ran 18 full GCs in 18 s while a micro-batch waited on its
    acknowledgements (issue 45, `tests/bench/bench_edges_split.py`). The old generation (two
    thirds of the heap) is kept at twice that: 896 MB, and 64 MB more per 1,000 topics."""
    return f"{BASE_HEAP_MB + 64 * -(-max(0, topics) // 1000)}m"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes in URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@dataclass
class KafkaBroker:
    """One broker that is also its own KRaft controller, on 127.0.0.1."""

    work_dir: Path
    port: int = 0
    heap: str = "384m"
    log_level: str = "WARN"
    jars: Path | None = None
    controller_port: int = 0
    sasl_port: int = 0
    # how often the broker deletes what retention let go (Kafka: every 5 minutes, first 30 s
    # after the start); a test of retention asks for seconds
    retention_check_ms: int | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        """The SASL/SCRAM listener: clients are who they authenticate as, ACLs decide."""
        return f"127.0.0.1:{self.sasl_port}"

    def sasl_client(self, username: str, password: str) -> dict[str, str]:
        """librdkafka settings of a client that authenticates as `username`."""
        return {"bootstrap.servers": self.sasl_bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": SCRAM, "sasl.username": username,
                "sasl.password": password}

    def add_scram_user(self, username: str, password: str, timeout: float = 30.0) -> None:
        """Create (or change) a SCRAM-SHA-512 user, through the administrators' listener."""
        from confluent_kafka.admin import (
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        upsert = UserScramCredentialUpsertion(
            username, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
            password.encode("utf-8"))
        for future in admin.alter_user_scram_credentials([upsert],
                                                         request_timeout=timeout).values():
            future.result(timeout)

    @property
    def log_file(self) -> Path:
        return self.work_dir / "broker.log"

    def _java(self, main: str, *args: str, heap: str | None = None) -> list[str]:
        java = shutil.which("java", path=(os.environ.get("JAVA_HOME", "") + "/bin:"
                                          + os.environ.get("PATH", "")))
        if java is None:
            raise BrokerUnavailable("no java on PATH (Java 17+ is needed)")
        assert self.jars is not None
        # C1 alone, its code cache at the size both tiers get (C1 alone reserves 48 MiB, which
        # a long run fills: the JIT then stops)
        return [java, f"-Xmx{heap or self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-XX:ReservedCodeCacheSize=240m",
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
                "-cp", f"{self.jars}/*", main, *args]

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        """Format a fresh log directory and start the broker; returns once it answers metadata
        requests (or BrokerUnavailable after `timeout` seconds, with the log's tail)."""
        self.jars = self.jars or broker_jars()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.controller_port = self.controller_port or free_port()
        self.sasl_port = self.sasl_port or free_port()
        logs = self.work_dir / "logs"
        (self.work_dir / "log4j2.properties").write_text(
            _LOG4J.format(log=self.log_file, level=self.log_level))
        config = self.work_dir / "server.properties"
        config.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
            f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port},"
            f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,"
            "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"sasl.enabled.mechanisms={SCRAM}",
            f"listener.name.sasl_plaintext.{SCRAM.lower()}.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            # ACLs decide for SASL clients; the broker itself and the administrators'
            # listener (PLAINTEXT, 127.0.0.1) are super users (the module docstring)
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users=User:ANONYMOUS",
            "allow.everyone.if.no.acl.found=false",
            f"log.dirs={logs}",
            "num.partitions=1",
            "auto.create.topics.enable=false",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "log.flush.interval.ms=1000",
            *([f"log.retention.check.interval.ms={self.retention_check_ms}",
               f"log.initial.task.delay.ms={self.retention_check_ms}"]
              if self.retention_check_ms else []),
            "",
        ]))
        deadline = time.monotonic() + timeout
        if not (logs / "meta.properties").is_file():
            with open(self.work_dir / "format.log", "wb") as out:
                done = subprocess.run(
                    # one argument with '=': an id may begin with '-', which argparse would
                    # take for an option of its own
                    self._java("kafka.tools.StorageTool", "format", f"--cluster-id={_cluster_id()}",
                               "-c", str(config), heap="128m"),
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    timeout=max(5.0, deadline - time.monotonic()))
            if done.returncode != 0:
                raise BrokerUnavailable("formatting the broker's log directory failed: "
                                        + (self.work_dir / "format.log").read_text()[-2000:])
        with open(self.work_dir / "broker.out", "ab") as out:
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(config)), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        last: Exception | None = None
        admin = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise BrokerUnavailable(f"the broker exited with {self.process.returncode}: "
                                        + self._tail())
            if admin is None:  # the client only once the port listens: it logs every refusal
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                except OSError as exc:
                    last = exc
                    time.sleep(0.2)
                    continue
                admin = AdminClient({"bootstrap.servers": self.bootstrap,
                                     "socket.timeout.ms": 2000})
            try:
                brokers = admin.list_topics(timeout=2).brokers
                if brokers:
                    return
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = exc
            time.sleep(0.2)
        raise BrokerUnavailable(f"the broker did not answer within the time-out ({last}): "
                                + self._tail())

    def _tail(self) -> str:
        parts = []
        for name in ("broker.out", "broker.log"):
            path = self.work_dir / name
            if path.is_file():
                parts.append(path.read_text(errors="replace")[-1500:])
        return "\n".join(parts)

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 30.0) -> None:
        """Create a topic and wait until every partition has a leader."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(name, partitions, 1)],
                                      operation_timeout=timeout, request_timeout=timeout)
        futures[name].result(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            topic = admin.list_topics(name, timeout=5).topics.get(name)
            if (topic is not None and topic.error is None and len(topic.partitions) == partitions
                    and all(p.leader >= 0 for p in topic.partitions.values())):
                return
            time.sleep(0.1)
        raise BrokerUnavailable(f"topic {name!r} has no leaders after {timeout} s")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (the broker shuts down cleanly), SIGKILL after `timeout` seconds."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a single-node Kafka broker (KRaft) for trying "
                                                 "xsg's Kafka streams; Ctrl-C stops it")
    parser.add_argument("--port", type=int, default=9092)
    parser.add_argument("--sasl-port", type=int, default=0,
                        help="the SASL/SCRAM listener's port (default: --port + 2)")
    parser.add_argument("--data-dir", default="data/kafka",
                        help="its log directory and configuration (kept across runs)")
    parser.add_argument("--plan-topics", type=int, default=5000,
                        help="plan topics (delivery = kafka: one per plan with a handle) the "
                             f"broker is sized for: its heap (default 5000: {heap_for(5000)})")
    parser.add_argument("--topic", action="append", default=[],
                        help="NAME[:PARTITIONS] to create if missing (repeatable)")
    args = parser.parse_args(argv)
    # the controller on the next port: the same two ports at every start of the same data dir
    broker = KafkaBroker(Path(args.data_dir).resolve(), port=args.port,
                         heap=heap_for(args.plan_topics), log_level="INFO",
                         controller_port=args.port + 1,
                         sasl_port=args.sasl_port or args.port + 2)
    try:
        broker.start()
    except BrokerUnavailable as exc:
        print(f"xsg: cannot start Kafka: {exc}", file=sys.stderr)
        return 1
    for spec in args.topic:
        name, _, parts = spec.partition(":")
        try:
            broker.create_topic(name, int(parts or 1))
        except Exception as exc:  # noqa: BLE001 - an existing topic is fine
            print(f"topic {name}: {exc}", file=sys.stderr)
    assert broker.jars is not None
    print(f"Kafka {broker.jars.name.removeprefix('broker-')} on {broker.bootstrap} "
          f"(SASL/SCRAM on {broker.sasl_bootstrap}; log {broker.log_file}); Ctrl-C stops it.\n"
          f"A topic:    java -cp '{broker.jars}/*' org.apache.kafka.tools.TopicCommand "
          f"--bootstrap-server {broker.bootstrap} --create --topic readings --partitions 3\n"
          f"A producer: java -cp '{broker.jars}/*' org.apache.kafka.tools.ConsoleProducer "
          f"--bootstrap-server {broker.bootstrap} --topic readings", flush=True)
    # SIGTERM (kill, a service manager) stops the broker as Ctrl-C does: without this the
    # interpreter died at once and left the broker's JVM running, orphaned
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while broker.process is not None and broker.process.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
