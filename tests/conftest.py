"""Suite-wide fixtures. Spark is started at most once per run (a cold session costs seconds),
and only when a test asks for it: the pure-Python tests never start a JVM."""
from __future__ import annotations

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "standalone: starts a Spark standalone master and worker (about 30-60 s)")


@pytest.fixture(scope="session")
def spark():
    from pep.runtime.session import create_spark_session
    session = create_spark_session("local[2]", "xsg-tests", {"spark.sql.shuffle.partitions": "2"})
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()
