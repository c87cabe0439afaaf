"""A micro-batch's DataFrame steps in as few py4j round trips as the JVM allows.

Each micro-batch builds its jobs anew over the batch's DataFrame, and PySpark's own methods make
many small calls into the JVM for that: `select(*cols)` fills a Java list one element per call,
`mapInArrow` pickles its function and builds a JVM UDF over `df[col]` for every column,
`Observation` looks classes up by reflection. At 1,000 handles that was ~110 calls per
micro-batch, and each one waits for the GIL while the route worker delivers the batch before
(py4j time of the batch thread: 0.2 s per micro-batch). The Columns are the same for every batch
of a shape, so the Scala Seqs of them, the UDF column and the JVM classes are built here once and
reused: a step is one call per batch.

`foreach_batch` registers a query's batch function the same way: PySpark's wrapper builds a new
Python `SparkSession` around the query's session for every batch (five calls, 0.1 s per batch
measured under the route worker's load); here it is built at the query's first batch and kept
(a query runs every batch in the one session it cloned at start; the executor's settings in it,
e.g. whole-stage codegen, are set once per query for that reason too).

A batch that starts while its query is being stopped between two batches fails with
`stopped_batch()`: an interrupted I/O as a Java exception, which Spark takes for the query's
stop (the batch is not committed, and nothing is logged) where any other failure of the batch
function is a query "terminated with error" (issue 42: a 75-line ERROR for every restart).

Only the classic (py4j) DataFrame is supported: it is what the gateway's session is.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import pyarrow as pa
from py4j.java_gateway import java_import
from py4j.protocol import Py4JJavaError
from pyspark.errors.exceptions.captured import unwrap_spark_exception
from pyspark.java_gateway import ensure_callback_server_started
from pyspark.serializers import CPickleSerializer
from pyspark.sql import Column, DataFrame, SparkSession, functions as F, types as T
from pyspark.sql.classic.column import _to_seq
from pyspark.sql.pandas.functions import pandas_udf
from pyspark.sql.pandas.serializers import ArrowCollectSerializer
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.readwriter import DataStreamWriter
from pyspark.util import PythonEvalType, _load_from_socket

from common.errors import described

_KEPT = 64  # Seqs and UDF columns kept per executor (shapes and matchers seen lately)


class _Memo:
    """A bounded memo of JVM objects whose entries hold for one `owner` object, compared by
    identity (a list of Columns, a matcher, a schema), kept alive by the entry so that an id
    used in the key stays its own; the least recently used go first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[object, Any]] = OrderedDict()

    def get(self, key: Hashable, owner: object, build: Callable[[], Any]) -> Any:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and hit[0] is owner:
                self._entries.move_to_end(key)
                return hit[1]
        value = build()  # outside the lock: py4j calls
        with self._lock:
            self._entries[key] = (owner, value)
            while len(self._entries) > _KEPT:
                self._entries.popitem(last=False)
        return value


class JvmSteps:
    """One stream executor's memo of JVM objects for its batch steps (thread-safe)."""

    def __init__(self) -> None:
        self._seqs = _Memo()  # (id(list of Columns), start) -> its Seq
        self._udfs = _Memo()  # key -> the UDF's Column, built for one owner
        self._arrow = _Memo()  # id(StructType) -> its Arrow schema
        self._classes: dict[str, Any] = {}

    def _seq(self, df: DataFrame, columns: Sequence[Column], start: int = 0) -> Any:
        return self._seqs.get((id(columns), start), columns,
                              lambda: _to_seq(df._sc, [c._jc for c in columns[start:]]))

    def _class(self, df: DataFrame, name: str) -> Any:
        cls = self._classes.get(name)
        if cls is None:
            cls = self._classes[name] = getattr(df._sc._jvm, name)
        return cls

    def select(self, df: DataFrame, columns: Sequence[Column]) -> DataFrame:
        """`df.select(*columns)`; `columns` is a list built once per shape (its identity is the
        memo's key: a list built per call works, it only gains nothing)."""
        return type(df)(df._jdf.select(self._seq(df, columns)), df.sparkSession)

    def where(self, df: DataFrame, condition: Column) -> DataFrame:
        return type(df)(df._jdf.filter(condition._jc), df.sparkSession)

    def observe(self, df: DataFrame, name: str, columns: Sequence[Column]
                ) -> tuple[DataFrame, Any]:
        """`df.observe(Observation(name), *columns)`: (the observed frame, the JVM observation
        to read with `observed` once the frame's first job ran)."""
        jo = self._class(df, "org.apache.spark.sql.Observation")(name)
        jdf = df._jdf.observe(jo, columns[0]._jc, self._seq(df, columns, 1))
        return type(df)(jdf, df.sparkSession), jo

    def observed(self, df: DataFrame, jo: Any) -> dict[str, Any]:
        """The observed metrics of `observe`'s frame (waits for its first job, as
        `Observation.get` does)."""
        utils = self._class(df, "org.apache.spark.sql.api.python.PythonSQLUtils")
        pickled = utils.toPyRow(jo.getRow())
        row = CPickleSerializer().loads(pickled)  # type: ignore[no-untyped-call]  # PySpark's
        return dict(row.asDict(recursive=False))

    def map_in_arrow(self, df: DataFrame, key: Hashable, owner: object,
                     function: Callable[[], Callable[..., Any]], schema: T.StructType,
                     names: Sequence[str]) -> DataFrame:
        """`df.mapInArrow(function(), schema)` over the columns `names` (all of `df`'s, in
        order). The UDF (its pickled function) is built once per `key` while `owner` (e.g. the
        matcher the function closes over) is the same object."""
        def build() -> Any:
            # PySpark's overloads of pandas_udf leave out the map-in-Arrow eval type
            udf = pandas_udf(function(), returnType=schema,  # type: ignore[call-overload]  # above
                             functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
            return udf(*[F.col(f"`{n}`") for n in names])._jc
        jc = self._udfs.get(key, owner, build)
        return type(df)(df._jdf.mapInArrow(jc, False, None), df.sparkSession)

    def to_arrow(self, df: DataFrame, schema: T.StructType) -> pa.Table:
        """`df.toArrow()` for a frame whose schema is `schema` (known to the caller: asking the
        JVM for it, and for two Arrow settings, is what PySpark's `toArrow` spends most of its
        calls on). The same table: batches in the job's order, cast to the schema's Arrow form
        (timestamps in UTC; `spark.sql.execution.arrow.useLargeVarTypes` only changes how the
        texts travel)."""
        arrow_schema = self._arrow.get(id(schema), schema, lambda: to_arrow_schema(
            schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC",
            prefers_large_types=False))
        port, secret, server = df._jdf.collectAsArrowToPython()
        try:
            serializer = ArrowCollectSerializer()  # type: ignore[no-untyped-call]  # PySpark's
            with _load_from_socket((port, secret), serializer) as stream:
                results = list(stream)
        finally:
            with unwrap_spark_exception():
                server.getResult()  # joins the serving thread; raises the job's error
        batches, order = results[:-1], results[-1]
        if not batches:
            return arrow_schema.empty_table()
        return pa.Table.from_batches([batches[i] for i in order]).cast(arrow_schema)


# py4j has no stubs: Py4JJavaError is Any to mypy
class BatchStopped(Py4JJavaError):  # type: ignore[misc]  # subclassing Any, see above
    """Raised by a batch function whose query is being stopped between two batches
    (`stopped_batch`); carries the Java exception Spark is to see."""


def stopped_batch(spark: SparkSession, what: str) -> BatchStopped:
    """The failure of a micro-batch that started while its query was being stopped, once the
    stop has begun (`StreamingQuery.isActive` is False): `UncheckedIOException(
    InterruptedIOException)` in the JVM, which Spark's stream execution takes for an
    interruption by `stop()` (`StreamExecution.isInterruptionException`): the batch is not
    committed and the query ends as stopped, not "terminated with error". Passed to the JVM as
    itself (`BatchFunction.call`); a plain Python exception would reach it as a Py4JException
    that Spark reports with its stack and the Python traceback."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    cause = jvm.java.io.InterruptedIOException(what)
    return BatchStopped(what, jvm.java.io.UncheckedIOException(what, cause))


class _QuietStops(logging.Filter):
    """py4j logs every exception a Python callback raises at ERROR, with its traceback: not a
    `BatchStopped`, which is how a query stops (Spark ends the query quietly on it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], BatchStopped))


_QUIET_STOPS = _QuietStops()


class BatchFunction:
    """The JVM's `PythonForeachBatchFunction`: `func(batch, batch_id)` with the batch's
    DataFrame in the query's session, wrapped once (see the module docstring)."""

    def __init__(self, spark: SparkSession, func: Callable[[DataFrame, int], None]) -> None:
        self._spark = spark
        self._func = func
        self._session: SparkSession | None = None
        self.error: BaseException | None = None

    def call(self, jdf: Any, batch_id: int) -> None:
        try:
            session = self._session
            if session is None:
                session = self._session = SparkSession(self._spark.sparkContext,
                                                       jdf.sparkSession())
            self._func(DataFrame(jdf, session), batch_id)
        except BatchStopped:
            raise  # its Java exception is thrown in the JVM (propagate_java_exceptions)
        except Exception as exc:  # noqa: BLE001 - said by its kinds
            # Any other failure reaches the JVM as before propagation was on: a Py4JException
            # with the Python traceback py4j formats, not the bare Java exception. That text
            # becomes the query's exception, which Spark logs and `awaitTermination` raises:
            # it says the failure's kinds and frames, never its message (a Spark error quotes
            # rows' values; common/errors.py), and chains no cause that would print one.
            self.error = exc  # what PySpark's own wrapper keeps
            raise RuntimeError(f"micro-batch {batch_id} failed: {described(exc)}") from None

    class Java:
        implements = ["org.apache.spark.sql.execution.streaming.sources.PythonForeachBatchFunction"]


def foreach_batch(writer: DataStreamWriter, func: Callable[[DataFrame, int], None]
                  ) -> DataStreamWriter:
    """`writer.foreachBatch(func)`, through `BatchFunction`."""
    spark = writer._spark
    gateway = spark.sparkContext._gateway
    assert gateway is not None  # a classic session's context has its py4j gateway
    java_import(gateway.jvm, "org.apache.spark.sql.execution.streaming.sources.*")
    gateway.jvm.PythonForeachBatchHelper.callForeachBatch(writer._jwrite,
                                                          BatchFunction(spark, func))
    ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]  # PySpark's, untyped
    # A Py4JJavaError raised by a callback is thrown in the JVM as its Java exception (only
    # `BatchStopped` is let through as one); read by py4j at each callback, for the gateway
    gateway.python_parameters.propagate_java_exceptions = True
    clientserver = logging.getLogger("py4j.clientserver")
    if _QUIET_STOPS not in clientserver.filters:
        clientserver.addFilter(_QUIET_STOPS)
    return writer


__all__ = ["JvmSteps", "BatchFunction", "BatchStopped", "foreach_batch", "stopped_batch"]
