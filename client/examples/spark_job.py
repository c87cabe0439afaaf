"""A downstream Spark job on a handle: the authorised stream as a streaming DataFrame (the xsg
data source), a running count and mean per 10-second window of event time, printed per batch.
Its checkpoint holds the handle's event ids: started again with the same --checkpoint, it goes
on after the last event it committed.

    python spark_job.py https://gateway:8080/handles/<id> --checkpoint /tmp/xsg-job \\
        --time ts --value rainrate

Needs pyspark (the client's `spark` extra). Stops after --seconds, or once --rows rows came.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from pyspark.sql import DataFrame, SparkSession, functions as F


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("handle")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--time", required=True, help="the handle's timestamp column")
    parser.add_argument("--value", required=True, help="a numeric column to average")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rows", type=int, default=None)
    args = parser.parse_args(argv)
    # Spark's Python workers run the source: they need this interpreter (with xsg-client),
    # not whatever `python3` the PATH finds
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[1]").appName("xsg-downstream")
             .config("spark.sql.shuffle.partitions", "1").config("spark.ui.enabled", "false")
             # stopping a foreachBatch query can overflow the driver's default thread stack
             .config("spark.driver.extraJavaOptions", "-Xss16m")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    stream = (spark.readStream.format("xsg")  # found by name once xsg-client is installed
              .option("handle", args.handle)
              .option("token", os.environ.get("XSG_TOKEN", ""))
              .option("eventIdColumn", "event_id")
              .load())
    seen = {"rows": 0}

    def report(batch: DataFrame, batch_id: int) -> None:
        rows = batch.count()
        if rows == 0:
            return
        last = batch.agg(F.max("event_id")).first()
        windows = (batch.groupBy(F.window(args.time, "10 seconds"))
                   .agg(F.count("*").alias("rows"), F.avg(args.value).alias("mean"))
                   .orderBy("window").collect())
        print(f"batch {batch_id}: {rows} rows, up to event {last[0] if last else None}")
        for w in windows:
            print(f"  {w['window']['start']} .. {w['window']['end']}: {w['rows']} rows, "
                  f"mean {w['mean']}")
        seen["rows"] += rows  # counted once reported: the main thread may stop the query then

    query = (stream.writeStream.foreachBatch(report)
             .option("checkpointLocation", args.checkpoint)
             .trigger(processingTime="1 second").start())
    deadline = time.monotonic() + args.seconds
    try:
        while time.monotonic() < deadline and query.isActive:
            if args.rows is not None and seen["rows"] >= args.rows:
                break
            time.sleep(0.2)
        if query.exception() is not None:
            print(f"the query failed: {query.exception()}")
            return 1
    finally:
        query.stop()
        spark.stop()
    print(f"{seen['rows']} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
