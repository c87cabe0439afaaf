"""pep/, pdp/, server/, common/ and proxy/ type-check under mypy --strict: with the settings
of setup.cfg's [mypy] sections, mypy finds no error.

mypy runs as a child process from the repository root (so that it reads setup.cfg and checks the
files named there), with its cache in the worktree's .mypy_cache: a first run takes about 40 s,
later ones a few seconds. Its report is shown when it fails: each line names file, line and
error code; fix the error (a `# type: ignore` names its code and says why, and only where a
third-party package's types are missing or wrong).
"""
from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MYPY_TIMEOUT = 240  # seconds; a cold run is ~40 s on this project's machine, cached ~2 s

pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")


@pytest.mark.timeout(MYPY_TIMEOUT + 30)
def test_mypy_finds_no_error():
    try:
        run = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "setup.cfg"],
                             cwd=REPO, capture_output=True, text=True, timeout=MYPY_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mypy took longer than {MYPY_TIMEOUT} s")
    report = (run.stdout + run.stderr).strip()
    assert run.returncode == 0, f"mypy found errors:\n{report}"
    assert "Success: no issues found" in run.stdout, report


PACKAGES = {"pep", "pdp", "server", "common", "proxy"}
# what a section for a third-party package may say: where its types are missing or re-exported
THIRD_PARTY_OPTIONS = {"ignore_missing_imports", "implicit_reexport"}


def test_mypy_checks_every_package_strict_and_relaxes_no_module_of_ours():
    """The settings check the packages, all of them under --strict (a new module is strict
    without being listed), and the per-module sections only describe third-party packages:
    none relaxes a module of ours, none silences a package."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    assert {p.strip() for p in config["mypy"]["files"].split(",")} == PACKAGES
    assert config["mypy"].getboolean("strict")
    for section in config.sections():
        if not section.startswith("mypy-"):
            continue
        modules = [m.strip() for m in section[len("mypy-"):].split(",")]
        ours = [m for m in modules if m.split(".")[0] in PACKAGES]
        assert ours == [], f"[{section}] names modules of ours: {ours}"
        assert set(config[section]) - set(config.defaults()) <= THIRD_PARTY_OPTIONS, section
