"""The runtime's fast paths keep their results: expressions and source frames built once and
reused, only the columns the plans output come back to the driver, timestamps formatted as
before."""
from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
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

SCHEMA = StreamSchema((Field("ts", "timestamp"), Field("temp", "double"), Field("hum", "long"),
                       Field("station", "string"), Field("ok", "boolean")))


def definition(tmp_path, name="lean", kind="ingest"):
    return StreamDefinition(name, "nea", SCHEMA,
                            SourceSpec(kind, (("path", str(tmp_path / name)),)),
                            time_attribute="ts")


def test_iso_text_matches_strftime_on_edge_values():
    from pep.runtime.base.encode import ISO_TEXT, iso_text as _iso_text
    micros = [0, -1, 1, 1_714_564_800_123_456, -62_135_596_800_000_000,
              253_402_300_799_999_999, None]
    column = pa.chunked_array([pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC"))])
    expected = pc.strftime(column.cast(pa.timestamp("us")), format=ISO_TEXT)
    got = _iso_text(column)
    assert got.to_pylist() == expected.to_pylist()
    assert got[3].as_py() == "2024-05-01T12:00:00.123456Z"


def test_filter_expressions_are_built_once_per_schema(spark):
    from pep.runtime.plans.plan_expressions import filter_expressions
    first = filter_expressions(SCHEMA)
    again = filter_expressions(StreamSchema(SCHEMA.fields))
    assert all(a is b for a, b in zip(first, again, strict=True))
    other = filter_expressions(StreamSchema(SCHEMA.fields[:2]))
    assert other[0] is not first[0] and other[2] is first[2]  # the match expression is generic


def test_source_frame_reused_but_checks_still_run(spark, tmp_path):
    from pep.runtime.sources.frames import SourceError, build_source
    sd = definition(tmp_path)
    frame = build_source(spark, sd, 7)
    assert build_source(spark, sd, 7) is frame
    assert build_source(spark, sd, 8) is not frame  # other reader options: another frame
    files = definition(tmp_path, "gone", kind="files")
    (tmp_path / "gone").mkdir()
    assert build_source(spark, files, 7) is build_source(spark, files, 7)
    (tmp_path / "gone").rmdir()
    with pytest.raises(SourceError, match="does not exist"):
        build_source(spark, files, 7)


def test_only_the_columns_the_plans_output_come_back(spark, tmp_path):
    from pep.runtime.base.columns import PIDS_COLUMN
    from pep.runtime.plans.compile import compile_plan
    from pep.runtime.query.executor import StreamExecutor
    from pep.runtime.sources.frames import SEQ_COLUMN
    ex = StreamExecutor(spark, definition(tmp_path), tmp_path, 0.25, 2, 0.0, lambda h: None)
    batch = spark.createDataFrame(
        [(datetime.fromtimestamp(i, UTC), i * 1.5, i, f"s{i % 3}", i % 2 == 0, i, None)
         for i in range(12)],
        "ts timestamp, temp double, hum long, station string, ok boolean, _xsg_seq long, "
        "_xsg_file string")

    def attach(handle, plan):
        ex.handles.add_handle(handle, compile_plan(plan, SCHEMA, "ts"), lambda rows: True)
        plans, version = ex.registry.current()
        shape = ex.table.shape_of(plans, version)
        _, scalar = ex.table.plan_table(plans, version, shape)
        return shape, scalar

    # filters on `station` and `ok` but projects `hum`: the filter reads them in Spark only,
    # and only the tuples that pass come back
    shape, scalar = attach("a", ExecutionPlan(
        "lean", ((Predicate("station", "=", "s1"), Predicate("ok", "=", True)),), ("hum",)))
    arrow = ex.rows.rows_frame(batch, scalar, shape).toArrow()
    assert arrow.column_names == ["hum", SEQ_COLUMN, PIDS_COLUMN]  # ingest: _xsg_seq orders
    assert arrow.column("hum").to_pylist() == [i for i in range(12) if i % 3 == 1 and i % 2 == 0]
    # a window with wide panes adds nothing to the rows: its tuples become panes in Spark
    shape, scalar = attach("b", ExecutionPlan(
        "lean", None, ("temp",), WindowSpec("tuple", 8, 8, (Aggregate("temp", "avg"),))))
    assert shape.plain_columns == ("hum",) and shape.tuple_windows
    assert shape.slots == (("d0", "d", frozenset({"c", "s"})),)
    panes = ex.panes.panes_frame(batch, scalar, shape).toArrow()
    assert panes.num_rows == 2  # 12 tuples, panes of 8
    assert sorted(panes.column("rows").to_pylist()) == [4, 8]
    # a tuple window with narrow panes (here 2) reads its tuples from the rows
    shape, _ = attach("c", ExecutionPlan(
        "lean", None, (), WindowSpec("tuple", 4, 2, (Aggregate("ok", "max"),))))
    assert shape.plain_columns == ("hum", "ok")
    ex.handles.remove_handle("a")
    ex.handles.remove_handle("c")
    plans, version = ex.registry.current()
    assert ex.table.shape_of(plans, version).plain_columns == ()


def test_the_spatial_branch_is_in_the_filter_only_when_a_plan_needs_it(spark):
    """Spark evaluates the plan-table lambdas per row and plan without compiling them: the
    spatial branch (haversine, polygon) made 1,000 plain plans about 20 times slower."""
    from pep.runtime.plans.plan_expressions import matched_plans_column
    from pep.runtime.plans.plan_schema import ROW_KINDS
    plain = str(matched_plans_column(ROW_KINDS))
    spatial = str(matched_plans_column(ROW_KINDS, spatial=True))
    assert "ASIN" not in plain.upper() and "RADIANS" not in plain.upper()
    assert "ASIN" in spatial.upper() and "RADIANS" in spatial.upper()
