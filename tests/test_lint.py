"""The checkout passes the linter: `ruff check .` with the settings of ruff.toml finds nothing.

ruff runs as a child process from the repository root (so that it reads ruff.toml and checks
every Python file of the checkout that git does not ignore); it takes about a second. When it
fails, its report lists each violation with file, line and rule; `ruff check --fix` repairs the
safe ones, `ruff rule CODE` explains a rule. A `# noqa` must name its rule and say why.
"""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUFF_TIMEOUT = 120  # seconds; a cold run is ~1 s on this project's machine

pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")


def _check(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", "ruff.toml", *args],
            cwd=REPO, input=stdin, capture_output=True, text=True, timeout=RUFF_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ruff took longer than {RUFF_TIMEOUT} s")


@pytest.mark.timeout(RUFF_TIMEOUT + 30)
def test_ruff_finds_nothing():
    run = _check("--output-format", "concise", ".")
    report = (run.stdout + run.stderr).strip()
    if run.returncode != 0:
        pytest.fail(f"ruff found violations (`ruff check .`):\n{report}", pytrace=False)


@pytest.mark.timeout(RUFF_TIMEOUT + 30)
def test_ruff_checks_the_project_packages():
    """The lint covers every package of the project: none is excluded, and a violation placed
    in a checked file is reported (the check is not vacuous)."""
    config = tomllib.loads((REPO / "ruff.toml").read_text())
    assert not config.get("exclude") and not config.get("extend-exclude"), config
    for rule in ("F", "E", "W", "I", "B", "UP", "RUF100", "PGH004"):
        assert rule in config["lint"]["select"], rule
    listed = _check("--show-files", ".")
    assert listed.returncode == 0, listed.stderr
    files = {Path(line).resolve().relative_to(REPO).parts[0]
             for line in listed.stdout.splitlines() if line.strip().endswith(".py")}
    for package in ("pdp", "pep", "proxy", "server", "common", "client", "tests", "docs"):
        assert package in files, f"ruff does not check {package}/"
    probe = "import os\n\nx = zip([1], [2])  # noqa\n"
    run = _check("--output-format", "concise", "--stdin-filename", "pep/_lint_probe.py", "-",
                 stdin=probe)
    for rule in ("F401", "PGH004"):
        assert rule in run.stdout, run.stdout
