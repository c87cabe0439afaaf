"""What the gateway's log would hold, for tests that assert a value reaches no log line: the
records (caplog's, formatted without the gateway's filter, so with their tracebacks), the
lines of the gateway's own handler (`common.logs.configure_logging`, into a buffer) and the
JVM's lines (a file appender with the layout and filters of the stderr appender the gateway
writes through, pep/runtime/log4j2.properties)."""
from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from common.logs import SILENCED_LOGGERS, configure_logging

APPENDER = "xsg-test-gateway-logs"


class GatewayLogs:
    def __init__(self, caplog: pytest.LogCaptureFixture, out: io.StringIO, jvm_file: Path
                 ) -> None:
        self._caplog, self._out, self._jvm_file = caplog, out, jvm_file

    def jvm(self) -> str:
        return self._jvm_file.read_text() if self._jvm_file.exists() else ""

    def text(self) -> str:
        plain = logging.Formatter("%(levelname)s %(name)s: %(message)s")
        records = "\n".join(plain.format(r) for r in self._caplog.records)
        return "\n".join((records, self._out.getvalue(), self.jvm()))


@contextmanager
def captured_logs(spark, caplog: pytest.LogCaptureFixture, tmp_path: Path
                 ) -> Iterator[GatewayLogs]:
    """The gateway's logging, as `xsg serve` sets it up, captured (see the module docstring)."""
    root, py4j = logging.getLogger(), logging.getLogger("py4j")
    levels = (root.level, py4j.level)
    silenced = {name: logging.getLogger(name).disabled for name in SILENCED_LOGGERS}
    out = io.StringIO()
    handler = configure_logging("INFO", stream=out)
    caplog.set_level(logging.INFO)
    jvm = spark.sparkContext._jvm
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    config = context.getConfiguration()
    stderr = config.getAppender("stderr")
    jvm_file = tmp_path / "jvm.log"
    builder = jvm.org.apache.logging.log4j.core.appender.FileAppender.newBuilder()
    builder.setName(APPENDER)
    builder.withFileName(str(jvm_file))
    builder.withImmediateFlush(True)
    builder.setLayout(stderr.getLayout())
    builder.setFilter(stderr.getFilter())
    builder.setConfiguration(config)
    appender = builder.build()
    appender.start()
    config.addAppender(appender)
    config.getRootLogger().addAppender(appender, None, None)
    context.updateLoggers()
    try:
        yield GatewayLogs(caplog, out, jvm_file)
    finally:
        config.getRootLogger().removeAppender(APPENDER)
        context.updateLoggers()
        appender.stop()
        root.removeHandler(handler)
        root.setLevel(levels[0])
        py4j.setLevel(levels[1])
        for name, disabled in silenced.items():
            logging.getLogger(name).disabled = disabled


def refuse_values(batch) -> None:
    """A Python step on the workers that fails on the tuple it reads, its exception quoting the
    tuple's `tag` (the failure the log tests look for)."""
    def refuse(batches):
        for b in batches:
            for tag in b.column("tag").to_pylist():
                raise ValueError(f"cannot read {tag!r}")
            yield b
    batch.select("tag").mapInArrow(refuse, "tag string").collect()
