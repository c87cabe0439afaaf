"""A query that fails on a row's value says what failed, never the value (common/errors.py).

Spark quotes the value in its error ("The value 'Mrs Secret 0451' of the type "STRING" cannot be
cast to "INT""), a Python step's error carries the worker's traceback with what its exception
said of the row, and py4j repeats both. The gateway's data never makes Spark fail on a value, so
the failures here are made by a step added to a real query (a cast under ANSI, a Python step on
the workers), over a real stream's tuple: what is under test is every place the failure goes.
"""
from __future__ import annotations

import io
import json
import logging

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from common.errors import SafeExceptions, described
from common.logs import configure_logging
from pep.core.plan import ExecutionPlan, Field, SourceSpec, StreamDefinition, StreamSchema
from pep.runtime.query.runner import MicroBatchRunner
from tests.pep.runtime.log_capture import captured_logs, refuse_values
from tests.pep.runtime.support import Collector, wait_until, write_jsonl

SECRET = "Mrs Secret 0451"
SCHEMA = StreamSchema((Field("t", "long"), Field("tag", "string")))


@pytest.fixture
def gateway_logs(spark, caplog, tmp_path):
    with captured_logs(spark, caplog, tmp_path) as logs:
        yield logs


def _stream(path) -> StreamDefinition:
    return StreamDefinition("leaky", "owner", SCHEMA,
                            SourceSpec("files", (("path", str(path)), ("format", "json"))),
                            time_attribute="t")


def _refuse_values(spark, batch) -> None:
    """A Python step on the workers that fails on the tuple it reads, saying its value."""
    refuse_values(batch)


def _cast_values(spark, batch) -> None:
    """A cast under ANSI of the tuple's text to a number: Spark's error quotes the value."""
    batch.select(F.col("tag").cast("int")).collect()


@pytest.mark.parametrize("step", [_cast_values, _refuse_values], ids=["cast", "python"])
def test_a_failed_micro_batch_says_its_kinds_never_the_value(runtime, spark, tmp_path,
                                                            monkeypatch, gateway_logs, step):
    src = tmp_path / "in"
    src.mkdir()
    real_run = MicroBatchRunner.run

    def run(self, batch, batch_id):
        step(spark, batch)
        return real_run(self, batch, batch_id)

    monkeypatch.setattr(MicroBatchRunner, "run", run)
    sink = Collector()
    definition = _stream(src)
    runtime.attach_handle("h", definition, ExecutionPlan("leaky", None, ("t",)), sink)
    write_jsonl(src, "a.json", [{"t": 1, "tag": SECRET}])
    assert wait_until(lambda: runtime.health()["leaky"]["state"] == "failed", timeout=90)

    assert wait_until(lambda: "terminated with error" in gateway_logs.jvm(), timeout=30)
    logged = gateway_logs.text()
    assert "micro-batch" in logged and "failed" in logged  # the line is there ...
    assert SECRET not in logged  # ... and says no value, nor does any other line
    health, stats = runtime.health()["leaky"], runtime.stats()["leaky"]
    assert SECRET not in json.dumps(health, default=str) + json.dumps(stats, default=str)
    kinds = "CAST_INVALID_INPUT" if step is _cast_values else "PythonException"
    assert kinds in health["last_error"]  # what failed is said
    # Spark's line of the failed task is there, cut at the exception it quotes
    assert "Lost task" in logged and "Exception (text not logged)" in gateway_logs.jvm()
    # the query's own error, which Spark logs and awaitTermination raises, has it no more
    query = runtime._executors["leaky"].lifecycle._query
    assert query is not None and query.exception() is not None
    assert SECRET not in str(query.exception())
    assert sink.rows == []


def test_a_query_that_does_not_start_again_says_its_kinds(runtime, spark, tmp_path,
                                                          gateway_logs):
    """The restart path (`QueryLifecycle.restart`, as real-time mode calls it): the new query's
    start fails on a value; the log line and the health say the failure's kinds."""
    src = tmp_path / "in"
    src.mkdir()
    write_jsonl(src, "a.json", [{"t": 1, "tag": "plain"}])
    sink = Collector()
    runtime.attach_handle("h", _stream(src), ExecutionPlan("leaky", None, ("t",)), sink)
    assert wait_until(lambda: sink.rows == [{"t": 1}] or runtime.stats()["leaky"]["batches"] > 0)
    lifecycle = runtime._executors["leaky"].lifecycle
    real_start = lifecycle.start

    def start(*args, **kwargs):
        frame = spark.createDataFrame([(SECRET,)], "tag string")
        _refuse_values(spark, frame)  # raises: the start fails on this value
        return real_start(*args, **kwargs)

    lifecycle.start = start
    lifecycle.restart()
    lifecycle.start = real_start
    logged = gateway_logs.text()
    assert "did not start again" in logged and "PythonException" in logged
    assert SECRET not in logged
    health = runtime.health()["leaky"]
    assert "PythonException" in health["last_error"] and SECRET not in json.dumps(health)


def test_the_log_handler_writes_an_exceptions_kinds_and_frames_never_its_text():
    """The last guard (`SafeExceptions`, on every program's handler), in both formats: a line
    of the runtime's loggers that still passes an exception, or any line that passes one of
    Spark's, py4j's or Arrow's (or one raised from it), is written without its message; an
    operator's error elsewhere (a configuration file's) keeps its text."""
    for fmt in ("text", "json"):
        out = io.StringIO()
        handler = configure_logging("INFO", fmt, stream=out)
        try:
            runtime_log = logging.getLogger("pep.runtime.tests")
            try:
                raise ValueError(f"cannot read {SECRET!r}")
            except ValueError as exc:
                runtime_log.exception("step failed")
                runtime_log.warning("step failed: %s", exc)
                runtime_log.error("step failed", exc_info=exc)
                runtime_log.error(exc)
            other = logging.getLogger("pep.handles.tests")
            try:
                try:
                    raise pa.ArrowInvalid(f"cannot read {SECRET!r}")
                except pa.ArrowInvalid as cause:
                    raise RuntimeError(f"wrapped: {cause}") from cause
            except RuntimeError as exc:
                other.exception("delivery failed")
                other.warning("delivery failed: %s", exc)
            other.warning("auth file not reloaded: %s", ValueError("line 3: not JSON"))
            handler.flush()
        finally:
            logging.getLogger().removeHandler(handler)
        text = out.getvalue()
        assert SECRET not in text
        lines = text.strip().splitlines()
        assert len(lines) == 7 and all("ValueError" in line for line in lines[:4])
        assert all("RuntimeError" in line for line in lines[4:6])
        assert "test_failure_logs.py:" in lines[0]  # where, as frames of code
        assert "line 3: not JSON" in lines[6]
        assert any(isinstance(f, SafeExceptions) for f in handler.filters)


def test_described_names_sparks_condition_and_the_java_class(spark):
    with pytest.raises(Exception) as failed:
        spark.createDataFrame([(SECRET,)], "s string").select(F.col("s").cast("int")).collect()
    assert SECRET in str(failed.value)  # Spark's text does quote it
    said = described(failed.value)
    assert "CAST_INVALID_INPUT" in said and SECRET not in said
    assert described(pa.ArrowInvalid(SECRET)) == "ArrowInvalid"


def test_the_shared_query_s_failed_micro_batch_says_its_kinds(spark, tmp_path, monkeypatch,
                                                              gateway_logs):
    """The shared query (pep/runtime/shared/): its micro-batch's raw lines cast under ANSI; the
    error quotes the line, so the value."""
    from pep.runtime.runtime import RuntimeSettings, StreamRuntime
    from pep.runtime.shared.query import SharedQuery

    real_run = SharedQuery._run

    def run(self, batch, batch_id):
        batch.select(*[F.col(c).cast("int") for c, t in batch.dtypes if t == "string"]
                     ).collect()
        return real_run(self, batch, batch_id)

    monkeypatch.setattr(SharedQuery, "_run", run)
    rt = StreamRuntime(spark, tmp_path / "work", settings=RuntimeSettings(
        trigger_interval=0.25, shared_query=True, shared_trigger_min=0.2,
        shared_trigger_max=1.0))
    try:
        definition = StreamDefinition("leaky", "owner", SCHEMA, SourceSpec(
            "ingest", (("path", str(tmp_path / "in")),)), time_attribute="t")
        sink = Collector()
        rt.attach_handle("h", definition, ExecutionPlan("leaky", None, ("t",)), sink)
        assert type(rt._executors["leaky"]).__name__ == "SharedStreamExecutor"
        write_jsonl(tmp_path / "in", "a.json", [{"t": 1, "tag": SECRET}])
        assert wait_until(lambda: rt.health()["leaky"]["state"] == "failed", timeout=90)
        assert wait_until(lambda: "terminated with error" in gateway_logs.jvm(), timeout=30)
        logged = gateway_logs.text()
        assert "shared stream query: micro-batch" in logged and SECRET not in logged
        health = rt.health()["leaky"]
        assert "CAST_INVALID_INPUT" in health["last_error"] and SECRET not in json.dumps(health)
    finally:
        rt.stop()


def test_a_join_s_failed_micro_batch_says_its_kinds(spark, tmp_path, monkeypatch, gateway_logs):
    """The join runtime (pep/runtime/joins/): a joined row's text cast under ANSI while its
    micro-batch runs."""
    from pep.core.plan import JoinPlan
    from pep.runtime.joins.runtime import JoinRuntime, _JoinQuery
    from tests.pep.runtime.test_joins import definitions, iso

    real_rows = _JoinQuery._rows

    def rows(self, arrow):  # the joined rows, in the batch: their text cast by Spark
        texts = [(v,) for c in arrow.column_names if pa.types.is_string(arrow.column(c).type)
                 for v in arrow.column(c).to_pylist()]
        spark.createDataFrame(texts, "s string").select(F.col("s").cast("int")).collect()
        return real_rows(self, arrow)

    monkeypatch.setattr(_JoinQuery, "_rows", rows)
    left_def, right_def = definitions(tmp_path)
    t0 = 1_740_000_000
    write_jsonl(tmp_path / "st", "0.json", [{"t": iso(t0), "station": SECRET, "rainrate": 2.0}])
    write_jsonl(tmp_path / "sh", "0.json", [{"ts": t0 + 0.5, "area": SECRET, "mmsi": 1}])
    plan = JoinPlan(ExecutionPlan("st", None, ("t", "station")),
                    ExecutionPlan("sh", None, ("ts", "area")), (("station", "area"),), 3.0,
                    "t", "ts")
    joins = JoinRuntime(spark, tmp_path / "work", trigger_interval=0.25, lateness=2.0)
    try:
        joins.attach_join("j", (left_def, right_def), plan, lambda batch: True)
        assert wait_until(lambda: any(s["last_error"] for s in joins.stats().values()),
                          timeout=120)
        stats = json.dumps(joins.stats(), default=str)
        assert "CAST_INVALID_INPUT" in stats and SECRET not in stats
        assert wait_until(lambda: "terminated with error" in gateway_logs.jvm(), timeout=30)
        logged = gateway_logs.text()
        assert "join " in logged and "micro-batch" in logged and SECRET not in logged
    finally:
        joins.stop()
