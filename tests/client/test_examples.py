"""The client's examples (client/examples/) run as a consumer runs them, against the session's
gateway (`xsg serve`): XSG_URL and XSG_TOKEN in their environment, their output checked. The
rows are in the handle before an example starts (it asks for the same stream with the same
plan: the gateway answers with the same handle, and a reader without Last-Event-ID gets the
rows the handle keeps)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.client.conftest import CLIENT, RawReader, wait_for
from tests.pep.conftest import TOKENS
from xsg_client import Client

EXAMPLES = CLIENT / "examples"
SCHEMA = [("ts", "timestamp"), ("rainrate", "double"), ("station", "long")]


def run(example: str, *args: str, url: str, timeout: float = 120) -> str:
    env = {**os.environ, "XSG_URL": url, "XSG_TOKEN": TOKENS["lta"]}
    done = subprocess.run([sys.executable, str(EXAMPLES / example), *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=EXAMPLES)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def handle_with_rows(served, stream: str, n: int) -> str:
    served.stream(stream, SCHEMA, {"attributes": ["ts", "rainrate", "station"]})
    with Client(served.url, TOKENS["lta"]) as xsg:
        grant = xsg.request(stream)
    served.append(stream, [{"ts": f"2024-06-01T08:00:0{i}Z", "rainrate": i + 0.5,
                            "station": 2 ** 40 + i} for i in range(n)])
    reader = RawReader(grant.handle).start()
    wait_for(lambda: len(reader.rows()) == n, what=f"{n} rows in {stream}")
    return grant.handle


def test_read_rows_and_read_async(served):
    handle_with_rows(served, "e_rows", 3)
    handle_with_rows(served, "e_async", 2)
    out = run("read_rows.py", "e_rows", "--max-rows", "3", "--release", url=served.url)
    lines = out.splitlines()
    assert lines[0] == "existing handle on e_rows"  # the same plan: the same handle
    assert "columns: ts timestamp, rainrate double, station long" in lines
    assert ("1 {'ts': datetime.datetime(2024, 6, 1, 8, 0, tzinfo=datetime.timezone.utc), "
            f"'rainrate': 0.5, 'station': {2 ** 40}}}") in lines
    assert lines[-2:] == ["3 rows; resume after event 3", "released"]
    out = run("read_async.py", "e_async", "e_rows", "--idle", "2", url=served.url)
    assert "e_async: 2 rows" in out and "e_rows: 0 rows" in out  # e_rows: a new handle


def test_frames(served):
    handle = handle_with_rows(served, "e_frames", 3)
    out = run("frames.py", handle, "--max-rows", "3", "--frames", "1", url=served.url)
    assert "frame 1: 3 rows" in out
    assert "datetime64[us, UTC]" in out and "Int64" in out
    assert str(2 ** 40 + 2) in out


@pytest.mark.timeout(300)
def test_spark_job(served, tmp_path):
    pytest.importorskip("pyspark")
    handle = handle_with_rows(served, "e_spark", 3)
    out = run("spark_job.py", handle, "--checkpoint", str(tmp_path / "job"), "--time", "ts",
              "--value", "rainrate", "--rows", "3", "--seconds", "150", url=served.url,
              timeout=240)
    assert "up to event 3" in out and out.splitlines()[-1] == "3 rows"
    assert "3 rows, mean 1.5" in out  # one 10-second window: 0.5, 1.5, 2.5
