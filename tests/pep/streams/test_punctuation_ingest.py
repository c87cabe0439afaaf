"""Punctuation records on ingest (`pep.streams.ingest`, `pep.streams.records`): refused on a
stream whose owner did not enable them, checked whole before anything is written, and kept in
the stream's log (never in its data files) with the position of the first tuple they precede."""
from __future__ import annotations

import json
import os

import pytest

from pep.core.punctuations import LOG_NAME, PunctuationError
from pep.streams.catalog import StreamCatalog
from pep.streams.definition import InvalidStream
from pep.streams.records import RecordError

FIELDS = [{"name": "patient", "type": "long"}, {"name": "hr", "type": "double"}]
SP = {"$punctuation": {"srp": ["doctor"], "ts": 1}}


def body(*records):
    return "\n".join(json.dumps(r) for r in records).encode()


@pytest.fixture
def catalog(tmp_path):
    c = StreamCatalog(tmp_path / "streams.db", tmp_path / "data")
    c.register("on", "o", FIELDS, {"kind": "ingest", "punctuations": "on"})
    c.register("off", "o", FIELDS, {"kind": "ingest"})
    yield c
    c.close()


def data_files(catalog, name):
    return sorted(f for f in os.listdir(catalog.ingest_dir(name)) if not f.startswith("."))


def test_a_punctuation_on_a_stream_without_them_is_refused_with_its_line(catalog):
    with pytest.raises(RecordError) as err:
        catalog.append_records("off", body({"patient": 1, "hr": 2.0}, SP))
    assert "line 2" in str(err.value) and "punctuations are off" in str(err.value)
    assert data_files(catalog, "off") == []


def test_a_bad_punctuation_refuses_the_whole_batch(catalog):
    bad = {"$punctuation": {"srp": ["doctor"], "ts": 1, "ddp": {"attributes": ["pulse"]}}}
    with pytest.raises(PunctuationError) as err:  # an InvalidInput: 400
        catalog.append_records("on", body(SP, {"patient": 1, "hr": 2.0}, bad))
    assert str(err.value).startswith("line 3: $punctuation: ddp.attributes: 'pulse'")
    with pytest.raises(RecordError, match="line 1: a punctuation record holds nothing but"):
        catalog.append_records("on", body({"$punctuation": SP["$punctuation"], "patient": 1}))
    assert data_files(catalog, "on") == []
    assert not (catalog.ingest_dir("on") / LOG_NAME).exists()


def test_punctuations_go_to_the_log_with_the_position_they_precede(catalog):
    later = {"$punctuation": {"srp": ["nurse"], "ts": 2, "sign": "-"}}
    assert catalog.append_records("on", body({"patient": 1, "hr": 1.0}, SP,
                                             {"patient": 2, "hr": 2.0}, later)) == 2
    assert catalog.append_records("on", body(later)) == 0  # punctuations only: no tuple
    assert catalog.append_records("on", body({"patient": 3, "hr": 3.0})) == 1
    log = [json.loads(x) for x in (catalog.ingest_dir("on") / LOG_NAME).read_text().split()]
    assert [(e["at"], e["sp"]["srp"], e["sp"]["sign"]) for e in log] == [
        (2, ["doctor"], "+"), (3, ["nurse"], "-"), (3, ["nurse"], "-")]
    rows = [json.loads(x) for f in data_files(catalog, "on")
            for x in (catalog.ingest_dir("on") / f).read_text().split()]
    assert rows == [{"patient": 1, "hr": 1.0, "_xsg_seq": 1}, {"patient": 2, "hr": 2.0,
                                                               "_xsg_seq": 2},
                    {"patient": 3, "hr": 3.0, "_xsg_seq": 3}]


def test_the_setting_is_on_or_off_on_ingest_files_and_kafka_streams(catalog, tmp_path):
    with pytest.raises(InvalidStream, match='must be "on" or "off"'):
        catalog.register("x", "o", FIELDS, {"kind": "ingest", "punctuations": "yes"})
    with pytest.raises(InvalidStream, match='must be "on" or "off"'):
        catalog.register("x", "o", FIELDS, {"kind": "files", "path": str(tmp_path),
                                            "punctuations": "yes"}, trusted=True)
    with pytest.raises(InvalidStream, match="supported on ingest, files"):
        catalog.register("y", "o", FIELDS, {"kind": "generator", "schema": "sensors",
                                            "punctuations": "on"}, trusted=True)
    # a punctuation is a JSON line: CSV and Parquet files cannot carry one
    with pytest.raises(InvalidStream, match="punctuations need format json"):
        catalog.register("y", "o", FIELDS, {"kind": "files", "path": str(tmp_path),
                                            "format": "csv", "punctuations": "on"},
                         trusted=True)
    # (main refused both: "supported on ingest streams only")
    files = catalog.register("f", "o", FIELDS, {"kind": "files", "path": str(tmp_path),
                                                "punctuations": "on"}, trusted=True)
    kafka = catalog.register("k", "o", FIELDS, {"kind": "kafka", "bootstrap.servers": "h:9",
                                                "subscribe": "t", "punctuations": "on"},
                             trusted=True)
    assert [d.source.option("punctuations") for d in (files, kafka)] == ["on", "on"]


def test_a_punctuation_appended_through_the_gateway_to_a_kafka_stream_is_refused(catalog):
    """The gateway's producer spreads records over the partitions, and a punctuation holds in
    its own partition only: its owner sends it to the topic itself (nothing is sent)."""
    catalog.register("k", "o", FIELDS, {"kind": "kafka", "bootstrap.servers": "127.0.0.1:9",
                                        "subscribe": "t", "punctuations": "on"}, trusted=True)
    with pytest.raises(RecordError) as err:
        catalog.append_records("k", body({"patient": 1, "hr": 2.0}, SP))
    assert "line 2" in str(err.value) and "each partition" in str(err.value)


@pytest.mark.timeout(30)
def test_a_kafka_stream_reads_committed_records_unless_its_owner_says_otherwise(catalog):
    """Records of an aborted transaction (a punctuation among them) are no records of the
    stream: Spark's consumer reads `read_committed` unless the registration set it."""
    from pep.runtime.sources.frames import kafka_options
    source = {"kind": "kafka", "bootstrap.servers": "h:9", "subscribe": "t",
              "punctuations": "on"}
    plain = catalog.register("k1", "o", FIELDS, source, trusted=True)
    assert kafka_options(plain)[2]["isolation.level"] == "read_committed"
    loose = catalog.register("k2", "o", FIELDS, {**source, "kafka.isolation.level":
                                                 "read_uncommitted"}, trusted=True)
    assert kafka_options(loose)[2]["isolation.level"] == "read_uncommitted"
    # tasks of fixed ranges (micro-batches, batch reads) fetch with a short wait at the broker
    # (frames.KAFKA_FETCH_WAIT_MS says why); real-time mode's long-running tasks keep Kafka's
    assert kafka_options(plain, ranges=True)[2]["fetch.max.wait.ms"] == "10"
    assert "fetch.max.wait.ms" not in kafka_options(plain)[2]
    waits = catalog.register("k4", "o", FIELDS, {**source, "kafka.fetch.max.wait.ms": "100"},
                             trusted=True)
    assert kafka_options(waits, ranges=True)[2]["fetch.max.wait.ms"] == "100"
    with pytest.raises(InvalidStream, match="kafka.isolation.level must be"):
        catalog.register("k3", "o", FIELDS, {**source, "kafka.isolation.level": "committed"},
                         trusted=True)
