"""librdkafka's log lines, summed up like our own repeating warnings.

A confluent-kafka client given a Python `logger` (its `logger` setting) writes each librdkafka
line as `logger.log(level, "%s [%s] %s", facility, client, text)`. While a broker is away,
every client writes the same lines again and again (`FAIL ... Connect to ... failed:
Connection refused`, about 20 a second per client; `ERROR` lines too: librdkafka logs its
errors when the client has no `error_cb`), and they flooded the gateway's and the edges' logs
(issue 45). `KafkaClientRepeats`, a filter on the log handler before `RepeatSummary`
(`common.logs.configure_logging`), marks such a record as repeating (`common.log_repeats`):
the first of a kind is written in full, then one line per period says how many came. The
kind is the client, the facility and the text without its counters (librdkafka's own "(after
12ms in state CONNECT, 5 identical error(s) suppressed)"), so a new kind of trouble is still
written at once. It recognises the records by their shape, whatever logger the client was
given, so every Kafka client of the process is covered without each passing something of
ours.
"""
from __future__ import annotations

import logging
import re

from common.log_repeats import REPEAT

KAFKA_FORMAT = "%s [%s] %s"  # confluent-kafka's call to its `logger`
_CLIENT = re.compile(r"rdkafka#[a-z]+-\d+\Z")
# librdkafka's counters in a line: "(after 0ms in state CONNECT)", "(..., 5 identical
# error(s) suppressed)"
_COUNTERS = re.compile(r"\s*\((?:[^()]|\(s\))*(?:ms in state|identical error)"
                       r"(?:[^()]|\(s\))*\)")


def kafka_label(record: logging.LogRecord) -> str | None:
    """The repeat label of a librdkafka line; None for any other record."""
    args = record.args
    if record.msg != KAFKA_FORMAT or not isinstance(args, tuple) or len(args) != 3:
        return None
    facility, client, text = args
    if not (isinstance(client, str) and _CLIENT.match(client) and isinstance(text, str)):
        return None
    return f"Kafka client {client}: {facility} {_COUNTERS.sub('', text)}"


class KafkaClientRepeats(logging.Filter):
    """Marks librdkafka's lines as repeating (the module docstring); passes every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, REPEAT, None) is None:
            label = kafka_label(record)
            if label is not None:
                setattr(record, REPEAT, label)
        return True

    def close(self) -> None:
        """Nothing held (the handlers' filters are closed alike when logging is set again)."""


__all__ = ["KAFKA_FORMAT", "KafkaClientRepeats", "kafka_label"]
