"""Driver for the standalone-cluster test (run in its own process: one SparkContext per process).

usage: python -m tests.pep.runtime.standalone_probe spark://host:port WORK_DIR
Prints one JSON line: what the handle received and what the executors were.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from pep.core.plan import (
    Aggregate,
    ExecutionPlan,
    Field,
    Predicate,
    SourceSpec,
    StreamDefinition,
    StreamSchema,
    WindowSpec,
)
from pep.runtime.runtime import StreamRuntime
from pep.runtime.session import create_spark_session
from tests.pep.runtime.support import Collector, wait_until, write_jsonl


def main(master: str, work: Path) -> dict:
    spark = create_spark_session(master, "xsg-standalone-probe", {
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m", "spark.cores.max": "1",
    }, warm=False)
    try:
        schema = StreamSchema((Field("n", "long"), Field("v", "double")))
        stream = StreamDefinition("probe", "owner", schema,
                                  SourceSpec("ingest", (("path", str(work / "in")),)))
        rows, windows = Collector(), Collector()
        runtime = StreamRuntime(spark, work / "rt")
        started = time.perf_counter()
        runtime.attach_handle("rows", stream, ExecutionPlan("probe", ((Predicate("v", ">", 5),),),
                                                     ("n",)), rows)
        runtime.attach_handle("win", stream, ExecutionPlan("probe", None, (), WindowSpec(
            "tuple", 5, 5, (Aggregate("v", "sum"),))), windows)
        attach_s = time.perf_counter() - started
        write_jsonl(work / "in", "a.json", [{"n": i, "v": i * 1.0, "_xsg_seq": i}
                                            for i in range(10)])
        wait_until(lambda: len(rows.rows) >= 4 and len(windows.rows) >= 2, timeout=120)
        stats = runtime.stats()
        runtime.stop()
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
        return {"rows": rows.rows, "windows": windows.rows, "attach_s": attach_s,
                "master": spark.sparkContext.master, "executors_incl_driver": executors,
                "batches": stats["probe"]["batches"]}
    finally:
        spark.stop()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]))))
