"""A micro-batch of a few small files is one task; a large one is still split (issue 26: the
per-batch cost of many busy streams on one gateway). Read through the shared session, which has
the gateway's settings (`pep.runtime.session.DEFAULT_CONF`)."""
from __future__ import annotations

import json
from pathlib import Path

SCHEMA = "t long, v double, pad string"


def write_files(directory: Path, count: int, rows: int) -> None:
    directory.mkdir()
    for f in range(count):
        (directory / f"part-{f:03d}.json").write_text("".join(
            json.dumps({"t": f * rows + i, "v": i * 0.5, "pad": "p" * 40}) + "\n"
            for i in range(rows)))


def test_a_batch_of_a_few_small_files_is_one_partition(spark, tmp_path):
    write_files(tmp_path / "in", 3, 20)  # what an ingest stream's 0.25 s batch holds
    frame = spark.read.schema(SCHEMA).json(str(tmp_path / "in"))
    assert frame.rdd.getNumPartitions() == 1
    assert frame.count() == 60


def test_spark_s_default_would_make_a_task_per_core(spark, tmp_path):
    """What the setting changes: the same files with Spark's default (the cores)."""
    write_files(tmp_path / "in", 3, 20)
    session = spark.newSession()
    session.conf.set("spark.sql.files.minPartitionNum", "2")
    assert session.read.schema(SCHEMA).json(str(tmp_path / "in")).rdd.getNumPartitions() == 2


def test_a_large_batch_is_still_split_at_the_partition_size(spark, tmp_path):
    write_files(tmp_path / "in", 6, 400)  # ~30 KB each
    session = spark.newSession()
    session.conf.set("spark.sql.files.minPartitionNum", "1")  # the gateway's, as in the tests above
    session.conf.set("spark.sql.files.maxPartitionBytes", "40000")
    session.conf.set("spark.sql.files.openCostInBytes", "1000")
    frame = session.read.schema(SCHEMA).json(str(tmp_path / "in"))
    assert frame.rdd.getNumPartitions() >= 4
    assert frame.count() == 2400
