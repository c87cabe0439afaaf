"""The Spark data source for handles: a Spark job (this process's session) reads a handle of a
real gateway (`xsg serve`, a child process) into a memory sink; restarted from its checkpoint
it goes on after the last event id it committed; a revocation ends it with a clear error."""
from __future__ import annotations

import pytest

from tests.client.conftest import RawReader, wait_for
from tests.client.test_client import SENSOR
from tests.pep.conftest import TOKENS
from xsg_client import Client
from xsg_client.schema import parse_timestamp

pyspark = pytest.importorskip("pyspark")


def records(ns: range) -> list[dict]:
    return [{"ts": f"2024-03-01T12:00:{n:02d}.{n * 111111 % 1000000:06d}Z", "v": n / 4,
             "n": 2 ** 62 + n, "tag": "x"} for n in ns]


def micros(text: str) -> int:
    stamp = parse_timestamp(text)
    return int(stamp.timestamp()) * 1_000_000 + stamp.microsecond


@pytest.mark.timeout(400)
def test_a_spark_job_reads_a_handle_and_resumes_from_its_checkpoint(spark, served, tmp_path):
    served.stream("s_sensor", SENSOR, {"id": "urn:t:s_sensor", "attributes": ["ts", "v", "n"]})
    with Client(served.url, TOKENS["lta"]) as xsg:
        grant = xsg.request("s_sensor")
    raw = RawReader(grant.handle).start()
    checkpoint = str(tmp_path / "checkpoint")

    sinks: dict[str, list[tuple]] = {"xsg_failing": [], "xsg_first": [], "xsg_second": []}

    def start(name: str):
        """The job: the handle into an in-memory sink of this process. (Spark's own memory
        sink cannot recover from a checkpoint in append mode: it refuses to start; a
        foreachBatch sink can.)"""
        frame = (spark.readStream.format("xsg").option("handle", grant.handle)
                 .option("token", TOKENS["lta"]).option("eventIdColumn", "event_id").load())
        assert [(f.name, f.dataType.simpleString()) for f in frame.schema.fields] == [
            ("event_id", "bigint"), ("ts", "timestamp"), ("v", "double"), ("n", "bigint")]

        def sink(batch, batch_id: int) -> None:
            if name == "xsg_failing" and not batch.isEmpty():
                raise RuntimeError("the sink failed")  # the batch is logged, not committed
            sinks[name].extend(tuple(r) for r in batch.selectExpr(
                "event_id", "unix_micros(ts)", "v", "n").collect())

        return (frame.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                .trigger(processingTime="0.5 seconds").start())

    def table(name: str) -> list[tuple]:
        return list(sinks[name])

    failing = start("xsg_failing")
    try:
        served.append("s_sensor", records(range(5)))
        with pytest.raises(Exception, match="the sink failed"):
            failing.awaitTermination(120)
    finally:
        failing.stop()
    # restarted: the failed batch is read again between its offsets (in a new reader: nothing
    # of it cached), then the query goes on
    first = start("xsg_first")
    try:
        wait_for(lambda: len(table("xsg_first")) == 5, timeout=120, what="5 rows in Spark")
        first.processAllAvailable()
    finally:
        first.stop()
    served.append("s_sensor", records(range(5, 10)))  # while no query runs
    wait_for(lambda: len(raw.rows()) == 10, what="the raw reader's 10 rows")
    second = start("xsg_second")
    try:
        wait_for(lambda: len(table("xsg_second")) == 5, timeout=120, what="5 more rows")
        expected = [(x["id"], micros(x["row"]["ts"]), x["row"]["v"], x["row"]["n"])
                    for x in raw.rows()]
        assert table("xsg_first") == expected[:5]  # the rows a raw reader got, exactly
        assert table("xsg_second") == expected[5:]  # after the checkpoint's offset: no repeat
        assert [r[3] for r in expected] == [2 ** 62 + n for n in range(10)]
        # revoked: the query ends with an error that says so
        served.call("DELETE", "/policies/urn:t:s_sensor", ok=(204,))
        with pytest.raises(Exception) as ended:
            second.awaitTermination(120)
        assert "the handle was revoked" in str(ended.value)
    finally:
        second.stop()
