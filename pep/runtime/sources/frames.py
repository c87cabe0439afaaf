"""Streaming DataFrames for each kind of stream source, all with the same shape.

Every source frame has the stream's declared attributes (in schema order, with the declared
types) followed by two ordering columns the executor relies on:
  `_xsg_seq`  a per-stream monotonically increasing integer when the source has one (the
              gateway's ingest writes it into each record; generators use the rate counter),
              else null;
  `_xsg_file` the file a tuple came from (file sources), its topic, partition and offset
              (Kafka), else null.

Ordering rule (tuple windows and firstval/lastval need one, because the file source does not keep
arrival order within a micro-batch): micro-batches are processed in order; within a batch tuples
are ordered by `_xsg_seq` when present, otherwise by the stream's time attribute, then by file
name, then by position within the file (line order), nulls last. The socket source spreads the
lines of a batch round-robin over partitions, so socket lines need `_xsg_seq` (or a time attribute)
to be ordered within a micro-batch. A Kafka record's `_xsg_file` is "<topic>/<partition>/<offset>"
(zero-padded) and its `_xsg_seq` null: a batch's records are ordered by the stream's time
attribute, then partition, then offset (offset order alone within a partition when the stream has
no time attribute).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession, functions as F, types as T

from common.numbers import NumberError, parse_int
from pep.core import punctuations
from pep.core.plan import StreamDefinition, StreamSchema
from pep.runtime.base.columns import (
    FILE_COLUMN,
    KAFKA_FILE_FORMAT,
    LANE_BITS,
    PUNCT_COLUMN,
    SEQ_COLUMN,
)
from pep.runtime.base.memo import OwnedCache
from pep.runtime.sources.generators import generator_frame
from pep.runtime.sources.kafka_connector import kafka_unavailable_reason

FILE_FORMATS = ("json", "csv", "parquet")
_SPARK_TYPES = {
    "double": T.DoubleType(),
    "long": T.LongType(),
    "string": T.StringType(),
    "label": T.StringType(),  # its canonical text; comparisons read its code (executor)
    "boolean": T.BooleanType(),
    "timestamp": T.TimestampType(),
}
# Reader options a stream definition may pass through to Spark's file readers.
_FILE_READER_OPTIONS = ("header", "sep", "delimiter", "quote", "escape", "encoding",
                        "timestampFormat", "multiLine", "recursiveFileLookup", "pathGlobFilter")


class SourceError(ValueError):
    """A stream's source cannot be built; the message says which stream and why."""


class KafkaConnectorMissing(SourceError):
    """Kafka was configured but Spark's Kafka connector is not on the classpath."""


def spark_schema(schema: StreamSchema, with_seq: bool = False) -> T.StructType:
    fields = [T.StructField(f.name, _SPARK_TYPES[f.type], True) for f in schema.fields]
    if with_seq and schema.lookup(SEQ_COLUMN) is None:
        fields.append(T.StructField(SEQ_COLUMN, T.LongType(), True))
    return T.StructType(fields)


def _shape(df: DataFrame, schema: StreamSchema, seq: Column | None, file: Column | None
           ) -> DataFrame:
    cols = [F.col(f"`{f.name}`").cast(_SPARK_TYPES[f.type]).alias(f.name) for f in schema.fields]
    cols.append((seq if seq is not None else F.lit(None)).cast("long").alias(SEQ_COLUMN))
    cols.append((file if file is not None else F.lit(None)).cast("string").alias(FILE_COLUMN))
    return df.select(*cols)


def local_dir(path: str) -> str | None:
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        return parsed.path if parsed.scheme else path
    return None


def _file_frame(spark: SparkSession, stream: StreamDefinition, path: str | None, fmt: str,
                max_files: int | None, create: bool, archive: str | None = None) -> DataFrame:
    name = stream.name
    if not path:
        raise SourceError(f"stream {name!r}: source option 'path' is required")
    if fmt not in FILE_FORMATS:
        raise SourceError(f"stream {name!r}: file format {fmt!r} is not one of "
                          f"{', '.join(FILE_FORMATS)}")
    local = local_dir(path)
    if local is not None:
        if create:
            os.makedirs(local, exist_ok=True)
        elif not os.path.isdir(local):
            raise SourceError(f"stream {name!r}: source directory {path!r} does not exist")
    own = stream.source.option("maxFilesPerTrigger")
    if own is not None:
        try:
            per_stream = parse_int(str(own), "maxFilesPerTrigger", low=1, high=1_000_000)
        except NumberError:
            raise SourceError(f"stream {name!r}: maxFilesPerTrigger must be a positive integer"
                              ) from None
        if max_files is not None:
            max_files = per_stream
    return _cached_frame(spark, ("file", stream, path, fmt, max_files, archive),
                         lambda: _file_reader_frame(spark, stream, path, fmt, max_files, archive))


def _file_reader_frame(spark: SparkSession, stream: StreamDefinition, path: str, fmt: str,
                       max_files: int | None, archive: str | None) -> DataFrame:
    if stream.source.kind == "files" and punctuations.enabled(stream):
        return _punctuated_file_frame(spark, stream, path, max_files)
    with_seq = fmt != "csv"  # CSV columns are positional: only the declared ones exist
    reader = spark.readStream.schema(spark_schema(stream.schema, with_seq))
    if max_files is not None:
        reader = reader.option("maxFilesPerTrigger", str(max_files))
    # A batch re-run after a failure may list a file that was removed meanwhile (a bad file
    # taken away by its owner): read what is still there rather than fail again.
    reader = reader.option("ignoreMissingFiles", "true")
    if archive == DELETE_COMMITTED:
        reader = reader.option("cleanSource", "delete")
    elif archive is not None:
        # committed files leave the source directory for the archive (retention sweeps it)
        reader = reader.option("cleanSource", "archive").option("sourceArchiveDir", archive)
    if fmt == "csv":
        reader = reader.option("header", stream.source.option("header", "true"))
    for option in _FILE_READER_OPTIONS:
        value = stream.source.option(option)
        if value is not None and option != "header":
            reader = reader.option(option, value)
    df = reader.format(fmt).load(path)
    seq = F.col(f"`{SEQ_COLUMN}`") if with_seq else None
    return _shape(df, stream.schema, seq, F.col("_metadata.file_path"))


def _punctuated_file_frame(spark: SparkSession, stream: StreamDefinition, path: str,
                           max_files: int | None) -> DataFrame:
    """A `files` stream of JSON lines whose owner enabled security punctuations: each file read
    whole (never split between tasks) and cut into its lines, so that each line keeps its
    number (`_xsg_seq`: a file's punctuations govern the lines after them in that file,
    `query/source_shield.py`). A blank line, or one that is not a JSON object, is no record."""
    reader = spark.readStream.format("text").option("wholetext", "true")
    if max_files is not None:
        reader = reader.option("maxFilesPerTrigger", str(max_files))
    reader = reader.option("ignoreMissingFiles", "true")
    for option in ("pathGlobFilter", "recursiveFileLookup"):
        value = stream.source.option(option)
        if value is not None:
            reader = reader.option(option, value)
    lines = reader.load(path).select(
        F.col("_metadata.file_path").alias(FILE_COLUMN),
        F.posexplode(F.split(F.col("value"), "\r?\n")).alias("_xsg_line_no", "_xsg_line"))
    lines = lines.where(F.ltrim(F.col("_xsg_line")).startswith("{"))
    return _punctuated_records(lines, stream, F.col("_xsg_line"), F.col("_xsg_line_no"))


def _punctuated_records(df: DataFrame, stream: StreamDefinition, text: Column, seq: Column
                        ) -> DataFrame:
    """The frame of a punctuated `files` or `kafka` stream (`df`: its records' JSON `text`,
    their place `seq` in their lane, `FILE_COLUMN`): the stream's shape, plus `PUNCT_COLUMN`,
    null on a tuple and on a `$punctuation` record its value as JSON text, or "" when the
    record cannot be read as one (other keys beside it; a record that does not parse and names
    a punctuation). The stream's query takes these records out of its batches before any plan
    reads them (`query/source_shield.py`): a punctuation is never a tuple."""
    key = punctuations.PUNCTUATION_KEY
    schema = spark_schema(stream.schema)
    with_key = T.StructType([*schema.fields, T.StructField(key, T.StringType(), True)])
    keys = F.json_object_keys(text)
    named = F.coalesce(F.array_contains(keys, F.lit(key)), F.lit(False))
    broken = keys.isNull() & text.contains("punctuation")
    parsed = F.from_json(text, with_key)
    punct = (F.when(named & (F.size(keys) == 1),
                    F.coalesce(parsed.getField(key), F.lit("null")))
             .when(named | broken, F.lit("")))
    framed = df.select(parsed.alias("_xsg_r"), punct.alias(PUNCT_COLUMN),
                       seq.cast("long").alias(SEQ_COLUMN), F.col(FILE_COLUMN))
    cols = [F.col("_xsg_r").getField(f.name).cast(_SPARK_TYPES[f.type]).alias(f.name)
            for f in stream.schema.fields]
    return framed.select(*cols, F.col(SEQ_COLUMN),
                         F.col(FILE_COLUMN).cast("string").alias(FILE_COLUMN),
                         F.col(PUNCT_COLUMN))


def _socket_frame(spark: SparkSession, stream: StreamDefinition) -> DataFrame:
    host = stream.source.option("host", "localhost")
    try:
        port = str(parse_int(stream.source.option("port"), "port", low=1, high=65535))
    except NumberError:
        raise SourceError(f"stream {stream.name!r}: socket source needs a numeric 'port' option"
                          ) from None
    raw = (spark.readStream.format("socket").option("host", host).option("port", port).load())
    parsed = raw.select(F.from_json("value", spark_schema(stream.schema, True)).alias("r"))
    return _shape(parsed.select("r.*"), stream.schema, F.col(f"`{SEQ_COLUMN}`"), None)


# Records one micro-batch of a Kafka stream reads at most (source option maxOffsetsPerTrigger):
# a backlog is read in batches a handle's buffer (10,000 rows) can take, as the file sources'
# maxFilesPerTrigger does.
KAFKA_MAX_OFFSETS = 10_000
# The same when the stream's rows go to plan topics (`delivery = "kafka"`): no buffer holds them,
# and each micro-batch pays a fixed cost (the topic write's job, the figures' job, ~0.3-0.5 s
# here), which 10,000-record batches paid every 10,000 records: a backlog read at half the rate
# of the query a user writes (issue 45, docs/benchmarks.md). A batch of 100,000 still ends within
# a few seconds; below a backlog the 0.25 s trigger reads what came, as before.
KAFKA_TOPICS_MAX_OFFSETS = 100_000
# Records a Spark task's Kafka consumer takes per poll (the client's max.poll.records, 500 by
# default; a stream's own `kafka.max.poll.records` wins). Spark's consumer asks the broker for
# the partition's earliest and latest offsets after every poll (two requests): at 500 records
# that was two round trips per 500 records, 40% of the tasks' samples waiting on them (jstack,
# bench_kafka's backlog) and twice to four times the broker's CPU of polls as large as a fetch
# brings (what a poll returns is still bounded by the fetch sizes: max.partition.fetch.bytes).
KAFKA_POLL_RECORDS = 100_000
# How long a Spark task's fetch may wait at the broker for records that are not there yet (the
# client's fetch.max.wait.ms, 500 by default; a stream's own `kafka.fetch.max.wait.ms` wins).
# A micro-batch's task reads a fixed range that ends at the partition's end when the batch was
# planned, and its consumer fetches ahead: that last fetch, at the log's end, is parked at the
# broker for fetch.max.wait.ms, and the broker answers a connection's requests in order, so the
# task's next offset lookup waits behind it. Every task reading to the end of its partition
# waited 500 ms: 100,000 records over 3 partitions read in 1.28 s, 0.31 s with 10 ms (a batch
# read, alternating, this machine); the tail of one partition's range 0.68 s against 0.18 s.
# Not for real-time mode (its long-running tasks poll as records come; an empty fetch every
# 10 ms per partition would be load for nothing).
KAFKA_FETCH_WAIT_MS = 10


# Spark's Kafka consumer reads `read_uncommitted` unless told: the records of a transaction the
# producer then aborted would be tuples, and an aborted security punctuation would govern the
# records after it (`query/source_shield.py`). Deny when in doubt: only committed records,
# unless the owner set `kafka.isolation.level` at registration (docs/punctuations.md).
KAFKA_ISOLATION = "read_committed"


def kafka_options(stream: StreamDefinition, ranges: bool = False
                  ) -> tuple[str, str, dict[str, str]]:
    """(bootstrap servers, topic, consumer settings) of a Kafka stream's source; the settings
    are the `kafka.*` options without their prefix (Java client names: security, SASL), with
    `isolation.level` `read_committed` unless the owner's options set it. `ranges`: for tasks
    that read fixed offset ranges (micro-batches, batch reads), with `fetch.max.wait.ms`
    KAFKA_FETCH_WAIT_MS unless the owner's options set it."""
    opts = dict(stream.source.options)
    servers = opts.get("bootstrap.servers") or opts.get("kafka.bootstrap.servers")
    if not servers:
        raise SourceError(f"stream {stream.name!r}: kafka source needs 'bootstrap.servers'")
    topic = opts.get("subscribe")
    if not topic:
        raise SourceError(f"stream {stream.name!r}: kafka source needs 'subscribe' (its topic)")
    client = {k[len("kafka."):]: v for k, v in opts.items()
              if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}
    client.setdefault("isolation.level", KAFKA_ISOLATION)
    if ranges:
        client.setdefault("fetch.max.wait.ms", str(KAFKA_FETCH_WAIT_MS))
    return servers, topic, client


def _kafka_frame(spark: SparkSession, stream: StreamDefinition,
                 max_offsets: int = KAFKA_MAX_OFFSETS) -> DataFrame:
    """A Kafka topic's records, each value a JSON object of the stream's attributes.

    A new query starts at the latest offsets (nothing is replayed: the runtime drops a Kafka
    stream's checkpoint when its last handle leaves); a query that stopped with handles attached
    resumes from its checkpoint. Records whose value is not a JSON object are dropped; in an
    object, an attribute that is missing or not of its declared type is null (an object that
    does not parse gives a tuple of nulls, as Spark's from_json does). Order
    (see the module docstring): `_xsg_seq` is null and `_xsg_file` is "<topic>/<partition>/
    <offset>", zero-padded, so that the executor orders a micro-batch by the stream's time
    attribute, then partition, then offset."""
    per_trigger = stream.source.option("maxOffsetsPerTrigger") or str(max_offsets)
    return _kafka_stream_records(spark, stream, per_trigger)


def kafka_realtime_frame(spark: SparkSession, stream: StreamDefinition) -> DataFrame:
    """A Kafka stream's frame for a real-time query (`pep.runtime.query.realtime`): as
    `_kafka_frame`, without a cap per trigger (real-time mode refuses maxOffsetsPerTrigger:
    its tasks read each partition as it comes)."""
    return _cached_frame(spark, ("kafka-realtime", stream),
                         lambda: _kafka_stream_records(spark, stream, None))


def _kafka_stream_records(spark: SparkSession, stream: StreamDefinition,
                          per_trigger: str | None) -> DataFrame:
    servers, topic, client = kafka_options(stream, ranges=per_trigger is not None)
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", servers)
              .option("subscribe", topic).option("startingOffsets", "latest")
              # records that retention removed while the query was stopped are skipped (logged
              # by Spark) rather than failing the stream at every restart
              .option("failOnDataLoss", "false")
              .option("kafka.max.poll.records", str(KAFKA_POLL_RECORDS)))
    if per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", per_trigger)
    for key, value in client.items():
        reader = reader.option(f"kafka.{key}", value)
    return _kafka_records(stream, reader)


def kafka_range_frame(spark: SparkSession, stream: StreamDefinition, assign: str, start: str,
                      end: str) -> DataFrame:
    """A Kafka stream's records of fixed offset ranges, read once (a batch query), shaped as
    its streaming frame: `assign` {topic: [partitions]}, `start` and `end` {topic: {partition:
    offset}} (JSON, as Spark's Kafka source takes them; end exclusive). A record the topic no
    longer holds fails the read rather than be skipped (`sources/replay.py` relies on whole
    ranges)."""
    servers, _, client = kafka_options(stream, ranges=True)
    reader = (spark.read.format("kafka").option("kafka.bootstrap.servers", servers)
              .option("assign", assign).option("startingOffsets", start)
              .option("endingOffsets", end).option("failOnDataLoss", "true")
              .option("kafka.max.poll.records", str(KAFKA_POLL_RECORDS)))
    for key, value in client.items():
        reader = reader.option(f"kafka.{key}", value)
    return _kafka_records(stream, reader)


def _kafka_records(stream: StreamDefinition, reader: Any) -> DataFrame:
    """A Kafka reader's records as the stream's frame (see `_kafka_frame`)."""
    try:
        raw = reader.load()
    except AnalysisException as exc:
        if "kafka" in str(exc).lower() and ("DATA_SOURCE_NOT_FOUND" in str(exc)
                                            or "Failed to find data source" in str(exc)):
            raise KafkaConnectorMissing(
                f"stream {stream.name!r}: Kafka needs Spark's Kafka connector "
                "(org.apache.spark:spark-sql-kafka-0-10_2.13 matching this Spark version) on the "
                "classpath; the pyspark wheel does not include it. "
                f"{kafka_unavailable_reason()}") from None
        raise
    text = F.col("value").cast("string")
    if punctuations.enabled(stream):
        # a record's place in its lane: its partition, then its offset (null past the axis:
        # such a record's segment is unknown, and the shield denies it)
        seq = F.when((F.col("offset") < F.lit(1 << LANE_BITS))
                     & (F.col("partition") < F.lit(1 << (62 - LANE_BITS))),
                     F.shiftleft(F.col("partition").cast("long"), LANE_BITS)
                     + F.col("offset"))
        return _punctuated_records(
            raw.where(F.ltrim(text).startswith("{")).select(
                text.alias("_xsg_text"), seq.alias("_xsg_pos"),
                F.format_string(KAFKA_FILE_FORMAT, F.col("topic"), F.col("partition"),
                                F.col("offset")).alias(FILE_COLUMN)),
            stream, F.col("_xsg_text"), F.col("_xsg_pos"))
    # Only on the text: a filter on the parsed struct would be pushed below the projection and
    # parse every record twice (measured: the rows job 1.3x slower)
    parsed = (raw.where(F.ltrim(text).startswith("{"))
              .select(F.from_json(text, spark_schema(stream.schema)).alias("r"),
                      F.format_string(KAFKA_FILE_FORMAT, F.col("topic"), F.col("partition"),
                                      F.col("offset")).alias(FILE_COLUMN)))
    return _shape(parsed.select("r.*", FILE_COLUMN), stream.schema, None, F.col(FILE_COLUMN))


# Building a source frame costs ~0.1 s of py4j calls and analysis, paid when a stream's query
# starts. A streaming DataFrame is only a description (every query started from it gets its own
# source instance and offsets), so one frame per session and definition serves every restart.
_FRAMES = OwnedCache(maxsize=64)


def _cached_frame(spark: SparkSession, key: tuple[object, ...], build: Callable[[], DataFrame]
                  ) -> DataFrame:
    frame: DataFrame = _FRAMES.get_or_build(spark, key, build)
    return frame


# `archive_dir` value for a directory whose files are the reader's own (a join's feed, see
# `StreamCatalog.open_feed`): committed files are deleted rather than archived.
DELETE_COMMITTED = "<delete committed files>"


def build_source(spark: SparkSession, stream: StreamDefinition,
                 max_files_per_trigger: int | None = 50, archive_dir: str | None = None,
                 max_offsets_per_trigger: int = KAFKA_MAX_OFFSETS) -> DataFrame:
    """The stream's source as a streaming DataFrame (see the module docstring for its shape).

    `max_files_per_trigger` None: no bound (the runtime's skip-to-the-end query);
    `max_offsets_per_trigger`: a Kafka stream's records per micro-batch, unless its definition
    sets its own. `archive_dir`:
    where an `ingest` stream's committed files go (Spark's `cleanSource=archive`), or
    `DELETE_COMMITTED`; the files of a `files` source are the owner's and are never moved. Checks
    run on every call; the frame itself is reused for the same session, definition and
    options."""
    src = stream.source
    kind = src.kind
    if kind == "ingest":
        return _file_frame(spark, stream, src.option("path"), "json", max_files_per_trigger,
                           create=True, archive=archive_dir)
    if kind == "files":
        fmt = (src.option("format") or "json").lower()
        return _file_frame(spark, stream, src.option("path"), fmt, max_files_per_trigger,
                           create=False)
    if kind == "generator":
        gen = (src.option("schema") or "").lower()
        rate_text = src.option("rate", "10") or "10"
        try:
            rate = max(1, round(float(rate_text)))
        except ValueError:
            raise SourceError(f"stream {stream.name!r}: generator rate {rate_text!r} "
                              "is not a number") from None

        def generated() -> DataFrame:
            try:
                df = generator_frame(spark, gen, rate, stream.schema)
            except ValueError as exc:
                raise SourceError(f"stream {stream.name!r}: {exc}") from None
            return _shape(df, stream.schema, F.col(SEQ_COLUMN), None)
        return _cached_frame(spark, ("generator", stream, gen, rate), generated)
    if kind == "socket":
        return _cached_frame(spark, ("socket", stream), lambda: _socket_frame(spark, stream))
    if kind == "kafka":
        return _cached_frame(spark, ("kafka", stream, max_offsets_per_trigger),
                             lambda: _kafka_frame(spark, stream, max_offsets_per_trigger))
    raise SourceError(f"stream {stream.name!r}: unknown source kind {kind!r}")
