"""A process's log lines (`xsg serve`, `xsg edge`, `xsg proxy`): one handler on stderr, text or
JSON, UTC times; warnings that repeat summed up once a minute (`common.log_repeats`). One module
for every program, so that an operator's log pipeline reads the proxy's lines as the gateway's."""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # imported where used at run time: `xsg --help` stays fast
    import logging


def _utc_time(record: logging.LogRecord) -> str:
    from datetime import UTC, datetime

    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


def _formatter(fmt: str) -> logging.Formatter:
    import logging

    class TextFormatter(logging.Formatter):
        def formatTime(self, record: logging.LogRecord,  # logging's name
                       datefmt: str | None = None) -> str:
            return _utc_time(record)

    class JsonFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            out: dict[str, object] = {"time": _utc_time(record), "level": record.levelname,
                                      "logger": record.name, "message": record.getMessage()}
            access = getattr(record, "access", None)
            if isinstance(access, dict):
                out.update(access)
            if record.exc_info:
                out["exception"] = self.formatException(record.exc_info)
            return json.dumps(out, default=str)

    if fmt == "json":
        return JsonFormatter()
    return TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


# Python-side loggers of py4j and PySpark, written through our handler.
LIBRARY_LOGGERS = ("py4j", "py4j.java_gateway", "py4j.clientserver", "pyspark")
# PySpark's query-context loggers: a Spark error with a query context logs its whole message
# there when it is raised, and that message can quote a row's value (a failed cast names the
# value), which must reach no log line. They are created here, plain and disabled: PySpark
# would otherwise make them its own (with a JSON handler of their own), and a plain logger
# that is enabled makes PySpark's call, which passes keywords only its logger takes
# (`file=`, `line=`), raise TypeError in place of the Spark error being raised.
SILENCED_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


def configure_logging(level: str = "INFO", fmt: str = "text", stream: TextIO | None = None,
                      repeat_period: float | None = None) -> logging.StreamHandler[TextIO]:
    """One handler on stderr for every line of the process: ours, the access log, py4j's and
    PySpark's Python side; ISO-8601 UTC timestamps; a record marked as repeating
    (`common.log_repeats.repeating`) written once, then summed up every `repeat_period` seconds
    (default a minute) while it repeats; so are the Kafka clients' (`common.kafka_logs`). An
    exception is written as its kinds and frames, never its message (`common.errors`).
    Returns the handler."""
    import logging

    from common.errors import SafeExceptions
    from common.kafka_logs import KafkaClientRepeats
    from common.log_repeats import DEFAULT_PERIOD, RepeatSummary

    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "xsg", False):
            root.removeHandler(handler)
            for old in list(handler.filters):
                if isinstance(old, RepeatSummary):
                    old.close()  # its last counts, on the handler they belong to
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.xsg = True  # type: ignore[attr-defined]  # marks the handlers this module added
    handler.setFormatter(_formatter(fmt))
    handler.addFilter(SafeExceptions())  # an exception's kinds and frames, never its text
    handler.addFilter(KafkaClientRepeats())  # librdkafka's lines: repeating (before the sums)
    handler.addFilter(RepeatSummary(handler.handle, repeat_period or DEFAULT_PERIOD))
    root.addHandler(handler)
    root.setLevel(level)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for own in list(logger.handlers):
            if not isinstance(own, logging.NullHandler):
                logger.removeHandler(own)
        logger.propagate = True
    for name in SILENCED_LOGGERS:
        logging.getLogger(name).disabled = True
    # py4j logs a line per callback at INFO, and at DEBUG every command and answer it carries
    # (rows' values and Spark's errors among them): only its warnings, at every level
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # psycopg's pool warns at every reconnection attempt while a PostgreSQL store is down; the
    # store says once that it is down and once that it is back (common/postgres.py)
    logging.getLogger("psycopg.pool").setLevel(logging.DEBUG if level == "DEBUG"
                                               else logging.ERROR)
    return handler


def flush_repeats(handler: logging.Handler) -> None:
    """Write the summaries of the repeated warnings `handler` holds back (the process ends)."""
    from common.log_repeats import RepeatSummary

    for summary in list(handler.filters):
        if isinstance(summary, RepeatSummary):
            summary.flush()
