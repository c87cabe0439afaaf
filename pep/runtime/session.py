"""The gateway's one SparkSession: started once per process, with the settings the runtime needs."""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession

from pep.runtime.sources.kafka_connector import (
    KAFKA_CACHE,
    kafka_connector_jars,
    kafka_unavailable_reason,
)

# The JVM's log lines in the gateway's own format and on stderr (see the file); a path with
# spaces is quoted, as spark-submit splits the option string like a shell.
LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties").resolve().as_uri()


def _java_option(name: str, value: str) -> str:
    option = f"-D{name}={value}"
    return f'"{option}"' if " " in option else option


# Measured here: stopping foreachBatch queries can overflow the driver's default thread stack,
# and a large shuffle partition count only adds scheduling overhead to tiny micro-batches. A
# file-source micro-batch lists its files (up to maxFilesPerTrigger, default 50) when it is
# built; above 32 paths Spark lists them with a Spark job of its own, measured 0.5-1 s per
# batch here against ~0.05 s listed on the driver.
#
# The driver's JIT compiles with C1 only (-XX:TieredStopAtLevel=1). The gateway's JVM runs many
# small micro-batches: its work is Spark's own driver code (planning, scheduling, logs), spread
# over thousands of methods, not a few hot loops. With both tiers the JIT was still compiling
# ~6,000 methods per 10 s two minutes after start (0.4-0.9 of this machine's two cores, C2
# mostly); with C1 alone the 1,000-reader benchmark's micro-batches took 0.26-0.34 s at p50
# instead of 0.39-0.59 s. A `spark.driver.extraJavaOptions` of the operator's own is appended
# after these, so `-XX:TieredStopAtLevel=4` there brings C2 back (later JVM flags win).
# C1 alone also lowers the JVM's default code cache from 240 to 48 MiB, which a gateway that
# runs many queries for days fills: then the JIT stops for good ("CodeCache is full. Compiler
# has been disabled", seen in bench_kafka after 200 s). The cache is reserved, not committed:
# 240 MiB costs only what is compiled.
JAVA_OPTIONS = ("-Xss16m -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m "
                + _java_option("log4j2.configurationFile", LOG4J2_CONFIG))
DEFAULT_CONF: dict[str, str] = {
    "spark.driver.extraJavaOptions": JAVA_OPTIONS,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "2g",
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "1024",
    # PySpark 4 records the Python call site of every Column and DataFrame function for
    # Spark's error context: a conf read over py4j and a walk of the Python stack per call
    # (F.col measured 1.4-2.8 ms with it, 0.4-0.7 ms without). The runtime builds a micro-
    # batch's jobs from Columns at every trigger, so that cost is paid per batch; its errors
    # are reported by stream and batch (executor), not by a line of the gateway's Python.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # A stream query writes its offset and commit logs (and a file source its metadata log) at
    # every micro-batch. Spark's default writer goes through Hadoop's FileContext: measured here
    # 50-70 ms per write on an idle machine (tmpfs too), 120-150 ms under load, three such steps
    # per batch; through FileSystem, 15-20 ms. Both write a temporary file and rename it (atomic
    # on a local or HDFS checkpoint directory, which is where the gateway keeps them).
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager",
    # Local files without Hadoop's checksum side files. Hadoop's default `file:` filesystem
    # writes a `.crc` file beside every file it writes (and renames it with it) and looks for one
    # beside every file it lists or opens: per micro-batch, the offset and commit logs' writes and
    # the ingest directory's listing. Alternating runs of the 1,000-reader benchmark: offset log
    # 24-27 -> 10-13 ms, commit log 15 -> 7-8 ms, the source's latestOffset 27 -> 14-16 ms per
    # batch. A checkpoint file is still written to a temporary name and renamed, so a crash
    # leaves the old file or the new one. What goes is the check of a file's bytes against
    # its `.crc` when it is read back (corruption on the disk), which SQLite, the gateway's
    # store, does not make either.
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
    # A micro-batch of a few small files in one task, not one per core. Spark sizes a file
    # scan's partitions as the batch's bytes (each file counted with a 4 MB opening cost) over
    # this number, which defaults to the cores: an ingest stream's batch of 2-3 files of a few
    # KB became a task per core, each a task launch and a Python worker's round trip for the
    # matcher, on the cores the other streams' batches need. With 1, the batch's bytes are
    # one partition up to `spark.sql.files.maxPartitionBytes` (128 MB), so a large batch (a
    # backlog, big files) is still split at that size. Alternating runs of
    # `bench_many_readers.py` (1,000 handles at 50%): over 4 busy streams p95 0.62-0.70 s
    # against 0.73-0.95 s, micro-batches p50 0.12-0.14 s against 0.16-0.18 s; one stream p95
    # 0.37 against 0.38-0.40 s, Spark's Python workers 0.03-0.04 cores against 0.05-0.06.
    "spark.sql.files.minPartitionNum": "1",
}


def _with_jars(conf: dict[str, str], jars: list[str]) -> dict[str, str]:
    """`spark.jars` with `jars` added after any the settings name already."""
    if not jars:
        return conf
    named = [j for j in conf.get("spark.jars", "").split(",") if j.strip()]
    out = dict(conf)
    out["spark.jars"] = ",".join(named + [j for j in jars if j not in named])
    return out


def session_conf(extra_conf: dict[str, str] | None = None) -> dict[str, str]:
    """The gateway's settings with the operator's (`extra_conf`) over them; the operator's
    `spark.driver.extraJavaOptions` come after the gateway's own JVM options instead of
    replacing them (the thread stack the queries need stays; a flag given again wins)."""
    conf = dict(DEFAULT_CONF)
    extra = dict(extra_conf or {})
    own = extra.pop("spark.driver.extraJavaOptions", "").strip()
    if own:
        conf["spark.driver.extraJavaOptions"] = f"{JAVA_OPTIONS} {own}"
    conf.update(extra)
    return conf


_warmed = False  # the JVM stays warm for the process: warm up once, however often we're called

UDS_ENABLED = "spark.python.unix.domain.socket.enabled"
UDS_DIR = "spark.python.unix.domain.socket.dir"
# the longest directory a socket file (".<uuid>.sock", 42 characters) fits in: Linux limits a
# Unix socket's path to 107 bytes
_UDS_DIR_MAX = 60


def local_python_sockets(conf: dict[str, str], master: str) -> dict[str, str]:
    """`conf` with Spark's JVM and its Python processes (workers, the driver's collects,
    accumulators) talking over Unix domain sockets in a directory of the gateway's own, when
    the master is local and the operator chose neither way.

    Why: over TCP, a task's input reached its Python worker ~40 ms late. The JVM writes the
    command and then the Arrow stream's first messages as small separate writes; Nagle's
    algorithm holds the second until the first is acknowledged, and the worker's end delays
    that acknowledgement (Linux's delayed ACK, up to 40 ms). Measured here, a `mapInArrow` job
    over two small partitions: first input batch 43 ms after the function started over TCP,
    1.5 ms over Unix sockets; the whole job 121 -> 73 ms. Every micro-batch's rows job pays it.

    Who may connect: over TCP Spark authenticates each connection with a secret; over Unix
    sockets it does not, and relies on the socket file. Hence a fresh directory that only the
    gateway's user can enter (`mkdtemp`, mode 0700) rather than Spark's default (`java.io.tmpdir`
    itself). A cluster master keeps TCP: the directory exists on this machine only, and its
    workers' Python processes would need one of their own (an operator may set both settings)."""
    if not master.startswith("local") or UDS_ENABLED in conf:
        return conf
    out = dict(conf)
    if UDS_DIR not in out:
        directory = tempfile.mkdtemp(prefix="xsg-py-")
        if len(directory) > _UDS_DIR_MAX:  # a long TMPDIR: TCP, as Spark's default
            os.rmdir(directory)
            return conf
        atexit.register(shutil.rmtree, directory, True)
        out[UDS_DIR] = directory
    out[UDS_ENABLED] = "true"
    return out


DAEMON_MODULE = "spark.python.daemon.module"


def quiet_python_daemon(conf: dict[str, str], master: str) -> dict[str, str]:
    """`conf` with Spark's Python daemon as `pep.runtime.quiet_daemon` (no traceback in the
    log when Spark stops an idle worker), when the master is local, the workers run this
    process's interpreter (which has xsg) and the operator chose no daemon of their own."""
    if (not master.startswith("local") or DAEMON_MODULE in conf
            or os.environ.get("PYSPARK_PYTHON", sys.executable) != sys.executable):
        return conf
    return {**conf, DAEMON_MODULE: "pep.runtime.quiet_daemon"}


def create_spark_session(master: str = "local[*]", app_name: str = "xsg",
                         extra_conf: dict[str, str] | None = None, warm: bool = True,
                         log_level: str = "WARN", python_workers: bool = True) -> SparkSession:
    """Build (or return the process's existing) SparkSession; takes seconds cold, so call once.

    With `warm` (the default) a throw-away shared query runs one micro-batch first (see warm_up)
    and, with `python_workers` too, Spark's Python workers are started
    (`python_workers.warm_python_workers`: what a gateway's many plans run on; a command that
    runs a few cases, `xsg policy test`, does without).
    `log_level` is Spark's own (log4j): `xsg policy test` keeps only errors.
    """
    # Python workers (the rows job's grouped matcher, `DataFrame.mapInArrow`) need numpy and
    # pyarrow: the gateway's own interpreter unless PYSPARK_PYTHON names another (pyspark reads
    # only that variable when it starts the context; `python3` on the PATH otherwise)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = _with_jars(quiet_python_daemon(local_python_sockets(session_conf(extra_conf), master),
                                          master), kafka_connector_jars())
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    global _warmed
    if warm and not _warmed:
        warm_up(spark)
        if python_workers:
            from pep.runtime.python_workers import warm_python_workers

            warm_python_workers(spark)
        _warmed = True
    return spark


def warm_up(spark: SparkSession, timeout: float = 60.0) -> float:
    """Run one tiny shared-query micro-batch end to end, so that the first real handle does not pay
    for the JVM's cold start (measured here: first query start ~2-3 s, first batch ~3-5 s cold).
    Returns the seconds it took."""
    import threading
    import time

    from pep.core.plan import ExecutionPlan, Predicate, SourceSpec, StreamDefinition
    from pep.core.schemas import WEATHER_SCHEMA
    from pep.runtime.runtime import StreamRuntime

    started = time.perf_counter()
    got = threading.Event()

    def arrived(rows: object) -> bool:
        got.set()
        return True
    stream = StreamDefinition("_xsg_warm_up", "xsg", WEATHER_SCHEMA,
                              SourceSpec("generator", (("schema", "weather"), ("rate", "50"))),
                              time_attribute="samplingtime")
    plan = ExecutionPlan(stream.name, ((Predicate("temperature", ">", -100.0),),),
                         ("samplingtime", "temperature"))
    with tempfile.TemporaryDirectory(prefix="xsg-warm-") as tmp:
        runtime = StreamRuntime(spark, Path(tmp), trigger_interval=0.1)
        try:
            runtime.attach_handle("warm-up", stream, plan, arrived)
            got.wait(timeout)
        finally:
            runtime.stop()
    return time.perf_counter() - started


__all__ = ["DEFAULT_CONF", "JAVA_OPTIONS", "KAFKA_CACHE", "create_spark_session",
           "kafka_connector_jars", "kafka_unavailable_reason", "local_python_sockets",
           "quiet_python_daemon", "session_conf", "warm_up"]
