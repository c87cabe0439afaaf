"""The client (client/src, its examples) passes mypy --strict, with its own settings
(client/pyproject.toml's [tool.mypy]), as the gateway's strict modules do (tests/test_types.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.client.conftest import CLIENT

pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")


@pytest.mark.timeout(300)
def test_the_client_passes_mypy_strict():
    run = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(CLIENT.parent /
                          ".mypy_cache" / "client")], cwd=CLIENT, capture_output=True,
                         text=True, timeout=270)
    report = (run.stdout + run.stderr).strip()
    assert run.returncode == 0, f"mypy found errors:\n{report}"
    assert "Success: no issues found" in run.stdout, report
