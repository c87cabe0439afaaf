"""Spark's Python workers freeze their heap at their first tasks (PySpark collects garbage in
full after every task: 35-40 ms each with numpy, pyarrow and pandas imported); the driver's heap
is left alone."""
from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from pep.runtime.plans.matcher import FROZEN_TASKS, freeze_worker_heap
from pep.runtime.query import rows_job

assert rows_job  # imported for its side effect: the matcher is pickled by value, as the
# runtime ships it to the workers


def test_the_driver_never_freezes():
    before = gc.get_freeze_count()
    assert freeze_worker_heap() is False
    assert gc.get_freeze_count() == before


def worker_facts(spark: Any, facts: Callable[[], dict[str, Any]], ddl: str, tuples: int,
                 partitions: int) -> list[Any]:
    """`facts()` as seen by Spark's Python workers, once per task: a row per tuple with the
    values its task saw (`ddl` names them in `facts`' order)."""
    def probe(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        seen = facts()
        for b in batches:
            yield pa.RecordBatch.from_pydict({k: [v] * b.num_rows for k, v in seen.items()})
    return spark.range(tuples).repartition(partitions).mapInArrow(probe, ddl).collect()


def test_a_worker_freezes_a_bounded_number_of_times_and_collections_skip_the_frozen(spark):
    def facts() -> dict[str, Any]:
        calls = [freeze_worker_heap() for _ in range(FROZEN_TASKS + 1)]
        return {"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()),
                "again": calls[-1]}  # past the first tasks' freezes a process freezes no more

    rows = worker_facts(spark, facts, "frozen long, tracked long, again boolean", 16, 4)
    assert len(rows) == 16
    for r in rows:
        assert r.again is False
        # the imported modules' objects moved out: a collection walks far fewer than before
        assert r.frozen > 10_000 and r.tracked < r.frozen


def test_the_shared_sessions_python_workers_are_reached_over_a_unix_socket(spark):
    """Over TCP each task's input reached its worker ~40 ms late (session.local_python_sockets)."""
    def facts() -> dict[str, Any]:
        import os
        import socket
        # the worker's own connection to the JVM, the socket among its open descriptors
        families = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                s = socket.socket(fileno=int(fd))
            except OSError:
                continue
            families.add(s.family.name)
            s.detach()
        return {"unix": os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", ""),
                "dir": os.environ.get("PYTHON_WORKER_FACTORY_SOCK_DIR", ""),
                "families": ",".join(sorted(families))}

    rows = worker_facts(spark, facts, "unix string, dir string, families string", 4, 2)
    assert {r.unix.lower() for r in rows} == {"true"}
    own = spark.sparkContext.getConf().get("spark.python.unix.domain.socket.dir")
    assert {r.dir for r in rows} == {own}
    assert all("AF_UNIX" in r.families and "AF_INET" not in r.families for r in rows)
