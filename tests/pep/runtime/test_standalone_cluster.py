"""The same runtime path on a real Spark standalone master and worker (started from pyspark)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import free_port

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "deploy" / "standalone-cluster.sh"


@pytest.mark.standalone
def test_runtime_on_standalone_master_and_worker(tmp_path):
    env = dict(os.environ, XSG_PYTHON=sys.executable, XSG_CLUSTER_DIR=str(tmp_path / "cluster"),
               XSG_MASTER_PORT=str(free_port()), XSG_MASTER_UI_PORT=str(free_port()),
               XSG_WORKER_UI_PORT=str(free_port()), XSG_WORKER_MEMORY="1g",
               XSG_WORKER_CORES="1", PYSPARK_PYTHON=sys.executable)
    master = f"spark://127.0.0.1:{env['XSG_MASTER_PORT']}"
    try:
        up = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True,
                            timeout=120)
        if up.returncode != 0:
            pytest.skip(f"standalone cluster could not start here: {up.stderr.strip()[-500:]}")
        probe = subprocess.run([sys.executable, "-m", "tests.pep.runtime.standalone_probe", master,
                                str(tmp_path / "driver")], env=env, cwd=ROOT,
                               capture_output=True, text=True, timeout=240)
        assert probe.returncode == 0, probe.stderr[-3000:]
        result = json.loads(probe.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60)
    assert result["master"] == master
    assert result["executors_incl_driver"] >= 2  # the worker's executor really joined
    assert result["rows"] == [{"n": i} for i in range(6, 10)]
    assert result["windows"] == [{"window_start": 0, "window_end": 4, "sum_v": 10.0},
                                 {"window_start": 5, "window_end": 9, "sum_v": 35.0}]
