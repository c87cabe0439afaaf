"""The grouped matcher runs on Spark's workers, which need not have xsg installed: its module
(`pep/runtime/plans/matcher.py`) is pickled by value (the rows job, `query/rows_job.py`,
registers it), so the function a task unpickles carries the driver's own code. Checked where it
counts: in a Python that cannot import `pep` at all, the unpickled function admits what it
admits on the driver."""
from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
from pyspark import cloudpickle

from pep.core.plan import ExecutionPlan, Field, Predicate, StreamSchema
from pep.runtime.plans.compile import compile_plan
from pep.runtime.plans.matcher import GroupedMatcher, admitted_rows, value_column
from pep.runtime.query import rows_job

assert rows_job  # imported for its side effect: plans/matcher.py is pickled by value

SCHEMA = StreamSchema((Field("x", "double"), Field("s", "string")))
RUN = """
import pickle, sys
sys.modules["pep"] = None  # no xsg here: any import of it fails
fn, batch = pickle.loads(sys.stdin.buffer.read())
out = list(fn(iter([batch])))
sink = __import__("pyarrow").BufferOutputStream()
with __import__("pyarrow").ipc.new_stream(sink, out[0].schema) as writer:
    for b in out:
        writer.write_batch(b)
sys.stdout.buffer.write(sink.getvalue().to_pybytes())
"""


def test_the_grouped_matchers_function_runs_where_pep_cannot_be_imported():
    plans = [(i + 1, compile_plan(ExecutionPlan(
        "s", ((Predicate("x", ">", float(i)), Predicate("s", "!=", f"s{i % 3}")),), ("x",)),
        SCHEMA)) for i in range(12)]
    grouped = GroupedMatcher.build(plans)
    assert grouped is not None
    fn = admitted_rows(grouped, "_xsg_seq", ["x", "_xsg_seq"], "_xsg_pbits",
                       ("_xsg_read", "_xsg_top"))
    xs = [float(i % 15) if i % 7 else None for i in range(40)]
    texts = [f"s{i % 4}" for i in range(40)]
    columns = {"x": xs, "_xsg_seq": list(range(40))}
    for attribute, family in grouped.columns:
        columns[value_column(attribute, family)] = xs if attribute == 1 else texts
    batch = pa.RecordBatch.from_pydict(columns)
    here = pa.Table.from_batches(list(fn(iter([batch]))))
    assert 0 < here.num_rows - 1 < 40  # some tuples admitted, some not, and the figures row

    run = subprocess.run([sys.executable, "-c", RUN], input=cloudpickle.dumps((fn, batch)),
                         capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    there = pa.ipc.open_stream(run.stdout).read_all()
    assert there.equals(here)
