"""The direct query of a comparison (tests/bench/harness.py gives the rules): as a user writes it,
with Spark's defaults, in an application of its own (`UserApp`, serving the benchmark's
operations); or with the gateway's per-query settings in the gateway's session (`DirectSides`
runs either). `FileQuery` is the direct query on a directory of JSON-lines files.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.bench.harness import INF, link_all, reply


@dataclass(frozen=True)
class QuerySettings:
    """The per-query settings of a direct query. All None: Spark's defaults (no cap on what a
    micro-batch reads; the default trigger, each micro-batch as soon as the last has ended)."""

    name: str
    trigger: float | None = None
    max_files: int | None = None
    max_offsets: int | None = None

    def source(self, reader: Any, kind: str) -> Any:
        """`reader` (a DataStreamReader of `kind` "files" or "kafka") with the caps."""
        if kind == "files" and self.max_files is not None:
            reader = reader.option("maxFilesPerTrigger", str(self.max_files))
        if kind == "kafka" and self.max_offsets is not None:
            reader = reader.option("maxOffsetsPerTrigger", str(self.max_offsets))
        return reader

    def trigger_on(self, writer: Any) -> Any:
        if self.trigger is None:
            return writer
        return writer.trigger(processingTime=f"{int(round(self.trigger * 1000))} milliseconds")

    def describe(self) -> str:
        if self.trigger is None and self.max_files is None and self.max_offsets is None:
            return "Spark's defaults: no cap per micro-batch, the default trigger"
        return (f"trigger {self.trigger} s, maxFilesPerTrigger {self.max_files}, "
                f"maxOffsetsPerTrigger {self.max_offsets}")


USER = QuerySettings("user")


def gateway_settings() -> QuerySettings:
    """The gateway's own per-query settings, read from its code (pep.runtime): its trigger
    interval, files per micro-batch, and records per micro-batch of a Kafka stream."""
    from pep.runtime.runtime import RuntimeSettings
    from pep.runtime.sources.frames import KAFKA_MAX_OFFSETS

    d = RuntimeSettings()
    return QuerySettings("gateway-settings", d.trigger_interval, d.max_files_per_trigger,
                         KAFKA_MAX_OFFSETS)


def from_dict(d: dict[str, Any]) -> QuerySettings:
    return QuerySettings(**d)


def user_session(kafka: bool = False) -> Any:
    """A SparkSession as a user's application makes it: Spark's defaults, local[*]; the only
    addition is the Kafka connector's jars (what `--packages` would fetch)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[*]").appName("a-user-query")
    if kafka:
        from pep.runtime.session import kafka_connector_jars
        builder = builder.config("spark.jars", ",".join(map(str, kafka_connector_jars())))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


Handler = Callable[..., dict[str, Any]]


def serve_user_app(handlers: dict[str, Handler], kafka: bool = False) -> None:
    """The child side of `UserApp`: a fresh SparkSession with Spark's defaults, then one command
    per stdin line (`{"op": ..., "args": {...}}`), each answered with `reply`."""
    started = time.time()
    spark = user_session(kafka)
    reply({"ready": True, "session_seconds": time.time() - started})
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            if cmd["op"] == "stop":
                break
            try:
                reply(handlers[cmd["op"]](spark, **cmd.get("args", {})))
            except Exception as exc:  # noqa: BLE001 - the parent reports it
                reply({"failed": f"{type(exc).__name__}: {str(exc)[:800]}"})
    finally:
        spark.stop()


class FileQuery:
    """The direct query on a directory of JSON-lines files: readStream json with `schema` (DDL),
    the filter `condition`, the projection `columns`, each micro-batch's rows brought to the
    driver with `toArrow()` (what a user's application reads); `done` once `want` rows came."""

    def __init__(self, spark: Any, settings: QuerySettings, directory: str, schema: str,
                 condition: str, columns: list[str], want: int = 1) -> None:
        self.frame = (settings.source(spark.readStream.schema(schema), "files").json(directory)
                      .filter(condition).select(*columns))
        self.settings = settings
        self.want = want
        self.rows = 0
        self.batches = 0  # micro-batches that brought rows
        self.first: float | None = None
        self.last: float | None = None
        self.done = threading.Event()
        self.query: Any = None
        self.stopping = False

    def _batch(self, df: Any, _id: int) -> None:
        try:
            n = df.toArrow().num_rows
        except Exception:
            if self.stopping:
                return  # stop() interrupted this batch's job
            raise
        if not n:
            return
        now = time.time()
        self.rows += n
        self.batches += 1
        self.first = self.first or now
        self.last = now
        if self.rows >= self.want:
            self.done.set()

    def start(self) -> FileQuery:
        writer = self.frame.writeStream.foreachBatch(self._batch)
        self.query = self.settings.trigger_on(writer).start()
        return self

    def stop(self) -> None:
        self.stopping = True
        if self.query is not None:
            self.query.stop()


def file_first_row(spark: Any, settings: dict[str, Any], directory: str, schema: str,
                   condition: str, columns: list[str], timeout: float = 60.0) -> dict[str, Any]:
    """Start -> the first row, for a query on a directory that records arrive in (inf: none
    within `timeout`)."""
    started = time.time()
    q = FileQuery(spark, from_dict(settings), directory, schema, condition, columns).start()
    try:
        q.done.wait(timeout)
    finally:
        q.stop()
    return {"first": (q.first - started) if q.first else INF}


def file_backlog(spark: Any, settings: dict[str, Any], staging: str, directory: str,
                 schema: str, condition: str, columns: list[str], expected: int,
                 timeout: float = 600.0) -> dict[str, Any]:
    """The query running on an empty directory, then the backlog's files appearing in it at
    once: the link's time, the first and last row's, the rows (see `backlog_figures`)."""
    Path(directory).mkdir(parents=True)
    q = FileQuery(spark, from_dict(settings), directory, schema, condition, columns, expected)
    q.start()
    try:
        time.sleep(1.0)  # the query runs (an empty directory: no batch yet)
        start = time.time()
        link_all(Path(staging), Path(directory))
        q.done.wait(timeout)
    finally:
        q.stop()
    return {"rows": q.rows, "lost": 0, "start": start, "first": q.first, "last": q.last,
            "batches": q.batches}


FILE_QUERY: dict[str, Handler] = {"first_row": file_first_row, "backlog": file_backlog}


class DirectSides:
    """Runs an operation of `ops` for a direct side: "user" in the user's application (which
    serves the same `ops`), "gateway-settings" here, in the gateway's session `spark`."""

    def __init__(self, spark: Any, app: UserApp | None, ops: dict[str, Handler]) -> None:
        self.spark, self.app, self.ops = spark, app, ops
        self.settings = {"user": USER, "gateway-settings": gateway_settings()}

    def run(self, side: str, op: str, wait: float = 900.0, **args: Any) -> dict[str, Any]:
        settings = asdict(self.settings[side])
        if side == "user":
            assert self.app is not None
            return self.app.call(op, wait=wait, settings=settings, **args)
        return self.ops[op](self.spark, settings=settings, **args)


def started_user_app(stack: ExitStack, script: str | Path) -> UserApp:
    """The user's application (`script --user-app`, see `UserApp`), closed with `stack`."""
    app = UserApp(script)
    stack.callback(app.close)
    print(f"the user's application (local[*], Spark's defaults) started in "
          f"{app.started['session_seconds']:.1f} s")
    return app


class UserApp:
    """The direct query as a user runs it: an application of its own (`script --user-app`), kept
    for the whole benchmark like the gateway is, so both sides' JVMs are equally warm after their
    first run. Its first run is its start-up."""

    def __init__(self, script: str | Path, timeout: float = 300.0) -> None:
        self.err = tempfile.NamedTemporaryFile(prefix="xsg-bench-user-app-", suffix=".log",
                                               delete=False, mode="w")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), "--user-app"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.err, text=True, bufsize=1)
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True, name="user-app-out").start()
        self.started = self._next(timeout)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@"):
                self.lines.put(json.loads(line[2:]))
        self.lines.put({"failed": f"the user's application ended ({self.proc.wait()}); see "
                                 f"{self.err.name}"})

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            got = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the user's application did not answer in {timeout:.0f} s; "
                               f"see {self.err.name}") from None
        if "failed" in got:
            raise RuntimeError(f"the user's application: {got['failed']}")
        return got

    def call(self, op: str, *, wait: float = 900.0, **args: Any) -> dict[str, Any]:
        """Run `op` in the application with `args`; its answer (at most `wait` seconds)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, "args": args}) + "\n")
        self.proc.stdin.flush()
        return self._next(wait)

    def close(self) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write(json.dumps({"op": "stop"}) + "\n")
                self.proc.stdin.flush()
            self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(30)
        self.err.close()
        os.unlink(self.err.name)
