"""The gateway's Spark settings and an operator's own (no Spark started)."""
import os
import stat
import sys

import pytest

from pep.runtime import quiet_daemon
from pep.runtime.session import (
    DAEMON_MODULE,
    DEFAULT_CONF,
    JAVA_OPTIONS,
    UDS_DIR,
    UDS_ENABLED,
    local_python_sockets,
    quiet_python_daemon,
    session_conf,
)


def test_defaults_compile_with_c1_and_keep_the_stack_size() -> None:
    conf = session_conf()
    assert conf == DEFAULT_CONF
    options = conf["spark.driver.extraJavaOptions"].split()
    assert "-XX:TieredStopAtLevel=1" in options and "-Xss16m" in options
    assert "-XX:ReservedCodeCacheSize=240m" in options  # C1 alone would reserve 48 MiB


def test_an_operators_java_options_follow_the_gateways_own() -> None:
    conf = session_conf({"spark.driver.extraJavaOptions": " -XX:TieredStopAtLevel=4 ",
                         "spark.sql.shuffle.partitions": "4"})
    options = conf["spark.driver.extraJavaOptions"]
    # the stack size the queries need stays; the flag given again comes last, and the JVM
    # takes the last one
    assert options.startswith(JAVA_OPTIONS)
    assert options.split()[-1] == "-XX:TieredStopAtLevel=4"
    assert conf["spark.sql.shuffle.partitions"] == "4"
    assert DEFAULT_CONF["spark.driver.extraJavaOptions"] == JAVA_OPTIONS  # not changed in place


def test_a_local_master_talks_to_python_over_unix_sockets_in_a_private_directory() -> None:
    conf = local_python_sockets(session_conf(), "local[2]")
    assert conf[UDS_ENABLED] == "true"
    directory = conf[UDS_DIR]
    # only the gateway's user may enter it: Spark does not authenticate Unix-socket connections
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert os.stat(directory).st_uid == os.getuid()
    assert UDS_ENABLED not in session_conf()  # the defaults themselves are not changed


def test_a_cluster_master_and_an_operators_choice_are_left_alone() -> None:
    base = session_conf()
    assert local_python_sockets(base, "spark://host:7077") == base  # TCP with Spark's secret
    off = session_conf({UDS_ENABLED: "false"})
    assert local_python_sockets(off, "local[*]") == off
    own = session_conf({UDS_DIR: "/run/xsg"})
    conf = local_python_sockets(own, "local[*]")
    assert conf[UDS_DIR] == "/run/xsg" and conf[UDS_ENABLED] == "true"


def test_the_kafka_connectors_cache_is_the_checkouts() -> None:
    """`make install` fetches the connector's jars into the checkout's `.cache/kafka`; the
    module that finds them sits two packages down (pep/runtime/sources), and looks there."""
    from pathlib import Path

    from pep.runtime.sources.kafka_connector import KAFKA_CACHE

    checkout = Path(__file__).resolve().parents[3]
    if not os.environ.get("XSG_KAFKA_CACHE"):
        assert KAFKA_CACHE == checkout / ".cache" / "kafka"


def test_a_local_gateway_runs_spark_s_python_daemon_quietly(monkeypatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    assert quiet_python_daemon({}, "local[2]")[DAEMON_MODULE] == "pep.runtime.quiet_daemon"
    assert DAEMON_MODULE not in quiet_python_daemon({}, "spark://h:7077")  # xsg not there
    assert quiet_python_daemon({DAEMON_MODULE: "own"}, "local")[DAEMON_MODULE] == "own"
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/other/python3")  # not this interpreter
    assert DAEMON_MODULE not in quiet_python_daemon({}, "local[2]")


def test_the_quiet_daemon_ends_a_worker_spark_disconnected_and_nothing_else(monkeypatch) -> None:
    def disconnected(sock, authenticated):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(quiet_daemon, "_worker", disconnected)
    assert quiet_daemon.quiet_worker(None, True) == 1  # type: ignore[arg-type]

    def failing(sock, authenticated):
        raise ValueError("a worker's own error")

    monkeypatch.setattr(quiet_daemon, "_worker", failing)
    with pytest.raises(ValueError):
        quiet_daemon.quiet_worker(None, True)  # type: ignore[arg-type]
