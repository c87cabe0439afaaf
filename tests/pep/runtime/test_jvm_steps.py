"""`JvmSteps`: the batch's DataFrame steps with memoised JVM objects give what PySpark's own
methods give, and reuse what they built (fewer py4j calls is their whole point)."""
from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F, types as T

from pep.runtime.base.jvm_steps import JvmSteps

SCHEMA = T.StructType([T.StructField("ts", T.TimestampType()), T.StructField("v", T.LongType()),
                       T.StructField("s", T.StringType())])


def frame(spark):
    rows = [(dt.datetime(2026, 1, 1, 0, 0, i, tzinfo=dt.UTC), i, f"t{i}")
            for i in range(20)]
    return spark.createDataFrame(rows, SCHEMA).repartition(3)


def odd_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        keep = pc.equal(pc.bit_wise_and(batch.column("v"), 1), 1)
        yield batch.filter(keep)


def py4j_calls(spark, action) -> int:
    """How many commands `action()` sends to the JVM from this thread."""
    client = spark.sparkContext._gateway._gateway_client
    sent = []
    original = type(client).send_command
    me = threading.get_ident()

    def counting(self, command, *args, **kwargs):
        # the session is shared: other tests' streaming queries and listeners call the JVM
        # from their own threads meanwhile
        if threading.get_ident() == me:
            sent.append(command)
        return original(self, command, *args, **kwargs)
    type(client).send_command = counting
    try:
        action()
    finally:
        type(client).send_command = original
    return len(sent)


def test_steps_give_what_pyspark_gives(spark):
    steps = JvmSteps()
    df = frame(spark)
    cols = [F.col("ts"), (F.col("v") * 2).alias("v2"), F.col("s")]
    ours = steps.where(steps.select(df, cols), F.col("v2") > 10)
    theirs = df.select(*cols).where(F.col("v2") > 10)
    assert sorted(ours.collect()) == sorted(theirs.collect())

    observed, jo = steps.observe(df, "steps_test_observe",
                                 [F.count(F.lit(1)).alias("rows"), F.max("v").alias("top")])
    out_schema = T.StructType([T.StructField("ts", T.TimestampType()),
                               T.StructField("v", T.LongType()),
                               T.StructField("s", T.StringType())])
    mapped = steps.map_in_arrow(observed, "odd", odd_rows, lambda: odd_rows, out_schema,
                                ["ts", "v", "s"])
    table = steps.to_arrow(mapped, out_schema)
    assert steps.observed(df, jo) == {"rows": 20, "top": 19}
    expected = df.mapInArrow(odd_rows, out_schema).toArrow()
    assert table.schema == expected.schema  # timestamps in UTC, as toArrow gives them
    assert sorted(table.column("v").to_pylist()) == sorted(expected.column("v").to_pylist()) \
        == list(range(1, 20, 2))
    empty = steps.to_arrow(steps.where(mapped, F.col("v") > 100), out_schema)
    assert empty.num_rows == 0 and empty.schema == expected.schema


def test_steps_build_once_and_then_make_one_call(spark):
    steps = JvmSteps()
    df = frame(spark)
    cols = [F.col("v"), F.col("s"), F.col("ts")]
    built = []

    def factory():
        built.append(1)
        return odd_rows
    first = py4j_calls(spark, lambda: steps.select(df, cols))
    again = py4j_calls(spark, lambda: steps.select(df, cols))
    pyspark_select = py4j_calls(spark, lambda: df.select(*cols))
    assert again == 1 < first and again < pyspark_select
    owner = object()
    m1 = py4j_calls(spark, lambda: steps.map_in_arrow(df, "k", owner, factory, SCHEMA,
                                                       ["ts", "v", "s"]))
    m2 = py4j_calls(spark, lambda: steps.map_in_arrow(df, "k", owner, factory, SCHEMA,
                                                       ["ts", "v", "s"]))
    assert built == [1] and m2 == 1 < m1
    steps.map_in_arrow(df, "k", object(), factory, SCHEMA, ["ts", "v", "s"])
    assert built == [1, 1]  # another matcher: its own UDF


def test_foreach_batch_keeps_the_query_session_for_every_batch(spark, tmp_path):
    """`foreach_batch` wraps the query's session once; every batch runs in that session (what
    lets it skip PySpark's per-batch wrapping), and the batches are the query's own rows."""
    import threading

    from pep.runtime.base.jvm_steps import foreach_batch
    seen: list[tuple[int, int, bool]] = []
    done = threading.Event()

    def on_batch(df, batch_id):
        same = df._jdf.sparkSession().equals(df.sparkSession._jsparkSession)
        seen.append((batch_id, df.count(), bool(same)))
        if len(seen) >= 3:
            done.set()
    source = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    query = (foreach_batch(source.writeStream.queryName("jvm_steps_foreach_test"), on_batch)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        assert done.wait(60), f"three batches expected, saw {seen}"
    finally:
        query.stop()
    assert all(same for _, _, same in seen)
    assert [b for b, _, _ in seen] == list(range(len(seen)))
    assert sum(n for _, n, _ in seen[1:]) > 0
    assert query.exception() is None
