"""Spark's Python workers are started with the session (`pep/runtime/python_workers.py`): after
the warm-up job, the Python daemon Spark forks its workers from has workers waiting; and the
job's functions run where xsg cannot be imported (a cluster's workers)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from pep.runtime import python_workers
from pep.runtime.delivery import worker_rows


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(entry.name))
    return out


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_the_warm_up_leaves_python_workers_waiting(spark):
    assert python_workers.warm_python_workers(spark) > 0
    children = _children()
    below, seen = [os.getpid()], []
    while below:  # this process's descendants: the JVM, its Python daemon, the workers
        pid = below.pop()
        seen.append(pid)
        below += children.get(pid, [])
    def daemon(pid: int) -> bool:  # Spark's, or the gateway's quiet one (`quiet_daemon`)
        return any(m in _cmdline(pid) for m in ("pyspark.daemon", "pep.runtime.quiet_daemon"))

    daemons = [p for p in seen if daemon(p)
               and not any(daemon(q) for q in seen if p in children.get(q, []))]
    assert daemons, "no Python daemon under this process's JVM"
    workers = [c for d in daemons for c in children.get(d, [])]
    assert workers, "no Python worker waiting after the warm-up"


RUN = """
import pickle, sys
sys.modules["pep"] = None  # no xsg here: any import of it fails
routed, numbering, batch = pickle.loads(sys.stdin.buffer.read())
out = list(numbering(iter(list(routed(iter([batch]))))))
print(sum(b.num_rows for b in out))
"""


def test_the_warm_up_functions_run_where_pep_cannot_be_imported():
    table = worker_rows.route_table([(1, ("warm#0",), 0), (2, ("warm#1",), 0),
                                     (3, ("warm#0", "warm#1"), 0)])
    numbering = worker_rows.numbered_records(worker_rows.list_pairs("pids"), ["x"], ["x"],
                                             table, ("topic", "projection", "i", "value"))
    batch = pa.RecordBatch.from_pydict({"x": list(range(10))})
    here = sum(b.num_rows for b in numbering(iter(list(python_workers._routed(iter([batch]))))))
    assert here == 25  # each tuple to plan 1 and to plan 2 or 3 (3: two topics)
    run = subprocess.run([sys.executable, "-c", RUN], capture_output=True, timeout=120,
                         input=cloudpickle.dumps((python_workers._routed, numbering, batch)))
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    assert int(run.stdout) == here
