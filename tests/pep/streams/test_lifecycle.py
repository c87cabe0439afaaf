"""The catalogue's share of a stream's life (no HTTP, no Spark): schemas that may only grow,
attributes added after registration that records may leave out, settings that persist, a
deletion that hides the stream at once and lets its name go to its former owner only, the
policies that name an attribute, and the deleted files' keeping time."""
from __future__ import annotations

import json
import threading
import time

import pytest

from pep.core.plan import Field, SourceSpec, StreamDefinition, StreamSchema
from pep.streams.catalog import StreamCatalog
from pep.streams.definition import (
    InvalidStream,
    SchemaChange,
    StreamConflict,
    StreamNotFound,
    extend_schema,
    parse_keep_data,
    parse_stream_patch,
)
from pep.streams.lifecycle import StreamLifecycle
from pep.streams.policy_check import policies_naming
from pep.streams.records import RecordError, validate_records

SCHEMA = [{"name": "ts", "type": "timestamp"}, {"name": "v", "type": "double"}]


@pytest.fixture
def catalog(tmp_path, storage):
    """A catalogue on each database (`storage`: tests/conftest.py)."""
    c = StreamCatalog(storage.database("streams"), tmp_path / "d")
    yield c
    c.close()


def definition(kind: str = "ingest") -> StreamDefinition:
    schema = StreamSchema((Field("ts", "timestamp"), Field("v", "double")))
    return StreamDefinition("g", "o", schema, SourceSpec(kind), "ts")


def test_a_schema_may_only_grow():
    d = definition()
    grown = extend_schema(
        d, parse_stream_patch(b'{"add_attributes": [{"name": "w", "type": "long"}]}')
    )
    assert grown.names == ("ts", "v", "w")
    same = parse_stream_patch(json.dumps({"schema": SCHEMA}).encode())
    assert extend_schema(d, same) is None and extend_schema(d, {"lateness": 1.0}) is None
    for schema, fragment, attributes in (
            ([SCHEMA[0]], "removes v", ("v",)),
            ([SCHEMA[0], {"name": "v", "type": "long"}], "retypes v", ("v",)),
            ([SCHEMA[0], {"name": "V", "type": "double"}], "renames or retypes v", ("v",)),
            ([SCHEMA[1], SCHEMA[0]], "keep their order", ())):
        with pytest.raises(SchemaChange) as caught:
            extend_schema(d, parse_stream_patch(json.dumps({"schema": schema}).encode()))
        assert fragment in caught.value.message and caught.value.attributes == attributes
    with pytest.raises(InvalidStream, match="'ingest' streams only"):
        extend_schema(definition("generator"),
                      {"add_attributes": (Field("w", "long"),)})
    with pytest.raises(InvalidStream, match="has it already"):
        extend_schema(d, {"add_attributes": (Field("TS", "long"),)})
    for text, fragment in ((b'{"add_attributes": {"name": "w"}}', "non-empty list"),
                           (b'{"lateness": true}', "got a boolean"),
                           (b'{"retention": -0.5}', "retention must be")):
        with pytest.raises(InvalidStream, match=fragment):
            parse_stream_patch(text)
    assert parse_keep_data(None) == 0 and parse_keep_data("90") == 90
    for bad in ("nan", "inf", "-1", "x"):
        with pytest.raises(InvalidStream, match="keep_data"):
            parse_keep_data(bad)


def test_added_attributes_and_settings_persist_and_records_may_leave_the_added_out(tmp_path,
                                                                                  storage):
    c = StreamCatalog(storage.database("streams"), tmp_path / "d")
    c.register("g", "o", SCHEMA, time_attribute="ts", description="first", lateness=2)
    before = c.get("g")
    c.update("g", parse_stream_patch(b'{"add_attributes": [{"name": "w", "type": "long"}],'
                                     b' "retention": 60, "lateness": null}'), by="o")
    after = c.get("g")  # the cache of definitions forgot the old one
    assert before.schema.names == ("ts", "v") and after.schema.names == ("ts", "v", "w")
    assert (before.lateness, after.lateness) == (2.0, None)
    c.close()
    c = StreamCatalog(storage.database("streams"), tmp_path / "d")
    try:
        e = c.entry("G")
        assert e.optional == ("w",) and e.retention == 60 and e.description == "first"
        assert c.append_records("g", b'{"ts": 0, "v": 1}\n{"ts": 1, "v": 2, "w": 3}\n') == 2
        with pytest.raises(RecordError, match="missing required field"):
            c.append_records("g", b'{"ts": 0, "w": 1}\n')
    finally:
        c.close()
    schema = StreamSchema((Field("a", "long"), Field("b", "long")))
    assert validate_records(schema, b'{"a": 1}\n', optional=frozenset({"b"})) == [
        {"a": 1, "b": None}]


def test_a_deletion_hides_the_stream_at_once_and_keeps_its_name_for_its_owner(catalog, tmp_path):
    catalog.register("g", "o", SCHEMA, visibility="restricted")
    assert catalog.append_records("g", b'{"ts": 0, "v": 1}\n') == 1
    entry = catalog.begin_delete("G")
    assert entry.definition.name == "g"
    assert catalog.get("g") is None and catalog.entry("g") is None and catalog.all() == []
    with pytest.raises(StreamNotFound):
        catalog.append_records("g", b'{"ts": 0, "v": 1}\n')
    with pytest.raises(StreamConflict, match="already exists"):
        catalog.register("g", "o", SCHEMA)
    catalog.abort_delete("g")  # a failed deletion: the stream is back as it was
    assert catalog.get("g") is not None and catalog.visibility("g") == "restricted"
    catalog.begin_delete("g")
    moved = catalog.finish_delete("g", "o", tmp_path / "held" / "streams")
    assert moved == tmp_path / "held" / "streams"
    assert list((moved / "ingest").glob("*.json")) and not catalog.stream_dir("g").exists()
    assert catalog.visibility("g") is None
    gone = catalog.deleted("G")
    assert (gone.name, gone.owner, gone.deleted_by) == ("g", "o", "o")
    with pytest.raises(StreamConflict, match="reserved to its former owner"):
        catalog.register("g", "someone", SCHEMA)
    again = catalog.register("g", "o", SCHEMA[:1])  # its former owner may
    assert again.schema.names == ("ts",) and catalog.deleted("g") is None
    assert catalog.position("g") == 0  # a new stream: a new counter, an empty directory
    assert list(catalog.ingest_dir("g").iterdir()) == []
    catalog.begin_delete("g")
    catalog.finish_delete("g", "root", None)
    assert catalog.register("g", "root", SCHEMA, trusted=True).owner == "root"  # an admin may


def test_an_append_under_way_finishes_before_the_directory_moves(catalog, tmp_path):
    catalog.register("g", "o", SCHEMA)
    lock = catalog._ingest_lock("g")
    outcome: list = []
    with lock:  # an append holds the lock: the deletion waits for it
        t = threading.Thread(target=lambda: outcome.append(
            catalog.finish_delete("g", "o", tmp_path / "held")))
        t.start()
        time.sleep(0.2)
        assert outcome == [] and catalog.stream_dir("g").exists()
    t.join(5)
    assert outcome == [tmp_path / "held"] and not catalog.stream_dir("g").exists()


POLICY = b"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="p"
  Version="1" RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
  <Target/><Rule RuleId="r" Effect="Permit"><ObligationExpressions>
  <ObligationExpression ObligationId="exacml:obligation:stream-filter" FulfillOn="Permit">
    <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-filter-condition-id">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">v &gt; 1</AttributeValue>
    </AttributeAssignmentExpression></ObligationExpression></ObligationExpressions></Rule>
</Policy>"""  # noqa: E501 - the tests read findings' line numbers: the document keeps its lines


def test_the_policies_that_name_an_attribute_are_found():
    d = definition()
    found = policies_naming(d, ["v", "ts", "nope"], [("p", POLICY, None), ("q", POLICY,
                                                                           frozenset({"x"}))])
    assert list(found) == ["p"] and [a for a, _ in found["p"]] == ["v"]
    assert found["p"][0][1] == 4  # the line of its obligation


def test_kept_files_go_when_their_time_is_over(tmp_path):
    held = tmp_path / "deleted"
    for name, until in (("a", time.time() - 1), ("b", time.time() + 3600)):
        (held / name).mkdir(parents=True)
        (held / name / "deleted.json").write_text(json.dumps({
            "keep_until": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(until))}))
    (held / "stray").mkdir()  # not a deletion's: left alone
    lifecycle = StreamLifecycle(catalog=None, deleted_dir=held)  # type: ignore[arg-type]
    assert lifecycle.sweep_kept(every=0) == 1
    assert sorted(p.name for p in held.iterdir()) == ["b", "stray"]
    assert lifecycle.sweep_kept(every=60) == 0  # at most once a minute


def test_a_change_whose_commit_fails_changes_nothing_in_memory_either(catalog, monkeypatch):
    """The store is lost as the change commits: the stream keeps its combining mode and its
    visibility (which decisions read from memory), as its row does, and a registration leaves
    no stream behind."""
    from contextlib import contextmanager

    from common.db import StoreUnavailable

    catalog.register("g", "o", SCHEMA, time_attribute="ts")
    real = catalog._db.transaction

    @contextmanager
    def lost_at_commit():
        with real() as cur:
            yield cur
            raise StoreUnavailable("the store cannot be reached, nothing was changed: lost")

    monkeypatch.setattr(catalog._db, "transaction", lost_at_commit)
    with pytest.raises(StoreUnavailable):
        catalog.update("g", {"combining": "union", "visibility": "restricted"}, by="o")
    with pytest.raises(StoreUnavailable):
        catalog.register("h", "o", SCHEMA, time_attribute="ts", visibility="restricted")
    monkeypatch.undo()
    assert catalog.combining("g") is None and catalog.visibility("g") == "listed"
    assert catalog.entry("g").combining is None and catalog.entry("g").visibility == "listed"
    assert catalog.visibility("h") is None and catalog.get("h") is None
    catalog.update("g", {"combining": "union"}, by="o")  # and it works once the store is back
    assert catalog.combining("g") == "union"
