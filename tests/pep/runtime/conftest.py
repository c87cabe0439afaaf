"""Fixtures of the runtime tests; the one SparkSession comes from tests/conftest.py."""
from __future__ import annotations

import pytest


@pytest.fixture
def runtime(spark, tmp_path):
    from pep.runtime.runtime import StreamRuntime
    rt = StreamRuntime(spark, tmp_path / "work", trigger_interval=0.25, max_files_per_trigger=2)
    yield rt
    rt.stop()
