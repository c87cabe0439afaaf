"""The JVM's log lines the gateway keeps out of its log (pep/runtime/log4j2.properties): normal
operation logs no warning, and the lines that say a real fault still come through."""
from __future__ import annotations

import pytest

from tests.pep.runtime.log_capture import captured_logs

pytestmark = pytest.mark.timeout(120)


def test_a_deleted_plan_topic_s_metadata_warnings_are_not_logged(spark, caplog, tmp_path):
    """Spark's Kafka producer asks for a deleted plan topic's metadata every second until it
    has been idle 5 minutes, a WARN each time: not logged. The same client saying that a
    broker cannot be reached is."""
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j
    net = log4j.LogManager.getLogger("org.apache.kafka.clients.NetworkClient")
    before = log4j.LogManager.getRootLogger().getLevel()
    # the gateway's level (spark_log_level); `xsg policy test`, run in this session by another
    # test, sets ERROR
    spark.sparkContext.setLogLevel("WARN")
    try:
        with captured_logs(spark, caplog, tmp_path) as logs:
            net.warn("[Producer clientId=producer-1] The metadata response from the cluster "
                     "reported a recoverable issue with correlation id 2497 : "
                     "{xsg.plan.3c2ac12466fe058c62548b42=UNKNOWN_TOPIC_OR_PARTITION}")
            net.warn("[Producer clientId=producer-1] Connection to node 1 (/127.0.0.1:9) "
                     "could not be established. Node may not be available.")
            text = logs.jvm()
    finally:
        log4j.core.config.Configurator.setRootLevel(before)
    assert "could not be established" in text
    assert "UNKNOWN_TOPIC_OR_PARTITION" not in text and "recoverable issue" not in text
