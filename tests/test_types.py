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
import io
import re
import subprocess
import sys
import tokenize
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


# `# type: ignore[code, ...]  # why`: the codes silenced, then the reason (it may point above)
IGNORE_WITH_REASON = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(?:,\s*[a-z-]+)*\]\s+#\s*\S")


def ignores_without_reason(source: str) -> list[str]:
    """The `# type: ignore` comments of a module that do not name their codes and a reason."""
    comments = [(tok.start[0], tok.string) for tok in
                tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT]
    return [f"line {line}: {text}" for line, text in comments
            if re.search(r"type:\s*ignore", text) and not IGNORE_WITH_REASON.search(text)]


def test_every_type_ignore_names_its_codes_and_a_reason():
    faults = [f"{path.relative_to(REPO)} {fault}" for package in sorted(PACKAGES)
              for path in sorted((REPO / package).rglob("*.py"))
              for fault in ignores_without_reason(path.read_text(encoding="utf-8"))]
    assert faults == [], "\n".join(faults)


def test_the_type_ignore_check_finds_what_it_must():
    assert ignores_without_reason(
        "x = f()  # type: ignore[attr-defined]  # pyspark has no stubs for f\n"
        "y = g()  # type: ignore[arg-type, union-attr]  # see above\n") == []
    assert len(ignores_without_reason("x = f()  # type: ignore\n")) == 1
    assert len(ignores_without_reason("x = f()  # type: ignore[arg-type]\n")) == 1
    assert len(ignores_without_reason("x = f()  # type: ignore  # no code\n")) == 1
