"""Each source kind that can run here delivers rows through the shared query; Kafka fails
clearly."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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
from pep.runtime.sources.frames import KafkaConnectorMissing, SourceError
from pep.runtime.sources.generators import AIS_SCHEMA, SHIP_TYPES, WEATHER_SCHEMA
from tests.pep.runtime.support import Collector, wait_until

SCHEMA = StreamSchema((Field("t", "long"), Field("v", "double"), Field("tag", "string")))


def files_stream(path: Path, fmt: str, *extra: tuple[str, str]) -> StreamDefinition:
    return StreamDefinition(f"f_{fmt}", "owner", SCHEMA,
                            SourceSpec("files", (("path", str(path)), ("format", fmt), *extra)),
                            time_attribute="t")


def test_csv_files_are_ordered_by_time_attribute_for_tuple_windows(runtime, tmp_path):
    src = tmp_path / "csv"
    src.mkdir()
    sink = Collector()
    plan = ExecutionPlan("f_csv", None, (), WindowSpec("tuple", 3, 3, (Aggregate("v", "firstval"),
                                                                      Aggregate("v", "lastval"),
                                                                      Aggregate("tag", "count"))))
    runtime.attach_handle("h", files_stream(src, "csv"), plan, sink)
    # lines deliberately out of time order inside the file: the time attribute orders them
    lines = ["t,v,tag"] + [f"{t},{t * 10.0},x{t}" for t in (3, 1, 2, 6, 5, 4)]
    tmp = src / ".a.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, src / "a.csv")
    assert wait_until(lambda: len(sink.rows) >= 2)
    assert sink.rows == [
        {"window_start": 0, "window_end": 2, "firstval_v": 10.0, "lastval_v": 30.0, "count_tag": 3},
        {"window_start": 3, "window_end": 5, "firstval_v": 40.0, "lastval_v": 60.0, "count_tag": 3},
    ]


def test_parquet_files_deliver_filtered_projected_rows(runtime, tmp_path):
    src = tmp_path / "pq"
    src.mkdir()
    sink = Collector()
    plan = ExecutionPlan("f_parquet", ((Predicate("tag", "=", "b"),),), ("t", "tag"))
    runtime.attach_handle(
        "h", files_stream(src, "parquet", ("maxFilesPerTrigger", "1")), plan, sink
    )
    table = pa.table({"t": pa.array([1, 2, 3, 4], pa.int64()), "v": [0.5, 1.5, None, 2.5],
                      "tag": ["a", "b", "b", None]})
    pq.write_table(table, src / ".x.tmp")
    os.replace(src / ".x.tmp", src / "x.parquet")
    assert wait_until(lambda: len(sink.rows) >= 2)
    assert sink.rows == [{"t": 2, "tag": "b"}, {"t": 3, "tag": "b"}]
    with pytest.raises(SourceError, match="maxFilesPerTrigger must be a positive integer"):
        runtime.attach_handle("bad", files_stream(src, "json", ("maxFilesPerTrigger", "0")),
                       ExecutionPlan("f_json", None, ("t",)), Collector())


def test_missing_files_directory_is_a_clear_error(runtime, tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        runtime.attach_handle("h", files_stream(tmp_path / "nope", "json"),
                       ExecutionPlan("f_json", None, ("t",)), Collector())
    assert runtime.handles() == {} and runtime.stats() == {}


def test_generators_produce_weather_and_ais_tuples(runtime):
    weather = StreamDefinition("weather", "nea", WEATHER_SCHEMA,
                               SourceSpec("generator", (("schema", "weather"), ("rate", "40"))),
                               time_attribute="samplingtime")
    ais = StreamDefinition("ships", "port", AIS_SCHEMA,
                           SourceSpec("generator", (("schema", "ais"), ("rate", "40"))),
                           time_attribute="ts")
    w, s = Collector(), Collector()
    runtime.attach_handle("w", weather, ExecutionPlan(
        "weather", ((Predicate("humidity", ">=", 0), Predicate("winddirection", "<", 360)),),
        ("samplingtime", "temperature", "winddirection")), w)
    runtime.attach_handle("s", ais, ExecutionPlan(
        "ships", ((Predicate("shiptype", "=", "cargo"),),),
        ("mmsi", "shipname", "shiptype", "speed")), s)
    assert wait_until(lambda: len(w.rows) >= 5 and len(s.rows) >= 2)
    assert set(w.rows[0]) == {"samplingtime", "temperature", "winddirection"}
    assert all(isinstance(r["temperature"], float) and 0 <= r["winddirection"] < 360
               and r["samplingtime"].endswith("Z") for r in w.rows)
    assert all(r["shiptype"] == "cargo" and r["shiptype"] in SHIP_TYPES
               and r["shipname"].startswith("VESSEL-") for r in s.rows)
    assert len(runtime.stats()) == 2


def test_unknown_generator_attribute_is_a_clear_error(runtime):
    bad = StreamDefinition("g", "o", StreamSchema((Field("pressure", "double"),)),
                           SourceSpec("generator", (("schema", "weather"), ("rate", "5"))))
    with pytest.raises(SourceError, match="no attribute 'pressure'"):
        runtime.attach_handle("h", bad, ExecutionPlan("g", None, ("pressure",)), Collector())


def test_socket_source_delivers_json_lines(runtime):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]

    def serve():
        conn, _ = server.accept()
        with conn:
            for i in range(10):
                line = {"t": i, "v": i / 2, "tag": "s", "_xsg_seq": i}  # the socket source
                conn.sendall((json.dumps(line) + "\n").encode())  # spreads lines round-robin
            threading.Event().wait(8)  # keep the connection open while the query reads

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    sd = StreamDefinition("sock", "o", SCHEMA,
                          SourceSpec("socket", (("host", "127.0.0.1"), ("port", str(port)))))
    sink = Collector()
    runtime.attach_handle(
        "h", sd, ExecutionPlan("sock", ((Predicate("v", ">=", 2),),), ("t",)), sink
    )
    assert wait_until(lambda: len(sink.rows) >= 6)
    assert sink.rows == [{"t": i} for i in range(4, 10)]
    runtime.detach("h")
    server.close()


def test_kafka_without_connector_says_so(runtime, spark):
    if "spark-sql-kafka" in spark.conf.get("spark.jars", ""):
        pytest.skip("Spark's Kafka connector is on the classpath (tests/kafka run Kafka)")
    sd = StreamDefinition("k", "o", SCHEMA, SourceSpec(
        "kafka", (("bootstrap.servers", "127.0.0.1:9"), ("subscribe", "topic"))))
    with pytest.raises(KafkaConnectorMissing, match="Kafka connector.*not include it"):
        runtime.attach_handle("h", sd, ExecutionPlan("k", None, ("t",)), Collector())
    assert runtime.handles() == {} and runtime.stats() == {}


def test_failed_query_is_reported_and_next_attach_restarts_it_with_old_handles(runtime, tmp_path):
    src = tmp_path / "bad"
    src.mkdir()
    sd = files_stream(src, "parquet")
    first = Collector()
    runtime.attach_handle("first", sd, ExecutionPlan("f_parquet", None, ("t",)), first)
    # a file whose `v` is text cannot be read with the declared schema: the query fails
    pq.write_table(pa.table({"t": pa.array([1], pa.int64()), "v": ["x"], "tag": ["a"]}),
                   src / ".bad.tmp")
    os.replace(src / ".bad.tmp", src / "bad.parquet")
    assert wait_until(lambda: not runtime.stats()["f_parquet"]["active"])
    assert runtime.stats()["f_parquet"]["last_error"]
    health = runtime.health()["f_parquet"]
    assert health["state"] == "failed" and health["last_error"]
    os.remove(src / "bad.parquet")
    second = Collector()
    runtime.attach_handle("second", sd, ExecutionPlan("f_parquet", None, ("t",)), second)
    assert runtime.stats()["f_parquet"]["active"] and set(runtime.handles()) == {"first", "second"}
    pq.write_table(pa.table({"t": pa.array([7], pa.int64()), "v": [1.0], "tag": ["a"]}),
                   src / ".ok.tmp")
    os.replace(src / ".ok.tmp", src / "ok.parquet")
    assert wait_until(lambda: first.rows == [{"t": 7}] and second.rows == [{"t": 7}])
